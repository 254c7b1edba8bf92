"""Device profiles: how one GPU + cuBLASLt version computes the FP8 GEMMs of one caller.

A profile bundles the accumulator preset for fast and split accumulation, the epilogue order and a
split-K decision per shape.  Where the split for a shape is not known the profile raises
:class:`SplitKUnknownError` naming the shape instead of guessing; a user who has observed the split
on their own GPU supplies it with :meth:`DeviceProfile.with_splits` (or passes ``split_k=``).

cuBLASLt's split decision depends on the caller's descriptor and workspace, so each recorded GPU has
two profiles: ``*_cublaslt_12_8`` for ``torch._scaled_mm`` (torch 2.7.1: 1 MiB workspace) and
``*_cublaslt_12_8_te`` for TransformerEngine's ``general_gemm`` (TE 2.3: 32 MiB on the H100, 4 MiB on the
RTX 4060, 256-byte alignment), which the TE modules use under ``autocast(accumulator=PROFILE)``.  Their
decisions come from the split-K tables mmaemu 0.1.0 recorded with cuBLASLt 12.8.3.14
(``mmaemu/platform/data/heur_*.npz``, read through ``mmaemu.platform.splitk_table.resolve_splitk`` under
mmaemu's profiles ``hopper``, ``hopper-te``, ``ada``, ``ada-te``); they need ``pip install mmaemu==0.1.0``.
Only decisions mmaemu marks as verified are used.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from .accumulators import get_accumulator
from .splitk import check_split_k

__all__ = ["DeviceProfile", "PROFILES", "SplitChoice", "SplitKUnknownError", "get_profile", "is_profile"]

SplitRule = Callable[[int, int, int, str, bool, str, str], "SplitChoice | tuple[int, str] | None"]


class SplitKUnknownError(LookupError):
    """The profile does not know which split-K cuBLAS uses for this shape."""


@dataclass(frozen=True)
class SplitChoice:
    """One split-K decision: ``S`` splits combined as ``scheme`` (``"none"`` for S = 1), where it came
    from (``source``: ``"table"``, ``"envelope"``, ``"live-query"``: mmaemu's; ``"override"``: the
    profile's :meth:`~DeviceProfile.with_splits`; ``"rule"``: a user's ``split_rule``; ``"zero-size"``)
    and a ``note`` saying why."""

    S: int
    scheme: str
    source: str
    note: str = ""

    @property
    def split_k(self) -> tuple[int, str]:
        return (self.S, self.scheme)


def _shape_text(m: int, n: int, k: int, out: str, fast: bool, fa: str, fb: str) -> str:
    return f"M={m} N={n} K={k} ({fa} x {fb} -> {out}, use_fast_accum={fast})"


@dataclass(frozen=True)
class DeviceProfile:
    """One device's FP8 GEMMs as ``caller`` (``"torch._scaled_mm"`` or ``"transformer_engine"``) runs
    them: ``fast`` / ``split`` accumulator presets (for ``use_fast_accum`` True / False), ``epilogue``
    (see :func:`fp8sim.gemm.scaled_mm`), the split-K ``schemes`` its kernels use and a ``split_rule``
    (None: unknown for every shape).
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
    caller: str = "torch._scaled_mm"

    def __post_init__(self) -> None:
        get_accumulator(self.fast)
        get_accumulator(self.split)
        if self.f16_accumulate is not None and get_accumulator(self.f16_accumulate).accumulate != "float16":
            raise ValueError(f"f16_accumulate must name a float16-accumulate preset; got {self.f16_accumulate!r}")
        if self.epilogue not in ("alpha", "sequential"):
            raise ValueError(f"epilogue must be 'alpha' or 'sequential', got {self.epilogue!r}")
        if self.caller not in _CALLERS:
            raise ValueError(f"caller must be one of {', '.join(_CALLERS)}; got {self.caller!r}")

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
        return self.decide(m, n, k, out, fast, fa, fb).split_k

    def decide(
        self, m: int, n: int, k: int, out: str, fast: bool, fa: str = "e4m3", fb: str = "e4m3", what: str | None = None
    ) -> SplitChoice:
        """The :class:`SplitChoice` for ``a (M x K) @ b (K x N)`` (``fa``, ``fb``: the operands' formats,
        ``out``: the output dtype name, ``fast``: ``use_fast_accum``), or :class:`SplitKUnknownError`
        naming the shape (``what``: the GEMM it is, e.g. "the dgrad GEMM of 'fc1'", and the ways out of
        a program, where the default names ``scaled_mm``'s ``split_k=``)."""
        for key in ((m, n, k, out, bool(fast)), (m, n, k)):
            if key in self.splits:
                s, scheme = self.splits[key]
                return SplitChoice(s, scheme, "override", "given with DeviceProfile.with_splits")
        if m == 0 or n == 0 or k == 0:
            return SplitChoice(1, "none", "zero-size", "nothing is accumulated")
        shape = _shape_text(m, n, k, out, fast, fa, fb)
        got = None if self.split_rule is None else self.split_rule(m, n, k, out, bool(fast), fa, fb)
        if isinstance(got, SplitChoice):
            return got
        if got is not None:
            return SplitChoice(int(got[0]), str(got[1]), "rule", "the profile's split_rule")
        why = "does not know cuBLAS's split-K" if self.split_rule is None else "has no recorded split-K decision"
        schemes = " or ".join(self.schemes) or "contiguous, serial or pairwise"
        if what is None:
            raise SplitKUnknownError(
                f"profile {self.name!r} {why} for {shape}; pass split_k=(S, scheme) ({schemes}) "
                f"or profile.with_splits({{({m}, {n}, {k}): (S, scheme)}}) with the split your GPU used"
            )
        raise SplitKUnknownError(
            f"profile {self.name!r} {why} for {what}: {shape}. Ways out: run with "
            f"accumulator=get_profile({self.name!r}).with_splits({{({m}, {n}, {k}): (S, scheme)}}) giving the split "
            f"your GPU used (scheme {schemes}; (1, 'none') if it does not split), or with an instruction preset "
            "(unsplit GEMMs); `fp8sim explain` lists every GEMM's decision at once"
        )


_CALLERS = ("torch._scaled_mm", "transformer_engine")
_TORCH_OUT = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16", "e4m3": "float8_e4m3fn"}
_TORCH_OUT["e5m2"] = "float8_e5m2"
_TORCH_IN = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}


def _mmaemu_rule(mmaemu_profile: str) -> SplitRule:
    """Split decisions from mmaemu's recorded table (verified decisions only), with mmaemu's source
    and note."""

    def rule(m: int, n: int, k: int, out: str, fast: bool, fa: str, fb: str) -> SplitChoice | None:
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
        return SplitChoice(int(d.S), "none" if d.S == 1 else str(d.scheme), str(d.source), f"mmaemu {d.note}")

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
            "h100_pcie_cublaslt_12_8_te",
            "hopper_fast",
            "hopper_split",
            schemes=("contiguous",),
            split_rule=_mmaemu_rule("hopper-te"),
            caller="transformer_engine",
            description="H100 PCIe (114 SMs), cuBLASLt 12.8.3.14, TransformerEngine 2.3 general_gemm: 32 MiB "
            "workspace, 256 B alignment (mmaemu 'hopper-te': its H100 table at 32 MiB, recorded with torch's "
            "descriptor, equal to TE's logged decisions on the 168 recorded Evo 2 calls, all S = 1; no split call "
            "ran through TE's own GEMM, and mmaemu's 32 MiB envelope is unvalidated, so only table rows decide)",
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
        DeviceProfile(
            "rtx4060_cublaslt_12_8_te",
            "ada_fast",
            "ada_split",
            schemes=("serial", "pairwise"),
            split_rule=_mmaemu_rule("ada-te"),
            caller="transformer_engine",
            description="RTX 4060 (24 SMs), cuBLASLt 12.8.3.14, TransformerEngine 2.3 general_gemm: 4 MiB workspace, "
            "256 B alignment (mmaemu 'ada-te': its RTX 4060 table at 4 MiB; TE's decisions equal torch's descriptor "
            "plus alignment on the 61 measured shapes; the reduction scheme of 46 TE split outputs was filled from "
            "the table itself, so mmaemu calls S > 1 experimental); float16 accumulation as the rtx4060 profile",
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


# mmaemu's profile names and the fp8sim profile of the same recordings (named in the unknown-profile error)
_MMAEMU_NAMES = {
    "hopper": "h100_pcie_cublaslt_12_8",
    "hopper-te": "h100_pcie_cublaslt_12_8_te",
    "ada": "rtx4060_cublaslt_12_8",
    "ada-te": "rtx4060_cublaslt_12_8_te",
}


def is_profile(x: object) -> bool:
    """Whether ``x`` names a device profile (a :class:`DeviceProfile` or a key of :data:`PROFILES`)."""
    return isinstance(x, DeviceProfile) or (isinstance(x, str) and x in PROFILES)


def get_profile(profile: str | DeviceProfile) -> DeviceProfile:
    """The profile ``profile`` names (a :class:`DeviceProfile` is returned as it is)."""
    if isinstance(profile, DeviceProfile):
        return profile
    if isinstance(profile, str) and profile in PROFILES:
        return PROFILES[profile]
    raise ValueError(f"unknown profile {profile!r}{mmaemu_hint(profile)}; known: {', '.join(PROFILES)}")


def mmaemu_hint(name: object) -> str:
    """For an mmaemu profile name, the text naming fp8sim's profile of the same recordings; else ""."""
    if not isinstance(name, str) or name not in _MMAEMU_NAMES:  # a dict or list is no profile name either
        return ""
    return f" (mmaemu's {name!r} is fp8sim's {_MMAEMU_NAMES[name]!r})"
