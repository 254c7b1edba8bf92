"""``te.ops`` numerics, bit-exact against references written from TE 2.20.0.dev0's source.

The references are independent of fp8sim's code paths: FP8 casts by ml_dtypes, GEMM sums exact
(``fractions.Fraction``) and rounded once to float32, per-tensor scales and epilogues as TE's kernels compute
them, MXFP8 / FP8-block operands read from the raw codes and scales of TE's public quantizer classes.
Every fused path has a negative control: the unfused rounding gives other bits on the same data.
Accumulation is ``autocast(accumulator="exact")`` (the exact sum rounded once), the model the references use.
"""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

import fp8sim.pytorch as te  # noqa: E402
import fp8sim.pytorch.ops as te_ops  # noqa: E402
from fp8sim.recipe import DelayedScaling, Float8BlockScaling, Float8CurrentScaling, Format, MXFP8BlockScaling  # noqa: E402

F32 = np.float32
FMT = {"e4m3": (ml_dtypes.float8_e4m3fn, 448.0), "e5m2": (ml_dtypes.float8_e5m2, 57344.0)}


def _round_f32(fr: Fraction) -> np.float32:
    """``fr`` rounded once to float32 (nearest, ties to even)."""
    f = F32(float(fr))
    cands = [f, np.nextafter(f, F32(np.inf)), np.nextafter(f, F32(-np.inf))]
    best = min(abs(Fraction(float(c)) - fr) for c in cands)
    ties = [c for c in cands if abs(Fraction(float(c)) - fr) == best]
    return min(ties, key=lambda c: int(np.asarray(c).view(np.uint32)) & 1)


def _exact_sum_f32(terms: np.ndarray) -> np.float32:
    """The exact sum of float64 ``terms`` rounded once to float32: ``math.fsum`` (correctly rounded to
    float64), exact rationals where that float64 sits on a float32 midpoint (the only case where rounding
    twice could differ)."""
    d = math.fsum(terms)
    f = F32(d)
    if float(f) != d and abs(float(f) - d) == abs(float(np.nextafter(f, F32(np.inf if d > f else -np.inf))) - d):
        return _round_f32(sum((Fraction(float(t)) for t in terms), Fraction(0)))
    return f


def _exact_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` (float64 values whose products are exact) summed exactly and rounded once to float32."""
    prods = a[:, :, None] * b[None, :, :]
    out = np.empty((a.shape[0], b.shape[1]), F32)
    for i in range(a.shape[0]):
        for j in range(b.shape[1]):
            out[i, j] = _exact_sum_f32(prods[i, :, j])
    return out


def _cast(v32: np.ndarray, fmt: str) -> np.ndarray:
    """TE's satfinite FP8 cast (``cast_to_fp8``: clamp to the format's max, round to nearest even), as values."""
    dtype, fmax = FMT[fmt]
    return np.clip(v32, -fmax, fmax).astype(dtype).astype(np.float64)


def _current(x: torch.Tensor, fmt: str) -> tuple[np.ndarray, np.float32]:
    """TE current scaling (``recipe/current_scaling.cu``): ``scale = fl32(max / amax)``, codes of
    ``fl32(x * scale)``, ``scale_inv = fl32(1 / scale)``."""
    x32 = x.float().numpy()
    scale = F32(FMT[fmt][1]) / F32(np.abs(x32).max())
    return _cast((x32 * scale).astype(F32), fmt), F32(1) / scale


def _dyadic(*shape: int, seed: int, dtype: torch.dtype = torch.bfloat16, lo: int = -16, hi: int = 16) -> torch.Tensor:
    """Small multiples of 1/8: every float32 sum over them in these tests is exact."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(lo, hi + 1, shape, generator=g).float() / 8).to(dtype)


def _randn(*shape: int, seed: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _bf16(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(a, F32)).to(torch.bfloat16)


def _linear_bias_relu(n_in: int = 32, n_out: int = 16):
    torch.manual_seed(0)
    linear, bias = te_ops.BasicLinear(n_in, n_out, dtype=torch.bfloat16), te_ops.Bias(n_out, dtype=torch.bfloat16)
    with torch.no_grad():
        linear.weight.copy_(_randn(n_out, n_in, seed=2))
        bias.bias.copy_(_randn(n_out, seed=3))
    return te_ops.Sequential(linear, bias, te_ops.ReLU()), linear, bias


def _run(model, recipe, x, dy):
    x = x.clone().requires_grad_(True)
    with te.autocast(recipe=recipe, accumulator="exact"):
        y = model(x)
    y.backward(dy)
    return y, x.grad


def _per_tensor_reference(x, w, b, dy, quant_fwd, quant_bwd):
    """TE's ``Sequential(BasicLinear, Bias, ReLU)`` in bf16 with per-tensor FP8 (``quant_*(t) -> (values,
    scale_inv)``): forward ``ForwardLinearBiasActivation`` (bias in the float32 epilogue,
    ``forward_linear_bias_activation.py:174``), backward ``BackwardActivationBias`` (``dbias_drelu`` writes the
    linear's grad-output quantizer, ``backward_activation_bias.py:80``), then dgrad / wgrad GEMMs
    (``basic_linear.py:853`` "NN", ``:901`` "NT") on the FP8 operands.  Returns the fused and the unfused ``y``."""
    xq, sx = quant_fwd(x)
    wq, sw = quant_fwd(w)
    d = (_exact_matmul(xq, wq.T) * (sx * sw)).astype(F32)  # cuBLAS: fl32(fl32(sa * sb) * acc)
    y_pre = _bf16(d + b.float().numpy())
    y_unfused = torch.relu(_bf16(d) + b)
    y = torch.relu(y_pre)
    g32 = torch.where(y_pre > 0, dy.float(), torch.zeros(()))  # drelu in float32 (exact here)
    db = g32.sum(0).to(torch.bfloat16)
    gq, sg = quant_bwd(g32.to(torch.bfloat16))
    dx = _bf16(_exact_matmul(gq, wq) * (sg * sw))
    dw = _bf16(_exact_matmul(gq.T, xq) * (sg * sx))
    return y, y_unfused, dx, dw, db


@pytest.mark.parametrize("recipe_name", ["current", "delayed"])
def test_linear_bias_relu_per_tensor_matches_te_kernels(recipe_name: str) -> None:
    """Current scaling (HYBRID: E4M3 forward, E5M2 backward) and delayed scaling on its first step (scale 1):
    y, dx, dW, db bit-exact; the unfused bias rounding gives other bits (negative control)."""
    model, linear, bias = _linear_bias_relu()
    x, dy = _randn(16, 32, seed=1), _dyadic(16, 16, seed=4)
    if recipe_name == "current":
        recipe = Float8CurrentScaling()
        fwd, bwd = (lambda t: _current(t, "e4m3")), (lambda t: _current(t, "e5m2"))
    else:
        recipe = DelayedScaling()
        fwd = lambda t: (_cast(t.float().numpy(), "e4m3"), F32(1))  # noqa: E731
        bwd = lambda t: (_cast(t.float().numpy(), "e5m2"), F32(1))  # noqa: E731
    y, dx = _run(model, recipe, x, dy)
    ref_y, ref_unfused, ref_dx, ref_dw, ref_db = _per_tensor_reference(
        x, linear.weight.detach(), bias.bias.detach(), dy, fwd, bwd
    )
    assert not torch.equal(ref_y, ref_unfused)
    assert torch.equal(y, ref_y)
    assert torch.equal(dx, ref_dx)
    assert torch.equal(linear.weight.grad, ref_dw)
    assert torch.equal(bias.bias.grad, ref_db)
    fused = model._module_groups[0]
    assert [type(op).__name__ for op, _ in fused._forward_ops] == ["ForwardLinearBiasActivation", "ReLU"]
    assert [type(op).__name__ for op, _ in fused._backward_ops] == ["BasicLinear", "BackwardActivationBias"]


def test_delayed_scaling_updates_scales_as_te() -> None:
    """TE ``quantization.py`` delayed scaling: the forward scales update when autocast exits, the backward ones
    after the backward of the region's first op, ``scale = fp8_max / max(amax_history)`` (margin 0)."""
    model, linear, _ = _linear_bias_relu()
    x, dy = _randn(16, 32, seed=1), _dyadic(16, 16, seed=4)
    y, _ = _run(model, DelayedScaling(fp8_format=Format.HYBRID), x, dy)
    amax_x, amax_w = F32(x.float().abs().max()), F32(linear.weight.detach().float().abs().max())
    assert linear.get_quantizer("forward", 0).scale.item() == F32(448) / amax_x
    assert linear.get_quantizer("forward", 1).scale.item() == F32(448) / amax_w
    g_amax = F32((y > 0).float().mul(dy.float()).abs().max())  # the relu gradient the linear's backward quantized
    assert linear.get_quantizer("backward", 0).scale.item() == F32(57344) / g_amax


def _mx_values(t, columnwise: bool) -> np.ndarray:
    """An MXFP8Tensor's values from its raw codes and E8M0 scales (rowwise blocks of 32 along the last dim,
    columnwise along the first; TE ``mxfp8_tensor.py``), as float64."""
    m, k = t.shape
    if columnwise:
        codes, s = t._columnwise_data, t._columnwise_scale_inv[: m // 32, :k].repeat_interleave(32, dim=0)
    else:
        codes, s = t._rowwise_data, t._rowwise_scale_inv[:m, : k // 32].repeat_interleave(32, dim=1)
    return (codes.view(torch.float8_e4m3fn).double() * torch.exp2(s.double() - 127)).numpy()


def _block_values(t, columnwise: bool) -> np.ndarray:
    """A Float8BlockwiseQTensor's values from its raw codes and float32 scale_inv (TE layouts: 1x128 rowwise
    scale ``[j, m]``, columnwise data ``(K, M)`` with scale ``[i, k]``; 128x128 one scale per tile)."""
    m, k = t.shape
    if t._is_2D_scaled:
        codes = t._rowwise_data.view(torch.float8_e4m3fn).double()
        s = t._rowwise_scale_inv[: m // 128, : k // 128].double().repeat_interleave(128, 0).repeat_interleave(128, 1)
    elif columnwise:
        codes = t._columnwise_data.view(torch.float8_e4m3fn).double().T
        s = t._columnwise_scale_inv[: m // 128, :k].double().repeat_interleave(128, dim=0)
    else:
        codes = t._rowwise_data.view(torch.float8_e4m3fn).double()
        s = t._rowwise_scale_inv[: k // 128, :m].double().T.repeat_interleave(128, dim=1)
    return (codes * s).numpy()


@pytest.mark.parametrize("recipe_name", ["mxfp8", "mxfp8_2d", "block"])
def test_linear_bias_relu_block_scaled_matches_te_kernels(recipe_name: str) -> None:
    """MXFP8 (1D and 2D weights) and FP8 block scaling (1x128 activations and gradients, 128x128 weights):
    the operands are TE's quantizers' tensors for each role (``RecipeState.make_quantizers``), the GEMMs the
    exact sums of their values rounded once; dbias from the float32 dact (fused ``dbias_drelu``)."""
    n = 128
    torch.manual_seed(0)
    linear, bias = te_ops.BasicLinear(n, n, dtype=torch.bfloat16), te_ops.Bias(n, dtype=torch.bfloat16)
    with torch.no_grad():
        linear.weight.copy_(_randn(n, n, seed=2))
        bias.bias.copy_(_randn(n, seed=3))
    model = te_ops.Sequential(linear, bias, te_ops.ReLU())
    x, dy = _randn(n, n, seed=1), _dyadic(n, n, seed=4)
    if recipe_name.startswith("mxfp8"):
        recipe = MXFP8BlockScaling(enable_2d_quantization=recipe_name == "mxfp8_2d")
        qx = qg = te.MXFP8Quantizer(te.DType.kFloat8E4M3)
        qw = te.MXFP8Quantizer(te.DType.kFloat8E4M3, with_2d_quantization=recipe.enable_2d_quantization)
        values = _mx_values
    else:
        recipe = Float8BlockScaling()

        def block(dim, dtype=te.DType.kFloat8E4M3):
            return te.Float8BlockQuantizer(dtype, rowwise=True, columnwise=True, block_scaling_dim=dim)

        qx, qw, qg, values = block(1), block(2), block(1), _block_values
    y, dx = _run(model, recipe, x, dy)
    xq, wq = qx(x), qw(linear.weight.detach())
    y_pre = _bf16(_exact_matmul(values(xq, False), values(wq, False).T) + bias.bias.detach().float().numpy())
    assert torch.equal(y, torch.relu(y_pre))
    g = torch.where(y_pre > 0, dy, torch.zeros((), dtype=torch.bfloat16))
    gq = qg(g)
    assert torch.equal(dx, _bf16(_exact_matmul(values(gq, False), values(wq, True))))
    assert torch.equal(linear.weight.grad, _bf16(_exact_matmul(values(gq, True).T, values(xq, True))))
    assert torch.equal(bias.bias.grad, g.float().sum(0).to(torch.bfloat16))


def test_ops_linear_equals_te_linear_module_under_every_recipe() -> None:
    """On a GPU ``te.ops.Linear`` and ``te.Linear`` run the same cuBLAS GEMM with the bias in its epilogue
    (bf16): fp8sim gives them the same bits too (NVFP4 without stochastic rounding, whose random bits differ)."""
    from fp8sim.recipe import NVFP4BlockScaling

    recipes = [None, DelayedScaling(), Float8CurrentScaling(), MXFP8BlockScaling(), Float8BlockScaling()]
    recipes.append(NVFP4BlockScaling(disable_stochastic_rounding=True))
    n = 128
    for recipe in recipes:
        torch.manual_seed(0)
        mod, op = te.Linear(n, n, params_dtype=torch.bfloat16), te_ops.Linear(n, n, dtype=torch.bfloat16)
        with torch.no_grad():
            op.weight.copy_(mod.weight)
            op.bias.copy_(_randn(n, seed=5))
            mod.bias.copy_(op.bias)
        x, dy = _randn(n, n, seed=6), _randn(n, n, seed=7)
        outs = []
        for layer in (mod, op):
            xi = x.clone().requires_grad_(True)
            with te.autocast(enabled=recipe is not None, recipe=recipe):
                y = layer(xi)
            y.backward(dy)
            outs.append((y, xi.grad, layer.weight.grad, layer.bias.grad))
        for a, b in zip(*outs, strict=True):
            assert torch.equal(a, b), type(recipe).__name__


@pytest.mark.parametrize(
    ("profile", "mmaemu_profile", "shape"),
    [
        ("rtx4060_cublaslt_12_8_te", "ada-te", (16, 4096, 32)),  # TE's 4 MiB workspace: split in 3, pairwise
        ("h100_pcie_cublaslt_12_8_te", "hopper-te", (16, 8192, 64)),  # split in 3, contiguous
    ],
)
def test_ops_linear_under_a_device_profile_equals_mmaemu(profile: str, mmaemu_profile: str, shape: tuple) -> None:
    """``autocast(accumulator=PROFILE)`` reaches the fusible ops' GEMM as it reaches ``te.Linear``'s: the forward
    is mmaemu 0.1.0's ``scaled_mm`` under the TE-caller profile, fed DelayedScaling's first casts (scale 1)."""
    import warnings

    mmaemu = require("mmaemu")
    t, i, o = shape
    torch.manual_seed(t + i + o)
    op = te_ops.Linear(i, o, bias=False, dtype=torch.bfloat16)
    x = torch.randn(t, i, dtype=torch.bfloat16)
    with torch.no_grad(), te.autocast(recipe=DelayedScaling(), accumulator=profile):
        y = op(x)
    a8 = x.float().to(torch.float8_e4m3fn)  # satfinite RN with scale 1: these values stay far below 448
    b8 = op.weight.detach().float().to(torch.float8_e4m3fn).t()  # (K, N), column-major as cuBLASLt wants it
    one = torch.tensor(1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # mmaemu warns that TE-caller split decisions are experimental
        want = mmaemu.scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16, use_fast_accum=True, profile=mmaemu_profile)
    assert torch.equal(y.view(torch.int16), want.view(torch.int16))


@pytest.mark.parametrize("layout", ["NN", "NT"])
def test_quantized_gemm_accumulates_into_out_with_beta_one(layout: str) -> None:
    """The fused epilogue TE's BackwardLinearAdd / wgrad-into-main_grad use (general_gemm with accumulate=True,
    alpha = beta = 1, no bias): result = op_B(B) @ op_A(A) + out.  Small integers keep every product and sum
    exact, so the float64 reference is the only possible answer whatever the summation order."""
    from fp8sim.pytorch.constants import DType
    from fp8sim.pytorch.ops._gemm import ops_gemm
    from fp8sim.pytorch.tensor.float8_tensor import Float8Quantizer

    q = Float8Quantizer(torch.ones(1), torch.zeros(1), DType.kFloat8E4M3)
    g = torch.Generator().manual_seed(1)
    a = torch.randint(-4, 5, (16, 32), generator=g).float()
    b = torch.randint(-4, 5, (16, 8) if layout == "NT" else (8, 16), generator=g).float()
    prod = b.double().T @ a.double() if layout == "NT" else b.double() @ a.double()
    out = torch.randint(-8, 9, tuple(prod.shape), generator=g).to(torch.bfloat16)
    want = (prod + out.double()).to(torch.bfloat16)
    got = ops_gemm(q(a), q(b), layout=layout, out_dtype=torch.bfloat16, accumulate=True, out=out.clone(), beta=1.0)
    assert torch.equal(got, want)
