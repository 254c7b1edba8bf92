"""How one module GEMM runs: its accumulator, split-K and epilogue for the region's ``accumulator``, and its
plan for ``fp8sim explain`` (:mod:`fp8sim.gemm.plans`).

``accumulator`` is None (fp8sim's default path: exact FP8 products summed by ``torch.matmul`` in float32), a
device name (``"hopper"``, ``"ada"``, ``"blackwell"``: fast or split as the recipe says for the GEMM), an
accumulator preset, or a device profile: then the split-K is the profile's decision for this GEMM's own
``(M, N, K)``, output dtype, fast/split accumulation and operand formats (TE's ``use_split_accumulator``:
fprop fast, dgrad/wgrad split unless the recipe's ``fp8_gemm_*`` say otherwise; Float8BlockScaling always
split).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from ...gemm.plans import GemmPlan, current_recorder
from ...gemm.profiles import SplitChoice, SplitKUnknownError, get_profile, is_profile
from ...recipe import Float8BlockScaling, Recipe
from ._operands import Operand

__all__ = ["GemmSite", "Arithmetic", "resolve", "out_name", "record_plan"]

# TE module constants for recipes without fp8_gemm_* fields (spec 4.7): fprop fast, dgrad/wgrad split
_SPLIT = {"fprop": False, "dgrad": True, "wgrad": True}
_OUT_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
DEFAULT = "torch.matmul fp32"  # the default path's name in a plan


@dataclass(frozen=True)
class GemmSite:
    """Which GEMM of which module this is (``gemm``: the module's GEMM name, e.g. "fc1", "gemm0")."""

    module: Any
    gemm: str = "gemm"

    def module_label(self) -> str:
        """TE's ``name=`` of the module where it has one, else its class."""
        return getattr(self.module, "name", None) or type(self.module).__name__

    def label(self) -> str:
        return self.module_label() if self.gemm == "gemm" else f"{self.module_label()}.{self.gemm}"


class Arithmetic(NamedTuple):
    """How the GEMM runs: ``preset`` (None: the default path), ``split_k`` (None: unsplit), ``epilogue``."""

    preset: str | None
    split_k: tuple[int, str] | None
    epilogue: str


def out_name(dtype: Any) -> str:
    """The output dtype name a profile's split decision is keyed by (a format name for FP8 outputs)."""
    if isinstance(dtype, str):
        return dtype
    if dtype is None:
        return "float32"
    if dtype not in _OUT_NAMES:
        raise ValueError(f"GEMM output dtype must be float32, bfloat16, float16 or an FP8 format; got {dtype}")
    return _OUT_NAMES[dtype]


def split_accumulator(recipe: Recipe, which: str) -> bool:
    """TE's ``use_split_accumulator`` for GEMM ``which`` under ``recipe``."""
    params = getattr(recipe, f"fp8_gemm_{which}", None)
    if params is not None:
        return bool(params.use_split_accumulator)
    if isinstance(recipe, Float8BlockScaling):
        return True
    return _SPLIT[which]


def _preset(accumulator: Any, recipe: Recipe, which: str) -> Any:
    if accumulator in ("hopper", "ada", "blackwell"):
        split = split_accumulator(recipe, which)
        if accumulator == "blackwell":
            return "blackwell_split" if split else "blackwell"
        return f"{accumulator}_{'split' if split else 'fast'}"
    return accumulator


def _what(site: GemmSite | None, which: str) -> str:
    return f"the {which} GEMM" + ("" if site is None else f" of {site.label()!r}")


def _blocks(op: Operand) -> str:
    if op.vals is not None:
        return "tensorwise"
    block = getattr(op.qt, "block", None)
    return f"{'x'.join(str(b) for b in block)} blocks" if block is not None else "block-scaled"


def scaling(a: Operand, b: Operand) -> str:
    sa, sb = _blocks(a), _blocks(b)
    return sa if sa == sb else f"{sa} x {sb}"


def dims(a: Operand, b: Operand) -> tuple[int, int, int]:
    per_tensor = a.vals is not None and b.vals is not None
    m, k = (a.codes if per_tensor else a.dq).shape[-2:]
    return int(m), int((b.codes if per_tensor else b.dq).shape[-1]), int(k)


def _profile_choice(prof: Any, a: Operand, b: Operand, m: int, n: int, k: int, out: str, fast: bool, what: str) -> Any:
    """The profile's split decision for this GEMM: a split given with ``with_splits``, else its table for
    per-tensor scales (block-scaled GEMMs need a given split: no block-scaled cuBLASLt call was recorded)."""
    for key in ((m, n, k, out, fast), (m, n, k)):
        if key in prof.splits:
            s, scheme = prof.splits[key]
            return SplitChoice(s, scheme, "override", "given with DeviceProfile.with_splits")
    if os.environ.get("NVTE_EXT_MARGIN_SM") is not None:
        # TE csrc/extensions/gemm.cpp: math SMs = sm_count - NVTE_EXT_MARGIN_SM (default sm_count: 0, no target)
        # becomes CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, which changes cuBLASLt's choice; none was recorded with one
        raise SplitKUnknownError(
            f"NVTE_EXT_MARGIN_SM is set: TE then asks cuBLASLt for an SM-count target, and profile {prof.name!r} "
            f"recorded no decision with one ({what}: M={m} N={n} K={k}); unset NVTE_EXT_MARGIN_SM or give the "
            "split with with_splits"
        )
    if a.vals is not None and b.vals is not None:
        return prof.decide(m, n, k, out, fast, a.fmt.name, b.fmt.name, what=what)
    raise SplitKUnknownError(
        f"profile {prof.name!r} records cuBLASLt's split-K for per-tensor scaled FP8 GEMMs only; {what} has "
        f"{scaling(a, b)} scales (M={m} N={n} K={k}, -> {out}, use_fast_accum={fast}). Ways out: "
        f"accumulator=get_profile({prof.name!r}).with_splits({{({m}, {n}, {k}): (1, 'none')}}) if your GPU does "
        "not split it, or an instruction preset"
    )


def record_plan(site_module: Any, gemm: str, role: str, **fields: Any) -> None:
    """Add a plan to the active recorder (no-op without one); ``site_module`` is named by the recorder."""
    rec = current_recorder()
    if rec is None:
        return
    if isinstance(site_module, str):
        name = site_module
    else:
        name = rec.name(site_module) or getattr(site_module, "name", None) or type(site_module).__name__
    rec.add(GemmPlan(module=name, gemm=gemm, role=role, **fields))


def resolve(
    a: Operand, b: Operand, recipe: Recipe, which: str, accumulator: Any, out_dtype: Any, site: GemmSite | None
) -> Arithmetic:
    """How the GEMM runs, its plan recorded in the active recorder; a dry recorder gets the default path
    (and an unknown split as a plan, where it would raise :class:`~fp8sim.gemm.SplitKUnknownError`)."""
    rec = current_recorder()
    m, n, k = dims(a, b)
    fast = not split_accumulator(recipe, which)
    out = out_name(out_dtype)
    profile, choice = None, None
    try:
        if accumulator is None:
            arith = Arithmetic(None, None, "alpha")
        elif is_profile(accumulator):
            prof = get_profile(accumulator)
            profile = prof.name
            choice = _profile_choice(prof, a, b, m, n, k, out, fast, _what(site, which))
            arith = Arithmetic(prof.accumulator_for(fast), choice.split_k, prof.epilogue)
        else:
            arith = Arithmetic(_preset(accumulator, recipe, which), None, "alpha")
    except SplitKUnknownError as e:
        if rec is None or not rec.dry:
            raise
        prof = get_profile(accumulator)
        arith = Arithmetic(prof.accumulator_for(fast), None, prof.epilogue)
        choice = SplitChoice(0, "?", "unknown", str(e))
    if rec is not None:
        preset = arith.preset if arith.preset is not None else DEFAULT
        acc_name = getattr(preset, "name", preset)
        if choice is None:
            choice = SplitChoice(1, "none", "default" if arith.preset is None else "preset", "")
        module = site.module if site is not None else None
        record_plan(
            module,
            "" if site is None or site.gemm == "gemm" else site.gemm,
            which,
            m=m,
            n=n,
            k=k,
            a_format=a.fmt.name,
            b_format=b.fmt.name,
            scaling=scaling(a, b),
            out_dtype=out,
            use_fast_accum=fast,
            accumulator=str(acc_name),
            profile=profile,
            split=choice.S or None,
            scheme=choice.scheme,
            source=choice.source,
            note=choice.note,
        )
        if rec.dry:
            return Arithmetic(None, None, "alpha")
    return arith
