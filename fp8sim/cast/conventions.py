"""Named conventions: what real implementations do by default, as data over the core cast.

Each :class:`Convention` says, per format, which rounding and overflow policy an implementation
uses, plus the few places where it departs from the core rules (NaN code, E8M0 zero and sign,
float64 narrowed through float32).  ``CONVENTIONS[name].encode(x, fmt)`` reproduces that
implementation's codes bit for bit; each preset is tested against the real library where it is
installed.  Spec section 2.3 and 2.4.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

import numpy as np

from ..formats import FloatFormat, get_format
from . import decode, encode

__all__ = ["Convention", "CONVENTIONS", "get_convention"]


@dataclass(frozen=True)
class Convention:
    """How one implementation casts to narrow formats.

    ``float64="via_float32"``: float64 arrays and tensors are first rounded to float32 (nearest
    even), then cast (ml_dtypes array casts, torch), so they are rounded twice; Python floats are
    always rounded once.  ``overrides`` maps a format name to ``{"rounding": ..., "saturate": ...}``.
    ``nan_codes`` maps a format name to the code a positive NaN gets (a negative NaN also gets the
    sign bit).  ``unsigned_zero`` / ``unsigned_negative``: what a format without zero and sign (E8M0)
    does with zeros (``"core"``: NaN, or 0x00 when saturating; ``"min"``: 0x00) and with negative
    inputs (``"core"``; ``"abs"``: the sign is ignored).
    """

    name: str
    description: str
    rounding: str = "nearest_even"
    saturate: bool = True
    float64: Literal["exact", "via_float32"] = "exact"
    formats: tuple[str, ...] | None = None
    overrides: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    nan_codes: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    unsigned_zero: Literal["core", "min"] = "core"
    unsigned_negative: Literal["core", "abs"] = "core"
    source: str = ""
    e8m0_ties: Literal["up", "even"] = "up"  # exact E8M0 ties (1.5 * 2^k): ml_dtypes 0.6.0 rounds them up

    def options(self, fmt: str | FloatFormat) -> dict[str, Any]:
        """The core ``encode`` options this convention uses for ``fmt``."""
        f = get_format(fmt)
        if self.formats is not None and f.name not in self.formats:
            raise ValueError(f"convention {self.name!r} has no {f.name}; it covers: {', '.join(self.formats)}")
        opts = {"rounding": self.rounding, "saturate": self.saturate}
        opts.update(self.overrides.get(f.name, {}))
        return opts

    def encode(self, x: Any, fmt: str | FloatFormat, *, seed: int | None = None) -> Any:
        """Codes of ``x`` in ``fmt`` as this implementation produces them."""
        f = get_format(fmt)
        opts = self.options(f)
        if opts["rounding"] == "stochastic":
            opts["seed"] = seed
        x = self._narrow(x)
        if not f.signed and self.unsigned_negative == "abs":
            x = abs(x)
        if f.name == "e8m0" and self.e8m0_ties == "even" and opts["rounding"] == "nearest_even":
            from .e8m0 import encode_e8m0

            codes = encode_e8m0(x, ties="even", saturate=opts["saturate"])
        else:
            codes = encode(x, f, **opts)
        with np.errstate(invalid="ignore"):  # NaN comparisons on bfloat16 arrays warn
            if not f.has_zero and self.unsigned_zero == "min":
                codes = _where(codes, x == 0, 0)
            if f.name in self.nan_codes:
                nan = self.nan_codes[f.name]
                codes = _where(codes, _isnan(x) & _signbit(x), nan | f.sign_mask)
                codes = _where(codes, _isnan(x) & ~_signbit(x), nan)
        return codes

    def quantize(self, x: Any, fmt: str | FloatFormat, *, seed: int | None = None) -> Any:
        """float32 values on the grid, as this implementation produces them."""
        return decode(self.encode(x, fmt, seed=seed), fmt)

    def _narrow(self, x: Any) -> Any:
        if self.float64 != "via_float32":
            return x
        if isinstance(x, np.ndarray) and x.dtype == np.float64:
            return x.astype(np.float32)
        if getattr(x, "dtype", None) is not None and str(x.dtype) == "torch.float64":
            return x.float()
        return x


def _isnan(x: Any) -> Any:
    return x.isnan() if hasattr(x, "isnan") else np.isnan(x)


def _signbit(x: Any) -> Any:
    return x.signbit() if hasattr(x, "signbit") else np.signbit(x)


def _where(codes: Any, cond: Any, value: int) -> Any:
    if hasattr(codes, "masked_fill"):
        return codes.masked_fill(cond, value)
    if isinstance(codes, int):
        return value if bool(cond) else codes
    out = np.where(cond, np.uint8(value), codes).astype(np.uint8)
    return out[()] if np.ndim(out) == 0 and not isinstance(codes, np.ndarray) else out


_TORCH_FORMATS = ("e4m3", "e5m2", "e8m0", "e4m3fnuz", "e5m2fnuz")
_TORCH_NAN = MappingProxyType({"e5m2": 0x7F})
_TORCH_COMMON = dict(
    float64="via_float32",
    formats=_TORCH_FORMATS,
    nan_codes=_TORCH_NAN,
    unsigned_zero="min",
    unsigned_negative="abs",
)

_PRESETS = (
    Convention(
        "ml_dtypes",
        "ml_dtypes astype / scalar constructor: nearest-even, non-saturating (E4M3 overflow -> NaN, "
        "E5M2 -> Inf, fnuz -> NaN, FP4/FP6 -> max), float64 arrays narrowed through float32",
        saturate=False,
        float64="via_float32",
        source="jax-ml/ml_dtypes:ml_dtypes/include/float8.h ConvertImpl; _src/floats.cc NPyCast",
    ),
    Convention(
        "satfinite",
        "CUDA __nv_cvt_*_to_fp8 with __NV_SATFINITE / PTX cvt.rn.satfinite, as TransformerEngine casts: "
        "nearest-even, +-Inf and finite overflow -> +-max; E8M0 rounds up (cvt.rp.satfinite.ue8m0x2)",
        saturate=True,
        overrides=MappingProxyType({"e8m0": {"rounding": "up", "saturate": True}}),
        source="CUDA cuda_fp8.hpp; NVIDIA/TransformerEngine common/util/ptx.cuh, ptx_arch_spec.cuh float_to_e8m0",
    ),
    Convention(
        "torch_eager",
        "torch eager .to(float8) on the CPU since pytorch#178817 (measured on torch 2.13.0+cpu): E4M3 "
        "overflow and +-Inf -> +-448, E5M2 overflow -> Inf with NaN code 0x7F, fnuz -> NaN, E8M0: "
        "0 -> 2^-127 and the sign ignored; float64 narrowed through float32",
        overrides=MappingProxyType({f: {"saturate": False} for f in _TORCH_FORMATS if f != "e4m3"}),
        source="pytorch/pytorch:torch/headeronly/util/Float8_*.h, aten/src/ATen/cpu/vec/vec512/vec512_float8.h",
        **_TORCH_COMMON,
    ),
    Convention(
        "torch_eager_legacy",
        "torch eager .to(float8) before pytorch#178817 (torch <= 2.12): as torch_eager but E4M3 overflow "
        "and +-Inf -> NaN (0x7F | sign)",
        saturate=False,
        source="pytorch/pytorch:torch/headeronly/util/Float8_e4m3fn.h @ 0316fdce",
        **_TORCH_COMMON,
    ),
    Convention(
        "torchao",
        "torchao float8 to_fp8_saturated: clamp to +-max, then torch eager .to(float8): nearest-even "
        "saturating; E5M2 NaN code 0x7F.  Compare NaN by class: torch's vectorised bfloat16 clamp "
        "turns every NaN negative while its scalar tail keeps the sign",
        saturate=True,
        float64="via_float32",
        formats=("e4m3", "e5m2", "e4m3fnuz", "e5m2fnuz"),
        nan_codes=_TORCH_NAN,
        source="pytorch/ao:torchao/float8/float8_utils.py to_fp8_saturated",
    ),
    Convention(
        "ml_dtypes_ties_even",
        "the ml_dtypes convention with exact E8M0 ties rounded to the even code (the open ml_dtypes change; "
        "ml_dtypes 0.6.0 rounds them up)",
        saturate=False,
        float64="via_float32",
        e8m0_ties="even",
        source="jax-ml/ml_dtypes:ml_dtypes/include/mxfloat.h (float8_e8m0fnu rounding); fp8sim.cast.e8m0",
    ),
)

CONVENTIONS: MappingProxyType = MappingProxyType({c.name: c for c in _PRESETS})
_ALIASES = {"cuda": "satfinite", "te": "satfinite", "transformer_engine": "satfinite"}


def get_convention(name: str | Convention) -> Convention:
    """A preset by name (aliases: cuda, te -> satfinite); a Convention passes through."""
    if isinstance(name, Convention):
        return name
    key = _ALIASES.get(name, name) if isinstance(name, str) else None
    if key in CONVENTIONS:
        return CONVENTIONS[key]
    raise ValueError(f"unknown convention {name!r}; known: {', '.join([*CONVENTIONS, *_ALIASES])}")
