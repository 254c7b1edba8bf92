"""Argument checks of :func:`fp8sim.gemm.scaled_mm`, in torch's words where torch has them.

Messages follow torch 2.13's ``_scaled_mm`` (``aten/src/ATen/native/cuda/ScaledBlas.cpp`` and the
CPU kernel): ``None`` scales are a TypeError naming the argument and its position, non-float32
scales and unknown layouts are "Invalid scaling configuration." followed by the layouts accepted,
a bias of the wrong length is "Bias must be size N but got X", and a bias of another type is
"Bias must be BFloat16 or Half, but got X".
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._util.tensors import is_torch_tensor
from ..formats import FORMATS, FloatFormat, get_format
from ..scaling.amax import dtype_name

__all__ = ["check_arguments", "check_bias", "check_scale_dtypes", "check_torch_rules", "layout_error", "out_dtype_name"]

_TORCH_FMT = {
    "float8_e4m3fn": "e4m3",
    "float8_e5m2": "e5m2",
    "float8_e4m3fnuz": "e4m3fnuz",
    "float8_e5m2fnuz": "e5m2fnuz",
}
_OUT_FLOATS = ("float32", "bfloat16", "float16")
_TORCH_NAMES = {"float32": "Float", "bfloat16": "BFloat16", "float16": "Half", "float64": "Double"}
_SCALE_CODE_DTYPES = ("torch.float8_e8m0fnu", "torch.float8_e4m3fn")


def _kind(x: Any) -> str:
    return "Tensor" if is_torch_tensor(x) else type(x).__name__


def check_arguments(a: Any, b: Any, scale_a: Any, scale_b: Any) -> None:
    """Operand kinds and scale presence, before any work."""
    if is_torch_tensor(a) != is_torch_tensor(b):
        raise TypeError(
            f"mat1 and mat2 must both be torch float8 tensors or both numpy code arrays; got {_kind(a)} and {_kind(b)}"
        )
    for pos, name, s in ((3, "scale_a", scale_a), (4, "scale_b", scale_b)):
        if s is None:
            want = "Tensor" if is_torch_tensor(a) else "a float32 scale (number or array)"
            raise TypeError(f"_scaled_mm(): argument '{name}' (position {pos}) must be {want}, not NoneType")


def check_scale_dtypes(scale_a: Any, scale_b: Any, m: int, k: int, n: int) -> None:
    """torch scales must be float32 (or block-scale codes): torch refuses bfloat16/half/double scales."""
    for s in (scale_a, scale_b):
        if is_torch_tensor(s) and str(s.dtype) != "torch.float32" and str(s.dtype) not in _SCALE_CODE_DTYPES:
            raise ValueError(layout_error(scale_a, scale_b, m, k, n))


def layout_error(sa: Any, sb: Any, m: int, k: int, n: int) -> str:
    """torch's "Invalid scaling configuration." message, with the block layouts fp8sim also takes."""

    def desc(s: Any) -> str:
        dt = str(getattr(s, "dtype", type(s).__name__)).replace("torch.", "")
        return f"dtype {_TORCH_NAMES.get(dt, dt)}, size {list(np.shape(s))}"

    kb = -(-k // 128)
    return (
        "Invalid scaling configuration.\n"
        "- For TensorWise scaling, a and b should be float8, scales should be float and singletons.\n"
        f"- For RowWise scaling, a and b should be float8, scales should be float, scale_a should be ({m}, 1) and "
        f"scale_b should be (1, {n}), and both should be contiguous.\n"
        f"- For BlockWise 1x128 / 128x128 scaling, scales should be float, scale_a ({m}, {kb}) or "
        f"({-(-m // 128)}, {kb}) and scale_b ({kb}, {n}) or ({kb}, {-(-n // 128)}), not both 128x128.\n"
        f"- For MX (1x32) scaling, scales should be E8M0 codes, scale_a ({m}, {-(-k // 32)}) and scale_b "
        f"({-(-k // 32)}, {n}); for NVFP4 (1x16), E2M1 operands and UE4M3 codes ({m}, {-(-k // 16)}) and "
        f"({-(-k // 16)}, {n}).\n"
        f"Got scale_a {desc(sa)} and scale_b {desc(sb)}"
    )


def out_dtype_name(out_dtype: Any, fa: FloatFormat) -> str:
    """fp8sim's name for ``out_dtype`` (None: the input's format, as torch)."""
    if out_dtype is None:
        return fa.name
    name = str(out_dtype).replace("torch.", "")
    if name in _OUT_FLOATS:
        return name
    if name in _TORCH_FMT:
        return _TORCH_FMT[name]
    if name in FORMATS:
        return get_format(name).name
    raise ValueError(
        f"out_dtype must be float32, bfloat16, float16 or an FP8 format ({', '.join(_TORCH_FMT)}, or a format "
        f"name: {', '.join(FORMATS)}); got {name}"
    )


def check_bias(bias: Any, n: int) -> None:
    size = int(np.prod(getattr(bias, "shape", ()) or (1,)))
    if size != n:
        raise RuntimeError(f"Bias must be size {n} but got {size}")


def check_torch_rules(a: Any, b: Any, fa: FloatFormat, fb: FloatFormat, bias: Any, out: str) -> None:
    """What CUDA's ``_scaled_mm`` refuses (``strict=True``)."""
    m, k = a.shape
    n = b.shape[1]
    if is_torch_tensor(a) and not (a.stride(1) == 1 and b.stride(0) == 1):
        raise RuntimeError("Only multiplication of row-major and column-major matrices is supported by cuBLASLt")
    if k % 16:
        raise RuntimeError(f"Expected trailing dimension of mat1 to be divisible by 16 but got mat1 shape: ({m}x{k}).")
    if k % 16 or n % 16:
        raise RuntimeError(f"mat2 shape ({k}x{n}) must be divisible by 16")
    if fa.name == "e5m2" and fb.name == "e5m2":
        raise RuntimeError("Multiplication of two Float8_e5m2 matrices is not supported")
    if bias is not None:
        bdt = dtype_name(bias)
        if out == "float32":
            raise RuntimeError("Bias is not supported when out_dtype is set to Float32")
        if bdt not in ("bfloat16", "float16"):
            raise RuntimeError(f"Bias must be BFloat16 or Half, but got {_TORCH_NAMES.get(bdt, bdt)}")
        if out == "bfloat16" and bdt != "bfloat16":
            raise RuntimeError(f"Bias must be BFloat16 to compute BFloat16 output, but got {_TORCH_NAMES[bdt]}")
        if out == "float16" and bdt != "float16":
            raise RuntimeError(f"Bias must be Float16 to compute Half output, but got {_TORCH_NAMES[bdt]}")
