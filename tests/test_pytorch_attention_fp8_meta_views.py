"""DotProductAttention's ``fp8_meta`` / ``quantizers`` after its scaler is replaced or the module copied, and
``get_qkv_quantization_capabilities`` (TE ``dot_product_attention.py`` at d0067d0: ``init_fp8_metadata(num_gemms=3)``
1168 and 1128, the capabilities 1163-1212, ``set_meta_tensor``'s ``[CS, DS]`` split of current scaling 1218-1290).

The states are live views of the module's delayed-scaling arrays (fp8sim's contract, ``fp8_meta.py``): what the
module loads or updates is what ``fp8_meta`` shows, in a copy too.
"""

from __future__ import annotations

import copy
import re

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

import fp8sim.pytorch as te  # noqa: E402
from fp8sim import recipe  # noqa: E402


def _step(dpa, rec) -> None:
    q, k, v = (torch.randn(1, 16, 2, 16, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    with te.autocast(enabled=True, recipe=rec):
        out = dpa(q, k, v, qkv_format="bshd")
    out.float().sum().backward()


def _dpa(name: str | None = None):
    return te.DotProductAttention(2, 16, qkv_format="bshd", attn_mask_type="causal", name=name)


def _extra(hist: int, base: float) -> dict:
    return {
        "fwd_scale": torch.arange(9, dtype=torch.float32) + base,
        "fwd_amax_history": torch.arange(hist * 9, dtype=torch.float32).view(hist, 9) + base,
        "bwd_scale": torch.arange(6, dtype=torch.float32) + 2 * base,
        "bwd_amax_history": torch.arange(hist * 6, dtype=torch.float32).view(hist, 6) + 2 * base,
    }


def test_fp8_meta_names_the_recipe_and_three_gemms() -> None:
    dpa = _dpa()
    rec = recipe.DelayedScaling(fp8_dpa=True, amax_history_len=4)
    _step(dpa, rec)
    meta = dpa.fp8_meta
    assert meta["recipe"] is rec and meta["num_gemms"] == 3
    assert set(dpa.quantizers) == {"scaling_fwd", "scaling_bwd"}


@pytest.mark.parametrize("hist", [2, 4])
def test_delayed_state_follows_a_loaded_extra_state_of_another_history_length(hist: int) -> None:
    dpa = _dpa()
    _step(dpa, recipe.DelayedScaling(fp8_dpa=True, amax_history_len=4))
    before = dpa.fp8_meta["scaling_fwd"]
    state = _extra(hist, 10.0)
    dpa.set_extra_state(state)
    fwd, bwd = dpa.fp8_meta["scaling_fwd"], dpa.fp8_meta["scaling_bwd"]
    assert isinstance(fwd, type(before)) and fwd.mode == "forward" and bwd.mode == "backward"
    assert torch.equal(fwd.scale, state["fwd_scale"]) and torch.equal(fwd.amax_history, state["fwd_amax_history"])
    assert torch.equal(bwd.scale, state["bwd_scale"]) and torch.equal(bwd.amax_history, state["bwd_amax_history"])
    assert len(dpa.quantizers["scaling_fwd"]) == 9 and len(dpa.quantizers["scaling_bwd"]) == 6


@pytest.mark.parametrize("hist", [1, 3])
def test_current_scaling_delayed_half_follows_a_loaded_extra_state(hist: int) -> None:
    """Current scaling: ``fp8_meta`` holds TE's DS half, the S slots (6-8) and the dP slots (4-5)."""
    dpa = _dpa()
    _step(dpa, recipe.Float8CurrentScaling(fp8_dpa=True))
    state = _extra(hist, 20.0)
    dpa.set_extra_state(state)
    fwd, bwd = dpa.fp8_meta["scaling_fwd"], dpa.fp8_meta["scaling_bwd"]
    assert (fwd.num_quantizers, bwd.num_quantizers) == (3, 2)
    assert torch.equal(fwd.scale, state["fwd_scale"][6:]) and torch.equal(bwd.scale, state["bwd_scale"][4:])
    assert torch.equal(fwd.amax_history, state["fwd_amax_history"][:, 6:])
    assert torch.equal(bwd.amax_history, state["bwd_amax_history"][:, 4:])
    assert dpa.fp8_meta["recipe"] is fwd.recipe and fwd.recipe.amax_history_len == hist


@pytest.mark.parametrize("rec", [recipe.DelayedScaling(fp8_dpa=True), recipe.Float8CurrentScaling(fp8_dpa=True)])
def test_a_deep_copy_shows_its_own_state(rec) -> None:
    dpa = _dpa()
    _step(dpa, rec)
    dup = copy.deepcopy(dpa)
    lo = 6 if rec.float8_current_scaling() else 0
    dup.fwd.scale[8] = 3.0
    dup.fwd.amax_history[0, 8] = 5.0
    meta = dup.fp8_meta["scaling_fwd"]
    assert float(meta.scale[8 - lo]) == 3.0 and float(meta.amax_history[0, 8 - lo]) == 5.0
    assert float(dpa.fp8_meta["scaling_fwd"].scale[8 - lo]) != 3.0


def test_current_scaling_quantizers_take_each_directions_format() -> None:
    """HYBRID: the CS half of the forward quantizers casts to E4M3, of the backward ones to E5M2."""
    dpa = _dpa()
    _step(dpa, recipe.Float8CurrentScaling(fp8_dpa=True, fp8_format=recipe.Format.HYBRID))
    fwd, bwd = dpa.quantizers["scaling_fwd"], dpa.quantizers["scaling_bwd"]
    assert {q.dtype for q in fwd} == {te.DType.kFloat8E4M3}
    assert {q.dtype for q in bwd} == {te.DType.kFloat8E5M2}


@pytest.mark.parametrize(
    ("rec", "caps"),
    [
        (recipe.DelayedScaling(fp8_dpa=True), (False, False)),
        (recipe.Float8CurrentScaling(fp8_dpa=True), (True, False)),
        (recipe.MXFP8BlockScaling(fp8_dpa=True), (False, True)),
    ],
)
def test_qkv_capabilities_per_recipe(rec, caps) -> None:
    dpa = _dpa()
    with te.autocast(enabled=True, recipe=rec):
        assert dpa.get_qkv_quantization_capabilities() == caps


@pytest.mark.parametrize("name", ["core", None])
def test_qkv_capabilities_without_fp8_name_the_role(name) -> None:
    dpa = _dpa(name)
    role = "module_type=dpa|tensor_type=qkv" + ("|name=core" if name else "")
    message = f"DotProductAttention did not materialize the canonical QKV quantizer for {role}."
    with pytest.raises(RuntimeError, match="^" + re.escape(message) + "$"):
        dpa.get_qkv_quantization_capabilities()


def test_qkv_capabilities_refuse_another_quantizer_class_naming_the_role() -> None:
    from fp8sim.pytorch.tensor import Float8BlockQuantizer

    def factory(role):  # noqa: ANN001, ANN202
        if role is not None and role.module_type == "dpa" and role.tensor_type == "qkv":
            return Float8BlockQuantizer(te.DType.kFloat8E4M3, rowwise=True, columnwise=True)
        return te.Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3)

    dpa = _dpa("core")
    message = "Unsupported CustomRecipe quantizer for module_type=dpa|tensor_type=qkv|name=core: Float8BlockQuantizer."
    with te.autocast(enabled=True, recipe=recipe.CustomRecipe(qfactory=factory, fp8_dpa=True)):
        with pytest.raises(TypeError, match="^" + re.escape(message) + "$"):
            dpa.get_qkv_quantization_capabilities()


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({}, (1, "most_recent", True)),
        (
            {"NVTE_DPA_FP8DS_AMAX_HISTLEN": "3", "NVTE_DPA_FP8DS_AMAX_ALGO": "max", "NVTE_DPA_FP8DS_REDUCE_AMAX": "0"},
            (3, "max", False),
        ),
    ],
)
def test_current_scaling_s_dp_recipe_is_tes(monkeypatch, env: dict, want: tuple) -> None:
    """TE ``dot_product_attention.py`` 202-207: under current scaling S and dP take a new DelayedScaling with the
    linear recipe's ``fp8_format``, ``fp8_dpa``, ``fp8_mha`` and ``NVTE_DPA_FP8DS_AMAX_HISTLEN`` (1),
    ``NVTE_DPA_FP8DS_AMAX_ALGO`` ("most_recent"), ``NVTE_DPA_FP8DS_REDUCE_AMAX`` ("1")."""
    for name in ("NVTE_DPA_FP8DS_AMAX_HISTLEN", "NVTE_DPA_FP8DS_AMAX_ALGO", "NVTE_DPA_FP8DS_REDUCE_AMAX"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    dpa = _dpa()
    _step(dpa, recipe.Float8CurrentScaling(fp8_format=recipe.Format.E4M3, fp8_dpa=True, fp8_mha=True))
    ds = dpa.fp8_meta["recipe"]
    assert isinstance(ds, recipe.DelayedScaling)
    assert (ds.amax_history_len, ds.amax_compute_algo, ds.reduce_amax) == want
    assert (ds.fp8_format, ds.fp8_dpa, ds.fp8_mha) == (recipe.Format.E4M3, True, True)
