"""fp8sim.collectives on gloo: float8 and packed FP4 payloads move as bytes, float8
reductions are fp8sim's (decode exactly, reduce in float64 in rank order, round once).

Oracles: each rank's payload is known to the test (seeded), the expected gathers are plain
concatenations, and the expected reductions come from ml_dtypes (codes -> float64, sum or max in
rank order, ``float64 -> float8`` cast by ml_dtypes).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")
dist = require("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

from _dist import ranks  # noqa: E402

import fp8sim.collectives as fd  # noqa: E402

WORLD = 2
N = 300  # not a multiple of anything in particular
_ML = {
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float8_e5m2": ml_dtypes.float8_e5m2,
    "float8_e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "float8_e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
    "float8_e8m0fnu": ml_dtypes.float8_e8m0fnu,
}
DTYPES = sorted(str(d).replace("torch.", "") for d in fd.BYTE_DTYPES)


def _payload(rank: int, n: int, salt: int = 0) -> np.ndarray:
    return np.random.default_rng(1000 * salt + rank).integers(0, 256, size=n, dtype=np.uint8)


def _uneven(rank: int) -> int:
    return (0, 5, 17, 2)[rank]  # rank 0 holds an empty shard


def _worker(rank: int, world: int, names: list[str]) -> dict:
    out: dict = {}
    for name in names:
        dt = getattr(torch, name)
        mine = torch.from_numpy(_payload(rank, N)).view(dt)
        full = torch.empty(world * N, dtype=dt)
        fd.all_gather_into_tensor(full, mine)
        parts = [torch.empty(N, dtype=dt) for _ in range(world)]
        fd.all_gather(parts, mine)
        uneven = fd.all_gather_uneven(torch.from_numpy(_payload(rank, _uneven(rank) * 3, 1)).view(dt).reshape(-1, 3))
        b = torch.from_numpy(_payload(rank, N, 2)).view(dt)
        fd.broadcast(b, src=world - 1)
        res = {
            "gather": full.view(torch.uint8).numpy().copy(),
            "list": [p.view(torch.uint8).numpy().copy() for p in parts],
            "uneven": [(u.dtype == dt, tuple(u.shape), u.view(torch.uint8).numpy().copy()) for u in uneven],
            "broadcast": b.view(torch.uint8).numpy().copy(),
        }
        if name in _ML:
            src = torch.from_numpy(_payload(rank, world * 8, 3)).view(dt)
            for op in ("SUM", "MAX", "MIN"):
                o = torch.empty(8, dtype=dt)
                fd.reduce_scatter_tensor(o, src, op=getattr(dist.ReduceOp, op))
                res[f"rs_{op}"] = o.view(torch.uint8).numpy().copy()
            o32 = torch.empty(8, dtype=torch.float32)
            fd.reduce_scatter_tensor(o32, src)
            res["rs_f32"] = o32.numpy().copy()
            ar = torch.from_numpy(_payload(rank, 8, 4)).view(dt)
            fd.all_reduce(ar, op=dist.ReduceOp.MAX)
            res["ar_MAX"] = ar.view(torch.uint8).numpy().copy()
        out[name] = res
    try:  # the reason the layer exists: gloo itself refuses float8
        dist.all_reduce(torch.zeros(2, dtype=torch.float8_e4m3fn))
        out["gloo_refuses_float8"] = False
    except RuntimeError:
        out["gloo_refuses_float8"] = True
    out["edges"] = _edges(rank, world)
    return out


_E4 = ((1.0, -2.0, 0.5, 448.0), (3.0, -0.25, 0.5, 448.0))  # rank 0 and 1; 448 + 448 overflows E4M3 to NaN
_F32 = ((1.5, -2.0, 7.0, 0.25), (-0.5, 4.0, 7.0, 1.0))


def _edges(rank: int, world: int) -> dict:
    """Each rank alone in its own group (at the same time as its peer: a collective that ignores ``group``
    runs over both ranks instead), the defaults (``op=None`` is SUM), other dtypes, 0-dim tensors."""
    e4 = torch.float8_e4m3fn
    own = [dist.new_group([r]) for r in range(world)][rank]  # every rank makes every group, in order
    mine = torch.tensor(_E4[rank]).to(e4)
    res: dict = {}
    full = torch.empty(4, dtype=e4)
    fd.all_gather_into_tensor(full, mine, group=own)
    one = [torch.empty(4, dtype=e4)]
    fd.all_gather(one, mine, group=own)
    uneven = fd.all_gather_uneven(mine[: rank + 1], group=own)
    b = mine.clone()
    fd.broadcast(b, src=rank, group=own)
    rs = torch.empty(4, dtype=e4)
    fd.reduce_scatter_tensor(rs, mine, op=dist.ReduceOp.SUM, group=own)
    ar = mine.clone()
    fd.all_reduce(ar, op=dist.ReduceOp.MAX, group=own)
    f32 = torch.tensor(_F32[rank])
    ar32, rs32 = f32.clone(), torch.empty(4)
    fd.all_reduce(ar32, group=own)
    fd.reduce_scatter_tensor(rs32, f32, group=own)
    res["own"] = [t.view(torch.uint8) if t.dtype == e4 else t for t in (full, one[0], *uneven, b, rs, ar, ar32, rs32)]
    # over the world: the default op, MIN, float32 through torch.distributed, a 0-dim broadcast
    s, lo = mine.clone(), mine.clone()
    fd.all_reduce(s)
    fd.all_reduce(lo, op=dist.ReduceOp.MIN)
    rs_sum, rs_max = torch.empty(2), torch.empty(2)
    fd.reduce_scatter_tensor(rs_sum, f32)
    fd.reduce_scatter_tensor(rs_max, f32, op=dist.ReduceOp.MAX)
    a32, m32 = f32.clone(), f32.clone()
    fd.all_reduce(a32)
    fd.all_reduce(m32, op=dist.ReduceOp.MAX)
    scalar = torch.tensor(float(rank + 10))
    fd.broadcast(scalar, src=1)
    scalar8 = mine[0].clone()  # a 0-dim float8 tensor: gloo gathers it as one row
    fd.all_reduce(scalar8)
    res["world"] = {
        "sum": s.view(torch.uint8),
        "min": lo.view(torch.uint8),
        "f32": (rs_sum, rs_max, a32, m32, scalar),
        "sum0": scalar8.view(torch.uint8),
    }
    # 2-D: rows scattered, trailing dims kept
    two = mine.reshape(2, 2)
    rs2, ar2 = torch.empty(1, 2, dtype=e4), two.clone()
    fd.reduce_scatter_tensor(rs2, two)
    fd.all_reduce(ar2, op=dist.ReduceOp.MAX)
    res["world"]["2d"] = (rs2.view(torch.uint8), ar2.view(torch.uint8))
    errors = []
    for out in (torch.empty(3, dtype=e4), torch.empty(1, 3, dtype=e4)):
        try:
            fd.reduce_scatter_tensor(out, mine if out.dim() == 1 else two)
        except ValueError as exc:
            errors.append(str(exc))
    res["shape_errors"] = errors
    return res


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return ranks(_worker, DTYPES, world_size=WORLD)


def _assert_codes(got: np.ndarray, want: np.ndarray, name: str, what: str) -> None:
    """Codes equal, except that any NaN code matches any NaN code (the sign of Inf - Inf is the CPU's)."""
    nan = np.isnan(_values(got, name)) & np.isnan(_values(want, name))
    bad = np.flatnonzero((got != want) & ~nan)
    i = bad[0] if bad.size else 0
    assert bad.size == 0, f"{name} {what}: first difference at {i}: got {got[i]:#04x}, want {want[i]:#04x}"


def _values(codes: np.ndarray, name: str) -> np.ndarray:
    return codes.view(_ML[name]).astype(np.float64)


@pytest.mark.parametrize("name", DTYPES)
def test_gathers_and_broadcast_move_codes_unchanged(results: list[dict], name: str) -> None:
    want = np.concatenate([_payload(r, N) for r in range(WORLD)])
    for rank, res in enumerate(results):
        got = res[name]
        assert np.array_equal(got["gather"], want), f"{name} rank {rank}: all_gather_into_tensor"
        for r, part in enumerate(got["list"]):
            assert np.array_equal(part, _payload(r, N)), f"{name} rank {rank}: all_gather part {r}"
        assert np.array_equal(got["broadcast"], _payload(WORLD - 1, N, 2)), f"{name} rank {rank}: broadcast"


@pytest.mark.parametrize("name", DTYPES)
def test_uneven_gather_keeps_each_ranks_length_empty_included(results: list[dict], name: str) -> None:
    for res in results:
        for r, (same_dtype, shape, codes) in enumerate(res[name]["uneven"]):
            assert same_dtype and shape == (_uneven(r), 3)
            assert np.array_equal(codes.ravel(), _payload(r, _uneven(r) * 3, 1))


@pytest.mark.parametrize("name", sorted(_ML))
def test_float8_reductions_round_once_from_the_rank_order_float64_result(results: list[dict], name: str) -> None:
    srcs = [_values(_payload(r, WORLD * 8, 3), name) for r in range(WORLD)]
    ml = _ML[name]
    for q, res in enumerate(results):
        chunk = [s[q * 8 : (q + 1) * 8] for s in srcs]
        with np.errstate(invalid="ignore", over="ignore"):
            want_sum = chunk[0] + chunk[1]
            want = {
                "SUM": want_sum.astype(ml),
                "MAX": np.maximum(chunk[0], chunk[1]).astype(ml),
                "MIN": np.minimum(chunk[0], chunk[1]).astype(ml),
            }
        for op, w in want.items():
            got = res[name][f"rs_{op}"]
            _assert_codes(got, w.view(np.uint8), name, f"{op} rank {q}")
        assert np.array_equal(res[name]["rs_f32"], want_sum.astype(np.float32), equal_nan=True)
        ar = np.maximum(_values(_payload(0, 8, 4), name), _values(_payload(1, 8, 4), name)).astype(ml)
        _assert_codes(res[name]["ar_MAX"], ar.view(np.uint8), name, f"all_reduce MAX rank {q}")


def test_gloo_itself_refuses_float8(results: list[dict]) -> None:
    assert all(r["gloo_refuses_float8"] for r in results)


def test_reductions_reject_packed_fp4_and_bad_ops() -> None:
    if not hasattr(torch, "float4_e2m1fn_x2"):
        pytest.skip("this torch has no float4_e2m1fn_x2")
    fp4 = torch.float4_e2m1fn_x2
    with pytest.raises(TypeError, match="^input dtype torch.float4_e2m1fn_x2 cannot be reduced: packed FP4"):
        fd.wire._reduce_rows(torch.zeros(2, 3, dtype=torch.uint8).view(fp4), "SUM", None)
    with pytest.raises(TypeError, match="^output dtype torch.float4_e2m1fn_x2 cannot be reduced: packed FP4"):
        fd.wire._reduce_rows(torch.zeros(2, 3, dtype=torch.float8_e4m3fn), "SUM", fp4)
    with pytest.raises(ValueError, match="op must be ReduceOp.SUM, ReduceOp.MAX or ReduceOp.MIN"):
        fd.wire._op_name(dist.ReduceOp.PRODUCT)


_TIE = (32768.0, 4096.0, 2.0**-16)  # e5m2: 2^15, half its spacing (an exact tie), the smallest subnormal


def _three_rank_sum(rank: int, world: int) -> np.ndarray:
    t = torch.tensor([_TIE[rank]]).to(torch.float8_e5m2)
    fd.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.view(torch.uint8).numpy().copy()


def test_float8_sum_rounds_the_float64_sum_once() -> None:
    """32768 + 4096 is an e5m2 tie; rank 2's 2^-16 breaks it upward in float64 (40960).  A float32 sum loses
    2^-16 (below half an ulp of 36864) and ties to even (32768); a sum rounded per step does too."""
    want = np.array([(_TIE[0] + _TIE[1]) + _TIE[2]], np.float64).astype(ml_dtypes.float8_e5m2)
    assert float(want[0]) == 40960.0
    for rank, got in enumerate(ranks(_three_rank_sum, world_size=3)):
        _assert_codes(got, want.view(np.uint8), "float8_e5m2", f"SUM rank {rank}")


def test_each_collective_runs_over_its_group_alone(results: list[dict]) -> None:
    """A rank alone in its group gets its own payload back from every collective (reductions of one
    contribution included: float8 codes unchanged, float32 values unchanged)."""
    for rank, res in enumerate(results):
        codes = torch.tensor(_E4[rank]).to(torch.float8_e4m3fn).view(torch.uint8)
        full, one, uneven, b, rs, ar, ar32, rs32 = res["edges"]["own"]
        for what, got in (
            ("gather", full),
            ("list", one),
            ("broadcast", b),
            ("reduce_scatter", rs),
            ("all_reduce", ar),
        ):
            assert torch.equal(got, codes), f"rank {rank} {what}"
        assert torch.equal(uneven, codes[: rank + 1]), f"rank {rank} uneven"
        f32 = torch.tensor(_F32[rank])
        assert torch.equal(ar32, f32) and torch.equal(rs32, f32), f"rank {rank} float32"


def test_defaults_other_ops_dtypes_and_0_dim_tensors_over_the_world(results: list[dict]) -> None:
    a, b = (np.array(v, np.float64) for v in _E4)
    e4 = ml_dtypes.float8_e4m3fn
    with np.errstate(invalid="ignore"):
        want_sum = (a + b).astype(e4).view(np.uint8)
    f0, f1 = (np.array(v, np.float32) for v in _F32)
    for rank, res in enumerate(results):
        got = res["edges"]["world"]
        _assert_codes(got["sum"].numpy(), want_sum, "float8_e4m3fn", f"all_reduce default op rank {rank}")
        assert np.array_equal(got["min"].numpy(), np.minimum(a, b).astype(e4).view(np.uint8))
        rs_sum, rs_max, a32, m32, scalar = got["f32"]
        half = slice(2 * rank, 2 * rank + 2)
        assert np.array_equal(rs_sum.numpy(), (f0 + f1)[half]) and np.array_equal(
            rs_max.numpy(), np.maximum(f0, f1)[half]
        )
        assert np.array_equal(a32.numpy(), f0 + f1) and np.array_equal(m32.numpy(), np.maximum(f0, f1))
        assert scalar.shape == () and scalar.item() == 11.0
        assert got["sum0"].shape == () and got["sum0"].item() == int(want_sum[0]), "0-dim float8 all_reduce"
        rs2, ar2 = got["2d"]
        sum2 = (a + b).astype(e4).view(np.uint8).reshape(2, 2)
        _assert_codes(rs2.numpy(), sum2[rank : rank + 1], "float8_e4m3fn", f"2-D reduce_scatter rank {rank}")
        assert np.array_equal(ar2.numpy(), np.maximum(a, b).astype(e4).view(np.uint8).reshape(2, 2))
        msg = "reduce_scatter_tensor: input shape {} must be world_size (2) times output shape {} along dim 0"
        assert res["edges"]["shape_errors"] == [msg.format([4], [3]), msg.format([2, 2], [1, 3])]


def test_bad_arguments_are_named_before_any_communication() -> None:
    e4 = torch.float8_e4m3fn
    for fn, what in ((fd.all_gather_into_tensor, "all_gather_into_tensor"), (fd.all_gather, "all_gather")):
        out = torch.empty(4, dtype=torch.uint8)
        with pytest.raises(TypeError) as info:
            fn(out if fn is fd.all_gather_into_tensor else [out], torch.empty(2, dtype=e4))
        assert str(info.value) == f"{what}: output dtype torch.uint8 differs from input dtype torch.float8_e4m3fn"
    with pytest.raises(ValueError) as info:
        fd.all_gather_uneven(torch.tensor(1.0))
    assert str(info.value) == "all_gather_uneven needs a tensor with at least one dimension, got a 0-dim tensor"
    with pytest.raises(ValueError) as info:
        fd.broadcast(torch.zeros(4, 2).t(), src=0)
    assert str(info.value) == "broadcast needs a contiguous tensor (it is written in place)"
    with pytest.raises(ValueError) as info:
        fd.wire._op_name(dist.ReduceOp.PRODUCT)
    assert str(info.value) == (
        f"op must be ReduceOp.SUM, ReduceOp.MAX or ReduceOp.MIN for float8 tensors, got {dist.ReduceOp.PRODUCT}"
    )
