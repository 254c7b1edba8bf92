"""MX block scaling (OCP MX v1.0): E8M0 scale rules, and torchao / TE MXFP8 quantization.

Semantics: ``docs/semantics.md`` sections 3 (scale rules), 5.2 (TE MXFP8) and 6.3 (torchao
``to_mx``).  A block is ``block_size`` consecutive elements along one axis; it gets one E8M0 code
``e`` (scale ``X = 2^(e-127)``, a *dequantization* scale) from its ``amax = max|x|``, and each
element becomes ``cast(x * r)`` with ``r = 2^(127-e)`` formed exactly.  Element casts are
round-to-nearest-even and saturating (clamp-then-cast and ``cvt.rn.satfinite`` agree, spec 2.3).

Flavors of :func:`quantize_mx`:

- ``"torchao"``: ``torchao.prototype.mx_formats.mx_tensor.to_mx`` 0.18 in eager mode, bit for bit:
  NaN-propagating amax; a NaN amax gives scale 0xFF, and then (x86 NaN rules) finite elements
  become +-0 and NaN/Inf elements NaN (FP4/FP6 NaNs take the code torchao's bit cast computes from
  the NaN's bits); for FLOOR/CEIL/EVEN an Inf amax is just exponent 255 in the arithmetic (E4M3:
  code 247, the Inf element saturates), the scale applied to the data is clamped to ``>= 2^-126``
  (code 0x00 multiplies by 2^126), and RCEIL is the eager fallback ``ceil(log2(fl32(amax/max)))``
  with float32 ``log2`` (it differs from the NVIDIA bit rule when ``fl32(amax/max)`` lies a few ulps
  above a power of two), Inf amax 0xFE, code 0x00 multiplying by 1.
- ``"te"``: TE MXFP8 (``quantize_mxfp8.cuh``): NaN-skipping amax (``fmaxf``), RCEIL only,
  ``r = 2^(127-e)`` exact for every code (0x00 multiplies by 2^127, 0xFE by 2^-127), so an Inf
  element saturates to +-max and the rest of its block flush; E4M3/E5M2 only.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from .._util.args import as_array, as_int
from .._util.tensors import is_torch_tensor, numpy_view
from ..cast import encode as _encode
from ..cast._tables import f32_code_table
from ..formats import E2M1, E2M3, E3M2, E4M3, E5M2, E8M0, FloatFormat, get_format
from .amax import dtype_name
from .quantized import MAX_BLOCK_SIZE, QuantizedData, check_padding

__all__ = [
    "MX_ELEM_FORMATS",
    "SCALE_RULES",
    "MX_FLAVORS",
    "e8m0_scale_codes",
    "quantize_mx",
    "quantize_mx_rowwise_columnwise",
    "quantize_mx_2d_te",
]

MX_ELEM_FORMATS: tuple[FloatFormat, ...] = (E4M3, E5M2, E2M3, E3M2, E2M1)
"""Element formats of MX blocks; ``emax_elem`` (spec 3) is each record's ``emax``: 8, 15, 2, 4, 2."""
SCALE_RULES = ("floor", "ceil", "even", "rceil", "nearest")
MX_FLAVORS = ("torchao", "te")
_SCALE_FLAVORS = ("ocp", "torchao", "te")
_TE_FORMATS = (E4M3, E5M2)  # TE MXFP8 data types
_MXFMA_DTYPES = ("bfloat16", "float16")
_INF = 0x7F800000
_QNAN = 0x7FC00000
_X86_DEFAULT_NAN = 0xFFC00000  # what Inf / Inf (and Inf * 0) produce on x86
_CHUNK = 1 << 17  # elements per pass: each pass stays in cache; 2^17 measured fastest (benchmarks/README.md)


# -- arguments ----------------------------------------------------------------------------


def _elem_format(elem_format: str | FloatFormat) -> FloatFormat:
    fmt = get_format(elem_format, arg="elem_format")
    if fmt not in MX_ELEM_FORMATS:
        known = ", ".join(f.name for f in MX_ELEM_FORMATS)
        raise ValueError(f"elem_format {fmt.name!r} is not an MX element format; MX element formats: {known}")
    return fmt


def _choice(value: Any, allowed: tuple[str, ...], arg: str) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"unknown {arg} {value!r}; known: {', '.join(allowed)}")
    return value


def _check_te(fmt: FloatFormat, rule: str) -> None:
    if rule != "rceil":
        raise ValueError(f"flavor='te' (TE MXFP8) computes scales with scale_rule='rceil' only; got {rule!r}")
    if fmt not in _TE_FORMATS:
        known = ", ".join(f.name for f in _TE_FORMATS)
        raise ValueError(f"flavor='te' (TE MXFP8) supports elem_format {known}; got {fmt.name!r}")


def _mxfma_constant(fmt: FloatFormat, dtype: str) -> np.float32:
    """TE's ``_ENABLE_MXFMA`` multiplier: 1/max rounded to nearest in the input dtype (bf16 0x3B12 /
    0x3792, fp16 0x1892 / 0x0125 for E4M3 / E5M2, spec 5.2)."""
    import ml_dtypes

    half = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    return np.float32(half(1.0 / fmt.max))


def _as_float32(x: Any, arg: str) -> tuple[np.ndarray, str]:
    """``x`` as a numpy float32 array, exactly, and the name of its original dtype."""
    if is_torch_tensor(x):
        import torch

        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{arg} must be an array or tensor, got {type(x).__name__}")
        name = dtype_name(x)
        if name not in ("float32", "bfloat16", "float16", "float64"):
            raise TypeError(f"{arg} must have dtype float32, bfloat16 or float16; got {x.dtype}")
        t = x.detach().cpu()
        arr = numpy_view(t if name in ("float32", "float64") else t.float())  # .numpy() pins the storage (FSDP2)
    else:
        if isinstance(x, (bool, np.bool_)) or x is None or isinstance(x, (str, bytes, complex)):
            raise TypeError(f"{arg} must be a float array or tensor, got {type(x).__name__}")
        arr = as_array(x, arg)
        if arr.dtype.kind == "f" and not arr.dtype.isnative:
            arr = arr.astype(arr.dtype.newbyteorder("="))
        name = arr.dtype.name
        if arr.dtype == np.float16 or (name == "bfloat16" and arr.dtype.type.__module__.startswith("ml_dtypes")):
            arr = arr.astype(np.float32)
        elif arr.dtype not in (np.float32, np.float64):
            raise TypeError(f"{arg} must have dtype float32, bfloat16 or float16; got {arr.dtype}")
    if arr.dtype == np.float64:
        with np.errstate(invalid="ignore", over="ignore"):
            narrow = arr.astype(np.float32)
            exact = (narrow.astype(np.float64) == arr) | np.isnan(arr)
        if not exact.all():
            raise ValueError(
                f"{arg} is float64 with values float32 cannot hold exactly; MX quantization takes float32, "
                "bfloat16 or float16 input (torchao and TE do too): cast it to float32 first"
            )
        arr = narrow
    return arr.astype(np.float32, order="C", copy=False), name


# -- scale rules (spec 3) -----------------------------------------------------------------


def _div32(amax_bits: np.ndarray, divisor: float) -> np.ndarray:
    """``fl32(amax / divisor)``, the correctly rounded float32 quotient (exact float64 quotient of a
    24-bit by a <= 4-bit significand is never near a float32 midpoint)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return (amax_bits.view(np.float32).astype(np.float64) / divisor).astype(np.float32)


@cache
def _exponent_table(fmt: FloatFormat, flavor: str) -> np.ndarray:
    """FLOOR code per amax exponent field 0..256 (CEIL/EVEN may round it up; 256 only from NaN)."""
    f = np.arange(257)
    hi = 128 if flavor == "torchao" else 127  # torchao clamps to [-127, 128] ("to capture NaNs")
    e = np.clip(f - 127 - fmt.emax, -127, hi) + 127
    e[256] = 255
    return e.astype(np.uint8)


def _codes_from_amax_bits(ab: np.ndarray, fmt: FloatFormat, rule: str, flavor: str, rcp: np.float32) -> np.ndarray:
    """E8M0 codes (uint8) of non-negative amax given as float32 bit patterns (uint32)."""
    if rule in ("floor", "ceil", "even"):
        if rule == "even":  # round amax at the element's mantissa width; the carry may bump F
            f = ((ab + np.uint32(1 << (22 - fmt.mbits))) >> 23) & 0x1FF
        else:
            f = ab >> 23
            if rule == "ceil":
                f = f + ((ab & 0x7FFFFF) != 0)
        e = _exponent_table(fmt, flavor)[f]
        if ab.size and ab.max() >= _INF:  # OCP: non-finite amax -> NaN scale; torchao: NaN only (an
            bad = ab > _INF if flavor == "torchao" else ab >= _INF  # Inf is exponent 255 to it)
            e = np.where(bad, np.uint8(255), e)
        return e
    if rule == "rceil" and flavor == "torchao":  # eager fallback: ceil(log2(amax / max)), float32 log2
        d = _div32(ab, fmt.max)
        with np.errstate(divide="ignore", invalid="ignore"):  # log2(0) = -inf clamps to code 0
            lg = np.ceil(np.log2(d.astype(np.float64)).astype(np.float32))  # = float32 log2 (checked vs torch)
        e = np.clip(np.nan_to_num(lg, nan=0.0), -127, 127).astype(np.int32) + 127
        return np.where(ab > _INF, 255, np.where(ab == _INF, 254, e)).astype(np.uint8)
    if rule == "rceil":  # NVIDIA: d = fl32(amax * fl32(1/max)), then round d's exponent up, cap 0xFE
        with np.errstate(over="ignore", invalid="ignore"):
            d = ab.view(np.float32) * rcp
        db = d.view(np.uint32)
        f, m = (db >> 23).astype(np.int32), db & 0x7FFFFF
        e = f + np.where(f == 0, m > 0x400000, m != 0)
        e = np.where(f == 0xFF, np.where(m != 0, 255, 254), np.minimum(e, 254))
        return e.astype(np.uint8)
    # nearest: torch's .to(float8_e8m0fnu) of fl32(amax / max): ties up, subnormal d -> 0x01 iff
    # its mantissa exceeds 0x400000 (the torch_eager convention, spec 2.4), Inf/NaN -> 0xFF
    db = _div32(ab, fmt.max).view(np.uint32)
    f, m = (db >> 23).astype(np.int32), db & 0x7FFFFF
    e = np.where(f == 0, m > 0x400000, f + (m >= 0x400000))
    return np.where(f == 0xFF, 255, np.minimum(e, 255)).astype(np.uint8)


def e8m0_scale_codes(
    amax: Any,
    elem_format: str | FloatFormat,
    rule: str,
    *,
    flavor: str = "ocp",
    mxfma_dtype: str | None = None,
) -> np.ndarray:
    """E8M0 scale codes (uint8, ``amax``'s shape) of block amaxes under a named rule (spec 3).

    ``amax``: float32 values (bfloat16/float16, torch tensors and exactly representable float64
    accepted; the sign is ignored).  ``rule``: ``floor`` (OCP, torchao default), ``ceil``, ``even``
    (Quark), ``rceil`` (NVIDIA: ``d = fl32(amax * fl32(1/max))``, exponent of d rounded up, subnormal
    d -> 0x01 iff its mantissa exceeds 0x400000, capped at 0xFE) or ``nearest`` (a torch E8M0 cast of
    ``fl32(amax / max)``, ties up).  Zero amax gives 0x00 under every rule.

    ``flavor`` decides non-finite amax and the upstream quirks: ``"ocp"`` (spec 3 as written: NaN
    or Inf -> 0xFF, except ``rceil``: Inf -> 0xFE), ``"torchao"`` (``to_mx``: NaN -> 0xFF; Inf is
    exponent 255 in FLOOR/CEIL/EVEN, 0xFE in RCEIL, whose eager form is
    ``ceil(log2(fl32(amax / max)))`` with float32 log2), ``"te"`` (RCEIL only, as ``"ocp"``).
    ``mxfma_dtype`` (``"bfloat16"``/``"float16"``, flavor ``"te"``) replaces ``fl32(1/max)`` with TE's
    ``_ENABLE_MXFMA`` constant for that input dtype (spec 5.2).
    """
    fmt = _elem_format(elem_format)
    rule = _choice(rule, SCALE_RULES, "rule")
    flavor = _choice(flavor, _SCALE_FLAVORS, "flavor")
    if flavor == "te":
        _check_te(fmt, rule)
    if mxfma_dtype is not None:
        if flavor != "te" or mxfma_dtype not in _MXFMA_DTYPES:
            raise ValueError(f"mxfma_dtype must be None or one of {', '.join(_MXFMA_DTYPES)}, with flavor='te'")
        rcp = _mxfma_constant(fmt, mxfma_dtype)
    else:
        rcp = np.float32(1.0 / fmt.max)
    a, _ = _as_float32(amax, "amax")
    ab = a.view(np.uint32) & np.uint32(0x7FFFFFFF)
    return _codes_from_amax_bits(ab, fmt, rule, flavor, rcp)


# -- element cast -------------------------------------------------------------------------


@cache
def _recip_table(flavor: str, rule: str) -> np.ndarray:
    """The float32 multiplier ``r`` applied to the data of a block, per E8M0 code."""
    e = np.arange(256)
    rb = (254 - e) << 23  # 2^(127-e) for 0 <= e <= 253
    rb[254] = 0x00400000  # 2^-127, an fp32 subnormal
    if flavor == "torchao":
        # RCEIL: code 0 multiplies by 1.0; else torchao divides by max(2^(e-127), 2^-126).  Code 255
        # blocks are rewritten by _torchao_nan_block_codes.
        rb[0] = 0x3F800000 if rule == "rceil" else 253 << 23
        rb[255] = 0
    else:
        rb[255] = _QNAN
    return rb.astype(np.uint32).view(np.float32)


def _torchao_nan_block_codes(xv: np.ndarray, fmt: FloatFormat, rule: str) -> np.ndarray:
    """Element codes of torchao blocks with scale 0xFF (x86 NaN rules, verified against to_mx).

    RCEIL multiplies by the NaN ``amax / max`` (torch.amax returns the canonical NaN), so every
    element is +NaN.  The other rules divide by ``2^128 = Inf``: finite -> +-0, NaN -> itself
    (quieted), +-Inf -> the x86 default NaN (negative).  torch float8 casts write NaN as
    ``0x7F | sign``; torchao's FP4/FP6 bit cast runs its normal-number path on the NaN's bits.
    """
    xb = xv.view(np.uint32).astype(np.int64)
    mag = xb & 0x7FFFFFFF
    if rule == "rceil":
        yb = np.full_like(xb, _QNAN)
    else:
        yb = np.where(mag > _INF, xb | 0x400000, np.where(mag == _INF, _X86_DEFAULT_NAN, xb & 0x80000000))
    sign = np.where(yb >> 31, fmt.sign_mask, 0)
    ymag = yb & 0x7FFFFFFF
    if fmt.has_nan:
        nan_code = fmt.magnitude_mask
    else:
        shift = 23 - fmt.mbits
        nan_code = ((ymag + ((fmt.bias - 127) << 23) + (1 << (shift - 1)) - 1 + ((ymag >> shift) & 1)) >> shift) & 0xFF
    return (np.where(ymag > _INF, nan_code, 0) | sign).astype(np.uint8)


def _block_max(a: np.ndarray, starts: np.ndarray | None) -> np.ndarray:
    """Max over axis 1 of ``(R, B, I)``; blocks along the last axis (I = 1) use ``reduceat`` over the
    flat array, 3x faster than numpy's many short row reductions."""
    if starts is None:
        return a.max(axis=1)
    return np.maximum.reduceat(a.reshape(-1), starts[: a.shape[0]])[:, None]


def _quantize_blocks(
    x3: np.ndarray, fmt: FloatFormat, rule: str, flavor: str, rcp: np.float32
) -> tuple[np.ndarray, np.ndarray]:
    """Codes ``(R, B, I)`` and scales ``(R, I)`` for float32 ``x3`` with blocks along axis 1."""
    rows_n, bs, cols_n = x3.shape
    codes = np.empty(x3.shape, np.uint8)
    scales = np.empty((rows_n, cols_n), np.uint8)
    if x3.size == 0:  # an empty tensor has no blocks to scale
        return codes, scales
    table = f32_code_table(fmt, "nearest_even", True)
    rows = max(1, _CHUNK // (bs * cols_n))
    cols = cols_n if bs * cols_n <= _CHUNK else max(1, _CHUNK // bs)
    size = min(rows * bs * cols, x3.size)
    abuf, idx, tmp = (np.empty(size, np.uint32) for _ in range(3))
    ybuf = np.empty(size, np.float32)
    te = flavor == "te"
    rtab = _recip_table(flavor, rule)
    starts = np.arange(0, size, bs) if cols_n == 1 else None
    for r0 in range(0, rows_n, rows):
        for c0 in range(0, cols_n, cols):
            xc = x3[r0 : r0 + rows, :, c0 : c0 + cols]
            n = xc.size
            a = np.bitwise_and(xc.view(np.uint32), np.uint32(0x7FFFFFFF), out=abuf[:n].reshape(xc.shape))
            amax = _block_max(a, starts)
            if te and amax.max() > _INF:  # fmaxf: NaN elements are skipped
                amax = _block_max(np.where(a > _INF, np.uint32(0), a), starts)
            e = _codes_from_amax_bits(amax, fmt, rule, flavor, rcp)
            scales[r0 : r0 + rows, c0 : c0 + cols] = e
            y = ybuf[:n].reshape(xc.shape)
            with np.errstate(invalid="ignore", over="ignore"):
                np.multiply(xc, rtab[e][:, None, :], out=y)
            # float32 -> code through the cast core's table: index = upper 16 bits << 1 | sticky
            yu, ix, t = y.reshape(-1).view(np.uint32), idx[:n], tmp[:n]
            np.right_shift(yu, 15, out=ix)
            np.bitwise_and(yu, 0x7FFF, out=t)
            np.minimum(t, 1, out=t)
            np.bitwise_or(ix, t, out=ix)
            out = codes[r0 : r0 + rows, :, c0 : c0 + cols]
            if out.flags.c_contiguous:
                np.take(table, ix.reshape(xc.shape), out=out)
            else:
                out[...] = table[ix.reshape(xc.shape)]
            if not te and (e == 255).any():
                bi, ci = np.nonzero(e == 255)
                out.transpose(0, 2, 1)[bi, ci] = _torchao_nan_block_codes(xc.transpose(0, 2, 1)[bi, ci], fmt, rule)
    return codes, scales


# -- public API ---------------------------------------------------------------------------


def _check_quantize_args(
    elem_format: Any, scale_rule: Any, flavor: Any, block_size: Any, mxfma: Any, pad: Any
) -> tuple[FloatFormat, str, str, int]:
    fmt = _elem_format(elem_format)
    rule = _choice(scale_rule, SCALE_RULES, "scale_rule")
    flavor = _choice(flavor, MX_FLAVORS, "flavor")
    block_size = as_int(block_size, "block_size", lo=1, hi=MAX_BLOCK_SIZE, what="MX uses 32")
    if not isinstance(mxfma, (bool, np.bool_)):
        raise TypeError(f"mxfma must be True or False, got {mxfma!r}")
    if pad is not None and not isinstance(pad, (bool, np.bool_)):
        raise TypeError(f"pad must be True, False or None, got {pad!r}")
    if flavor == "te":
        _check_te(fmt, rule)
    elif mxfma:
        raise ValueError("mxfma=True is a TE kernel option; use it with flavor='te'")
    return fmt, rule, flavor, block_size


def _quantize(
    arr: np.ndarray,
    dtype: str,
    fmt: FloatFormat,
    axis: Any,
    block_size: int,
    rule: str,
    flavor: str,
    mxfma: bool,
    pad: bool | None,
) -> QuantizedData:
    ndim = arr.ndim
    axis = as_int(axis, "axis")
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for a {ndim}-d input; allowed: {-ndim}..{ndim - 1}")
    ax = int(axis) % ndim
    shape = tuple(arr.shape)
    n = shape[ax]
    if n % block_size:
        if not (flavor == "te" if pad is None else pad):
            raise ValueError(
                f"dimension {ax} of shape {shape} has size {n}, which must be divisible by block_size "
                f"{block_size} (torchao refuses other sizes); pass pad=True to zero-pad to whole blocks as TE does"
            )
        check_padding(shape, tuple(block_size if d == ax else 1 for d in range(ndim)))
        widths = [(0, 0)] * ndim
        widths[ax] = (0, -n % block_size)
        arr = np.pad(arr, widths)
    padded = tuple(arr.shape)
    outer = int(np.prod(padded[:ax], dtype=np.int64))
    inner = int(np.prod(padded[ax + 1 :], dtype=np.int64))
    rcp = _mxfma_constant(fmt, dtype) if mxfma and dtype in _MXFMA_DTYPES else np.float32(1.0 / fmt.max)
    x3 = arr.reshape(outer * (padded[ax] // block_size), block_size, inner)
    codes, scales = _quantize_blocks(x3, fmt, rule, flavor, rcp)
    block = tuple(block_size if d == ax else 1 for d in range(ndim))
    return QuantizedData(
        codes=codes.reshape(padded),
        scales=scales.reshape(tuple(s // b for s, b in zip(padded, block, strict=True))),
        fmt=fmt,
        block=block,
        shape=shape,
        dtype=dtype,
        scale_format=E8M0,
    )


def quantize_mx(
    x: Any,
    elem_format: str | FloatFormat = "e4m3",
    *,
    axis: int = -1,
    block_size: int = 32,
    scale_rule: str = "floor",
    flavor: str = "torchao",
    mxfma: bool = False,
    pad: bool | None = None,
    swizzle: bool = False,
) -> QuantizedData:
    """MX-quantize ``x`` in blocks of ``block_size`` consecutive elements along ``axis``.

    ``x``: numpy float32/bfloat16/float16 array or torch tensor (moved to the CPU), any shape;
    converted to float32 exactly.  ``elem_format``: e4m3, e5m2, e2m3, e3m2 or e2m1.
    ``scale_rule``: see :func:`e8m0_scale_codes`; ``flavor="te"`` requires ``"rceil"``.
    ``flavor``: ``"torchao"`` (``to_mx``) or ``"te"`` (TE MXFP8), see the module docstring.
    ``mxfma`` (TE only): use the ``_ENABLE_MXFMA`` kernel's 16-bit constant for bf16/fp16 input (no
    effect on float32 input, which that kernel does not take; changes results only for fp16 -> E5M2).
    ``pad``: zero-pad the axis to whole blocks; default: TE pads, torchao refuses (ValueError).
    torchao itself takes only bf16/fp32 and has no ``nearest`` mode: float16 input goes through the
    same arithmetic, and ``nearest`` uses the FLOOR path's element arithmetic.

    ``swizzle``: also give the scales in the 128x4 blocked layout (``blocked_scales``, 2-D ``x`` only;
    :func:`fp8sim.scaling.swizzle.with_blocked_scales`).

    Returns a :class:`QuantizedData` with unpacked element codes, uint8 E8M0 scale codes and
    ``block`` = ``block_size`` at ``axis`` and 1 elsewhere; its ``shape`` is the unpadded shape.
    """
    fmt, rule, flavor, block_size = _check_quantize_args(elem_format, scale_rule, flavor, block_size, mxfma, pad)
    if not isinstance(swizzle, bool):
        raise TypeError(f"swizzle must be True or False, got {swizzle!r}")
    arr, dtype = _as_float32(x, "x")
    qt = _quantize(arr, dtype, fmt, axis, block_size, rule, flavor, bool(mxfma), pad)
    if swizzle:
        from .swizzle import with_blocked_scales

        qt = with_blocked_scales(qt)
    return qt


def quantize_mx_rowwise_columnwise(
    x: Any,
    elem_format: str | FloatFormat = "e4m3",
    *,
    block_size: int = 32,
    scale_rule: str = "floor",
    flavor: str = "torchao",
    mxfma: bool = False,
    pad: bool | None = None,
) -> tuple[QuantizedData, QuantizedData]:
    """Both MX copies of a 2-D ``x`` (spec 5.2): rowwise (1 x block_size blocks along the last dim)
    and columnwise (block_size x 1 blocks along dim 0), each computed from the high-precision input,
    never one from the other.  Arguments as :func:`quantize_mx`."""
    fmt, rule, flavor, block_size = _check_quantize_args(elem_format, scale_rule, flavor, block_size, mxfma, pad)
    arr, dtype = _as_float32(x, "x")
    if arr.ndim != 2:
        raise ValueError(f"quantize_mx_rowwise_columnwise takes a 2-D tensor; got shape {arr.shape}")
    args = (block_size, rule, flavor, bool(mxfma), pad)
    return _quantize(arr, dtype, fmt, -1, *args), _quantize(arr, dtype, fmt, 0, *args)


# -- TE's MXFP8 2D weight quantization -----------------------------------------------------


def _e8m0_ceil(amax: np.ndarray, fmax: float) -> np.ndarray:
    """TE's E8M0 scale code for a tile amax: the exponent of ``fl32(amax * fl32(1/fmax))`` (the kernel
    multiplies by ``max_norm_rcp``: ``common/cast/mxfp8/quantize_mxfp8.cuh`` lines 440-441), rounded
    up when the mantissa is nonzero (not past 254; subnormals at most half an ulp round to 0); 0 for
    amax 0, 0xFE for Inf, 0xFF for NaN (``ptx::float_to_e8m0``, ``common/util/ptx_arch_spec.cuh`` lines 86-101;
    Blackwell's ``cvt.rp.satfinite.ue8m0x2`` agrees)."""
    val = (amax.astype(np.float32) * np.float32(1.0 / fmax)).astype(np.float32)
    bits = val.view(np.uint32)
    exponent = ((bits >> 23) & 0xFF).astype(np.int32)
    mantissa = bits & 0x7FFFFF
    up = (mantissa > 0) & (exponent != 254) & ~((exponent == 0) & (mantissa <= 0x400000))
    exponent = np.where(val == 0, 0, exponent + up)
    exponent = np.where(np.isinf(val), 0xFE, np.where(np.isnan(val), 0xFF, exponent))
    return exponent.astype(np.uint8)


def quantize_mx_2d_te(x: np.ndarray, fmt: FloatFormat, k_axis: int) -> QuantizedData:
    """MXFP8 2D weight quantization (``MXFP8BlockScaling(enable_2d_quantization=True)``): one E8M0
    scale per 32x32 tile, shared by the rowwise and the columnwise copy (TE ``quantization.py``
    MXFP8BlockScalingRecipeState: linear weights only; reference ``_mxfp8_2d_quantize_reference``).
    ``x``: a 2-D float32 array.  Returned as 1x32 blocks along ``k_axis`` whose scales repeat the tile's."""
    rows, cols = x.shape
    pr, pc = -(-rows // 32) * 32, -(-cols // 32) * 32
    xp = np.zeros((pr, pc), np.float32)
    xp[:rows, :cols] = x
    # the kernel's tile amax is fmaxf from 0 over |x|: NaN-skipping (quantize_mxfp8.cuh lines 409-437)
    tiles = np.fmax.reduce(np.abs(xp).reshape(pr // 32, 32, pc // 32, 32), axis=(1, 3), initial=0.0)
    e8m0 = _e8m0_ceil(tiles, fmt.max)
    scale_inv = np.ldexp(np.float32(1), e8m0.astype(np.int32) - 127).astype(np.float32)
    full = np.repeat(np.repeat(scale_inv, 32, axis=0), 32, axis=1)
    codes = _encode(xp / full, fmt, saturate=True)  # exact division by a power of two, then RN
    if k_axis == 1:
        scales, block = np.repeat(e8m0, 32, axis=0), (1, 32)
    else:
        scales, block = np.repeat(e8m0, 32, axis=1), (32, 1)
    return QuantizedData(
        codes=np.asarray(codes, np.uint8),
        scales=scales,
        fmt=fmt,
        block=block,
        shape=(rows, cols),
        dtype="float32",
        scale_format=E8M0,
    )
