"""MultiheadAttention, TransformerLayer and rotary embeddings against TE's definitions.

Layouts from TE ``attention/multi_head_attention.py`` (fused QKV rows ``[ng, np/ng + 2, hn]`` when
``qkv_weight_interleaved``, else ``[np/ng + 2, ng, hn]``), RoPE from ``attention/rope.py``
(``inv_freq = base^(-2i/d)``, ``[f, f]`` or interleaved ``[f0, f0, f1, f1, ...]``, rotation
``t cos + rotate_half(t) sin``), TransformerLayer residual structure from ``transformer.py``.
"""

from __future__ import annotations

import io

import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

import fp8sim.pytorch as te  # noqa: E402
from fp8sim.recipe import DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling  # noqa: E402

torch.set_num_threads(1)
# TE's MultiheadAttention builds its DotProductAttention with the default "causal" window (-1, 0), so a
# non-causal mask type warns in TE too (dot_product_attention/utils.py check_set_window_size)
pytestmark = pytest.mark.filterwarnings("ignore:window_size should be")


# ---- rotary embeddings ---------------------------------------------------------------------------------
def _ref_rope(t: torch.Tensor, positions: torch.Tensor, rot: int, interleaved: bool, base: float = 10000.0):
    """Rotate channel pairs of ``t`` [s, ..., d] by ``pos * base^(-2i/rot)`` as complex numbers (float64)."""
    inv = 1.0 / (base ** (np.arange(0, rot, 2, dtype=np.float32) / np.float32(rot)))
    ang = torch.from_numpy(np.outer(positions.numpy().astype(np.float32), inv).astype(np.float32)).double()
    ang = ang.view(ang.shape[0], *([1] * (t.dim() - 2)), -1)
    x = t.double()
    head, rest = x[..., :rot], x[..., rot:]
    if interleaved:
        pairs = torch.complex(head[..., ::2], head[..., 1::2]) * torch.polar(torch.ones_like(ang), ang)
        out = torch.stack((pairs.real, pairs.imag), dim=-1).reshape(head.shape)
    else:
        h = rot // 2
        pairs = torch.complex(head[..., :h], head[..., h:]) * torch.polar(torch.ones_like(ang), ang)
        out = torch.cat((pairs.real, pairs.imag), dim=-1)
    return torch.cat((out, rest), dim=-1)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
def test_rope_is_a_rotation_of_channel_pairs(fmt, interleaved):
    s, b, h, d, rot = 7, 2, 3, 16, 12
    t = torch.randn(s, b, h, d, generator=torch.Generator().manual_seed(0))
    freqs = te.RotaryPositionEmbedding(rot, interleaved=interleaved)(s)
    assert freqs.shape == (s, 1, 1, rot) and freqs.dtype == torch.float32
    x = t if fmt == "sbhd" else t.transpose(0, 1)
    out = te.apply_rotary_pos_emb(x, freqs, fmt, interleaved=interleaved)
    out = out if fmt == "sbhd" else out.transpose(0, 1)
    ref = _ref_rope(t, torch.arange(s), rot, interleaved)
    torch.testing.assert_close(out.double(), ref, rtol=1e-6, atol=1e-6)
    assert torch.equal(out[..., rot:], t[..., rot:])


def test_rope_start_positions_and_thd():
    s, b, h, d = 5, 2, 2, 8
    freqs = te.RotaryPositionEmbedding(d)(16)
    t = torch.randn(s, b, h, d, generator=torch.Generator().manual_seed(1))
    start = torch.tensor([3, 0])
    out = te.apply_rotary_pos_emb(t, freqs, "sbhd", start_positions=start)
    for i in range(b):
        ref = _ref_rope(t[:, i], torch.arange(s) + int(start[i]), d, False)
        torch.testing.assert_close(out[:, i].double(), ref, rtol=1e-6, atol=1e-6)
    packed = torch.randn(9, h, d, generator=torch.Generator().manual_seed(2))
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    out = te.apply_rotary_pos_emb(packed, freqs, "thd", cu_seqlens=cu)
    for lo, hi in ((0, 4), (4, 9)):  # positions restart in every sequence
        torch.testing.assert_close(
            out[lo:hi].double(), _ref_rope(packed[lo:hi], torch.arange(hi - lo), d, False), rtol=1e-6, atol=1e-6
        )
    with pytest.raises(AssertionError, match="cu_seqlens must not be None"):
        te.apply_rotary_pos_emb(packed, freqs, "thd")


# ---- MultiheadAttention ------------------------------------------------------------------------------------
def _sdpa(q, k, v, causal):
    """sbhd float64 math SDPA with GQA (query head j uses kv group j // (h / hg))."""
    qb, kb, vb = (x.permute(1, 2, 0, 3) for x in (q, k, v))
    g = qb.shape[1] // kb.shape[1]
    kb, vb = kb.repeat_interleave(g, 1), vb.repeat_interleave(g, 1)
    out, _ = torch.ops.aten._scaled_dot_product_attention_math(qb, kb, vb, is_causal=causal)
    return out.permute(2, 0, 1, 3).reshape(q.shape[0], q.shape[1], -1)


@pytest.mark.parametrize("fuse,interleaved", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("hg", [4, 2])
def test_mha_self_attention_splits_qkv_as_te(fuse, interleaved, hg):
    torch.manual_seed(0)
    hidden, h, s, b = 32, 4, 6, 2
    m = te.MultiheadAttention(
        hidden,
        h,
        num_gqa_groups=hg,
        attention_dropout=0.0,
        fuse_qkv_params=fuse,
        qkv_weight_interleaved=interleaved,
        input_layernorm=True,
        params_dtype=torch.float64,
    )
    x = torch.randn(s, b, hidden, dtype=torch.float64)
    out = m(x)
    lnq = m.layernorm_qkv
    ln = torch.nn.functional.layer_norm(x, (hidden,), lnq.layer_norm_weight, lnq.layer_norm_bias, 1e-5)
    weight = lnq.weight if fuse else torch.cat([lnq.query_weight, lnq.key_weight, lnq.value_weight])
    bias = lnq.bias if fuse else torch.cat([lnq.query_bias, lnq.key_bias, lnq.value_bias])
    mixed = ln @ weight.t() + bias
    hn, per = hidden // h, h // hg
    if interleaved:  # rows: for each group g, per query heads, one key, one value
        grp = mixed.view(s, b, hg, per + 2, hn)
        q = grp[:, :, :, :per].reshape(s, b, h, hn)
        k, v = grp[:, :, :, per], grp[:, :, :, per + 1]
    else:  # rows: all queries ([per, ng] heads), then keys, then values
        q = mixed[..., : h * hn].reshape(s, b, h, hn)
        k = mixed[..., h * hn : (h + hg) * hn].reshape(s, b, hg, hn)
        v = mixed[..., (h + hg) * hn :].reshape(s, b, hg, hn)
    ref = _sdpa(q, k, v, causal=True) @ m.proj.weight.t() + m.proj.bias
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-7)  # TE normalizes in float32


def test_mha_cross_attention_and_rope():
    torch.manual_seed(1)
    hidden, h, sq, sk, b = 32, 2, 5, 7, 1
    m = te.MultiheadAttention(
        hidden, h, attention_dropout=0.0, attention_type="cross", attn_mask_type="no_mask", params_dtype=torch.float64
    )
    x, enc = torch.randn(sq, b, hidden, dtype=torch.float64), torch.randn(sk, b, hidden, dtype=torch.float64)
    out = m(x, encoder_output=enc)
    hn = hidden // h
    q = (x @ m.query_layer.weight.t() + m.query_layer.bias).view(sq, b, h, hn)
    kv = enc @ torch.cat([m.key_value.key_weight, m.key_value.value_weight]).t()
    kv = kv + torch.cat([m.key_value.key_bias, m.key_value.value_bias])
    k, v = kv[..., :hidden].view(sk, b, h, hn), kv[..., hidden:].view(sk, b, h, hn)
    ref = _sdpa(q, k, v, causal=False) @ m.proj.weight.t() + m.proj.bias
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-7)  # TE normalizes in float32
    # rotary embeddings rotate q and k before attention
    m2 = te.MultiheadAttention(hidden, h, attention_dropout=0.0, params_dtype=torch.float64)
    freqs = te.RotaryPositionEmbedding(hn)(sq)
    out = m2(x, rotary_pos_emb=freqs)
    w, bias = (
        torch.cat([m2.qkv.query_weight, m2.qkv.key_weight, m2.qkv.value_weight]),
        torch.cat([m2.qkv.query_bias, m2.qkv.key_bias, m2.qkv.value_bias]),
    )
    mixed = x @ w.t() + bias
    q, k, v = (mixed[..., i * hidden : (i + 1) * hidden].view(sq, b, h, hn) for i in range(3))
    q, k = (_ref_rope(t, torch.arange(sq), hn, False) for t in (q, k))
    ref = _sdpa(q, k, v, causal=True) @ m2.proj.weight.t() + m2.proj.bias
    torch.testing.assert_close(out, ref, rtol=1e-7, atol=1e-7)


# ---- TransformerLayer ----------------------------------------------------------------------------------
def test_transformer_layer_residual_structure_matches_te():
    """encoder: x + attn(x); then + mlp(.)  (post-LN residuals: from the norms' outputs)."""
    torch.manual_seed(2)
    for post in (False, True):
        layer = te.TransformerLayer(
            32,
            64,
            2,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            params_dtype=torch.float64,
            apply_residual_connection_post_layernorm=post,
        )
        x = torch.randn(6, 2, 32, dtype=torch.float64)
        attn = layer.self_attention(x)
        if post:
            attn, ln1 = attn
            h1 = ln1 + attn
            mlp, ln2 = layer.layernorm_mlp(h1)
            ref = ln2 + mlp
        else:
            h1 = x + attn
            ref = h1 + layer.layernorm_mlp(h1)
        torch.testing.assert_close(layer(x), ref, rtol=0, atol=0)


def _tanh_gelu(x: torch.Tensor) -> torch.Tensor:
    """TE's "gelu" (common/util/math.h: 0.5 x (1 + tanh(0.79788456 x (1 + 0.044715 x^2)))), written out."""
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * x * (1.0 + 0.044715 * x * x)))


@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("post", [False, True])
def test_transformer_layer_equals_a_reference_written_from_its_parameters(post, fuse):
    """The whole encoder layer from its parameters alone (TE transformer.py forward, pre-LN default and
    ``apply_residual_connection_post_layernorm``): LN -> QKV -> causal SDPA -> proj -> + residual ->
    LN -> fc1 -> tanh-GELU -> fc2 -> + residual.  QKV rows are interleaved per head only with
    ``fuse_qkv_params=True`` (multi_head_attention.py:317-318 turns ``qkv_weight_interleaved`` off
    otherwise).  Independent of the submodules' forward code; float64 parameters, TE's norms in
    float32 (hence the tolerance)."""
    torch.manual_seed(5)
    hidden, ffn, heads, s, b = 32, 64, 4, 6, 2
    hn = hidden // heads
    layer = te.TransformerLayer(
        hidden, ffn, heads, hidden_dropout=0.0, attention_dropout=0.0, params_dtype=torch.float64,
        apply_residual_connection_post_layernorm=post, fuse_qkv_params=fuse,
    )  # fmt: skip
    with torch.no_grad():
        for p in layer.parameters():  # non-trivial norms and biases, so a dropped term shows
            p.add_(0.1 * torch.randn_like(p))
    x = torch.randn(s, b, hidden, dtype=torch.float64)
    qkv, mlp = layer.self_attention.layernorm_qkv, layer.layernorm_mlp
    ln1 = torch.nn.functional.layer_norm(x, (hidden,), qkv.layer_norm_weight, qkv.layer_norm_bias, 1e-5)
    if fuse:
        grp = (ln1 @ qkv.weight.t() + qkv.bias).view(s, b, heads, 3, hn)  # per head: its q, k, v rows
        q, k, v = grp[:, :, :, 0], grp[:, :, :, 1], grp[:, :, :, 2]
    else:
        lin = torch.nn.functional.linear
        q, k, v = (lin(ln1, getattr(qkv, f"{n}_weight"), getattr(qkv, f"{n}_bias")) for n in ("query", "key", "value"))
        q, k, v = (t.view(s, b, heads, hn) for t in (q, k, v))
    proj = layer.self_attention.proj
    attn = _sdpa(q, k, v, causal=True) @ proj.weight.t() + proj.bias
    h1 = (ln1 if post else x) + attn
    ln2 = torch.nn.functional.layer_norm(h1, (hidden,), mlp.layer_norm_weight, mlp.layer_norm_bias, 1e-5)
    out = _tanh_gelu(ln2 @ mlp.fc1_weight.t() + mlp.fc1_bias) @ mlp.fc2_weight.t() + mlp.fc2_bias
    ref = (ln2 if post else h1) + out
    torch.testing.assert_close(layer(x), ref, rtol=1e-5, atol=1e-6)


def test_parallel_attention_mlp_adds_both_blocks_of_the_input():
    """TE transformer.py 868-944 (parallel_attention_mlp): self attention and layernorm_mlp both read the
    layer's input (return_bias=False), and the output is x + dropout(attn(x) + mlp(x))."""
    torch.manual_seed(4)
    layer = te.TransformerLayer(
        32, 64, 2, hidden_dropout=0.0, attention_dropout=0.0, params_dtype=torch.float64, parallel_attention_mlp=True
    )
    x = torch.randn(6, 2, 32, dtype=torch.float64)
    ref = x + (layer.self_attention(x) + layer.layernorm_mlp(x))
    torch.testing.assert_close(layer(x), ref, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"layer_type": "decoder"}, "parallel_attention requires layer_type='encoder', but got layer_type='decoder'"),
        (
            {"apply_residual_connection_post_layernorm": True},
            "parallel_attention and apply_residual_connection_post_layernorm are not supported simultaneously.",
        ),
        ({"output_layernorm": True}, "parallel_attention and output_layernorm are not supported simultaneously."),
    ],
)
def test_parallel_attention_mlp_refusals_are_tes(kwargs, message):
    """TE transformer.py 376-389."""
    with pytest.raises(ValueError, match=f"^{message}$".replace("(", r"\(").replace(")", r"\)")):
        te.TransformerLayer(32, 64, 2, parallel_attention_mlp=True, **kwargs)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("fp8", [False, True])
def test_transformer_layer_follows_torch_autocast(dtype, fp8):
    """TE transformer.py 864-866: under AMP the layer casts its input to the autocast dtype, so the
    residuals and the output are in that dtype; the same as feeding the cast input outside autocast
    with modules whose activation dtype is the autocast dtype (fp8sim kept float32)."""
    from contextlib import nullcontext

    torch.manual_seed(6)
    layer = te.TransformerLayer(32, 64, 2, hidden_dropout=0.0, attention_dropout=0.0, params_dtype=torch.float32)
    x = torch.randn(16, 2, 32)
    fp8_ctx = (lambda: te.autocast(recipe=Float8CurrentScaling())) if fp8 else nullcontext
    with torch.autocast("cpu", dtype=dtype), fp8_ctx():
        y = layer(x)
    assert y.dtype == dtype
    with torch.autocast("cpu", dtype=dtype), fp8_ctx():
        attn = layer.self_attention(x.to(dtype))
        h = x.to(dtype) + attn
        ref = h + layer.layernorm_mlp(h)
    assert ref.dtype == dtype and torch.equal(y, ref)


def test_transformer_layer_fuse_wgrad_accumulation_writes_main_grad():
    """TE transformer.py 432-445 and 505-512 hand fuse_wgrad_accumulation to MultiheadAttention (its
    GEMMs) and LayerNormMLP: each GEMM weight's gradient is added into main_grad, as plain Linear does
    (fp8sim dropped the flag).  Reference: the weight gradients of the same layer without fusion."""
    torch.manual_seed(7)
    kw = dict(hidden_dropout=0.0, attention_dropout=0.0, fuse_qkv_params=True)
    fused = te.TransformerLayer(32, 64, 2, fuse_wgrad_accumulation=True, **kw)
    plain = te.TransformerLayer(32, 64, 2, **kw)
    plain.load_state_dict(fused.state_dict())
    gemm_weights = [
        n for n, _ in fused.named_parameters() if n.endswith(("qkv.weight", "proj.weight", "fc1_weight", "fc2_weight"))
    ]
    assert len(gemm_weights) == 4
    start = {}
    for n, p in fused.named_parameters():
        p.main_grad = torch.randn_like(p)
        start[n] = p.main_grad.clone()
    x = torch.randn(8, 2, 32)
    fused(x).sum().backward()
    plain(x).sum().backward()
    plain_params = dict(plain.named_parameters())
    for n in gemm_weights:
        p = dict(fused.named_parameters())[n]
        assert torch.equal(p.main_grad, start[n] + plain_params[n].grad), n


def test_decoder_and_output_layernorm():
    torch.manual_seed(3)
    layer = te.TransformerLayer(
        32,
        64,
        2,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        layer_type="decoder",
        output_layernorm=True,
        normalization="RMSNorm",
        params_dtype=torch.float64,
    )
    assert not hasattr(layer.self_attention, "layernorm_qkv") and hasattr(layer, "inter_attention")
    x, enc = torch.randn(6, 2, 32, dtype=torch.float64), torch.randn(4, 2, 32, dtype=torch.float64)
    h1 = x + layer.self_attention(x)
    h2 = h1 + layer.inter_attention(h1, encoder_output=enc)
    ref = layer.layernorm(h2 + layer.layernorm_mlp(h2))
    torch.testing.assert_close(layer(x, encoder_output=enc), ref, rtol=0, atol=0)


RECIPES = {
    "delayed": lambda: DelayedScaling(fp8_dpa=True, fp8_mha=True, amax_history_len=4),
    "current": lambda: Float8CurrentScaling(fp8_dpa=True),
    "mxfp8": lambda: MXFP8BlockScaling(fp8_dpa=True),
}


@pytest.mark.parametrize("name", list(RECIPES))
def test_te_style_training_loop_reduces_loss(name):
    torch.manual_seed(4)
    hidden, heads, s, b = 64, 2, 128, 1  # MXFP8 attention needs s % 128 == 0 and head_dim % 32 == 0
    layer = te.TransformerLayer(hidden, 128, heads, hidden_dropout=0.0, attention_dropout=0.0, fuse_qkv_params=True)
    opt = torch.optim.Adam(layer.parameters(), lr=3e-3)
    x = torch.randn(s, b, hidden)
    target = torch.randn(s, b, hidden) * 0.5
    recipe = RECIPES[name]()
    losses = []
    for _ in range(6):
        with te.autocast(recipe=recipe):
            out = layer(x)
        loss = torch.nn.functional.mse_loss(out, target)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0], losses
    dpa = layer.self_attention.core_attention
    if name != "mxfp8":
        assert dpa.fwd.scale[8] != 1.0  # the S slot moved off its initial scale


def test_attention_slots_follow_hand_computed_trajectory_in_transformer_layer():
    """DelayedScaling(fp8_dpa=True, fp8_mha=True, amax_history_len=2), two steps: QKV (fwd slot 2) holds
    max|q,k,v| of the DPA input and dO (bwd slot 3) max|dO|; scales are 448 / max(history) and
    57344 / max(history) (spec 4.5), updated at autocast exit and at the end of the backward."""
    torch.manual_seed(5)
    layer = te.TransformerLayer(32, 64, 2, hidden_dropout=0.0, attention_dropout=0.0)
    dpa = layer.self_attention.core_attention
    seen = {}
    dpa.register_forward_hook(lambda m, a, o: seen.update(qkv=max(float(t.detach().abs().max()) for t in a[:3])))
    dpa.register_full_backward_hook(lambda m, gi, go: seen.update(do=float(go[0].abs().max())))
    recipe = DelayedScaling(fp8_dpa=True, fp8_mha=True, amax_history_len=2)
    qkv, do = [], []
    for step in range(2):
        x = torch.randn(16, 2, 32, requires_grad=True)
        with te.autocast(recipe=recipe):
            out = layer(x)
        qkv.append(seen["qkv"])
        assert dpa.fwd.scale[2] == np.float32(448) / np.float32(max(qkv)), step  # forward: at autocast exit
        assert dpa.fwd.amax_history[1, 2] == np.float32(qkv[-1]) and dpa.fwd.amax_history[0, 2] == 0
        bwd_before = dpa.bwd.scale.copy()
        out.square().sum().backward()
        do.append(seen["do"])
        assert dpa.bwd.amax_history[1, 3] == np.float32(do[-1])
        assert dpa.bwd.scale[3] == np.float32(57344) / np.float32(max(do)), step  # backward: after the backward
        assert step > 0 or bwd_before[3] == 1.0


def test_state_dict_round_trip_restores_attention_state(monkeypatch):
    """TE's _extra_state format for every module, the DPA's included (TE's base-module pickle, loaded
    only with NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1 as in TE)."""
    monkeypatch.setenv("NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE", "1")
    torch.manual_seed(6)
    recipe = DelayedScaling(fp8_dpa=True, amax_history_len=3)
    layer = te.TransformerLayer(32, 64, 2, hidden_dropout=0.0, attention_dropout=0.0)
    x = torch.randn(16, 2, 32)
    for _ in range(2):
        with te.autocast(recipe=recipe):
            layer(x).sum().backward()
    sd = layer.state_dict()
    extra = sd["self_attention.core_attention._extra_state"]
    assert extra.dtype == torch.uint8 and extra.numel() > 0
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    clone = te.TransformerLayer(32, 64, 2, hidden_dropout=0.0, attention_dropout=0.0)
    clone.load_state_dict(torch.load(buf, weights_only=False))
    a, c = layer.self_attention.core_attention, clone.self_attention.core_attention
    assert np.array_equal(a.fwd.scale, c.fwd.scale) and np.array_equal(a.bwd.amax_history, c.bwd.amax_history)
    with torch.no_grad(), te.autocast(recipe=recipe):
        assert torch.equal(layer(x), clone(x))


def test_is_first_microbatch_reuses_cached_weights():
    """TE (spec 4.9): True quantizes and caches every GEMM weight, False reuses the cached FP8 weights,
    so a later change of the GEMM weights is invisible until the next first microbatch."""
    torch.manual_seed(7)
    layer = te.TransformerLayer(32, 64, 2, hidden_dropout=0.0, attention_dropout=0.0, fuse_qkv_params=True)
    x = torch.randn(16, 2, 32)
    recipe = DelayedScaling(fp8_dpa=True)
    gemm_weights = [p for n, p in layer.named_parameters() if n.endswith("weight") and "layer_norm" not in n]
    with torch.no_grad(), te.autocast(recipe=recipe):
        first = layer(x, is_first_microbatch=True)
        for p in gemm_weights:
            p.mul_(1.5)
        cached = layer(x, is_first_microbatch=False)
        fresh = layer(x, is_first_microbatch=None)
    assert torch.equal(first, cached)
    assert not torch.equal(first, fresh)


def test_transformer_layer_bad_input():
    with pytest.raises(ValueError, match="layer_type 'middle' is not supported"):
        te.TransformerLayer(32, 64, 2, layer_type="middle")
    layer = te.TransformerLayer(32, 64, 2, self_attn_mask_type="padding")
    with pytest.raises(TypeError, match="non-bool dtypes"):
        layer(torch.randn(4, 2, 32), attention_mask=torch.zeros(2, 1, 1, 4))
    with pytest.raises(ValueError, match="self_attn_mask_type 'diagonal' is not supported"):
        layer(torch.randn(4, 2, 32), self_attn_mask_type="diagonal")


def test_dpa_extra_state_is_te_format_and_refused_without_opt_in(monkeypatch):
    monkeypatch.delenv("NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE", raising=False)
    dpa = te.DotProductAttention(2, 16, qkv_format="bshd")
    assert dpa.get_extra_state().numel() == 0  # before any FP8 step, as TE
    x = torch.randn(1, 8, 2, 16, requires_grad=True)
    with te.autocast(recipe=DelayedScaling(fp8_dpa=True, amax_history_len=5)):
        dpa(x, x, x).sum().backward()
    state = dpa.get_extra_state()
    fresh = te.DotProductAttention(2, 16, qkv_format="bshd")
    with pytest.raises(RuntimeError, match="NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1"):
        fresh.set_extra_state(state)
    monkeypatch.setenv("NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE", "1")
    fresh.set_extra_state(state)
    assert fresh.fwd.amax_history.shape == (5, 9) and np.array_equal(fresh.bwd.scale, dpa.bwd.scale)


def test_te_llama_style_block_through_the_shim_trains():
    """TE's te_llama pattern (docs/examples/te_llama): TransformerLayer(normalization="RMSNorm",
    activation="swiglu", attn_input_format="bshd", num_gqa_groups, fuse_qkv_params=False) with
    RotaryPositionEmbedding, imported as ``transformer_engine.pytorch`` under the shim."""
    import importlib

    import fp8sim.run.shim as shim

    shim.install(quiet=True)  # quiet: the once-per-process banner stays for test_shim to see
    try:
        tep = importlib.import_module("transformer_engine.pytorch")
        recipe_mod = importlib.import_module("transformer_engine.common.recipe")
        torch.manual_seed(8)
        layer = tep.TransformerLayer(
            64,
            128,
            4,
            num_gqa_groups=2,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            normalization="RMSNorm",
            activation="swiglu",
            attn_input_format="bshd",
            fuse_qkv_params=False,
            bias=False,
        )
        rope = tep.attention.RotaryPositionEmbedding(16)(32)
        x, target = torch.randn(2, 32, 64), torch.randn(2, 32, 64)
        opt = torch.optim.SGD(layer.parameters(), lr=0.05)
        recipe = recipe_mod.DelayedScaling(fp8_dpa=True, amax_history_len=8)
        losses = []
        for _ in range(5):
            with tep.autocast(recipe=recipe):
                out = layer(x, rotary_pos_emb=rope)
            loss = torch.nn.functional.mse_loss(out, target)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(float(loss.detach()))
        assert losses[-1] < losses[0], losses
    finally:
        shim.uninstall()


def test_transformer_layer_with_tp_size_2_builds_te_shards_and_needs_a_group():
    """TE transformer.py passes tp_group/tp_size/sequence_parallel/set_parallel_mode to MultiheadAttention and
    LayerNormMLP (496-530); multi_head_attention.py 327-339 (heads and GQA groups per partition), 362-475
    (QKV column-, proj row-parallel), linear.py parameters_split divided per rank; base.py prepare_forward's
    error without a group.  The 2-rank run is in tests/test_distributed_te_tp.py."""
    layer = te.TransformerLayer(32, 64, 4, num_gqa_groups=2, tp_size=2, set_parallel_mode=True, sequence_parallel=True)
    att = layer.self_attention
    assert (att.num_attention_heads_per_partition, att.num_gqa_groups_per_partition) == (2, 1)
    shapes = {n: tuple(p.shape) for n, p in layer.named_parameters() if n.endswith("weight")}
    assert shapes["self_attention.layernorm_qkv.query_weight"] == (16, 32)
    assert shapes["self_attention.layernorm_qkv.key_weight"] == (8, 32)
    assert shapes["self_attention.proj.weight"] == (32, 16)
    assert shapes["layernorm_mlp.fc1_weight"] == (32, 32) and shapes["layernorm_mlp.fc2_weight"] == (32, 32)
    assert layer.sequence_parallel and att.proj.sequence_parallel and layer.layernorm_mlp.sequence_parallel
    with pytest.raises(RuntimeError, match="Tensor parallel group not initialized"):
        layer(torch.randn(8, 1, 32))
    group = object()  # TE: TransformerLayer.set_tensor_parallel_group reaches every submodule that has one
    layer.set_tensor_parallel_group(group)
    assert att.tp_group is group and att.proj.tp_group is group and layer.layernorm_mlp.tp_group is group
    assert att.layernorm_qkv.tp_group is group
    with pytest.raises(AssertionError, match="GQA groups must be divisible by tensor parallel size"):
        te.MultiheadAttention(32, 4, num_gqa_groups=1, tp_size=2, set_parallel_mode=True)
    with pytest.raises(NotImplementedError, match="needs set_parallel_mode=True"):
        te.TransformerLayer(32, 64, 2, tp_size=2)
    one = te.TransformerLayer(32, 64, 2, tp_size=1, set_parallel_mode=True, sequence_parallel=True)
    assert not one.sequence_parallel and tuple(one.self_attention.proj.weight.shape) == (32, 32)


def test_submodule_names_reach_custom_recipe_roles():
    """TE names the GEMM submodules after the parent (``transformer.py``: ``.self_attention``,
    ``.layernorm_mlp``; ``multi_head_attention.py``: ``.layernorm_linear_qkv``, ``.core_attention``, ``.proj``),
    and a ``CustomRecipe`` factory sees those names in ``QuantizerRole.name`` (TE's
    test_custom_recipe.py ``test_custom_recipe_quantization_targets``)."""
    from fp8sim.pytorch.custom_recipes.quantizer_factories import current_scaling_factory
    from fp8sim.recipe import CustomRecipe

    names = set()

    def factory(role):
        if role is not None:
            names.add(role.name)
        return current_scaling_factory(role)

    layer = te.TransformerLayer(32, 64, 4, hidden_dropout=0.0, attention_dropout=0.0, name="tl0")
    with te.autocast(recipe=CustomRecipe(qfactory=factory)):
        layer(torch.randn(8, 2, 32)).sum().backward()
    want = {f"tl0.self_attention.{n}" for n in ("layernorm_linear_qkv", "proj")}
    want |= {f"tl0.layernorm_mlp.{n}" for n in ("fc1", "fc2")}
    assert want <= names, sorted(names)
    assert layer.self_attention.core_attention.name == "tl0.self_attention.core_attention"
    unnamed = te.MultiheadAttention(32, 4)
    assert unnamed.proj.name is None and unnamed.qkv.name is None  # TE: None without a parent name
