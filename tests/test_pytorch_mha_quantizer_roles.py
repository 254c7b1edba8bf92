"""``MultiheadAttention``'s boundary quantizer roles (issue 27), against TE's source at d0067d0:
``attention/multi_head_attention.py`` ``_update_output_quantizer_roles`` (483-559: the four boundary roles)
and ``forward`` (877-926: under a ``CustomRecipe`` with ``fp8_mha`` the roles ``(rotary_pos_emb is None, True,
True)`` are set before DPA's recipe state is made, then ``get_qkv_quantization_capabilities``; otherwise
``(qkv_fp8_output, proj_fp8_grad, dpa_fp8_output)`` from the recipe's flags).  The expected lists below are
written from that source; the slot layouts from ``module/linear.py`` / ``layernorm_linear.py``
``get_quantizer_roles`` (output slot 2, grad-input slot 1) and ``dot_product_attention.py``
``get_quantizer_roles`` (O slots 3-5, dQKV slots 0-1)."""

from __future__ import annotations

import sys

from fp8sim.testing.oracles import require

torch = require("torch")
import pytest  # noqa: E402

import fp8sim.pytorch as te  # noqa: E402
from fp8sim import recipe  # noqa: E402
from fp8sim.pytorch.tensor import DelayedScalingRequest, QuantizerRole  # noqa: E402


def _role(module_type: str, tensor_type: str, name: str) -> QuantizerRole:
    return QuantizerRole(module_type=module_type, tensor_type=tensor_type, name=name)


class _Recorder:
    """A role-dispatching qfactory (TE's contract: S and dP of the delayed kind) that records every role."""

    def __init__(self) -> None:
        self.seen: list = []

    def __call__(self, role):  # noqa: ANN001, ANN204
        self.seen.append(role)
        if role is not None and role.module_type == "dpa" and role.tensor_type in ("s", "dp"):
            return DelayedScalingRequest(amax_history_len=1, amax_compute_algo="most_recent")
        grad = role is not None and (role.tensor_type in ("grad_output", "do") or "grad" in role.name)
        return te.Float8CurrentScalingQuantizer(te.DType.kFloat8E5M2 if grad else te.DType.kFloat8E4M3)


def _mha(**kw) -> torch.nn.Module:  # noqa: ANN003
    return te.MultiheadAttention(32, 2, attention_dropout=0.0, params_dtype=torch.bfloat16, name="mha", **kw)


def _run(mha: torch.nn.Module, rec: recipe.Recipe | None, **kw) -> None:  # noqa: ANN003
    x = torch.randn(16, 2, 32, dtype=torch.bfloat16, requires_grad=True)
    with te.autocast(enabled=rec is not None, recipe=rec):
        out = mha(x, **kw)
    out.float().sum().backward()


def _slot_roles(m: torch.nn.Module) -> tuple[list, list]:
    return list(m.fp8_meta["scaling_fwd"].roles), list(m.fp8_meta["scaling_bwd"].roles)


def _boundaries(mha: torch.nn.Module, qkv_linears: tuple) -> dict:
    dpa = mha.core_attention
    return {
        **{f"{m.name}.output": m.output_quantizer_role for m in qkv_linears},
        "proj.grad_input": mha.proj.grad_input_quantizer_role,
        "dpa.output": dpa.output_quantizer_role,
        "dpa.grad_input": dpa.grad_input_quantizer_role,
    }


def test_custom_fp8_mha_boundary_slots_get_their_consumers_roles() -> None:
    """Self attention without a norm: each boundary slot's quantizer is made for the consumer's role."""
    factory = _Recorder()
    mha = _mha()
    core, proj, qkv = "mha.core_attention", mha.proj.name, mha.qkv.name
    assert (core, proj) == (mha.core_attention.name, "mha.proj")
    with pytest.warns(UserWarning, match="keeps the QKV output.*in high precision") as record:
        _run(mha, recipe.CustomRecipe(qfactory=factory, fp8_mha=True))
        _run(mha, recipe.CustomRecipe(qfactory=factory, fp8_mha=True))
    mine = [w for w in record if "fp8_mha=True keeps" in str(w.message)]
    assert len(mine) == 1  # once per module
    # at the caller's line; mutmut's trampoline is one frame more, so the stacklevel is judged on plain source
    if not hasattr(sys.modules[te.MultiheadAttention.__module__], "_mutmut_mutated"):
        assert mine[0].filename == __file__
    fwd, bwd = _slot_roles(mha.qkv)
    assert fwd[2] == _role("dpa", "qkv", core) and bwd[1] is None
    fwd, bwd = _slot_roles(mha.proj)
    assert fwd[2] is None and bwd[1] == _role("dpa", "do", core)
    fwd, bwd = _slot_roles(mha.core_attention)
    assert fwd[3:6] == [_role("linear", "input", proj)] * 3
    assert bwd[0:2] == [_role("linear", "grad_output", qkv)] * 2
    for want in (_role("dpa", "qkv", core), _role("dpa", "do", core), _role("linear", "grad_output", qkv)):
        assert want in factory.seen  # the factory was asked for the consumer's role
    # no hint-only roles: every boundary was wired before DPA's state was made
    assert not any(r is not None and r.name.endswith(("dpa_output", "dpa_grad_input")) for r in factory.seen)


def test_custom_fp8_mha_roles_with_rope_and_cross_attention() -> None:
    """RoPE: TE leaves the QKV output's role None; cross attention labels both query and key_value GEMMs, and
    DPA's grad input names the query GEMM (``layernorm_query`` with a norm)."""
    rec = recipe.CustomRecipe(qfactory=_Recorder(), fp8_mha=True)
    mha = _mha()
    rope = te.RotaryPositionEmbedding(16)(16)
    _run(mha, rec, rotary_pos_emb=rope)
    b = _boundaries(mha, (mha.qkv,))
    assert b[f"{mha.qkv.name}.output"] is None and b["proj.grad_input"] == _role("dpa", "do", "mha.core_attention")
    assert _slot_roles(mha.qkv)[0][2] is None

    cross = _mha(attention_type="cross", input_layernorm=True)
    x = torch.randn(16, 2, 32, dtype=torch.bfloat16)
    with te.autocast(recipe=rec):
        cross(x, encoder_output=torch.randn(16, 2, 32, dtype=torch.bfloat16)).float().sum().backward()
    qkv_role = _role("dpa", "qkv", "mha.core_attention")
    assert cross.layernorm_query.output_quantizer_role == qkv_role == cross.key_value.output_quantizer_role
    assert _slot_roles(cross.key_value)[0][2] == qkv_role == _slot_roles(cross.layernorm_query)[0][2]
    assert _slot_roles(cross.core_attention)[1][0] == _role("linear", "grad_output", cross.layernorm_query.name)


@pytest.mark.parametrize(
    ("rec", "qkv_out", "proj_grad", "dpa_out"),
    [
        (recipe.DelayedScaling(fp8_dpa=True), False, True, True),
        (recipe.DelayedScaling(fp8_mha=True), True, True, True),
        (recipe.Float8CurrentScaling(fp8_mha=True), False, False, True),  # CS: no FP8 QKV output, no FP8 dgrad
        (recipe.MXFP8BlockScaling(fp8_dpa=True), False, False, False),
        (recipe.CustomRecipe(qfactory=_Recorder(), fp8_dpa=True), False, False, False),  # custom: fp8_mha only
        (None, False, False, False),  # outside FP8
    ],
    ids=["ds-dpa", "ds-mha", "cs-mha", "mxfp8-dpa", "custom-dpa", "off"],
)
def test_boundary_roles_follow_the_recipe_flags(rec, qkv_out, proj_grad, dpa_out) -> None:  # noqa: ANN001
    mha = _mha(input_layernorm=True)
    mha.proj.grad_input_quantizer_role = _role("stale", "stale", "stale")  # TE resets a flag that is off
    kw = {}
    if isinstance(rec, recipe.MXFP8BlockScaling):
        with te.autocast(recipe=rec):  # MXFP8 attention needs s % 128: the roles are set before DPA runs
            with pytest.raises(AssertionError, match="MXFP8 quantization requires"):
                mha(torch.randn(16, 2, 32, dtype=torch.bfloat16))
    else:
        _run(mha, rec, **kw)
    core, qkv = "mha.core_attention", mha.layernorm_qkv.name
    assert _boundaries(mha, (mha.layernorm_qkv,)) == {
        f"{qkv}.output": _role("dpa", "qkv", core) if qkv_out else None,
        "proj.grad_input": _role("dpa", "do", core) if proj_grad else None,
        "dpa.output": _role("linear", "input", "mha.proj") if dpa_out else None,
        "dpa.grad_input": _role("linear", "grad_output", qkv) if dpa_out else None,
    }


def test_custom_fp8_mha_refuses_a_qkv_quantizer_dpa_cannot_take() -> None:
    """TE ``get_qkv_quantization_capabilities`` (dot_product_attention.py 1163-1214), called by MHA before
    DPA runs: a QKV slot quantizer other than Float8 / Float8CurrentScaling / MXFP8 is a TypeError."""

    def factory(role):  # noqa: ANN001, ANN202
        if role is not None and role.module_type == "dpa" and role.tensor_type == "qkv":
            return te.Float8BlockQuantizer(te.DType.kFloat8E4M3, rowwise=True, columnwise=True)
        return _Recorder()(role)

    with pytest.raises(TypeError, match=r"Unsupported CustomRecipe quantizer for .*qkv.*: Float8BlockQuantizer"):
        _run(_mha(), recipe.CustomRecipe(qfactory=factory, fp8_mha=True))
    dpa = te.DotProductAttention(2, 16)
    with pytest.raises(RuntimeError, match="did not materialize the canonical QKV quantizer"):
        dpa.get_qkv_quantization_capabilities()  # outside FP8: no quantizers, as TE
    with te.autocast(recipe=recipe.Float8CurrentScaling(fp8_dpa=True)):
        assert dpa.get_qkv_quantization_capabilities() == (True, False)
    with te.autocast(recipe=recipe.DelayedScaling(fp8_dpa=True)):
        assert dpa.get_qkv_quantization_capabilities() == (False, False)
