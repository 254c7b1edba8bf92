"""Device profiles: how one GPU + cuBLASLt version computes ``torch._scaled_mm``.

A profile bundles the accumulator preset for fast and split accumulation, the epilogue order and a
split-K decision per shape.  Where the split for a shape is not known the profile raises
:class:`SplitKUnknownError` naming the shape instead of guessing; a user who has observed the split
on their own GPU supplies it with :meth:`DeviceProfile.with_splits` (or passes ``split_k=``).

Split decisions of the two recorded profiles come from the split-K tables mmaemu 0.1.0 recorded
with cuBLASLt 12.8.3.14 and torch 2.7.1's 1 MiB workspace (``mmaemu/platform/data/heur_*.npz``,
read through ``mmaemu.platform.splitk_table.resolve_splitk``); they need ``pip install mmaemu==0.1.0``.
Only decisions mmaemu marks as verified are used.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from .accumulators import get_accumulator
from .splitk import check_split_k

__all__ = ["DeviceProfile", "PROFILES", "SplitKUnknownError", "get_profile"]

SplitRule = Callable[[int, int, int, str, bool, str, str], "tuple[int, str] | None"]


class SplitKUnknownError(LookupError):
    """The profile does not know which split-K cuBLAS uses for this shape."""


def _shape_text(m: int, n: int, k: int, out: str, fast: bool, fa: str, fb: str) -> str:
    return f"M={m} N={n} K={k} ({fa} x {fb} -> {out}, use_fast_accum={fast})"


@dataclass(frozen=True)
class DeviceProfile:
    """One device's ``torch._scaled_mm``: ``fast`` / ``split`` accumulator presets (for
    ``use_fast_accum`` True / False), ``epilogue`` (see :func:`fp8sim.gemm.scaled_mm`), the split-K
    ``schemes`` its kernels use and a ``split_rule`` (None: unknown for every shape).
    ``f16_accumulate``: the preset of a kernel that accumulates in float16 on this device (``mma.sync
    ... .f16``: Triton ``out_dtype=float16``, CUTLASS ``half_t``; cuBLASLt's FP8 GEMMs always accumulate
    in float32), None where the device's rule is not known."""

    name: str
    fast: str
    split: str
    epilogue: str = "alpha"
    schemes: tuple[str, ...] = ()
    split_rule: SplitRule | None = None
    splits: Mapping[tuple, tuple[int, str]] = field(default_factory=lambda: MappingProxyType({}))
    description: str = ""
    f16_accumulate: str | None = None

    def __post_init__(self) -> None:
        get_accumulator(self.fast)
        get_accumulator(self.split)
        if self.f16_accumulate is not None and get_accumulator(self.f16_accumulate).accumulate != "float16":
            raise ValueError(f"f16_accumulate must name a float16-accumulate preset; got {self.f16_accumulate!r}")
        if self.epilogue not in ("alpha", "sequential"):
            raise ValueError(f"epilogue must be 'alpha' or 'sequential', got {self.epilogue!r}")

    def accumulator_for(self, use_fast_accum: bool, accumulate: str = "float32") -> str:
        """The preset for ``use_fast_accum`` (float32 accumulation) or, with ``accumulate="float16"``,
        for float16 accumulation (ValueError where this device's rule is not known)."""
        if accumulate == "float32":
            return self.fast if use_fast_accum else self.split
        if accumulate != "float16":
            raise ValueError(f"accumulate must be 'float32' or 'float16'; got {accumulate!r}")
        if self.f16_accumulate is None:
            raise ValueError(
                f"profile {self.name!r} has no float16-accumulate model: its mma.sync .f16 rule is not known "
                "(reports/hardware_f16_accumulate.md); modelled on Ada (rtx4060_cublaslt_12_8, l40s: ada_fast_f16)"
            )
        return self.f16_accumulate

    def with_splits(self, splits: Mapping[tuple, Any]) -> DeviceProfile:
        """The same profile with observed splits: keys ``(M, N, K)`` or ``(M, N, K, out, use_fast_accum)``,
        values ``(S, scheme)`` (``(1, "none")`` for unsplit)."""
        merged = dict(self.splits)
        for key, value in splits.items():
            if not (isinstance(key, tuple) and len(key) in (3, 5)):
                raise ValueError(f"splits keys must be (M, N, K) or (M, N, K, out, use_fast_accum); got {key!r}")
            check_split_k(value)
            merged[tuple(key)] = (int(value[0]), str(value[1]))
        return replace(self, splits=MappingProxyType(merged))

    def split_for(self, m: int, n: int, k: int, out: str, fast: bool, fa: str = "e4m3", fb: str = "e4m3") -> tuple:
        """``(S, scheme)`` for this call, or :class:`SplitKUnknownError` naming the shape."""
        for key in ((m, n, k, out, bool(fast)), (m, n, k)):
            if key in self.splits:
                return self.splits[key]
        if m == 0 or n == 0 or k == 0:
            return (1, "none")
        shape = _shape_text(m, n, k, out, fast, fa, fb)
        if self.split_rule is None:
            raise SplitKUnknownError(
                f"profile {self.name!r} does not know cuBLAS's split-K for {shape}; pass split_k=(S, scheme) "
                f"or profile.with_splits({{({m}, {n}, {k}): (S, scheme)}}) with the split your GPU used"
            )
        got = self.split_rule(m, n, k, out, bool(fast), fa, fb)
        if got is None:
            raise SplitKUnknownError(
                f"profile {self.name!r} has no recorded split-K decision for {shape}; pass split_k=(S, scheme) "
                f"({' or '.join(self.schemes)}) or profile.with_splits(...) with the split your GPU used"
            )
        return got


_TORCH_OUT = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16", "e4m3": "float8_e4m3fn"}
_TORCH_OUT["e5m2"] = "float8_e5m2"
_TORCH_IN = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}


def _mmaemu_rule(mmaemu_profile: str) -> SplitRule:
    """Split decisions from mmaemu's recorded table (verified decisions only)."""

    def rule(m: int, n: int, k: int, out: str, fast: bool, fa: str, fb: str) -> tuple[int, str] | None:
        try:
            import torch
            from mmaemu.platform.splitk_table import resolve_splitk
        except ImportError as e:
            raise SplitKUnknownError(
                f"the recorded split-K table of {mmaemu_profile!r} ships with mmaemu: pip install mmaemu==0.1.0 "
                f"(needed for {_shape_text(m, n, k, out, fast, fa, fb)}), or pass split_k=(S, scheme)"
            ) from e
        if out not in _TORCH_OUT or fa not in _TORCH_IN or fb not in _TORCH_IN:
            return None
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                d = resolve_splitk(
                    m,
                    n,
                    k,
                    a_dtype=getattr(torch, _TORCH_IN[fa]),
                    b_dtype=getattr(torch, _TORCH_IN[fb]),
                    out_dtype=getattr(torch, _TORCH_OUT[out]),
                    use_fast_accum=fast,
                    profile=mmaemu_profile,
                    splitk="auto",
                    dry=True,
                )
            except LookupError:
                return None
        if not d.verified:
            return None
        return (int(d.S), "none" if d.S == 1 else str(d.scheme))

    return rule


PROFILES: dict[str, DeviceProfile] = {
    p.name: p
    for p in (
        DeviceProfile(
            "h100_pcie_cublaslt_12_8",
            "hopper_fast",
            "hopper_split",
            schemes=("contiguous",),
            split_rule=_mmaemu_rule("hopper"),
            description="H100 PCIe (114 SMs), cuBLASLt 12.8.3.14, torch 2.7.1 _scaled_mm (mmaemu 'hopper')",
        ),
        DeviceProfile(
            "rtx4060_cublaslt_12_8",
            "ada_fast",
            "ada_split",
            schemes=("serial", "pairwise"),
            split_rule=_mmaemu_rule("ada"),
            description="RTX 4060 (24 SMs), cuBLASLt 12.8.3.14, torch 2.7.1 _scaled_mm (mmaemu 'ada'); float16 "
            "accumulation: Ada mma.sync .f16 as measured on an RTX 1000 Ada",
            f16_accumulate="ada_fast_f16",
        ),
        DeviceProfile("h100_sxm", "hopper_fast", "hopper_split", description="H100 SXM: split-K rule not recorded"),
        DeviceProfile("h200", "hopper_fast", "hopper_split", description="H200: split-K rule not recorded"),
        DeviceProfile(
            "l40s",
            "ada_fast",
            "ada_split",
            description="L40S: split-K rule not recorded; float16 accumulation: Ada mma.sync .f16 as measured on an "
            "RTX 1000 Ada (the L40S float32 set agrees with the same ada_mma model)",
            f16_accumulate="ada_fast_f16",
        ),
        DeviceProfile("b200", "blackwell", "blackwell_split", description="B200 (tcgen05): split-K rule not recorded"),
    )
}


def get_profile(profile: str | DeviceProfile) -> DeviceProfile:
    if isinstance(profile, DeviceProfile):
        return profile
    if isinstance(profile, str) and profile in PROFILES:
        return PROFILES[profile]
    raise ValueError(f"unknown profile {profile!r}; known: {', '.join(PROFILES)}")
