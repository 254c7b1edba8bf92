"""Shared helpers for the cast tests: the failure reporter and an independent exact reference.

``assert_codes_equal`` compares code arrays, treating two codes that both decode to NaN (as
ml_dtypes decodes them) as equal, and reports the first mismatch with its input, both codes in hex
and the format.

``ref_encode`` is the exact rounding rule of ``docs/semantics.md`` section 2 (2.1, 2.2) written with
``fractions.Fraction`` over the sorted list of a format's values (taken from ``FloatFormat.code_value``,
which ``test_cast_ml_dtypes`` checks against ml_dtypes).  It shares no code with ``fp8sim.cast``.
"""

from __future__ import annotations

import bisect
import math
from fractions import Fraction
from functools import cache
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import fp8sim
from fp8sim.testing.oracles import require, require_feature


# -- hypothesis profiles: a red CI run reproduces, a local run keeps exploring ------------------------
def _hypothesis_profiles() -> None:
    """``ci`` (selected when ``CI`` is set, as CI services set it; ``.ci/run`` sets it too): derandomized,
    so every run draws the same examples and a failure reproduces from the log; ``dev`` (local runs): fresh
    random draws each run, failures replayed from the local example database.  ``FP8SIM_HYPOTHESIS_PROFILE``
    picks one explicitly."""
    import os

    from hypothesis import settings

    # explicit values: recent hypothesis loads its own "ci" profile when CI is set, and a new profile
    # inherits from whichever is loaded
    settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
    settings.register_profile("dev", parent=settings.get_profile("default"), derandomize=False, print_blob=True)
    ci = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
    settings.load_profile(os.environ.get("FP8SIM_HYPOTHESIS_PROFILE", "ci" if ci else "dev"))


_hypothesis_profiles()

FORMAT_NAMES = tuple(fp8sim.FORMATS)
DETERMINISTIC_MODES = ("nearest_even", "toward_zero", "up", "down", "nearest_away")
ALL_MODES = (*DETERMINISTIC_MODES, "stochastic")
SR_BITS = 32


@pytest.fixture
def one_torch_thread() -> Any:
    """torch on one intra-op thread for the test (``pytestmark = pytest.mark.usefixtures("one_torch_thread")``):
    torch's CPU reductions split by thread count, so a bit-exact comparison must not depend on the host's cores."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


# -- collection: the torch marker -------------------------------------------------------------


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test of a module that imports torch at module level with ``torch``, so that
    ``-m "not torch"`` selects the numpy-only part (what ``nox -s oldest`` runs without torch).  A
    numpy-only module marks its few torch tests (or parameters) with ``@pytest.mark.torch`` itself."""
    for item in items:
        module = getattr(item, "module", None)
        if type(getattr(module, "torch", None)).__name__ == "module":
            item.add_marker(pytest.mark.torch)


# -- oracles ------------------------------------------------------------------------------------

ML_DTYPES_SINCE = {"float8_e5m3fnu": "0.7.0"}
"""The first ml_dtypes release with each dtype newer than the oldest release pyproject allows (0.5.0)."""


def ml_dtype(fmt: Any) -> Any:
    """The ml_dtypes scalar type of ``fmt``, the oracle of its casts: where the installed ml_dtypes
    predates the dtype the test skips with the reason (CI too); a dtype missing otherwise fails in CI."""
    f = fp8sim.get_format(fmt)
    name = f.ml_dtypes_name
    return require_feature("ml_dtypes", name, since=ML_DTYPES_SINCE.get(name, "0.5.0"), reason=f"oracle for {f.name}")


def gfloat_format(fmt: Any) -> Any:
    """gfloat's ``FormatInfo`` of ``fmt``: its OCP records, and records written here for what gfloat 0.5
    lacks: fnuz (no -0: that code is the single NaN, no Inf) and UE5M3 (unsigned, one NaN, no Inf).
    gfloat keeps the sign of negative inputs even for unsigned formats: compare those elsewhere."""
    gf = require("gfloat")
    from gfloat import formats as gff

    f = fp8sim.get_format(fmt)
    table = {
        "e4m3": gff.format_info_ocp_e4m3,
        "e5m2": gff.format_info_ocp_e5m2,
        "e8m0": gff.format_info_ocp_e8m0,
        "e2m1": gff.format_info_ocp_e2m1,
        "e2m3": gff.format_info_ocp_e2m3,
        "e3m2": gff.format_info_ocp_e3m2,
    }
    if f.name in table:
        return table[f.name]
    assert f.specials == "fnuz" or (not f.signed and f.specials == "fn"), f.name
    return gf.FormatInfo(
        f.name,
        k=f.bits,
        precision=f.mbits + 1,
        bias=f.bias,
        is_signed=f.signed,
        domain=gf.Domain.Finite,
        has_nz=False,
        num_high_nans=0 if f.signed else 1,
        has_subnormals=True,
        is_twos_complement=False,
    )


def encode_like_installed_ml_dtypes(x: Any, fmt: Any, saturate: bool) -> Any:
    """fp8sim's core nearest-even cast, except E8M0 under the installed ml_dtypes' own nearest rule
    where that is not the core's (releases before 0.7: ``fp8sim.cast.conventions.ml_dtypes_rule``).  Every
    other format, and E8M0 from ml_dtypes 0.7 on, is the core cast itself."""
    from fp8sim.cast.conventions import ml_dtypes_rule
    from fp8sim.cast.e8m0 import encode_e8m0

    f = fp8sim.get_format(fmt)
    rule = ml_dtypes_rule()
    if f.name == "e8m0" and (rule.e8m0_ties, rule.e8m0_sliver) != ("up", "nearest"):
        return encode_e8m0(x, ties=rule.e8m0_ties, sliver=rule.e8m0_sliver, saturate=saturate)
    return fp8sim.encode(x, f, saturate=saturate)


# -- failure reporting ------------------------------------------------------------------------


def _to_numpy(a: Any) -> np.ndarray:
    if type(a).__module__.startswith("torch"):
        import torch

        a = a.detach().cpu()
        if a.dtype in (torch.float16, torch.bfloat16):
            bits = a.view(torch.int16).numpy().view(np.uint16)
            return bits.view(np.float16 if a.dtype == torch.float16 else ml_dtypes.bfloat16)
        return a.numpy()
    return np.asarray(a)


@cache
def ml_nan_table(fmt: fp8sim.FloatFormat) -> np.ndarray:
    """Boolean per code: does ml_dtypes decode it to NaN?  (A format record without an ml_dtypes
    type, e.g. a custom one, falls back to its own ``is_nan_code``.)"""
    if fmt.ml_dtype is None:
        return np.array([fmt.is_nan_code(c) for c in range(fmt.num_codes)], bool)
    codes = np.arange(fmt.num_codes, dtype=np.uint8)
    return np.isnan(codes.view(fmt.ml_dtype).astype(np.float32))


def _is_nan_code(codes: np.ndarray, fmt: fp8sim.FloatFormat) -> np.ndarray:
    codes = codes.astype(np.int64)
    ok = (codes >= 0) & (codes < fmt.num_codes)
    return ok & ml_nan_table(fmt)[np.where(ok, codes, 0)]


def describe_input(v: Any) -> str:
    """A float with its bit pattern, e.g. ``1.0625 (float32 0x3F880000)``."""
    v = np.asarray(v)
    bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}.get(v.dtype.itemsize)
    if v.dtype.kind in "fV" and bits is not None:
        width = 2 * v.dtype.itemsize
        raw = int(v.reshape(1).view(bits)[0])
        value = float(v.astype(np.float64)) if v.dtype.kind == "V" else float(v)
        return f"{value!r} ({v.dtype} 0x{raw:0{width}X})"
    return repr(v.item() if v.ndim == 0 else v)


def assert_codes_equal(got: Any, want: Any, fmt: Any, inputs: Any, what: str = "") -> None:
    """``got == want`` elementwise (two NaN codes count as equal); on failure report the first
    differing element: its input (value and bits), both codes in hex and the format."""
    fmt = fp8sim.get_format(fmt)
    g = _to_numpy(got)
    w = _to_numpy(want)
    assert g.shape == w.shape, f"{fmt.name}: shape {g.shape} != expected {w.shape} {what}"
    g = g.reshape(-1).astype(np.int64)
    w = w.reshape(-1).astype(np.int64)
    same = (g == w) | (_is_nan_code(g, fmt) & _is_nan_code(w, fmt))
    if same.all():
        return
    bad = np.flatnonzero(~same)
    i = int(bad[0])
    x = _to_numpy(inputs).reshape(-1)
    shown = describe_input(x[i]) if x.size == g.size else f"(inputs have {x.size} elements)"
    raise AssertionError(
        f"{fmt.name} {what}: {bad.size} of {g.size} codes differ; first at flat index {i}: "
        f"input {shown}: got 0x{g[i]:02X}, want 0x{w[i]:02X}"
    )


# -- inputs -----------------------------------------------------------------------------------


def all_float16() -> np.ndarray:
    """All 65,536 float16 bit patterns."""
    return np.arange(1 << 16, dtype=np.uint16).view(np.float16)


def all_bfloat16() -> np.ndarray:
    """All 65,536 bfloat16 bit patterns."""
    return np.arange(1 << 16, dtype=np.uint16).view(ml_dtypes.bfloat16)


def widen(x: np.ndarray, dtype: Any) -> np.ndarray:
    """Exact widening (NaN sign kept; signalling NaNs are quieted without a warning)."""
    with np.errstate(invalid="ignore"):
        return x.astype(dtype)


# -- independent exact reference (docs/semantics.md section 2) --------------------------------


class Grid:
    """A format's values as exact Fractions, with the codes the spec assigns to them."""

    def __init__(self, fmt: fp8sim.FloatFormat) -> None:
        self.fmt = fmt
        self.pos_code: dict[Fraction, int] = {}
        self.neg_code: dict[Fraction, int] = {}
        self.nan_code: int | None = None
        self.inf_code: int | None = None
        self.neg_inf_code: int | None = None
        for c in range(fmt.num_codes):
            v = fmt.code_value(c)
            if math.isnan(v):
                self.nan_code = c if self.nan_code is None else self.nan_code
            elif math.isinf(v):
                if v > 0:
                    self.inf_code = c
                else:
                    self.neg_inf_code = c
            elif math.copysign(1.0, v) > 0:
                self.pos_code[Fraction(v)] = c
            else:
                self.neg_code[Fraction(-v)] = c
        self.mags = sorted(self.pos_code)
        self.max = self.mags[-1]
        self.signed = bool(self.neg_code)
        self.has_zero = self.mags[0] == 0
        self.neg_zero_code = self.neg_code.get(Fraction(0))
        # The grid continues one step above max: max + 2^(exponent(max) - mbits).
        top_exp = math.frexp(float(self.max))[1] - 1
        self.next = self.max + Fraction(2) ** (top_exp - fmt.mbits)

    def signed_code(self, mag: Fraction, negative: bool) -> int:
        if not negative:
            return self.pos_code[mag]
        if mag == 0:
            return self.neg_zero_code if self.neg_zero_code is not None else self.pos_code[mag]
        return self.neg_code[mag]

    def overflow_code(self, negative: bool) -> int:
        """Non-saturating overflow: Inf if the format has it, else NaN, else (FP4/FP6) max."""
        if self.inf_code is not None:
            return self.neg_inf_code if negative else self.inf_code
        if self.nan_code is not None:
            return self.nan_code
        return self.signed_code(self.max, negative)


def grid(fmt: Any) -> Grid:
    """The Grid of a format name or FloatFormat record."""
    return _grid(fp8sim.get_format(fmt))


@cache
def _grid(fmt: fp8sim.FloatFormat) -> Grid:
    return Grid(fmt)


def ref_encode(x: float, fmt: Any, rounding: str, saturate: bool, rbits: int | None = None) -> int:
    """The code of float ``x`` under ``docs/semantics.md`` section 2 (E8M0 nearest: ml_dtypes 0.7's rule,
    linear-domain nearest with ties up on the whole range, 2.4).

    ``rbits`` (an int in [0, 2^32)) is needed for ``stochastic``: round away from zero iff
    ``floor(f * 2^32) + rbits >= 2^32``.
    """
    g = grid(fmt)
    negative = bool(np.signbit(x))
    if math.isnan(x):
        if g.nan_code is not None:
            return g.nan_code
        # FP4/FP6 (no NaN): ml_dtypes gives the -0 code, sign-flipped by the input's sign.
        return g.neg_zero_code ^ (g.neg_zero_code if negative else 0)
    if not g.signed and g.has_zero and x == 0:
        return g.pos_code[Fraction(0)]  # UE5M3: -0 is 0
    if not g.signed and (negative or x == 0):
        # E8M0 (no zero) and UE5M3: no sign. ml_dtypes gives NaN; saturating = clip to finfo.min (2^-127, 0).
        return g.pos_code[g.mags[0]] if saturate else g.nan_code
    to_max = (
        saturate
        or rounding == "toward_zero"
        or (rounding == "up" and negative)
        or (rounding == "down" and not negative)
    )
    if math.isinf(x):
        return g.signed_code(g.max, negative) if saturate else g.overflow_code(negative)
    a = abs(Fraction(x))
    if a >= g.next:
        mag = None  # every mode rounds beyond max
    elif a < g.mags[0]:
        mag = g.mags[0]  # no zero (E8M0): below the smallest value is the smallest value
    else:
        points = g.mags + [g.next]
        i = bisect.bisect_right(points, a) - 1
        lo, hi = points[i], points[i + 1]
        f = (a - lo) / (hi - lo)
        if rounding == "nearest_even":
            if not g.has_zero:
                up = f >= Fraction(1, 2)  # E8M0, ml_dtypes: linear-domain ties go up
            else:
                up = f > Fraction(1, 2) or (f == Fraction(1, 2) and g.pos_code[lo] & 1 == 1)
        elif rounding == "nearest_away":
            up = f >= Fraction(1, 2)
        elif rounding == "toward_zero":
            up = False
        elif rounding == "up":
            up = f > 0 and not negative
        elif rounding == "down":
            up = f > 0 and negative
        elif rounding == "stochastic":
            assert rbits is not None and 0 <= rbits < 2**SR_BITS
            up = math.floor(f * 2**SR_BITS) + rbits >= 2**SR_BITS
        else:
            raise ValueError(rounding)
        mag = hi if up else lo
        if mag > g.max:
            mag = None
    if mag is None:
        if rounding == "stochastic":
            to_max = saturate  # stochastic overflow follows nearest rounding
        return g.signed_code(g.max, negative) if to_max else g.overflow_code(negative)
    return g.signed_code(mag, negative)


def ref_encode_array(x: np.ndarray, fmt: Any, rounding: str, saturate: bool, rbits: Any = None) -> np.ndarray:
    flat = widen(np.asarray(x), np.float64).reshape(-1)
    r = [None] * flat.size if rbits is None else [int(b) for b in np.asarray(rbits).reshape(-1)]
    out = [ref_encode(float(v), fmt, rounding, saturate, rb) for v, rb in zip(flat, r, strict=True)]
    return np.array(out, dtype=np.uint8).reshape(np.shape(x))


def critical_points(fmt: Any) -> list[Fraction]:
    """Positive finite grid values, the midpoints between neighbours, and the half step above max
    (all exact; every one of them is a float32)."""
    g = grid(fmt)
    pts = list(g.mags) + [g.next]
    mids = [(a + b) / 2 for a, b in zip(pts[:-1], pts[1:], strict=True)]
    return sorted(set(g.mags) | set(mids))


def midpoints(fmt: Any) -> list[Fraction]:
    g = grid(fmt)
    pts = list(g.mags) + [g.next]
    return [(a + b) / 2 for a, b in zip(pts[:-1], pts[1:], strict=True)]


def ref_encode_vec(x: np.ndarray, fmt: Any, rounding: str, saturate: bool) -> np.ndarray:
    """Vectorised ``ref_encode`` for deterministic modes, for inputs with at most 24 significant bits
    (float16, bfloat16, float32).  Same rule, same grid; the arithmetic is float64 and exact here:
    adjacent grid points differ by a power of two and ``|x| - lo`` fits in 53 bits."""
    g = grid(fmt)
    x = widen(np.asarray(x), np.float64).reshape(-1)
    pts = np.array([float(p) for p in g.mags] + [float(g.next)], np.float64)
    pos = np.array([g.pos_code[m] for m in g.mags], np.int64)
    neg = np.array([g.signed_code(m, True) for m in g.mags], np.int64) if g.signed else pos
    negative = np.signbit(x)
    nan = np.isnan(x)
    a = np.where(nan, 0.0, np.abs(x))
    i = np.clip(np.searchsorted(pts, a, side="right") - 1, 0, pts.size - 2)
    lo, hi = pts[i], pts[i + 1]
    with np.errstate(invalid="ignore"):
        f = (a - lo) / (hi - lo)
    if rounding == "nearest_even":
        up = (f > 0.5) | ((f == 0.5) & ((pos[i] & 1 == 1) | (not g.has_zero)))
    elif rounding == "nearest_away":
        up = f >= 0.5
    elif rounding == "toward_zero":
        up = np.zeros(x.shape, bool)
    elif rounding == "up":
        up = (f > 0) & ~negative
    elif rounding == "down":
        up = (f > 0) & negative
    else:
        raise ValueError(rounding)
    k = i + up
    below = a < pts[0]  # only without zero (E8M0): the smallest value
    k = np.where(below, 0, k)
    over = (a >= pts[-1]) | (k == pts.size - 1)
    k = np.minimum(k, pos.size - 1)
    code = np.where(negative, neg[k], pos[k])
    to_max = np.full(x.shape, saturate or rounding == "toward_zero")
    if not saturate and rounding == "up":
        to_max = negative
    elif not saturate and rounding == "down":
        to_max = ~negative
    max_code = np.where(negative, neg[-1], pos[-1])
    ovf = np.array([g.overflow_code(False), g.overflow_code(True)], np.int64)[negative.astype(int)]
    code = np.where(over, np.where(to_max, max_code, ovf), code)
    inf = np.isinf(x)
    code = np.where(inf, max_code if saturate else ovf, code)
    if not g.signed:
        bad = (negative & (x != 0)) if g.has_zero else (negative | (x == 0))
        code = np.where(bad, pos[0] if saturate else g.nan_code, code)
        if g.has_zero:
            code = np.where(x == 0, pos[0], code)
    nan_codes = [ref_encode(math.nan, fmt, rounding, saturate), ref_encode(-math.nan, fmt, rounding, saturate)]
    code = np.where(nan, np.array(nan_codes, np.int64)[negative.astype(int)], code)
    return code.astype(np.uint8)
