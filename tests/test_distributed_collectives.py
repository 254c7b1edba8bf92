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
    return out


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
