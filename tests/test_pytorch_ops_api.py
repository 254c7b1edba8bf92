"""``te.ops`` options, refusals, checkpoints and imports (TE 2.20.0.dev0 ``pytorch/ops``).

Every option has a test that fails if the option is ignored; references are written from TE's source
(file and line cited) on data whose float32 arithmetic is exact (small multiples of 1/8).
"""

from __future__ import annotations

import subprocess
import sys
import warnings

import ml_dtypes
import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

import fp8sim.pytorch as te  # noqa: E402
import fp8sim.pytorch.ops as te_ops  # noqa: E402
from fp8sim._util.upstream_quirk import UpstreamQuirkWarning  # noqa: E402
from fp8sim.recipe import (  # noqa: E402
    DelayedScaling,
    Float8CurrentScaling,
    Format,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
    QParams,
)

BF16 = torch.bfloat16


def _dyadic(*shape: int, seed: int, den: int = 8, lim: int = 16, dtype: torch.dtype = BF16) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(-lim, lim + 1, shape, generator=g).double() / den).to(dtype)


def _linear(n_in: int, n_out: int, seed: int, **kw) -> te_ops.BasicLinear:
    op = te_ops.BasicLinear(n_in, n_out, dtype=BF16, **kw)
    with torch.no_grad():
        op.weight.copy_(_dyadic(n_out, n_in, seed=seed))
    return op


@pytest.mark.parametrize("overwrite", [False, True])
def test_accumulate_into_main_grad_adds_or_overwrites_wgrad(overwrite: bool) -> None:
    """basic_linear.py:1060-1110: wgrad written into ``weight.main_grad`` (float32, beta = 1 unless
    ``overwrite_main_grad``); ``grad_added_to_main_grad`` params get TE's dummy ``.grad``."""
    op = _linear(16, 8, seed=1, accumulate_into_main_grad=True)
    op.weight.main_grad = torch.full((8, 16), 0.5)
    op.weight.overwrite_main_grad = overwrite
    op.weight.grad_added_to_main_grad = False
    x, dy = _dyadic(4, 16, seed=2).requires_grad_(True), _dyadic(4, 8, seed=3)
    op(x).backward(dy)
    wgrad = (dy.double().t() @ x.detach().double()).float()
    assert torch.equal(op.weight.main_grad, wgrad if overwrite else wgrad + 0.5)
    if not overwrite:
        assert op.weight.grad_added_to_main_grad is True and op.weight.grad.shape == (8, 16)
    plain = _linear(16, 8, seed=1)  # negative control: without the option the gradient is .grad
    plain.weight.main_grad = torch.full((8, 16), 0.5)
    plain(x.detach().requires_grad_(True)).backward(dy)
    assert torch.equal(plain.weight.main_grad, torch.full((8, 16), 0.5))
    assert torch.equal(plain.weight.grad, wgrad.to(BF16))


@pytest.mark.parametrize(("fwd", "bwd"), [(True, False), (False, True), (True, True), (False, False)])
def test_quantize_forward_and_backward_flags(fwd: bool, bwd: bool) -> None:
    """quantize.py:57-84: the output is quantized iff ``forward``, the grad input iff ``backward``; identity
    values (E4M3-exact inputs, delayed scaling's first step has scale 1)."""
    x = _dyadic(32, 32, seed=4).requires_grad_(True)
    with te.autocast(recipe=DelayedScaling(fp8_format=Format.E4M3)):
        y = te_ops.Quantize(forward=fwd, backward=bwd)(x)
    y.backward(_dyadic(32, 32, seed=5))
    assert isinstance(y, te.QuantizedTensor) == fwd and isinstance(x.grad, te.QuantizedTensor) == bwd
    assert torch.equal(y.float() if fwd else y, x.detach().float() if fwd else x.detach())


@pytest.mark.parametrize("override", ["high_precision", "dequantized"])
def test_backward_override_runs_the_backward_gemms_on_te_operands(override: str) -> None:
    """basic_linear.py:1014-1017 and :1043: ``high_precision`` keeps the original input and weight,
    ``dequantized`` the quantized forward operands (dequantized), for an unquantized backward."""
    op = _linear(32, 32, seed=6)
    x = torch.randn(32, 32, generator=torch.Generator().manual_seed(7)).to(BF16).requires_grad_(True)
    dy = _dyadic(32, 32, seed=8)
    with te.autocast(recipe=Float8CurrentScaling(backward_override=override)):
        y = op(x)
    y.backward(dy)
    w = op.weight.detach()
    if override == "dequantized":
        w = te.Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3)(w).dequantize(dtype=BF16)
    ref = (dy.double() @ w.double()).float().to(BF16)
    quantized = te.Float8CurrentScalingQuantizer(te.DType.kFloat8E5M2)(dy).dequantize(dtype=BF16)
    assert not torch.equal(ref, (quantized.double() @ w.double()).float().to(BF16))
    assert torch.equal(x.grad, ref)


def test_cache_quantized_input_saves_an_e4m3_current_scaled_input() -> None:
    """activation.py:105-110: the saved input is E4M3 current-scaled; SReLU's gradient 2x reads it."""
    x = torch.randn(32, 32, generator=torch.Generator().manual_seed(9)).to(BF16)
    dy = torch.ones(32, 32, dtype=BF16)
    grads = []
    for cache in (False, True):
        xi = x.clone().requires_grad_(True)
        te_ops.SReLU(cache_quantized_input=cache)(xi).backward(dy)
        grads.append(xi.grad)
    xq = te.Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3)(x).dequantize(dtype=BF16).float()
    assert torch.equal(grads[1], (2 * torch.relu(xq)).to(BF16))
    assert not torch.equal(grads[0], grads[1])


def test_glu_interleave_size_reads_alternating_blocks() -> None:
    """swiglu.py:139-151: blocks of ``glu_interleave_size`` alternate gate and linear units; the gradient
    comes back in the interleaved layout."""
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(10)).requires_grad_(True)
    plain_in = x.detach().reshape(4, 2, 2, 16).transpose(1, 2).reshape(4, 64).requires_grad_(True)
    y = te_ops.SwiGLU(glu_interleave_size=16)(x)
    y_ref = te_ops.SwiGLU()(plain_in)
    dy = torch.randn(4, 32, generator=torch.Generator().manual_seed(11))
    y.backward(dy)
    y_ref.backward(dy)
    assert torch.equal(y, y_ref) and not torch.equal(y, te_ops.SwiGLU()(x.detach()))
    assert torch.equal(x.grad, plain_in.grad.reshape(4, 2, 2, 16).transpose(1, 2).reshape(4, 64))


def test_zero_centered_gamma_and_eps() -> None:
    """layer_norm.py / normalization kernels: ``zero_centered_gamma`` uses ``gamma + 1`` (initialised to 0),
    ``eps`` enters the variance."""
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(12))
    zc, plain = te_ops.LayerNorm(32, zero_centered_gamma=True), te_ops.LayerNorm(32)
    assert torch.equal(zc.weight, torch.zeros(32)) and torch.equal(zc(x), plain(x))
    assert torch.equal(plain(x), torch.nn.functional.layer_norm(x, (32,), eps=1e-5))
    assert not torch.equal(te_ops.LayerNorm(32, eps=1.0)(x), plain(x))
    r = te_ops.RMSNorm(32, eps=0.5)(x)
    assert torch.equal(r, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 0.5))


def test_dropout_fused_kernel_semantics() -> None:
    """dropout.cu:245-246: bf16 and numel % 16 == 0 use the fused kernel: drop iff a random byte is below
    ``floor(256 p)``, keep ``fl32(x * fl32(1 / (1 - p)))``; evaluation is the identity."""
    x = _dyadic(64, 64, seed=13, den=1024, lim=2000) + 3
    op = te_ops.Dropout(0.3)
    y = op(x)
    kept = y != 0
    scale = np.float32(1) / np.float32(np.float32(1) - np.float32(0.3))
    assert torch.equal(y[kept], (x.float()[kept] * torch.tensor(scale)).to(BF16))
    assert abs(1 - kept.float().mean().item() - 76 / 256) < 0.03  # floor(256 * 0.3) = 76
    op.eval()
    assert torch.equal(op(x), x)


def test_add_extra_input_in_place_writes_into_the_extra_tensor() -> None:
    """add_extra_input.py:79-85."""
    x, extra = torch.ones(4), torch.full((4,), 2.0)
    y = te_ops.AddExtraInput()(x, extra)
    assert torch.equal(y, torch.full((4,), 3.0)) and torch.equal(extra, torch.full((4,), 2.0))
    y = te_ops.AddExtraInput(in_place=True)(x, extra)
    assert y.data_ptr() == extra.data_ptr() and torch.equal(extra, torch.full((4,), 3.0))


def test_current_scaling_qparams_power_of_two_applies_and_amax_epsilon_does_not() -> None:
    """basic_linear.py:396-404: the ops set the role's ``power_2_scale`` on ``force_pow_2_scales`` but its
    ``amax_epsilon`` on ``amax_epsilon_scales``, which TE's quantizer does not read: no effect (a warning)."""
    recipe = Float8CurrentScaling()
    recipe.fp8_quant_fwd_inp = QParams(power_2_scale=True, amax_epsilon=1e6)
    op = _linear(32, 32, seed=14)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with te.autocast(recipe=recipe):
            op(torch.randn(32, 32).to(BF16))
    q = op.get_quantizer("forward", 0)
    assert q.force_pow_2_scales is True and q.amax_epsilon == 0.0 and q.amax_epsilon_scales == 1e6
    assert any(issubclass(w.category, UpstreamQuirkWarning) for w in caught)


def test_bias_backward_writes_the_previous_ops_grad_quantizer() -> None:
    """bias.py:126-140 (``tex.bgrad_quantize``): dbias is the float32 row sum, ``dy`` leaves quantized."""
    x = _dyadic(32, 32, seed=15).requires_grad_(True)
    dy = _dyadic(32, 32, seed=16)
    model = te_ops.Sequential(te_ops.Quantize(forward=False, backward=True), te_ops.Bias(32, dtype=BF16))
    with te.autocast(recipe=DelayedScaling(fp8_format=Format.E4M3)):
        model(x).backward(dy)
    assert isinstance(x.grad, te.Float8Tensor) and torch.equal(x.grad.dequantize(dtype=BF16), dy)
    assert torch.equal(model[1].bias.grad, dy.float().sum(0).to(BF16))


def test_situglu_and_clamped_swiglu_parameters_change_the_output() -> None:
    """swiglu.py:230-238 (betas finite and positive) and :287 (limit, alpha, offset)."""
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(17)) * 4
    with pytest.raises(ValueError, match="beta1"):
        te_ops.SiTUGLU(beta1=0.0)
    with pytest.raises(ValueError, match="beta2"):
        te_ops.ScaledSiTUGLU(beta2=float("inf"))
    g, u = x.chunk(2, dim=-1)
    assert torch.equal(
        te_ops.SiTUGLU(beta1=3.0, beta2=12.0)(x), 3 * torch.tanh(g / 3) * torch.sigmoid(g) * 12 * torch.tanh(u / 12)
    )
    base = te_ops.ClampedSwiGLU()(x)
    for kw in ({"limit": 2.0}, {"alpha": 1.0}, {"glu_linear_offset": 0.0}):
        assert not torch.equal(te_ops.ClampedSwiGLU(**kw)(x), base)


def test_refusals_name_what_needs_cuda() -> None:
    """Userbuffers (peer-to-peer GPU buffers), cuDNN normalization and CuTe grouped-MLP kernels are refused."""
    with pytest.raises(NotImplementedError, match="Userbuffers .*needs CUDA.*several GPUs.*not emulated"):
        te_ops.BasicLinear(16, 16, userbuffers_options={"comm_name": "qkv"})
    for make in (te.Linear, te.LayerNormLinear, te.LayerNormMLP):  # issue 27: a refusal says it needs CUDA
        with pytest.raises(NotImplementedError, match=f"{make.__name__}: Userbuffers .*needs CUDA.*not emulated"):
            make(16, 16, ub_overlap_ag=True)
    with pytest.raises(NotImplementedError, match="Userbuffers"):
        te_ops.fused.UserbuffersForwardLinear()
    with pytest.raises(NotImplementedError, match="CuTe"):
        te_ops.fused.GroupedMLP_CuTeGEMMGLU()
    op = te_ops.GroupedLinear(2, 16, 16, single_grouped_weight=True)
    with pytest.raises(RuntimeError, match="native grouped-tensor GroupedLinear path"):
        op(torch.randn(4, 16), torch.tensor([2, 2]))


def test_norm_with_cudnn_env_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """normalization.cpp:103-113: ``NVTE_NORM_FWD_USE_CUDNN=1`` switches quantized outputs to cuDNN kernels."""
    monkeypatch.setenv("NVTE_NORM_FWD_USE_CUDNN", "1")
    model = te_ops.Sequential(te_ops.LayerNorm(32), te_ops.Quantize())
    with pytest.raises(NotImplementedError, match="NVTE_NORM_FWD_USE_CUDNN"), te.autocast(recipe=MXFP8BlockScaling()):
        model(torch.randn(32, 32))


def test_extra_state_round_trips_delayed_scaling_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """op.py:640-760: a pickled ``{mode: {recipe, scale_*, amax_history_*, extra_fp8_variables}}``; loading a
    stateful pickle needs ``NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1``; stateless recipes give an empty tensor."""
    src = te_ops.Sequential(te_ops.Linear(32, 32))
    x = torch.randn(32, 32)
    with te.autocast(recipe=DelayedScaling(amax_history_len=4)):
        src(x).sum().backward()
    sd = src.state_dict()
    blob = sd["0.basic_ops.0._extra_state"]
    assert (
        blob.dtype == torch.uint8 and blob.numel() > 0 and b"transformer_engine.common.recipe" in blob.numpy().tobytes()
    )
    dst = te_ops.Sequential(te_ops.Linear(32, 32))
    monkeypatch.delenv("NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE", raising=False)
    with pytest.raises(RuntimeError, match="NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE"):
        dst.load_state_dict(sd)
    monkeypatch.setenv("NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE", "1")
    dst = te_ops.Sequential(te_ops.Linear(32, 32))
    dst.load_state_dict(sd)
    for mode in ("forward", "backward"):
        a, b = src[0].basic_ops[0]._state(mode), dst[0].basic_ops[0]._state(mode)
        assert torch.equal(a.scale, b.scale) and torch.equal(a.amax_history, b.amax_history)
    assert torch.equal(src[0].basic_ops[0].weight, dst[0].basic_ops[0].weight)
    stateless = te_ops.Linear(32, 32)
    with te.autocast(recipe=Float8CurrentScaling()):
        stateless(x)
    assert stateless.basic_ops[0].get_extra_state().numel() == 0


def test_nvfp4_4over6_quantized_data_uses_the_tensors_e4m3_max() -> None:
    """quantize_4over6_nvfp4.cuh: a 4over6 tensor with E4M3 max 256 has ``S_enc = 6 * 256 / amax``; its GEMM
    record (``quantized_data``) carries ``fl32(1 / S_enc)`` and dequantizes to the tensor's values up to the
    order of the float32 products (it used 448 before: a factor 448/256 off)."""
    q = te.NVFP4Quantizer(nvfp4_use_4over6=True, nvfp4_e4m3_max=256, columnwise=False)
    t = q(torch.randn(32, 64, generator=torch.Generator().manual_seed(18)).to(BF16))
    rec = t.quantized_data()
    amax = np.float32(t._amax_rowwise.item())
    assert rec.global_scale == np.float32(1) / (np.float32(1536) / amax)
    np.testing.assert_allclose(rec.dequantize(), t.dequantize(dtype=torch.float32).numpy(), rtol=3e-7, atol=0)


def test_block_2d_quantized_data_reads_the_columnwise_copy() -> None:
    """A 128x128-scaled tensor keeps one set of tiles: with its rowwise copy dropped (the backward's usage),
    the record comes from the transposed columnwise copy."""
    q = te.Float8BlockQuantizer(te.DType.kFloat8E4M3, rowwise=True, columnwise=True, block_scaling_dim=2)
    t = q(torch.randn(256, 128, generator=torch.Generator().manual_seed(19)))
    full = t.quantized_data().dequantize()
    t.update_usage(rowwise_usage=False, columnwise_usage=True)
    assert np.array_equal(t.quantized_data(columnwise=True).dequantize(), full)


def test_nvfp4_fp32_input_with_rht_is_refused_as_te() -> None:
    """NVFP4 RHT takes bf16 only (csrc/quantizer.cpp); TE's ops quantize through the quantizer, which refuses."""
    with (
        pytest.raises(RuntimeError, match="RHT is only supported for bfloat16"),
        te.autocast(recipe=NVFP4BlockScaling()),
    ):
        te_ops.Linear(32, 32)(torch.randn(32, 32, requires_grad=True)).sum().backward()


def test_transformer_engine_ops_resolve_under_fp8sim_run() -> None:
    """``fp8sim run --device-map cuda=cpu``: TE's ``ops`` names import, CUDA's RNG state is the CPU
    generator's, and a float32 CUDA autocast (which torch's CPU autocast refuses) computes in float32."""
    script = (
        "import torch, transformer_engine.pytorch as te\n"
        "import transformer_engine.pytorch.ops as te_ops\n"
        "from transformer_engine.pytorch.ops.fused import ForwardLinearBiasActivation\n"
        "from transformer_engine.pytorch.ops.basic.grouped_linear import OUTPUT_BUFFER_KEY\n"
        "s = torch.cuda.get_rng_state(); a = torch.rand(2); torch.cuda.set_rng_state(s)\n"
        "assert torch.equal(torch.rand(2), a)\n"
        "x = torch.ones(4, 4, dtype=torch.bfloat16, device='cuda')\n"
        "with torch.autocast(device_type='cuda', dtype=torch.float32):\n"
        "    y = te_ops.Linear(4, 4, bias=False, dtype=torch.bfloat16)(x)\n"
        "print(y.dtype, te_ops.Sequential.__module__, OUTPUT_BUFFER_KEY)\n"
    )
    cmd = [sys.executable, "-m", "fp8sim", "run", "--quiet", "--device-map", "cuda=cpu", "-c", script]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["torch.float32", "fp8sim.pytorch.ops.sequential", "output"]


def test_float8_e4m3_reference_cast_is_satfinite() -> None:
    """The references' cast (ml_dtypes after clamping) saturates like TE's ``cast_to_fp8`` (sanity of the oracle)."""
    v = np.array([500.0, -1e9, 1.0625 + 2**-12], np.float32)
    out = np.clip(v, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    assert out.tolist() == [448.0, -448.0, 1.125]


def test_fuser_saves_through_tes_saved_tensor_protocol() -> None:
    """TE ops/fuser.py 224-228: the fused autograd function saves the ops' tensors with prepare_for_saving +
    save_for_backward and keeps the objects in ``tensor_objects``; TE's test_backward_override.py reads them
    back with ``restore_from_saved(y.grad_fn.tensor_objects, y.grad_fn.saved_tensors)``.  BasicLinear saves
    (x_local, w) (basic_linear.py 1044-1053): under backward_override="dequantized", x quantized by current
    scaling (E4M3: scale = 448 / amax, codes = e4m3(x * scale))."""
    from fp8sim.pytorch.tensor.quantized_tensor import restore_from_saved
    from fp8sim.recipe import Float8CurrentScaling

    torch.manual_seed(0)
    m = te_ops.Linear(32, 16, dtype=torch.float32)
    x = torch.randn(16, 32, requires_grad=True)
    with te.autocast(enabled=True, recipe=Float8CurrentScaling(backward_override="dequantized")):
        y = m(x)
    saved = restore_from_saved(y.grad_fn.tensor_objects, list(y.grad_fn.saved_tensors))
    assert len(saved) == 2
    xs = x.detach().numpy()
    scale = np.float32(448.0) / np.abs(xs).max()
    want = (xs * scale).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) / scale
    np.testing.assert_array_equal(saved[0].dequantize(dtype=torch.float32).numpy(), want)
    y.sum().backward()
    assert x.grad is not None and m.weight.grad is not None
