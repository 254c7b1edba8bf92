"""Attention semantics found untested by the second mutation sample of ``pytorch-attention`` (seed 31;
``reports/mutation_pytorch_attention.md``), each against an independent oracle:

- MXFP8 attention (``MXFP8BlockScaling``): dV = P^T dO takes dO blocked by 32 along the query sequence (the GEMM's
  reduction axis), checked bit for bit with ``tests/test_pytorch_attention_fp8.py``'s reference (its MX cast written
  with ml_dtypes and numpy bit operations); ``mxfp8_softmax="mxfp8"`` blocks P by 32 along the keys before P V.
- ``fp8sim explain``: an attention GEMM's ``batch`` is the number of matrix products torch's broadcasting makes
  (K and V of batch 1 broadcast over the queries' batch).
- TE's messages and names: the ``qkv_format`` check (``dot_product_attention.py`` 1756-1763 at d0067d0), the pickled
  extra state refusal for ``self.__class__.__name__`` (``module/base.py`` 1427-1439, ``_extra_state.py`` 88-94),
  ``MultiheadAttention``'s unnamed ``query_layer`` (``multi_head_attention.py`` 429-437: no ``name=``, unlike
  ``.linear_kv``, 447) and the boundary role naming it ``""`` (``qkv_linear.name or ""``, 551-558).
"""

from __future__ import annotations

import math

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

from test_pytorch_attention_fp8 import E4, _assert_bits, _bhsd, _run, mx, reference  # noqa: E402
from test_pytorch_mha_quantizer_roles import _mha, _Recorder, _role, _slot_roles  # noqa: E402

import fp8sim.pytorch as te  # noqa: E402
from fp8sim import recipe  # noqa: E402
from fp8sim.pytorch.attention import DotProductAttention  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _mx_data(seed: int) -> list[torch.Tensor]:
    b, s, h, d = 1, 128, 1, 32
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, s, h, d, generator=g) for _ in range(4)]


def test_mxfp8_dv_takes_do_blocked_along_the_query_sequence() -> None:
    """dO's rows scaled by 2^0 ... 2^-15: blocks along d (one row each) keep every row's precision, blocks along
    the sequence (32 rows) flush the small rows; dV must equal the reference's, whose dO is blocked along the
    sequence (a d-blocked dO is not computed here)."""
    q, k, v, do = _mx_data(31)
    do = do * torch.pow(2.0, -(torch.arange(128) % 16).float()).view(1, 128, 1, 1)
    dpa = DotProductAttention(1, 32, qkv_format="bshd", attn_mask_type="causal")
    out, grads = _run(dpa, recipe.MXFP8BlockScaling(fp8_dpa=True), q, k, v, do, accumulator=None)
    ref_out, ref_grads = reference(*(_bhsd(t) for t in (q, k, v, do)), 32**-0.5, True, "mxfp8")
    _assert_bits(_bhsd(out.reshape(q.shape)), ref_out, "O")
    for name, got, want in zip("QKV", grads, ref_grads, strict=True):
        _assert_bits(_bhsd(got), want, f"d{name}")


def test_mxfp8_softmax_blocks_p_along_the_keys_under_the_mxfp8_recipe() -> None:
    """``MXFP8BlockScaling`` with ``mxfp8_softmax="mxfp8"``: O = mx(P) mx(V), P blocked by 32 along the keys (E4M3),
    P = softmax(mx(Q) mx(K)^T / sqrt(d)), causal; and dV = mx(P)^T dO with P blocked along the queries."""
    q, k, v, do = _mx_data(32)
    dpa = DotProductAttention(1, 32, qkv_format="bshd", attn_mask_type="causal", mxfp8_softmax="mxfp8")
    out, (_, _, dv) = _run(dpa, recipe.MXFP8BlockScaling(fp8_dpa=True), q, k, v, do, accumulator=None)
    qb, kb, vb, dob = (t[0, :, 0] for t in (q, k, v, do))
    causal = torch.ones(128, 128, dtype=torch.bool).triu(1)
    p = torch.softmax((mx(qb, E4, -1) @ mx(kb, E4, -1).T * 32**-0.5).masked_fill(causal, float("-inf")), dim=-1)
    _assert_bits(out.reshape(128, 32), mx(p, E4, -1) @ mx(vb, E4, -2), "O")
    _assert_bits(dv.reshape(128, 32), mx(p, E4, -2).T @ mx(dob, E4, -2), "dV")


def test_explain_batch_is_the_broadcast_batch_of_each_attention_gemm() -> None:
    """K and V of batch 1 broadcast over the queries' batch of 2 (torch.matmul's rule): every GEMM runs
    2 x heads products, and its plan says so."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 8, 2, 16, generator=g, requires_grad=True)
    k, v = (torch.randn(1, 8, 2, 16, generator=g, requires_grad=True) for _ in range(2))
    products = math.prod(torch.matmul(q.transpose(1, 2), k.transpose(1, 2).transpose(-1, -2)).shape[:-2])
    dpa = te.DotProductAttention(2, 16, qkv_format="bshd", attn_mask_type="no_mask")
    with te.record_gemm_plans(model=dpa) as rec:
        with te.autocast(enabled=True, recipe=recipe.DelayedScaling(fp8_dpa=True)):
            out = dpa(q, k, v)
        out.float().sum().backward()
    assert products == 4 and k.grad.shape == k.shape
    assert sorted(p.role for p in rec.plans) == sorted(["QK^T", "PV", "dV", "dP", "dQ", "dK"])
    assert [p.batch for p in rec.plans] == [products] * 6


def test_qkv_format_check_has_tes_message() -> None:
    q = torch.randn(1, 2, 2, 8)
    dpa = te.DotProductAttention(2, 8, qkv_format="bshd", attn_mask_type="no_mask")
    with pytest.raises(AssertionError) as info:
        dpa(q, q, q, qkv_format="bhsd")
    assert str(info.value) == "DotProductAttention only supports qkv_format = {'sbhd', 'bshd', 'thd'}!"


def test_pickled_extra_state_refusal_names_the_class(monkeypatch: pytest.MonkeyPatch) -> None:
    """TE refuses a pickled delayed-scaling state without ``NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1``, naming the
    module's class (``context = self.__class__.__name__``)."""
    dpa = te.DotProductAttention(2, 16, qkv_format="bshd", attn_mask_type="no_mask")
    q = torch.randn(1, 8, 2, 16, requires_grad=True)
    with te.autocast(enabled=True, recipe=recipe.DelayedScaling(fp8_dpa=True)):
        dpa(q, q, q).float().sum().backward()
    blob = dpa.get_extra_state()
    monkeypatch.delenv("NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE", raising=False)
    with pytest.raises(RuntimeError) as info:
        te.DotProductAttention(2, 16).set_extra_state(blob)
    want = "Refusing to load pickled Transformer Engine extra state for DotProductAttention. "
    assert str(info.value).startswith(want)


def test_mha_size_messages_name_hidden_size() -> None:
    with pytest.raises(ValueError) as info:
        te.MultiheadAttention(0, 2)
    assert str(info.value) == "hidden_size must be an int >= 1, got 0"


def test_mha_hands_inference_params_to_attention_which_refuses_kv_caching() -> None:
    mha = te.MultiheadAttention(16, 2, attention_dropout=0.0)
    with pytest.raises(NotImplementedError) as info:
        mha(torch.randn(4, 1, 16), inference_params=object())
    assert str(info.value) == "fp8sim does not emulate KV caching (inference_params)"


def test_cross_attention_query_linear_is_unnamed_as_in_te() -> None:
    """TE names ``.linear_kv`` but not the query ``Linear`` of cross attention without an input norm, so the roles
    of its quantizers and DPA's grad-input boundary role carry the name ``""``."""
    mha = _mha(attention_type="cross", input_layernorm=False)
    names = (mha.query_layer.name, mha.key_value.name, mha.core_attention.name)
    assert names == (None, "mha.linear_kv", "mha.core_attention")
    x = torch.randn(16, 2, 32, dtype=torch.bfloat16)
    with pytest.warns(UserWarning, match="keeps the QKV output"):
        with te.autocast(recipe=recipe.CustomRecipe(qfactory=_Recorder(), fp8_mha=True)):
            out = mha(x, encoder_output=torch.randn(16, 2, 32, dtype=torch.bfloat16))
    out.float().sum().backward()
    assert _slot_roles(mha.core_attention)[1][0] == _role("linear", "grad_output", "")
    assert {r.name for r in _slot_roles(mha.query_layer)[0] if r is not None and r.module_type == "linear"} == {""}
