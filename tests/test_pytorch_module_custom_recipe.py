"""``CustomRecipe`` in the GEMM modules, as TE 2.20.0.dev0 (NVIDIA/TransformerEngine at d0067d0) runs it.

References, all from TE's source:
- ``tests/pytorch/test_custom_recipe.py:430-550``: each factory of ``custom_recipes/quantizer_factories.py``
  gives bit-identical output and gradients to its built-in recipe on ``Linear``, and
  ``high_precision_factory`` to the module run without autocast;
- ``tests/pytorch/test_custom_recipe.py:313-362``: one factory call per slot, forward input / weight /
  output(None), backward grad_output / grad_input(None);
- roles: ``module/linear.py:1816-1840``, ``grouped_linear.py:1841-1866``, ``layernorm_mlp.py:2185-2230``;
- ``module/base.py:1130-1136``: the state is rebuilt only for another recipe object;
- ``module/layernorm_linear.py:241-253``: the norm kernel fuses the slot's quantizer (delayed scaling:
  quantized from the float32 norm output), the built-in recipe's behaviour.
"""

from __future__ import annotations

import copy

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

import fp8sim.pytorch as te  # noqa: E402
from fp8sim import recipe as R  # noqa: E402
from fp8sim.pytorch.constants import DType  # noqa: E402
from fp8sim.pytorch.custom_recipes import quantizer_factories as F  # noqa: E402
from fp8sim.pytorch.quantization import QuantizerRole  # noqa: E402

_BUILTIN = [
    (F.delayed_scaling_factory, R.DelayedScaling),
    (F.current_scaling_factory, R.Float8CurrentScaling),
    (F.mxfp8_factory, R.MXFP8BlockScaling),
    (F.float8_block_scaling_factory, R.Float8BlockScaling),
    (F.nvfp4_factory, R.NVFP4BlockScaling),
]


def _step(model, x, rec, steps: int = 1) -> list:
    """Forward and backward ``steps`` times (the loss stresses the gradient's range, as TE's test does)."""
    for _ in range(steps):
        model.zero_grad()
        xi = x.clone().requires_grad_(True)
        with te.autocast(enabled=rec is not None, recipe=rec):
            y = model(xi)
        w = torch.ones(y.shape[-1])
        w[0], w[1] = 1e8, 1e-8
        (y.float() * w).sum().backward()
    return [y.detach(), xi.grad] + [p.grad for p in model.parameters()]


def _same(a: list, b: list) -> bool:
    return all(torch.equal(u, v) for u, v in zip(a, b, strict=True))


@pytest.mark.parametrize("module", ["Linear", "LayerNormLinear"])
@pytest.mark.parametrize("factory, builtin", _BUILTIN, ids=[f.__name__ for f, _ in _BUILTIN])
def test_factory_matches_builtin_recipe_bit_for_bit(module: str, factory, builtin) -> None:
    torch.manual_seed(42)
    base = getattr(te, module)(128, 128, params_dtype=torch.bfloat16)
    x = torch.randn(32, 128, dtype=torch.bfloat16)
    steps = 3 if builtin is R.DelayedScaling else 1  # the requested delayed-scaling state updates as TE's
    got = _step(copy.deepcopy(base), x, R.CustomRecipe(qfactory=factory), steps)
    assert _same(got, _step(copy.deepcopy(base), x, builtin(), steps))


@pytest.mark.parametrize("module", ["Linear", "LayerNormMLP"])
def test_high_precision_factory_matches_no_autocast(module: str) -> None:
    torch.manual_seed(1)
    base = getattr(te, module)(64, 64, params_dtype=torch.bfloat16)
    x = torch.randn(16, 64, dtype=torch.bfloat16)
    got = _step(copy.deepcopy(base), x, R.CustomRecipe(qfactory=F.high_precision_factory))
    assert _same(got, _step(copy.deepcopy(base), x, None))
    # negative control: a quantized recipe gives other bits
    assert not _same(_step(copy.deepcopy(base), x, R.CustomRecipe(qfactory=F.current_scaling_factory)), got)


def test_the_factory_is_honoured_per_role() -> None:
    """An E5M2 weight (the factory's choice, not the recipe's default) changes the result; E4M3 does not."""
    torch.manual_seed(3)
    base = te.Linear(64, 64, params_dtype=torch.bfloat16)
    x = torch.randn(16, 64, dtype=torch.bfloat16)

    def e5m2_weight(role):  # noqa: ANN001, ANN202
        if role is not None and role.tensor_type == "weight":
            return te.Float8CurrentScalingQuantizer(DType.kFloat8E5M2)
        return F.current_scaling_factory(role)

    ref = _step(copy.deepcopy(base), x, R.Float8CurrentScaling())
    assert not _same(_step(copy.deepcopy(base), x, R.CustomRecipe(qfactory=e5m2_weight)), ref)


def test_factory_calls_and_roles_per_module() -> None:
    seen: list = []

    def qfactory(role):  # noqa: ANN001, ANN202
        seen.append(role)
        grad = role is not None and role.tensor_type == "grad_output"
        return te.Float8CurrentScalingQuantizer(DType.kFloat8E5M2 if grad else DType.kFloat8E4M3)

    rec = R.CustomRecipe(qfactory=qfactory)
    lin = te.Linear(64, 64, params_dtype=torch.bfloat16)
    x = torch.randn(16, 64, dtype=torch.bfloat16, requires_grad=True)
    for _ in range(2):  # the same recipe object: the quantizers are kept
        with te.autocast(enabled=True, recipe=rec):
            lin(x).float().sum().backward()
    r = QuantizerRole
    assert seen == [r("linear", "input"), r("linear", "weight"), None, r("linear", "grad_output"), None]
    assert lin.quantizers["scaling_bwd"][1].dtype == DType.kFloat8E4M3  # the role=None slot (TE's test asserts it)
    # TE base.py init_fp8_metadata (d0067d0, line 1545): a recipe that compares equal (a dataclass: same
    # qfactory, same fields) keeps the state; an unequal one rebuilds it
    with te.autocast(enabled=True, recipe=R.CustomRecipe(qfactory=qfactory)):
        lin(x)
    assert len(seen) == 5
    with te.autocast(enabled=True, recipe=R.CustomRecipe(qfactory=qfactory, quantization_alignment=64)):
        lin(x)
    assert len(seen) == 10

    seen.clear()
    mlp = te.LayerNormMLP(64, 64, params_dtype=torch.bfloat16, name="mlp")
    with te.autocast(enabled=True, recipe=rec):
        mlp(x)
    fc1, fc2 = "mlp.fc1", "mlp.fc2"
    assert seen == [
        r("linear", "input", fc1), r("linear", "weight", fc1), r("linear", "input", fc2),
        r("linear", "input", fc2), r("linear", "weight", fc2), None,
        r("linear", "grad_output", fc1), None, r("linear", "grad_output", fc2), r("linear", "grad_output", fc1),
    ]  # fmt: skip

    seen.clear()
    gl = te.GroupedLinear(2, 64, 64, params_dtype=torch.bfloat16, name="g")
    with te.autocast(enabled=True, recipe=rec):
        gl(torch.randn(32, 64, dtype=torch.bfloat16), [16, 16])
    assert [s.module_type for s in seen if s is not None] == ["grouped_linear"] * 6
    assert len(seen) == 10


def test_an_identity_slot_beside_a_quantized_one_is_refused() -> None:
    def mixed(role):  # noqa: ANN001, ANN202
        if role is not None and role.tensor_type == "weight":
            return te.IdentityQuantizer()
        return F.current_scaling_factory(role)

    lin = te.Linear(32, 32, params_dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="one IdentityQuantizer"):
        with te.autocast(enabled=True, recipe=R.CustomRecipe(qfactory=mixed)):
            lin(torch.randn(16, 32, dtype=torch.bfloat16))


def test_ops_linear_takes_the_high_precision_factory() -> None:
    """``te.ops.Linear`` under ``high_precision_factory`` runs its GEMMs on the held tensors (TE
    ``cpp_extensions/gemm.py`` ``_unwrap_tensor`` dequantizes an IdentityTensor)."""
    import fp8sim.pytorch.ops as te_ops

    torch.manual_seed(5)
    base = te_ops.Linear(64, 64, dtype=torch.bfloat16)
    x = torch.randn(16, 64, dtype=torch.bfloat16)
    got = _step(copy.deepcopy(base), x, R.CustomRecipe(qfactory=F.high_precision_factory))
    assert _same(got, _step(copy.deepcopy(base), x, None))
