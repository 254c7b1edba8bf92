"""Where ``scaled_mm``'s tensor-core chains run: the torch-ops chains (:mod:`fp8sim.gemm._torch_chain`)
on the operands' device, or the numpy path on the host."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._util.tensors import is_torch_tensor
from ..formats import FloatFormat
from . import _torch_chain
from .accumulators import Accumulator
from .instructions import INSTRUCTION_MODELS


def _keep_on_device(a: Any, b: Any, backend: str | None) -> bool:
    """Torch operands on a non-CPU device (MPS lacks float64) keep their codes there unless
    ``backend="numpy"``: the torch-ops chains may then run on them."""
    if backend == "numpy" or not (is_torch_tensor(a) and is_torch_tensor(b)):
        return False
    return a.device.type not in ("cpu", "mps")


_IN_INSTRUCTION = ("mx", "nvfp4")  # block scales that enter the instructions (Blackwell block-scale kinds)


def _torch_backend(backend: str | None, acc: Accumulator, layout: str, host: bool) -> bool:
    """Whether the torch-ops chains run this GEMM; ``backend="torch"`` where they cannot raises."""
    chains = acc.kind == "tensor_core" and _torch_chain.supports(INSTRUCTION_MODELS[acc.instruction])
    ok = (chains and (layout in ("tensorwise", "rowwise", *_IN_INSTRUCTION) or layout.startswith("block"))) or (
        acc.kind == "exact" and layout in ("tensorwise", "rowwise")
    )
    if ok and layout in _IN_INSTRUCTION:
        _block_instruction(acc, layout)  # a non-Blackwell accumulator: the numpy path's message
    if backend == "torch" and not ok:
        raise ValueError(
            "backend='torch' runs the tensor-core accumulators (hopper_*, ada_*, blackwell, blackwell_split, "
            "blackwell_mma) with tensorwise, rowwise, 1x128/128x128 block, MX or NVFP4 scales, and exact "
            "with tensorwise or rowwise scales; "
            f"got accumulator {acc.name!r}, {layout} scales"
        )
    return ok and (backend == "torch" or not host)


def _block_instruction(acc: Accumulator, layout: str) -> str:
    """The Blackwell block-scale kind that runs ``acc`` on MX / NVFP4 scales."""
    if INSTRUCTION_MODELS[acc.instruction].out_mbits != 23 or not acc.instruction.startswith("blackwell"):
        raise ValueError(f"{layout} block scales need a Blackwell accumulator (blackwell, blackwell_split)")
    return "blackwell_mxf4nvf4" if layout == "nvfp4" else "blackwell_mxf8f6f4"


def _torch_gemm(
    ac: Any,
    bc: Any,
    fa: FloatFormat,
    fb: FloatFormat,
    acc: Accumulator,
    split: Any,
    instruction: str | None = None,
    scales: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    import torch

    if not is_torch_tensor(ac):
        ac, bc = torch.from_numpy(np.ascontiguousarray(ac)), torch.from_numpy(np.ascontiguousarray(bc))
    if acc.kind == "exact":
        return _torch_chain.exact_gemm(ac, bc, fa, fb, split)
    im = INSTRUCTION_MODELS[instruction or acc.instruction]
    if scales is not None:
        scales = tuple(torch.from_numpy(np.ascontiguousarray(x).astype(np.int64)).to(ac.device) for x in scales)
    return _torch_chain.chain_gemm(
        ac, bc, fa, fb, im, acc.promote_every, split, scales=scales, accumulate=acc.accumulate
    )
