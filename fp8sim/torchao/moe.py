"""torchao 0.18's MoE training conversion (``torchao/prototype/moe_training``), emulated: routed-expert
grouped GEMMs ``torch._grouped_mm(x, w_t, offs=offs)`` in MXFP8 or FP8 rowwise, forward and backward.

- MXFP8 (``mxfp8_grouped_mm.py`` ``_MXFP8GroupedMM``): with ``KernelPreference.EMULATED`` (runs on a CPU) the
  torchao arithmetic bit for bit: ``to_mx`` casts (E4M3, 32-blocks, RCEIL by default) of ``x`` along K and
  of the experts ``w_t.transpose(-2, -1)`` along K; both dequantized **in bfloat16** (``data.to(bf16) *
  scale.to(bf16)``) and multiplied by ``torch._grouped_mm``; dgrad casts ``grad`` along N and ``w_t`` along
  N; wgrad casts ``grad.t()`` and ``x.t()`` along the tokens (blocks may straddle groups, as torchao's) and
  runs the 2d x 2d grouped mm (``wgrad_with_hp``: unquantized).  ``AUTO`` (SM100 kernels) is emulated as
  the same casts through :func:`fp8sim.gemm.scaled_grouped_mm` (block-scaled GEMMs, ``out_dtype``), forward
  and backward: dgrad ``grad`` 1x32 along N times the experts 32x1 along N; wgrad ``grad.t()`` and ``x.t()``
  along the tokens, a 2d x 2d grouped mm whose token groups must be multiples of 32 (torchao's
  ``offs // 32`` scale rearrangement); re-derived from ``_compute_*_sm100``, not measured.
  ``pad_token_groups_for_grouped_mm=True`` pads each token group to a multiple of 32 in a zeroed buffer
  (torchao's ``torch_pad_token_groups``) and unpads the output; its backward pads ``grad`` the same way.
- FP8 rowwise (``fp8_grouped_mm.py`` ``_Float8GroupedMM``, Triton/CUDA only in torchao, so re-derived from
  its source): power-of-2 torchao scales ``max / max(amax, 1e-12)`` per token row (over K) and per expert
  column (over K); ``torch._scaled_grouped_mm(..., 1/scales, out_dtype=bf16, use_fast_accum=True)``;
  dgrad: grad rowwise over N, experts per (expert, k) over N; wgrad: per-group column scales of grad and
  ``x`` over each group's tokens, a 2d x 2d scaled grouped mm.  GEMMs through
  :func:`fp8sim.gemm.scaled_grouped_mm` (``accumulator``, default ``"dequantized_fp32"``).

:func:`convert_to_moe_training` wraps the selected parameters so that ``torch._grouped_mm`` calls with
them as ``mat_b`` (2d x 3d with ``offs``) take the path of the config, as torchao's weight wrapper
tensors do; every other op sees a plain tensor.  Linears are converted by
:func:`~fp8sim.torchao.convert_to_float8_training` / :func:`~fp8sim.torchao.convert_to_mxfp8_training`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np
import torch
from torch import nn

from ..cast import decode
from ..formats import E4M3, E8M0, get_format
from ..gemm.grouped import grouped_mm, scaled_grouped_mm
from ..scaling.current import torchao_amax_to_scale
from ..scaling.mx import quantize_mx
from ._double_backward import refuse_double_backward
from .mx_linear import KernelPreference, MXFP8TrainingOpConfig, ScaleCalculationMode

__all__ = [
    "Float8TrainingRecipe",
    "Float8TrainingOpConfig",
    "mxfp8_grouped_mm",
    "fp8_rowwise_grouped_mm",
    "convert_to_moe_training",
]

_BLOCK = 32
_AUTO_MODES = (ScaleCalculationMode.FLOOR, ScaleCalculationMode.RCEIL)


class Float8TrainingRecipe(Enum):
    """torchao ``moe_training/config.py``."""

    FP8_ROWWISE = "fp8_rowwise"


@dataclass
class Float8TrainingOpConfig:
    """torchao's ``Float8TrainingOpConfig`` fields and defaults (CUDA dtypes; MI300's fnuz is not chosen)."""

    float8_dtype: torch.dtype = torch.float8_e4m3fn
    out_dtype: torch.dtype | None = torch.bfloat16
    pad_token_groups_for_grouped_mm: bool = False
    float8_linear_recipe: str = "rowwise"

    @classmethod
    def from_recipe(cls, recipe: Float8TrainingRecipe | str) -> Float8TrainingOpConfig:
        if Float8TrainingRecipe(recipe) is Float8TrainingRecipe.FP8_ROWWISE:
            return cls()
        raise ValueError(f"Unsupported FP8 recipe: {recipe}")  # pragma: no cover - one member


# -- MXFP8 --------------------------------------------------------------------------------------


def _mx_bf16(x: torch.Tensor, mode: ScaleCalculationMode) -> torch.Tensor:
    """``to_mx`` of a contiguous 2-D/3-D tensor along its last dim, dequantized as torchao's emulated grouped
    GEMMs do: ``data.to(bf16) * scale.to(bf16)`` (the float32 product rounded once to bf16)."""
    q = quantize_mx(x.detach().contiguous(), "e4m3", axis=-1, scale_rule=mode.value, flavor="torchao")
    vals = decode(q.codes, E4M3) * np.repeat(decode(q.scales, E8M0), _BLOCK, axis=-1)
    return torch.from_numpy(vals).to(torch.bfloat16)


def _mx_codes(x: torch.Tensor, mode: ScaleCalculationMode) -> tuple[torch.Tensor, torch.Tensor]:
    q = quantize_mx(x.detach().contiguous(), "e4m3", axis=-1, scale_rule=mode.value, flavor="torchao")
    return torch.from_numpy(q.codes).view(torch.float8_e4m3fn), torch.from_numpy(q.scales)


class _MXFP8GroupedMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w_t: torch.Tensor, offs: torch.Tensor, cfg: MXFP8TrainingOpConfig, acc: Any):  # type: ignore[override]
        ctx.save_for_backward(x, w_t, offs)
        ctx.cfg, ctx.acc = cfg, acc
        mode, out_dtype = cfg.scale_calculation_mode, cfg.out_dtype or torch.bfloat16
        if cfg.kernel_preference is KernelPreference.EMULATED:
            a = _mx_bf16(x, mode)
            b = _mx_bf16(w_t.transpose(-2, -1), mode).transpose(-2, -1).contiguous()  # (E, K, N)
            return grouped_mm(a, b, offs=offs, out_dtype=out_dtype)
        a, sa = _mx_codes(x, mode)
        b, sb = _mx_codes(w_t.transpose(-2, -1), mode)  # (E, N, K), (E, N, K/32)
        return scaled_grouped_mm(
            a, b.transpose(-2, -1), sa, sb.transpose(-2, -1), offs, out_dtype=out_dtype, accumulator=acc,
            device="blackwell",
        )  # fmt: skip

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        refuse_double_backward("the MXFP8 grouped GEMMs (MoE)")
        x, w_t, offs = ctx.saved_tensors
        cfg = ctx.cfg
        mode, out_dtype = cfg.scale_calculation_mode, cfg.out_dtype or torch.bfloat16
        grad = grad.contiguous()
        if cfg.kernel_preference is not KernelPreference.EMULATED:
            return (*_mxfp8_auto_backward(grad, x, w_t, offs, cfg, ctx.acc), None, None, None)
        go = _mx_bf16(grad, mode)  # along N
        w = _mx_bf16(w_t, mode)  # (E, K, N) along N
        w = w.transpose(-2, -1).contiguous()  # (E, N, K), torchao's reshape copy
        grad_x = grouped_mm(go, w, offs=offs, out_dtype=out_dtype)
        if cfg.wgrad_with_hp:
            grad_w = grouped_mm(grad.t(), x, offs=offs, out_dtype=out_dtype)
        else:
            go_t = _mx_bf16(grad.t(), mode)  # (N, M) along the tokens
            x_t = _mx_bf16(x.t(), mode)  # (K, M)
            grad_w = grouped_mm(go_t, x_t.t(), offs=offs, out_dtype=out_dtype)
        return grad_x, grad_w.transpose(-2, -1), None, None, None


def _mxfp8_auto_backward(
    grad: torch.Tensor, x: torch.Tensor, w_t: torch.Tensor, offs: torch.Tensor, cfg: MXFP8TrainingOpConfig, acc: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """torchao's ``_compute_dgrad_sm100`` / ``_compute_wgrad_sm100``: the same ``to_mx`` casts as EMULATED
    (torchao's CUDA/CuTe/Triton cast kernels are tested against ``to_mx``), the GEMMs block-scaled."""
    mode, out_dtype = cfg.scale_calculation_mode, cfg.out_dtype or torch.bfloat16
    # dgrad: grad (M, N) 1x32 along N; experts (E, N, K) 32x1 along N (to_mx of w_t (E, K, N) along N)
    g, sg = _mx_codes(grad, mode)
    w, sw = _mx_codes(w_t, mode)  # (E, K, N), (E, K, N/32)
    grad_x = scaled_grouped_mm(
        g, w.transpose(-2, -1), sg, sw.transpose(-2, -1), offs, out_dtype=out_dtype, accumulator=acc,
        device="blackwell",
    )  # fmt: skip
    if cfg.wgrad_with_hp:
        grad_w = grouped_mm(grad.t(), x, offs=offs, out_dtype=out_dtype)
        return grad_x, grad_w.transpose(-2, -1)
    # wgrad: grad.t() (N, M) and x.t() (K, M) cast along the tokens (torchao's dim1 cast), then a 2d x 2d
    # block-scaled grouped mm over the token groups (offs // 32 picks each group's scale blocks)
    gt, sgt = _mx_codes(grad.t(), mode)  # (N, M), (N, M/32)
    xt, sxt = _mx_codes(x.t(), mode)  # (K, M), (K, M/32)
    grad_w = scaled_grouped_mm(
        gt, xt.t(), sgt, sxt.t(), offs, out_dtype=out_dtype, accumulator=acc, device="blackwell"
    )  # (E, N, K)
    return grad_x, grad_w.transpose(-2, -1)


def mxfp8_grouped_mm(
    x: torch.Tensor,
    w_t: torch.Tensor,
    offs: torch.Tensor,
    config: MXFP8TrainingOpConfig | None = None,
    *,
    accumulator: Any = "blackwell",
) -> torch.Tensor:
    """torchao's ``_to_mxfp8_then_scaled_grouped_mm(x, w_t, offs, ...)``: ``x`` (M, K) tokens grouped by
    ``offs``, ``w_t`` (E, K, N) experts; returns (M, N) in ``config.out_dtype`` (module docstring)."""
    cfg = MXFP8TrainingOpConfig(kernel_preference=KernelPreference.EMULATED) if config is None else config
    if x.dim() != 2 or w_t.dim() != 3:
        raise ValueError(f"x must be 2D and w_t 3D; got {x.dim()}D and {w_t.dim()}D")
    if cfg.kernel_preference is KernelPreference.AUTO and cfg.scale_calculation_mode not in _AUTO_MODES:
        # torchao's SM100 cast kernels (CuTe 1x32, CUDA 3d and dim1) take scaling_mode "floor" or "rceil"
        raise ValueError(
            f"scale_calculation_mode must be FLOOR or RCEIL with KernelPreference.AUTO, "
            f"got {cfg.scale_calculation_mode.name}"
        )
    if not cfg.pad_token_groups_for_grouped_mm:
        return _MXFP8GroupedMM.apply(x, w_t, offs, cfg, accumulator)
    # torchao's torch_pad_token_groups / torch_unpad_token_groups (kernels/mxfp8/quant.py): each group copied
    # to a zeroed buffer at 32-aligned starts; the gather's backward zero-pads grad_output the same way
    idx, padded_offs, rows = _padded_token_rows(offs, x.shape[0])
    xp = x.new_zeros((rows, x.shape[1])).index_copy(0, idx, x)
    return _MXFP8GroupedMM.apply(xp, w_t, padded_offs, cfg, accumulator).index_select(0, idx)


def _padded_token_rows(offs: torch.Tensor, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Row of each token in torchao's padded buffer, the padded group end offsets, and the buffer's rows
    (``num_tokens + groups * 32`` rounded up to 32, torchao's upper bound)."""
    ends = [int(v) for v in offs.tolist()]
    starts = [0, *ends[:-1]]
    rows, pos, p_ends = [], 0, []
    for s, e in zip(starts, ends, strict=True):
        rows.extend(range(pos, pos + e - s))
        pos += -(-(e - s) // _BLOCK) * _BLOCK
        p_ends.append(pos)
    total = -(-(num_tokens + len(ends) * _BLOCK) // _BLOCK) * _BLOCK
    idx = torch.tensor(rows, dtype=torch.int64, device=offs.device)
    return idx, torch.tensor(p_ends, dtype=torch.int32, device=offs.device), total


# -- FP8 rowwise ----------------------------------------------------------------------------------


def _fp8_axiswise(x: torch.Tensor, dim: int, fmt: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes and the *dequantization* scales (1/scale) of ``x`` scaled per slice reducing ``dim``
    (power-of-2 torchao scales, ``satfinite(RN(fl32(x) * scale))``)."""
    from ..cast import encode

    x32 = x.detach().float().numpy()
    amax = np.max(np.abs(x32), axis=dim, keepdims=True, initial=np.float32(0))
    scale = torchao_amax_to_scale(amax, fmt, round_scales_to_power_of_2=True)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):  # an Inf amax: scale 0, as torchao's
        codes = encode(x32 * scale, fmt, saturate=True)
        inverse = np.float32(1) / scale
    return torch.from_numpy(codes).view(fmt.torch_dtype), torch.from_numpy(inverse)


class _Float8GroupedMM(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, w_t: torch.Tensor, offs: torch.Tensor, cfg: Float8TrainingOpConfig, acc: Any
    ):  # type: ignore[override]
        ctx.save_for_backward(x, w_t, offs)
        ctx.cfg, ctx.acc = cfg, acc
        fmt = get_format({torch.float8_e4m3fn: "e4m3", torch.float8_e4m3fnuz: "e4m3fnuz"}[cfg.float8_dtype])
        ctx.fmt = fmt
        a, sa = _fp8_axiswise(x, -1, fmt)  # per token, over K
        b, sb = _fp8_axiswise(w_t, -2, fmt)  # per (expert, n), over K
        return scaled_grouped_mm(
            a, b, sa.reshape(-1), sb.reshape(sb.shape[0], -1), offs, out_dtype=cfg.out_dtype,
            use_fast_accum=True, accumulator=acc,
        )  # fmt: skip

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        refuse_double_backward("the float8 grouped GEMMs (MoE)")
        x, w_t, offs = ctx.saved_tensors
        cfg, acc, fmt = ctx.cfg, ctx.acc, ctx.fmt
        grad = grad.contiguous()
        g, sg = _fp8_axiswise(grad, -1, fmt)  # per token, over N
        w = w_t.transpose(-2, -1)  # (E, N, K)
        b, sb = _fp8_axiswise(w, -2, fmt)  # per (expert, k), over N
        grad_x = scaled_grouped_mm(
            g, b, sg.reshape(-1), sb.reshape(sb.shape[0], -1), offs, out_dtype=cfg.out_dtype, use_fast_accum=True,
            accumulator=acc,
        )  # fmt: skip
        ends = [int(v) for v in offs.tolist()]
        starts = [0, *ends[:-1]]
        n, k = grad.shape[1], x.shape[1]
        gt_codes = torch.zeros((n, x.shape[0]), dtype=torch.uint8)
        x_codes = torch.zeros((x.shape[0], k), dtype=torch.uint8)
        s_gt = torch.ones((len(ends), n))
        s_x = torch.ones((len(ends), k))
        for e, (s, t) in enumerate(zip(starts, ends, strict=True)):
            if t > s:  # per-group column scales over the group's tokens
                c, sc = _fp8_axiswise(grad[s:t], 0, fmt)
                gt_codes[:, s:t], s_gt[e] = c.view(torch.uint8).t(), sc.reshape(-1)
                c, sc = _fp8_axiswise(x[s:t], 0, fmt)
                x_codes[s:t], s_x[e] = c.view(torch.uint8), sc.reshape(-1)
        grad_w = scaled_grouped_mm(
            gt_codes.view(fmt.torch_dtype), x_codes.view(fmt.torch_dtype), s_gt, s_x, offs, out_dtype=cfg.out_dtype,
            use_fast_accum=True, accumulator=acc,
        )  # fmt: skip
        return grad_x, grad_w.transpose(-2, -1), None, None, None


def fp8_rowwise_grouped_mm(
    x: torch.Tensor,
    w_t: torch.Tensor,
    offs: torch.Tensor,
    config: Float8TrainingOpConfig | None = None,
    *,
    accumulator: Any = "dequantized_fp32",
) -> torch.Tensor:
    """torchao's ``_to_fp8_rowwise_then_scaled_grouped_mm(x, w_t, offs, ...)`` (module docstring)."""
    cfg = Float8TrainingOpConfig() if config is None else config
    if cfg.pad_token_groups_for_grouped_mm:
        raise NotImplementedError("pad_token_groups_for_grouped_mm=True is not yet supported (torchao's words)")
    if x.dim() != 2 or w_t.dim() != 3:
        raise ValueError(f"x must be 2D and w_t 3D; got {x.dim()}D and {w_t.dim()}D")
    if x.shape[-1] % 16 or w_t.shape[-2] % 16 or w_t.shape[-1] % 16:
        raise ValueError(f"A must have a last dim divisible by 16 and B its last 2 dims; got {x.shape}, {w_t.shape}")
    return _Float8GroupedMM.apply(x, w_t, offs, cfg, accumulator)


# -- conversion -----------------------------------------------------------------------------------


class _GroupedTrainingWeight(torch.Tensor):
    """A parameter whose ``torch._grouped_mm(x, self, offs=...)`` takes the low-precision path."""

    _fp8sim_config: Any = None
    _fp8sim_accumulator: Any = None

    @staticmethod
    def __new__(cls, data: torch.Tensor, config: Any, accumulator: Any) -> _GroupedTrainingWeight:
        t = torch.Tensor._make_subclass(cls, data, data.requires_grad)
        t._fp8sim_config, t._fp8sim_accumulator = config, accumulator
        return t

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") == "_grouped_mm" and len(args) >= 2 and isinstance(args[1], cls):
            a, b = args[0], args[1]
            offs = kwargs.get("offs", args[2] if len(args) > 2 else None)
            if a.dim() == 2 and b.dim() == 3 and offs is not None and not isinstance(a, cls):
                cfg, acc = b._fp8sim_config, b._fp8sim_accumulator
                with torch._C.DisableTorchFunctionSubclass():
                    if isinstance(cfg, MXFP8TrainingOpConfig):
                        return mxfp8_grouped_mm(a, b, offs, cfg, accumulator=acc)
                    return fp8_rowwise_grouped_mm(a, b, offs, cfg, accumulator=acc)
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        if func in (torch.Tensor.detach, torch.Tensor.requires_grad_) and isinstance(args[0], cls):
            return cls(out, args[0]._fp8sim_config, args[0]._fp8sim_accumulator)  # Parameter() needs the type
        return out


def convert_to_moe_training(
    module: nn.Module,
    *,
    config: MXFP8TrainingOpConfig | Float8TrainingOpConfig,
    module_filter_fn: Callable[[nn.Module, str], bool] | None = None,
    accumulator: Any = None,
) -> nn.Module:
    """Wrap the parameters of every module passing ``module_filter_fn(module, fqn)`` (default: all) so
    their grouped GEMMs run as ``config`` says (module docstring); returns ``module``, changed in place."""
    if not isinstance(config, (MXFP8TrainingOpConfig, Float8TrainingOpConfig)):
        raise TypeError(
            f"config must be an MXFP8TrainingOpConfig or Float8TrainingOpConfig, got {type(config).__name__}"
        )
    if accumulator is None:
        accumulator = "blackwell" if isinstance(config, MXFP8TrainingOpConfig) else "dequantized_fp32"
    for fqn, mod in module.named_modules():
        if module_filter_fn is not None and not module_filter_fn(mod, fqn):
            continue
        for name, p in list(mod.named_parameters(recurse=False)):
            if not isinstance(p, _GroupedTrainingWeight):
                wrapped = _GroupedTrainingWeight(p.data, config, accumulator)
                setattr(mod, name, nn.Parameter(wrapped, requires_grad=p.requires_grad))
    return module
