"""``DelayedScaler`` edges: the amax all-reduce of :func:`reduce_and_update` / :meth:`update` in a group of two
(torch's ``fake`` backend plays rank 1; ``all_reduce`` is replaced by the MAX with rank 0's row, as gloo would
compute it), ``reduced_amax`` checking, ``set_recipe`` keeping the state's arrays and the ``fused`` choice, and
``quantize`` records.  Expected scales by hand: TE's fused update is ``fp8_max / amax`` in one IEEE division
(``common/recipe/delayed_scaling.cu``), the eager unfused one ``amax.reciprocal() * fp8_max`` (spec 0, 4.6)."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

from fp8sim.recipe import DelayedScaling
from fp8sim.scaling.delayed import DelayedScaler, reduce_and_update
from fp8sim.testing.oracles import require

torch = require("torch")
dist = require("torch.distributed")


class _TwoRanks:
    """Rank 1 of a fake group of two; ``all_reduce`` takes the elementwise MAX with ``other`` (rank 0's row)."""

    def __init__(self, other: list[float]) -> None:
        self.other = torch.tensor(other, dtype=torch.float32)
        self.calls: list[tuple[list[float], object, object]] = []

    def __enter__(self) -> _TwoRanks:
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=2)
        self.group = dist.new_group([0, 1])
        self.real = dist.all_reduce

        def all_reduce(t, op=dist.ReduceOp.SUM, group=None, async_op=False):  # noqa: ANN001, ANN202
            self.calls.append((t.tolist(), op, group))
            t.copy_(torch.maximum(t, self.other))

        dist.all_reduce = all_reduce
        return self

    def __exit__(self, *exc: object) -> None:
        dist.all_reduce = self.real
        dist.destroy_process_group()


def _scalers(reduce_amax: bool = True) -> tuple[DelayedScaler, DelayedScaler]:
    a = DelayedScaler(DelayedScaling(amax_history_len=2, reduce_amax=reduce_amax), n=2)  # fused
    b = DelayedScaler(DelayedScaling(amax_history_len=2, reduce_amax=reduce_amax), n=1, fused=False)
    a.record(0, np.array([2.0], np.float32))
    a.record(1, np.array([0.5], np.float32))
    b.record(0, np.array([-3.0], np.float32))
    return a, b


def test_reduce_and_update_all_reduces_one_row_and_splits_it_per_scaler() -> None:
    a, b = _scalers()
    c = DelayedScaler(DelayedScaling(amax_history_len=2), n=1)
    c.record(0, np.array([1.0], np.float32))
    with _TwoRanks([8.0, 0.25, 5.0, 7.0]) as ranks:
        reduce_and_update([a, b, c], group=ranks.group)
    assert len(ranks.calls) == 1
    sent, op, group = ranks.calls[0]
    assert sent == [2.0, 0.5, 3.0, 1.0] and op == dist.ReduceOp.MAX and group is ranks.group
    # reduced row (8, 0.5, 5, 7): a fused, b unfused (eager reciprocal * 448), c fused
    assert a.scale.tolist() == [56.0, 896.0] and a.amax_history.tolist() == [[0.0, 0.0], [8.0, 0.5]]
    assert b.scale[0] == (np.float32(1) / np.float32(5)) * np.float32(448)
    assert b.amax_history.tolist() == [[0.0], [5.0]]
    assert c.scale.tolist() == [64.0] and c.amax_history.tolist() == [[0.0], [7.0]]


def test_reduce_and_update_without_reduce_amax_keeps_the_local_row() -> None:
    a, b = _scalers(reduce_amax=False)
    with _TwoRanks([8.0, 0.25, 1.0]) as ranks:
        reduce_and_update([a, b], group=ranks.group)
    assert ranks.calls == []
    assert a.scale.tolist() == [224.0, 896.0] and a.amax_history.tolist() == [[0.0, 0.0], [2.0, 0.5]]
    assert b.amax_history.tolist() == [[0.0], [3.0]]


def test_update_all_reduces_in_the_given_group() -> None:
    a, _ = _scalers()
    with _TwoRanks([1.0, 4.0]) as ranks:
        a.update(group=ranks.group)
    assert [c[2] for c in ranks.calls] == [ranks.group]
    assert a.scale.tolist() == [224.0, 112.0]


def test_a_group_of_one_rank_in_a_world_of_two_is_not_reduced() -> None:
    a, _ = _scalers()
    with _TwoRanks([9.0, 9.0]) as ranks:
        alone = dist.new_group([1])
        a.update(group=alone)
    assert ranks.calls == [] and a.scale.tolist() == [224.0, 896.0]


def test_reduced_amax_takes_any_real_array_or_tensor_and_names_itself_when_bad() -> None:
    s = DelayedScaler(DelayedScaling(amax_history_len=1, reduce_amax=False), n=2)
    s.update(reduced_amax=torch.tensor([4.0, 8.0], dtype=torch.bfloat16, requires_grad=True))
    assert s.scale.tolist() == [112.0, 56.0]
    # an integer amax rounds once to float32: 2^54 + 2^30 + 1 -> 2^54 + 2^31 (via float64 it would tie to 2^54)
    s.update(reduced_amax=np.array([2**54 + 2**30 + 1, 1], np.int64))
    assert s.amax_history[0, 0] == 0 and s.scale[0] == np.float32(448) / np.float32(2**54 + 2**31)
    assert s.scale[1] == 448.0  # a reduced amax of 1 is an amax like any other (the local row is 0 here)
    for bad, msg in (
        ([[1.0], [2.0, 3.0]], "reduced_amax is not a rectangular array"),
        (
            np.array([1.0, 2.0, 3.0]),
            r"reduced_amax must be 2 real amaxes \(shape \(2,\)\), got float64 of shape \(3,\)",
        ),
        (np.array(["a", "b"]), r"reduced_amax must be 2 real amaxes .*got <U1 of shape \(2,\)"),
    ):
        with pytest.raises(ValueError, match=msg):
            s.update(reduced_amax=bad)


def test_set_recipe_keeps_the_arrays_at_equal_length_and_the_fused_choice() -> None:
    s = DelayedScaler(DelayedScaling(amax_history_len=3), n=2, fused=False)
    hist, scale = s.amax_history, s.scale
    s.set_recipe(DelayedScaling(amax_history_len=3, margin=1))
    assert s.amax_history is hist and s.scale is scale and s.recipe.margin == 1
    assert s.fused is False  # the constructor's fused=False stays
    with pytest.raises(TypeError, match="recipe must be a DelayedScaling, got str"):
        s.set_recipe("delayed")


def _e4m3_codes(v: np.ndarray) -> np.ndarray:
    return np.clip(v, -448, 448).astype(np.float32).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


@pytest.mark.parametrize("shape", [(1, 4), (0,), (3, 1, 2)])
def test_quantize_record_covers_the_tensor_in_one_block(shape: tuple) -> None:
    s = DelayedScaler(DelayedScaling(amax_history_len=1, reduce_amax=False))
    s.scale[0] = np.float32(300.0)
    x = np.linspace(-3, 3, int(np.prod(shape)), dtype=np.float32).reshape(shape)
    q = s.quantize(0, torch.from_numpy(x).to(torch.bfloat16))
    xb = torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    assert q.block == tuple(max(d, 1) for d in shape) and q.shape == shape and q.dtype == "bfloat16"
    np.testing.assert_array_equal(q.codes, _e4m3_codes(xb * np.float32(300.0)))  # saturating: |x| * 300 > 448
    assert q.scales.dtype == np.float32 and q.scales.reshape(-1)[0] == np.float32(1) / np.float32(300)
    np.testing.assert_array_equal(q.dequantize().shape, shape)


def test_fused_update_warns_nothing_on_zero_tiny_inf_nan_amaxes() -> None:
    """The kernel's float32 division has no floating-point traps: a quantizer that did not run (amax 0), an
    amax whose scale overflows (FLT_MAX), Inf and NaN (scale kept)."""
    amaxes = np.array([0.0, 1e-45, np.inf, np.nan, 3.0], np.float32)
    s = DelayedScaler(DelayedScaling(amax_history_len=1, reduce_amax=False), n=amaxes.size)
    assert s.fused
    s.scale[:] = np.float32(5.0)
    s.amax_history[0] = amaxes
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s.update()
    assert s.scale.tolist() == [5.0, float(np.finfo(np.float32).max), 5.0, 5.0, float(np.float32(448) / 3)]


@pytest.mark.parametrize(
    ("state", "msg"),
    [
        (7, r"^state must be a dict with keys \('scale', 'amax_history'\) \(a state_dict\(\)\); got int$"),
        (
            {"scale": np.ones(2)},
            r"^DelayedScaler state: missing key\(s\) \['amax_history'\]; a state has exactly the keys",
        ),
        (
            {"scale": np.ones(2), "extra": 1, "other": 2},
            r"^DelayedScaler state: missing key\(s\) \['amax_history'\]; unexpected key\(s\) 'extra', 'other'; "
            r"a state has exactly the keys \('scale', 'amax_history'\)$",
        ),
        (
            {"scale": np.ones(2), "amax_history": np.ones((4, 2)), "extra": 1},
            r"^DelayedScaler state: unexpected key\(s\) 'extra'; a state",
        ),
        ({"scale": np.zeros(2), "amax_history": np.ones((4, 2))}, r"state\['scale'\] must be finite and positive"),
        ({"scale": np.array([1e39, 1.0]), "amax_history": np.ones((4, 2))}, "must be finite and positive"),
        (
            {"scale": np.ones(2), "amax_history": np.ones((3, 2))},
            r"has shape \(3, 2\); this DelayedScaler's is \(4, 2\) \(amax_history_len, n\): the state comes from "
            "another recipe or module$",
        ),
    ],
    ids=["not-a-dict", "missing", "missing-and-unexpected", "unexpected", "zero-scale", "float32-overflow", "shape"],
)
def test_bad_states_are_refused_with_the_whole_message(state, msg: str) -> None:  # noqa: ANN001
    s = DelayedScaler(DelayedScaling(amax_history_len=4), n=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the message is the whole report: no numpy warning before it
        with pytest.raises((TypeError, ValueError), match=msg):
            s.load_state_dict(state)
    assert s.scale.tolist() == [1.0, 1.0]
    s.load_state_dict({"scale": np.array([0.5, 1e-30]), "amax_history": np.zeros((4, 2), np.float16)})
    assert s.scale.tolist() == [0.5, float(np.float32(1e-30))]
