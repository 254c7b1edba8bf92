"""``scaled_mm``'s arguments: the operands as element codes and formats, the scales as arrays, which scale
layout they are (spec 8.2) with their block tiling, the accumulator, what torch's oneDNN kernel takes, and a
device profile's split-K for the call."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._util.tensors import is_torch_tensor, numpy_view
from ..formats import FloatFormat, get_format
from ..scaling.amax import dtype_name
from ._blocks import BLOCK_ORDERS, resolve_tiling, torch_tiling
from ._checks import _SCALE_CODE_DTYPES, _TORCH_FMT, layout_error
from .accumulators import Accumulator, get_accumulator

__all__: list[str] = []


def _operand(x: Any, fmt: str | FloatFormat | None, name: str, host: bool = True) -> tuple[Any, FloatFormat]:
    """uint8 codes and format; ``host=False`` keeps a torch FP8 operand's codes on its device."""
    if is_torch_tensor(x):
        dt = dtype_name(x)
        if dt == "float4_e2m1fn_x2":  # two E2M1 codes per byte along K (element 2i in the low nibble)
            from ..scaling.packing import unpack_fp4

            src = x.detach() if not host else x.detach().cpu()  # a device operand unpacks on its device
            codes = unpack_fp4(src) if name == "mat1" else unpack_fp4(src.t()).t()
            return (codes if not host else np.asarray(codes)), get_format("e2m1")
        if dt not in _TORCH_FMT:
            raise ValueError(f"Expected {name} to be Float8 matrix got {dt}")
        if not host:
            return x.detach().view(__import__("torch").uint8), get_format(_TORCH_FMT[dt])
        # numpy_view, not .numpy(): that would pin the storage of an FP8 parameter (FSDP2 frees it)
        return numpy_view(x.detach().contiguous().view(__import__("torch").uint8).cpu()), get_format(_TORCH_FMT[dt])
    if fmt is None:
        raise ValueError(f"{name} is a code array: pass {'a' if name == 'mat1' else 'b'}_format= (e.g. 'e4m3')")
    f = get_format(fmt, arg="a_format" if name == "mat1" else "b_format")
    arr = np.asarray(x)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integer codes of {f.name}, got dtype {arr.dtype}")
    if arr.size and (arr.min() < 0 or arr.max() >= f.num_codes):
        raise ValueError(f"{name} holds codes outside [0, {f.num_codes - 1}] for {f.name}")
    return arr.astype(np.uint8, copy=False), f


def _as_input(x: Any, name: str, number: bool = False) -> Any:
    """One normalisation before every check: torch tensors and numpy arrays as given, nested lists
    and tuples (and, for scales and the bias, Python numbers, which become float32 as
    ``torch.tensor`` makes them) as numpy arrays; anything else a TypeError naming the argument."""
    if x is None or is_torch_tensor(x) or isinstance(x, np.ndarray):
        return x
    ok = (list, tuple, np.generic) + ((int, float) if number else ())
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, ok):
        what = "a torch tensor, a numpy array or a nested list" + (" or a number" if number else "")
        raise TypeError(f"{name} must be {what}; got {type(x).__name__}")
    if isinstance(x, np.generic):
        return np.asarray(x)
    try:
        arr = np.asarray(x)
    except ValueError as exc:  # ragged nesting
        raise ValueError(f"{name} is not a rectangular array: {exc}") from None
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"{name} must hold numbers; got {arr.dtype} from a {type(x).__name__}")
    return arr.astype(np.float32) if number else arr  # Python numbers: float32, as torch.tensor makes them


def _scale(x: Any) -> np.ndarray:
    if x is None:
        return None
    if is_torch_tensor(x):
        t = x.detach().cpu()
        if str(t.dtype) in _SCALE_CODE_DTYPES:
            return numpy_view(t.view(__import__("torch").uint8))
        if str(t.dtype) in ("torch.bfloat16", "torch.float16"):
            return numpy_view(t.float())  # exact
        return numpy_view(t)
    return np.asarray(x)


def _layout(sa: np.ndarray, sb: np.ndarray, m: int, k: int, n: int, fa: FloatFormat) -> str:
    """Which scale layout the pair of scales is (spec 8.2), or ValueError."""
    if sa.dtype == np.float32 and sb.dtype == np.float32:
        if sa.size == 1 and sb.size == 1:
            return "tensorwise"
        if sa.shape == (m, 1) and sb.shape == (1, n):
            return "rowwise"
        kb = -(-k // 128)
        a1, a2 = sa.shape == (m, kb), sa.shape == (-(-m // 128), kb)
        b1, b2 = sb.shape == (kb, n), sb.shape == (kb, -(-n // 128))
        if (a1 or a2) and (b1 or b2) and not (a2 and b2 and not (a1 or b1)):
            return f"block_{'1' if a1 else '2'}x{'1' if b1 else '2'}"
    if sa.dtype == np.uint8 and sb.dtype == np.uint8:  # one scale per (possibly partial) block along K
        k16, k32 = -(-k // 16), -(-k // 32)
        if fa.name == "e2m1" and sa.shape == (m, k16) and sb.shape == (k16, n):
            return "nvfp4"
        if sa.shape == (m, k32) and sb.shape == (k32, n):
            return "mx"
    raise ValueError(layout_error(sa, sb, m, k, n))


def _check_onednn_call(sa: np.ndarray, sb: np.ndarray, scale_result: Any, out_dtype: Any) -> None:
    """What torch's oneDNN kernel takes (``aten/src/ATen/native/mkldnn/Linear.cpp`` ``mkldnn_scaled_mm``)."""
    if sa.dtype.kind != "f" or sb.dtype.kind != "f" or sa.size != 1 or sb.size != 1:
        raise ValueError(
            "accumulator 'cpu_onednn' is torch's oneDNN CPU kernel, which takes one float scale per operand "
            "(Blas.cpp sends other scale layouts to the fallback kernel: accumulator 'cpu_reference'); "
            f"got scales of shapes {list(sa.shape)} and {list(sb.shape)}, dtypes {sa.dtype} and {sb.dtype}"
        )
    if scale_result is not None and out_dtype is None:
        raise ValueError(
            "torch's oneDNN CPU kernel reads out_dtype without checking it is set when scale_result is given "
            "(undefined behaviour in mkldnn_scaled_mm): pass out_dtype with scale_result"
        )


def _profile_split(prof: Any, layout: str, m: int, n: int, k: int, out: str, fast: bool, fa: str, fb: str) -> tuple:
    """The profile's split for this call: its recorded decision for tensorwise scales (the only cuBLASLt calls
    recorded: rowwise runs other kernels, CUTLASS on sm_89/sm_90), else a split given with ``with_splits``."""
    if layout == "tensorwise":
        return prof.split_for(m, n, k, out, fast, fa, fb)
    for key in ((m, n, k, out, bool(fast)), (m, n, k)):
        if key in prof.splits:
            return prof.splits[key]
    from .profiles import SplitKUnknownError

    raise SplitKUnknownError(
        f"profile {prof.name!r} records the split-K of tensorwise-scaled calls only; this call has {layout} scales "
        f"(M={m} N={n} K={k}, {fa} x {fb} -> {out}, use_fast_accum={fast}); pass split_k=(S, scheme) or "
        f"profile.with_splits({{({m}, {n}, {k}): (S, scheme)}}) with the split your GPU used ((1, 'none'): unsplit)"
    )


def _block_layout(sa, sb, m, k, n, fa, block_shape, block_order, strict) -> tuple[str, Any]:  # noqa: ANN001
    """The scale layout and, for block scales, their tiling ``(block_m, block_n, block_k)``."""
    if block_order is not None and block_order not in BLOCK_ORDERS:
        raise ValueError(f"block_order must be None or one of {', '.join(BLOCK_ORDERS)}; got {block_order!r}")
    if block_shape is not None:
        if sa.dtype != np.float32 or sb.dtype != np.float32:
            raise ValueError(f"block_shape takes float32 block scales; got {sa.dtype} and {sb.dtype}")
        return "block", resolve_tiling(sa, sb, m, k, n, block_shape, None, strict)
    try:
        layout = _layout(sa, sb, m, k, n, fa)
    except ValueError as e:
        if not (sa.dtype == np.float32 and sb.dtype == np.float32 and sa.ndim == 2 and sb.ndim == 2):
            raise
        return "block", resolve_tiling(sa, sb, m, k, n, None, str(e), strict)
    if layout.startswith("block"):
        return layout, torch_tiling(layout)
    if block_order is not None:
        raise ValueError(f"block_order applies to float32 block scales; these scales are {layout}")
    return layout, None


def _pick_accumulator(acc: Any, fast: bool, device: str) -> Accumulator:
    if acc is not None:
        return get_accumulator(acc)
    if not isinstance(device, str) or device not in ("hopper", "ada", "blackwell"):
        raise ValueError(f"device must be 'hopper', 'ada' or 'blackwell', got {device!r:.60}")
    if device == "blackwell":
        return get_accumulator("blackwell" if fast else "blackwell_split")
    return get_accumulator(f"{device}_{'fast' if fast else 'split'}")
