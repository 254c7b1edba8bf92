"""The forward operands a module saves for ``recipe.backward_override="dequantized"``, as TE saves them.

TE's ``_Linear`` / ``_LayerNormLinear`` / ``_GroupedLinear`` keep the rowwise FP8 operands of fprop (its
``internal=True`` quantizers' storages, columnwise copies dropped) and the backward GEMMs read
``dequantize(dtype=activation_dtype)`` of them.  :func:`rowwise_storage` turns a module operand (the
:class:`~fp8sim.scaling.QuantizedData` record ``quantize_operand`` gave) into that storage, laid out as
TE's tensor of the recipe lays its rowwise copy out, so ``restore_from_saved(grad_fn.tensor_objects,
grad_fn.saved_tensors)`` reads what TE's reads.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ...recipe import Float8BlockScaling, MXFP8BlockScaling, NVFP4BlockScaling, Recipe
from ._operands import PER_TENSOR, Operand
from ._quantizers import _4over6_scope

__all__ = ["rowwise_storage"]


def _fp8_dtype(fmt: Any) -> Any:
    from ..constants import DType

    return DType.kFloat8E4M3 if fmt.name == "e4m3" else DType.kFloat8E5M2


def rowwise_storage(
    op: Operand, shape: tuple[int, ...], dtype: torch.dtype, recipe: Recipe, kind: str, device: Any = None
) -> Any:
    """The rowwise FP8/FP4 storage of ``op`` (an operand of logical ``shape``, nominal ``dtype``) for
    ``recipe`` and role ``kind`` ("input", "weight"); None where the operand has no TE tensor form
    (a custom recipe's slot, fp8sim's NVFP4 variants, a transposed copy)."""
    from ..tensor.storage.quantized_tensor_storage import as_storage

    if op.custom is not None or op.high_precision or op.fmt is None or op.transposed:
        return None
    shape = tuple(shape)
    m, k = math.prod(shape[:-1]), shape[-1]
    if isinstance(recipe, PER_TENSOR) and op.codes is not None:
        from ..tensor import Float8Tensor

        t = Float8Tensor(
            shape=shape,
            dtype=dtype,
            data=op.codes.reshape(shape).contiguous(),
            fp8_scale_inv=torch.tensor([op.scale_inv], dtype=torch.float32),
            fp8_dtype=_fp8_dtype(op.fmt),
            device=device,
        )
        return as_storage(t)
    q = op.qt
    if q is None or tuple(q.shape) != (m, k):
        return None
    codes = torch.from_numpy(np.ascontiguousarray(q.codes[:m, :k]))
    if isinstance(recipe, MXFP8BlockScaling):
        return as_storage(_mxfp8(q, codes, shape, dtype, device))
    if isinstance(recipe, Float8BlockScaling):
        return as_storage(_blockwise(q, codes, shape, dtype, device))
    if isinstance(recipe, NVFP4BlockScaling) and getattr(recipe, "fp8sim_nvfp4_variant", "e4m3x16") == "e4m3x16":
        return as_storage(_nvfp4(q, codes, shape, dtype, recipe, kind, device))
    return None


def _mxfp8(q: Any, codes: torch.Tensor, shape: tuple, dtype: torch.dtype, device: Any) -> Any:
    """TE's MXFP8 rowwise copy: the codes, the E8M0 scales (M, K/32) padded to (128, 4) multiples."""
    from ..tensor import MXFP8Quantizer, MXFP8Tensor
    from ..tensor._blockwise import padded

    dt = _fp8_dtype(q.fmt)
    scales = padded(q.scales, MXFP8Quantizer(dt).get_scale_shape(shape, False), torch.uint8)
    return MXFP8Tensor(
        shape=shape, dtype=dtype, device=device, rowwise_data=codes.reshape(shape), rowwise_scale_inv=scales,
        columnwise_data=None, columnwise_scale_inv=None, fp8_dtype=dt,
    )  # fmt: skip


def _blockwise(q: Any, codes: torch.Tensor, shape: tuple, dtype: torch.dtype, device: Any) -> Any:
    """TE's FP8 block rowwise copy: 1x128 scales stored (K/128, M), 128x128 tile scales (M/128, K/128)."""
    from ..tensor import Float8BlockQuantizer, Float8BlockwiseQTensor
    from ..tensor._blockwise import padded

    dt, two_d = _fp8_dtype(q.fmt), tuple(q.block) == (128, 128)
    quantizer = Float8BlockQuantizer(dt, rowwise=True, columnwise=False, block_scaling_dim=2 if two_d else 1)
    scales = q.scales if two_d else q.scales.T
    return Float8BlockwiseQTensor(
        shape=shape, dtype=dtype, device=device, rowwise_data=codes.reshape(shape),
        rowwise_scale_inv=padded(scales, quantizer.get_scale_shape(shape, False), torch.float32),
        columnwise_data=None, columnwise_scale_inv=None, fp8_dtype=dt, is_2D_scaled=two_d,
    )  # fmt: skip


def _nvfp4(q: Any, codes: torch.Tensor, shape: tuple, dtype: torch.dtype, recipe: Any, kind: str, device: Any) -> Any:
    """TE's NVFP4 rowwise copy: packed E2M1 codes, E4M3 block scales (a 16x16 tile's on each of its rows),
    the global amax; a 4over6 operand keeps its E4M3 maximum (the global scale's numerator)."""
    from ...scaling.packing import pack_fp4
    from ..tensor import NVFP4Quantizer, NVFP4Tensor
    from ..tensor._blockwise import padded

    two_d = tuple(q.block) == (16, 16)
    scales = np.repeat(q.scales, 16, axis=0) if two_d else q.scales
    use_4over6 = _4over6_scope(recipe.nvfp4_4over6, kind)
    emax = 256 if use_4over6 and _4over6_scope(recipe.nvfp4_4over6_e4m3_use_256, kind) else 448
    k = shape[-1]
    return NVFP4Tensor(
        shape=shape, dtype=dtype, device=device,
        rowwise_data=pack_fp4(codes).reshape(*shape[:-1], k // 2),
        rowwise_scale_inv=padded(scales, NVFP4Quantizer().get_scale_shape(shape, False), torch.uint8),
        amax_rowwise=torch.as_tensor(np.asarray(q.global_amax, np.float32)).reshape(-1),
        columnwise_data=None, columnwise_scale_inv=None, amax_columnwise=None,
        with_2d_quantization=two_d, nvfp4_use_4over6=use_4over6, nvfp4_e4m3_max=emax,
    )  # fmt: skip
