"""Tensor-core chains in torch ops (``scaled_mm(backend="torch")``; the default for torch operands on
a non-CPU device): the arithmetic of :func:`fp8sim.gemm.instructions.run_instruction` for every
instruction model: the truncating ones (``hopper_*``, ``ada_*``, ``blackwell``, ``blackwell_split``),
the round-to-nearest ``blackwell_mma`` / ``blackwell_mma_km`` (exact or aligned sum, one nearest-even
rounding: TwoSum distillation in float64, :mod:`fp8sim.gemm._torch_exact`) and the block-scaled
Blackwell kinds (MX: E8M0 exponents added to each product; NVFP4: exact 16-product group sums times
the UE4M3 scales); and the ``exact`` accumulator (:func:`exact_gemm`: band-pair float64 matmuls,
exact in any summation order).

Every step uses only ops whose results are exact and so identical on every device: float64
products of FP8 values (exact), integer exponents, powers of two built from their bits (no
``pow``/``ldexp``, whose device implementations may differ), ``trunc``, sums of integers below 2^53
(exact in any order), comparisons and ``where``.  Operands stay on their device; the float32
accumulator result is the only thing copied back.  Throughput on CUDA is not measured yet (no GPU
in this session): ``scripts/gpu_session.sh`` measures it on the next GPU run.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..formats import FloatFormat, get_format
from ._torch_exact import exact_matmul_f32, rn_sum_f32
from .instructions import InstructionModel, _decoded
from .splitk import split_indices

__all__ = ["supports", "chain_dots", "chain_gemm", "exact_gemm"]

_F32_NAN_BITS = 0x7FFFFFFF
_F16_NAN_AS_F32_BITS = 0x7FFFE000  # the models' float16 NaN 0x7FFF, widened to float32


def supports(m: InstructionModel) -> bool:
    """Models this backend runs: every model (truncating or nearest-even, with or without block scales)."""
    return m.rounding in ("truncate", "rn") and m.scale_format in (None, "e8m0", "ue4m3")


def _tables(f: FloatFormat, device: Any) -> tuple[Any, Any]:
    """Per code: value (float64, NaN/Inf included) and nominal exponent (int64), on ``device``."""
    import torch

    vals, _, e = _decoded(f)
    return torch.tensor(vals, device=device), torch.tensor(e, device=device)


def _pow2(x: Any) -> Any:
    """2.0**x in float64 for integer tensors with -1022 <= x <= 1023, from the exponent bits (exact)."""
    import torch

    return ((x.to(torch.int64) + 1023) << 52).view(torch.float64)


def _exponent(x: Any) -> Any:
    """floor(log2 x) of non-negative normal float64 values (-1023 for zero), from the bits."""
    import torch

    return ((x.view(torch.int64) >> 52) & 0x7FF) - 1023


def _rn16(value: Any) -> Any:
    """float16 nearest-even of exact float64 values (Inf past the float16 range), from exact ops only:
    torch's own float64 -> float16 conversion may round twice (through float32)."""
    import torch

    mag = value.abs()
    qe = torch.clamp(_exponent(mag) - 10, min=-24)  # the float16 quantum (subnormals: 2^-24)
    r = torch.round(mag * _pow2(-qe)) * _pow2(qe)  # torch.round: half to even
    return torch.copysign(torch.where(r > 65504.0, torch.inf, r), value)


def _step(p: Any, e: Any, c: Any, m: InstructionModel, f16: bool = False) -> Any:
    """One (sub-)instruction: terms ``p`` (float64 [..., s], NaN/Inf where inputs are special) with
    exponents ``e``, accumulator ``c`` (float64 holding a float32 value, or a float16 one with
    ``f16``: the float16-accumulate variant); float64 result."""
    import torch

    fin = torch.isfinite(p)
    pf = torch.where(fin, p, 0.0)
    c_ok = torch.isfinite(c)
    c0 = torch.where(c_ok, c, 0.0)
    n = m.frac_bits
    if n is not None:
        big = torch.maximum(e.amax(-1), torch.clamp(_exponent(c0.abs()), min=-14 if f16 else -126))
        unit = _pow2(n - big)
    if m.rounding == "rn":
        if f16:
            raise ValueError(f"{m.name}: float16 accumulation is not modelled")
        if n is not None:  # the terms on the alignment grid (exact: integers times a power of two)
            back = _pow2(big - n)
            pf, c0 = torch.trunc(pf * unit[..., None]) * back[..., None], torch.trunc(c0 * unit) * back
        out = rn_sum_f32(torch.cat([pf, c0[..., None]], -1)).double()
        special = p.sum(-1) + c
        out = torch.where(torch.isinf(special), special, out)
        return torch.where(torch.isnan(special), torch.nan, out)
    total = torch.trunc(pf * unit[..., None]).sum(-1) + torch.trunc(c0 * unit)
    value = total * _pow2(big - n)  # exact: an integer times a power of two
    if f16:
        out = _rn16(value)
    else:
        mag = value.abs()
        ex = _exponent(mag)
        qe = torch.clamp(ex - m.out_mbits, min=-126 - m.out_mbits)
        r = torch.trunc(mag * _pow2(-qe)) * _pow2(qe)
        r = torch.where(ex > 127, torch.inf, r)
        out = torch.copysign(r, value)
    special = p.sum(-1) + c  # NaN/Inf as IEEE says (finite parts cannot overflow float64)
    out = torch.where(torch.isinf(special), special, out)
    return torch.where(torch.isnan(special), torch.nan, out)


def _scaled_terms(exact: Any, e: Any, sa: Any, sb: Any, m: InstructionModel, scale_tables: Any) -> tuple:
    """Block scales of one instruction (``sa``, ``sb``: scale codes ``[..., k / scale_block]``): the
    terms, their nominal exponents and where a NaN scale makes the result NaN (as ``_fused``)."""
    import torch

    if m.scale_format == "e8m0":
        x = torch.repeat_interleave((sa - 127) + (sb - 127), m.scale_block, dim=-1)
        nan = (sa == 0xFF).any(-1) | (sb == 0xFF).any(-1)
        return exact * _pow2(x), e + x, nan
    sv, se = scale_tables
    gsum = exact.reshape(exact.shape[:-1] + (-1, m.scale_block)).sum(-1)  # exact: short sums of FP4 products
    ma, mb = sa & 0x7F, sb & 0x7F  # the sign bit of a UE4M3 scale is ignored
    nan = (ma == 0x7F).any(-1) | (mb == 0x7F).any(-1)
    return gsum * sv[ma] * sv[mb], se[ma] + se[mb], nan  # block terms are not normalised


def chain_dots(
    ac: Any,
    bc: Any,
    c: Any,
    fa: FloatFormat,
    fb: FloatFormat,
    m: InstructionModel,
    every: int | None = None,
    scale_a: Any = None,
    scale_b: Any = None,
    accumulate: str = "float32",
) -> Any:
    """float32 results of instruction chains along the last axis: ``ac``, ``bc`` integer code tensors
    broadcasting to ``[..., K]`` (K a multiple of ``m.k``), ``c`` the float32 start value ``[...]``
    (None: 0); ``every``: promotion interval (None: one chain over all K); ``scale_a``/``scale_b``:
    block-scale codes broadcasting to ``[..., K / scale_block]`` for block-scaled models;
    ``accumulate="float16"``: c and every instruction's result are float16 (``c`` rounded to it).
    NaN is 0x7FFFFFFF (0x7FFFE000, float16's 0x7FFF widened, for float16 chains)."""
    import torch

    dev = ac.device
    (va_t, ea_t), (vb_t, eb_t) = _tables(fa, dev), _tables(fb, dev)
    scale_tables = _tables(get_format("e4m3"), dev) if m.scale_format == "ue4m3" else None
    ai, bi = ac.long(), bc.long()
    if m.scale_format is not None:
        sai, sbi = scale_a.long(), scale_b.long()
    k = torch.broadcast_shapes(ai.shape, bi.shape)[-1]
    lead = torch.broadcast_shapes(ai.shape[:-1], bi.shape[:-1])
    f16 = accumulate == "float16"
    chain = torch.zeros(lead, dtype=torch.float64, device=dev) if c is None else c.to(dev, torch.float64)
    chain = chain.expand(lead).clone()
    if f16:
        chain = _rn16(chain)
    reg = torch.zeros(lead, dtype=torch.float32, device=dev)
    step = m.k // m.halves
    every = every or k
    for g0 in range(0, k, every):
        if g0:
            chain = torch.zeros_like(chain)
        for j in range(g0, min(g0 + every, k), step):
            sa, sb = ai[..., j : j + step], bi[..., j : j + step]
            p = va_t[sa] * vb_t[sb]
            e = ea_t[sa] + eb_t[sb]
            if m.scale_format is None:
                chain = _step(p, e, chain, m, f16)
                continue
            blocks = slice(j // m.scale_block, (j + step) // m.scale_block)
            p, e, nan = _scaled_terms(p, e, sai[..., blocks], sbi[..., blocks], m, scale_tables)
            chain = torch.where(nan, torch.nan, _step(p, e, chain, m))
        reg = (reg + chain.to(torch.float32)) if every != k else chain.to(torch.float32)
    bits = reg.view(torch.int32)
    nan_bits = _F16_NAN_AS_F32_BITS if f16 else _F32_NAN_BITS
    return torch.where(torch.isnan(reg), torch.full_like(bits, nan_bits), bits).view(torch.float32)


def chain_gemm(
    ac: Any,
    bc: Any,
    fa: FloatFormat,
    fb: FloatFormat,
    m: InstructionModel,
    every: int | None,
    split: tuple[int, str] | None = None,
    tile_elements: int | None = None,
    scales: tuple[Any, Any] | None = None,
    accumulate: str = "float32",
) -> np.ndarray:
    """float32 (M, N) numpy: ``a @ b`` as the chains compute it, on ``ac``'s device.  ``ac``: (M, K)
    and ``bc``: (K, N) integer code tensors; ``split``: cuBLAS split-K (:mod:`fp8sim.gemm.splitk`),
    partials combined on the device in the scheme's float32 order; ``scales``: block-scale codes
    ``(M, K / scale_block)`` and ``(K / scale_block, N)`` for the block-scaled models (unsplit)."""
    import torch

    mm, k = ac.shape
    n = bc.shape[1]
    dev = ac.device
    if tile_elements is None:
        tile_elements = 1 << (22 if dev.type != "cpu" else 16)
    bt = bc.t().contiguous()

    sa = sbt = None
    if scales is not None:  # scales for the K padding: 1.0 (E8M0 127, UE4M3 0x38), as the numpy path
        kk = -(-k // m.k) * m.k
        one = 127 if m.scale_format == "e8m0" else 0x38
        sa, sbt = scales[0].long(), scales[1].long().t()
        extra = kk // m.scale_block - sa.shape[1]
        if extra > 0:
            sa = torch.nn.functional.pad(sa, (0, extra), value=one)
            sbt = torch.nn.functional.pad(sbt, (0, extra), value=one)

    def unsplit(a2: Any, b2t: Any) -> Any:  # (M, k2) and (N, k2) codes, k2 a multiple of the model's k
        out = torch.empty((mm, n), dtype=torch.float32, device=dev)
        rows = max(1, tile_elements // max(n * m.k, 1))
        for r0 in range(0, mm, rows):
            sc = {} if sa is None else {"scale_a": sa[r0 : r0 + rows, None, :], "scale_b": sbt[None, :, :]}
            out[r0 : r0 + rows] = chain_dots(
                a2[r0 : r0 + rows, None, :], b2t[None, :, :], None, fa, fb, m, every, **sc, accumulate=accumulate
            )
        return out

    def padded(idx: Any) -> tuple[Any, Any]:  # gather K (-1: code 0, +0) and pad to whole instructions
        kk = -(-idx.numel() // m.k) * m.k
        full = torch.full((kk,), -1, dtype=torch.int64, device=dev)
        full[: idx.numel()] = idx
        keep = (full >= 0)[None, :]
        g = full.clamp(min=0)
        zero = torch.zeros((), dtype=ac.dtype, device=dev)
        return torch.where(keep, ac[:, g], zero), torch.where(keep, bt[:, g], zero)

    if split is None:
        res = unsplit(*padded(torch.arange(k, device=dev)))
    else:
        s, scheme = split
        parts = []
        for idx in split_indices(k, s, scheme):
            if idx.size == 0:
                parts.append(torch.zeros((mm, n), dtype=torch.float32, device=dev))
            else:
                parts.append(unsplit(*padded(torch.from_numpy(idx).to(dev))))
        res = _combine(parts, scheme)
    return res.cpu().numpy()


def _combine(parts: list, scheme: str) -> Any:
    """:func:`fp8sim.gemm.splitk.combine_partials` on device tensors (float32 adds, same order)."""
    s = len(parts)
    if scheme in ("serial", "contiguous") or s == 1:
        acc = parts[0]
        for p in parts[1:]:
            acc = acc + p
        return acc
    h = -(-s // 2)
    acc = parts[s - 1]
    for i in range(h):
        acc = acc + ((parts[i] + parts[i + h]) if i + h < s - 1 else parts[i])
    return acc


def exact_gemm(ac: Any, bc: Any, fa: FloatFormat, fb: FloatFormat, split: tuple[int, str] | None = None) -> np.ndarray:
    """float32 (M, N) numpy: the ``exact`` accumulator on ``ac``'s device (each split's exact sum
    rounded once, the partials combined in the scheme's float32 order)."""
    import torch

    dev = ac.device
    (va_t, _), (vb_t, _) = _tables(fa, dev), _tables(fb, dev)
    va, vb = va_t[ac.long()], vb_t[bc.long()]
    if split is None:
        return exact_matmul_f32(va, vb, fa.mbits, fb.mbits).cpu().numpy()
    parts = []
    for idx in split_indices(ac.shape[1], *split):
        idx = torch.from_numpy(idx[idx >= 0]).to(dev)
        parts.append(exact_matmul_f32(va[:, idx], vb[idx], fa.mbits, fb.mbits))
    return _combine(parts, split[1]).cpu().numpy()
