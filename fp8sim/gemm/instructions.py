"""Per-instruction tensor-core models: one MMA output element, bit for bit (spec 9.1, MMA-Sim).

For ``d = c + sum_i a_i * b_i`` of one instruction:

1. decode every operand to ``s * 2^e`` (FP8 subnormals keep ``s < 1`` at the format's minimum
   exponent; a zero counts with exponent -126; c is decoded in its own type, float16 c with
   exponent floor -14, float32 c with -126); products have ``e = e_a + e_b`` (+ block-scale
   exponents);
2. align every term, c included, to the largest exponent E and truncate each toward zero to
   ``frac_bits`` fractional bits below it;
3. add the truncated terms exactly;
4. normalise: float32 output truncates toward zero to ``out_mbits`` fraction bits (13 for FP8 on
   Ada/Hopper, 23 otherwise; below 2^-126 the same absolute grid; overflow gives Inf), float16
   output rounds to nearest even;
5. specials come first, from an exact float64 evaluation of the sum: NaN -> 0x7FFFFFFF (0x7FFF),
   +-Inf -> +-Inf.

Models with ``rounding="rn"`` (Blackwell sm_100 ``mma.sync``, measured) round once to float32, nearest
even, instead of step 4: with ``frac_bits=None`` the exact sum of the products and c, otherwise the
sum of the terms aligned and truncated as in step 2 (the finite alignment of Khattak & Mikaitis'
parameterised model, ``models/tools/Generic_BFMA_TC.m``: their ``neab`` extra alignment bits are
``frac_bits - 23``, ``frmode`` ``"rz"``/``"rne"`` is ``"truncate"``/``"rn"``, ``fma`` is ``k``).

Models are data (:class:`InstructionModel`), so a new device is one record.  Every intermediate is
an integer below 2^53, so the arithmetic runs exactly in vectorised float64.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from .._util.args import as_array
from .._util.tensors import is_torch_tensor, numpy_view
from ..cast._tables import code_values
from ..formats import FloatFormat, get_format

__all__ = ["InstructionModel", "INSTRUCTION_MODELS", "get_instruction_model", "dot_add", "run_instruction", "align_sum"]

_F32_NAN = np.array(0x7FFFFFFF, np.uint32).view(np.float32)
_F16_NAN = np.array(0x7FFF, np.uint16).view(np.float16)
_ZERO_EXP = -126


@dataclass(frozen=True)
class InstructionModel:
    """One tensor-core instruction's arithmetic.

    ``k``: products per instruction; ``frac_bits``: bits kept below the largest exponent when
    aligning; ``out_mbits``: fraction bits of the float32 result (truncated); ``halves``: the
    instruction runs as this many sequential sub-instructions of ``k / halves`` (Ada);
    ``scale_format`` / ``scale_block``: block scales (``"e8m0"`` exponents added to each product,
    or ``"ue4m3"`` scaling exact ``scale_block``-product group sums, as ``kind::mxf4nvf4``);
    ``rounding``: ``"truncate"`` (steps 2-4) or ``"rn"`` (one nearest-even rounding to float32 of
    the terms aligned to ``frac_bits`` bits, or of the exact sum for ``frac_bits=None``;
    ``out_mbits`` unused; float16 accumulation not modelled).
    """

    name: str
    k: int
    frac_bits: int | None
    out_mbits: int = 23
    halves: int = 1
    scale_format: str | None = None
    scale_block: int | None = None
    description: str = ""
    rounding: str = "truncate"

    def __post_init__(self) -> None:
        if self.rounding not in ("truncate", "rn"):
            raise ValueError(f"rounding must be 'truncate' or 'rn'; got {self.rounding!r}")
        if self.frac_bits is None and self.rounding == "truncate":
            raise ValueError("frac_bits=None (no alignment limit) needs rounding='rn'")
        if self.frac_bits is not None and not 0 <= self.frac_bits <= 60:
            raise ValueError(f"frac_bits must be None or an integer in [0, 60]; got {self.frac_bits!r}")
        if self.k % self.halves:
            raise ValueError(f"k={self.k} must be a multiple of halves={self.halves}")
        if (self.scale_format is None) != (self.scale_block is None):
            raise ValueError("scale_format and scale_block go together")
        if self.scale_format not in (None, "e8m0", "ue4m3"):
            raise ValueError(f"scale_format must be None, 'e8m0' or 'ue4m3'; got {self.scale_format!r}")


INSTRUCTION_MODELS: dict[str, InstructionModel] = {
    m.name: m
    for m in (
        InstructionModel("hopper_wgmma", 32, 13, 13, description="Hopper wgmma m64nNk32 FP8 -> f32 (e8m13) / f16"),
        InstructionModel("ada_mma", 32, 13, 13, halves=2, description="Ada mma.sync m16n8k32 FP8, two k16 halves"),
        InstructionModel("blackwell_tcgen05", 32, 25, 23, description="Blackwell tcgen05.mma kind::f8f6f4"),
        InstructionModel(
            "blackwell_mma",
            32,
            None,
            23,
            rounding="rn",
            description="Blackwell sm_100 mma.sync m16n8k32 FP8 -> f32: exact sum, one nearest-even rounding "
            "(measured: B200 E4M3 5,000/5,000, E5M2 4,999/5,000)",
        ),
        InstructionModel(
            "blackwell_mma_km",
            32,
            25,
            23,
            rounding="rn",
            description="Khattak-Mikaitis B200TCRN FP8 parameters (fma 32, neab 2: 25 alignment bits, truncation, "
            "one nearest-even rounding); their published model, not the measured B200 (E4M3 4,754/5,000)",
        ),
        InstructionModel(
            "blackwell_mxf8f6f4",
            32,
            25,
            23,
            scale_format="e8m0",
            scale_block=32,
            description="Blackwell tcgen05.mma kind::mxf8f6f4.block_scale.block32 (UE8M0 scales)",
        ),
        InstructionModel(
            "blackwell_mxf4nvf4",
            64,
            35,
            23,
            scale_format="ue4m3",
            scale_block=16,
            description="Blackwell tcgen05.mma kind::mxf4nvf4.block_scale.block16 (E2M1, UE4M3 scales)",
        ),
    )
}


def get_instruction_model(model: str | InstructionModel) -> InstructionModel:
    if isinstance(model, InstructionModel):
        return model
    if isinstance(model, str) and model in INSTRUCTION_MODELS:
        return INSTRUCTION_MODELS[model]
    raise ValueError(f"unknown instruction model {model!r}; known: {', '.join(INSTRUCTION_MODELS)}")


@cache
def _decoded(fmt: FloatFormat, zero_exp: int = _ZERO_EXP) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per code: value (float64), signed significand s and exponent e with value = s * 2^e."""
    vals = code_values(fmt)
    finite = np.isfinite(vals)
    mag = np.where(finite, np.abs(vals), 0.0)
    e = np.full(vals.shape, zero_exp, np.int64)
    nz = mag > 0
    e[nz] = np.maximum(np.frexp(mag[nz])[1] - 1, fmt.emin)
    s = np.where(nz, np.ldexp(mag, -e), 0.0) * np.where(np.signbit(vals), -1.0, 1.0)
    return vals, s, e


def _codes(x: Any, arg: str, fmt: FloatFormat) -> np.ndarray:
    arr = numpy_view(x) if is_torch_tensor(x) else as_array(x, arg)  # .numpy() pins the storage (FSDP2)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{arg} must hold integer codes of {fmt.name}, got dtype {arr.dtype}")
    if arr.size and (arr.min() < 0 or arr.max() >= fmt.num_codes):
        raise ValueError(f"{arg} holds codes outside [0, {fmt.num_codes - 1}] for {fmt.name}")
    return arr.astype(np.int64)


def dot_add(
    a: Any,
    b: Any,
    c: Any,
    *,
    model: str | InstructionModel,
    a_format: str | FloatFormat = "e4m3",
    b_format: str | FloatFormat = "e4m3",
    scale_a: Any = None,
    scale_b: Any = None,
    out_dtype: str = "float32",
) -> np.ndarray:
    """One instruction's output for every leading index: ``a``, ``b`` codes of shape ``[..., K]``
    (K = the model's k), ``c`` of shape ``[...]`` (float32, or float16 values for
    ``out_dtype="float16"``), block-scale codes ``[..., K / scale_block]`` for block-scaled models.
    Returns float32 (or float16) values of shape ``[...]``."""
    m = get_instruction_model(model)
    fa, fb = get_format(a_format, arg="a_format"), get_format(b_format, arg="b_format")
    ac, bc = _codes(a, "a", fa), _codes(b, "b", fb)
    if ac.shape != bc.shape or ac.shape[-1:] != (m.k,):
        raise ValueError(f"a and b must have the same shape [..., {m.k}] for {m.name}; got {ac.shape} and {bc.shape}")
    if out_dtype not in ("float32", "float16"):
        raise ValueError(f"out_dtype must be 'float32' or 'float16', got {out_dtype!r}")
    c = numpy_view(c) if is_torch_tensor(c) else as_array(c, "c")
    if c.dtype.kind not in "iuf":
        raise TypeError(f"c must hold real numbers (float32, or float16 values), got dtype {c.dtype}")
    try:
        c = np.broadcast_to(c.astype(np.float16 if out_dtype == "float16" else np.float32), ac.shape[:-1])
    except ValueError:
        raise ValueError(f"c has shape {c.shape}; it must broadcast to the outputs' shape {ac.shape[:-1]}") from None
    sa = sb = None
    if m.scale_format is not None:
        if scale_a is None or scale_b is None:
            raise ValueError(f"{m.name} needs scale_a and scale_b ({m.scale_format} codes, one per {m.scale_block})")
        sf = get_format("e8m0" if m.scale_format == "e8m0" else "e4m3")
        sa, sb = _codes(scale_a, "scale_a", sf), _codes(scale_b, "scale_b", sf)
        want = ac.shape[:-1] + (m.k // m.scale_block,)
        if sa.shape != want or sb.shape != want:
            raise ValueError(f"scale_a and scale_b must have shape {want}; got {sa.shape} and {sb.shape}")
    elif scale_a is not None or scale_b is not None:
        raise ValueError(f"{m.name} takes no block scales")
    out = run_instruction(m, fa, fb, ac, bc, c.astype(np.float64), sa, sb, out_dtype)
    return out.astype(np.float16 if out_dtype == "float16" else np.float32)


def run_instruction(
    m: InstructionModel,
    fa: FloatFormat,
    fb: FloatFormat,
    ac: np.ndarray,
    bc: np.ndarray,
    c: np.ndarray,
    sa: np.ndarray | None = None,
    sb: np.ndarray | None = None,
    out_dtype: str = "float32",
    specials: bool = True,
) -> np.ndarray:
    """One instruction on int64 code arrays that broadcast to ``[..., k]`` and a float64 ``c`` of
    the leading shape; returns float64 holding the instruction's output values.  ``specials=False``
    skips the NaN/Inf pass when the caller knows every input is finite."""
    step = m.k // m.halves
    acc = c
    with np.errstate(invalid="ignore", over="ignore"):  # Inf * 0 and Inf - Inf: resolved as NaN below
        for h in range(m.halves):
            part = slice(h * step, (h + 1) * step)
            psa = psb = None
            if sa is not None:
                blocks = slice(h * step // m.scale_block, (h + 1) * step // m.scale_block)
                psa, psb = sa[..., blocks], sb[..., blocks]
            new = _fused(m, fa, fb, ac[..., part], bc[..., part], acc, psa, psb, out_dtype, specials)
            # without the specials pass, a half that overflowed (float16) must stay Inf in the next half
            acc = new if specials else np.where(np.isfinite(acc), new, acc)
    return acc


def _fused(
    m: InstructionModel,
    fa: FloatFormat,
    fb: FloatFormat,
    ac: np.ndarray,
    bc: np.ndarray,
    c: np.ndarray,
    sa: np.ndarray | None,
    sb: np.ndarray | None,
    out_dtype: str,
    specials: bool = True,
) -> np.ndarray:
    va, _, e_a = (t[ac] for t in _decoded(fa))
    vb, _, e_b = (t[bc] for t in _decoded(fb))
    exact = va * vb  # float64, exact (NaN/Inf where the inputs are special)
    if m.scale_format == "e8m0":
        x = np.repeat(sa - 127, m.scale_block, axis=-1) + np.repeat(sb - 127, m.scale_block, axis=-1)
        p, e = exact * np.ldexp(1.0, x), e_a + e_b + x
        nan_scale = (sa == 0xFF).any(-1) | (sb == 0xFF).any(-1)
    elif m.scale_format == "ue4m3":
        vals, _, se = _decoded(get_format("e4m3"))
        gsum = exact.reshape(exact.shape[:-1] + (-1, m.scale_block)).sum(-1)  # exact: multiples of 1/4
        ma, mb = sa & 0x7F, sb & 0x7F  # the sign bit of a scale is ignored
        p, e = gsum * vals[ma] * vals[mb], se[ma] + se[mb]  # block terms are not normalised
        nan_scale = (ma == 0x7F).any(-1) | (mb == 0x7F).any(-1)
    else:
        p, e = exact, e_a + e_b
        nan_scale = None
    out = align_sum(m, np.where(np.isfinite(p), p, 0.0) if specials else p, e, c, out_dtype)
    nan_value = np.float64(_F16_NAN) if out_dtype == "float16" else np.float64(_F32_NAN)
    if specials:
        special = np.sum(p, axis=-1) + c
        out = np.where(np.isinf(special), special, out)
        out = np.where(np.isnan(special), nan_value, out)
    if nan_scale is not None:
        out = np.where(nan_scale, nan_value, out)
    return out


def align_sum(m: InstructionModel, p: np.ndarray, e: np.ndarray, c: np.ndarray, out_dtype: str) -> np.ndarray:
    """Steps 2-4 for finite terms: ``p`` the exact term values ``[..., terms]`` with nominal
    exponents ``e``, ``c`` the accumulator input (float64 holding a float32/float16 value).  Each
    term ``s * 2^e`` truncated to ``frac_bits`` below E is ``trunc(p * 2^(frac_bits - E))``."""
    c = np.where(np.isfinite(c), c, 0.0)
    if m.rounding == "rn":
        if m.frac_bits is not None:
            unit = _unit(m.frac_bits, e, c, out_dtype)
            p, c = np.trunc(p * unit[..., None]) / unit[..., None], np.trunc(c * unit) / unit
        return _exact_rn(m, p, c, out_dtype)
    unit = _unit(m.frac_bits, e, c, out_dtype)
    total = np.trunc(p * unit[..., None]).sum(axis=-1) + np.trunc(c * unit)
    value = total / unit  # exact: an integer times a power of two
    if out_dtype == "float16":
        with np.errstate(over="ignore"):
            return value.astype(np.float16).astype(np.float64)
    return _truncate_f32(value, m.out_mbits)


def _unit(n: int, e: np.ndarray, c: np.ndarray, out_dtype: str) -> np.ndarray:
    """``2^(n - E)``: one truncation grid per output, E the largest exponent of the terms and c."""
    c_emin = -14 if out_dtype == "float16" else -126
    c_mag = np.abs(c)
    e_c = np.where(c_mag > 0, np.maximum(np.frexp(c_mag)[1] - 1, c_emin), c_emin)
    return np.ldexp(1.0, n - np.maximum(e.max(axis=-1), e_c))


def _truncate_f32(v: np.ndarray, mbits: int) -> np.ndarray:
    """Toward zero onto float32 with ``mbits`` fraction bits (fixed grid below 2^-126); Inf past max."""
    mag = np.abs(v)
    ex = np.frexp(mag)[1] - 1
    qe = np.maximum(ex - mbits, -126 - mbits)
    r = np.ldexp(np.trunc(np.ldexp(mag, -qe)), qe)
    r = np.where(ex > 127, np.inf, r)
    return np.copysign(r, v)


def _exact_rn(m: InstructionModel, p: np.ndarray, c: np.ndarray, out_dtype: str) -> np.ndarray:
    """float32 nearest-even of the exact ``sum(p) + c`` (finite terms, already aligned if the model limits it)."""
    if out_dtype != "float32":
        raise ValueError(
            f"{m.name}: float16 accumulation is not modelled (the rule is open; see reports/hardware_f16_accumulate.md)"
        )
    from ._exact import _distill, round_sum_to_f32

    terms = [p[..., i] for i in range(p.shape[-1])] + [c]
    hi, rem = _distill(terms)
    return round_sum_to_f32(hi, rem).astype(np.float64)
