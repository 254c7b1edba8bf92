"""Named conventions: what real implementations do by default, as data over the core cast.

Each :class:`Convention` says, per format, which rounding and overflow policy an implementation
uses, plus the few places where it departs from the core rules (NaN code, E8M0 zero and sign,
float64 narrowed through float32).  ``CONVENTIONS[name].encode(x, fmt)`` reproduces that
implementation's codes bit for bit; each preset is tested against the real library where it is
installed.  Spec section 2.3 and 2.4.

``CONVENTIONS["ml_dtypes"]`` is the rule of the *installed* ml_dtypes release (detected at import);
``ml_dtypes_0_5_0``, ``ml_dtypes_0_5``, ``ml_dtypes_0_6`` and ``ml_dtypes_0_7`` name each release's
rule so results made with another ml_dtypes can be reproduced (:data:`ML_DTYPES_RULES`,
``docs/versions.md``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal

import numpy as np

from ..formats import FloatFormat, get_format
from . import decode, encode

__all__ = [
    "Convention",
    "CONVENTIONS",
    "get_convention",
    "MlDtypesRule",
    "ML_DTYPES_RULES",
    "ml_dtypes_rule",
]


@dataclass(frozen=True)
class Convention:
    """How one implementation casts to narrow formats.

    ``float64="via_float32"``: float64 arrays and tensors are first rounded to float32 (nearest
    even), then cast (ml_dtypes array casts, torch), so they are rounded twice; Python floats are
    always rounded once.  ``overrides`` maps a format name to ``{"rounding": ..., "saturate": ...}``.
    ``nan_codes`` maps a format name to the code a positive NaN gets (a negative NaN also gets the
    sign bit).  ``unsigned_zero`` / ``unsigned_negative``: what a format without zero and sign (E8M0)
    does with zeros (``"core"``: NaN, or 0x00 when saturating; ``"min"``: 0x00) and with negative
    inputs (``"core"``; ``"abs"``: the sign is ignored).  ``e8m0_ties`` / ``e8m0_sliver``: the E8M0
    nearest-rounding rule (:func:`fp8sim.cast.e8m0.encode_e8m0`); the core is ``"up"`` / ``"nearest"``.
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
    e8m0_ties: Literal["up", "even"] = "up"  # exact E8M0 ties (1.5 * 2^k): ml_dtypes >= 0.5.1 rounds them up
    e8m0_sliver: Literal["nearest", "up"] = "nearest"  # (2^-127, 2^-126): "up" -> 0x01 (ml_dtypes < 0.7, torch)

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
            x = _abs(x)
        e8m0_rule = (self.e8m0_ties, self.e8m0_sliver) != ("up", "nearest")
        if f.name == "e8m0" and e8m0_rule and opts["rounding"] == "nearest_even":
            from .e8m0 import encode_e8m0

            codes = encode_e8m0(x, ties=self.e8m0_ties, sliver=self.e8m0_sliver, saturate=opts["saturate"])
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


def _abs(x: Any) -> Any:
    """``|x|`` of the kind ``encode`` takes: numpy's abs for arrays, numpy scalars and lists (a 0-d array stays
    one: numpy returns a scalar), Python's for floats and tensors."""
    if isinstance(x, (np.ndarray, np.generic, list, tuple)):
        out = np.abs(x)
        return np.asarray(out) if isinstance(x, np.ndarray) else out
    return abs(x)


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
    e8m0_sliver="up",  # fp8e8m0fnu_from_fp32_value: (2^-127, 2^-126) -> 0x01
)


@dataclass(frozen=True)
class MlDtypesRule:
    """How a range of ml_dtypes releases casts, where releases differ (read from each tag's source).

    ``first``: the first release with this rule (it holds until the next record's ``first``);
    ``convention``: the preset that reproduces it; ``e8m0_ties``, ``e8m0_sliver``, ``float64``: as in
    :class:`Convention`; ``source``: the file and lines it was read from."""

    convention: str
    first: tuple[int, int, int]
    releases: str
    e8m0_ties: Literal["up", "even"]
    e8m0_sliver: Literal["nearest", "up"]
    float64: Literal["exact", "via_float32"]
    source: str

    @property
    def summary(self) -> str:
        """One line: E8M0 ties, the lowest binade and float64 arrays."""
        ties = "to the even code" if self.e8m0_ties == "even" else "up"
        sliver = "-> 2^-126" if self.e8m0_sliver == "up" else "to nearest"
        f64 = "through float32 (double rounding)" if self.float64 == "via_float32" else "rounded once"
        return f"E8M0 ties {ties}, (2^-127, 2^-126) {sliver}; float64 arrays {f64}"


ML_DTYPES_RULES: tuple[MlDtypesRule, ...] = (
    MlDtypesRule(
        "ml_dtypes_0_5_0",
        (0, 5, 0),
        "0.5.0",
        "even",
        "up",
        "via_float32",
        "ml_dtypes/include/float8.h@v0.5.0: RoundBitsToNearestEven (line 1295) on the float32 bits with the "
        "exponent LSB as L (line 1535); float32 subnormals lines 1451-1480; _src/custom_float.h NPyCast line 629",
    ),
    MlDtypesRule(
        "ml_dtypes_0_5",
        (0, 5, 1),
        "0.5.1 - 0.5.4",
        "up",
        "up",
        "via_float32",
        "ml_dtypes/include/float8.h@v0.5.1: RoundBitsToNearestEven(..., use_implicit_bit) lines 1296-1308, "
        "1488, 1544 (commit 82a0ca1); _src/custom_float.h NPyCast (CastToFloat)",
    ),
    MlDtypesRule(
        "ml_dtypes_0_6",
        (0, 6, 0),
        "0.6.x",
        "up",
        "up",
        "via_float32",
        "ml_dtypes/include/float8.h@v0.6.0: ConvertImpl steps 4-6 (lines 1433-1514; line 1466 rounds with the "
        "implicit bit as L, E8M0 exponent 0 taken as a subnormal); _src/custom_float.h NPyCast line 640",
    ),
    MlDtypesRule(
        "ml_dtypes_0_7",
        (0, 7, 0),
        "0.7.x",
        "up",
        "nearest",
        "exact",
        "ml_dtypes/include/float8.h@v0.7.0: kToEncodingBias and the kSmallest shift in ConvertImpl (lines 1550, "
        "1652, 1709-1710; #434); RoundToOddFloat line 1806; _src/floats.h NarrowToFloat, _src/casts.cc line 230 (#401)",
    ),
)
ML_DTYPES_VERIFIED = "0.7.0"
"""The newest ml_dtypes release whose source was read; a newer one is given its predecessor's rule."""


def _version_tuple(version: str) -> tuple[int, int, int]:
    nums = [int(n) for n in re.findall(r"\d+", version.split("+")[0])[:3]]
    return tuple(nums + [0] * (3 - len(nums)))  # type: ignore[return-value]


def ml_dtypes_rule(version: str | None = None) -> MlDtypesRule:
    """The :class:`MlDtypesRule` of ml_dtypes ``version`` (default: the installed one)."""
    if version is None:
        import ml_dtypes

        version = ml_dtypes.__version__
    v = _version_tuple(version)
    found = ML_DTYPES_RULES[0]
    for rule in ML_DTYPES_RULES:
        if v >= rule.first:
            found = rule
    return found


_ML_DTYPES_DESCRIPTION = (
    "ml_dtypes {releases} astype / scalar constructor: nearest-even, non-saturating (E4M3 overflow -> NaN, "
    "E5M2 -> Inf, fnuz -> NaN, FP4/FP6 -> max); {summary}"
)


def _ml_dtypes_preset(rule: MlDtypesRule) -> Convention:
    return Convention(
        rule.convention,
        _ML_DTYPES_DESCRIPTION.format(releases=rule.releases, summary=rule.summary),
        saturate=False,
        float64=rule.float64,
        e8m0_ties=rule.e8m0_ties,
        e8m0_sliver=rule.e8m0_sliver,
        source="jax-ml/ml_dtypes:" + rule.source,
    )


def _installed_ml_dtypes() -> Convention:
    import ml_dtypes

    rule = ml_dtypes_rule(ml_dtypes.__version__)
    newer = _version_tuple(ml_dtypes.__version__) > _version_tuple(ML_DTYPES_VERIFIED)
    note = f" (newer than {ML_DTYPES_VERIFIED}, the last release checked: assumed unchanged)" if newer else ""
    return replace(
        _ml_dtypes_preset(rule),
        name="ml_dtypes",
        description=f"the installed ml_dtypes {ml_dtypes.__version__}: rule {rule.convention}{note}; "
        + _ML_DTYPES_DESCRIPTION.format(releases=rule.releases, summary=rule.summary),
    )


_PRESETS = (
    _installed_ml_dtypes(),
    Convention(
        "satfinite",
        "CUDA __nv_cvt_*_to_fp8 with __NV_SATFINITE / PTX cvt.rn.satfinite, as TransformerEngine casts: "
        "nearest-even, +-Inf and finite overflow -> +-max; E8M0 rounds up (cvt.rp.satfinite.ue8m0x2); "
        "not UE5M3, whose CUDA conversion (__nv_fp8_ue5m3) has not been read",
        saturate=True,
        formats=("e4m3", "e5m2", "e8m0", "e4m3fnuz", "e5m2fnuz", "e2m1", "e2m3", "e3m2"),
        overrides=MappingProxyType({"e8m0": {"rounding": "up", "saturate": True}}),
        source="CUDA cuda_fp8.hpp; NVIDIA/TransformerEngine common/util/ptx.cuh, ptx_arch_spec.cuh float_to_e8m0",
    ),
    Convention(
        "torch_eager",
        "torch eager .to(float8) on the CPU since pytorch#178817 (measured on torch 2.13.0+cpu): E4M3 "
        "overflow and +-Inf -> +-448, E5M2 overflow -> Inf with NaN code 0x7F, fnuz -> NaN, E8M0: "
        "0 -> 2^-127, the sign ignored and (2^-127, 2^-126) -> 2^-126; float64 narrowed through float32",
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
        "the ml_dtypes 0.7 convention with exact E8M0 ties rounded to the even code (gfloat TiesToEven; "
        "ml_dtypes >= 0.5.1 rounds them up)",
        saturate=False,
        e8m0_ties="even",
        source="graphcore-research/gfloat:src/gfloat/round.py (TiesToEven); fp8sim.cast.e8m0",
    ),
    *(_ml_dtypes_preset(rule) for rule in ML_DTYPES_RULES),
)

_ALIASES = {"cuda": "satfinite", "te": "satfinite", "transformer_engine": "satfinite"}


class _Presets(Mapping):
    """The presets by name, read-only; an alias (``CONVENTIONS["te"]``) finds its preset as
    :func:`get_convention` does, while iteration and ``len`` list each preset once, by its own name."""

    def __init__(self, presets: dict[str, Convention]) -> None:
        self._presets = presets

    def __getitem__(self, name: object) -> Convention:
        key = _ALIASES.get(name, name) if isinstance(name, str) else name
        try:
            return self._presets[key]
        except (KeyError, TypeError):
            raise KeyError(f"unknown convention {name!r}; known: {', '.join([*self._presets, *_ALIASES])}") from None

    def __iter__(self):  # noqa: ANN204
        return iter(self._presets)

    def __len__(self) -> int:
        return len(self._presets)

    def __repr__(self) -> str:
        return f"CONVENTIONS({list(self._presets)})"


CONVENTIONS: Mapping[str, Convention] = _Presets({c.name: c for c in _PRESETS})


def get_convention(name: str | Convention) -> Convention:
    """A preset by name (aliases: cuda, te -> satfinite); a Convention passes through."""
    if isinstance(name, Convention):
        return name
    key = _ALIASES.get(name, name) if isinstance(name, str) else None
    if key in CONVENTIONS:
        return CONVENTIONS[key]
    raise ValueError(f"unknown convention {name!r}; known: {', '.join([*CONVENTIONS, *_ALIASES])}")
