"""TE's FP8 boundaries (``Linear(fp8_output=, fp8_grad=)``, ``LayerNormLinear(fp8_output=)``) outside FP8
autocast and under ``Float8CurrentScaling`` on one rank.

References are TE's code at NVIDIA/TransformerEngine d0067d0, written out in the test:

* ``module/linear.py`` 2082-2112 ``_get_quantizers``: no quantizers at all when FP8 is off (the flags are
  ignored); the OUTPUT slot ``scaling_fwd[GEMM1_OUTPUT]`` for ``fp8_output``, ``scaling_bwd[GRAD_INPUT1]`` for
  ``fp8_grad``.  ``quantization.py`` 1487-1495 ``Float8CurrentScalingRecipeState.make_quantizers`` builds every
  slot with ``force_pow_2_scales=recipe.use_power_2_scales`` (amax epsilon 0); ``linear.py`` 2202-2228
  ``_customize_quantizers_float8_current_scaling`` then resets only the input, weight and grad-output slots
  from ``fp8_quant_fwd_inp`` / ``fp8_quant_fwd_weight`` / ``fp8_quant_bwd_grad``.
* ``csrc/extensions/gemm.cpp`` 216-233 and 392-396: a current-scaling output quantizer is unfused: the GEMM
  writes D in ``out_dtype`` (the activation dtype, ``linear.py`` 536-545 and 1085-1098), then the quantizer
  casts D.  ``csrc/quantizer.cpp`` 980-1033: amax of D, ``compute_scale_from_amax`` (``common/recipe/
  recipe_common.cuh`` 14-49), the cast ``satfinite(RN(fl32(x) * scale))``; ``scale_inv`` is the correctly
  rounded reciprocal (``common/utils.cuh`` 950 ``reciprocal<float>``).
* ``linear.py`` 421-425: a ``Float8Tensor`` input is used as it is (no INPUT cast); ``module/base.py``
  1763-1787 ``grad_output_preprocess``: a ``Float8Tensor`` grad output likewise (no GRAD_OUTPUT cast), the
  bias gradient from its dequantized value.
* The GEMM (``docs/semantics.md`` 4.7 / 8): the hand-off tests run under ``accumulator="exact"`` so that
  every bit has one reference, the exact sum of the exact FP8 products rounded once to float32, computed in
  Python integers by ``tests/_gemm_reference.py`` (not ``torch.matmul``, which ``module/_gemm.py`` runs);
  then cuBLAS's epilogue: the two ``scale_inv`` (their float32 product), a float32 bias, one rounding to the
  output dtype.  The default accumulator (float32 BLAS sum, order unspecified) has its own test below.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fp8sim.testing.oracles import require

torch = require("torch")

import _gemm_reference as ref  # noqa: E402

import fp8sim.pytorch as te  # noqa: E402
from fp8sim.pytorch.module._fp8_handoff import handoff_of  # noqa: E402
from fp8sim.recipe import (  # noqa: E402
    Float8BlockScaling,
    Float8CurrentScaling,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
)

torch.set_num_threads(1)

_ML = {"e4m3": (ml_dtypes.float8_e4m3fn, 448.0), "e5m2": (ml_dtypes.float8_e5m2, 57344.0)}


_cs_cast = ref.current_scaling_cast


def _mm(a: torch.Tensor, sa: float, b: torch.Tensor, sb: float, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The FP8 GEMM under ``accumulator="exact"`` (semantics 4.7, 8, 9): the exact sum of the decoded operands'
    products rounded once to float32, ``fl32(sa * sb)`` and the bias in the epilogue (float32 result, rounded
    by the caller)."""
    return ref.epilogue(ref.rn_f32(a, b), sa, sb, bias)


def _deq(vals: torch.Tensor, sinv: float, dt: torch.dtype) -> torch.Tensor:
    """``Float8Tensor.dequantize(dtype=dt)``: ``fl32(code * scale_inv)`` rounded to ``dt``."""
    return (vals * torch.tensor(sinv, dtype=torch.float32)).to(dt)


def _linear(inf: int, outf: int, dt: torch.dtype, seed: int) -> te.Linear:
    torch.manual_seed(seed)
    m = te.Linear(inf, outf, params_dtype=dt)
    with torch.no_grad():  # a bias that bf16 holds exactly (an FP8 GEMM's bias goes through bf16 for fp32)
        m.bias.copy_((torch.randn(outf) * 0.5).to(torch.bfloat16).to(dt))
    return m


def _assert_bits(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype, got.shape, want.shape)
    bad = (got.detach() != want.detach()) & ~(torch.isnan(got.detach()) & torch.isnan(want.detach()))
    if bad.any():
        i = tuple(int(j) for j in bad.nonzero()[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} elements differ, first at {i}: {got[i].item()} != {want[i].item()}"
        )


# -- 1. outside FP8 autocast the flags are ignored -------------------------------------------------------------


@pytest.mark.parametrize("module", ["Linear", "LayerNormLinear"])
def test_fp8_boundary_flags_outside_fp8_autocast_are_ignored_as_te_does(module: str) -> None:
    """TE linear.py 2082-2083 / layernorm_linear.py ``_get_quantizers``: ``if not self.fp8: return [None] * 6``:
    ``fp8_output=True, fp8_grad=True`` outside FP8 autocast give the plain call's bits (output, input and weight
    gradients) and a plain tensor (fp8sim used to raise NotImplementedError)."""
    torch.manual_seed(3)
    m = te.Linear(16, 8) if module == "Linear" else te.LayerNormLinear(16, 8)
    x, dy = torch.randn(4, 16), torch.randn(4, 8)
    outs = []
    for flags in ({}, {"fp8_output": True, "fp8_grad": True}):
        xi = x.clone().requires_grad_()
        y = m(xi, **flags)
        y.backward(dy)
        outs.append((y.detach(), xi.grad, m.weight.grad.clone(), handoff_of(y)))
        m.weight.grad = None
    for what, a, b in zip(("y", "dx", "dw"), outs[0][:3], outs[1][:3], strict=True):
        _assert_bits(b, a, what)
    assert outs[1][3] is None
    if module == "Linear":  # and both are torch's own linear
        _assert_bits(outs[1][0], torch.nn.functional.linear(x, m.weight, m.bias).detach(), "y vs F.linear")


def test_dot_product_attention_fp8_output_outside_fp8_autocast_is_ignored() -> None:
    """TE ``DotProductAttention(fp8_output=True)`` outside FP8 autocast: no FP8 (``fp8_meta["recipe"]`` unused,
    ``FusedAttnFunc`` not in FP8), the plain output's bits and no FP8 data on it."""
    torch.manual_seed(9)
    dpa = te.DotProductAttention(2, 8, attention_dropout=0.0)
    q, k, v = (torch.randn(4, 2, 2, 8) for _ in range(3))
    y = dpa(q, k, v, fp8_output=True)
    _assert_bits(y, dpa(q, k, v), "O")
    assert handoff_of(y) is None


# -- 2. Float8CurrentScaling -----------------------------------------------------------------------------------


@pytest.mark.parametrize("use_power_2_scales", [False, True])
@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_linear_fp8_output_and_fp8_grad_under_current_scaling_match_te(
    dt: torch.dtype, use_power_2_scales: bool
) -> None:
    """Producer ``Linear(fp8_output=True)`` -> consumer ``Linear(fp8_grad=True)`` under Float8CurrentScaling.
    Forward: the producer's D (its GEMM with the bias, rounded to the activation dtype) cast by the OUTPUT slot
    (E4M3, pow2 = ``use_power_2_scales``): codes and scale_inv; the returned tensor its dequantized value; the
    consumer's GEMM on those codes and scale_inv as they are.  Backward: the consumer's dgrad D rounded to the
    activation dtype, cast by the GRAD_INPUT slot (E5M2, pow2 = ``use_power_2_scales``); the producer's dgrad,
    wgrad and bias gradient from those codes as they are.  With ``use_power_2_scales=True`` the OUTPUT and
    GRAD_INPUT slots round their scales to powers of 2 while the input/grad-output QParams (class attributes
    fixed at import, recipe/__init__.py 302-306) do not, so a re-cast by the consumer would differ."""
    recipe = Float8CurrentScaling(use_power_2_scales=use_power_2_scales)
    p_in, p_w, p_g = (
        q.power_2_scale for q in (recipe.fp8_quant_fwd_inp, recipe.fp8_quant_fwd_weight, recipe.fp8_quant_bwd_grad)
    )
    prod, cons = _linear(16, 32, dt, 1), _linear(32, 16, dt, 2)
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(8, 16, generator=g) * 3).to(dt).requires_grad_()
    dz = (torch.randn(8, 16, generator=g) * 1e-3).to(dt)
    with te.autocast(recipe=recipe, accumulator="exact"):
        y = prod(x, fp8_output=True)
        z = cons(y, fp8_grad=True)
    z.backward(dz)
    hy = handoff_of(y)

    # reference forward
    vx, _, sx = _cs_cast(x, "e4m3", p_in)
    vwp, _, swp = _cs_cast(prod.weight, "e4m3", p_w)
    d_prod = _mm(vx, sx, vwp.t(), swp, prod.bias).to(dt)  # unfused: D in the activation dtype first
    vo, co, so = _cs_cast(d_prod, "e4m3", use_power_2_scales)
    assert hy is not None and hy.sinv == so, (hy and hy.sinv, so)
    _assert_bits(hy.codes, co, "OUTPUT codes")
    _assert_bits(y.detach(), _deq(vo, so, dt), "producer output")
    vwc, _, swc = _cs_cast(cons.weight, "e4m3", p_w)
    _assert_bits(z.detach(), _mm(vo, so, vwc.t(), swc, cons.bias).to(dt), "consumer output")
    if use_power_2_scales and not p_in:  # the INPUT slot's own cast of y would give other bits
        vr, _, sr = _cs_cast(y, "e4m3", p_in)
        assert not torch.equal(_mm(vr, sr, vwc.t(), swc, cons.bias).to(dt), z.detach())

    # reference backward
    vdz, _, sdz = _cs_cast(dz, "e5m2", p_g)
    d_dgrad = _mm(vdz, sdz, vwc, swc).to(dt)
    vgi, cgi, sgi = _cs_cast(d_dgrad, "e5m2", use_power_2_scales)
    assert hy.grad is not None and hy.grad.sinv == sgi, (hy.grad and hy.grad.sinv, sgi)
    _assert_bits(hy.grad.codes, cgi, "GRAD_INPUT codes")
    _assert_bits(cons.weight.grad, _mm(vdz.t(), sdz, vo, so).to(dt), "consumer wgrad")
    _assert_bits(x.grad, _mm(vgi, sgi, vwp, swp).to(dt), "producer dgrad")
    _assert_bits(prod.weight.grad, _mm(vgi.t(), sgi, vx, sx).to(dt), "producer wgrad")
    _assert_bits(prod.bias.grad, _deq(vgi, sgi, dt).float().sum(0).to(dt), "producer bias grad")


def _decoded(codes: torch.Tensor, fmt: str) -> torch.Tensor:
    return torch.from_numpy(codes.numpy().view(_ML[fmt][0]).astype(np.float32))


def _band(*shape: int, generator: torch.Generator) -> torch.Tensor:
    """Magnitudes in [0.6, 1), random signs: after current scaling every FP8 value lies in the top binades."""
    mag = torch.rand(*shape, generator=generator) * 0.4 + 0.6
    return torch.where(torch.rand(*shape, generator=generator) < 0.5, -mag, mag)


def test_default_accumulator_gemms_are_the_exact_fp8_products_summed_in_float32() -> None:
    """``accumulator=None`` (the default, semantics 4.7): fprop, dgrad and wgrad are the exact products of the
    FP8 operands (TE's quantizer written above) summed in float32, times ``fl32(sa * sb)``.  The data keep every
    FP8 value in its top binades, so the products share a 2**t grid and their absolute sum is below 2**(t + 24):
    every float32 summation order is exact and all elements are checked bit for bit against the exact sum,
    independently of the BLAS order ``torch.matmul`` picks."""
    recipe = Float8CurrentScaling()
    p_in, p_w, p_g = (
        q.power_2_scale for q in (recipe.fp8_quant_fwd_inp, recipe.fp8_quant_fwd_weight, recipe.fp8_quant_bwd_grad)
    )
    g = torch.Generator().manual_seed(11)
    m = te.Linear(64, 32, bias=False)
    with torch.no_grad():
        m.weight.copy_(_band(32, 64, generator=g))
    x = (_band(16, 64, generator=g) * 3).requires_grad_()
    dy = _band(16, 32, generator=g) * 1e-3
    with te.autocast(recipe=recipe):
        y = m(x)
    y.backward(dy)
    vx, _, sx = _cs_cast(x, "e4m3", p_in)
    vw, _, sw = _cs_cast(m.weight, "e4m3", p_w)
    vg, _, sg = _cs_cast(dy, "e5m2", p_g)
    assert ref.assert_default_accumulation(y, vx, vw.t(), sx, sw, "fprop") == y.numel()
    assert ref.assert_default_accumulation(x.grad, vg, vw, sg, sw, "dgrad") == x.numel()
    assert ref.assert_default_accumulation(m.weight.grad, vg.t(), vx, sg, sx, "wgrad") == m.weight.numel()


def test_default_accumulator_consumer_gemms_take_the_handed_off_codes_as_they_are() -> None:
    """``Linear(fp8_output=True)`` -> ``Linear(fp8_grad=True)`` with the default accumulator: the consumer's
    output is the exact products of the hand-off's codes and its weight's cast, summed in float32 (bits where
    every order is exact, within gamma_K * sum|p| elsewhere: the BLAS order is the contract there, not bits),
    and the producer's dgrad likewise from the GRAD_INPUT codes; the hand-offs are the module's own (their
    codes are checked bit for bit under the exact accumulator above)."""
    recipe = Float8CurrentScaling()
    p_w = recipe.fp8_quant_fwd_weight.power_2_scale
    torch.manual_seed(5)
    prod, cons = te.Linear(32, 64, bias=False), te.Linear(64, 32, bias=False)
    x = (torch.randn(16, 32) * 3).requires_grad_()
    with te.autocast(recipe=recipe):
        y = prod(x, fp8_output=True)
        z = cons(y, fp8_grad=True)
    z.backward(torch.randn(16, 32) * 1e-3)
    h = handoff_of(y)
    assert h is not None and h.grad is not None
    vo, vgi = _decoded(h.codes, "e4m3"), _decoded(h.grad.codes, "e5m2")
    vwc, _, swc = _cs_cast(cons.weight, "e4m3", p_w)
    vwp, _, swp = _cs_cast(prod.weight, "e4m3", p_w)
    exact = ref.assert_default_accumulation(z, vo, vwc.t(), h.sinv, swc, "consumer fprop")
    exact += ref.assert_default_accumulation(x.grad, vgi, vwp, h.grad.sinv, swp, "producer dgrad")
    assert exact > 0  # the bit-level half of the check is not vacuous


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**16),
    exponent=st.one_of(st.integers(-130, -118), st.integers(-20, 40)),  # -118 and below: scale FLT_MAX
    zero=st.booleans(),
    nobias=st.booleans(),
    pow2=st.booleans(),
    bf16=st.booleans(),
)
def test_current_scaling_fp8_output_is_te_cast_of_the_plain_result_for_any_magnitude(
    seed: int, exponent: int, zero: bool, nobias: bool, pow2: bool, bf16: bool
) -> None:
    """Law: under Float8CurrentScaling the FP8 output's codes and scale_inv are TE's quantizer applied to the
    call without ``fp8_output`` (the GEMM's D in the activation dtype), at any magnitude: an all-zero D
    (amax 0: scale 1), a tiny D whose scale overflows float32 (FLT_MAX), a huge one (recipe_common.cuh 14-49)."""
    dt = torch.bfloat16 if bf16 else torch.float32
    m = _linear(16, 16, dt, seed % 97)
    if zero or nobias:  # without a bias D has the input's magnitude
        with torch.no_grad():
            m.bias.zero_()
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(8, 16, generator=g, dtype=torch.float64) * (0.0 if zero else 2.0**exponent)).to(dt)
    with te.autocast(recipe=Float8CurrentScaling(use_power_2_scales=pow2)):
        plain = m(x)
        y = m(x, fp8_output=True)
    vo, co, so = _cs_cast(plain, "e4m3", pow2)
    h = handoff_of(y)
    assert h is not None and h.sinv == so, (h and h.sinv, so)
    _assert_bits(h.codes, co, "OUTPUT codes")
    _assert_bits(y.detach(), _deq(vo, so, dt), "output")


@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_layernorm_linear_fp8_output_under_current_scaling_cast_unfused_and_fp8_grad_output_used_as_is(
    dt: torch.dtype, normalization: str
) -> None:
    """``LayerNormLinear(fp8_output=True)`` under Float8CurrentScaling(use_power_2_scales=True)
    (layernorm_linear.py 394-413: the GEMM's OUTPUT quantizer through ``general_gemm``): the result of the call
    without the flag (the GEMM's D in the activation dtype) cast by the OUTPUT slot as TE's quantizer does;
    the consumer ``Linear(fp8_grad=True)`` takes its codes and scale_inv as they are, and its FP8 dgrad
    (GRAD_INPUT slot) is this module's grad output as it is: the wgrad from those codes and the norm output's
    INPUT cast (layernorm_linear.py backward; ``return_layernorm_output`` gives the norm output); a GRAD_OUTPUT
    re-cast (its QParams do not round the scale to a power of 2) would give other bits."""
    recipe = Float8CurrentScaling(use_power_2_scales=True)
    p_in, p_w, p_g = (
        q.power_2_scale for q in (recipe.fp8_quant_fwd_inp, recipe.fp8_quant_fwd_weight, recipe.fp8_quant_bwd_grad)
    )
    torch.manual_seed(6)
    lnl = te.LayerNormLinear(16, 32, normalization=normalization, params_dtype=dt, return_layernorm_output=True)
    cons = _linear(32, 16, dt, 7)
    x = (torch.randn(8, 16) * 2).to(dt)
    dz = (torch.randn(8, 16) * 1e-3).to(dt)
    with te.autocast(recipe=recipe, accumulator="exact"):
        plain = lnl(x)[0].detach()
        y, ln = lnl(x.clone().requires_grad_(), fp8_output=True)
        z = cons(y, fp8_grad=True)
    z.backward(dz)
    vo, co, so = _cs_cast(plain, "e4m3", True)
    h = handoff_of(y)
    assert h is not None and h.sinv == so
    _assert_bits(h.codes, co, "OUTPUT codes")
    _assert_bits(y.detach(), _deq(vo, so, dt), "output")
    vwc, _, swc = _cs_cast(cons.weight, "e4m3", p_w)
    _assert_bits(z.detach(), _mm(vo, so, vwc.t(), swc, cons.bias).to(dt), "consumer output")
    vdz, _, sdz = _cs_cast(dz, "e5m2", p_g)
    vg, cg, sg = _cs_cast(_mm(vdz, sdz, vwc, swc).to(dt), "e5m2", True)
    assert h.grad is not None and h.grad.sinv == sg
    _assert_bits(h.grad.codes, cg, "GRAD_INPUT codes")
    vln, _, sln = _cs_cast(ln, "e4m3", p_in)
    _assert_bits(lnl.weight.grad, _mm(vg.t(), sg, vln, sln).to(dt), "wgrad from the FP8 grad output")
    if not p_g:
        vr, _, sr = _cs_cast(_deq(vg, sg, dt), "e5m2", p_g)
        assert not torch.equal(_mm(vr.t(), sr, vln, sln).to(dt), lnl.weight.grad)


@pytest.mark.parametrize("role", ["input", "weight", "grad"])
def test_current_scaling_qparams_of_each_role_reach_its_cast(role: str) -> None:
    """``Float8CurrentScaling``'s ``fp8_quant_fwd_inp`` / ``fp8_quant_fwd_weight`` / ``fp8_quant_bwd_grad``
    (class attributes in TE, not fields: set on a subclass, recipe/__init__.py 302-306): TE linear.py 2202-2228
    builds the input, weight and grad-output quantizers from them; here the role's ``QParams(power_2_scale=True,
    amax_epsilon=0.25)`` (its tensor's amax is below 0.25, so the scale is ``pow2(fmax / 0.25)``), the other
    roles the defaults.  fprop and dgrad bit for bit (exact accumulator); the default QParams give other bits."""
    from fp8sim.recipe import QParams

    field = {"input": "fp8_quant_fwd_inp", "weight": "fp8_quant_fwd_weight", "grad": "fp8_quant_bwd_grad"}[role]
    recipe = type("Custom", (Float8CurrentScaling,), {field: QParams(power_2_scale=True, amax_epsilon=0.25)})()
    torch.manual_seed(21)
    m = te.Linear(64, 32, bias=False)
    g = torch.Generator().manual_seed(22)
    x = (torch.randn(16, 64, generator=g) * 1e-2).requires_grad_()
    dy = torch.randn(16, 32, generator=g) * 1e-3
    with te.autocast(recipe=recipe, accumulator="exact"):
        y = m(x)
    y.backward(dy)

    def cast(t: torch.Tensor, fmt: str, mine: bool):
        return ref.current_scaling_cast(t, fmt, pow2=mine, eps=0.25 if mine else 0.0)

    (vx, _, sx), (vw, _, sw) = cast(x, "e4m3", role == "input"), cast(m.weight, "e4m3", role == "weight")
    vg, _, sg = cast(dy, "e5m2", role == "grad")
    want_y = _mm(vx, sx, vw.t(), sw)
    want_dx = _mm(vg, sg, vw, sw)
    _assert_bits(y.detach(), want_y, "fprop")
    _assert_bits(x.grad, want_dx, "dgrad")
    (dvx, _, dsx), (dvw, _, dsw) = cast(x, "e4m3", False), cast(m.weight, "e4m3", False)
    dvg, _, dsg = cast(dy, "e5m2", False)
    plain = (_mm(dvx, dsx, dvw.t(), dsw), _mm(dvg, dsg, dvw, dsw))
    assert not (torch.equal(plain[0], want_y) and torch.equal(plain[1], want_dx))


@pytest.mark.parametrize("fmt", ["HYBRID", "E4M3"])
def test_current_scaling_fp8_format_picks_the_gradient_format(fmt: str) -> None:
    """``Float8CurrentScaling(fp8_format=...)``: TE ``quantization.py`` ``get_fp8_te_dtype``: forward tensors
    E4M3 in both, the backward ones E5M2 under HYBRID and E4M3 under E4M3 (recipe docstring).  fprop and dgrad
    bit for bit (exact accumulator) from the current-scaling casts written in ``_gemm_reference.py``; the
    other gradient format gives other dgrad bits."""
    from fp8sim.recipe import Format

    torch.manual_seed(23)
    m = te.Linear(64, 32, bias=False)
    g = torch.Generator().manual_seed(24)
    x = torch.randn(16, 64, generator=g).requires_grad_()
    dy = torch.randn(16, 32, generator=g) * 0.3
    with te.autocast(recipe=Float8CurrentScaling(fp8_format=Format[fmt]), accumulator="exact"):
        y = m(x)
    y.backward(dy)
    gfmt, other = ("e5m2", "e4m3") if fmt == "HYBRID" else ("e4m3", "e5m2")
    (vx, _, sx), (vw, _, sw) = _cs_cast(x, "e4m3"), _cs_cast(m.weight, "e4m3")
    vg, _, sg = _cs_cast(dy, gfmt)
    _assert_bits(y.detach(), _mm(vx, sx, vw.t(), sw), "fprop")
    want_dx = _mm(vg, sg, vw, sw)
    _assert_bits(x.grad, want_dx, "dgrad")
    ovg, _, osg = _cs_cast(dy, other)
    assert not torch.equal(_mm(ovg, osg, vw, sw), want_dx)


def test_layernorm_linear_fp8_grad_inside_fp8_autocast_is_refused() -> None:
    """TE layernorm_linear.py 1133-1161 hands the dgrad GEMM's FP8 output straight to ``tex.layernorm_bwd`` /
    ``tex.rmsnorm_bwd`` (plain ``at::Tensor`` arguments): not emulated, refused with a message naming it."""
    m = te.LayerNormLinear(16, 16)
    with te.autocast(recipe=Float8CurrentScaling()), pytest.raises(NotImplementedError, match="fp8_grad=True"):
        m(torch.randn(8, 16), fp8_grad=True)


def test_layernorm_linear_fp8_grad_without_grad_mode_is_ignored_as_te_does() -> None:
    """TE layernorm_linear.py 1856-1862 makes the grad-input quantizer only ``if is_grad_enabled``: under
    ``torch.no_grad()`` the flag changes nothing (fp8sim refused it)."""
    torch.manual_seed(0)
    m = te.LayerNormLinear(16, 16)
    x = torch.randn(8, 16)
    with torch.no_grad(), te.autocast(recipe=Float8CurrentScaling()):
        got = m(x, fp8_grad=True)
    with torch.no_grad(), te.autocast(recipe=Float8CurrentScaling()):
        want = m(x)
    assert torch.equal(got, want)


# -- 4. block-scaled recipes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "recipe", [MXFP8BlockScaling(), Float8BlockScaling(), NVFP4BlockScaling()], ids=lambda r: type(r).__name__
)
@pytest.mark.parametrize("flag", ["fp8_output", "fp8_grad"])
def test_fp8_boundaries_under_block_scaled_recipes_are_refused_naming_the_recipe(recipe: object, flag: str) -> None:
    """TE's general_gemm accepts a block-scaled output quantizer (gemm.cpp 218-233: unfused cast of the
    activation-dtype D) but the output is rowwise only (linear.py 520-521); fp8sim's FP8 hand-off carries one
    per-tensor scale, so these are refused with the recipe named (the flags without FP8 stay ignored)."""
    m = te.Linear(32, 32)
    with te.autocast(recipe=recipe), pytest.raises(NotImplementedError, match=type(recipe).__name__) as excinfo:
        m(torch.randn(32, 32), **{flag: True})
    assert "block-scaled FP8 hand-off is not emulated" in str(excinfo.value)
