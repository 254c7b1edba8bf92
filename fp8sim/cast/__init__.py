"""The cast API: ``encode``, ``decode`` and ``quantize`` for numpy, torch and Python scalars.

Semantics (spec section 2): the input is rounded once, from its exact value, onto the format's
grid with gradual underflow; then overflow is resolved:

- ``saturate=True``: finite overflow and +-Inf become +-max (CUDA ``satfinite``).
- ``saturate=False``: the non-saturating OCP rule, exactly ml_dtypes' cast: overflow becomes Inf
  where the format has it, else NaN, else (FP4/FP6) max.  Directed modes (``toward_zero``, and
  ``up``/``down`` away from their direction) still land on +-max, as IEEE 754 section 7.4 says.

NaN stays NaN (FP4/FP6, which have no NaN, take ml_dtypes' code: the -0 code, sign-flipped by the
input's sign).  E8M0 has no zero and no sign: nearest rounding is in the linear domain on the
whole range, (2^-127, 2^-126) included, with ties going up (ml_dtypes 0.7), ``up``/``down`` round
to the power of two above/below, values below 2^-127 go to 2^-127, and zero or negative inputs give
NaN, or 2^-127 (code 0x00) when saturating.  Unsigned formats with zero (UE5M3) give NaN for
negative inputs, or 0 when saturating; -0 is 0.
"""

from __future__ import annotations

import secrets
from typing import Any

import numpy as np

from .._util.args import as_array, is_complex_dtype, is_real_float_dtype
from .._util.tensors import is_torch_tensor
from ..formats import FloatFormat, get_format
from . import numpy_backend
from ._rounding import ROUNDING_MODES, SR_BITS
from ._tables import decode_table

__all__ = ["encode", "decode", "quantize", "ROUNDING_MODES", "SR_BITS"]

_FLOAT_DTYPES = "float16, bfloat16, float32, float64"


def _check_options(rounding: str, saturate: bool, seed: int | None) -> int | None:
    if not isinstance(rounding, str) or rounding not in ROUNDING_MODES:
        raise ValueError(f"unknown rounding {rounding!r}; known: {', '.join(ROUNDING_MODES)}")
    if not isinstance(saturate, (bool, np.bool_)):
        raise TypeError(f"saturate must be True or False, got {saturate!r}")
    if rounding != "stochastic":
        if seed is not None:
            raise ValueError(f"seed is used only with rounding='stochastic' (rounding={rounding!r})")
        return None
    if seed is None:
        return secrets.randbits(64)  # not reproducible: pass seed= for that
    from ._random import seed_keys

    seed_keys(seed)  # validates
    return int(seed)


def _float_array(x: Any, arg: str = "x") -> np.ndarray:
    """numpy float16/float32/float64 view of ``x`` (bfloat16 and narrower ml_dtypes floats become
    float32, exactly)."""
    if isinstance(x, (np.ndarray, np.generic)):
        arr = np.asarray(x)
    elif isinstance(x, (bool, int, complex)) or not isinstance(x, (float, list, tuple)):
        raise TypeError(
            f"{arg} must be a float, a float array or a float tensor ({_FLOAT_DTYPES}); got {type(x).__name__}"
        )
    else:
        arr = as_array(x, arg)
    dt = arr.dtype
    if is_complex_dtype(dt):  # numpy would drop the imaginary part with only a ComplexWarning
        raise TypeError(f"{arg} must have a real floating dtype ({_FLOAT_DTYPES}); got complex {dt}")
    if dt.type.__module__.startswith("ml_dtypes") and is_real_float_dtype(dt):
        # every ml_dtypes float (float8_e5m2 has kind "f", the others "V") widens exactly
        return arr.astype(np.float32)
    if dt.kind == "f" and not dt.isnative:
        arr = arr.astype(dt.newbyteorder("="))
        dt = arr.dtype
    if dt in (np.float16, np.float32, np.float64):
        return arr
    raise TypeError(f"{arg} must have a floating dtype ({_FLOAT_DTYPES}); got {dt}")


def _torch_float(x: Any, arg: str = "x") -> Any:
    import torch

    if x.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        return x
    if x.is_floating_point() and torch.finfo(x.dtype).bits <= 16:
        return x.float()  # float8 inputs: exact
    raise TypeError(f"{arg} must have a floating dtype ({_FLOAT_DTYPES}); got {x.dtype}")


def encode(
    x: Any,
    fmt: str | FloatFormat,
    *,
    rounding: str = "nearest_even",
    saturate: bool = True,
    seed: int | None = None,
) -> Any:
    """Round ``x`` to ``fmt`` and return its codes as uint8 (low bits for 4- and 6-bit formats).

    ``x``: a Python float, a numpy array/scalar or a torch tensor (any device) of float16,
    bfloat16, float32 or float64; the result is of the same kind, shape and device.
    ``rounding``: one of ``nearest_even`` (default), ``toward_zero``, ``up``, ``down``,
    ``nearest_away``, ``stochastic`` (32 counter-based random bits per element from ``seed``; see
    :data:`SR_BITS`).  ``saturate``: overflow policy, see the module docstring.
    """
    f = get_format(fmt)
    seed = _check_options(rounding, saturate, seed)
    if is_torch_tensor(x):
        from . import torch_backend

        return torch_backend.encode(_torch_float(x), f, rounding, bool(saturate), seed)
    scalar = isinstance(x, float) and not isinstance(x, np.generic)
    arr = _float_array(x)
    out = numpy_backend.encode(arr, f, rounding, bool(saturate), seed)
    if scalar:
        return int(out)
    return out[()] if isinstance(x, np.generic) else out


def decode(codes: Any, fmt: str | FloatFormat) -> Any:
    """float32 values of ``codes`` (integers in ``[0, 2^bits)``) in ``fmt``.

    A Python int gives a Python float; numpy and torch inputs give float32 of the same shape
    (and device).
    """
    f = get_format(fmt)
    if is_torch_tensor(codes):
        import torch

        if codes.is_floating_point() or codes.is_complex() or codes.dtype == torch.bool:
            raise TypeError(f"codes must be an integer tensor, got {codes.dtype}")
        if codes.dtype in _torch_wide_unsigned(torch):
            # torch has no min/max (nor most kernels) for uint16/32/64: check and decode as int64
            wide = codes.to(torch.int64)
            if wide.numel() and wide.min().item() < 0:  # a uint64 code >= 2^63
                _check_range(0, wide.min().item() + (1 << 64), f)
            codes = wide
        _check_range(codes.min().item() if codes.numel() else 0, codes.max().item() if codes.numel() else 0, f)
        from . import torch_backend

        return torch_backend.decode(codes, f)
    if isinstance(codes, bool) or not isinstance(codes, (int, np.integer, np.ndarray, list, tuple)):
        raise TypeError(f"codes must be integers (int, integer array or tensor); got {type(codes).__name__}")
    arr = as_array(codes, "codes")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"codes must have an integer dtype; got {arr.dtype}")
    if arr.size:
        _check_range(int(arr.min()), int(arr.max()), f)
    out = decode_table(f)[arr.astype(np.intp).reshape(-1)].reshape(arr.shape)
    if isinstance(codes, int) and not isinstance(codes, np.generic):
        return float(out)
    return out[()] if isinstance(codes, np.generic) else out


def _torch_wide_unsigned(torch: Any) -> tuple:
    """torch's uint16/uint32/uint64 dtypes (torch >= 2.3; none before)."""
    return tuple(getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n))


def _check_range(lo: int, hi: int, f: FloatFormat) -> None:
    if lo < 0 or hi >= f.num_codes:
        bad = lo if lo < 0 else hi
        raise ValueError(f"code {bad} out of range for {f.name}: codes must be in [0, {f.num_codes - 1}]")


def quantize(
    x: Any,
    fmt: str | FloatFormat,
    *,
    rounding: str = "nearest_even",
    saturate: bool = True,
    seed: int | None = None,
) -> Any:
    """``decode(encode(x, ...))``: float32 values on the format's grid, same kind/shape/device."""
    f = get_format(fmt)
    return decode(encode(x, f, rounding=rounding, saturate=saturate, seed=seed), f)
