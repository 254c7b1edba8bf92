"""The module layer's ``accumulator`` option (``Linear(accumulator=)``, ``autocast(accumulator=)``) and the
recipes' ``fp8_gemm_*`` fields, against references built in the test (issue 30.2, 30.3).

References, independent of ``fp8sim/pytorch/module/_gemm.py`` (which calls ``fp8sim.gemm.scaled_mm``):

* the operands: TE's current-scaling quantizer written with ml_dtypes (``tests/_gemm_reference.py``);
* a device accumulator (``"hopper"``, ``"ada"``, ``"blackwell"``): the GEMM chained in the test from the
  per-instruction model ``fp8sim.gemm.dot_add`` (checked against MMA-Sim's golden vectors and hardware
  measurements in ``tests/test_gemm_instructions.py``); fast or split per GEMM as TE decides it
  (NVIDIA/TransformerEngine d0067d0 ``pytorch/module/base.py`` 83-85 ``_2X_ACC_FPROP = False``,
  ``_2X_ACC_DGRAD = True``, ``_2X_ACC_WGRAD = True``; ``module/linear.py`` 513-517, 1963-1971: a recipe's
  ``fp8_gemm_fprop/dgrad/wgrad.use_split_accumulator`` overrides them);
* ``"exact"``: the exact sum of the exact products rounded once (Python integers in the test);
* the epilogue ``fl32(D * fl32(sa * sb))`` (``docs/semantics.md`` 4.7, 8).

Sizes are multiples of 32 and above 128 so that split (promotion every 128 elements) and fast differ.
"""

from __future__ import annotations

import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

import _gemm_reference as ref  # noqa: E402

import fp8sim.pytorch as te  # noqa: E402
from fp8sim.recipe import DelayedScaling, Float8CurrentScaling, MMParams  # noqa: E402

torch.set_num_threads(1)

N = 160  # tokens, in and out features: every GEMM has K = 160 (one promotion at 128)
S = 32  # the other dimensions where only fprop (K = in_features) is checked
_INSTR = {"hopper": "hopper_wgmma", "ada": "ada_mma", "blackwell": "blackwell_tcgen05"}


def _run(m: torch.nn.Module, recipe: Float8CurrentScaling, accumulator: str | None = None, tokens: int = N):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, m.in_features, generator=g).requires_grad_()
    dy = torch.randn(tokens, m.out_features, generator=g) * 1e-2
    with te.autocast(recipe=recipe, accumulator=accumulator):
        y = m(x)
    y.backward(dy)
    return x, dy, y


def _linear(out_features: int = N, **kw) -> te.Linear:
    torch.manual_seed(1)
    return te.Linear(N, out_features, bias=False, **kw)


def _scale_one_cast(x: torch.Tensor, fmt: str) -> tuple[None, torch.Tensor, float]:
    """DelayedScaling's first step: ``satfinite(RN(x * 1))`` (scale 1, TE's initial ``fp8_meta`` scale)."""
    dt, fmax = ref._ML[fmt]
    q = np.clip(x.detach().float().numpy(), -fmax, fmax).astype(dt)
    return None, torch.from_numpy(q.view(np.uint8).copy()), 1.0


def _chain_refs(x, dy, w, instruction: str, split: dict[str, bool], cast=ref.current_scaling_cast):
    """fprop ``x @ W.T``, dgrad ``dy @ W``, wgrad ``dy.T @ x`` (those named in ``split``) as the instruction
    chains them, with the operands of ``cast`` (E4M3 forward, E5M2 gradient) and the epilogue."""
    _, cx, sx = cast(x, "e4m3")
    _, cw, sw = cast(w, "e4m3")
    _, cg, sg = cast(dy, "e5m2")
    gemms = {
        "fprop": (cx, cw.t(), "e4m3", sx, sw),
        "dgrad": (cg, cw, "e5m2", sg, sw),
        "wgrad": (cg.t(), cx, "e5m2", sg, sx),
    }
    out = {}
    for which, every in split.items():
        a, b, fa, s1, s2 = gemms[which]
        out[which] = ref.epilogue(ref.chain(a, b, fa, "e4m3", instruction, 128 if every else None), s1, s2)
    return out


def _assert_bits(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    got = got.detach()
    bad = got.view(torch.int32) != want.view(torch.int32)
    if bad.any():
        i = tuple(int(j) for j in bad.nonzero()[0])
        raise AssertionError(f"{what}: {int(bad.sum())} elements differ, first at {i}: {got[i]!r} != {want[i]!r}")


def test_hopper_accumulator_chains_fprop_fast_and_gradients_split_as_te() -> None:
    """``Linear(accumulator="hopper")`` under Float8CurrentScaling: fprop one chain over all of K (FAST_ACCUM,
    ``fp8_gemm_fprop.use_split_accumulator=False``), dgrad and wgrad promoted every 128 (split), each built
    from ``dot_add``; the fast and split chains differ on this data, so swapping them fails too."""
    m = _linear(accumulator="hopper")
    x, dy, y = _run(m, Float8CurrentScaling())
    want = _chain_refs(x, dy, m.weight, "hopper_wgmma", {"fprop": False, "dgrad": True, "wgrad": True})
    _assert_bits(y, want["fprop"], "fprop")
    _assert_bits(x.grad, want["dgrad"], "dgrad")
    _assert_bits(m.weight.grad, want["wgrad"], "wgrad")
    other = _chain_refs(x, dy, m.weight, "hopper_wgmma", {"fprop": True, "dgrad": False})
    assert not torch.equal(other["fprop"], want["fprop"]) and not torch.equal(other["dgrad"], want["dgrad"])


@pytest.mark.parametrize("device", ["ada", "blackwell"])
def test_ada_and_blackwell_accumulators_chain_their_own_instruction(device: str) -> None:
    """``accumulator="ada"`` / ``"blackwell"``: fprop is a fast chain of ``ada_mma`` (two k16 halves, 13 bits)
    or ``blackwell_tcgen05`` (25 bits) instructions, not Hopper's."""
    m = _linear(S, accumulator=device)
    x, dy, y = _run(m, Float8CurrentScaling(), tokens=S)
    want = _chain_refs(x, dy, m.weight, _INSTR[device], {"fprop": False})
    _assert_bits(y, want["fprop"], "fprop")
    hopper = _chain_refs(x, dy, m.weight, "hopper_wgmma", {"fprop": False})
    if device == "blackwell":
        assert not torch.equal(hopper["fprop"], want["fprop"])


def test_recipe_fp8_gemm_fields_choose_fast_or_split_per_gemm() -> None:
    """A recipe's ``fp8_gemm_fprop/dgrad/wgrad = MMParams(use_split_accumulator=...)`` overrides TE's module
    constants (linear.py 513-517, 1963-1971): inverted here, fprop is split and both gradients fast."""
    recipe = Float8CurrentScaling(
        fp8_gemm_fprop=MMParams(use_split_accumulator=True),
        fp8_gemm_dgrad=MMParams(use_split_accumulator=False),
        fp8_gemm_wgrad=MMParams(use_split_accumulator=False),
    )
    m = _linear(accumulator="hopper")
    x, dy, y = _run(m, recipe)
    want = _chain_refs(x, dy, m.weight, "hopper_wgmma", {"fprop": True, "dgrad": False, "wgrad": False})
    _assert_bits(y, want["fprop"], "fprop")
    _assert_bits(x.grad, want["dgrad"], "dgrad")
    _assert_bits(m.weight.grad, want["wgrad"], "wgrad")


def test_recipes_without_gemm_fields_take_te_module_constants() -> None:
    """DelayedScaling has no ``fp8_gemm_*`` fields: TE's module constants decide (base.py 83-85), fprop fast and
    dgrad/wgrad split.  First step: every scale is 1."""
    m = _linear(accumulator="hopper")
    x, dy, y = _run(m, DelayedScaling())
    want = _chain_refs(
        x, dy, m.weight, "hopper_wgmma", {"fprop": False, "dgrad": True, "wgrad": True}, cast=_scale_one_cast
    )
    _assert_bits(y, want["fprop"], "fprop")
    _assert_bits(x.grad, want["dgrad"], "dgrad")
    _assert_bits(m.weight.grad, want["wgrad"], "wgrad")


def test_autocast_accumulator_applies_to_every_module_and_overrides_the_modules_own() -> None:
    """``autocast(accumulator="hopper")`` runs a module built without one, and one built with ``"exact"``,
    on the Hopper chains; a module's own ``accumulator`` applies when autocast names none."""
    want = None
    for kw in ({}, {"accumulator": "exact"}):
        m = _linear(S, **kw)
        x, dy, y = _run(m, Float8CurrentScaling(), accumulator="hopper", tokens=S)
        want = _chain_refs(x, dy, m.weight, "hopper_wgmma", {"fprop": False})
        _assert_bits(y, want["fprop"], f"fprop {kw}")
    m = _linear(S, accumulator="hopper")
    _, _, y = _run(m, Float8CurrentScaling(), tokens=S)
    _assert_bits(y, want["fprop"], "module's own accumulator")


def test_exact_accumulator_is_the_exact_sum_rounded_once_where_a_float32_sum_is_not() -> None:
    """``accumulator="exact"``: every GEMM is the exact sum of the exact FP8 products rounded once to float32,
    then the epilogue.  The data are chosen (a wide spread of magnitudes) so that a float32 BLAS sum, the
    default accumulator, gives other bits: dropping the option fails."""
    g = torch.Generator().manual_seed(3)
    torch.manual_seed(4)
    m = te.Linear(N, S, bias=False, accumulator="exact")
    spread = 2.0 ** torch.randint(-14, 2, (S, N), generator=g).float()
    x = (torch.randn(S, N, generator=g) * spread).requires_grad_()
    with te.autocast(recipe=Float8CurrentScaling()):
        y = m(x)
    vx, _, sx = ref.current_scaling_cast(x, "e4m3")
    vw, _, sw = ref.current_scaling_cast(m.weight, "e4m3")
    want = ref.epilogue(ref.rn_f32(vx, vw.t()), sx, sw)
    _assert_bits(y, want, "fprop")
    m.accumulator = None
    with te.autocast(recipe=Float8CurrentScaling()):
        y_default = m(x)
    assert not torch.equal(y_default.detach(), want), "the data do not tell the exact sum from a float32 sum"


@pytest.mark.parametrize("module", ["LayerNormLinear", "LayerNormMLP", "GroupedLinear"])
def test_every_module_honours_its_accumulator(module: str) -> None:
    """``LayerNormLinear``, ``LayerNormMLP`` and ``GroupedLinear`` built with ``accumulator="hopper"`` give the
    bits of the same module under ``autocast(accumulator="hopper")`` (checked against the chains above for
    ``Linear``), and not those of the default accumulator."""

    def make(**kw):
        torch.manual_seed(7)
        if module == "LayerNormLinear":
            return te.LayerNormLinear(N, N, bias=False, **kw)
        if module == "LayerNormMLP":
            return te.LayerNormMLP(N, N, bias=False, **kw)
        return te.GroupedLinear(2, N, N, bias=False, **kw)

    x = torch.randn(N, N, generator=torch.Generator().manual_seed(8))
    args = (x, [96, 64]) if module == "GroupedLinear" else (x,)
    outs = {}
    for name, kw, acc in (("own", {"accumulator": "hopper"}, None), ("autocast", {}, "hopper"), ("none", {}, None)):
        with te.autocast(recipe=Float8CurrentScaling(), accumulator=acc), torch.no_grad():
            outs[name] = make(**kw)(*args)
    assert torch.equal(outs["own"], outs["autocast"])
    assert not torch.equal(outs["own"], outs["none"])
