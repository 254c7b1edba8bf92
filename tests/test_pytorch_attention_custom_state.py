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
