"""Rule inference: which rounding rule, format and saturation explain a captured cast or elementwise output
(``fp8sim.native.infer_rule``), which accumulator preset or profile a captured GEMM
(``fp8sim.native.infer_accumulator``); through ``compare`` on planted captures, its CLI line and report.

Every candidate's fraction is recomputed here from an independent rounding: gfloat 0.5.2's
``round_ndarray`` (``format_info_bfloat16``, ``_binary16``, ``_ocp_e4m3``, ``_ocp_e5m2``; its five
deterministic modes, ``sat`` True/False), SR-compatible meaning "equals gfloat's RD or RU".  The planted
truncation is aiter#5151's ``bf16_truncate`` (``(x.view(int32) >> 16).to(int16).view(bfloat16)``); the
planted GEMM outputs come from mmaemu 0.1.0 (an independent model of Hopper's and Ada's ``_scaled_mm``).
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

from fp8sim.native import compare_capture, infer_accumulator, infer_rule
from fp8sim.native.fileformat import write_bundle
from fp8sim.native.suite import SUITE_VERSION, GemmCase, gemm_operands, input_set
from fp8sim.testing.oracles import require

gfloat = require("gfloat")
from gfloat import formats as gf  # noqa: E402

GF = {
    "bfloat16": gf.format_info_bfloat16,
    "float16": gf.format_info_binary16,
    "e4m3": gf.format_info_ocp_e4m3,
    "e5m2": gf.format_info_ocp_e5m2,
}
MODES = {
    "nearest_even": gfloat.RoundMode.TiesToEven,
    "nearest_away": gfloat.RoundMode.TiesToAway,
    "toward_zero": gfloat.RoundMode.TowardZero,
    "up": gfloat.RoundMode.TowardPositive,
    "down": gfloat.RoundMode.TowardNegative,
}


def _f64(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # signalling NaN patterns among the inputs
        return x.astype(np.float64)


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return ((a == b) & (np.signbit(a) == np.signbit(b))) | (np.isnan(a) & np.isnan(b))


def _reference_fractions(x: np.ndarray, y: np.ndarray, fmt: str) -> dict[tuple[str, bool], float]:
    """{(rule, saturate): fraction of non-NaN inputs whose gfloat rounding is y}; rule "stochastic": RD or RU."""
    x64, y64 = _f64(x).reshape(-1), _f64(y).reshape(-1)
    keep = ~np.isnan(x64)
    xk, yk = x64[keep], y64[keep]
    out = {}
    for sat in (True, False):
        r = {m: gfloat.round_ndarray(GF[fmt], xk, rnd, sat=sat) for m, rnd in MODES.items()}
        for m in MODES:
            out[m, sat] = float(_same(r[m], yk).mean())
        out["stochastic", sat] = float((_same(r["down"], yk) | _same(r["up"], yk)).mean())
    return out


def _check_fractions(inf_dict: dict, want: dict[tuple[str, bool], float], fmt: str) -> None:
    got = {(c["rounding"], c["saturate"]): c["fraction"] for c in inf_dict["candidates"] if c["format"] == fmt}
    assert got.keys() == want.keys()
    for key, frac in want.items():
        assert got[key] == frac, f"{fmt} {key}: inferred {got[key]!r}, gfloat says {frac!r}"


def _truncate_bf16(x: np.ndarray) -> np.ndarray:
    """aiter#5151's bf16_truncate: the top 16 bits of the float32 pattern."""
    return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


# ---- casts and elementwise outputs from Python ---------------------------------------------------------------
def test_truncating_rmsnorm_output_is_identified_as_rz_from_torch_tensors() -> None:
    """aiter#5151: a fused RMSNorm whose bf16 store truncates; the float32 result is the reference."""
    torch = require("torch")
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(16, 256, generator=g) * 3, torch.randn(256, generator=g)
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    out = (ref.view(torch.int32) >> 16).to(torch.int16).view(torch.bfloat16)
    res = infer_rule(ref, out)
    assert res.matches and res.matches[0].params == {"format": "bfloat16", "rounding": "toward_zero", "saturate": True}
    assert {c.params["rounding"] for c in res.matches} == {"toward_zero"}  # no overflow: both saturations fit
    assert res.describe().startswith("explained by bfloat16 RZ (toward_zero), satfinite (equally: bfloat16 RZ")
    _check_fractions(res.to_dict(), _reference_fractions(ref.numpy(), out.float().numpy(), "bfloat16"), "bfloat16")
    rne = infer_rule(ref, ref.to(torch.bfloat16))  # torch's own cast: RN-even
    assert rne.matches[0].params["rounding"] == "nearest_even"


@pytest.mark.parametrize(
    ("fmt", "mode", "sat"),
    [("e4m3", "toward_zero", True), ("e4m3", "nearest_even", False), ("e5m2", "up", True), ("float16", "down", False)],
)
def test_planted_rule_is_named_and_every_fraction_matches_gfloat(fmt: str, mode: str, sat: bool) -> None:
    x = input_set("f32_special")
    y = gfloat.round_ndarray(GF[fmt], _f64(x), MODES[mode], sat=sat)
    dtype = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2, "float16": np.float16}[fmt]
    typed = y.astype(dtype)
    res = infer_rule(x, typed)
    assert res.matches[0].params == {"format": fmt, "rounding": mode, "saturate": sat}, res.describe()
    _check_fractions(res.to_dict(), _reference_fractions(x, y, fmt), fmt)


def test_values_in_a_wide_dtype_are_matched_against_several_formats() -> None:
    """float32 arrays holding E5M2 values: the format is found among the candidates named."""
    x = input_set("bf16_all").astype(np.float32)
    y = gfloat.round_ndarray(GF["e5m2"], _f64(x), MODES["nearest_even"], sat=True).astype(np.float32)
    res = infer_rule(x, y, format=["e4m3", "e5m2"])
    assert res.matches[0].name == "e5m2 RN-even (nearest_even), satfinite"
    assert all(c.params["format"] == "e5m2" for c in res.matches)
    for fmt in ("e4m3", "e5m2"):
        _check_fractions(res.to_dict(), _reference_fractions(x, y, fmt), fmt)


def test_stochastic_rounding_is_recognised_as_sr_compatible_only() -> None:
    x = input_set("f32_special")
    x64 = _f64(x)
    rd = gfloat.round_ndarray(GF["e4m3"], x64, MODES["down"], sat=True)
    ru = gfloat.round_ndarray(GF["e4m3"], x64, MODES["up"], sat=True)
    pick = np.random.default_rng(1).random(x.shape) < 0.5
    y = np.where(pick, rd, ru)
    res = infer_rule(x, y.astype(ml_dtypes.float8_e4m3fn))
    assert not res.matches
    assert res.describe().startswith("stochastic-rounding compatible (e4m3 SR-compatible (RD or RU), satfinite")
    _check_fractions(res.to_dict(), _reference_fractions(x, y, "e4m3"), "e4m3")


def test_no_candidate_explains_a_tampered_output() -> None:
    x = input_set("f32_special")
    with np.errstate(invalid="ignore"):
        y = x.astype(ml_dtypes.bfloat16)
    bits = y.view(np.uint16).copy()
    finite = np.flatnonzero(np.isfinite(x) & (np.abs(x) > 1e-30) & (np.abs(x) < 1e30))[:5]
    bits[finite] += 2  # two ulps away: no rule gives it, nor stochastic rounding
    res = infer_rule(x, bits, format="bfloat16")
    n = int((~np.isnan(x)).sum())
    assert not res.matches and res.best.fraction == (n - 5) / n
    assert res.describe() == f"no rule candidate explains every output; closest: {res.best.name} ({(n - 5) / n:.2%})"


def test_bad_arguments_name_the_argument() -> None:
    x = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="same shape"):
        infer_rule(x, np.ones(3, np.float16))
    with pytest.raises(ValueError, match="names no format: pass format="):
        infer_rule(x, np.ones(4, np.uint8))
    with pytest.raises(ValueError, match="x's own dtype float32: pass format="):
        infer_rule(x, x)
    with pytest.raises(ValueError, match="unknown format 'e4m4'; known: e4m3, e5m2"):
        infer_rule(x, x, format="e4m4")
    with pytest.raises(ValueError, match="integer codes: pass exactly one format"):
        infer_rule(x, np.ones(4, np.uint8), format=["e4m3", "e5m2"])
    with pytest.raises(ValueError, match="rules must be among nearest_even"):
        infer_rule(x, np.ones(4, np.float16), rules=["banker"])
    with pytest.raises(TypeError, match="x must be a float array"):
        infer_rule(np.ones(4, np.int32), np.ones(4, np.float16))


# ---- planted captures through compare -----------------------------------------------------------------------
def _bundle(tmp_path, name: str, ops: list, arrays: dict, meta: dict | None = None) -> str:  # noqa: ANN001
    meta = meta or {"device": "cpu", "device_name": "planted", "compute_capability": None, "torch": "2.13.0",
                    "cuda": None, "driver": None, "fp8sim": "test", "date": "2026-12-01"}  # fmt: skip
    doc = {"meta": meta, "ops": ops, "suite": "quick", "suite_version": SUITE_VERSION}
    return str(write_bundle(tmp_path / f"{name}.fp8cap", arrays, doc))


def test_planted_truncating_fp32_to_bf16_capture_is_identified(tmp_path, capsys) -> None:  # noqa: ANN001
    x = input_set("f32_wide")
    trunc = _truncate_bf16(x)
    fp8 = gfloat.round_ndarray(GF["e4m3"], _f64(input_set("f32_special")), MODES["toward_zero"], sat=True)
    ops = [
        {"name": "cast/bfloat16/f32_wide", "kind": "cast_float", "format": "bfloat16", "inputs": "f32_wide", "seed": 0},
        {"name": "cast/e4m3/f32_special", "kind": "cast", "format": "e4m3", "inputs": "f32_special", "seed": 0},
    ]
    arrays = {ops[0]["name"]: trunc, ops[1]["name"]: fp8.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)}
    path = _bundle(tmp_path, "trunc", ops, arrays)
    res = {o.name: o for o in compare_capture(path).ops}
    bf = res["cast/bfloat16/f32_wide"]
    assert bf.bit_exact < bf.n  # RN-even is not what the kernel did
    inf = bf.extra["rule_inference"]
    assert inf["matches"] == ["bfloat16 RZ (toward_zero), non-saturating"]  # Inf and overflows tell the saturation
    assert inf["text"] == "explained by bfloat16 RZ (toward_zero), non-saturating"
    _check_fractions(inf, _reference_fractions(x, trunc.view(ml_dtypes.bfloat16), "bfloat16"), "bfloat16")
    nan_in = np.isnan(x)
    n_inf = int(np.isinf(trunc[nan_in].view(ml_dtypes.bfloat16).astype(np.float32)).sum())
    assert inf["notes"] == [f"{int(nan_in.sum())} NaN inputs (not counted): {int(nan_in.sum()) - n_inf} gave NaN in "
                            f"bfloat16, {n_inf} Inf, 0 a number"]  # fmt: skip
    e4 = res["cast/e4m3/f32_special"].extra["rule_inference"]
    assert e4["matches"] == ["e4m3 RZ (toward_zero), satfinite"]

    from fp8sim.cli import main

    assert main(["compare", path, "--no-progress"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("cast/bfloat16/f32_wide"))
    assert line.endswith("; rule: explained by bfloat16 RZ (toward_zero), non-saturating"), line
    assert main(["compare", path, "--no-progress", "--infer", "none"]) == 0
    assert "rule:" not in capsys.readouterr().out

    require("matplotlib")
    from fp8sim.report import write_compare_report

    md = write_compare_report(compare_capture(path), tmp_path / "report").read_text()
    assert "## Rules inferred from the outputs" in md
    assert "| cast/bfloat16/f32_wide | explained by bfloat16 RZ (toward_zero), non-saturating<br>" in md


def _mmaemu(case: GemmCase, profile: str, fast: bool) -> np.ndarray:
    torch = require("torch")
    mmaemu = require("mmaemu")
    a, b, sa, sb = gemm_operands(case)
    at = torch.from_numpy(a).view(torch.float8_e4m3fn)
    bt = torch.from_numpy(np.ascontiguousarray(b.T)).view(torch.float8_e4m3fn).t()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = mmaemu.scaled_mm(at, bt, torch.from_numpy(sa), torch.from_numpy(sb), out_dtype=torch.float32,
                             use_fast_accum=fast, profile=profile, splitk=1)  # fmt: skip
    return d.view(torch.int32).numpy()


def test_planted_hopper_fast_gemm_capture_is_identified(tmp_path, capsys) -> None:  # noqa: ANN001
    """A CPU capture whose _scaled_mm output is Hopper fast accumulation (mmaemu): the CPU emulator
    (dequantized_fp32) misses it, the inference names hopper_fast; the Ada and Hopper-split fractions equal
    mmaemu's own Ada / promoted outputs' agreement with the capture.  One flipped bit: nothing explains it."""
    case = GemmCase(16, 16, 256, "e4m3", "e4m3", "tensorwise", True, "float32", 21)
    planted = _mmaemu(case, "hopper", True)
    ops = [{"name": case.name, "kind": "scaled_mm", **case.to_dict()}]
    path = _bundle(tmp_path, "hopper", ops, {case.name: planted})
    (res,) = compare_capture(path).ops
    assert res.bit_exact < res.n
    inf = res.extra["accumulator_inference"]
    assert inf["matches"] == ["accumulator hopper_fast"], inf["text"]
    assert inf["text"] == "explained by accumulator hopper_fast"
    frac = {c["name"]: c["fraction"] for c in inf["candidates"]}
    assert frac["accumulator ada_fast"] == float((_mmaemu(case, "ada", True) == planted).mean()) < 1
    assert frac["accumulator hopper_split"] == float((_mmaemu(case, "hopper", False) == planted).mean()) < 1

    # the CLI, on the same output claimed by a Hopper: bit-exact, and with --infer all the inference still runs
    from fp8sim.cli import main

    hopper = {"device": "cuda", "device_name": "planted sm_90", "compute_capability": [9, 0], "torch": "2.13.0",
              "cuda": "13.0", "driver": None, "fp8sim": "test", "date": "2026-12-01"}  # fmt: skip
    gpu = _bundle(tmp_path, "sm90", ops, {case.name: planted}, hopper)
    assert main(["compare", gpu, "--no-progress", "--infer", "all", "--require-bit-exact", "scaled_mm/*"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith(case.name))
    assert line.endswith("; accumulator: explained by accumulator hopper_fast"), line

    # from Python, with torch tensors; then one flipped output bit
    torch = require("torch")
    a, b, sa, sb = (torch.from_numpy(t) for t in gemm_operands(case))
    a, b = a.view(torch.float8_e4m3fn), b.view(torch.float8_e4m3fn)
    direct = infer_accumulator(a, b, sa, sb, torch.from_numpy(planted).view(torch.float32), use_fast_accum=True)
    assert direct.to_dict()["candidates"] == inf["candidates"]
    bad = planted.copy()
    bad[0, 0] ^= 1
    t = infer_accumulator(a, b, sa, sb, torch.from_numpy(bad).view(torch.float32), use_fast_accum=True)
    assert not t.matches and t.best.name == "accumulator hopper_fast" and t.best.fraction == 1 - 1 / 256
    assert t.describe() == "no accumulator candidate explains every output; closest: accumulator hopper_fast (99.61%)"


def test_accumulator_inference_arguments() -> None:
    case = GemmCase(4, 4, 32, "e4m3", "e4m3", "tensorwise", True, "float32", 1)
    a, b, sa, sb = gemm_operands(case)
    out = np.zeros((4, 4), np.float32)
    kw = {"a_format": "e4m3", "b_format": "e4m3"}
    with pytest.raises(ValueError, match="unknown accumulators \\['hopper'\\]; known: exact"):
        infer_accumulator(a, b, sa, sb, out, accumulators=["hopper"], **kw)
    with pytest.raises(ValueError, match="out_dtype must be one of float32, bfloat16, float16"):
        infer_accumulator(a, b, sa, sb, out.view(np.int32), **kw)
    with pytest.raises(TypeError, match="out must be float32, bfloat16 or float16"):
        infer_accumulator(a, b, sa, sb, out.astype(np.float64), **kw)
    res = infer_accumulator(a, b, sa, sb, out, accumulators=["exact"], profiles=["h200"], use_fast_accum=True, **kw)
    assert [c.name for c in res.candidates] == ["accumulator exact"]
    assert res.notes == ("not tried, split-K unknown for this shape: profile h200",)
    with pytest.raises(ValueError, match="infer must be one of auto, all, none"):
        compare_capture("nowhere.fp8cap", infer="some")


def test_cast_float_ops_are_validated_by_the_capture_schema(tmp_path) -> None:  # noqa: ANN001
    from fp8sim.native.fileformat import CaptureFileError, read_bundle

    x = input_set("f16_all")
    op = {"name": "cast/bfloat16/f16_all", "kind": "cast_float", "format": "bfloat16", "inputs": "f16_all", "seed": 0}
    with np.errstate(invalid="ignore"):
        good = _bundle(tmp_path, "good", [op], {op["name"]: x.astype(ml_dtypes.bfloat16).view(np.uint16)})
    assert read_bundle(good)[0]["ops"][0]["kind"] == "cast_float"
    bad_fmt = _bundle(tmp_path, "fmt", [{**op, "format": "e4m3"}], {op["name"]: x.view(np.uint16)})
    with pytest.raises(CaptureFileError, match="ops\\[0\\].format is 'e4m3'; allowed: bfloat16, float16"):
        read_bundle(bad_fmt)
    bad_dtype = _bundle(tmp_path, "dtype", [op], {op["name"]: x.view(np.int16)})
    with pytest.raises(CaptureFileError, match="has dtype int16, expected uint16"):
        read_bundle(bad_dtype)
