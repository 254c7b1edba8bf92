"""FP8 DotProductAttention under a CustomRecipe: which slots the delayed-scaling requests of S and dP drive, and
when the slot quantizers are made again.

TE (``dot_product_attention.py`` / ``utils.py`` at d0067d0): S is forward slot ``META_S = 8``, dP backward slot
``META_DP = 5`` (``get_attention_quantizers``); the quantizers come from ``qfactory`` when the recipe state is built
(``set_meta_tensor``), not at every step.
"""

from __future__ import annotations

from fp8sim.testing.oracles import require

torch = require("torch")

import fp8sim.pytorch as te  # noqa: E402
from fp8sim.pytorch.attention import DotProductAttention  # noqa: E402
from fp8sim.pytorch.quantization import DelayedScalingRequest  # noqa: E402
from fp8sim.recipe import CustomRecipe  # noqa: E402

E4, E5 = te.DType.kFloat8E4M3, te.DType.kFloat8E5M2


def _factory(qkv_dtype=E4, calls: list | None = None):
    def factory(role):  # noqa: ANN001, ANN202
        if calls is not None:
            calls.append(role)
        if role.module_type == "dpa" and role.tensor_type in ("s", "dp"):
            return DelayedScalingRequest(amax_history_len=1, amax_compute_algo="most_recent")
        if role.module_type == "dpa" and role.tensor_type == "qkv":
            return te.Float8CurrentScalingQuantizer(qkv_dtype)
        return te.Float8CurrentScalingQuantizer(E5 if role.tensor_type == "do" or "grad" in role.name else E4)

    return factory


def _step(dpa, rec) -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 16, 2, 16, generator=g).requires_grad_() for _ in range(3))
    with te.autocast(enabled=True, recipe=rec):
        out = dpa(q, k, v, qkv_format="bshd")
    out.sum().backward()


def test_s_and_dp_amaxes_update_their_own_slots() -> None:
    """After a step the S slot (forward 8) and the dP slot (backward 5) have scales from their amaxes; the unused
    slots of their groups (forward 6, 7; backward 4) saw no amax and keep scale 1."""
    dpa = DotProductAttention(2, 16, attn_mask_type="causal")
    _step(dpa, CustomRecipe(qfactory=_factory(), fp8_dpa=True))
    fwd, bwd = dpa.quantizers["scaling_fwd"], dpa.quantizers["scaling_bwd"]
    assert float(fwd[8].scale) > 1.0 and float(bwd[5].scale) != 1.0
    assert float(fwd[6].scale) == float(fwd[7].scale) == float(bwd[4].scale) == 1.0


def test_slot_quantizers_are_made_again_only_for_another_recipe() -> None:
    calls_a: list = []
    calls_b: list = []
    factory_a = _factory(E4, calls_a)
    dpa = DotProductAttention(2, 16, attn_mask_type="causal")
    _step(dpa, CustomRecipe(qfactory=factory_a, fp8_dpa=True))
    made = len(calls_a)
    assert made == 15  # 9 forward and 6 backward slots
    _step(dpa, CustomRecipe(qfactory=factory_a, fp8_dpa=True))  # an equal recipe: the same quantizers
    assert len(calls_a) == made
    dpa.init_fp8_meta_tensors(CustomRecipe(qfactory=_factory(E5, calls_b), fp8_dpa=True))
    assert dpa.quantizers["scaling_fwd"][2].dtype == E5 and len(calls_b) == 15
    _step(dpa, CustomRecipe(qfactory=factory_a, fp8_dpa=True))  # back to A: A's quantizers, made again
    assert dpa.quantizers["scaling_fwd"][2].dtype == E4 and len(calls_a) == 2 * made


def test_unnamed_module_roles_are_tes_hint_roles() -> None:
    """TE ``get_quantizer_roles`` (1343-1376): ``name = self.name or ""``; boundary slots without a consumer get a
    hint role named ``dpa_output`` / ``dpa_grad_input`` (prefixed ``<name>.`` only for a named module)."""
    from fp8sim.pytorch.tensor import QuantizerRole

    calls: list = []
    dpa = DotProductAttention(2, 16, attn_mask_type="causal")
    _step(dpa, CustomRecipe(qfactory=_factory(E4, calls), fp8_dpa=True))
    qkv, s = (QuantizerRole(module_type="dpa", tensor_type=t, name="") for t in ("qkv", "s"))
    do, dp = (QuantizerRole(module_type="dpa", tensor_type=t, name="") for t in ("do", "dp"))
    o, dqkv = QuantizerRole(name="dpa_output"), QuantizerRole(name="dpa_grad_input")
    assert calls == [qkv] * 3 + [o] * 3 + [s] * 3 + [dqkv] * 2 + [do] * 2 + [dp] * 2


def test_custom_mxfp8_slots_with_mxfp8_softmax_block_p_by_32() -> None:
    """MXFP8 slot quantizers run TE's MXFP8 flow; ``mxfp8_softmax="mxfp8"`` blocks P along the keys (E4M3, the QKV
    slot's dtype) before ``P V``: O = mx(P) mx(V) with P = softmax(mx(Q) mx(K)^T / sqrt(d)), causal."""
    import ml_dtypes
    from test_pytorch_attention_fp8 import mx

    s, d = 128, 32
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, s, 1, d, generator=g) for _ in range(3))

    def factory(role):  # noqa: ANN001, ANN202
        return te.MXFP8Quantizer(E5 if role.tensor_type in ("do", "dp") or "grad" in role.name else E4)

    do = torch.randn(1, s, d, generator=g)
    outs, dqs = {}, {}
    for soft in ("mxfp8", "none"):
        dpa = DotProductAttention(1, d, qkv_format="bshd", attn_mask_type="causal", mxfp8_softmax=soft)
        qq = q.clone().requires_grad_()
        with te.autocast(enabled=True, recipe=CustomRecipe(qfactory=factory, fp8_dpa=True)):
            out = dpa(qq, k, v)
        out.backward(do)
        outs[soft], dqs[soft] = out.detach().reshape(s, d), qq.grad.reshape(s, d)
    e4, e5 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2
    qb, kb, vb = (t[0, :, 0] for t in (q, k, v))
    causal = torch.ones(s, s, dtype=torch.bool).triu(1)
    p = torch.softmax((mx(qb, e4, -1) @ mx(kb, e4, -1).T * d**-0.5).masked_fill(causal, float("-inf")), dim=-1)
    want = mx(p, e4, -1) @ mx(vb, e4, -2)
    assert torch.equal(outs["mxfp8"], want)
    assert not torch.equal(outs["none"], want)
    # backward: dS = P (dO V^T - rowsum(dO * O)) blocked along the keys in the dP slot's dtype (the dO slot's, E5M2)
    do_r = mx(do[0], e5, -1)
    ds = p * (do_r @ mx(vb, e4, -1).T - (do_r * want).sum(-1, keepdim=True))
    want_dq = mx(ds, e5, -1) @ mx(kb, e4, -2) * d**-0.5
    torch.testing.assert_close(dqs["mxfp8"], want_dq, rtol=1e-6, atol=1e-6)
    assert not torch.equal(dqs["none"], dqs["mxfp8"])
