"""FSDP2 float8 all-gather, torchao 0.18's semantics (``torchao/float8/fsdp_utils.py``), emulated.

With ``Float8LinearConfig(enable_fsdp_float8_all_gather=True)`` the weight of each
:class:`~fp8sim.torchao.Float8Linear` is a :class:`WeightWithDynamicFloat8CastTensor` (same name
as torchao's).  Under ``torch.distributed.fsdp.fully_shard`` every rank casts its own shard to
float8 before the all-gather and FSDP2 gathers the codes (as ``uint8``: gloo refuses float8):

* the scale is the one of the whole weight: the shard's ``max|w|`` (NaN propagating; an empty
  shard gives 0) MAX-all-reduced over the FSDP mesh, then torchao's ``amax_to_scale`` (float64
  ``max / max(amax, 1e-12)`` rounded to float32, no power-of-2 rounding on this path), or the
  scale :func:`precompute_float8_dynamic_scale_for_fsdp` stored;
* the cast is ``satfinite(RN(fl32(w) * scale))``, from the shard as it is stored (float32
  master weights are cast once: a bf16 ``MixedPrecisionPolicy`` does not round them to bf16 first);
* the gathered codes and the scale are both GEMMs' weight operand (forward and grad_input),
  without a second cast; the unsharded parameter holds ``decode(codes) / scale`` in the param dtype.

Uneven shards (FSDP2's ``torch.chunk`` split, empty shards included) are padded with zero codes
to the padded shard size FSDP2 expects and cut back after the gather.

:func:`precompute_float8_dynamic_scale_for_fsdp` is torchao's arithmetic: one inf-norm per local
weight shard, stacked, MAX-reduced over the mesh dims the weights are sharded on (DTensor's partial
inf-norm: under HSDP the shard dim, not the replicate dim; the all-gather's own amax is reduced over
the shard mesh FSDP2 passes in), clamped to ``EPS`` in the weights' dtype (so
float32 ``fl32(1e-12)``), divided into the format's max in float64, clamped to the float16 max
for float16 weights, rounded to float32.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.utils._pytree as pytree
from torch import nn

from ..cast import decode, encode
from ..formats import get_format
from ..scaling.current import TORCHAO_EPS
from ._float8 import _FP8_FORMATS, _Float8

__all__ = ["WeightWithDynamicFloat8CastTensor", "precompute_float8_dynamic_scale_for_fsdp"]

# the Float8Linear class (``.linear`` registers it): ``linear`` builds on this module, not the reverse
_FLOAT8_LINEARS: list[type] = []


def register_float8_linear(cls: type) -> type:
    """Make :func:`precompute_float8_dynamic_scale_for_fsdp` see modules of class ``cls`` (torchao's
    ``isinstance(m, Float8Linear)``)."""
    _FLOAT8_LINEARS.append(cls)
    return cls


# the ops FSDP2 applies to a sharded parameter (padding, slicing, copying); their results stay wrapped
_PRESERVE = {
    torch.ops.aten.empty_like.default,
    torch.ops.aten.new_zeros.default,
    torch.ops.aten.slice.Tensor,
    torch.ops.aten.copy_.default,
    torch.ops.aten.view.default,
    torch.ops.aten.as_strided.default,
    torch.ops.aten._to_copy.default,
    torch.ops.aten._pin_memory.default,
    torch.ops.aten.split.Tensor,
    torch.ops.aten.clone.default,
}


class WeightWithDynamicFloat8CastTensor(torch.Tensor):
    """A high-precision weight that FSDP2 all-gathers in float8 (module docstring).

    ``tensor``: the weight; ``linear_mm_config``: kept for torchao's signature (fp8sim passes None:
    its GEMMs take their settings from the module); ``dtype``: the float8 dtype;
    ``precomputed_scale``: a float32 scale to use instead of the amax of the next all-gather.
    Every other op sees the plain ``tensor``.
    """

    @staticmethod
    def __new__(
        cls, tensor: torch.Tensor, linear_mm_config: Any, dtype: torch.dtype, precomputed_scale: Any = None
    ) -> WeightWithDynamicFloat8CastTensor:
        return torch.Tensor._make_wrapper_subclass(
            cls,
            tensor.size(),
            strides=tensor.stride(),
            storage_offset=tensor.storage_offset(),
            dtype=tensor.dtype,
            layout=tensor.layout,
            device=tensor.device,
            requires_grad=tensor.requires_grad,
        )

    def __init__(
        self, tensor: torch.Tensor, linear_mm_config: Any, dtype: torch.dtype, precomputed_scale: Any = None
    ) -> None:
        if dtype not in _FP8_FORMATS:
            raise ValueError(f"Unsupported float8_dtype: {dtype}")
        self._tensor = tensor
        self._linear_mm_config = linear_mm_config
        self._dtype = dtype
        self._precomputed_scale = precomputed_scale

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func is torch.ops.aten.detach.default:
            w = args[0]
            return cls(w._tensor, w._linear_mm_config, w._dtype)  # torchao: detach drops the precomputed scale
        wrapped = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, cls)]
        config, dtype = wrapped[0]._linear_mm_config, wrapped[0]._dtype
        if any(w._dtype != dtype for w in wrapped):
            raise AssertionError("WeightWithDynamicFloat8CastTensor operands have different float8 dtypes")
        args, kwargs = pytree.tree_map_only(cls, lambda w: w._tensor, (args, kwargs or {}))
        out = func(*args, **kwargs)
        if func not in _PRESERVE:
            return out
        return pytree.tree_map_only(torch.Tensor, lambda t: cls(t, config, dtype), out)

    def __tensor_flatten__(self) -> tuple[list[str], dict]:
        names = ["_tensor"] + (["_precomputed_scale"] if self._precomputed_scale is not None else [])
        return names, {"mm_config": self._linear_mm_config, "dtype": self._dtype}

    @staticmethod
    def __tensor_unflatten__(inner: dict, spec: dict, outer_size: Any, outer_stride: Any) -> Any:
        return WeightWithDynamicFloat8CastTensor(
            inner["_tensor"], spec["mm_config"], spec["dtype"], inner.get("_precomputed_scale")
        )

    def __repr__(self) -> str:
        return f"WeightWithDynamicFloat8CastTensor(tensor={self._tensor}, dtype={self._dtype})"

    def fsdp_pre_all_gather(
        self, mesh: Any, outer_size: torch.Size, outer_stride: Any, module: nn.Module, mp_policy: Any
    ) -> tuple[tuple[torch.Tensor, ...], Any]:
        """This rank's shard as float8 codes (uint8, padded to FSDP2's shard size) and the scale."""
        fmt = get_format(_FP8_FORMATS[self._dtype])
        shard = self._tensor
        scale = self._precomputed_scale  # read once: precompute may replace it between iterations
        if scale is None:
            amax = torch.max(shard.abs()).float() if shard.numel() else shard.new_zeros((), dtype=torch.float32)
            amax = amax.reshape(()).clone()
            if dist.is_initialized():
                dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=mesh.get_group())
            scale = (fmt.max / torch.clamp(amax.double(), min=TORCHAO_EPS)).float()
        codes = encode(shard.detach().float() * scale, fmt, saturate=True)
        rows = -(-outer_size[0] // mesh.size())  # FSDP2 pads every shard to ceil(dim0 / world) rows
        if codes.shape[0] != rows:
            padded = codes.new_zeros((rows, *outer_size[1:]))
            padded[: codes.shape[0]] = codes
            codes = padded
        return (codes,), (scale, tuple(outer_size))

    def fsdp_post_all_gather(
        self,
        all_gather_outputs: tuple[torch.Tensor, ...],
        metadata: Any,
        param_dtype: torch.dtype,
        *,
        out: torch.Tensor | None = None,
    ) -> Any:
        """The unsharded weight: ``decode(codes) / scale`` carrying the codes and scale for the GEMMs."""
        (data,), (scale, size) = all_gather_outputs, metadata
        fmt = get_format(_FP8_FORMATS[self._dtype])
        codes = data[: size[0]]
        fp8 = _Float8(codes, scale, fmt, False)
        with torch.no_grad():
            values = (decode(codes, fmt) / scale).to(param_dtype)
        if out is not None:  # FSDP2 refills the same storage each unshard, as its own copy-out, unversioned
            with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(out):
                out.copy_(values)
            out._fp8sim_float8 = fp8
            return None
        gathered = values.as_subclass(_GatheredFloat8Weight)
        gathered._fp8sim_float8 = fp8
        return gathered, (gathered,)


class _GatheredFloat8Weight(torch.Tensor):
    """The unsharded weight of a float8 all-gather; ``_fp8sim_float8`` holds the gathered codes and scale.

    Every op returns plain tensors except ``torch.as_strided`` and ``detach``, through which FSDP2
    makes the unsharded Parameter: those keep the float8 record.
    """

    _fp8sim_float8: _Float8

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **(kwargs or {}))
        if func in (torch.Tensor.detach, torch.as_strided) and isinstance(out, torch.Tensor):
            out = out.as_subclass(cls)
            out._fp8sim_float8 = args[0]._fp8sim_float8
        return out


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's own local shard (``to_local()`` returns a view: an attribute set on it is lost)."""
    return t._local_tensor if hasattr(t, "_local_tensor") else t


@torch.no_grad()
def precompute_float8_dynamic_scale_for_fsdp(module: nn.Module) -> None:
    """Compute the scales of every float8-all-gathered weight in ``module`` with one all-reduce
    (torchao's arithmetic, module docstring); call it after the optimizer step."""
    linears = [
        m
        for m in module.modules()
        if isinstance(m, tuple(_FLOAT8_LINEARS))
        and hasattr(m.weight, "device_mesh")
        and isinstance(_local(m.weight), WeightWithDynamicFloat8CastTensor)
    ]
    if not linears:
        return
    dtypes = {m.config.cast_config_weight.target_dtype for m in linears}
    if len(dtypes) != 1:
        names = sorted(map(str, dtypes))
        raise ValueError(f"precompute_float8_dynamic_scale_for_fsdp needs one float8 dtype, got {names}")
    (target_dtype,) = dtypes
    shards = [_local(m.weight)._tensor for m in linears]
    weight_dtype = shards[0].dtype
    norms = [s.abs().max() if s.numel() else s.new_zeros(()) for s in shards]  # inf-norm; empty -> 0
    amax = torch.stack(norms).float()  # MAX is exact in any dtype; gloo reduces float32
    mesh = linears[0].weight.device_mesh
    if dist.is_initialized():  # the inf-norm is partial over the sharded mesh dims only (HSDP: not the replicas)
        for dim in range(mesh.ndim):
            if any(m.weight.placements[dim].is_shard() for m in linears):
                dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=mesh.get_group(dim))
    amax = torch.clamp(amax.to(weight_dtype), TORCHAO_EPS)  # the clamp runs in the weights' dtype
    scale = torch.finfo(target_dtype).max / amax.to(torch.float64)
    if weight_dtype is torch.float16:
        scale = torch.clamp(scale, max=torch.finfo(torch.float16).max)
    scale = scale.to(torch.float32)
    for i, m in enumerate(linears):
        _local(m.weight)._precomputed_scale = scale[i]


# checkpoints holding these weights load with torch.load(weights_only=True), as torchao allows its own
if hasattr(torch.serialization, "add_safe_globals"):
    torch.serialization.add_safe_globals([WeightWithDynamicFloat8CastTensor])
