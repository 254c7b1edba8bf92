"""torchao float8 training semantics found untested by the second mutation sample (seed 31), each against
torchao 0.18 itself (``torchao/float8/``) run side by side.

- A ``Float8Linear`` with one output feature (``nn.Linear(16, 1)``) runs as torchao's.
- A config mixing a tensorwise input with axiswise (rowwise) weight scales, on the scaled-GEMM path of an
  fp8sim accumulator: torchao's ``preprocess_addmm`` expands the tensorwise scale to one per row; on data whose
  products and sums are exact the values are torchao's ``emulate=True`` bits.
- ``fp8sim explain``'s note of an undecided profile names both operand formats of each GEMM as torchao casts
  them (a weight cast to e5m2: torchao's ``float8_mm`` operands, read through ``preprocess_addmm``).
- The FSDP2 weight wrapper's flatten / unflatten round trip carries the mm config and dtype as torchao's
  ``WeightWithDynamicFloat8CastTensor`` does; operands of two float8 dtypes are refused (AssertionError).
- Argument errors name the argument: tensor-parallel layouts, a non-divisor record.
"""

from __future__ import annotations

import copy
import dataclasses
import re

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")
ao = require("torchao.float8")
ao_ops = require("torchao.float8.float8_ops")
ao_fsdp = require("torchao.float8.fsdp_utils")
ao_linear = require("torchao.float8.float8_linear")

from torch import nn  # noqa: E402

import fp8sim.torchao as fs  # noqa: E402
from fp8sim.testing import assert_bit_exact  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_a_single_output_feature_runs_like_torchao() -> None:
    torch.manual_seed(0)
    base = nn.Linear(16, 1)
    cfg = dataclasses.replace(ao.Float8LinearConfig(), emulate=True)
    theirs = ao_linear.Float8Linear.from_float(copy.deepcopy(base), config=cfg)
    ours = fs.Float8Linear(16, 1)
    with torch.no_grad():
        ours.weight.copy_(base.weight)
        ours.bias.copy_(base.bias)
    x = torch.randn(8, 16)
    got, want = [], []
    for model, sink in ((ours, got), (theirs, want)):
        xi = x.clone().requires_grad_(True)
        y = model(xi)
        y.square().sum().backward()
        sink.extend([y.detach(), xi.grad, model.weight.grad])
    for g, w in zip(got, want, strict=True):
        assert_bit_exact(g, w)


def _small_integers(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Entries in {-1, 0, 1} and one +-7 per row: every row's amax is 7, so torchao's scale is 448 / 7 = 64
    (exact), every code is exact and every product and sum of the GEMM is a small integer."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(-1, 2, (rows, cols), generator=g).float()
    t[torch.arange(rows), torch.randint(0, cols, (rows,), generator=g)] = 7.0 * (1 - 2 * (torch.arange(rows) % 2))
    return t


def test_tensorwise_input_with_rowwise_weight_scales_on_the_scaled_gemm_path_equals_torchao() -> None:
    """``a`` tensorwise, ``b`` axiswise: torchao's ``preprocess_addmm`` (float8_ops.py) repeats ``a``'s one
    scale for each of its rows before ``addmm_float8_unwrapped``; with exact data any accumulator gives the
    exact sums, so fp8sim's scaled-GEMM path equals torchao's ``emulate=True`` bit for bit (which accumulator ran
    is not asserted)."""
    axis = dict(scaling_granularity=ao.ScalingGranularity.AXISWISE)
    cfg_ao = ao.Float8LinearConfig(cast_config_weight=ao.CastConfig(**axis), emulate=True)
    cfg_fs = fs.Float8LinearConfig(cast_config_weight=fs.CastConfig(scaling_granularity=fs.ScalingGranularity.AXISWISE))
    base = nn.Linear(16, 8, bias=False)
    with torch.no_grad():
        base.weight.copy_(_small_integers(8, 16, 1))
    theirs = ao_linear.Float8Linear.from_float(copy.deepcopy(base), config=cfg_ao)
    ours = fs.Float8Linear(16, 8, bias=False, config=cfg_fs, accumulator="hopper")
    with torch.no_grad():
        ours.weight.copy_(base.weight)
    x = _small_integers(4, 16, 2)
    x[1:] = x[1:].clamp(-1, 1)  # the tensor's amax 7 comes from row 0 only: one scale for all rows
    with torch.no_grad():
        want = theirs(x)
        got = ours(x)
    assert torch.equal(want, x @ base.weight.t())  # the data are exact, as intended
    assert_bit_exact(got, want)


_NAMES = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}


def test_explain_note_names_both_operand_formats_torchao_casts() -> None:
    from fp8sim.pytorch import record_gemm_plans

    e5 = torch.float8_e5m2
    cfg_ao = ao.Float8LinearConfig(cast_config_weight=ao.CastConfig(target_dtype=e5), emulate=True)
    seen: list[tuple[str, str]] = []
    original = ao_ops.preprocess_addmm

    def spy(a, b):  # torchao's float8_mm reads its two Float8TrainingTensor operands through this
        seen.append((_NAMES[a._data.dtype], _NAMES[b._data.dtype]))
        return original(a, b)

    x = torch.randn(16, 64)
    base = nn.Linear(64, 32)
    theirs = ao_linear.Float8Linear.from_float(copy.deepcopy(base), config=cfg_ao)
    mp = pytest.MonkeyPatch()
    mp.setattr(ao_ops, "preprocess_addmm", spy)
    try:
        theirs(x.clone().requires_grad_(True)).sum().backward()
    finally:
        mp.undo()
    assert seen == [("e4m3", "e5m2"), ("e5m2", "e5m2"), ("e5m2", "e4m3")]  # fprop, dgrad, wgrad

    holder = nn.Module()
    holder.proj = fs.Float8Linear(
        64, 32, config=fs.Float8LinearConfig(cast_config_weight=fs.CastConfig(target_dtype=e5)), accumulator="h200"
    )
    with record_gemm_plans(model=holder, dry=True) as rec:
        holder.proj(x.clone().requires_grad_(True)).sum().backward()
    notes = [re.search(r"\((\w+) x (\w+) -> ", p.note).groups() for p in rec.plans]
    assert [p.role for p in rec.plans] == ["fprop", "dgrad", "wgrad"]
    assert notes == seen


def test_fsdp_weight_flatten_round_trip_carries_what_torchaos_carries() -> None:
    t = torch.randn(4, 8)
    mm_config = ao_ops.LinearMMConfig() if hasattr(ao_ops, "LinearMMConfig") else object()
    kept = []
    for cls in (ao_fsdp.WeightWithDynamicFloat8CastTensor, fs.WeightWithDynamicFloat8CastTensor):
        w = cls(t, mm_config, torch.float8_e4m3fn)
        names, spec = w.__tensor_flatten__()
        back = cls.__tensor_unflatten__({n: getattr(w, n) for n in names}, spec, w.shape, w.stride())
        kept.append((names, back._linear_mm_config is mm_config, back._dtype, torch.equal(back._tensor, t)))
    assert kept[1] == kept[0] == (["_tensor"], True, torch.float8_e4m3fn, True)


def test_fsdp_weights_of_two_float8_dtypes_are_refused_like_torchao() -> None:
    t = torch.randn(4, 8)
    for cls in (ao_fsdp.WeightWithDynamicFloat8CastTensor, fs.WeightWithDynamicFloat8CastTensor):
        a, b = cls(t, None, torch.float8_e4m3fn), cls(t, None, torch.float8_e5m2)
        with pytest.raises(AssertionError) as info:
            torch.add(a, b)
        if cls is fs.WeightWithDynamicFloat8CastTensor:
            assert str(info.value) == "WeightWithDynamicFloat8CastTensor operands have different float8 dtypes"


@pytest.mark.parametrize(
    ("style", "kwargs", "message"),
    [
        ("PrepareFloat8ModuleInput", {"input_layouts": "Shard(1)"}, "input_layouts must be one of"),
        ("PrepareFloat8ModuleInput", {"desired_input_layouts": "Shard(0)"}, "desired_input_layouts must be one of"),
        ("Float8ColwiseParallel", {"input_layouts": "Shard(1)"}, "input_layouts must be one of"),
        ("Float8ColwiseParallel", {"output_layouts": "Shard(0)"}, "output_layouts must be one of"),
        ("Float8RowwiseParallel", {"input_layouts": "Shard(0)"}, "input_layouts must be one of"),
        ("Float8RowwiseParallel", {"output_layouts": "Shard(1)"}, "output_layouts must be one of"),
    ],
)
def test_a_layout_not_emulated_is_refused_naming_the_argument(style: str, kwargs: dict, message: str) -> None:
    placement = require("torch.distributed.tensor")
    from fp8sim.torchao import tp

    layouts = {k: placement.Shard(int(v[6])) for k, v in kwargs.items()}
    with pytest.raises(ValueError, match=rf"^{message} "):
        getattr(tp, style)(**layouts)


def test_a_record_with_multiplier_scales_is_refused_by_name() -> None:
    import numpy as np

    from fp8sim.scaling.mx import quantize_mx
    from fp8sim.torchao._float8 import _Float8

    q = quantize_mx(np.ones((2, 32), np.float32), "e4m3", axis=-1)
    with pytest.raises(
        ValueError, match=r"^a torchao float8 operand holds divisor scales \(quantize_torchao's record\)$"
    ):
        _Float8.of_record(q, axiswise=False)
