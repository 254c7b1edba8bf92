"""FP8 block scaling (TE ``Float8BlockScaling``, DeepSeek-style): 1x128 and 128x128 blocks.

Per block (spec 5.3, ``common/transpose/quantize_transpose_{vector,square}_blockwise.cu``)::

    scale     = compute_scale_from_amax(block_amax, fp8_max, pow2, eps=0,
                                        value_for_inf=max finite of the INPUT dtype)
    scale_inv = fl32(1 / scale)            # exact for pow2 scales
    q         = satfinite(RN(fl32(x) * scale))

The amax skips NaN (TE's ``fmaxf``), a zero block gets scale 1, and partial edge blocks use only
their valid elements (the codes are zero-padded to whole blocks; the original shape is kept).  The
columnwise copy (128x1 blocks) is computed from the high-precision input, never transposed from
the rowwise one.  Scales are powers of two by default (``pow2=False``: float32 scales).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._util.args import as_int, as_real
from ..cast import encode
from ..formats import FloatFormat, get_format
from .amax import amax_nan_skipping, as_float32, dtype_name
from .current import compute_scale_from_amax
from .quantized import MAX_BLOCK_SIZE, QuantizedData, check_padding

__all__ = ["quantize_block_scaling", "BLOCK_SIZE", "MAX_BLOCK_SIZE", "input_dtype_max"]

BLOCK_SIZE = 128
_DTYPE_MAX = {"float32": float(np.finfo(np.float32).max), "bfloat16": 3.3895313892515355e38, "float16": 65504.0}


def input_dtype_max(dtype: str) -> float:
    """Largest finite value of the input dtype: TE's ``value_for_inf`` for block scales."""
    try:
        return _DTYPE_MAX[dtype]
    except KeyError:
        raise ValueError(f"input dtype must be one of {', '.join(_DTYPE_MAX)}; got {dtype!r}") from None


def quantize_block_scaling(
    x: Any,
    fmt: str | FloatFormat = "e4m3",
    *,
    block_dim: int = 1,
    columnwise: bool = False,
    pow2: bool = True,
    block_size: int = BLOCK_SIZE,
    eps: float = 0.0,
) -> QuantizedData:
    """Quantize with 1x``block_size`` (``block_dim=1``; ``columnwise``: ``block_size``x1 along dim 0)
    or ``block_size``x``block_size`` (``block_dim=2``) blocks.  1-D blocks along the last dim accept
    any rank; the columnwise and 2-D layouts need a 2-D tensor.  ``eps``: a block amax below it is
    raised to it before the scale (TE's ``amax_epsilon``, ``recipe_common.cuh``)."""
    f = get_format(fmt)
    if (
        isinstance(block_dim, (bool, np.bool_))
        or not isinstance(block_dim, (int, np.integer))
        or block_dim not in (1, 2)
    ):
        raise ValueError(
            f"block_dim must be 1 (1x{block_size}) or 2 ({block_size}x{block_size}); got {block_dim!r:.60}"
        )
    block_size = as_int(block_size, "block_size", lo=1, hi=MAX_BLOCK_SIZE, what="TE uses 128")
    eps = as_real(eps, "eps", finite=True, lo=0.0)
    for name, flag in (("pow2", pow2), ("columnwise", columnwise)):
        if not isinstance(flag, bool | np.bool_):
            raise ValueError(f"{name} must be True or False, got {flag!r}")
    dtype = dtype_name(x)
    value_for_inf = input_dtype_max(dtype if dtype in _DTYPE_MAX else "float32")
    x32 = as_float32(x)
    if x32.ndim == 0:
        raise ValueError("block scaling needs a tensor with at least one dimension")
    if (block_dim == 2 or columnwise) and x32.ndim != 2:
        what = "128x128 blocks" if block_dim == 2 else "columnwise blocks"
        raise ValueError(f"{what} need a 2-D tensor (flatten leading dims first); got shape {x32.shape}")
    if block_dim == 2:
        block = (block_size, block_size)
    elif columnwise:
        block = (block_size, 1)
    else:
        block = (1,) * (x32.ndim - 1) + (block_size,)
    check_padding(x32.shape, block)
    padded = np.zeros(tuple(-(-n // b) * b for n, b in zip(x32.shape, block, strict=True)), np.float32)
    padded[tuple(slice(0, n) for n in x32.shape)] = x32
    # one axis pair per dim: (blocks, within-block)
    split = padded.reshape(tuple(v for n, b in zip(padded.shape, block, strict=True) for v in (n // b, b)))
    inner = tuple(range(1, 2 * padded.ndim, 2))
    amax = amax_nan_skipping(split, axis=inner)
    scale = compute_scale_from_amax(amax, f.max, pow2=pow2, eps=eps, value_for_inf=value_for_inf)
    with np.errstate(divide="ignore"):
        scale_inv = (np.float32(1) / scale).astype(np.float32)
    expanded = np.expand_dims(scale, inner)
    with np.errstate(invalid="ignore", over="ignore"):  # Inf * 0 -> NaN, as upstream
        codes = encode((split * expanded).reshape(padded.shape), f, saturate=True)
    return QuantizedData(codes, scale_inv, f, block, x32.shape, dtype)
