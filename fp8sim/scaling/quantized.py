"""QuantizedData: what a scaled low-precision tensor really holds, the one quantized-data record of fp8sim.

Every quantizer of :mod:`fp8sim.scaling` returns it; the layers above carry it (TE's tensor classes in
``fp8sim.pytorch.tensor`` convert to it, the modules' GEMM operands and the torchao emulation hold it).
It was named ``QuantizedTensor`` before, a name TE's torch class ``fp8sim.pytorch.tensor.QuantizedTensor``
keeps; the old name still resolves here, with a DeprecationWarning.

One type for every layout (per-tensor, per-row, 1x128 / 128x128 blocks, MX, NVFP4): element codes,
one scale per block, the element and scale formats, the block shape, and the original shape and
dtype.  Scales are *dequantization* scales (spec "Notation"): ``x ~ decode(code) * scale``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..cast import decode
from ..formats import FloatFormat

__all__ = ["QuantizedData", "expand_blocks", "MAX_BLOCK_SIZE", "MAX_PADDED_ELEMENTS", "check_padding"]

MAX_BLOCK_SIZE = 1 << 16  # codes are padded to whole blocks: a larger block would only allocate padding
MAX_PADDED_ELEMENTS = 1 << 24  # a block larger than its dimension may zero-pad a tensor up to this size


def __getattr__(name: str) -> Any:
    return _deprecated_name(__name__, name)


def _deprecated_name(module: str, name: str) -> Any:
    """``QuantizedTensor``, the record's old name (a module ``__getattr__``)."""
    if name == "QuantizedTensor":
        import warnings

        warnings.warn(
            f"{module}.QuantizedTensor is now {module}.QuantizedData (TE's QuantizedTensor is the torch class "
            "fp8sim.pytorch.tensor.QuantizedTensor); the old name will be removed",
            DeprecationWarning,
            stacklevel=3,
        )
        return QuantizedData
    raise AttributeError(f"module {module!r} has no attribute {name!r}")


@dataclass(frozen=True, eq=False)
class QuantizedData:
    """A block-scaled tensor.

    - ``codes``: uint8 numpy array, one (unpacked) element code per element, shape ``padded_shape``.
    - ``scales``: numpy array with one entry per block, shape ``padded_shape[d] // block[d]``; float32
      values when ``scale_format`` is None, else uint8 codes of ``scale_format`` (E8M0 for MX, E4M3
      for NVFP4).
    - ``fmt``: the element format; ``block``: the block shape (1 along dims that are not blocked).
    - ``shape``: the original shape (``codes`` may be zero-padded up to whole blocks); ``dtype``:
      the original dtype's name.
    - ``global_scale``: a second-level float32 dequantization scale (NVFP4; an array broadcasting
      over the leading dims for row-scaled NVFP4), or None.
    - ``global_amax``: the amax the global scale came from, where an upstream dequantizes from it
      (TE NVFP4), or None.
    - ``scale_is_divisor``: the stored scales are *quantization* scales and dequantization divides
      by them (torchao: ``_data / _scale``), instead of multiplying.
    - ``blocked_scales``: the same scales in the flat 128x4 blocked ("swizzled") layout that
      ``torch._scaled_mm`` takes for MX/NVFP4 (:mod:`fp8sim.scaling.swizzle`), when a quantizer was asked
      for it (``swizzle=True``), else None.
    """

    codes: np.ndarray
    scales: np.ndarray
    fmt: FloatFormat
    block: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: str
    scale_format: FloatFormat | None = None
    global_scale: float | np.ndarray | None = None
    scale_is_divisor: bool = False
    global_amax: float | np.ndarray | None = None
    blocked_scales: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.codes.ndim != len(self.block) or len(self.shape) != len(self.block):
            raise ValueError(f"block {self.block} must have one entry per dim of shape {self.shape}")
        want = tuple(c // b for c, b in zip(self.codes.shape, self.block, strict=True))
        # a zero-length dim holds no blocks or one empty block (an empty tensor keeps its per-tensor scale)
        got = tuple(self.scales.shape)
        if len(got) == len(want):
            got = tuple(w if s == 1 and c == 0 else s for s, c, w in zip(got, self.codes.shape, want, strict=True))
        if any(c % b for c, b in zip(self.codes.shape, self.block, strict=True)) or got != want:
            got = tuple(self.scales.shape)
            raise ValueError(f"scales shape {got} does not match codes {self.codes.shape} in blocks {self.block}")

    @property
    def padded_shape(self) -> tuple[int, ...]:
        return tuple(self.codes.shape)

    def scale_values(self) -> np.ndarray:
        """The block scales as float32 (decoded when they are codes)."""
        if self.scale_format is None:
            return self.scales.astype(np.float32)
        return decode(self.scales, self.scale_format)

    def dequantize(self) -> np.ndarray:
        """float32 ``decode(code) * scale (* global_scale)`` (or ``/ scale``) in the original shape,
        formed exactly and rounded once to float32."""
        vals = decode(self.codes, self.fmt)
        scale = expand_blocks(self.scale_values(), self.block)
        if self.scale_is_divisor:
            with np.errstate(divide="ignore", invalid="ignore"):
                return (vals / scale)[tuple(slice(0, n) for n in self.shape)]  # one float32 rounding
        out = vals.astype(np.float64) * scale.astype(np.float64)
        if self.global_scale is not None:
            g = np.asarray(self.global_scale, np.float32).astype(np.float64)
            out = out * (g if g.ndim == 0 else _pad_to(g, out.shape))
        with np.errstate(invalid="ignore", over="ignore"):
            out = out.astype(np.float32)
        return out[tuple(slice(0, n) for n in self.shape)]

    def __repr__(self) -> str:
        sf = self.scale_format.name if self.scale_format else "float32"
        return (
            f"QuantizedData(fmt={self.fmt.name}, shape={self.shape}, block={self.block}, "
            f"scales={sf}{tuple(self.scales.shape)}, dtype={self.dtype})"
        )


def check_padding(shape: tuple[int, ...], block: tuple[int, ...], arg: str = "block_size") -> None:
    """Refuse blocks that would zero-pad ``shape`` beyond reason before anything is allocated: a block
    larger than its dimension is allowed only while the padded tensor holds at most
    :data:`MAX_PADDED_ELEMENTS` elements (blocks within their dimensions at most double each one)."""
    padded = [-(-n // b) * b for n, b in zip(shape, block, strict=True)]
    total = int(np.prod(padded, dtype=object))
    over = [d for d, (n, b) in enumerate(zip(shape, block, strict=True)) if b > n]
    if over and total > max(MAX_PADDED_ELEMENTS, int(np.prod(shape, dtype=object))):
        d = over[0]
        raise ValueError(
            f"{arg} {block[d]} is larger than dimension {d} of the input (shape {tuple(shape)}): zero-padding to "
            f"whole blocks would make {total} elements; a block larger than its dimension may pad up to "
            f"{MAX_PADDED_ELEMENTS} elements (use a {arg} of at most {shape[d]})"
        )


def _pad_to(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A per-row global scale (shape ``shape[:-1] + (1,)`` of the original tensor) padded to the
    padded codes' shape with ones."""
    pad = [(0, s - n) if n != 1 else (0, 0) for n, s in zip(g.shape, shape, strict=True)]
    return np.pad(g, pad, constant_values=1.0)


def expand_blocks(per_block: Any, block: tuple[int, ...]) -> np.ndarray:
    """Repeat each block's value over the block: shape ``per_block.shape * block``."""
    out = np.asarray(per_block)
    for axis, b in enumerate(block):
        if b != 1:
            out = np.repeat(out, b, axis=axis)
    return out
