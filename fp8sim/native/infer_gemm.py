"""Which accumulator made this GEMM output?  Try every accumulator preset and every device profile of
:mod:`fp8sim.gemm` on a captured ``_scaled_mm`` and count the outputs each reproduces bit for bit.

A preset (``hopper_fast``, ``ada_split``, ``dequantized_fp32``, ...) is one tensor-core accumulation rule,
unsplit, with the ``alpha`` epilogue; a profile (``h100_pcie_cublaslt_12_8``, ...) adds its epilogue and
the split-K cuBLAS picks for the shape, and is tried where it knows that split (the others are named in
the notes).  NaN outputs match NaN.  The split search of :mod:`fp8sim.native.infer_split` is the next
step when no candidate explains the capture.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._util.tensors import is_torch_tensor
from ..gemm import ACCUMULATORS, PROFILES, SplitKUnknownError, scaled_mm
from ._inference import Candidate, Inference

__all__ = ["infer_accumulator"]

_OUT_BITS = {"float32": np.int32, "bfloat16": np.int16, "float16": np.int16}


def _out_bits(out: Any, out_dtype: str | None) -> tuple[np.ndarray, str]:
    """(bit patterns, output dtype name) of a captured output."""
    if is_torch_tensor(out):
        import torch

        names = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
        if out.dtype not in names:
            raise TypeError(f"out must be float32, bfloat16 or float16; got {out.dtype}")
        name = names[out.dtype]
        return out.detach().cpu().view(torch.int32 if name == "float32" else torch.int16).numpy(), name
    arr = np.asarray(out)
    if arr.dtype.kind in "iu":
        if out_dtype not in _OUT_BITS:
            raise ValueError(
                f"out holds integer bit patterns: out_dtype must be one of {', '.join(_OUT_BITS)}; got {out_dtype!r}"
            )
        if arr.dtype.itemsize != np.dtype(_OUT_BITS[out_dtype]).itemsize:
            raise ValueError(f"out holds {arr.dtype} bit patterns, which are not {out_dtype}")
        return arr.view(_OUT_BITS[out_dtype]), out_dtype
    name = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}.get(arr.dtype.name)
    if name is None:
        raise TypeError(f"out must be float32, bfloat16 or float16 (or their bit patterns); got {arr.dtype}")
    return arr.view(_OUT_BITS[name]), name


def _is_nan(bits: np.ndarray, out: str) -> np.ndarray:
    if out == "float32":
        return np.isnan(bits.view(np.float32))
    b = bits.view(np.uint16).astype(np.uint32)
    exp_mask, man_mask = (0x7F80, 0x007F) if out == "bfloat16" else (0x7C00, 0x03FF)
    return ((b & exp_mask) == exp_mask) & ((b & man_mask) != 0)


def infer_accumulator(
    a: Any,
    b: Any,
    scale_a: Any,
    scale_b: Any,
    out: Any,
    *,
    a_format: str | None = None,
    b_format: str | None = None,
    out_dtype: str | None = None,
    use_fast_accum: bool | None = None,
    accumulators: Sequence[str] | None = None,
    profiles: Sequence[str] | None = None,
) -> Inference:
    """Which accumulator preset or device profile reproduces ``out`` = ``_scaled_mm(a, b, scale_a, scale_b)``.

    ``a`` (M, K) and ``b`` (K, N): FP8 torch tensors or uint8 codes with ``a_format``/``b_format``;
    ``scale_a``/``scale_b``: dequantization scales as :func:`fp8sim.gemm.scaled_mm` takes them; ``out``:
    the captured output (float32, bfloat16 or float16, torch or numpy; or its bit patterns with
    ``out_dtype``).  ``use_fast_accum``: what the kernel was asked for (profiles are tried with it; None:
    both).  ``accumulators``/``profiles``: the candidates (default: every preset and every profile)."""
    bits, out_name = _out_bits(out, out_dtype)
    accs = list(ACCUMULATORS) if accumulators is None else list(accumulators)
    profs = list(PROFILES) if profiles is None else list(profiles)
    for name, known, what in ((accs, ACCUMULATORS, "accumulators"), (profs, PROFILES, "profiles")):
        bad = [n for n in name if n not in known]
        if bad:
            raise ValueError(f"unknown {what} {bad}; known: {', '.join(known)}")
    if use_fast_accum not in (None, True, False):
        raise TypeError(f"use_fast_accum must be True, False or None; got {use_fast_accum!r}")
    want = bits.reshape(-1)
    want_nan = _is_nan(want, out_name)
    kw = {"a_format": a_format, "b_format": b_format, "out_dtype": out_name, "strict": False}

    def fraction(got: Any) -> float:
        g = np.ascontiguousarray(np.asarray(got)).view(want.dtype).reshape(-1)
        if g.shape != want.shape:
            raise ValueError(f"out has {want.size} elements; the GEMM gives {g.size}")
        return float(((g == want) | (_is_nan(g, out_name) & want_nan)).mean()) if want.size else 1.0

    cands: list[Candidate] = []
    refused: list[tuple[str, ValueError]] = []
    for acc in accs:
        try:
            got = scaled_mm(a, b, scale_a, scale_b, accumulator=acc, **kw)
        except ValueError as exc:  # a kernel that cannot take these operands (cpu_onednn: rowwise scales)
            refused.append((f"accumulator {acc}", exc))
            continue
        cands.append(Candidate(f"accumulator {acc}", fraction(got), True, {"accumulator": acc}))
    if refused and len(refused) == len(accs):
        raise refused[0][1]  # the operands themselves are wrong, not one kernel's limits
    notes: list[str] = []
    if refused:
        notes.append(f"not tried, they refuse these operands: {', '.join(n for n, _ in refused)}")
    unknown: list[str] = []
    for prof in profs:
        for fast in (True, False) if use_fast_accum is None else (use_fast_accum,):
            label = f"profile {prof}" + (f" (use_fast_accum={fast})" if use_fast_accum is None else "")
            try:
                got = scaled_mm(a, b, scale_a, scale_b, profile=prof, use_fast_accum=fast, **kw)
            except SplitKUnknownError:
                unknown.append(label)
                continue
            cands.append(Candidate(label, fraction(got), True, {"profile": prof, "use_fast_accum": fast}))
    if unknown:
        notes.append(f"not tried, split-K unknown for this shape: {', '.join(unknown)}")
    cands.sort(key=lambda c: (-c.fraction, "profile" in c.params))
    return Inference("accumulator", int(want.size), tuple(cands), tuple(notes))
