"""The attention core, high precision and FP8, on the internal layout ``[b, h, s, d]`` in float32.

One autograd function computes ``O = dropout(softmax(scale * Q K^T + bias, masked)) V`` and its
gradients with the quantization points of TE's FP8 fused attention (``FusedAttnFunc`` in TE's
``attention/dot_product_attention/backends.py``; quantizer roles from ``get_attention_quantizers`` in
``utils.py``).  With no quantizers it is the high-precision path.

Quantization points (forward ``Q, K, V -> S -> P -> O``, backward ``dO -> dP -> dS -> dQ, dK, dV``;
TE's slot names in brackets, HYBRID: forward E4M3, backward E5M2):

- Q, K, V [QKV]: one per-tensor scale over the three (``combine_and_quantize``); MXFP8: each tensor
  separately, 1x32 blocks along the GEMM's reduction axis (Q, K along d for ``QK^T``; V along the
  sequence for ``PV``; Q, K along the sequence again for ``dK``, ``dQ``).
- P [S]: the softmax output after dropout, before ``PV`` and ``P^T dO``.  Delayed scaling uses the
  S slot; current scaling uses a delayed-scaling S slot as TE does (history 1, ``most_recent``,
  ``NVTE_DPA_FP8DS_*``); MXFP8: TE hands P to cuDNN unquantized and cuDNN's choice is not in TE's
  code (``mxfp8_softmax="none"`` keeps P as TE's own emulation does, ``"mxfp8"`` blocks it by 32).
- O [O]: delayed scaling only (cuDNN writes O in FP8; TE dequantizes it for the caller unless
  ``fp8_output``); current scaling and MXFP8 return O in high precision (``NVTE_DPA_FP8CS_O_in_F16=1``,
  TE's default).  FP8 inputs, an FP8 dO and FP8 dQKV outputs: ``qkv_in``, ``do_in``, ``dqkv_out``.
- dO [dO]: every recipe; MXFP8 rowwise (for ``dO V^T``) and columnwise (for ``P^T dO``).
- dS [dP]: the gradient of the scaled scores, before ``dQ = scale dS K`` and ``dK = scale dS^T Q``;
  slots as for P.
- dQ, dK, dV [dQKV]: delayed scaling only, one scale over the three; the others return them in high
  precision.

fp8sim extensions for MXFP8, after cuDNN-frontend (causal safety: no scale shared across sequence
positions): ``pv_bf16`` (PR#983) keeps Q, K in MXFP8 for ``QK^T`` but runs ``PV`` on BF16 operands, P
rounded to BF16 (RN-even) instead of quantized and V the caller's tensor in BF16 (no MXFP8 V), exact
products summed in float32, and writes O in BF16; ``dqkv_bf16`` (PR#1123, draft) gives the backward's
sequence-reduction GEMMs ``dV = P^T dO``, ``dQ = dS K``, ``dK = dS^T Q`` BF16 operands (P, dO, dS, Q, K
rounded to BF16) while ``dP = dO V^T``, which reduces over the head dimension, stays MXFP8.

Choices TE's code leaves to cuDNN and that fp8sim fixes (documented, not verified on hardware):
GEMMs sum exact products in float32 (or the named accumulator model) and apply
``fl32(scale_inv_a * scale_inv_b)`` after the sum, then the softmax scale; the softmax runs in float32
with ``exp`` of ``s - rowmax``; the softmax backward uses the unquantized P and
``D = rowsum(dO * O)`` on the dequantized dO and the O that the backward receives (FP8 under delayed
scaling); amaxes are taken of exactly the tensor each quantizer casts; rows with every key masked give
0 (cuDNN zero-fills them).  ``NVTE_FP8_DPA_BWD=0`` runs the backward in high precision from the
unquantized Q, K, V, the returned O and the FP8 forward's softmax statistics (log-sum-exp), which TE
hands to the F16 backward kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ....formats import FloatFormat
from ....scaling.amax import amax_nan_skipping_tensor
from ....scaling.quantized import QuantizedData
from ...module._operands import Operand

__all__ = ["AttentionConfig", "Quantizer", "attention", "check_bf16_options"]


def _amax(*xs: torch.Tensor) -> np.float32:
    """max|x| over the tensors, NaN skipped (the scaling layer's amax of each, TE's ``fmaxf`` reduction)."""
    return np.fmax.reduce([np.float32(amax_nan_skipping_tensor(x)) for x in xs], initial=np.float32(0))


@dataclass
class Quantizer:
    """One attention quantization point.  ``kind``: "delayed" (``scaler.scale[index]``, amax folded
    into the staging row), "current" (scale from this tensor's amax) or "mxfp8" (E8M0 per 32 along
    ``axis``, TE's RCEIL rule)."""

    kind: str
    fmt: FloatFormat
    scaler: Any = None
    index: int = 0

    def __call__(self, *xs: torch.Tensor, axis: int = -1) -> list[Operand]:
        """The tensors quantized by the scaling layer (:class:`~fp8sim.scaling.QuantizedData` records, as
        torch operands): one scale over all of them for the per-tensor kinds (TE's ``combine_and_quantize``)."""
        if self.kind == "mxfp8":
            from ....scaling.mx import quantize_mx

            out = []
            for x in xs:
                q = quantize_mx(
                    x.detach().float().contiguous().numpy(), self.fmt, axis=axis, scale_rule="rceil", flavor="te"
                )
                out.append(Operand(torch.from_numpy(q.dequantize()), self.fmt, qt=q))
            return out
        if self.kind == "delayed":  # the slot's scale; each amax joins its staging row
            scale = np.float32(self.scaler.scale[self.index])
            return [_per_tensor(self.scaler.quantize(self.index, x.detach()), x, scale) for x in xs]
        from ....scaling.current import compute_scale_from_amax, quantize_with_scale

        scale = np.float32(compute_scale_from_amax(_amax(*xs), self.fmt.max))
        return [_per_tensor(quantize_with_scale(x.detach(), scale, self.fmt), x, scale) for x in xs]


def _per_tensor(q: QuantizedData, x: torch.Tensor, scale: np.float32) -> Operand:
    """The GEMM operand of ``q``, the per-tensor record of ``x`` cast with ``scale``: its codes, their values
    and ``scale_inv``.  A NaN of ``fl32(x * scale)`` keeps torch's float8 cast convention, which the attention
    core has always used (code ``0x7F | sign`` in E4M3 and E5M2, decoded by torch with its NaN payload); the
    record holds the scaling layer's NaN codes (ml_dtypes: E5M2 ``0x7E | sign``)."""
    codes = torch.from_numpy(q.codes).to(x.device)
    scaled = x.detach().float() * torch.tensor(float(scale), dtype=torch.float32)
    nan = torch.isnan(scaled)
    if bool(nan.any()):
        sign = torch.signbit(scaled).to(torch.uint8) << 7
        codes = torch.where(nan, sign | 0x7F, codes)
    return Operand(None, q.fmt, codes.view(q.fmt.torch_dtype).float(), codes, float(q.scales.reshape(-1)[0]), qt=q)


@dataclass
class AttentionConfig:
    """Everything the core needs besides Q, K, V.  Quantizers are None for high precision."""

    softmax_scale: float
    mask: torch.Tensor | None = None  # bool, True = masked, broadcastable to [b, h, sq, skv]
    bias: torch.Tensor | None = None  # float32, added before (pre_scale) or after the scale
    bias_type: str = "no_bias"
    dropout_p: float = 0.0
    qkv: Quantizer | None = None
    s: Quantizer | None = None
    o: Quantizer | None = None
    do: Quantizer | None = None
    dp: Quantizer | None = None
    dqkv: Quantizer | None = None
    bwd_fp8: bool = True
    accumulator: str | None = None
    site: Any = None  # the attention module (plans for fp8sim explain)
    profile: str | None = None  # the region's device profile, by name (plans)
    on_backward_end: Any = None  # callable run after the backward (TE: the first module updates scales)
    # FP8 boundaries (TE's Float8Tensor inputs/outputs of FusedAttnFunc; per-tensor recipes):
    qkv_in: tuple | None = None  # Q, K, V already in FP8 (``Operand``s): the QKV quantizer is skipped
    do_in: Any = None  # callable -> the FP8 dO (``Operand``) that the consumer's backward wrote, or None
    dqkv_out: Any = None  # callable taking the FP8 dQ, dK, dV (``Operand``s) when the inputs were FP8
    pv_bf16: bool = False  # MXFP8 only: P, V and O of the PV GEMM in BF16 (cuDNN-frontend PR#983)
    dqkv_bf16: bool = False  # MXFP8 only: the dQ, dK, dV GEMMs on BF16 operands (cuDNN-frontend PR#1123)
    saved: dict = field(default_factory=dict)


def check_bf16_options(pv_bf16: Any, dqkv_bf16: Any, recipe: str | None = None, mxfp8: bool = True) -> None:
    """``pv_bf16`` and ``dqkv_bf16`` are booleans, and options of MXFP8 attention only (``recipe``: the
    recipe's class name, ``mxfp8``: whether it is MXFP8)."""
    for name, flag in (("pv_bf16", pv_bf16), ("dqkv_bf16", dqkv_bf16)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False; got {flag!r}")
    if (pv_bf16 or dqkv_bf16) and not mxfp8:
        raise NotImplementedError(
            "pv_bf16 and dqkv_bf16 are options of MXFP8 attention (cuDNN-frontend PR#983, PR#1123); "
            f"the recipe is {recipe}"
        )


def _record(a: Operand, b: Operand, accumulator: Any, role: str, cfg: Any) -> Any:
    """The plan of one FP8 attention GEMM (cuDNN's kernel: the accumulator's model, no split-K) for ``fp8sim
    explain``; the accumulator to compute with (None under a dry recorder)."""
    from ....gemm.plans import current_recorder

    rec = current_recorder()
    if rec is None or a.fmt is None or b.fmt is None or cfg is None:
        return accumulator
    from ...module._gemm_plan import DEFAULT, record_plan

    sa = (a.vals if a.vals is not None else a.dq).shape
    sb = (b.vals if b.vals is not None else b.dq).shape
    acc = DEFAULT if accumulator is None else str(getattr(accumulator, "name", accumulator))
    record_plan(
        cfg.site, "", role, m=sa[-2], n=sb[-1], k=sa[-1], a_format=a.fmt.name, b_format=b.fmt.name,
        scaling="tensorwise" if a.vals is not None else "1x32 blocks", out_dtype="float32", use_fast_accum=None,
        accumulator=acc, profile=cfg.profile, split=1, scheme="none",
        source="default" if accumulator is None else "cudnn",
        note="FP8 attention runs in cuDNN's fused kernels, not cuBLAS: no split-K",
        batch=math.prod(torch.broadcast_shapes(sa[:-2], sb[:-2])),
    )  # fmt: skip
    return None if rec.dry else accumulator


def _mm(a: Operand, b: Operand, accumulator: str | None, role: str = "", cfg: Any = None) -> torch.Tensor:
    """Batched ``a @ b`` in float32 with the per-tensor scales applied after the sum.  ``accumulator`` models
    FP8 GEMMs: high-precision operands (the F16 backward of ``NVTE_FP8_DPA_BWD=0``, BF16 P/V) sum in float32."""
    accumulator = _record(a, b, accumulator, role, cfg)
    if a.vals is None or b.vals is None:
        if accumulator is not None and (a.fmt is not None or b.fmt is not None):
            raise NotImplementedError("fp8sim runs MXFP8 attention GEMMs only with accumulator=None")
        return torch.matmul(a.dequant(), b.dequant())
    alpha = torch.tensor(np.float32(a.scale_inv) * np.float32(b.scale_inv), dtype=torch.float32)
    if accumulator is None:
        return torch.matmul(a.vals, b.vals) * alpha
    from ....gemm import scaled_mm

    ac, bc = a.codes, b.codes
    lead = torch.broadcast_shapes(ac.shape[:-2], bc.shape[:-2])
    ac = ac.expand(*lead, *ac.shape[-2:]).reshape(-1, *ac.shape[-2:])
    bc = bc.expand(*lead, *bc.shape[-2:]).reshape(-1, *bc.shape[-2:])
    outs = [
        torch.from_numpy(
            scaled_mm(
                ac[i].contiguous().numpy(),
                bc[i].contiguous().numpy(),
                np.float32(a.scale_inv),
                np.float32(b.scale_inv),
                out_dtype="float32",
                accumulator=accumulator,
                a_format=a.fmt,
                b_format=b.fmt,
                strict=False,
            )
        )
        for i in range(ac.shape[0])
    ]
    return torch.stack(outs).reshape(*lead, ac.shape[-2], bc.shape[-1])


def _hp(x: torch.Tensor) -> Operand:
    return Operand(x, None)


def _bf16(x: torch.Tensor) -> Operand:
    """``x`` rounded to BF16 (torch's cast: RN-even), held as float32 values."""
    return Operand(x.detach().to(torch.bfloat16).to(torch.float32), None)


def _expand(x: Operand, groups: int) -> Operand:
    """K, V (and their gradients' operands) repeated over the query heads of each GQA group."""
    if groups == 1:
        return x
    rep = lambda t: None if t is None else t.repeat_interleave(groups, dim=1)  # noqa: E731
    return Operand(rep(x.dq), x.fmt, rep(x.vals), rep(x.codes), x.scale_inv)


def _softmax(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return torch.softmax(scores, dim=-1)
    scores = scores.masked_fill(mask, float("-inf"))
    empty = mask.all(dim=-1, keepdim=True)  # every key masked: cuDNN writes zeros
    p = torch.softmax(scores.masked_fill(empty, 0.0), dim=-1)
    return p.masked_fill(empty, 0.0)


def _scores(q: Operand, k: Operand, cfg: AttentionConfig) -> torch.Tensor:
    s = _mm(q, k.t(), cfg.accumulator, "QK^T", cfg)
    if cfg.bias_type == "pre_scale_bias":
        return (s + cfg.bias) * cfg.softmax_scale
    s = s * cfg.softmax_scale
    return s + cfg.bias if cfg.bias is not None else s


def _recompute_p(
    q: torch.Tensor, k: torch.Tensor, cfg: AttentionConfig, groups: int, lse: torch.Tensor
) -> torch.Tensor:
    """cuDNN's F16 backward after an FP8 forward (``NVTE_FP8_DPA_BWD=0``): it recomputes the scores from
    the high-precision Q, K and exponentiates them against the forward kernel's softmax statistics
    (TE passes the FP8 forward's ``aux_ctx_tensors`` to the F16 ``fused_attn_bwd``)."""
    s = _scores(_hp(q), _expand(_hp(k), groups), cfg)
    if cfg.mask is not None:
        s = s.masked_fill(cfg.mask, float("-inf"))
    p = torch.exp(s - lse)
    return p if cfg.mask is None else p.masked_fill(cfg.mask.all(dim=-1, keepdim=True), 0.0)


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: AttentionConfig) -> torch.Tensor:
        groups = q.shape[1] // k.shape[1]
        if cfg.qkv is None:
            qq, kq, vq = _hp(q), _hp(k), _hp(v)
        elif cfg.qkv_in is not None:  # FP8 inputs are used as they are (TE: is_input_fp8)
            qq, kq, vq = cfg.qkv_in
        elif cfg.qkv.kind == "mxfp8":  # Q, K blocked along d (for QK^T), V along the sequence (for PV)
            qq, kq = cfg.qkv(q, k, axis=-1)
            (vq,) = (_bf16(v),) if cfg.pv_bf16 else cfg.qkv(v, axis=-2)
        else:
            qq, kq, vq = cfg.qkv(q, k, v)
        scores = _scores(qq, _expand(kq, groups), cfg)
        p = _softmax(scores, cfg.mask)
        if cfg.qkv is not None and not cfg.bwd_fp8:  # the softmax statistics the high-precision backward reuses
            masked = scores if cfg.mask is None else scores.masked_fill(cfg.mask, float("-inf"))
            ctx.lse = torch.logsumexp(masked, dim=-1, keepdim=True)
        keep = None
        if cfg.dropout_p > 0:
            keep = torch.rand_like(p) >= cfg.dropout_p
            pd = p * keep / (1.0 - cfg.dropout_p)
        else:
            pd = p
        if cfg.pv_bf16:  # P rounded, not quantized; the BF16 products summed in float32, O written in BF16
            pq = _bf16(pd)
            o = _bf16(_mm(pq, _expand(vq, groups), cfg.accumulator, "PV", cfg)).dq
        else:
            pq = cfg.s(pd, axis=-1)[0] if cfg.s is not None else _hp(pd)
            o = _mm(pq, _expand(vq, groups), cfg.accumulator, "PV", cfg)
        oq = cfg.o(o)[0] if cfg.o is not None else None
        out = oq.dequant() if oq is not None else o
        cfg.saved["oq"] = oq
        ctx.cfg, ctx.groups, ctx.keep = cfg, groups, keep
        ctx.quant = (qq, kq, vq, pq)
        ctx.save_for_backward(q, k, v, p, out, pd)
        return out

    @staticmethod
    def backward(ctx: Any, d_out: torch.Tensor) -> tuple:
        with torch.autocast(d_out.device.type, enabled=False):
            return _Attention._backward(ctx, d_out)

    @staticmethod
    def _backward(ctx: Any, d_out: torch.Tensor) -> tuple:
        cfg, g = ctx.cfg, ctx.groups
        q, k, v, p, out, pd = ctx.saved_tensors
        fp8 = cfg.qkv is not None and cfg.bwd_fp8
        d_out = d_out.to(q.dtype)
        if fp8:
            qq, kq, vq, pq = ctx.quant
            mx = cfg.qkv.kind == "mxfp8"
            if mx:  # each GEMM's operands blocked along its reduction axis, from the high-precision tensors
                do_row = cfg.do(d_out, axis=-1)[0]
                (vq_row,) = cfg.qkv(v, axis=-1)
                if cfg.dqkv_bf16:  # the GEMMs that reduce over the sequence take BF16 operands instead
                    do_col, qq_col, kq_col, pq = _bf16(d_out), _bf16(q), _bf16(k), _bf16(pd)
                else:
                    do_col = cfg.do(d_out, axis=-2)[0]
                    qq_col, kq_col = cfg.qkv(q, k, axis=-2)
                    pq = cfg.s(pd, axis=-2)[0] if cfg.s is not None else _hp(pd)  # P^T dO reduces over s_q
            else:
                do_fp8 = cfg.do_in() if cfg.do_in is not None else None  # TE: a Float8Tensor dO as it is
                do_row = do_col = do_fp8 if do_fp8 is not None else cfg.do(d_out)[0]
                vq_row, qq_col, kq_col = vq, qq, kq
        else:
            qq_col = _hp(q)
            kq_col = _hp(k)
            vq_row = _hp(v)
            do_row = do_col = _hp(d_out)
            if cfg.qkv is not None:  # FP8 forward, F16 backward: P = exp(S - LSE) with the forward's LSE
                p = _recompute_p(q, k, cfg, g, ctx.lse)
                pd = p if ctx.keep is None else p * ctx.keep / (1.0 - cfg.dropout_p)
            pq = _hp(pd)
        acc = cfg.accumulator
        dv = _mm(pq.t(), do_col, acc, "dV", cfg)
        dp = _mm(do_row, _expand(vq_row, g).t(), acc, "dP", cfg)
        if ctx.keep is not None:
            dp = dp * ctx.keep / (1.0 - cfg.dropout_p)
        o_used = out
        delta = (do_row.dequant() * o_used).sum(dim=-1, keepdim=True)
        ds = p * (dp - delta)
        if fp8 and cfg.dqkv_bf16:
            ds_row = ds_col = _bf16(ds)
        elif fp8 and cfg.dp is not None:
            ds_row = cfg.dp(ds, axis=-1)[0]
            ds_col = ds_row if cfg.dp.kind != "mxfp8" else cfg.dp(ds, axis=-2)[0]
        else:
            ds_row = ds_col = _hp(ds)
        dq = _mm(ds_row, _expand(kq_col, g), acc, "dQ", cfg) * cfg.softmax_scale
        dk = _mm(ds_col.t(), qq_col, acc, "dK", cfg) * cfg.softmax_scale
        if g > 1:
            dk = dk.reshape(dk.shape[0], -1, g, *dk.shape[2:]).sum(2)
            dv = dv.reshape(dv.shape[0], -1, g, *dv.shape[2:]).sum(2)
        if fp8 and cfg.dqkv is not None:
            dqkv = cfg.dqkv(dq, dk, dv)
            if cfg.dqkv_out is not None:  # FP8 inputs: dQ, dK, dV go back in FP8 (TE: is_input_fp8)
                cfg.dqkv_out(dqkv)
            dq, dk, dv = (t.dequant() for t in dqkv)
        if cfg.on_backward_end is not None:
            cfg.on_backward_end()
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: AttentionConfig) -> torch.Tensor:
    """``[b, h, sq, d]`` x ``[b, hg, skv, d]`` x ``[b, hg, skv, dv]`` -> ``[b, h, sq, dv]`` in float32
    (float64 for float64 inputs in high precision).

    The bias (``core_attention_bias``) gets no gradient here (TE returns one for learnable biases only
    through cuDNN; fp8sim treats it as a constant)."""
    if q.shape[1] % k.shape[1]:
        raise AssertionError("The number of attention heads must be divisible by the number of GQA groups!")
    dt = torch.float64 if q.dtype == torch.float64 and cfg.qkv is None else torch.float32
    if cfg.bias is not None:
        cfg.bias = cfg.bias.to(dt)
    with torch.autocast(q.device.type, enabled=False):  # float32 GEMMs and softmax under torch.autocast too
        return _Attention.apply(q.to(dt), k.to(dt), v.to(dt), cfg)
