"""``Float8Linear``: torchao's float8 training arithmetic, emulated (the swap is ``float8_linear_utils``).

A linear layer runs three GEMMs (spec 6.2), each ``a @ b`` with ``a``'s reduction dim last, on the
2-D views torchao uses (so the float32 BLAS call sees the same layouts)::

    output      = input_2d @ weight.t()                  (input dim -1, weight^T dim 0)
    grad_input  = grad_output_2d @ weight                 (grad_output dim -1, weight^T dim -1)
    grad_weight = grad_output_2d.t() @ input_2d           (grad_output dim 0, input dim 0)

An enabled operand is cast dynamically as :func:`fp8sim.scaling.current.quantize_torchao` does
(amax NaN-propagating, ``scale = fl32(max / max(fp64(amax), 1e-12))``, optional power-of-2 floor,
``satfinite(RN(fl32(x) * scale))``); AXISWISE scales run along the GEMM's reduction dim.  A
DISABLED GEMM is ``torch.mm`` of the high-precision operands.  The float8 GEMM is, with
``accumulator=None`` (or ``"torchao_emulate"``), torchao's ``emulate=True`` arithmetic:
``torch.mm(data_a / scale_a, data_b / scale_b).to(out_dtype)`` in float32.  With an fp8sim
accumulator preset it is torchao's ``addmm_float8_unwrapped`` through :func:`fp8sim.gemm.scaled_mm`:
dequantization scales ``1/scale`` (float32 reciprocals), a tensorwise scale expanded against an
axiswise one, rowwise without fast accumulation as unit scales then ``out *= (1/sa)(1/sb)``, and
rowwise float32/float16 outputs produced in bfloat16 and cast.  ``"hopper"``, ``"ada"`` and
``"blackwell"`` pick the fast or split preset from each GEMM's ``use_fast_accum``; a device profile (e.g.
``"h100_pcie_cublaslt_12_8"``, torch's caller) also the split-K of each GEMM's own shape, output dtype and
formats, as that GPU's ``torch._scaled_mm`` (tensorwise scales; rowwise only with splits given by
``with_splits``); ``"dequantized_fp32"``
is torchao ``emulate=False`` on the CPU (``torch._scaled_mm``'s CPU fallback).  The bias is
added after the GEMM in the output dtype (``out + bias.to(out.dtype)``), so its gradient is torch's.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

from .._util.args import as_int
from .._util.tensors import numpy_view
from ..cast import encode
from ..formats import FloatFormat, get_format
from ..gemm import Accumulator, DeviceProfile, get_accumulator, get_profile, is_profile, scaled_mm
from ..scaling.current import TORCHAO_EPS as _TORCHAO_EPS
from ..scaling.current import quantize_torchao, torchao_amax_to_scale
from ._double_backward import float8_grad
from ._float8 import _FP8_FORMATS, _Float8
from ._plans import record_gemm as _record
from .config import Float8LinearConfig, ScalingGranularity, ScalingType
from .fsdp import WeightWithDynamicFloat8CastTensor, register_float8_linear

__all__ = ["Float8Linear"]

_DEVICE_ACCUMULATORS = ("hopper", "ada", "blackwell")
# the tensor-parallel group whose ranks hold shards of the operands being cast (set by fp8sim.torchao.tp)
_TP_AMAX_GROUP: contextvars.ContextVar[Any] = contextvars.ContextVar("fp8sim_tp_amax_group", default=None)
_EMULATE = "torchao_emulate"


class _GemmSpec(NamedTuple):
    """How one of the three GEMMs runs: torchao's ScaledMMConfig plus the fp8sim accumulator."""

    use_fast_accum: bool
    pad_inner_dim: bool
    round_scales_to_power_of_2: bool
    accumulator: str | Accumulator | None  # None: torchao emulate; a device name: fast/split per use_fast_accum
    site: Any = None  # the Float8Linear (plans for fp8sim explain)
    role: str = ""  # "fprop", "dgrad" or "wgrad"


class _Gemms(NamedTuple):
    """The specs of the output, grad_input and grad_weight GEMMs."""

    output: _GemmSpec
    grad_input: _GemmSpec
    grad_weight: _GemmSpec


def _gemm_specs(config: Float8LinearConfig, accumulator: str | Accumulator | None, site: Any = None) -> _Gemms:
    """The three GEMMs of a Float8Linear (``site``) from its config and its current ``accumulator``."""
    acc = _check_accumulator(accumulator)
    pad, pow2 = config.pad_inner_dim, config.round_scales_to_power_of_2
    return _Gemms(
        _GemmSpec(config.gemm_config_output.use_fast_accum, pad, pow2, acc, site, "fprop"),
        _GemmSpec(config.gemm_config_grad_input.use_fast_accum, pad, pow2, acc, site, "dgrad"),
        _GemmSpec(config.gemm_config_grad_weight.use_fast_accum, pad, pow2, acc, site, "wgrad"),
    )


def _check_accumulator(accumulator: str | Accumulator | DeviceProfile | None) -> Any:
    """The accumulator as the GEMMs use it (a device profile as its record); unknown names raise fp8sim's
    ValueError now."""
    if accumulator is None or accumulator == _EMULATE:
        return None
    if isinstance(accumulator, str) and accumulator in _DEVICE_ACCUMULATORS:
        return accumulator
    if is_profile(accumulator):
        return get_profile(accumulator)
    return get_accumulator(accumulator)


def _cast(x: torch.Tensor, target_dtype: torch.dtype, granularity: ScalingGranularity, dim: int, pow2: bool) -> _Float8:
    """torchao's ``hp_tensor_to_float8_dynamic`` of a 2-D operand (axiswise scales reduce ``dim``)."""
    if target_dtype not in _FP8_FORMATS:
        raise ValueError(f"Unsupported float8_dtype: {target_dtype}")
    if x.dim() == 2 and not x.is_contiguous() and x.t().is_contiguous():
        # a transposed view (weight.t(), grad_output.t()): cast its contiguous transpose along the other dim and
        # hand back transposed codes, so the dequantized operand has torchao's layout without a copy
        f = _cast(x.t(), target_dtype, granularity, -1 if dim == 0 else 0, pow2)
        return f.relaid(f.codes.t(), f.scale.t() if f.axiswise else f.scale)
    fmt = get_format(_FP8_FORMATS[target_dtype])
    axiswise = granularity is ScalingGranularity.AXISWISE
    group = _TP_AMAX_GROUP.get()
    if group is not None and not axiswise:  # a tensor-parallel shard: the scale of the whole tensor (fp8sim.torchao.tp)
        return _cast_with_group_amax(x, fmt, pow2, group)
    if x.numel() and x.dtype in _TORCH_CAST_DTYPES:  # empty: torch.max refuses, the numpy path does not
        return _cast_in_torch_ops(x, target_dtype, fmt, axiswise, dim, pow2)
    q = quantize_torchao(
        x.detach(), fmt, granularity=granularity.value, axiswise_dim=dim, round_scales_to_power_of_2=pow2
    )
    return _Float8.of_record(q, axiswise, x.device)


_TORCH_CAST_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _cast_in_torch_ops(
    x: torch.Tensor, target_dtype: torch.dtype, fmt: FloatFormat, axiswise: bool, dim: int, pow2: bool
) -> _Float8:
    """torchao's cast as the torch ops it is defined by (float8_utils.py ``tensor_to_amax`` /
    ``amax_to_scale`` / ``to_fp8_saturated``, float8_training_tensor.py:153): amax in the input dtype,
    ``max / clamp(float64 amax, EPS)`` rounded to float32 (then ``exp2(floor(log2))`` with pow2),
    ``clamp(fl32(x) * scale, +-max)`` cast with torch's round-to-nearest-even.  The same bits as
    :func:`fp8sim.scaling.current.quantize_torchao` (tested), at torch's speed on any device."""
    with torch.no_grad():
        a = torch.abs(x.detach())
        amax = torch.amax(a, dim=dim, keepdim=True) if axiswise else torch.max(a)
        scale = (fmt.max / torch.clamp(amax.to(torch.float64), min=_TORCHAO_EPS)).to(torch.float32)
        if pow2:
            scale = torch.exp2(torch.floor(torch.log2(scale)))
        scaled = x.detach().to(torch.float32) * scale
        codes = scaled.clamp(min=-fmt.max, max=fmt.max).to(target_dtype).view(torch.uint8)
    return _Float8(codes, scale, fmt, axiswise)


def _cast_with_group_amax(x: torch.Tensor, fmt: FloatFormat, pow2: bool, group: Any) -> _Float8:
    """Tensorwise cast of a shard with torchao's DTensor semantics: ``max|x|`` MAX-reduced over ``group``."""
    import torch.distributed as dist

    with torch.no_grad():
        amax = torch.max(x.detach().abs()).float() if x.numel() else x.new_zeros((), dtype=torch.float32)
        amax = amax.reshape(1).clone()
        dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=group)
        scale = torch.from_numpy(np.asarray(torchao_amax_to_scale(amax.numpy()[0], fmt, pow2), np.float32))
        codes = encode(x.detach().float() * scale, fmt, saturate=True)
    return _Float8(codes, scale.reshape(()), fmt, False)


def _dequantized_like(t: _Float8, ref: torch.Tensor) -> torch.Tensor:
    """torchao's ``_data.float() / _scale`` (float32 division), with ``ref``'s strides as torchao's
    elementwise ops keep them (contiguous when ``ref`` is not dense)."""
    values = _dequantized_cpu(t)
    if values is None:
        # torch's float8 -> float32 conversion is exact and gives a NaN code torchao's NaN bits
        values = t.codes.view(t.fmt.torch_dtype).float() / t.scale
    if ref.is_contiguous() or values.stride() == ref.stride():
        return values
    return torch.empty_like(ref, dtype=torch.float32).copy_(values)


_CODE_VALUES: dict[str, torch.Tensor] = {}


def _dequantized_cpu(t: _Float8) -> torch.Tensor | None:
    """The same values through a 256-entry table on the CPU (torch's float8 -> float32 conversion is slow
    there): the table holds torch's own float32 value of each code, NaN bits included, and each quotient is
    torch's float32 division of those operands, so every bit is torchao's.  None where it does not apply.
    The codes are read through ``numpy_view``: ``.numpy()`` would pin an FSDP2 all-gather buffer."""
    codes = t.codes
    if codes.device.type != "cpu" or codes.dim() != 2:
        return None
    transposed = not codes.is_contiguous()
    if transposed:
        codes = codes.t()
        if not codes.is_contiguous():
            return None
    table = _CODE_VALUES.get(t.fmt.name)
    if table is None:
        table = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(t.fmt.torch_dtype).float()
        _CODE_VALUES[t.fmt.name] = table
    if t.axiswise:
        scale = t.scale.t() if transposed else t.scale
        values = torch.from_numpy(table.numpy().take(numpy_view(codes))) / scale
    else:  # one scale: divide the 256 code values once, then gather
        values = torch.from_numpy((table / t.scale).numpy().take(numpy_view(codes)))
    return values.t() if transposed else values


class _Operand(NamedTuple):
    """A cast GEMM operand and, on the emulated path, its dequantized float32 tensor in torchao's layout."""

    fp8: _Float8
    values: torch.Tensor | None

    def t(self) -> _Operand:
        """The same operand transposed (tensorwise only: a 0-dim scale)."""
        return _Operand(self.fp8.relaid(self.fp8.codes.t()), None if self.values is None else self.values.t())


def _reusable(cc_1: Any, cc_2: Any) -> bool:
    """Whether two casts of one tensor give the same codes: equal configs with one scale for the whole tensor
    (an axiswise cast runs along a different dim in each GEMM).  Reusing them changes no bit."""
    return (
        cc_1 == cc_2
        and cc_1.scaling_type is not ScalingType.DISABLED
        and cc_1.scaling_granularity is ScalingGranularity.TENSORWISE
    )


def _pad_k(codes: torch.Tensor, dim: int) -> torch.Tensor:
    """torchao's ``pad_tensor_for_matmul``: zero codes up to a multiple of 16 along ``dim``."""
    extra = -codes.shape[dim] % 16
    if not extra:
        return codes
    return nn.functional.pad(codes, (0, extra) if dim == 1 else (0, 0, 0, extra))


def _scaled_mm_gemm(a: _Float8, b: _Float8, out_dtype: torch.dtype, spec: _GemmSpec) -> torch.Tensor:
    """torchao's ``preprocess_addmm`` + ``addmm_float8_unwrapped`` with fp8sim's ``scaled_mm``."""
    a_codes, b_codes = a.codes, b.codes
    if spec.pad_inner_dim:
        a_codes, b_codes = _pad_k(a_codes, 1), _pad_k(b_codes, 0)
    m, n = a_codes.shape[0], b_codes.shape[1]
    a_scale, b_scale = a.scale, b.scale
    if not a.axiswise and b.axiswise:
        a_scale = a_scale.repeat(m).reshape(-1, 1)
    elif a.axiswise and not b.axiswise:
        b_scale = b_scale.repeat(n).reshape(1, -1)
    a_inv, b_inv = a_scale.reciprocal(), b_scale.reciprocal()
    rowwise = tuple(a_scale.shape) == (m, 1) and tuple(b_scale.shape) == (1, n)
    post = None
    if rowwise and not spec.use_fast_accum:
        post = a_inv * b_inv
        a_inv = b_inv = a_inv.new_ones(())
    mm_dtype = torch.bfloat16 if rowwise and out_dtype in (torch.float16, torch.float32) else out_dtype
    acc = spec.accumulator
    device = acc if isinstance(acc, str) else "hopper"
    prof = acc if isinstance(acc, DeviceProfile) else None
    k = a_codes.shape[1]
    layout = "tensorwise" if a_inv.numel() == 1 and b_inv.numel() == 1 else "rowwise"
    if _record(spec, (m, n, k), (a.fmt.name, b.fmt.name), layout, mm_dtype, acc, prof):  # dry: the cheap path
        acc, prof = get_accumulator("dequantized_fp32"), None
    out = scaled_mm(
        a_codes.view(a.fmt.torch_dtype),
        b_codes.view(b.fmt.torch_dtype),
        a_inv,
        b_inv,
        out_dtype=mm_dtype,
        use_fast_accum=spec.use_fast_accum,
        accumulator=None if isinstance(acc, str) or prof is not None else acc,
        device=device,
        strict=False,
        profile=prof,
    )
    if post is not None:
        out *= post
    return out.to(out_dtype)


def _gemm(
    a_hp: torch.Tensor,
    b_hp: torch.Tensor,
    cc_a: Any,
    cc_b: Any,
    spec: _GemmSpec,
    out_dtype: torch.dtype | None = None,
    b_fp8: _Float8 | None = None,
    a_op: _Operand | None = None,
    b_op: _Operand | None = None,
) -> tuple[torch.Tensor, _Operand | None, _Operand | None]:
    """``a_hp @ b_hp`` as torchao computes it, and the two operands used (None when not cast); ``a_op`` /
    ``b_op``: operands already cast (see :func:`_reusable`).  The output dtype is ``out_dtype`` (the CPU
    autocast dtype, which torchao's autocast ``_to_copy`` writes into the float8 operand's ``_orig_dtype``),
    else ``a_hp``'s."""
    if cc_a.scaling_type is ScalingType.DISABLED:  # the config guarantees cc_b is DISABLED too
        if out_dtype is not None:  # what autocast does to a plain torch.mm
            return torch.mm(a_hp.to(out_dtype), b_hp.to(out_dtype)), None, None
        return torch.mm(a_hp, b_hp), None, None
    out_dtype = a_hp.dtype if out_dtype is None else out_dtype
    pow2 = spec.round_scales_to_power_of_2
    emulate = spec.accumulator is None
    if a_op is None:
        a = _cast(a_hp, cc_a.target_dtype, cc_a.scaling_granularity, -1, pow2)
        a_op = _Operand(a, _dequantized_like(a, a_hp) if emulate else None)
    if b_op is None:
        # b_fp8: a weight already in float8 (FSDP2 float8 all-gather), used as torchao uses a Float8TrainingTensor
        b = b_fp8 if b_fp8 is not None else _cast(b_hp, cc_b.target_dtype, cc_b.scaling_granularity, 0, pow2)
        b_op = _Operand(b, _dequantized_like(b, b_hp) if emulate else None)
    if emulate:
        dims = (a_op.values.shape[0], b_op.values.shape[1], a_op.values.shape[1])
        _record(spec, dims, (a_op.fp8.fmt.name, b_op.fp8.fmt.name), "emulate", out_dtype, None, None)
        return torch.mm(a_op.values, b_op.values).to(out_dtype), a_op, b_op
    return _scaled_mm_gemm(a_op.fp8, b_op.fp8, out_dtype, spec), a_op, b_op


def _autocast_dtype(device_type: str) -> torch.dtype | None:
    """The autocast dtype of ``device_type`` while autocast is on there, else None.  torch >= 2.4 has the
    per-device ``is_autocast_enabled(device_type)`` / ``get_autocast_dtype(device_type)``; older torch only
    the CPU and CUDA functions."""
    if hasattr(torch, "get_autocast_dtype"):
        try:
            on = torch.is_autocast_enabled(device_type)
        except (RuntimeError, TypeError):  # a device type autocast does not know
            return None
        return torch.get_autocast_dtype(device_type) if on else None
    if device_type == "cpu":
        return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None
    if device_type == "cuda":
        return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None
    return None


def _no_autocast(device_type: str) -> Any:
    """Autocast off on ``device_type`` where it is on; a device type autocast does not know (``meta``, on which
    torchao's Float8Linear traces shapes) has none to turn off, and ``torch.autocast`` refuses it."""
    return torch.autocast(device_type, enabled=False) if _autocast_dtype(device_type) else contextlib.nullcontext()


class _Float8MatMul(torch.autograd.Function):
    """``input @ weight_t`` with float8 GEMMs forward and backward (torchao's ``matmul_with_hp_or_float8_args``)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        input_hp: torch.Tensor,
        weight_hp_t: torch.Tensor,
        config: Float8LinearConfig,
        gemms: _Gemms,
        out_dtype: torch.dtype | None = None,
        weight_fp8: _Float8 | None = None,
    ) -> torch.Tensor:
        ctx.save_for_backward(input_hp, weight_hp_t)
        ctx.config, ctx.gemms, ctx.weight_fp8 = config, gemms, weight_fp8
        ctx.tp_group = _TP_AMAX_GROUP.get()  # the backward casts reduce their amaxes over it too
        input_2d = input_hp.reshape(-1, input_hp.shape[-1])
        # torchao's mm runs below autocast (in __torch_dispatch__): keep fp8sim's float32 GEMMs out of it
        with _no_autocast(input_hp.device.type):
            out, in_op, w_op = _gemm(
                input_2d,
                weight_hp_t,
                config.cast_config_input,
                config.cast_config_weight,
                gemms.output,
                out_dtype,
                None if weight_fp8 is None else weight_fp8.relaid(weight_fp8.codes.t()),
            )
        # the backward GEMMs recast input and weight; where that cast is the same, keep this one (saves time)
        reuse = gemms.output.accumulator == gemms.grad_weight.accumulator
        ctx.input_op = (
            in_op if reuse and _reusable(config.cast_config_input, config.cast_config_input_for_grad_weight) else None
        )
        reuse = gemms.output.accumulator == gemms.grad_input.accumulator and weight_fp8 is None
        ctx.weight_op = (
            w_op if reuse and _reusable(config.cast_config_weight, config.cast_config_weight_for_grad_input) else None
        )
        return out.reshape(*input_hp.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        token = _TP_AMAX_GROUP.set(ctx.tp_group)
        try:
            return _Float8MatMul._backward(ctx, grad_output)
        finally:
            _TP_AMAX_GROUP.reset(token)

    @staticmethod
    def _backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        input_hp, weight_hp_t = ctx.saved_tensors
        c, gemms = ctx.config, ctx.gemms
        go_2d = grad_output.reshape(-1, grad_output.shape[-1])
        grad_input = grad_weight_t = go_op = None
        if ctx.needs_input_grad[0]:
            cc_go, cc_w = c.cast_config_grad_output, c.cast_config_weight_for_grad_input
            w_op = None if ctx.weight_op is None else ctx.weight_op.t()
            gi, go_op, _ = _gemm(go_2d, weight_hp_t.t(), cc_go, cc_w, gemms.grad_input, b_fp8=ctx.weight_fp8, b_op=w_op)
            if cc_go.scaling_type is not ScalingType.DISABLED:  # create_graph=True: torchao's graph, then its error
                gi = float8_grad(gi, grad_output, weight_hp_t)
            grad_input = gi.reshape(*grad_output.shape[:-1], gi.shape[-1])
        if ctx.needs_input_grad[1]:
            input_2d = input_hp.reshape(-1, input_hp.shape[-1])
            cc_go, cc_i = c.cast_config_grad_output_for_grad_weight, c.cast_config_input_for_grad_weight
            same_go = (
                go_op is not None
                and go_2d.is_contiguous()  # then go_2d.t()'s dequantized layout is go_op's transposed
                and gemms.grad_input.accumulator == gemms.grad_weight.accumulator
                and _reusable(c.cast_config_grad_output, cc_go)
            )
            go_t = go_op.t() if same_go else None
            gw, _, _ = _gemm(go_2d.t(), input_2d, cc_go, cc_i, gemms.grad_weight, a_op=go_t, b_op=ctx.input_op)
            if cc_go.scaling_type is not ScalingType.DISABLED:
                gw = float8_grad(gw, grad_output, input_hp)
            grad_weight_t = gw.t()
        ctx.input_op = ctx.weight_op = None
        return grad_input, grad_weight_t, None, None, None, None


@register_float8_linear
class Float8Linear(nn.Linear):
    """``nn.Linear`` whose three GEMMs run in emulated float8 as torchao's ``Float8Linear`` (module docstring).

    Extra keywords: ``config`` (:class:`Float8LinearConfig`, default ``Float8LinearConfig()``) and
    ``accumulator`` (None or ``"torchao_emulate"``: torchao ``emulate=True`` arithmetic; an fp8sim preset or
    :class:`~fp8sim.gemm.Accumulator`; ``"hopper"`` / ``"ada"`` / ``"blackwell"``: fast or split per
    GEMM from ``use_fast_accum``).  fp8sim always emulates: ``config.emulate`` and
    ``config.enable_fsdp_float8_all_gather`` do not change the arithmetic.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device: Any = None,
        dtype: torch.dtype | None = None,
        *,
        config: Float8LinearConfig | None = None,
        accumulator: str | Accumulator | None = None,
    ) -> None:
        in_features, out_features = as_int(in_features, "in_features", lo=1), as_int(out_features, "out_features", lo=1)
        super().__init__(in_features, out_features, bias, device, dtype)
        config = Float8LinearConfig() if config is None else config
        if not isinstance(config, Float8LinearConfig):
            raise TypeError(f"config must be an fp8sim.torchao.Float8LinearConfig, got {type(config).__name__}")
        self.config = config
        self.accumulator = accumulator
        self.scaling_type_input = config.cast_config_input.scaling_type
        self.scaling_type_weight = config.cast_config_weight.scaling_type
        self.scaling_type_grad_output = config.cast_config_grad_output.scaling_type
        _check_accumulator(accumulator)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """torchao's forward: under CUDA autocast the input is cast to its dtype first; under CPU autocast
        (spec 0, "6.1") the operands are cast from their own dtype and the emulated float32 GEMM is
        rounded to the autocast dtype; then ``+ bias.to(output.dtype)``."""
        if input.dim() == 0:
            raise RuntimeError("both arguments to linear need to be at least 1D, but they are 0D and 2D")
        cuda_dtype = _autocast_dtype("cuda")
        if cuda_dtype is not None:  # torchao: torch.is_autocast_enabled() (CUDA) casts any input to its dtype
            input = input.to(cuda_dtype)
        # on another device type, that device's autocast rounds the float8 GEMM (its _to_copy sets _orig_dtype)
        out_dtype = None if input.device.type == "cuda" else _autocast_dtype(input.device.type)
        gemms = _gemm_specs(self.config, self.accumulator, self)
        weight_fp8 = getattr(self.weight, "_fp8sim_float8", None)  # set by the FSDP2 float8 all-gather
        output = _Float8MatMul.apply(input, self.weight.t(), self.config, gemms, out_dtype, weight_fp8)
        if self.bias is not None:
            output = output + self.bias.to(output.dtype)
        return output

    def extra_repr(self) -> str:
        c = self.config
        parts = [
            f"i:{c.cast_config_input.short_str()}",
            f"w:{c.cast_config_weight.short_str()}",
            f"go:{c.cast_config_grad_output.short_str()}",
        ]
        if c.cast_config_input_for_grad_weight != c.cast_config_input:
            parts.append(f"i_gw:{c.cast_config_input_for_grad_weight.short_str()}")
        if c.cast_config_weight_for_grad_input != c.cast_config_weight:
            parts.append(f"w_gi:{c.cast_config_weight_for_grad_input.short_str()}")
        if c.cast_config_grad_output_for_grad_weight != c.cast_config_grad_output:
            parts.append(f"go_gw:{c.cast_config_grad_output_for_grad_weight.short_str()}")
        acc = self.accumulator
        acc_str = "" if acc is None else f", accumulator={getattr(acc, 'name', acc)}"
        return f"{super().extra_repr()}, cast_configs={','.join(parts)}{acc_str}"

    @classmethod
    def from_float(
        cls,
        mod: nn.Linear,
        config: Float8LinearConfig | None = None,
        *,
        accumulator: str | Accumulator | None = None,
    ) -> Float8Linear:
        """A Float8Linear sharing ``mod``'s weight and bias Parameters (torchao's ``from_float``)."""
        with torch.device("meta"):
            new_mod = cls(mod.in_features, mod.out_features, bias=False, config=config, accumulator=accumulator)
        new_mod.weight = mod.weight
        new_mod.bias = mod.bias
        if new_mod.config.enable_fsdp_float8_all_gather:  # last, as torchao: FSDP2 gathers this weight in float8
            w = new_mod.weight
            target = new_mod.config.cast_config_weight.target_dtype
            wrapped = WeightWithDynamicFloat8CastTensor(w.data, None, target)  # fp8sim needs no mm config
            new_mod.weight = nn.Parameter(wrapped, requires_grad=w.requires_grad)
        return new_mod


# The emulated casts run in numpy, which Dynamo cannot trace: under torch.compile the forward (and so its
# backward) runs eagerly behind a graph break, giving eager's bits; the rest of the model still compiles.
Float8Linear.forward = torch.compiler.disable(Float8Linear.forward)  # type: ignore[method-assign]
