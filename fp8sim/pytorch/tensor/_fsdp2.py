"""FSDP2 all-gather of FP8 primary weights (TE: ``tensor/float8_tensor.py`` ``fsdp_pre_all_gather``,
``fsdp_post_all_gather``, the ``as_strided`` rule and ``Float8CurrentScalingQuantizer.update_quantized``).

``torch.distributed.fsdp.fully_shard`` shards a ``Float8Tensor`` parameter by rows (``split``,
``new_zeros``, ``copy_``: each shard keeps the codes of its rows and the one ``_scale_inv``).
Before each all-gather FSDP2 asks the shard for its inputs: the uint8 codes ``_data`` (so the
payload is FP8 bytes, and a backend without float8, gloo, carries it); the metadata is
``(_scale_inv, rowwise, columnwise, fp8_dtype)``.  After the gather a ``Float8Tensor`` over the
gathered codes and the shard's ``_scale_inv`` (the same tensor object, so a later in-place
re-quantization of the shard is seen) is the unsharded parameter; later gathers only swap its
``_data``.  The usages follow TE: with ``reshard_after_forward`` the forward gather keeps the
rowwise codes and the backward one the columnwise copy; otherwise rowwise plus the quantizer's
columnwise usage.

Current scaling: FSDP2's first gather sets the shard's ``amax_reduction_group`` to the mesh's
group, and an in-place quantization into such a tensor (the optimizer's update of the shard)
MAX-reduces the amax over it, so every shard of one weight gets the same scale.  Delayed scaling
needs nothing: the shards share the recipe state's scale, and their amaxes meet in the recipe's
own amax reduction.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = [
    "fsdp_pre_all_gather",
    "fsdp_post_all_gather",
    "as_strided",
    "current_scaling_update_quantized",
    "NoCtx",
    "untyped_storage",
    "shard_dispatch",
    "pad_dim",
]


class NoCtx:
    """Stands for an autograd ``ctx`` where an ``autograd.Function.forward`` runs under dispatch."""


def _training_state_is_pre_backward(param_group: Any) -> bool:
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState
    except ImportError:  # pragma: no cover - torch without FSDP2's private module
        return False
    return param_group._training_state == TrainingState.PRE_BACKWARD


def _param_group(module: Any) -> Any:
    """The FSDP2 parameter group of ``module``: its own when it is ``fully_shard``-ed, else that of
    the smallest ``fully_shard``-ed module containing it (TE ``distributed.py``
    ``_get_module_fsdp_state``; found once, then cached on the module)."""
    if hasattr(module, "_get_fsdp_state"):
        state = module._get_fsdp_state()
    else:
        state = getattr(module, "_fp8sim_parent_fsdp_state", None)
        if state is None:
            from torch.distributed._composable_state import _module_state_mapping

            owners = [m for m in list(_module_state_mapping) if hasattr(m, "_get_fsdp_state")]
            owners = [m for m in owners if any(sub is module for sub in m.modules())]
            if not owners:
                raise RuntimeError("Module is not FSDP-wrapped and does not have any FSDP-wrapped parent modules.")
            state = min(owners, key=lambda m: sum(1 for _ in m.modules()))._get_fsdp_state()
            module._fp8sim_parent_fsdp_state = state
    return getattr(state, "_fsdp_param_group", None)


def gather_usages(module: Any, columnwise_usage: bool) -> tuple[bool, bool, bool]:
    """TE's ``fsdp_pre_all_gather`` usage rule: ``(rowwise, columnwise, resharded)``.  Resharded after
    forward, the forward gathers the rowwise copy and the backward the columnwise one; otherwise the one
    gather carries rowwise plus the quantizer's ``columnwise_usage``."""
    group = _param_group(module)
    if group is None:
        raise RuntimeError("FSDP state for this module has no parameter group; cannot determine reshard_after_forward.")
    if group._reshard_after_forward:
        backward = _training_state_is_pre_backward(group)
        return not backward, backward, True
    return True, columnwise_usage, False


def fsdp_pre_all_gather(
    self: Any, mesh: Any, orig_size: torch.Size, contiguous_orig_stride: tuple, module: Any, mp_policy: Any
) -> tuple[tuple[torch.Tensor, ...], tuple]:
    """The shard's FP8 codes to all-gather, and what rebuilds the gathered ``Float8Tensor``."""
    del orig_size, contiguous_orig_stride, mp_policy
    if getattr(self._quantizer, "fsdp_reduces_amax", False) and mesh is not None:  # current scaling
        self.amax_reduction_group = mesh.get_group()  # one scale for all shards of this weight
    rowwise, columnwise, _ = gather_usages(module, self._quantizer.columnwise_usage)
    if self._data is None:
        raise RuntimeError("Float8Tensor has no rowwise data to all-gather")
    return (self._data,), (self._scale_inv, rowwise, columnwise, self._fp8_dtype)


def fsdp_post_all_gather(
    self: Any, all_gather_outputs: tuple[torch.Tensor, ...], metadata: Any, param_dtype: torch.dtype, *, out: Any = None
) -> tuple[Any, tuple[torch.Tensor, ...]] | None:
    """A ``Float8Tensor`` (the shard's class) over the gathered codes (or ``out`` with its codes swapped)."""
    (data,) = all_gather_outputs
    scale_inv, rowwise, columnwise, fp8_dtype = metadata
    if out is not None:
        out._data = data
    else:  # the first gather: the gathered tensor gets its own copy of the shard's quantizer
        out = type(self)(
            shape=data.size(),
            dtype=param_dtype,
            data=data,
            fp8_scale_inv=scale_inv,
            fp8_dtype=fp8_dtype,
            quantizer=self._quantizer,
            requires_grad=False,
            device=data.device,
        )
    out._quantizer.set_usage(rowwise=rowwise, columnwise=columnwise)
    out.update_usage(rowwise_usage=rowwise, columnwise_usage=columnwise)
    return out, all_gather_outputs


def as_strided(tensor: Any, args: tuple, kwargs: dict) -> Any:
    """TE's ``as_strided`` (FSDP2 views the gathered tensor with its original size and stride): a
    ``Float8Tensor`` over the strided codes; the transpose is kept for the identity view only."""
    size, stride = tuple(args[1]), tuple(args[2])
    offset = kwargs.get("storage_offset", args[3] if len(args) > 3 else 0) or 0
    identity = size == tuple(tensor.shape) and stride == tuple(tensor.stride()) and offset == 0
    transpose = None if tensor._transpose_invalid else tensor._transpose
    if tensor._data is None:
        if identity and transpose is not None:
            return tensor._rebuilt(tensor.shape, None, transpose)
        return torch.as_strided(tensor.dequantize(), size, stride, offset)
    data = torch.as_strided(tensor._data, size, stride, offset)
    return tensor._rebuilt(data.shape, data, transpose if identity else None)


def current_scaling_update_quantized(
    self: Any, src: torch.Tensor, dst: Any, *, noop_flag: torch.Tensor | None = None
) -> Any:
    """TE's ``Float8CurrentScalingQuantizer.update_quantized``: a destination with an
    ``amax_reduction_group`` (set by FSDP2) is quantized by a copy of this quantizer that
    MAX-reduces the amax over that group."""
    from .quantized_tensor import Quantizer

    quantizer = self
    group = getattr(dst, "amax_reduction_group", None)
    if group is not None:
        quantizer = self.copy()
        quantizer.with_amax_reduction = True
        quantizer.amax_reduction_group = group
    return Quantizer.update_quantized(quantizer, src, dst, noop_flag=noop_flag)


def untyped_storage(self: Any) -> torch.UntypedStorage:
    """TE's ``QuantizedTensor.untyped_storage`` (``quantized_tensor.py``): an empty storage, the bytes live
    in the data buffers.  FSDP2's ``reset_sharded_param`` (after ``to_empty`` + ``reset_parameters``, TE's
    meta-device flow) compares storage pointers, which a wrapper subclass's own storage lacks."""
    return torch.UntypedStorage(0, device=self.device)


def pad_dim(t: torch.Tensor, dim: int, multiple: int) -> torch.Tensor:
    """``t`` zero-padded at the end of ``dim`` (0 or 1) to a multiple of ``multiple`` (scale-grid padding)."""
    pad = (multiple - t.shape[dim] % multiple) % multiple
    if not pad:
        return t
    return torch.nn.functional.pad(t, (0, 0, 0, pad) if dim == 0 else (0, pad))


def shard_dispatch(func: Any, args: tuple, kwargs: dict, new_zeros: Any, split: Any, refuse: Any) -> Any:
    """The FSDP2 sharding ops on a block-scaled tensor (``new_zeros``, row ``split``, the full ``slice``, a
    same-shape contiguous ``view``/``as_strided``), or ``NotImplemented`` for the class's other rules.
    ``new_zeros(tensor, shape)`` and ``split(tensor, rows)`` are the format's; ``refuse(tensor, why)``
    raises for a partial slice of a padded FSDP2 shard (uneven shards)."""
    aten = torch.ops.aten
    tensor = args[0]
    if func == aten.new_zeros.default:
        return new_zeros(tensor, tuple(args[1]))
    if func == aten.split.Tensor:
        dim = kwargs.get("dim", args[2] if len(args) > 2 else 0)
        return NotImplemented if dim != 0 else (split(tensor, args[1]) or NotImplemented)
    if func == aten.slice.Tensor:  # narrow(0, 0, length) of the padded shard
        dim, start, end, step = (*args[1:], *(0, None, None, 1)[len(args) - 1 :])[:4]
        size = tensor.shape[dim]
        if (start or 0) == 0 and (end is None or end >= size) and step == 1:
            return type(tensor).make_like(tensor)
        if getattr(tensor, "_fp8sim_fsdp_padded", False):
            refuse(tensor, f"uneven shards (a shard of {end} rows in a padded shard of {size})")
        return NotImplemented
    if func in (aten.view.default, aten.as_strided.default):
        shape = tuple(args[1])
        stride = tuple(args[2]) if func == aten.as_strided.default else None
        offset = kwargs.get("storage_offset", args[3] if len(args) > 3 else 0) or 0
        contiguous = stride is None or (stride == tuple(torch.empty(shape, device="meta").stride()) and offset == 0)
        if shape == tuple(tensor.shape) and contiguous:
            return type(tensor).make_like(tensor)
    return NotImplemented
