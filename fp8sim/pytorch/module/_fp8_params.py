"""FP8 primary weights (``quantized_model_init``): module weights held as TE quantized tensors.

TE ``module/base.py`` ``reset_parameters``: inside ``quantized_model_init`` each weight is quantized
by the module's weight quantizer right after its initialisation and registered as an
``nn.Parameter`` wrapping the quantized tensor; ``preserve_high_precision_init_val`` keeps a CPU
copy of the initial value behind ``get_high_precision_init_val()`` / ``clear_high_precision_init_val()``.
The weight quantizer is the module's ``quantizers["scaling_fwd"]`` weight slot (TE
``self.quantizers["scaling_fwd"][fp8_meta_index]``), so every recipe gives its own tensor class:
``Float8Tensor`` (delayed, current), ``MXFP8Tensor``, ``Float8BlockwiseQTensor``, ``NVFP4Tensor``.
The GEMMs then use the tensor's own codes and scales (nothing re-quantized): the rowwise copy in
fprop, the columnwise copy in dgrad.  An optimizer step writes into the parameter in place, which
``QuantizedTensor.__torch_dispatch__`` turns into dequantize, update, ``quantize_`` (TE's rule).
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn

from ...recipe import (
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
    Recipe,
    tensor_format,
)
from ._operands import Operand

__all__ = [
    "quantize_primary_weights",
    "operand_from_fp8_weight",
    "block_operands_from_fp8_weight",
    "is_fp8_weight",
    "weight_quantizers",
    "update_weight_quantizers",
    "reset_sharded_parameters",
]


def is_fp8_weight(w: Any) -> bool:
    from ..tensor import QuantizedTensor

    return isinstance(w, QuantizedTensor)


def _weight_quantizer(module: Any, name: str, recipe: Recipe) -> Any:
    from ..constants import DType
    from ..tensor import Float8CurrentScalingQuantizer, delayed_scaling_quantizers

    if isinstance(recipe, DelayedScaling):
        g = module.fp8_gemms[module._gemm_of_weight(name)]
        g.ensure(recipe)
        return delayed_scaling_quantizers(g.fwd)[1]  # the WEIGHT slot of that GEMM's forward state
    if isinstance(recipe, Float8CurrentScaling):
        fp8 = DType.kFloat8E4M3 if tensor_format(recipe.fp8_format, True).name == "e4m3" else DType.kFloat8E5M2
        qp = recipe.fp8_quant_fwd_weight
        return Float8CurrentScalingQuantizer(fp8, force_pow_2_scales=qp.power_2_scale, amax_epsilon=qp.amax_epsilon)
    if isinstance(recipe, MXFP8BlockScaling | Float8BlockScaling | NVFP4BlockScaling):
        from ._quantizers import module_quantizers

        index = list(module.fp8_gemms).index(module._gemm_of_weight(name))
        return module_quantizers(module, recipe)["scaling_fwd"][3 * index + 1]  # TE's WEIGHT slot of that GEMM
    raise NotImplementedError(
        f"transformer_engine.pytorch.quantized_model_init with {type(recipe).__name__}: FP8 primary weights are "
        "not emulated for this recipe"
    )


def weight_quantizers(module: Any) -> list:
    """TE ``_get_weight_quantizers``: the weight slot's quantizer of each GEMM weight under the module's
    recipe (the last FP8 step's, else the ``quantized_model_init`` one); None outside FP8."""
    recipe = module._last_recipe or (module._param_recipe if module.primary_weights_in_fp8 else None)
    names = module._weights()
    if recipe is None:
        return [None] * len(names)
    return [_weight_quantizer(module, name, recipe) for name in names]


def update_weight_quantizers(module: Any) -> None:
    """TE ``base.py`` ``_update_weight_quantizers``: each quantized weight takes its slot's current
    quantizer (``update_quantizer``, which warns when it changes), e.g. after the delayed-scaling state
    was rebuilt for a new ``amax_history_len``."""
    from ..tensor import QuantizedTensorStorage

    tensors = [getattr(module, n) for n in module._weights()]
    quantizers = weight_quantizers(module)
    for weight, quantizer in zip(tensors, quantizers, strict=True):
        if quantizer is not None and isinstance(weight, QuantizedTensorStorage):
            quantizer.set_usage(rowwise=True, columnwise=weight.get_usages()["columnwise"])
            weight.update_quantizer(quantizer)


def quantize_primary_weights(module: Any, names: list[str], recipe: Recipe, preserve: bool) -> None:
    """Replace each weight ``names[i]`` of ``module`` by an ``nn.Parameter`` of its quantized tensor
    (TE base.py ``reset_parameters``: the column-wise copy only where grad is enabled)."""
    columnwise = torch.is_grad_enabled()
    for name in names:
        hp = getattr(module, name)
        if hp.device.type == "meta":
            continue
        quantizer = _weight_quantizer(module, name, recipe)
        quantizer.set_usage(rowwise=True, columnwise=columnwise)
        with torch.no_grad():
            q = quantizer(hp.detach())
        param = nn.Parameter(q, requires_grad=hp.requires_grad)
        if preserve:
            _attach_high_precision_init_val(param, hp.detach().to("cpu", copy=True))
        module.register_parameter(name, param)


def reset_sharded_parameters(module: Any) -> bool:
    """TE ``base.py`` ``reset_parameters`` for FSDP2 (DTensor) parameters, TE's meta-device flow (build on
    ``device="meta"``, ``fully_shard``, ``to_empty``, ``reset_parameters``): each rank initialises its local
    shard with the parameter's ``init_fn`` (on CPU where it is still on meta), quantizes an FP8 weight's
    shard (current scaling and NVFP4: the amax MAX-reduced over the mesh's shard group, so every shard has
    one scale) and registers a DTensor over it with the parameter's mesh, placements, size and stride.
    Returns False (nothing done) where the module has no DTensor parameter."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch < 2.5 keeps it under _tensor
        from torch.distributed._tensor import DTensor
    params = {name: getattr(module, name, None) for name in module._init_fns}
    if not any(isinstance(p, DTensor) for p in params.values()):
        return False
    from ..tensor import Float8CurrentScalingQuantizer, NVFP4Quantizer

    fp8 = getattr(module, "primary_weights_in_fp8", False)
    for name, p in params.items():
        if not isinstance(p, DTensor):
            continue
        local = p._local_tensor
        if local.is_meta:
            local = torch.empty_like(local, device="cpu")
        with torch.no_grad():
            module._init_fns[name](local)
        value: Any = local
        hp = None
        if fp8 and name in module._weights():
            if module._preserve_high_precision_init_val:
                hp = local.detach().to("cpu", copy=True)
            quantizer = _weight_quantizer(module, name, module._param_recipe)
            quantizer.set_usage(rowwise=True, columnwise=torch.is_grad_enabled())
            if isinstance(quantizer, Float8CurrentScalingQuantizer | NVFP4Quantizer):
                mesh = p.device_mesh
                quantizer = quantizer.copy()  # the module's own weight slot keeps its settings
                quantizer.amax_reduction_group = mesh.get_group(mesh_dim="shard") if mesh.ndim > 1 else mesh.get_group()
                quantizer.with_amax_reduction = True
            with torch.no_grad():
                value = _torch_owned(quantizer(local.detach()))
        dtensor = DTensor.from_local(value, p.device_mesh, p.placements, shape=p.size(), stride=p.stride())
        param = nn.Parameter(dtensor, requires_grad=p.requires_grad)
        if hp is not None:
            _attach_high_precision_init_val(param, hp)
        nn.Module.register_parameter(module, name, param)
    return True


def _torch_owned(q: Any) -> Any:
    """``q`` with every buffer in torch-allocated, resizable storage (a buffer made from numpy is not; FSDP2
    keeps this shard as the parameter, so none may pin its storage)."""
    for key, value in vars(q).items():
        if isinstance(value, torch.Tensor) and not value.untyped_storage().resizable():
            setattr(q, key, value.clone())
    return q


def _attach_high_precision_init_val(param: Any, value: torch.Tensor) -> None:
    """TE ``base.py`` ``_attach_high_precision_init_val``."""
    param._high_precision_init_val = value

    def get(self: Any) -> torch.Tensor | None:
        return getattr(self, "_high_precision_init_val", None)

    def clear(self: Any) -> None:
        self._high_precision_init_val = None

    param.get_high_precision_init_val = types.MethodType(get, param)
    param.clear_high_precision_init_val = types.MethodType(clear, param)


def operand_from_fp8_weight(w: Any) -> Operand:
    """The GEMM operand of a per-tensor FP8 primary weight: its own codes and ``scale_inv``."""
    return Operand.of_per_tensor(w.quantized_data(), w.device)


def block_operands_from_fp8_weight(w: Any) -> tuple[Operand, Operand | None]:
    """``(row, col)`` GEMM operands of a block-scaled primary weight ``w`` (N, K): ``row`` blocked
    along K from the rowwise copy (fprop), ``col`` blocked along N from the columnwise copy (dgrad),
    in the layouts :func:`fp8sim.pytorch.module._operands.quantize_operand` gives; ``col`` is None
    where the weight has no columnwise copy (quantized where grad was disabled)."""
    from ..tensor import Float8BlockwiseQTensor, MXFP8Tensor, NVFP4Tensor

    if w._rowwise_data is None:
        raise RuntimeError(f"{type(w).__name__} weight has no rowwise data; quantize it with rowwise usage")
    if isinstance(w, MXFP8Tensor | NVFP4Tensor):
        row = w.quantized_data()
        col = w.quantized_data(columnwise=True) if w._columnwise_data is not None else None
    elif isinstance(w, Float8BlockwiseQTensor):
        row = w.quantized_data()
        has_col = w._columnwise_data is not None
        col = row if w._is_2D_scaled else (w.quantized_data(columnwise=True) if has_col else None)
    else:
        raise NotImplementedError(f"FP8 primary weights of type {type(w).__name__} are not emulated")
    row_op = Operand(torch.from_numpy(row.dequantize()), row.fmt, qt=row)
    if col is None:
        return row_op, None
    if isinstance(w, NVFP4Tensor):  # stored (K, N): the operand is its transpose
        return row_op, Operand(torch.from_numpy(col.dequantize()).t(), col.fmt, qt=col, transposed=True)
    return row_op, Operand(torch.from_numpy(col.dequantize()), col.fmt, qt=col)
