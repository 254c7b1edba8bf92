"""MXFP8 linear training as torchao 0.18 defines it (``torchao/prototype/moe_training/mxfp8_linear.py``,
``config.py``), emulated.

``MXFP8Linear`` runs torchao's ``mx_mm``: each GEMM operand is cast by ``MXTensor.to_mx`` (E4M3 elements,
32-element E8M0 blocks along the GEMM's reduction dim, ``scale_calculation_mode`` RCEIL by default;
fp8sim's :func:`~fp8sim.scaling.mx.quantize_mx` ``flavor="torchao"``, bit-exact with it), then with
``kernel_preference=EMULATED`` (the only mode torchao runs on a CPU) dequantized in the operand's dtype
(``fl(code) * fl(2^(e-127))`` rounded once to that dtype, NaN for e = 0xFF) and multiplied by ``torch.mm``
in that dtype, with the layouts torchao's GEMMs see::

    output      = deq(input  [M,K] blocks along K) @ deq(weight   [N,K] blocks along K).t()
    grad_input  = deq(grad   [M,N] blocks along N) @ deq(weight.t() [K,N] blocks along N).t()
    grad_weight = deq(grad.t() [N,M] blocks along M) @ deq(input.t() [K,M] blocks along M).t()

``wgrad_with_hp=True`` makes the last one ``grad.t() @ input`` unquantized.  The bias is added as
``out + bias.to(out.dtype)``.  ``KernelPreference.AUTO`` (torchao's CUDA/CUTLASS kernels) is emulated as
the same casts followed by a block-scaled GEMM in :func:`fp8sim.gemm.scaled_mm` (``accumulator``,
default ``"blackwell"``) with bfloat16 output, as torchao calls ``torch._scaled_mm(..., out_dtype=bf16)``;
that path is re-derived from torchao's source, not measured.  As torchao's casts do, EMULATED refuses inputs and
weights other than bfloat16/float32, AUTO anything but bfloat16 (AssertionError, torchao's messages).  Needs torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np
import torch
from torch import nn

from ..cast._tables import decode_table
from ..formats import E4M3, E8M0
from ..gemm import scaled_mm
from ..scaling.amax import dtype_name
from ..scaling.mx import quantize_mx
from ..scaling.quantized import QuantizedData
from ._double_backward import warn_graphless
from .float8_linear_utils import swap_linear_layers

__all__ = [
    "KernelPreference",
    "ScaleCalculationMode",
    "MXFP8TrainingRecipe",
    "MXFP8TrainingOpConfig",
    "MXFP8Linear",
    "convert_to_mxfp8_training",
]

_BLOCK = 32


class KernelPreference(str, Enum):
    """torchao ``quantization/quantize_/common/kernel_preference.py`` (the members MX and NVFP4 training use)."""

    AUTO = "auto"
    TORCH = "torch"
    MSLK = "mslk"
    EMULATED = "emulated"
    TRITON = "triton"  # torchao's NVFP4 training kernels


class ScaleCalculationMode(Enum):
    """torchao ``prototype/mx_formats/config.py``: how the E8M0 block scale is computed."""

    FLOOR = "floor"
    RCEIL = "rceil"
    CEIL = "ceil"
    EVEN = "even"


class MXFP8TrainingRecipe(Enum):
    """torchao ``prototype/moe_training/config.py`` recipe names."""

    MXFP8_RCEIL = "mxfp8_rceil"
    MXFP8_RCEIL_WGRAD_WITH_HP = "mxfp8_rceil_wgrad_with_hp"
    MXFP8_EMULATED_RCEIL = "mxfp8_emulated_rceil"


@dataclass
class MXFP8TrainingOpConfig:
    """torchao's ``MXFP8TrainingOpConfig`` (same fields and defaults); ``from_recipe`` gives its presets."""

    kernel_preference: KernelPreference = KernelPreference.AUTO
    out_dtype: torch.dtype | None = torch.bfloat16
    wgrad_with_hp: bool = False
    scale_calculation_mode: ScaleCalculationMode = ScaleCalculationMode.RCEIL
    pad_token_groups_for_grouped_mm: bool = False

    def __post_init__(self) -> None:
        self.kernel_preference = KernelPreference(self.kernel_preference)
        self.scale_calculation_mode = ScaleCalculationMode(self.scale_calculation_mode)
        if self.kernel_preference not in (KernelPreference.AUTO, KernelPreference.EMULATED):
            raise ValueError(
                f"kernel_preference must be AUTO or EMULATED for MXFP8 training, got {self.kernel_preference}"
            )
        if not isinstance(self.wgrad_with_hp, bool):
            raise TypeError(f"wgrad_with_hp must be True or False, got {self.wgrad_with_hp!r}")

    @classmethod
    def from_recipe(cls, recipe: MXFP8TrainingRecipe | str) -> MXFP8TrainingOpConfig:
        """torchao's presets: RCEIL scales, bf16 grouped output; wgrad in high precision or EMULATED kernels."""
        try:
            recipe = MXFP8TrainingRecipe(recipe)
        except ValueError:
            known = ", ".join(r.value for r in MXFP8TrainingRecipe)
            raise ValueError(f"Unsupported MXFP8 recipe: {recipe}; known: {known}") from None
        emulated = recipe is MXFP8TrainingRecipe.MXFP8_EMULATED_RCEIL
        return cls(
            kernel_preference=KernelPreference.EMULATED if emulated else KernelPreference.AUTO,
            wgrad_with_hp=recipe is MXFP8TrainingRecipe.MXFP8_RCEIL_WGRAD_WITH_HP,
        )


def _to_mx(x: torch.Tensor, mode: ScaleCalculationMode) -> QuantizedData:
    """torchao's ``to_mx`` along the last dim: E4M3 codes, E8M0 scale codes per 1x32 block."""
    if x.shape[-1] % _BLOCK:
        raise ValueError(f"the last dimension of shape {tuple(x.shape)} must be divisible by block_size {_BLOCK}")
    if x.numel() and x.dtype in (torch.float32, torch.bfloat16) and mode in _TORCH_OP_MODES:
        return _to_mx_in_torch_ops(x.detach().contiguous(), mode)
    return quantize_mx(x.detach().contiguous(), "e4m3", axis=-1, scale_rule=mode.value, flavor="torchao")


_TORCH_OP_MODES = (ScaleCalculationMode.FLOOR, ScaleCalculationMode.RCEIL)
_E4M3_MAX, _E4M3_MAX_POW2, _E8M0_BIAS = 448.0, 8, 127


def _to_mx_in_torch_ops(x: torch.Tensor, mode: ScaleCalculationMode) -> QuantizedData:
    """torchao's ``to_mx`` for E4M3 elements (mx_tensor.py:214-380, eager, no inline PTX) as the torch ops it
    is defined by: block amax in the input dtype, then float32; FLOOR: the amax's exponent minus 8, clamped
    to [-127, 128], NaN amax -> 255, elements divided by ``max(2^e, 2^-126)``; RCEIL (``_to_mx_rceil``):
    ``ceil(log2(amax / 448))`` clamped to [-127, 127], NaN -> 255, Inf -> 254, elements times the
    reciprocal power of two; both clamp to +-448 and cast with torch's round-to-nearest-even.  The same
    bits as :func:`fp8sim.scaling.mx.quantize_mx` (``flavor="torchao"``, tested), at torch's speed."""
    shape = x.shape
    blocks = x.reshape(*shape[:-1], shape[-1] // _BLOCK, _BLOCK)
    max_abs = torch.amax(torch.abs(blocks), -1).unsqueeze(-1).to(torch.float32)
    data = blocks.to(torch.float32)
    if mode is ScaleCalculationMode.RCEIL:
        descale = max_abs / _E4M3_MAX
        normal = (torch.clamp(torch.ceil(torch.log2(descale)), min=-_E8M0_BIAS, max=_E8M0_BIAS) + _E8M0_BIAS).to(
            torch.uint8
        )
        exponent = torch.where(torch.isnan(descale), 255, torch.where(torch.isinf(descale), 254, normal))
        exponent = exponent.to(torch.uint8)
        rcp = torch.where(
            exponent == 255,
            descale,
            torch.where(
                exponent == 254,
                2.0**-127,
                torch.where(exponent == 0, 1.0, torch.exp2(_E8M0_BIAS - exponent.to(torch.float32))),
            ),
        )
        scaled = data * rcp
    else:
        pow2 = ((max_abs.view(torch.int32) >> 23) & 0xFF) - _E8M0_BIAS
        unbiased = torch.clamp(pow2 - _E4M3_MAX_POW2, min=-_E8M0_BIAS, max=_E8M0_BIAS + 1)
        exponent = torch.where(torch.isnan(max_abs), 255, (unbiased + _E8M0_BIAS).to(torch.uint8)).to(torch.uint8)
        scale = torch.clamp((exponent.to(torch.int32) << 23).view(torch.float32), min=2.0**-126)
        scaled = data / scale
    codes = torch.clamp(scaled, min=-_E4M3_MAX, max=_E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    scales = exponent.reshape(*shape[:-1], shape[-1] // _BLOCK).cpu().numpy()
    return _mx_record(codes.reshape(shape).cpu().numpy(), scales, dtype_name(x))


def _mx_record(codes: np.ndarray, scales: np.ndarray, dtype: str = "bfloat16") -> QuantizedData:
    """The record of a ``to_mx`` cast along the last dim: E4M3 codes, one E8M0 scale code per 1x32 block."""
    block = (1,) * (codes.ndim - 1) + (_BLOCK,)
    return QuantizedData(codes, scales, E4M3, block, codes.shape, dtype, scale_format=E8M0)


def _dequantize(t: QuantizedData, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """torchao ``mx_tensor.to_dtype``: ``data.to(dtype) * get_fp_scale(scale).to(dtype)``; both factors are
    exact in float32 and bf16/fp16 arithmetic rounds the float32 product once, as here."""
    if dtype == torch.bfloat16:
        return _dequantize_bf16(t).to(device)
    vals = decode_table(E4M3).take(t.codes)  # decode through 256-entry tables: the same values, no checks
    scale = decode_table(E8M0).take(t.scales)
    rows, k = vals.shape
    with np.errstate(over="ignore", invalid="ignore"):  # each element times its block's scale, no repeat copy
        prod = (vals.reshape(rows, k // _BLOCK, _BLOCK) * scale[:, :, None]).reshape(rows, k)
    return torch.from_numpy(prod).to(device=device, dtype=dtype)


def _dequantize_bf16(t: QuantizedData) -> torch.Tensor:
    """The bf16 case in torch ops: E4M3 codes and E8M0 scales are exact in bf16 (its exponent range is
    float32's), and torch's bf16 multiply rounds the float32 product once, so the bits are those of the
    float32 product rounded to bf16 (NaN to torch's one bf16 NaN either way).  Faster than the numpy path."""
    codes = torch.from_numpy(np.ascontiguousarray(t.codes))
    rows, k = codes.shape
    vals = codes.view(torch.float8_e4m3fn).to(torch.bfloat16).view(rows, k // _BLOCK, _BLOCK)
    scale = torch.from_numpy(decode_table(E8M0).take(t.scales)).to(torch.bfloat16)
    return (vals * scale[:, :, None]).view(rows, k)


def _mm(
    a: QuantizedData, b: QuantizedData, dtype: torch.dtype, device: torch.device, kernel: KernelPreference, acc: Any
) -> torch.Tensor:
    """``a @ b.t()`` of two operands blocked along their common last dim, as torchao's ``mx_mm`` runs it."""
    if kernel is KernelPreference.EMULATED:
        return torch.mm(_dequantize(a, dtype, device), _dequantize(b, dtype, device).t())
    out = scaled_mm(
        a.codes,
        np.ascontiguousarray(b.codes.T),
        a.scales,
        np.ascontiguousarray(b.scales.T),
        out_dtype="bfloat16",
        accumulator=acc,
        a_format="e4m3",
        b_format="e4m3",
        strict=False,
    )
    return torch.from_numpy(out.astype(np.float32)).to(device=device, dtype=torch.bfloat16)


def _check_cast_dtype(x: torch.Tensor, kern: KernelPreference) -> None:
    """torchao's forward casts refuse other dtypes before any arithmetic (torchao 0.18): EMULATED's ``to_mx``
    takes bfloat16 and float32 only (``mx_formats/mx_tensor.py:225-228``); AUTO casts dim0 with
    ``triton_to_mxfp8_dim0``, bfloat16 only (``mx_formats/kernels.py:860-862``)."""
    if kern is KernelPreference.EMULATED:
        if x.dtype not in (torch.bfloat16, torch.float32):
            raise AssertionError(f"{x.dtype} is not supported yet")
    elif x.dtype != torch.bfloat16:
        raise AssertionError(f"only bfloat16 inputs are supported, got {x.dtype}")


class _MXMatMul(torch.autograd.Function):
    """torchao's ``mx_mm`` autograd function (module docstring)."""

    @staticmethod
    def forward(ctx: Any, input_hp: torch.Tensor, weight_hp: torch.Tensor, cfg: MXFP8TrainingOpConfig, acc: Any):  # type: ignore[override]
        mode, kern = cfg.scale_calculation_mode, cfg.kernel_preference
        _check_cast_dtype(input_hp, kern)
        _check_cast_dtype(weight_hp, kern)
        ctx.save_for_backward(input_hp, weight_hp)
        ctx.cfg, ctx.acc = cfg, acc
        x = input_hp.reshape(-1, input_hp.shape[-1])
        with torch.autocast(input_hp.device.type, enabled=False):
            out = _mm(_to_mx(x, mode), _to_mx(weight_hp, mode), input_hp.dtype, input_hp.device, kern, acc)
        return out.reshape(*input_hp.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        input_hp, weight_hp = ctx.saved_tensors
        cfg, acc = ctx.cfg, ctx.acc
        warn_graphless("MXFP8 GEMMs (mx_mm)")
        mode, kern = cfg.scale_calculation_mode, cfg.kernel_preference
        go = grad_output.contiguous().reshape(-1, grad_output.shape[-1])
        x = input_hp.reshape(-1, input_hp.shape[-1])
        dev = grad_output.device
        gi = _mm(_to_mx(go, mode), _to_mx(weight_hp.t(), mode), go.dtype, dev, kern, acc)
        grad_input = gi.reshape(*grad_output.shape[:-1], gi.shape[-1])
        if cfg.wgrad_with_hp:
            grad_weight = torch.mm(go.t(), x)
        else:
            grad_weight = _mm(_to_mx(go.t(), mode), _to_mx(x.t(), mode), go.dtype, dev, kern, acc)
        return grad_input, grad_weight, None, None


class MXFP8Linear(nn.Linear):
    """``nn.Linear`` whose three GEMMs run in emulated MXFP8 as torchao's ``MXFP8Linear`` (module docstring).

    Keywords as torchao's: ``kernel_preference`` (default AUTO), ``scale_calculation_mode`` (RCEIL),
    ``wgrad_with_hp`` (False); fp8sim adds ``accumulator`` for the AUTO path's block-scaled GEMM."""

    def __init__(
        self,
        *args: Any,
        kernel_preference: KernelPreference | str = KernelPreference.AUTO,
        scale_calculation_mode: ScaleCalculationMode | str = ScaleCalculationMode.RCEIL,
        wgrad_with_hp: bool = False,
        accumulator: Any = "blackwell",
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        cfg = MXFP8TrainingOpConfig(
            kernel_preference=kernel_preference,
            scale_calculation_mode=scale_calculation_mode,
            wgrad_with_hp=wgrad_with_hp,
        )
        self.kernel_preference = cfg.kernel_preference
        self.scale_calculation_mode = cfg.scale_calculation_mode
        self.wgrad_with_hp = cfg.wgrad_with_hp
        self.accumulator = accumulator

    def _config(self) -> MXFP8TrainingOpConfig:
        return MXFP8TrainingOpConfig(
            kernel_preference=self.kernel_preference,
            scale_calculation_mode=self.scale_calculation_mode,
            wgrad_with_hp=self.wgrad_with_hp,
        )

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.dim() == 0:
            raise RuntimeError("both arguments to linear need to be at least 1D, but they are 0D and 2D")
        output = _MXMatMul.apply(input, self.weight, self._config(), self.accumulator)
        if self.bias is not None:
            output = output + self.bias.to(output.dtype)
        return output

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, kernel_preference={self.kernel_preference.value}, "
            f"scale_calculation_mode={self.scale_calculation_mode.value}, wgrad_with_hp={self.wgrad_with_hp}"
        )

    @classmethod
    def from_float(cls, mod: nn.Linear, config: MXFP8TrainingOpConfig | None = None, **kw: Any) -> MXFP8Linear:
        """An MXFP8Linear sharing ``mod``'s weight and bias Parameters."""
        config = MXFP8TrainingOpConfig() if config is None else config
        with torch.device("meta"):
            new = cls(
                mod.in_features,
                mod.out_features,
                bias=False,
                kernel_preference=config.kernel_preference,
                scale_calculation_mode=config.scale_calculation_mode,
                wgrad_with_hp=config.wgrad_with_hp,
                **kw,
            )
        new.weight, new.bias = mod.weight, mod.bias
        return new


# The numpy casts cannot be traced: under torch.compile the forward runs eagerly behind a graph break.
MXFP8Linear.forward = torch.compiler.disable(MXFP8Linear.forward)  # type: ignore[method-assign]


def convert_to_mxfp8_training(
    module: nn.Module,
    *,
    config: MXFP8TrainingOpConfig | None = None,
    module_filter_fn: Callable[[nn.Module, str], bool] | None = None,
    accumulator: Any = "blackwell",
) -> nn.Module:
    """Swap the ``nn.Linear`` modules of ``module`` for :class:`MXFP8Linear` (what torchao's
    ``quantize_(model, MXFP8TrainingOpConfig(...))`` does to linears through its weight wrapper tensor;
    torchao's wrapper drops a Linear's bias from the GEMM override, fp8sim adds it as ``MXFP8Linear`` does)."""
    config = MXFP8TrainingOpConfig() if config is None else config
    if not isinstance(config, MXFP8TrainingOpConfig):
        raise TypeError(f"config must be an fp8sim.torchao.MXFP8TrainingOpConfig, got {type(config).__name__}")
    return swap_linear_layers(
        module,
        lambda m: MXFP8Linear.from_float(m, config, accumulator=accumulator),
        module_filter_fn=module_filter_fn,
    )
