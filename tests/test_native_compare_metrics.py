"""What ``fp8sim compare`` reports for planted errors: bit-exact counts, ULP distances, clusters, the emulator
it chose, the notes, and the result helpers (issue 30: mutation testing of ``fp8sim.native``).

Captures are built here by hand: the true outputs come from torch 2.13's own casts and CPU ``_scaled_mm``
(run on the fallback kernel, which ``fp8sim.gemm.torch_cpu`` names), then a few outputs are moved by a known
number of steps on the format's grid.  Cluster sizes are recounted independently: ties from gfloat 0.5.2's
``round_ndarray`` (TiesToEven differs from TiesToAway exactly at a tie), ranges from ml_dtypes' ``finfo``.
"""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from fp8sim.native import compare as cmp
from fp8sim.native.compare import CompareResult, OpResult, accumulator_for, cast_convention_for, compare_capture
from fp8sim.native.fileformat import write_bundle
from fp8sim.native.suite import SUITE_VERSION, GemmCase, gemm_operands, input_set
from fp8sim.testing.oracles import require

torch = require("torch")
gfloat = require("gfloat")
from gfloat import formats as gf  # noqa: E402

CPU = {"device": "cpu", "device_name": "planted", "compute_capability": None, "torch": "2.13.0", "cuda": None,
       "driver": None, "fp8sim": "test", "date": "2026-12-02", "torch_cpu_kernel": "fallback",
       "torch_cpu_kernel_mixed": "fallback", "mkldnn_enabled": "no", "cpu_amx_int8": "no"}  # fmt: skip


def _bundle(tmp_path: Path, name: str, ops: list, arrays: dict, meta: dict | None = None) -> Path:
    doc = {"meta": meta or CPU, "ops": ops, "suite": "quick", "suite_version": SUITE_VERSION}
    return write_bundle(tmp_path / f"{name}.fp8cap", arrays, doc)


def _cast_op(fmt: str, inputs: str, kind: str = "cast") -> dict:
    return {"name": f"cast/{fmt}/{inputs}", "kind": kind, "format": fmt, "inputs": inputs, "seed": 0}


def _f64(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # signalling NaN patterns among the inputs
        return x.astype(np.float64)


def _gf_tie(fi: object, x: np.ndarray) -> np.ndarray:
    """x lies exactly halfway between two neighbours of the format (gfloat: TiesToEven != TiesToAway)."""
    x64 = np.where(np.isfinite(x), _f64(x), 0.0)
    even = gfloat.round_ndarray(fi, x64, gfloat.RoundMode.TiesToEven, sat=False)
    away = gfloat.round_ndarray(fi, x64, gfloat.RoundMode.TiesToAway, sat=False)
    return np.isfinite(x) & ~((even == away) | (np.isnan(even) & np.isnan(away)))


# ---- casts to FP8 ------------------------------------------------------------------------------------------------
def _torch_e4m3(x: np.ndarray) -> np.ndarray:
    return torch.from_numpy(x).to(torch.float8_e4m3fn).view(torch.uint8).numpy().copy()


def test_planted_fp8_cast_errors_are_counted_measured_in_grid_steps_and_clustered(tmp_path: Path) -> None:
    x = input_set("f32_special")
    truth = _torch_e4m3(x)
    planted = truth.copy()
    i_pos = int(np.flatnonzero(x == 1.5)[0])  # code 0x3C; 0x3E is 1.75, two steps up
    i_neg = int(np.flatnonzero(x == -1.5)[0])  # 0xBC; 0xB9 is -1.125, three steps toward zero
    i_zero = int(np.flatnonzero((x == 0) & ~np.signbit(x))[0])  # +0 captured as -0: not bit-exact, no step
    i_nan = int(np.flatnonzero(np.isnan(x))[0])  # NaN captured as a number: no finite distance
    assert (truth[[i_pos, i_neg, i_zero]] == [0x3C, 0xBC, 0x00]).all() and truth[i_nan] & 0x7F == 0x7F
    planted[[i_pos, i_neg, i_zero, i_nan]] = [0x3E, 0xB9, 0x80, 0x00]
    op = _cast_op("e4m3", "f32_special")
    (res,) = compare_capture(_bundle(tmp_path, "c", [op], {op["name"]: planted})).ops
    n = x.size
    assert (res.name, res.kind, res.emulator) == (op["name"], "cast", "convention torch_eager")
    assert (res.n, res.bit_exact) == (n, n - 4) and res.rate == (n - 4) / n
    finite_steps = n - 1  # a NaN against a number has no distance; a NaN matched counts 0 steps
    assert res.max_ulp == 3.0
    assert res.mean_ulp == pytest.approx(5 / finite_steps, rel=1e-12)
    assert res.extra["convention_rates"]["torch_eager"] == (n - 4) / n
    # the clusters, recounted: NaN, Inf, beyond the largest finite 448, ties below it, subnormals, zeros, the rest
    a = np.abs(_f64(x))
    fi = ml_dtypes.finfo(ml_dtypes.float8_e4m3fn)
    nan, inf = np.isnan(a), np.isinf(a)
    sat = np.isfinite(a) & (a > float(fi.max))
    tie = _gf_tie(gf.format_info_ocp_e4m3, x) & ~sat
    sub = (a > 0) & (a < float(fi.smallest_normal)) & ~tie
    zero = a == 0
    normal = ~(nan | inf | sat | tie | sub | zero)
    want = {"nan": nan, "inf": inf, "saturation": sat, "tie": tie, "subnormal": sub, "zero": zero, "normal": normal}
    assert {k: v[0] for k, v in res.clusters.items()} == {k: int(m.sum()) for k, m in want.items()}
    assert {k: v[1] for k, v in res.clusters.items() if v[1]} == {"normal": 2, "zero": 1, "nan": 1}
    inf = res.extra["rule_inference"]
    assert inf["n"] == n - int(np.isnan(x).sum()) and {c["name"].split()[0] for c in inf["candidates"]} == {"e4m3"}
    # the legacy convention for a capture of torch before 2.13, the best convention for a GPU capture
    old = compare_capture(_bundle(tmp_path, "old", [op], {op["name"]: truth}, {**CPU, "torch": "2.12.1+cpu"}))
    assert old.ops[0].emulator == "convention torch_eager_legacy"
    gpu_meta = {**CPU, "device": "cuda", "compute_capability": [9, 0]}
    (g,) = compare_capture(_bundle(tmp_path, "gpu", [op], {op["name"]: truth}, gpu_meta), infer="none").ops
    rates = g.extra["convention_rates"]
    assert g.rate == 1.0 == max(rates.values()) and rates[g.emulator.split()[-1]] == 1.0
    assert "rule_inference" not in g.extra and len(rates) > 1


def test_a_gpu_cast_is_compared_under_the_convention_that_explains_most(tmp_path: Path) -> None:
    """A GPU capture's convention is one with the highest rate: saturating RN-even codes (gfloat,
    ``sat=True``) are ``satfinite``'s, which ml_dtypes' (overflow to NaN) miss."""
    x = input_set("f32_special")
    sat = gfloat.round_ndarray(gf.format_info_ocp_e4m3, _f64(x), gfloat.RoundMode.TiesToEven, sat=True)
    codes = sat.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    op = _cast_op("e4m3", "f32_special")
    gpu = {**CPU, "device": "cuda", "compute_capability": [8, 9]}
    (res,) = compare_capture(_bundle(tmp_path, "sat", [op], {op["name"]: codes}, gpu), infer="none").ops
    rates = res.extra["convention_rates"]
    assert res.bit_exact == res.n and rates[res.emulator.split()[-1]] == 1.0
    assert rates["satfinite"] == 1.0 > rates["ml_dtypes"]


# ---- casts to bfloat16 / float16 --------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
def test_planted_16_bit_cast_errors_are_counted_in_ulps_and_clustered(tmp_path: Path, fmt: str) -> None:
    x = input_set("f32_wide")
    dt = getattr(torch, fmt)
    truth = torch.from_numpy(x).to(dt).view(torch.int16).numpy().view(np.uint16).copy()
    val = truth.view(ml_dtypes.bfloat16 if fmt == "bfloat16" else np.float16).astype(np.float64)
    ok = np.isfinite(val) & (np.abs(val) > 1) & (np.abs(val) < 100)
    i_pos = int(np.flatnonzero(ok & (val > 0))[0])
    i_neg = int(np.flatnonzero(ok & (val < 0))[0])
    i_nan = int(np.flatnonzero(np.isnan(x))[0])
    planted = truth.copy()
    planted[i_pos] += 2  # two steps away from zero on a positive value
    planted[i_neg] -= 3  # three steps toward zero on a negative value (sign-magnitude bits)
    planted[i_nan] = 0x0000  # NaN captured as +0
    op = _cast_op(fmt, "f32_wide", "cast_float")
    (res,) = compare_capture(_bundle(tmp_path, fmt, [op], {op["name"]: planted})).ops
    n = x.size
    assert (res.kind, res.emulator) == ("cast_float", "RN-even (ml_dtypes)")
    assert (res.n, res.bit_exact) == (n, n - 3) and res.max_ulp == 3.0
    assert res.mean_ulp == pytest.approx(5 / (n - 1), rel=1e-12)  # NaN against 0 has no distance
    fi = ml_dtypes.finfo(ml_dtypes.bfloat16 if fmt == "bfloat16" else np.float16)
    a = np.abs(_f64(x))
    fin = np.isfinite(a)
    tie = _gf_tie(gf.format_info_bfloat16 if fmt == "bfloat16" else gf.format_info_binary16, x)
    over = fin & (a > float(fi.max))
    cats = {"nan": np.isnan(a), "inf": np.isinf(a), "overflow": over, "tie": tie}
    cats["subnormal"] = fin & (a > 0) & (a < float(fi.smallest_normal)) & ~tie
    cats["zero"] = a == 0
    taken = np.zeros(a.shape, bool)
    for m in cats.values():
        taken |= m
    cats["normal"] = ~taken
    assert {k: v[0] for k, v in res.clusters.items()} == {k: int(m.sum()) for k, m in cats.items() if m.any()}
    wrong = {k: v[1] for k, v in res.clusters.items() if v[1]}
    assert sum(wrong.values()) == 3 and wrong["nan"] == 1, wrong
    inf = res.extra["rule_inference"]
    assert inf["n"] == n - int(np.isnan(x).sum())  # NaN inputs are not counted
    assert {c["name"].split()[0] for c in inf["candidates"]} == {fmt}
    (none,) = compare_capture(_bundle(tmp_path, fmt + "-ok", [op], {op["name"]: truth}), infer="none").ops
    assert none.bit_exact == none.n and none.max_ulp == 0 and "rule_inference" not in none.extra


def test_a_16_bit_nan_compares_by_class_and_signed_zeros_are_one_step_apart(tmp_path: Path) -> None:
    x = input_set("f32_wide")
    truth = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16).copy()
    planted = truth.copy()
    nan_at = np.flatnonzero(np.isnan(x))
    planted[nan_at] = 0x7FC1  # another quiet NaN payload: the same class
    i_zero = int(np.flatnonzero((x == 0) & ~np.signbit(x))[0])
    planted[i_zero] = 0x8000
    op = _cast_op("bfloat16", "f32_wide", "cast_float")
    (res,) = compare_capture(_bundle(tmp_path, "nan", [op], {op["name"]: planted}), infer="none").ops
    assert res.bit_exact == res.n - 1 and res.max_ulp == 1.0


# ---- scaled_mm ---------------------------------------------------------------------------------------------------
def _torch_scaled_mm(case: GemmCase) -> np.ndarray:
    """torch's CPU _scaled_mm on the fallback kernel: the oracle of a CPU capture."""
    from fp8sim.gemm.torch_cpu import fallback_kernel

    a, b, sa, sb = gemm_operands(case)
    dt = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
    at = torch.from_numpy(a).view(dt[case.a_format])
    bt = torch.from_numpy(np.ascontiguousarray(b.T)).view(dt[case.b_format]).t()
    with fallback_kernel():
        out = getattr(torch, case.out_dtype)
        d = torch._scaled_mm(
            at, bt, torch.from_numpy(sa), torch.from_numpy(sb), out_dtype=out, use_fast_accum=case.fast_accum
        )
    return (d.view(torch.int32) if case.out_dtype == "float32" else d.view(torch.int16)).numpy().copy()


def _ordered(bits: np.ndarray) -> np.ndarray:
    """float32 bit patterns as integers in the order of their values (IEEE sign-magnitude)."""
    b = bits.astype(np.int64)
    return np.where(b < 0, -(b & 0x7FFFFFFF) - 1, b)


def _exact_tensorwise(case: GemmCase) -> np.ndarray:
    """The ``exact`` accumulator's output (fp8sim.gemm.accumulators: the exact sum rounded once to float32,
    then the alpha epilogue ``fl32(fl32(sa * sb) * acc)``), from math.fsum of the exactly known products."""
    import math
    from fractions import Fraction

    a, b, sa, sb = gemm_operands(case)
    dt = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
    av, bv = a.view(dt[case.a_format]).astype(np.float64), b.view(dt[case.b_format]).astype(np.float64)
    alpha = np.float32(sa) * np.float32(sb)
    out = np.empty((case.m, case.n), np.float32)
    for i in range(case.m):
        for j in range(case.n):
            prods = av[i] * bv[:, j]  # exact: at most 4 x 4 significant bits each
            s = math.fsum(prods)
            assert Fraction(s) == sum(map(Fraction, prods.tolist()))  # the sum itself fits a float64
            out[i, j] = alpha * np.float32(s)
    return out


@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
def test_planted_gemm_errors_are_counted_in_output_ulps(tmp_path: Path, out_dtype: str) -> None:
    case = GemmCase(16, 16, 32, "e5m2", "e4m3", "rowwise" if out_dtype == "bfloat16" else "tensorwise", False,
                    out_dtype, 11)  # fmt: skip
    truth = _torch_scaled_mm(case)
    op = {"name": case.name, "kind": "scaled_mm", **case.to_dict()}
    (ok,) = compare_capture(_bundle(tmp_path, "ok", [op], {case.name: truth}), infer="auto").ops
    assert (ok.n, ok.bit_exact, ok.max_ulp, ok.mean_ulp) == (256, 256, 0.0, 0.0)
    assert ok.emulator == "accumulator dequantized_fp32" and ok.extra["torch_cpu_kernel"] == "fallback"
    assert "split_inference" not in ok.extra and "accumulator_inference" not in ok.extra  # nothing to explain
    assert ok.extra["native_vs_exact_mean_ulp"] == ok.extra["emulator_vs_exact_mean_ulp"]
    assert {k: ok.extra[k] for k in ("k", "fast_accum", "layout", "out_dtype", "formats")} == {
        "k": 32,
        "fast_accum": False,
        "layout": case.layout,
        "out_dtype": out_dtype,
        "formats": "e5m2xe4m3",
    }
    planted = truth.copy()
    val = planted.view(np.float32 if out_dtype == "float32" else ml_dtypes.bfloat16).astype(np.float64)
    assert val[0, 0] > 0  # row 0 of a and column 0 of b are positive
    neg = np.unravel_index(int(np.flatnonzero(val < 0)[0]), val.shape)
    planted[0, 0] += 3  # three steps away from zero
    planted[neg] += 1  # one step away from zero (sign-magnitude)
    (res,) = compare_capture(_bundle(tmp_path, "bad", [op], {case.name: planted})).ops
    assert (res.n, res.bit_exact, res.max_ulp) == (256, 254, 3.0) and res.mean_ulp == 4 / 256
    assert res.extra["native_vs_exact_mean_ulp"] != res.extra["emulator_vs_exact_mean_ulp"]
    # the unsplit device model reproduces all but the two planted outputs; S in 2..16 under 3 schemes tried too
    assert res.extra["split_inference"] == {
        "match": None, "closest": [1, "none"], "agreement": 254 / 256, "tried": 1 + 15 * 3,
        "text": "no candidate matches; closest split_k=(1, 'none') agrees on 99.22%"}  # fmt: skip
    acc = {c["name"]: c["fraction"] for c in res.extra["accumulator_inference"]["candidates"]}
    assert acc["accumulator dequantized_fp32"] == max(acc.values()) == 254 / 256
    assert not any("use_fast_accum" in name for name in acc)  # profiles tried as the capture asked (split)
    flip = truth.copy()
    flip[0, 0] ^= np.array(1 << (31 if out_dtype == "float32" else 15)).astype(flip.dtype)  # x captured as -x
    (neg,) = compare_capture(_bundle(tmp_path, "flip", [op], {case.name: flip}), infer="none").ops
    magnitude = int(truth[0, 0])  # positive: its bits count the steps from +0; -0 is one more step
    assert neg.bit_exact == 255 and neg.max_ulp == 2 * magnitude + 1
    if out_dtype == "float32":  # the distance to the exact product, counted here from Python's exact sums
        ref = _ordered(_exact_tensorwise(case).view(np.int32))
        assert ok.extra["emulator_vs_exact_mean_ulp"] == float(np.abs(_ordered(truth) - ref).mean()) > 0.5
        assert res.extra["native_vs_exact_mean_ulp"] == float(np.abs(_ordered(planted) - ref).mean())
        assert res.extra["emulator_vs_exact_mean_ulp"] == ok.extra["emulator_vs_exact_mean_ulp"]
    (quiet,) = compare_capture(_bundle(tmp_path, "q", [op], {case.name: planted}), infer="none").ops
    assert "accumulator_inference" not in quiet.extra and "split_inference" in quiet.extra
    (loud,) = compare_capture(_bundle(tmp_path, "l", [op], {case.name: truth}), infer="all").ops
    assert "accumulator_inference" in loud.extra and "split_inference" not in loud.extra


# ---- the result helpers and compare_capture's bookkeeping ----------------------------------------------------
def test_cast_convention_follows_the_captured_device_and_torch_version() -> None:
    assert cast_convention_for({"device": "cpu", "torch": "2.13.0"}) == "torch_eager"
    assert cast_convention_for({"device": "cpu", "torch": "2.13.0+cpu"}) == "torch_eager"
    assert cast_convention_for({"device": "cpu", "torch": "2.14.1"}) == "torch_eager"
    assert cast_convention_for({"device": "cpu", "torch": "3.0"}) == "torch_eager"
    assert cast_convention_for({"device": "cpu", "torch": "2.13+cpu"}) == "torch_eager"  # the schema takes "X.Y..."
    assert cast_convention_for({"device": "cpu", "torch": "2.14.0a0+git1234abc"}) == "torch_eager"  # a nightly
    assert cast_convention_for({"device": "cpu", "torch": "2.12.9"}) == "torch_eager_legacy"
    assert cast_convention_for({"device": "cpu", "torch": "1.99"}) == "torch_eager_legacy"
    assert cast_convention_for({"torch": "2.13.0"}) == "torch_eager"  # no device: a CPU capture
    assert cast_convention_for({"device": "cpu"}) == "torch_eager_legacy"  # no version: the oldest
    assert cast_convention_for({"device": "cuda:1", "torch": "2.13.0"}) is None


def test_accumulator_follows_the_captured_device() -> None:
    cpu = {"device": "cpu"}
    assert accumulator_for(cpu, True) == accumulator_for(cpu, False) == "dequantized_fp32"
    assert accumulator_for({}, True, "fallback") == "dequantized_fp32"
    assert accumulator_for(cpu, False, "onednn") == "cpu_onednn"
    want = {(9, 0): ("hopper_fast", "hopper_split"), (8, 9): ("ada_fast", "ada_split"),
            (10, 0): ("blackwell", "blackwell_split"), (12, 0): ("blackwell", "blackwell_split"),
            (8, 0): ("exact", "exact"), (8, 6): ("exact", "exact"), (11, 0): ("exact", "exact")}  # fmt: skip
    for cc, (fast, split) in want.items():
        meta = {"device": "cuda", "compute_capability": list(cc)}
        assert (accumulator_for(meta, True, "onednn"), accumulator_for(meta, False)) == (fast, split), cc
    assert accumulator_for({"device": "cuda", "compute_capability": None}, True) == "exact"
    assert accumulator_for({"device": "cuda"}, False) == "exact"


def _ops() -> list[OpResult]:
    return [
        OpResult("cast/e4m3/a", "cast", n=10, bit_exact=10),
        OpResult("cast/e4m3/b", "cast", n=10, bit_exact=9),
        OpResult("cast/e5m2/a", "cast", skipped="no float8_e5m2"),
        OpResult("scaled_mm/x", "scaled_mm", n=4, bit_exact=0),
        OpResult("torchao", "torchao_float8", skipped="torchao is not installed"),
    ]


def test_result_helpers_count_gate_and_explain_vacuous_gates() -> None:
    res = CompareResult("/some/where/run.fp8cap", {}, _ops())
    assert res.summary() == "5 ops: 1 bit-exact, 2 not bit-exact, 2 skipped"
    assert [o.name for o in res.failing(["cast/*"])] == ["cast/e4m3/b"]
    assert [o.name for o in res.failing(["*/a", "scaled_mm/*"])] == ["scaled_mm/x"]
    assert res.failing(["torchao", "cast/e5m2/*", "cast/e4m3/a"]) == []
    assert res.vacuous(["cast/*", "scaled_mm/x"], "--require-bit-exact") == []
    assert res.vacuous(["nothing*", "torchao*", "cast/e5m2/*"], "--ops") == [
        "--ops 'nothing*' matches no op in run.fp8cap",
        "--ops 'torchao*': all 1 matching ops were skipped (torchao is not installed)",
        "--ops 'cast/e5m2/*': all 1 matching ops were skipped (no float8_e5m2)",
    ]
    both = CompareResult("x", {}, [OpResult("a/1", "cast", skipped="s1"), OpResult("a/2", "cast", skipped="s2")])
    assert both.vacuous(["a/*"], "-g") == ["-g 'a/*': all 2 matching ops were skipped (s1)"]
    assert OpResult("e", "cast").rate == 1.0 and OpResult("h", "cast", n=4, bit_exact=1).rate == 0.25
    fresh = OpResult("f", "cast")
    assert (fresh.emulator, fresh.n, fresh.bit_exact, fresh.max_ulp, fresh.mean_ulp) == ("", 0, 0, 0.0, 0.0)
    assert fresh.clusters == {} and fresh.extra == {} and fresh.skipped is None
    assert CompareResult("p", {}, []).notes == []


def test_compare_keeps_skipped_and_unknown_ops_and_notes_only_for_gemms_it_runs(tmp_path: Path) -> None:
    x = input_set("f16_all")
    cast = _cast_op("e4m3", "f16_all")
    skipped = {"name": "scaled_mm/e4m3xe4m3/x", "kind": "scaled_mm", "skipped": "RuntimeError: no"}
    future = {"name": "future/op", "kind": "fused_thing"}
    arrays = {cast["name"]: _torch_e4m3(x)}
    meta = {k: v for k, v in CPU.items() if not k.startswith("torch_cpu")}  # an old capture: no kernel record
    res = compare_capture(_bundle(tmp_path, "mix", [cast, skipped, future], arrays, meta), infer="none")
    assert res.path.endswith("mix.fp8cap") and res.meta["device_name"] == "planted"
    assert [(o.name, o.kind, o.skipped) for o in res.ops] == [
        (cast["name"], "cast", None),
        (skipped["name"], "scaled_mm", "RuntimeError: no"),
        ("future/op", "fused_thing", "unknown op kind 'fused_thing' (newer fp8sim?)"),
    ]
    assert res.ops[0].bit_exact == res.ops[0].n == x.size
    assert res.notes == []  # the only GEMM was skipped: nothing to say about the CPU kernel
    only = compare_capture(_bundle(tmp_path, "mix2", [cast, skipped, future], arrays, meta), ops=["future/*"])
    assert [o.name for o in only.ops] == ["future/op"]
    case = GemmCase(16, 16, 32, "e4m3", "e4m3", "tensorwise", False, "float32", 9)
    gemm = {"name": case.name, "kind": "scaled_mm", **case.to_dict()}
    path = _bundle(tmp_path, "old", [cast, gemm], {**arrays, case.name: _torch_scaled_mm(case)}, meta)
    old = compare_capture(path, ops=["scaled_mm/*"])
    assert len(old.notes) == 1 and "does not record which torch CPU _scaled_mm kernel" in old.notes[0]
    assert old.ops[0].bit_exact == old.ops[0].n and "torch_cpu_kernel" not in old.ops[0].extra
    assert compare_capture(path, ops=["cast/*"]).notes == []


def test_cpu_kernel_notes_name_the_captured_kernel_and_this_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    from fp8sim.gemm import torch_cpu

    monkeypatch.setattr(torch_cpu, "torch_cpu_kernel", lambda: "fallback")
    assert cmp.cpu_kernel_notes({"device": "cuda:0"}) == []
    assert cmp.cpu_kernel_notes({"torch_cpu_kernel": "fallback"}) == []  # no device: a CPU capture
    (old,) = cmp.cpu_kernel_notes({"device": "cpu"})
    assert old.startswith("this CPU capture does not record which torch CPU _scaled_mm kernel produced it")
    amx = {"device": "cpu", "torch_cpu_kernel": "onednn", "cpu_amx_int8": "yes", "onednn": "3.12.0",
           "mkldnn_enabled": "yes"}  # fmt: skip
    where = "captured where torch's CPU _scaled_mm runs onednn (AMX-INT8, oneDNN 3.12.0, oneDNN enabled)"
    model, host = cmp.cpu_kernel_notes(amx)
    assert model.startswith(where + ": its tensorwise GEMMs are modelled by accumulator cpu_onednn")
    assert model.endswith("`fp8sim capture --torch-cpu-kernel fallback` records the fallback, which fp8sim "
                          "reproduces bit for bit")  # fmt: skip
    assert host == where + "; this host runs fallback: the comparison follows the capture's kernel, not this host's"
    mixed = {"device": "cpu", "torch_cpu_kernel": "fallback", "torch_cpu_kernel_mixed": "onednn"}
    (note,) = cmp.cpu_kernel_notes(mixed)
    assert note.startswith("captured where torch's CPU _scaled_mm runs fallback (no AMX-INT8, oneDNN -, oneDNN "
                           "disabled): its tensorwise GEMMs are modelled by accumulator cpu_onednn")  # fmt: skip
    monkeypatch.setattr(torch_cpu, "torch_cpu_kernel", lambda: "onednn")
    assert len(cmp.cpu_kernel_notes(amx)) == 1


def test_accumulator_inference_skips_a_kernel_that_refuses_rowwise_scales() -> None:
    """Fixed: a rowwise GEMM no model reproduced made compare raise, because cpu_onednn (torch's oneDNN CPU
    kernel, which takes one float scale per operand) refused the operands; it is now named as not tried."""
    from fp8sim.native import infer_accumulator

    case = GemmCase(16, 16, 32, "e4m3", "e4m3", "rowwise", False, "bfloat16", 4)
    a, b, sa, sb = gemm_operands(case)
    truth = _torch_scaled_mm(case)
    res = infer_accumulator(a, b, sa, sb, truth, out_dtype="bfloat16", use_fast_accum=False, a_format="e4m3",
                            b_format="e4m3", profiles=[])  # fmt: skip
    assert "accumulator cpu_onednn" not in [c.name for c in res.candidates]
    assert res.notes == ("not tried, they refuse these operands: accumulator cpu_onednn",)
    assert "accumulator dequantized_fp32" in [c.name for c in res.matches]
    with pytest.raises(ValueError, match="cpu_onednn"):  # the only candidate refuses: that is the answer
        infer_accumulator(a, b, sa, sb, truth, out_dtype="bfloat16", a_format="e4m3", b_format="e4m3",
                          accumulators=["cpu_onednn"], profiles=[])  # fmt: skip


# ---- torchao's quantizers ---------------------------------------------------------------------------------------
def _torchao_truth(fmt: str, granularity: str, pow2: bool) -> tuple[np.ndarray, np.ndarray]:
    """torchao 0.18's own tensor_to_scale and to_fp8_saturated on the capture's input (the oracle)."""
    fu = require("torchao.float8.float8_utils")
    from torchao.float8.config import ScalingGranularity

    from fp8sim.native.capture import torchao_input

    dt = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[fmt]
    x = torch.from_numpy(torchao_input().view(np.int16)).view(torch.bfloat16)
    g = ScalingGranularity.TENSORWISE if granularity == "tensorwise" else ScalingGranularity.AXISWISE
    dim = None if granularity == "tensorwise" else -1
    scale = fu.tensor_to_scale(x, dt, scaling_granularity=g, axiswise_dim=dim, round_scales_to_power_of_2=pow2)
    data = fu.to_fp8_saturated(x.float() * scale, dt)
    return data.view(torch.uint8).numpy().copy(), scale.float().numpy().copy()


def test_planted_torchao_errors_are_counted_per_code_and_per_scale(tmp_path: Path) -> None:
    codes, scale = _torchao_truth("e4m3", "axiswise", False)
    name = "torchao/e4m3/axiswise/pow2=False"
    op = {"name": name, "kind": "torchao_float8", "format": "e4m3", "granularity": "axiswise", "pow2": False}
    flat = scale.reshape(-1)  # the schema takes any shape of 64 scales
    (ok,) = compare_capture(_bundle(tmp_path, "ok", [op], {name + "/codes": codes, name + "/scale": flat})).ops
    assert (ok.kind, ok.emulator) == ("torchao_float8", "fp8sim.scaling.current.quantize_torchao")
    assert (ok.n, ok.bit_exact, ok.max_ulp) == (64 * 128 + 64, 64 * 128 + 64, 0.0)
    assert ok.clusters == {"codes": [8192, 0], "scales": [64, 0]}
    i = int(np.flatnonzero((codes.reshape(-1) & 0x7F) == 0x38)[0])  # a code of magnitude 1.0: one step up is 1.125
    bad_codes = codes.copy().reshape(-1)
    bad_codes[i] += 1
    bad_scale = flat.copy()
    bad_scale[3] = np.nextafter(bad_scale[3], np.float32(np.inf))
    arrays = {name + "/codes": bad_codes.reshape(codes.shape), name + "/scale": bad_scale}
    (res,) = compare_capture(_bundle(tmp_path, "bad", [op], arrays)).ops
    assert (res.n, res.bit_exact, res.max_ulp) == (8256, 8254, 1.0) and res.mean_ulp == 2 / 8256
    assert res.clusters == {"codes": [8192, 1], "scales": [64, 1]}


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_a_torchao_nan_code_is_a_mismatch(tmp_path: Path, fmt: str) -> None:
    """torchao saturates: no captured code is NaN, so a NaN code is a fault, never a match."""
    codes, scale = _torchao_truth(fmt, "tensorwise", True)
    name = f"torchao/{fmt}/tensorwise/pow2=True"
    op = {"name": name, "kind": "torchao_float8", "format": fmt, "granularity": "tensorwise", "pow2": True}
    bad = codes.copy()
    assert codes[0, 0] & 0x7F != 0x7F
    bad[0, 0] = 0x7F  # NaN in e4m3fn and in e5m2
    (res,) = compare_capture(_bundle(tmp_path, fmt, [op], {name + "/codes": bad, name + "/scale": scale})).ops
    assert res.n == 8193 and res.bit_exact == 8192 and res.clusters["codes"][1] == 1


def test_a_gemm_of_an_amx_host_is_labelled_as_not_reproducing_onednn_and_not_split_searched(tmp_path: Path) -> None:
    case = GemmCase(16, 16, 32, "e4m3", "e4m3", "tensorwise", False, "float32", 13)
    op = {"name": case.name, "kind": "scaled_mm", **case.to_dict()}
    planted = _torch_scaled_mm(case)
    planted[0, 0] += 1
    amx = {**CPU, "cpu_amx_int8": "yes", "mkldnn_enabled": "yes", "torch_cpu_kernel": "onednn", "onednn": "3.12.0"}
    (res,) = compare_capture(_bundle(tmp_path, "amx", [op], {case.name: planted}, amx), infer="none").ops
    assert res.emulator == "accumulator cpu_onednn (oneDNN's summation order not reproduced)"
    assert res.extra["torch_cpu_kernel"] == "onednn" and res.bit_exact < res.n
    assert "split_inference" not in res.extra  # a split search cannot explain oneDNN's order
