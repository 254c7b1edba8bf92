"""Grouped GEMMs (``fp8sim.gemm.grouped``) and torchao 0.18's MoE training conversion (``fp8sim.torchao.moe``).

Oracles: torch's own ``torch._grouped_mm`` (CPU) for the grouped layouts; torch's CPU ``torch._scaled_mm``
per group for the rowwise scaled grouped mm; torchao's real ``_to_mxfp8_then_scaled_grouped_mm`` with
``KernelPreference.EMULATED`` (``torchao/prototype/moe_training/mxfp8_grouped_mm.py``) and torchao's
``quantize_(model, MXFP8TrainingOpConfig(...))`` conversion for the MXFP8 path, bit for bit, forward,
every gradient and two SGD steps.  FP8 rowwise (Triton-only in torchao) against a reference written here
from ``fp8_grouped_mm.py``.
"""

from __future__ import annotations

import copy

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")
ao_mx_gmm = require("torchao.prototype.moe_training.mxfp8_grouped_mm")
ao_cfg = require("torchao.prototype.moe_training.config")

from torch import nn  # noqa: E402
from torchao.quantization.quantize_.common.kernel_preference import KernelPreference as AoKP  # noqa: E402

import fp8sim.torchao as fs  # noqa: E402
from fp8sim.gemm.grouped import grouped_mm, scaled_grouped_mm  # noqa: E402
from fp8sim.testing import assert_bit_exact  # noqa: E402
from fp8sim.torchao.moe import (  # noqa: E402
    Float8TrainingOpConfig,
    convert_to_moe_training,
    fp8_rowwise_grouped_mm,
    mxfp8_grouped_mm,  # noqa: E402
)

OFFS = [32, 64, 64, 128]  # four experts, one of them empty


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # bit-exact: reductions split by thread


def _offs(ends=OFFS):
    return torch.tensor(ends, dtype=torch.int32)


# -- torch._grouped_mm semantics ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_grouped_mm_layouts_equal_torch(dtype):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(128, 64, generator=g).to(dtype)
    b3 = torch.randn(4, 64, 32, generator=g).to(dtype)
    assert_bit_exact(grouped_mm(a, b3, offs=_offs()), torch._grouped_mm(a, b3, offs=_offs()))
    go = torch.randn(128, 32, generator=g).to(dtype)
    assert_bit_exact(grouped_mm(go.t(), a, offs=_offs()), torch._grouped_mm(go.t(), a, offs=_offs()))
    a3 = torch.randn(4, 8, 64, generator=g).to(dtype)
    assert_bit_exact(grouped_mm(a3, b3), torch._grouped_mm(a3, b3))


def test_grouped_mm_rows_past_the_last_offset_are_zero_and_arguments_are_checked():
    a, b = torch.ones(8, 16), torch.ones(2, 16, 4)
    out = grouped_mm(a, b, offs=_offs([2, 5]))
    assert (out[5:] == 0).all() and (out[:5] == 16).all()
    with pytest.raises(ValueError, match="non-decreasing"):
        grouped_mm(a, b, offs=_offs([5, 2]))
    with pytest.raises(ValueError, match="1-D int32"):
        grouped_mm(a, b, offs=torch.tensor([2, 5]))
    with pytest.raises(ValueError, match="offs is required"):
        grouped_mm(a, b)
    with pytest.raises(ValueError, match="out_dtype must be"):
        grouped_mm(a, b, offs=_offs([2, 5]), out_dtype=torch.float16)


def test_scaled_grouped_mm_rowwise_equals_torch_scaled_mm_per_group():
    """2d x 3d with rowwise scales: each group is ``torch._scaled_mm(a_g, b_g, sa_g, sb_g)`` (CPU)."""
    g = torch.Generator().manual_seed(1)
    a = torch.randn(128, 64, generator=g).to(torch.float8_e4m3fn)
    b = torch.randn(4, 64, 32, generator=g).to(torch.float8_e4m3fn)
    sa, sb = torch.rand(128, generator=g) + 0.5, torch.rand(4, 32, generator=g) + 0.5
    got = scaled_grouped_mm(a, b, sa, sb, _offs(), accumulator="cpu_reference")
    starts = [0, *OFFS[:-1]]
    for e, (s, t) in enumerate(zip(starts, OFFS, strict=True)):
        if t > s:
            want = torch._scaled_mm(
                a[s:t], b[e].t().contiguous().t(), sa[s:t, None], sb[e][None, :], out_dtype=torch.bfloat16
            )
            assert_bit_exact(got[s:t], want)


# -- MXFP8 grouped GEMM against torchao EMULATED --------------------------------------------------------


def _inputs(dtype, seed=2):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(128, 64, generator=g) * torch.exp(torch.randn(128, 64, generator=g))).to(dtype)
    w = torch.randn(4, 96, 64, generator=g).to(dtype)
    return x, w


def _run(fn, x, w):
    x = x.clone().requires_grad_(True)
    w_t = w.transpose(-2, -1).detach().requires_grad_(True)  # (E, K, N), per-expert column-major as torchao wants
    out = fn(x, w_t)
    out.float().square().sum().backward()
    return {"output": out.detach(), "grad_x": x.grad, "grad_w_t": w_t.grad}


@pytest.mark.parametrize("wgrad_with_hp", [False, True], ids=["wgrad_mx", "wgrad_hp"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_mxfp8_grouped_mm_equals_torchao_emulated(dtype, wgrad_with_hp):
    x, w = _inputs(dtype)
    cfg = fs.MXFP8TrainingOpConfig(kernel_preference="emulated", wgrad_with_hp=wgrad_with_hp)

    def theirs(a, b):
        return ao_mx_gmm._to_mxfp8_then_scaled_grouped_mm(
            a, b, _offs(), kernel_preference=AoKP.EMULATED, wgrad_with_hp=wgrad_with_hp
        )

    def ours(a, b):
        return mxfp8_grouped_mm(a, b, _offs(), cfg)

    if dtype == torch.float32 and wgrad_with_hp:  # torchao's hp wgrad mixes bf16 grads with fp32 inputs
        with pytest.raises(RuntimeError, match="same dtype"):
            _run(theirs, x, w)
        with pytest.raises(ValueError, match="same dtype"):
            _run(ours, x, w)
        return
    got, want = _run(ours, x, w), _run(theirs, x, w)
    for k in want:
        assert got[k].dtype == want[k].dtype, k
        assert_bit_exact(got[k], want[k])


class _Experts(nn.Module):
    def __init__(self, dim: int = 64, hidden: int = 64, n: int = 4) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.w1 = nn.Parameter((torch.randn(n, hidden, dim, generator=g) * 0.2).transpose(-2, -1))
        self.w2 = nn.Parameter((torch.randn(n, dim, hidden, generator=g) * 0.2).transpose(-2, -1))

    def forward(self, x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        h = torch.relu(torch._grouped_mm(x, self.w1, offs=offs))
        return torch._grouped_mm(h, self.w2, offs=offs)


class _MoE(nn.Module):
    """Top-1 routing with a fixed router; tokens sorted by expert, the experts as grouped GEMMs."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(64, 4, bias=False)
        self.experts = _Experts()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            choice = self.router(x).argmax(-1)
        order = torch.argsort(choice, stable=True)
        counts = torch.bincount(choice, minlength=4)
        offs = torch.cumsum(counts, 0).to(torch.int32)
        y = self.experts(x[order], offs)
        return torch.empty_like(y).index_copy_(0, order, y)


def _train(model, x, target, steps=2):
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses, grads = [], []
    for _ in range(steps):
        opt.zero_grad()
        loss = (model(x).float() - target).square().mean()
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        opt.step()
        losses.append(loss.detach())
    return losses, grads


def _moe_data():
    g = torch.Generator().manual_seed(4)
    torch.manual_seed(0)
    model = _MoE().to(torch.bfloat16)
    x = torch.randn(128, 64, generator=g).to(torch.bfloat16)
    target = torch.randn(128, 64, generator=g)
    return model, x, target


def test_moe_layer_trains_under_mxfp8_bit_equal_to_torchao_quantize_():
    from torchao.quantization import quantize_

    model, x, target = _moe_data()
    theirs, ours = copy.deepcopy(model), copy.deepcopy(model)
    ao_config = ao_cfg.MXFP8TrainingOpConfig(kernel_preference=AoKP.EMULATED)
    quantize_(theirs, ao_config, filter_fn=lambda m, fqn: fqn == "experts")
    cfg = fs.MXFP8TrainingOpConfig.from_recipe("mxfp8_emulated_rceil")
    convert_to_moe_training(ours, config=cfg, module_filter_fn=lambda m, fqn: fqn == "experts")
    l_ours, g_ours = _train(ours, x, target)
    l_theirs, g_theirs = _train(theirs, x, target)
    for a, b in zip(l_ours, l_theirs, strict=True):
        assert_bit_exact(a, b)
    for step_ours, step_theirs in zip(g_ours, g_theirs, strict=True):
        assert step_ours.keys() == step_theirs.keys()
        for k in step_theirs:
            assert_bit_exact(step_ours[k].as_subclass(torch.Tensor), step_theirs[k].as_subclass(torch.Tensor))
    more, _ = _train(ours, x, target, steps=6)
    assert more[-1] < l_ours[0]


def _fp8_reference_forward(x, w_t, ends):
    """torchao ``fp8_grouped_mm.py`` forward: power-of-2 rowwise scales of x over K and of each expert's
    columns over K, ``torch._scaled_mm`` per group with the reciprocal scales (CPU: dequantize-then-mm)."""
    out = torch.zeros(x.shape[0], w_t.shape[2], dtype=torch.bfloat16)

    def cast(t, dim):
        amax = t.float().abs().amax(dim=dim, keepdim=True).double()
        scale = (448.0 / torch.clamp(amax, min=1e-12)).float()
        scale = torch.exp2(torch.floor(torch.log2(scale)))
        return (t.float() * scale).clamp(-448, 448).to(torch.float8_e4m3fn), scale.reciprocal()

    xa, sx = cast(x, -1)
    starts = [0, *ends[:-1]]
    for e, (s, t) in enumerate(zip(starts, ends, strict=True)):
        if t > s:
            wb, sw = cast(w_t[e], 0)
            out[s:t] = torch._scaled_mm(xa[s:t], wb.t().contiguous().t(), sx[s:t], sw, out_dtype=torch.bfloat16)
    return out


def test_fp8_rowwise_grouped_mm_forward_equals_reference_and_moe_trains():
    x, w = _inputs(torch.bfloat16, seed=5)
    w_t = w.transpose(-2, -1)
    got = fp8_rowwise_grouped_mm(x, w_t, _offs(), accumulator="cpu_reference")
    assert_bit_exact(got, _fp8_reference_forward(x, w_t, OFFS))
    model, xm, target = _moe_data()
    cfg = Float8TrainingOpConfig.from_recipe("fp8_rowwise")
    convert_to_moe_training(model, config=cfg, module_filter_fn=lambda m, fqn: fqn == "experts")
    losses, grads = _train(model, xm, target, steps=6)
    assert losses[-1] < losses[0]
    assert all(torch.isfinite(g).all() for step in grads for g in step.values())


def test_config_names_equal_torchao():
    assert [(r.name, r.value) for r in fs.moe.Float8TrainingRecipe] == [
        (r.name, r.value) for r in ao_cfg.Float8TrainingRecipe
    ]
    ours, theirs = Float8TrainingOpConfig(), ao_cfg.Float8TrainingOpConfig()
    for name in ("float8_dtype", "out_dtype", "pad_token_groups_for_grouped_mm", "float8_linear_recipe"):
        assert getattr(ours, name) == getattr(theirs, name), name
    with pytest.raises(TypeError, match="config must be"):
        convert_to_moe_training(nn.Linear(4, 4), config="mxfp8")


# -- MXFP8 KernelPreference.AUTO, forward and backward ------------------------------------------------


def _ao_to_mx(t):
    """torchao's own ``to_mx`` (``mx_formats/mx_tensor.py``, runs on a CPU), RCEIL: E4M3 codes and E8M0 scales
    along the last dim, dequantized exactly in float64."""
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import to_mx

    scale, data = to_mx(t.contiguous(), torch.float8_e4m3fn, 32, scaling_mode=ScaleCalculationMode.RCEIL)
    s = torch.exp2(scale.view(torch.uint8).double() - 127)
    return (data.double().reshape(*t.shape[:-1], -1, 32) * s.unsqueeze(-1)).reshape(t.shape)


def _exact_to_bf16(v):
    """The exact accumulator: the exact sum (float64 holds it for these magnitudes) rounded to float32, then
    to bfloat16 (``torch._scaled_grouped_mm(..., out_dtype=torch.bfloat16)``)."""
    return v.float().to(torch.bfloat16)


def _mxfp8_auto_reference(x, w_t, grad, ends):
    """torchao ``mxfp8_grouped_mm.py`` ``_compute_fwd_sm100`` (l. 492-538): x 1x32 along K, experts
    ``w_t.transpose(-2, -1)`` 1x32 along K; ``_compute_dgrad_sm100`` (l. 587-640): grad 1x32 along N, the
    experts (E, N, K) 32x1 along N (``scale_block_dim1=block_size``); ``_compute_wgrad_sm100`` (l. 694-774):
    ``grad.t()`` and ``x.t()`` cast along the tokens (dim1 kernels), each group's tokens ``offs // 32`` scale
    blocks, ``grad_w = (grad_t @ x)`` per group, returned transposed."""
    starts = [0, *ends[:-1]]
    xq = _ao_to_mx(x)
    wq = _ao_to_mx(w_t.transpose(-2, -1))  # (E, N, K) along K
    gq = _ao_to_mx(grad)  # (M, N) along N
    wnq = _ao_to_mx(w_t).transpose(-2, -1)  # (E, N, K), blocks along N
    gtq, xtq = _ao_to_mx(grad.t()), _ao_to_mx(x.t())  # (N, M), (K, M) along the tokens
    out = torch.zeros(x.shape[0], w_t.shape[2], dtype=torch.bfloat16)
    gx = torch.zeros(x.shape, dtype=torch.bfloat16)
    gw = torch.zeros(w_t.shape, dtype=torch.bfloat16)
    for e, (s, t) in enumerate(zip(starts, ends, strict=True)):
        if t > s:
            out[s:t] = _exact_to_bf16(xq[s:t] @ wq[e].t())
            gx[s:t] = _exact_to_bf16(gq[s:t] @ wnq[e])
            gw[e] = _exact_to_bf16(gtq[:, s:t] @ xtq[:, s:t].t()).t()
    return {"output": out, "grad_x": gx, "grad_w_t": gw}


def test_mxfp8_auto_forward_and_backward_equal_block_scaled_reference():
    x, w = _inputs(torch.bfloat16, seed=6)
    cfg = fs.MXFP8TrainingOpConfig.from_recipe("mxfp8_rceil")
    assert cfg.kernel_preference is fs.KernelPreference.AUTO
    got = _run(lambda a, b: mxfp8_grouped_mm(a, b, _offs(), cfg, accumulator="exact"), x, w)
    w_t = w.transpose(-2, -1)
    grad = (2 * got["output"].float()).to(torch.bfloat16)  # d(sum(out.float()^2))/d out, in bf16
    want = _mxfp8_auto_reference(x, w_t, grad, OFFS)
    for k in want:
        assert got[k].dtype == want[k].dtype, k
        assert_bit_exact(got[k], want[k])


def test_mxfp8_auto_equals_torchao_emulated_where_every_sum_is_exact():
    """Small integers: every product and partial sum is exact in float32, so torchao's EMULATED (bf16
    dequantize, ``torch._grouped_mm``) and the block-scaled AUTO GEMMs must give the same bits."""
    g = torch.Generator().manual_seed(7)
    x = torch.randint(-3, 4, (128, 64), generator=g).to(torch.bfloat16)
    w = torch.randint(-2, 3, (4, 96, 64), generator=g).to(torch.bfloat16)
    cfg = fs.MXFP8TrainingOpConfig(kernel_preference="auto")

    def theirs(a, b):
        return ao_mx_gmm._to_mxfp8_then_scaled_grouped_mm(a, b, _offs(), kernel_preference=AoKP.EMULATED)

    got = _run(lambda a, b: mxfp8_grouped_mm(a, b, _offs(), cfg, accumulator="blackwell"), x, w)
    want = _run(theirs, x, w)
    for k in want:
        assert_bit_exact(got[k], want[k])


def test_mxfp8_auto_wgrad_refuses_token_groups_off_the_32_grid():
    x, w = _inputs(torch.bfloat16)
    cfg = fs.MXFP8TrainingOpConfig(kernel_preference="auto")
    with pytest.raises(ValueError, match="offs must be multiples of 32"):
        _run(lambda a, b: mxfp8_grouped_mm(a, b, _offs([40, 64, 64, 128]), cfg), x, w)
    ceil = fs.MXFP8TrainingOpConfig(kernel_preference="auto", scale_calculation_mode="ceil")
    with pytest.raises(ValueError, match="scale_calculation_mode must be FLOOR or RCEIL with KernelPreference.AUTO"):
        mxfp8_grouped_mm(x, w.transpose(-2, -1), _offs(), ceil)


# -- MoE training: gradients bit-equal to references written from torchao's source, two steps ------------


def _fp8_cast(t, dim):
    """torchao ``kernels/float8_rowwise.py`` l. 343-376 and ``jagged_float8_scales.py`` l. 683-748: amax over
    ``dim`` in float64, ``448 / clamp(amax, 1e-12)`` to float32, ``exp2(floor(log2(.)))``, then
    ``clamp(t.float() * scale, -448, 448)`` cast to E4M3; returns the codes and the reciprocal scale."""
    amax = t.float().abs().amax(dim=dim, keepdim=True).double()
    scale = (448.0 / torch.clamp(amax, min=1e-12)).float()
    scale = torch.exp2(torch.floor(torch.log2(scale)))
    return (t.float() * scale).clamp(-448, 448).to(torch.float8_e4m3fn), scale.reciprocal()


def _colmajor(t):
    return t.t().contiguous().t()


class _Fp8GroupedReference(torch.autograd.Function):
    """torchao ``fp8_grouped_mm.py`` ``_Float8GroupedMM`` (l. 136-185 forward, 231-319 backward) with
    ``torch._scaled_grouped_mm`` replaced by CPU ``torch._scaled_mm`` per group."""

    @staticmethod
    def forward(ctx, x, w_t, ends):
        ctx.save_for_backward(x, w_t)
        ctx.ends = ends
        starts = [0, *ends[:-1]]
        xa, sx = _fp8_cast(x, -1)
        out = torch.zeros(x.shape[0], w_t.shape[2], dtype=torch.bfloat16)
        for e, (s, t) in enumerate(zip(starts, ends, strict=True)):
            if t > s:
                wb, sw = _fp8_cast(w_t[e], 0)  # per (expert, n) over K
                out[s:t] = torch._scaled_mm(xa[s:t], _colmajor(wb), sx[s:t], sw, out_dtype=torch.bfloat16)
        return out

    @staticmethod
    def backward(ctx, grad):
        x, w_t = ctx.saved_tensors
        ends = ctx.ends
        starts = [0, *ends[:-1]]
        grad = grad.contiguous()
        ga, sg = _fp8_cast(grad, -1)  # per token over N
        gx = torch.zeros(x.shape, dtype=torch.bfloat16)
        gw = torch.zeros(w_t.shape, dtype=torch.bfloat16)
        for e, (s, t) in enumerate(zip(starts, ends, strict=True)):
            if t > s:
                wn, swn = _fp8_cast(w_t[e].t(), 0)  # (N, K), per (expert, k) over N
                gx[s:t] = torch._scaled_mm(ga[s:t], _colmajor(wn), sg[s:t], swn, out_dtype=torch.bfloat16)
                gc, sgc = _fp8_cast(grad[s:t], 0)  # per-group column scales over the group's tokens
                xc, sxc = _fp8_cast(x[s:t], 0)
                gw_e = torch._scaled_mm(
                    gc.t().contiguous(), _colmajor(xc), sgc.reshape(-1, 1), sxc, out_dtype=torch.bfloat16
                )
                gw[e] = gw_e.t()
        return gx, gw, None


class _FixedRoutedExperts(nn.Module):
    """Two grouped GEMMs over fixed token groups (``OFFS``, one expert empty); ``fn`` replaces ``_grouped_mm``."""

    def __init__(self, fn=None) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(8)
        self.w1 = nn.Parameter((torch.randn(4, 64, 64, generator=g) * 0.2).to(torch.bfloat16).transpose(-2, -1))
        self.w2 = nn.Parameter((torch.randn(4, 64, 64, generator=g) * 0.2).to(torch.bfloat16).transpose(-2, -1))
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mm = self.fn or (lambda a, b: torch._grouped_mm(a, b, offs=_offs()))
        return mm(torch.relu(mm(x, self.w1)), self.w2)


def _fixed_data():
    g = torch.Generator().manual_seed(9)
    return torch.randn(128, 64, generator=g).to(torch.bfloat16), torch.randn(128, 64, generator=g)


def _assert_two_steps_equal(ours, ref):
    x, target = _fixed_data()
    l_ours, g_ours = _train(ours, x, target)
    l_ref, g_ref = _train(ref, x, target)
    for a, b in zip(l_ours, l_ref, strict=True):
        assert_bit_exact(a, b)
    for step_ours, step_ref in zip(g_ours, g_ref, strict=True):
        assert step_ours.keys() == step_ref.keys() == {"w1", "w2"}
        for k in step_ref:
            assert_bit_exact(step_ours[k].as_subclass(torch.Tensor), step_ref[k])
    assert l_ours[1] < l_ours[0]


def test_moe_fp8_rowwise_gradients_equal_torchao_reference_for_two_steps():
    ours = convert_to_moe_training(
        _FixedRoutedExperts(), config=Float8TrainingOpConfig.from_recipe("fp8_rowwise"), accumulator="cpu_reference"
    )
    ref = _FixedRoutedExperts(lambda a, b: _Fp8GroupedReference.apply(a, b, OFFS))
    _assert_two_steps_equal(ours, ref)


class _MxAutoReference(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w_t):
        ctx.save_for_backward(x, w_t)
        return _mxfp8_auto_reference(x, w_t, torch.zeros(x.shape[0], w_t.shape[2], dtype=x.dtype), OFFS)["output"]

    @staticmethod
    def backward(ctx, grad):
        x, w_t = ctx.saved_tensors
        r = _mxfp8_auto_reference(x, w_t, grad.contiguous(), OFFS)
        return r["grad_x"], r["grad_w_t"]


def test_moe_mxfp8_auto_gradients_equal_block_scaled_reference_for_two_steps():
    cfg = fs.MXFP8TrainingOpConfig.from_recipe("mxfp8_rceil")
    ours = convert_to_moe_training(_FixedRoutedExperts(), config=cfg, accumulator="exact")
    _assert_two_steps_equal(ours, _FixedRoutedExperts(_MxAutoReference.apply))


UNALIGNED = [20, 64, 64, 101]  # group sizes 20, 44, 0, 37; tokens past 101 belong to no group


@pytest.mark.parametrize("wgrad_with_hp", [False, True], ids=["wgrad_mx", "wgrad_hp"])
def test_mxfp8_padded_token_groups_equal_torchao_emulated(wgrad_with_hp):
    """``pad_token_groups_for_grouped_mm=True``: torchao pads each group to a multiple of 32
    (``kernels/mxfp8/quant.py`` ``torch_pad_token_groups``), runs the grouped GEMMs, unpads."""
    x, w = _inputs(torch.bfloat16, seed=10)
    x = x[:101]
    cfg = fs.MXFP8TrainingOpConfig(
        kernel_preference="emulated", wgrad_with_hp=wgrad_with_hp, pad_token_groups_for_grouped_mm=True
    )

    def theirs(a, b):
        return ao_mx_gmm._to_mxfp8_then_scaled_grouped_mm(
            a, b, _offs(UNALIGNED), kernel_preference=AoKP.EMULATED, wgrad_with_hp=wgrad_with_hp,
            pad_token_groups_for_grouped_mm=True,
        )  # fmt: skip

    got = _run(lambda a, b: mxfp8_grouped_mm(a, b, _offs(UNALIGNED), cfg), x, w)
    want = _run(theirs, x, w)
    for k in want:
        assert got[k].shape == want[k].shape, k
        assert_bit_exact(got[k], want[k])


def test_mxfp8_auto_with_padded_groups_equals_torchao_emulated_where_every_sum_is_exact():
    g = torch.Generator().manual_seed(11)
    x = torch.randint(-3, 4, (101, 64), generator=g).to(torch.bfloat16)
    w = torch.randint(-2, 3, (4, 96, 64), generator=g).to(torch.bfloat16)
    cfg = fs.MXFP8TrainingOpConfig(kernel_preference="auto", pad_token_groups_for_grouped_mm=True)

    def theirs(a, b):
        return ao_mx_gmm._to_mxfp8_then_scaled_grouped_mm(
            a, b, _offs(UNALIGNED), kernel_preference=AoKP.EMULATED, pad_token_groups_for_grouped_mm=True
        )

    got = _run(lambda a, b: mxfp8_grouped_mm(a, b, _offs(UNALIGNED), cfg), x, w)
    want = _run(theirs, x, w)
    for k in want:
        assert_bit_exact(got[k], want[k])


def test_routed_moe_trains_under_mxfp8_auto_with_padded_token_groups():
    model, x, target = _moe_data()
    cfg = fs.MXFP8TrainingOpConfig(kernel_preference="auto", pad_token_groups_for_grouped_mm=True)
    convert_to_moe_training(model, config=cfg, module_filter_fn=lambda m, fqn: fqn == "experts", accumulator="exact")
    losses, grads = _train(model, x, target, steps=4)
    assert losses[-1] < losses[0]
    assert all(torch.isfinite(g).all() for step in grads for g in step.values())


def test_create_graph_through_the_grouped_gemms_is_refused_at_the_first_backward() -> None:
    """torchao 0.18's emulated MXFP8 grouped GEMM differentiates twice; fp8sim's cannot, so it refuses
    (issue 29.7: never a silently constant gradient)."""
    model, x, _ = _moe_data()
    cfg = fs.MXFP8TrainingOpConfig.from_recipe("mxfp8_emulated_rceil")
    convert_to_moe_training(model, config=cfg, module_filter_fn=lambda m, fqn: fqn == "experts")
    x = x.clone().requires_grad_(True)
    with pytest.raises(NotImplementedError, match="create_graph=True .* MXFP8 grouped GEMMs"):
        torch.autograd.grad(model(x).float().square().sum(), x, create_graph=True)
    (g,) = torch.autograd.grad(model(x).float().square().sum(), x)  # a plain backward still runs
    assert not g.requires_grad
