"""``fp8sim compare``: recompute every captured op with the emulator and measure the agreement.

Emulator choices follow the captured device: casts under the named convention that describes the
device's torch (``torch_eager`` for torch >= 2.13 on the CPU, ``torch_eager_legacy`` before; on a
GPU the best of all conventions, each one's rate reported); ``scaled_mm`` with the accumulator of
the device (CPU: the kernel the capture records, :mod:`fp8sim.gemm.torch_cpu`: the fallback's
``dequantized_fp32`` arithmetic, or ``cpu_onednn``, whose summation order is not oneDNN's, so it is not
claimed bit-exact; sm_89: ``ada_*``; sm_90: ``hopper_*``; sm_100/sm_120: ``blackwell*``; fast or split as
captured); casts to bfloat16 and float16 with RN-even (ml_dtypes); torchao ops with
``fp8sim.scaling.current.quantize_torchao``.  ``CompareResult.notes`` says where a CPU capture's kernel
differs from this host's, or was not recorded.

Rule inference (``infer``): which rounding rule, format and saturation explain each cast
(:func:`fp8sim.native.infer_rounding.infer_rule`) and which accumulator preset or device profile each
GEMM (:func:`fp8sim.native.infer_gemm.infer_accumulator`), with the fraction of outputs every candidate
explains.  ``"auto"`` (default): every cast, and the GEMMs the device's accumulator does not reproduce;
``"all"``; ``"none"``.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._util.progress import Progress
from ..cast import encode
from ..cast._tables import code_values
from ..cast.conventions import CONVENTIONS
from ..formats import FORMATS, FloatFormat
from ..gemm import scaled_mm
from ..gemm.torch_cpu import kernel_of_capture
from .fileformat import read_bundle
from .suite import GemmCase, gemm_operands, input_set

__all__ = ["OpResult", "CompareResult", "compare_capture", "cast_convention_for", "accumulator_for", "INFER"]
INFER = ("auto", "all", "none")


@dataclass
class OpResult:
    """Agreement of one captured op with the emulator."""

    name: str
    kind: str
    emulator: str = ""
    n: int = 0
    bit_exact: int = 0
    max_ulp: float = 0.0
    mean_ulp: float = 0.0
    clusters: dict[str, list[int]] = field(default_factory=dict)  # category -> [count, mismatches]
    extra: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None

    @property
    def rate(self) -> float:
        return self.bit_exact / self.n if self.n else 1.0


@dataclass
class CompareResult:
    path: str
    meta: dict[str, Any]
    ops: list[OpResult]
    notes: list[str] = field(default_factory=list)

    def failing(self, patterns: list[str]) -> list[OpResult]:
        """Ops whose name matches one of the glob ``patterns`` and that are not bit-exact."""
        return [
            o
            for o in self.ops
            if o.skipped is None and o.bit_exact < o.n and any(fnmatch.fnmatch(o.name, p) for p in patterns)
        ]

    def vacuous(self, patterns: list[str], option: str) -> list[str]:
        """Why a gate over ``patterns`` would pass without checking anything: a glob that matches
        no op, or whose every matching op was skipped.  One message per such glob."""
        problems = []
        for p in patterns:
            hit = [o for o in self.ops if fnmatch.fnmatch(o.name, p)]
            if not hit:
                problems.append(f"{option} {p!r} matches no op in {Path(self.path).name}")
            elif all(o.skipped is not None for o in hit):
                problems.append(f"{option} {p!r}: all {len(hit)} matching ops were skipped ({hit[0].skipped})")
        return problems

    def summary(self) -> str:
        """One line: ops compared, bit-exact, not bit-exact, skipped."""
        done = [o for o in self.ops if o.skipped is None]
        exact = sum(o.bit_exact == o.n for o in done)
        return (
            f"{len(self.ops)} ops: {exact} bit-exact, {len(done) - exact} not bit-exact, "
            f"{len(self.ops) - len(done)} skipped"
        )


def cast_convention_for(meta: dict[str, Any]) -> str | None:
    """The convention that describes the captured torch's casts, None when unknown (GPU)."""
    if meta.get("device", "cpu") != "cpu":
        return None
    version = tuple(int(p) for p in str(meta.get("torch", "0.0")).split("+")[0].split(".")[:2])
    return "torch_eager" if version >= (2, 13) else "torch_eager_legacy"


def accumulator_for(meta: dict[str, Any], fast: bool, cpu_kernel: str | None = None) -> str:
    """The accumulator preset that models the captured device's ``_scaled_mm`` (on the CPU: of the
    ``cpu_kernel`` the call took, the fallback where unknown)."""
    if meta.get("device", "cpu") == "cpu":
        return "cpu_onednn" if cpu_kernel == "onednn" else "dequantized_fp32"
    cc = tuple(meta.get("compute_capability") or (0, 0))
    if cc[0] == 9:
        return "hopper_fast" if fast else "hopper_split"
    if cc == (8, 9):
        return "ada_fast" if fast else "ada_split"
    if cc[0] in (10, 12):
        return "blackwell" if fast else "blackwell_split"
    return "exact"


def _ordered_f(bits: np.ndarray, width: int) -> np.ndarray:
    """Integers ordered like the floats whose bit patterns are ``bits`` (int32 or int16)."""
    b = bits.astype(np.int64)
    sign = 1 << (width - 1)
    b = np.where(b < 0, b + (1 << width), b)  # unsigned view
    return np.where(b & sign, sign - b - 1, b)  # negatives below positives, -0 next to +0


def _ulp_codes(got: np.ndarray, want: np.ndarray, f: FloatFormat) -> np.ndarray:
    """ULP distance between codes: steps on the format's sorted grid of distinct values (-0 and +0
    share a step)."""
    vals = code_values(f)
    nan = np.isnan(vals)
    uniq = np.unique(vals[~nan])
    rank = np.searchsorted(uniq, np.where(nan, 0, vals))
    return np.abs(rank[got].astype(np.int64) - rank[want])


def _stats(res: OpResult, equal: np.ndarray, ulp: np.ndarray) -> None:
    res.n = int(equal.size)
    res.bit_exact = int(equal.sum())
    finite = np.isfinite(ulp)
    res.max_ulp = float(ulp[finite].max()) if finite.any() else 0.0
    res.mean_ulp = float(ulp[finite].mean()) if finite.any() else 0.0


def _cast_categories(x: np.ndarray, f: FloatFormat) -> dict[str, np.ndarray]:
    with np.errstate(invalid="ignore"):
        x32 = x.astype(np.float32)
        a = np.abs(x32.astype(np.float64))
        nan, inf = np.isnan(a), np.isinf(a)
        tie = encode(x32, f, rounding="nearest_even") != encode(x32, f, rounding="nearest_away")
        sat = ~nan & ~inf & (a > f.max)
        sub = ~nan & (a > 0) & (a < f.min_normal)
    cats = {"nan": nan, "inf": inf, "saturation": sat, "tie": tie & ~sat, "subnormal": sub & ~tie, "zero": a == 0}
    taken = np.zeros(a.shape, bool)
    for m in cats.values():
        taken |= m
    cats["normal"] = ~taken
    return cats


def _compare_cast(op: dict, codes: np.ndarray, meta: dict, infer: str = "auto") -> OpResult:
    f = FORMATS[op["format"]]
    x = input_set(op["inputs"], op.get("seed", 0))
    res = OpResult(op["name"], "cast")
    nan_codes = np.isnan(code_values(f))
    rates: dict[str, float] = {}
    results: dict[str, np.ndarray] = {}
    for name, conv in CONVENTIONS.items():
        if conv.formats is not None and f.name not in conv.formats:
            continue
        emu = conv.encode(x, f)
        eq = (emu == codes) | (nan_codes[emu] & nan_codes[codes])
        rates[name], results[name] = float(eq.mean()), emu
    chosen = cast_convention_for(meta)
    if chosen not in rates:
        chosen = max(rates, key=lambda k: rates[k])
    emu = results[chosen]
    res.emulator = f"convention {chosen}"
    equal = (emu == codes) | (nan_codes[emu] & nan_codes[codes])
    ulp = _ulp_codes(emu, codes, f)
    ulp = np.where(nan_codes[emu] | nan_codes[codes], np.inf, ulp).astype(np.float64)
    ulp[equal] = 0
    _stats(res, equal, ulp)
    res.clusters = {k: [int(m.sum()), int((m & ~equal).sum())] for k, m in _cast_categories(x, f).items() if m.any()}
    res.extra["convention_rates"] = rates
    if infer != "none":
        from .infer_rounding import infer_rule

        res.extra["rule_inference"] = infer_rule(x, codes, format=f.name).to_dict()
    return res


def _compare_cast_float(op: dict, bits: np.ndarray, infer: str = "auto") -> OpResult:
    """torch's cast to bfloat16 or float16 against RN-even (ml_dtypes, NaN compared by class)."""
    import ml_dtypes

    from .infer_rounding import _wide_rounded, infer_rule

    x = input_set(op["inputs"], op.get("seed", 0))
    dt = ml_dtypes.bfloat16 if op["format"] == "bfloat16" else np.float16
    with np.errstate(over="ignore", invalid="ignore"):
        emu = x.astype(dt)
        got = bits.view(dt)
        x64 = x.astype(np.float64)
    nan = np.isnan(emu.astype(np.float32)) & np.isnan(got.astype(np.float32))
    equal = (emu.view(np.uint16) == bits) | nan
    ulp = np.abs(_ordered_f(bits.view(np.int16), 16) - _ordered_f(emu.view(np.int16), 16)).astype(np.float64)
    ulp = np.where(np.isnan(emu.astype(np.float32)) | np.isnan(got.astype(np.float32)), np.inf, ulp)
    ulp[equal] = 0
    res = OpResult(op["name"], "cast_float", emulator="RN-even (ml_dtypes)")
    _stats(res, equal, ulp)
    fin = np.isfinite(x64)
    big, tiny = float(ml_dtypes.finfo(dt).max), float(ml_dtypes.finfo(dt).smallest_normal)
    table = _wide_rounded(np.where(np.isnan(x64), 0.0, x64), op["format"])
    tie = table["nearest_even", False] != table["nearest_away", False]
    a = np.abs(x64)
    cats = {"nan": np.isnan(x64), "inf": np.isinf(x64), "overflow": fin & (a > big), "tie": fin & tie}
    cats["subnormal"] = fin & (a > 0) & (a < tiny) & ~tie
    cats["zero"] = a == 0
    taken = np.zeros(x64.shape, bool)
    for m in cats.values():
        taken |= m
    cats["normal"] = ~taken
    res.clusters = {k: [int(m.sum()), int((m & ~equal).sum())] for k, m in cats.items() if m.any()}
    if infer != "none":
        res.extra["rule_inference"] = infer_rule(x, got).to_dict()
    return res


def _compare_gemm(op: dict, bits: np.ndarray, meta: dict, infer: str = "auto") -> OpResult:
    fields = {k: op[k] for k in GemmCase.__dataclass_fields__}
    case = GemmCase(**fields)
    a, b, sa, sb = gemm_operands(case)
    kernel = kernel_of_capture(meta, case.a_format != case.b_format, case.layout == "tensorwise")
    acc = accumulator_for(meta, case.fast_accum, kernel)
    kw = {"a_format": case.a_format, "b_format": case.b_format, "out_dtype": case.out_dtype}
    emu = scaled_mm(a, b, sa, sb, accumulator=acc, **kw)
    exact = scaled_mm(a, b, sa, sb, accumulator="exact", **kw)
    width = 32 if case.out_dtype == "float32" else 16
    view = np.int32 if width == 32 else np.int16
    got_k = _ordered_f(bits.view(view), width)
    emu_k = _ordered_f(np.ascontiguousarray(emu).view(view), width)
    ex_k = _ordered_f(np.ascontiguousarray(exact).view(view), width)
    label = f"accumulator {acc}" + (" (oneDNN's summation order not reproduced)" if kernel == "onednn" else "")
    res = OpResult(op["name"], "scaled_mm", emulator=label)
    ulp = np.abs(got_k - emu_k).astype(np.float64)
    _stats(res, ulp == 0, ulp)
    if kernel is not None:
        res.extra["torch_cpu_kernel"] = kernel
    if res.bit_exact < res.n and kernel != "onednn":  # which split-K (if any) reproduces the kernel
        from .infer_split import infer_split

        res.extra["split_inference"] = infer_split(a, b, sa, sb, bits.view(view), accumulator=acc, **kw).to_dict()
    if infer == "all" or (infer == "auto" and res.bit_exact < res.n):  # which accumulator explains it
        from .infer_gemm import infer_accumulator

        inf = infer_accumulator(a, b, sa, sb, bits.view(view), use_fast_accum=case.fast_accum, **kw)
        res.extra["accumulator_inference"] = inf.to_dict()
    res.extra.update(
        k=case.k,
        fast_accum=case.fast_accum,
        layout=case.layout,
        out_dtype=case.out_dtype,
        formats=f"{case.a_format}x{case.b_format}",
        native_vs_exact_mean_ulp=float(np.abs(got_k - ex_k).mean()),
        emulator_vs_exact_mean_ulp=float(np.abs(emu_k - ex_k).mean()),
    )
    return res


def _compare_torchao(op: dict, arrays: dict) -> OpResult:
    from ..scaling.current import quantize_torchao
    from .capture import torchao_input

    f = FORMATS[op["format"]]
    q = quantize_torchao(
        torchao_input(), f, granularity=op["granularity"], axiswise_dim=-1, round_scales_to_power_of_2=op["pow2"]
    )
    codes, scale = arrays[op["name"] + "/codes"], arrays[op["name"] + "/scale"]
    nan_codes = np.isnan(code_values(f))
    eq_codes = (q.codes == codes) | (nan_codes[q.codes] & nan_codes[codes])
    eq_scale = q.scales.reshape(scale.shape).view(np.uint32) == scale.astype(np.float32).view(np.uint32)
    res = OpResult(op["name"], "torchao_float8", emulator="fp8sim.scaling.current.quantize_torchao")
    equal = np.concatenate([eq_codes.reshape(-1), eq_scale.reshape(-1)])
    ulp = _ulp_codes(q.codes.reshape(-1), codes.reshape(-1), f).astype(np.float64)
    # as for casts: a NaN against a number is no count of grid steps (left out of max/mean), NaN = NaN is 0
    ulp = np.where(nan_codes[q.codes.reshape(-1)] | nan_codes[codes.reshape(-1)], np.inf, ulp)
    ulp[eq_codes.reshape(-1)] = 0
    _stats(res, equal, np.concatenate([ulp, (~eq_scale.reshape(-1)).astype(np.float64)]))
    res.clusters = {
        "codes": [int(eq_codes.size), int((~eq_codes).sum())],
        "scales": [int(eq_scale.size), int((~eq_scale).sum())],
    }
    return res


def compare_capture(
    path: str | Path, progress: bool = False, ops: list[str] | None = None, infer: str = "auto"
) -> CompareResult:
    """Compare the ops of the capture at ``path`` with the emulator: every op, or those whose name
    matches one of the glob patterns in ``ops`` (e.g. ``["cast/*"]``); ``infer``: which ops get a rule
    inference (module docstring)."""
    if infer not in INFER:
        raise ValueError(f"infer must be one of {', '.join(INFER)}; got {infer!r}")
    header, arrays = read_bundle(path)
    meta = header["meta"]
    selected = ops
    ops = [o for o in header["ops"] if selected is None or any(fnmatch.fnmatch(o["name"], p) for p in selected)]
    bar = Progress(len(ops), progress, prefix="compare ")
    out: list[OpResult] = []
    notes = cpu_kernel_notes(meta) if any(o["kind"] == "scaled_mm" and "skipped" not in o for o in ops) else []
    for op in ops:
        if "skipped" in op:
            out.append(OpResult(op["name"], op["kind"], skipped=op["skipped"]))
        elif op["kind"] == "cast":
            out.append(_compare_cast(op, arrays[op["name"]], meta, infer))
        elif op["kind"] == "cast_float":
            out.append(_compare_cast_float(op, arrays[op["name"]], infer))
        elif op["kind"] == "scaled_mm":
            out.append(_compare_gemm(op, arrays[op["name"]], meta, infer))
        elif op["kind"] == "torchao_float8":
            out.append(_compare_torchao(op, arrays))
        else:
            out.append(OpResult(op["name"], op["kind"], skipped=f"unknown op kind {op['kind']!r} (newer fp8sim?)"))
        bar.step(op["name"])
    return CompareResult(str(path), meta, out, notes)


def cpu_kernel_notes(meta: dict[str, Any]) -> list[str]:
    """What a CPU capture's ``_scaled_mm`` ops mean here: which torch CPU kernel recorded them, and how
    that differs from this host's (:mod:`fp8sim.gemm.torch_cpu`)."""
    from ..gemm.torch_cpu import torch_cpu_kernel

    if meta.get("device", "cpu") != "cpu":
        return []
    if "torch_cpu_kernel" not in meta:
        return [
            "this CPU capture does not record which torch CPU _scaled_mm kernel produced it (fp8sim before "
            "issue 24): the fallback is assumed; on an AVX-512-FP16/AMX host torch runs oneDNN instead"
        ]
    theirs, mixed = meta["torch_cpu_kernel"], meta.get("torch_cpu_kernel_mixed", meta["torch_cpu_kernel"])
    host = "AMX-INT8" if meta.get("cpu_amx_int8") == "yes" else "no AMX-INT8"
    where = f"captured where torch's CPU _scaled_mm runs {theirs} ({host}, oneDNN {meta.get('onednn') or '-'}"
    where += f", oneDNN {'enabled' if meta.get('mkldnn_enabled') == 'yes' else 'disabled'})"
    notes = []
    if "onednn" in (theirs, mixed):
        notes.append(
            f"{where}: its tensorwise GEMMs are modelled by accumulator cpu_onednn, whose float32 summation order "
            "is not oneDNN's (AMX tiles, K split per thread): low-bit mismatches are expected and not a fault; "
            "`fp8sim capture --torch-cpu-kernel fallback` records the fallback, which fp8sim reproduces bit for bit"
        )
    try:
        import torch  # noqa: F401
    except ImportError:
        notes.append(
            "torch is not installed here: the fallback's float32 matmul runs in numpy's summation order, not "
            "torch's BLAS order, so this capture's GEMMs may differ in the low bits; install torch to compare "
            "them bit for bit"
        )
    ours = torch_cpu_kernel()
    if ours != theirs:
        notes.append(f"{where}; this host runs {ours}: the comparison follows the capture's kernel, not this host's")
    return notes
