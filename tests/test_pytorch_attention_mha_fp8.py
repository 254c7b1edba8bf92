"""FP8 boundaries inside MultiheadAttention, bit for bit against a reference written here from TE's data flow.

TE ``attention/multi_head_attention.py`` forward (``qkv_fp8_output``, ``dpa_fp8_output``,
``proj_fp8_grad``, the lines after "QKV Gemm: do not produce FP8 output when fp8_mha = True if"):
under ``DelayedScaling(fp8_mha=True)`` without RoPE the QKV GEMM writes Q, K, V in FP8 with its own
OUTPUT slot (fwd index 2, ``Linear(fp8_output=True)``), DPA takes them as they are
(``backends.py`` ``FusedAttnFunc.forward``: ``if is_input_fp8: q_fp8, k_fp8, v_fp8 = q, k, v``) and
returns dQ, dK, dV in FP8 with its dQKV slot; DPA's FP8 O (``fp8_output=dpa_fp8_output``) is
``proj``'s input operand (no INPUT cast); ``proj``'s dgrad is written in FP8 with its GRAD_INPUT slot
(bwd index 1, ``fp8_grad=proj_fp8_grad``) and is DPA's dO (``backward``: ``if isinstance(d_out,
QuantizedTensorStorage): d_out_fp8 = d_out``).  Under current scaling only O crosses in FP8
(``proj_fp8_grad = dpa_fp8_output and not float8_current_scaling``; ``qkv_fp8_output`` needs
delayed scaling).  The old fp8sim flow dequantized every boundary and cast it again with the
consumer's own scale: the tests show the two differ once the scales differ.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

import _gemm_reference as gref  # noqa: E402

import fp8sim.pytorch as te  # noqa: E402
from fp8sim.pytorch.attention import MultiheadAttention  # noqa: E402
from fp8sim.recipe import DelayedScaling, Float8CurrentScaling  # noqa: E402

torch.set_num_threads(1)
E4, E5 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2
MAX = {E4: 448.0, E5: 57344.0}
S, B, HID, H = 4, 2, 16, 2
HN = HID // H

# slot scales set before the checked step (distinct, not powers of two, so that a second cast differs)
QKV_GEMM = {"in": 1.7, "w": 3.1, "out": 2.3, "go": 900.0}
PROJ = {"in": 5.3, "w": 2.9, "go": 700.0, "gi": 3000.0}
DPA = {"qkv": 9.7, "o": 13.1, "s": 300.0, "dqkv": 4000.0, "do": 1100.0, "dp": 200.0}


def q8(x: torch.Tensor, scale: float, dt) -> tuple[torch.Tensor, np.float32]:
    """satfinite(RN(fl32(x) * scale)) decoded, and scale_inv = fl32(1 / scale)."""
    y = (x.detach().float() * torch.tensor(np.float32(scale), dtype=torch.float32)).numpy()
    y = np.clip(y, -MAX[dt], MAX[dt]).astype(dt).astype(np.float32)
    return torch.from_numpy(y), np.float32(1) / np.float32(scale)


def mm(a, b, sa, sb):
    """The FP8 GEMM under ``accumulator="exact"`` (the tests run under it): the exact sum of the products of the
    code values rounded once to float32 (Python integers, ``tests/_gemm_reference.py``, not the module's
    ``torch.matmul``), then ``fl32(sa * sb)`` (cuBLAS's epilogue); batched over leading dims."""
    lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a2 = a.expand(*lead, *a.shape[-2:]).reshape(-1, *a.shape[-2:])
    b2 = b.expand(*lead, *b.shape[-2:]).reshape(-1, *b.shape[-2:])
    d = torch.stack([torch.from_numpy(gref.rn_f32(x, y)) for x, y in zip(a2, b2, strict=True)])
    d = d.reshape(*lead, a.shape[-2], b.shape[-1])
    return d * torch.tensor(np.float32(sa) * np.float32(sb), dtype=torch.float32)


def deq(v, s):
    return v * torch.tensor(s, dtype=torch.float32)


def to_bhsd(t):  # [s, b, h, d] -> [b, h, s, d]
    return t.permute(1, 2, 0, 3)


def split_qkv(t, ng, interleaved):
    """TE's split of the fused QKV rows (``multi_head_attention.py``): ``[ng, np/ng + 2, hn]`` with
    ``qkv_weight_interleaved``, else ``[np/ng + 2, ng, hn]``; Q heads ``[s, b, np, hn]``, K, V ``[s, b, ng, hn]``."""
    per = H // ng
    if interleaved:
        m = t.reshape(S, B, ng, per + 2, HN)
        return m[:, :, :, :per].reshape(S, B, H, HN), m[:, :, :, per], m[:, :, :, per + 1]
    m = t.reshape(S, B, per + 2, ng, HN)
    return m[:, :, :per].reshape(S, B, H, HN), m[:, :, per], m[:, :, per + 1]


def merge_qkv(dq, dk, dv, ng, interleaved):
    """The inverse of :func:`split_qkv` (sbhd parts -> ``[s*b, rows]``)."""
    per = H // ng
    if interleaved:
        t = torch.cat([dq.reshape(S, B, ng, per, HN), dk[:, :, :, None], dv[:, :, :, None]], dim=3)
    else:
        t = torch.cat([dq.reshape(S, B, per, ng, HN), dk[:, :, None], dv[:, :, None]], dim=2)
    return t.reshape(S * B, -1)


def reference(x, wqkv, wproj, dy, scale, fp8_mha, old=False, current=False, ng=H, interleaved=True, act=torch.float32):
    """MHA forward/backward (self attention, fused QKV split as TE splits it, GQA: K, V expanded to the
    query heads of their group, dK, dV summed over them; no mask, no dropout, zero biases).  ``old``: every boundary
    dequantized and cast again by the consumer (fp8sim before TE's flow was emulated)."""
    if current:  # current-scaling scales from each tensor's amax (448 / amax for E4M3, 57344 for E5M2)
        cs = {E4: np.float32(448), E5: np.float32(57344)}
        scale_of = lambda t, dt, _: cs[dt] / np.float32(float(t.abs().max()))  # noqa: E731
    else:
        scale_of = lambda t, dt, s: s  # noqa: E731
    r = lambda t: t.to(act).float()  # noqa: E731  (the activation dtype under torch.autocast)
    X, wqkv, wproj = r(x.reshape(-1, HID)), r(wqkv), r(wproj)
    xv, sx = q8(X, scale_of(X, E4, QKV_GEMM["in"]), E4)
    wv, sw = q8(wqkv, scale_of(wqkv, E4, QKV_GEMM["w"]), E4)
    mixed = mm(xv, wv.t(), sx, sw)
    if fp8_mha and not old:
        mv, sm = q8(mixed, QKV_GEMM["out"], E4)  # the QKV GEMM's FP8 output (OUTPUT slot)
        qv, kv, vv = (to_bhsd(t) for t in split_qkv(mv, ng, interleaved))
    else:
        q, k, v = (to_bhsd(t) for t in split_qkv(mixed, ng, interleaved))
        s_qkv = scale_of(torch.stack([q.abs().max(), k.abs().max(), v.abs().max()]), E4, DPA["qkv"])
        (qv, sm), (kv, _), (vv, _) = (q8(t, s_qkv, E4) for t in (q, k, v))
    groups = H // ng
    kv, vv = kv.repeat_interleave(groups, dim=1), vv.repeat_interleave(groups, dim=1)
    sc = mm(qv, kv.transpose(-1, -2), sm, sm) * scale
    p = torch.softmax(sc, dim=-1)
    pv, sp = q8(p, DPA["s"], E4)  # S keeps a delayed slot under current scaling too (scale set here)
    o = mm(pv, vv, sp, sm)
    if current:  # O written in F16 (NVTE_DPA_FP8CS_o_in_F16), cast by the O quantizer for proj
        o_dpa = o
        ov_, so = q8(o, scale_of(o, E4, None), E4)
    else:
        ov_, so = q8(o, DPA["o"], E4)
        o_dpa = deq(ov_, so)  # what DPA's backward uses as O
    o_rows = ov_.permute(2, 0, 1, 3).reshape(-1, HID)  # [s, b, h*d]
    if old:  # proj casts the dequantized O again with its INPUT scale
        o_in = deq(o_rows, so) if not current else o.permute(2, 0, 1, 3).reshape(-1, HID)
        ov, so_p = q8(o_in, scale_of(o_in, E4, PROJ["in"]), E4)
    else:
        ov, so_p = o_rows, so
    wpv, swp = q8(wproj, scale_of(wproj, E4, PROJ["w"]), E4)
    y = mm(ov, wpv.t(), so_p, swp)
    # backward
    DY = dy.reshape(-1, HID)
    dyv, sdy = q8(DY, scale_of(DY, E5, PROJ["go"]), E5)
    dgrad = mm(dyv, wpv, sdy, swp)
    dwproj = mm(dyv.t(), ov, sdy, so_p)
    d_o = to_bhsd(dgrad.reshape(S, B, H, HN))
    if old or current:
        dov, sdo = q8(d_o, scale_of(d_o, E5, DPA["do"]), E5)
    else:  # proj's FP8 dgrad (GRAD_INPUT slot) is DPA's dO
        dov, sdo = q8(d_o, PROJ["gi"], E5)
    dv = mm(pv.transpose(-1, -2), dov, sp, sdo)
    dp = mm(dov, vv.transpose(-1, -2), sdo, sm)
    ds = p * (dp - (deq(dov, sdo) * o_dpa).sum(-1, keepdim=True))
    dsv, sds = q8(ds, DPA["dp"], E5)
    dq = mm(dsv, kv, sds, sm) * scale
    dk = mm(dsv.transpose(-1, -2), qv, sds, sm) * scale
    dk = dk.reshape(B, ng, groups, S, HN).sum(2)
    dv = dv.reshape(B, ng, groups, S, HN).sum(2)
    if not current:
        (dqv, sg), (dkv, _), (dvv, _) = (q8(t, DPA["dqkv"], E5) for t in (dq, dk, dv))
    else:
        dqv, dkv, dvv, sg = dq, dk, dv, np.float32(1)
    g = merge_qkv(*(t.permute(2, 0, 1, 3) for t in (dqv, dkv, dvv)), ng, interleaved)
    if old or not fp8_mha:  # the QKV GEMM casts the dequantized dQKV again with its GRAD_OUTPUT scale
        G = deq(g, sg)
        gv, sg = q8(G, scale_of(G, E5, QKV_GEMM["go"]), E5)
    else:
        gv = g
    dx = mm(gv, wv, sg, sw)
    dwqkv = mm(gv.t(), xv, sg, sx)
    return r(y.reshape(S, B, HID)), r(dx.reshape(S, B, HID)), r(dwqkv), r(dwproj)


def _setup(seed=0, ng=H, interleaved=True):
    torch.manual_seed(seed)
    mha = MultiheadAttention(
        HID,
        H,
        attention_dropout=0.0,
        attn_mask_type="no_mask",
        fuse_qkv_params=True,
        num_gqa_groups=ng,
        qkv_weight_interleaved=interleaved,
        window_size=(-1, -1),
    )
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(S, B, HID, generator=g)
    dy = torch.randn(S, B, HID, generator=g) * 1e-2
    return mha, x, dy


def _set_scales(mha):
    qg, pg, ca = mha.qkv.fp8_gemms["gemm"], mha.proj.fp8_gemms["gemm"], mha.core_attention
    from fp8sim.pytorch.attention.dot_product_attention.dot_product_attention import (
        META_DO,
        META_DP,
        META_DQKV,
        META_O,
        META_QKV,
        META_S,
    )

    for sc, vals in (
        (qg.fwd, {0: QKV_GEMM["in"], 1: QKV_GEMM["w"], 2: QKV_GEMM["out"]}),
        (qg.bwd, {0: QKV_GEMM["go"]}),
        (pg.fwd, {0: PROJ["in"], 1: PROJ["w"]}),
        (pg.bwd, {0: PROJ["go"], 1: PROJ["gi"]}),
        (ca.fwd, {META_QKV: DPA["qkv"], META_O: DPA["o"], META_S: DPA["s"]}),
        (ca.bwd, {META_DQKV: DPA["dqkv"], META_DO: DPA["do"], META_DP: DPA["dp"]}),
    ):
        if sc is None:  # current scaling: the linears keep no delayed state
            continue
        for i, v in vals.items():
            sc.scale[i] = np.float32(v)
        sc.amax_history[:] = 0


def _run(mha, x, dy, recipe, act=torch.float32):
    x = x.clone().requires_grad_(True)
    mha.zero_grad()
    with (
        torch.autocast("cpu", dtype=act, enabled=act != torch.float32),
        te.autocast(enabled=True, recipe=recipe, accumulator="exact"),
    ):
        y = mha(x)
        qf = mha.qkv.fp8_gemms["gemm"].fwd
        staged = None if qf is None else qf.amax_history[0].copy(), mha.core_attention.fwd.amax_history[0].copy()
    y.backward(dy.to(y.dtype))
    return y.detach().float(), x.grad, mha.qkv.weight.grad, mha.proj.weight.grad, staged


@pytest.mark.parametrize(
    "fp8_mha, ng, interleaved", [(False, H, True), (True, H, True), (True, 1, False), (True, 1, True)]
)
def test_mha_fp8_boundaries_follow_te_bit_for_bit_under_delayed_scaling(fp8_mha, ng, interleaved):
    recipe = DelayedScaling(fp8_dpa=True, fp8_mha=fp8_mha, amax_history_len=1)
    mha, x, dy = _setup(ng=ng, interleaved=interleaved)
    _run(mha, x, dy, recipe)  # creates the FP8 state
    _set_scales(mha)
    y, dx, dwqkv, dwproj, (qkv_amax, dpa_amax) = _run(mha, x, dy, recipe)
    scale = 1.0 / np.sqrt(HN)
    ref = reference(
        x, mha.qkv.weight.detach(), mha.proj.weight.detach(), dy, scale, fp8_mha, ng=ng, interleaved=interleaved
    )
    for got, want in zip((y, dx, dwqkv, dwproj), ref, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    old = reference(
        x, mha.qkv.weight.detach(), mha.proj.weight.detach(), dy, scale, fp8_mha, True, ng=ng, interleaved=interleaved
    )
    assert any(not torch.equal(a, b) for a, b in zip(ref, old, strict=True))  # the old flow rounds twice
    # FP8 Q, K, V: the QKV GEMM's OUTPUT slot records the amax, DPA's QKV cast (slot 2) is skipped
    assert (qkv_amax[2] > 0) == fp8_mha and (dpa_amax[2] == 0) == fp8_mha


def test_mha_fp8_output_under_current_scaling_feeds_proj_bit_for_bit():
    """Float8CurrentScaling: O quantized from the F16 O by the current-scaling O quantizer, used by proj
    as it is; dO and dQKV in high precision across the boundaries (TE: cuBLAS writes no FP8CS output)."""
    recipe = Float8CurrentScaling(fp8_dpa=True)
    mha, x, dy = _setup(3)
    _run(mha, x, dy, recipe)
    _set_scales(mha)  # S and dP keep delayed slots under current scaling
    y, dx, dwqkv, dwproj, _ = _run(mha, x, dy, recipe)
    scale = 1.0 / np.sqrt(HN)
    w1, w2 = mha.qkv.weight.detach(), mha.proj.weight.detach()
    ref = reference(x, w1, w2, dy, scale, False, current=True)
    for got, want in zip((y, dx, dwqkv, dwproj), ref, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    # the O handoff equals the old re-cast here: proj's current-scaling cast of the returned O takes
    # the same amax of the same tensor (TE's flow saves the second cast, not a rounding)
    old = reference(x, w1, w2, dy, scale, False, old=True, current=True)
    for a, b in zip(ref, old, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
def test_layernorm_linear_fp8_output_is_the_gemm_result_cast_with_the_output_slot(normalization):
    """``LayerNormLinear(fp8_output=True)`` (TE ``layernorm_linear.py``: the GEMM's output quantizer is
    ``quantizers["scaling_fwd"][GEMM1_OUTPUT]``): the float32 GEMM result cast once with the OUTPUT
    slot's scale, its amax staged in that slot; the returned tensor is its dequantized value."""
    from fp8sim.pytorch.module._fp8_handoff import handoff_of

    torch.manual_seed(5)
    lnl = te.LayerNormLinear(16, 24, normalization=normalization)
    x = torch.randn(8, 16)
    recipe = DelayedScaling(amax_history_len=1)
    with te.autocast(enabled=True, recipe=recipe, accumulator="exact"):
        lnl(x)  # creates the state
    g = lnl.fp8_gemms["gemm"]
    g.fwd.scale[:] = np.float32([1.9, 2.7, 3.3])
    g.fwd.amax_history[:] = 0
    with te.autocast(enabled=True, recipe=recipe, accumulator="exact"):
        plain = lnl(x).detach()
        g.fwd.amax_history[:] = 0
        y = lnl(x, fp8_output=True)
        staged = g.fwd.amax_history[0, 2]
    h = handoff_of(y)
    want, sinv = q8(plain, 3.3, E4)
    assert h is not None and h.sinv == sinv
    torch.testing.assert_close(h.vals, want, rtol=0, atol=0)
    torch.testing.assert_close(y.detach(), deq(want, sinv), rtol=0, atol=0)
    assert staged == np.float32(plain.abs().max())


@pytest.mark.parametrize("input_layernorm", [False, True])
def test_cross_attention_fp8_mha_skips_the_dpa_qkv_and_the_linears_grad_output_casts(input_layernorm):
    """Cross attention under fp8_mha: query and key_value GEMMs write FP8 (their OUTPUT slots stage an
    amax, DPA's QKV slot none); DPA's FP8 dQ and dK, dV feed their backward (no GRAD_OUTPUT amax)."""
    torch.manual_seed(7)
    mha = MultiheadAttention(16, 2, attention_dropout=0.0, attention_type="cross", input_layernorm=input_layernorm)
    x, enc = torch.randn(4, 2, 16, requires_grad=True), torch.randn(4, 2, 16)
    recipe = DelayedScaling(fp8_dpa=True, fp8_mha=True, amax_history_len=1)
    qlin = mha.layernorm_query if input_layernorm else mha.query_layer
    for _ in range(2):
        with te.autocast(enabled=True, recipe=recipe, accumulator="exact"):
            y = mha(x, encoder_output=enc)
            staged = [m.fp8_gemms["gemm"].fwd.amax_history[0, 2] for m in (qlin, mha.key_value)]
            dpa_qkv = mha.core_attention.fwd.amax_history[0, 2]
        bwd = [m.fp8_gemms["gemm"].bwd for m in (qlin, mha.key_value, mha.proj)]
        for b in bwd:  # a marker scale: the backward update replaces it only where an amax was staged
            b.scale[:] = np.float32(123.0)
        y.sum().backward()
        assert all(a > 0 for a in staged) and dpa_qkv == 0
        assert all(b.scale[0] == np.float32(123.0) for b in bwd[:2])  # FP8 grads: no GRAD_OUTPUT cast
        assert bwd[2].scale[1] != np.float32(123.0)  # proj's FP8 dgrad staged its GRAD_INPUT amax
        assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0


def test_mha_fp8_mha_bit_for_bit_under_bf16_autocast():
    """The same flow under ``torch.autocast(bfloat16)``: inputs and weights rounded to bf16 before their
    casts, the FP8 boundaries taken from the float32 GEMM results (cuBLAS writes FP8 D from its float32
    accumulator), the module outputs and gradients rounded to bf16."""
    recipe = DelayedScaling(fp8_dpa=True, fp8_mha=True, amax_history_len=1)
    mha, x, dy = _setup(11)
    bf = torch.bfloat16
    _run(mha, x, dy, recipe, bf)
    _set_scales(mha)
    got = _run(mha, x, dy, recipe, bf)[:4]
    w1, w2 = mha.qkv.weight.detach(), mha.proj.weight.detach()
    ref = reference(x, w1, w2, dy.to(bf).float(), 1.0 / np.sqrt(HN), True, act=bf)
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_dpa_under_torch_autocast_computes_in_float32_as_without_it():
    """TE's fused attention takes bf16 Q, K, V and computes in float32 whether or not torch.autocast is
    on; fp8sim's float32 core must not be autocast to bf16 (forward and backward)."""
    from fp8sim.pytorch.attention import DotProductAttention

    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(16, 2, 2, 32, generator=g).to(torch.bfloat16) for _ in range(3))
    do = torch.randn(16, 2, 64, generator=g).to(torch.bfloat16)
    dpa = DotProductAttention(2, 32, attention_dropout=0.0, attn_mask_type="causal")
    res = []
    for on in (False, True):
        ts = [t.clone().requires_grad_(True) for t in (q, k, v)]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=on):
            out = dpa(*ts)
        out.backward(do)
        res.append([out.detach(), *(t.grad for t in ts)])
    for a, b in zip(*res, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
