"""``CustomRecipe``'s qfactory contract, written from NVIDIA/TransformerEngine at d0067d0
``transformer_engine/pytorch/quantization.py``: ``QuantizerRole`` (lines 57-97),
``DelayedScalingRequest`` (115-145), ``CustomRecipeState.make_quantizers`` (1910-1950: one call per
slot, None refused) and ``_handle_delayed_scaling_requests`` (1754-1838: matching requests share
one delayed-scaling state whose quantizers replace them).
"""

from __future__ import annotations

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

from fp8sim.pytorch.constants import DType  # noqa: E402
from fp8sim.pytorch.tensor import (  # noqa: E402
    DelayedScalingRequest,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    QuantizerRole,
    custom_recipe_quantizers,
)
from fp8sim.recipe import CustomRecipe, Format  # noqa: E402

ROLES = [QuantizerRole("linear", t, "fc1") for t in ("input", "weight", "output")]


def test_role_str_is_tes() -> None:
    assert str(QuantizerRole()) == "QuantizerRole()"
    assert str(QuantizerRole("linear", "weight", "fc1")) == "module_type=linear|tensor_type=weight|name=fc1"
    assert str(QuantizerRole(tensor_type="input")) == "tensor_type=input"


def test_factory_is_called_once_per_role_and_requests_share_state() -> None:
    seen = []

    def qfactory(role: QuantizerRole):  # noqa: ANN202
        seen.append(role)
        if role.tensor_type == "weight":
            return Float8CurrentScalingQuantizer(DType.kFloat8E4M3, "cpu")
        return DelayedScalingRequest(amax_history_len=4, fp8_format=Format.E4M3)

    out = custom_recipe_quantizers(CustomRecipe(qfactory=qfactory), ROLES)
    assert seen == ROLES
    assert isinstance(out.quantizers[1], Float8CurrentScalingQuantizer)
    assert all(isinstance(out.quantizers[i], Float8Quantizer) for i in (0, 2))
    assert out.scaler.n == 2 and out.scaler.amax_history.shape == (4, 2)
    out.quantizers[2](torch.full((4, 4), 3.0))
    assert out.scaler.amax_history[0].tolist() == [0.0, 3.0]  # slot 2 is the second request
    again = custom_recipe_quantizers(CustomRecipe(qfactory=qfactory), ROLES, existing=out.scaler)
    assert again.scaler is out.scaler  # compatible: reused, as TE keeps its predecessor's buffers


def test_none_and_mismatched_requests_are_tes_errors() -> None:
    with pytest.raises(ValueError, match=r"qfactory returned None for slot 0 \(role=module_type=linear"):
        custom_recipe_quantizers(CustomRecipe(qfactory=lambda role: None), ROLES)

    def mixed(role: QuantizerRole) -> DelayedScalingRequest:
        return DelayedScalingRequest(margin=1 if role.tensor_type == "output" else 0)

    with pytest.raises(ValueError, match="Slot 0 has margin=0, slot 2 has 1"):
        custom_recipe_quantizers(CustomRecipe(qfactory=mixed), ROLES)
    with pytest.warns(UserWarning, match="no QuantizerRole list provided"):
        out = custom_recipe_quantizers(CustomRecipe(qfactory=lambda r: DelayedScalingRequest()), None, num_quantizers=2)
    assert out.scaler.fmt.name == "e4m3"
    bwd = custom_recipe_quantizers(CustomRecipe(qfactory=lambda r: DelayedScalingRequest()), ROLES[:2], mode="backward")
    assert bwd.quantizers[0].dtype == DType.kFloat8E5M2  # HYBRID backward
