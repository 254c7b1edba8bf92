"""Accumulator presets for emulated GEMMs: how the products of a dot product are summed.

- ``exact``: the exact sum, rounded once to float32 (nearest even).
- ``dequantized_fp32``: dequantize each operand with its scales to float32, then one float32
  matmul (BLAS order): torchao ``emulate=True``, torch's CPU ``_scaled_mm`` fallback kernel
  (``cpu_reference``) and most fake-quant tools.
- ``fp32_matmul``: the unscaled products summed by one float32 matmul, the scales applied after
  (``fl32(fl32(sa * sb) * acc)``): torch's CPU ``_scaled_mm`` on oneDNN (``cpu_onednn``), whose own
  summation order fp8sim does not reproduce (:mod:`fp8sim.gemm.torch_cpu`).
- tensor-core chains (spec 9.2): instructions of the named model run along K, each feeding its
  result to the next as ``c``; ``promote_every`` K elements (split accumulation) the chain's result
  is added with float32 round-to-nearest into a register accumulator and the chain restarts from 0.
  ``promote_every=None`` chains over all of K (cuBLAS FAST_ACCUM=1).
- float16 accumulation (``accumulate="float16"``, ``mma.sync ... .f16``: c and d are float16, as a
  kernel with a ``half`` accumulator, e.g. Triton ``out_dtype=float16`` or CUTLASS ``half_t``): each
  instruction's result is rounded to float16 and fed to the next.  Modelled for Ada only
  (``ada_fast_f16``: ``ada_mma`` with float16 output reproduces real Ada ``mma.sync...f16.e4m3/e5m2``
  bit for bit, ``tests/test_gemm_f16_accumulate.py``); the Hopper and Blackwell ``mma.sync`` rule is
  not known (``reports/hardware_f16_accumulate.md``) and is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from .instructions import INSTRUCTION_MODELS

__all__ = ["Accumulator", "ACCUMULATORS", "F16_ACCUMULATE", "get_accumulator"]


_KINDS = ("exact", "dequantized_fp32", "fp32_matmul", "tensor_core")


@dataclass(frozen=True)
class Accumulator:
    """How a GEMM sums its products; ``instruction`` names an :data:`INSTRUCTION_MODELS` entry
    for ``kind="tensor_core"`` (block-scaled layouts switch to the Blackwell block-scale kinds)."""

    name: str
    kind: Literal["exact", "dequantized_fp32", "fp32_matmul", "tensor_core"]
    instruction: str | None = None
    promote_every: int | None = None
    description: str = ""
    accumulate: Literal["float32", "float16"] = "float32"

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"kind must be one of {', '.join(map(repr, _KINDS))}; got {self.kind!r}")
        if self.kind == "tensor_core":
            if self.instruction not in INSTRUCTION_MODELS:
                raise ValueError(
                    f"instruction must be one of {', '.join(INSTRUCTION_MODELS)}; got {self.instruction!r}"
                )
            k = INSTRUCTION_MODELS[self.instruction].k
            if self.promote_every is not None and (self.promote_every < k or self.promote_every % k):
                raise ValueError(f"promote_every must be a positive multiple of the instruction's K={k}")
        if self.accumulate not in ("float32", "float16"):
            raise ValueError(f"accumulate must be 'float32' or 'float16'; got {self.accumulate!r}")
        if self.accumulate == "float16" and self.instruction not in F16_ACCUMULATE:
            raise ValueError(
                f"accumulate='float16' is modelled for {', '.join(F16_ACCUMULATE)} (measured on Ada mma.sync .f16); "
                f"got {self.kind} {self.instruction or ''}: the float16-accumulate rule of Hopper and Blackwell "
                "mma.sync is not known (reports/hardware_f16_accumulate.md)"
            )

    def with_promotion(self, every: int | None) -> Accumulator:
        """The same chain with another promotion interval (None: never promote)."""
        return replace(self, name=f"{self.name}@{every}", promote_every=every)


# instruction models whose float16-accumulate variant matches real hardware (tests/test_gemm_f16_accumulate.py)
F16_ACCUMULATE = ("ada_mma",)

ACCUMULATORS: dict[str, Accumulator] = {
    a.name: a
    for a in (
        Accumulator("exact", "exact", description="exact sum, one float32 rounding"),
        Accumulator("dequantized_fp32", "dequantized_fp32", description="dequantize, then a float32 matmul"),
        Accumulator(
            "cpu_reference",
            "dequantized_fp32",
            description="torch's CPU _scaled_mm fallback kernel: dequantized_fp32, FP8 output * (1 / scale_result) "
            "then torch's .to()",
        ),
        Accumulator(
            "cpu_onednn",
            "fp32_matmul",
            description="torch's CPU _scaled_mm on oneDNN (AMX hosts): unscaled float32 sum in BLAS order "
            "(oneDNN's own order is not reproduced), * fl32(sa * sb), + bias, / scale_result, non-saturating FP8",
        ),
        Accumulator("hopper_fast", "tensor_core", "hopper_wgmma", None, "Hopper wgmma chained over all K"),
        Accumulator("hopper_split", "tensor_core", "hopper_wgmma", 128, "Hopper, promoted to fp32 every 128 K"),
        Accumulator("ada_fast", "tensor_core", "ada_mma", None, "Ada mma.sync chained over all K"),
        Accumulator("ada_split", "tensor_core", "ada_mma", 128, "Ada, promoted to fp32 every 128 K"),
        Accumulator("blackwell", "tensor_core", "blackwell_tcgen05", None, "Blackwell tcgen05 (25 bits), chained"),
        Accumulator("blackwell_split", "tensor_core", "blackwell_tcgen05", 128, "Blackwell, promoted every 128 K"),
        Accumulator("blackwell_mma", "tensor_core", "blackwell_mma", None, "Blackwell sm_100 mma.sync, RN each step"),
        Accumulator(
            "ada_fast_f16",
            "tensor_core",
            "ada_mma",
            None,
            "Ada mma.sync .f16 chained over all K in float16 (measured on an RTX 1000 Ada)",
            accumulate="float16",
        ),
    )
}
_ALIASES = {
    "exact_fp32": "exact",
    "torchao_emulate": "dequantized_fp32",
    "cpu_fallback": "cpu_reference",
    "hopper_split128": "hopper_split",
    "ada": "ada_fast",
    "ada_split128": "ada_split",
    "ada_f16": "ada_fast_f16",
    "blackwell_f8f6f4": "blackwell",
    "blackwell_mx": "blackwell",
    "blackwell_nvfp4": "blackwell",
}


def get_accumulator(acc: str | Accumulator) -> Accumulator:
    if isinstance(acc, Accumulator):
        return acc
    name = _ALIASES.get(acc, acc) if isinstance(acc, str) else None
    if name in ACCUMULATORS:
        return ACCUMULATORS[name]
    raise ValueError(f"unknown accumulator {acc!r}; known: {', '.join([*ACCUMULATORS, *_ALIASES])}")
