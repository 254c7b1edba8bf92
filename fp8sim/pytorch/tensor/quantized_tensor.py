"""TE's ``Quantizer`` and ``QuantizedTensor`` bases (TE: ``pytorch/quantized_tensor.py``).

A quantizer turns a high-precision tensor into a quantized tensor; the quantized tensor is a
``torch.Tensor`` wrapper subclass (``_make_wrapper_subclass`` + ``__torch_dispatch__``, torch 2.7+)
whose ``dtype`` is the nominal high-precision dtype and whose data are the codes and scales fp8sim's
bit-exact ``fp8sim.scaling`` computes.  As in TE, an op the subclass does not handle runs on the
dequantized values, and an in-place op dequantizes, runs, and quantizes the result back.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._pytree import tree_map

from .storage.quantized_tensor_storage import QuantizedTensorStorage

__all__ = ["Quantizer", "QuantizedTensor", "QuantizedTensorStorage", "prepare_for_saving", "restore_from_saved"]

_HIGH_PRECISION = (torch.float32, torch.float16, torch.bfloat16)


class _QuantizeFunc(torch.autograd.Function):
    """Quantize in the forward pass; the gradient passes straight through (TE's ``_QuantizeFunc``)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, impl: Any) -> Any:  # noqa: ARG004
        return impl(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return grad, None


class _IdentityFunc(torch.autograd.Function):
    """A new quantized tensor over ``init`` data, with an identity gradient."""

    @staticmethod
    def forward(ctx: Any, tensor: QuantizedTensor, init: dict[str, Any] | None = None) -> QuantizedTensor:  # noqa: ARG004
        kwargs = tensor.get_metadata()
        kwargs.update(init or {})
        return type(tensor)(shape=tensor.shape, dtype=tensor.dtype, device=tensor.device, **kwargs)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return grad, None


class Quantizer(abc.ABC):
    """Builder of quantized tensors.  ``rowwise_usage``: keep the data laid out for ``x @ W^T``
    (row-major); ``columnwise_usage``: keep the copy the transposed GEMMs (dgrad/wgrad) read;
    ``internal``: TE returns storage objects without autograd (fp8sim returns the same tensors)."""

    rowwise_usage: bool
    columnwise_usage: bool
    internal: bool
    optimize_for_gemm: bool

    def __init__(self, *, rowwise: bool, columnwise: bool) -> None:
        self.rowwise_usage = rowwise
        self.columnwise_usage = columnwise
        self.internal = False
        self.optimize_for_gemm = False

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(rowwise_usage={self.rowwise_usage}, "
            f"columnwise_usage={self.columnwise_usage}, internal={self.internal}, )"
        )

    def set_usage(self, *, rowwise: bool | None = None, columnwise: bool | None = None) -> None:
        """Which copies later quantizations produce (None: unchanged)."""
        if rowwise is not None:
            self.rowwise_usage = rowwise
        if columnwise is not None:
            self.columnwise_usage = columnwise

    def get_usages(self) -> dict[str, bool]:
        return {"rowwise": self.rowwise_usage, "columnwise": self.columnwise_usage}

    @abc.abstractmethod
    def quantize_impl(self, tensor: torch.Tensor) -> QuantizedTensor:
        """Quantize ``tensor`` (no autograd)."""

    @abc.abstractmethod
    def copy(self) -> Quantizer:
        """A shallow copy (shared state tensors)."""

    def update_quantized(
        self, src: torch.Tensor, dst: QuantizedTensor, *, noop_flag: torch.Tensor | None = None
    ) -> QuantizedTensor:
        """Quantize ``src`` into ``dst`` in place (skipped when ``noop_flag`` is 1, as TE's kernels)."""
        _check_destination(self, dst)
        if noop_flag is not None and float(noop_flag.reshape(-1)[0]) == 1.0:
            return dst
        if isinstance(src, QuantizedTensor):
            src = src.dequantize()
        new = self.quantize_impl(src.detach())
        dst._assign_from(new)
        return dst

    def quantize(
        self, tensor: torch.Tensor, *, out: QuantizedTensor | None = None, dtype: torch.dtype | None = None
    ) -> QuantizedTensor:
        """Quantize ``tensor`` (into ``out`` when given); under grad mode the result is connected to
        ``tensor`` with a straight-through gradient, as TE's ``_QuantizeFunc``."""
        del dtype  # used by some upstream overrides only
        if out is not None:
            return self.update_quantized(tensor, out)
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{type(self).__name__} quantizes a torch.Tensor, got {type(tensor).__name__}")
        if not self.internal and torch.is_grad_enabled() and tensor.requires_grad:
            result = _QuantizeFunc.apply(tensor, self.quantize_impl)
        else:
            result = self.quantize_impl(tensor.detach())
        # TE: the amax reduction group never persists on a tensor's quantizer (its own copy)
        result_quantizer = getattr(result, "_quantizer", None)
        if getattr(result_quantizer, "with_amax_reduction", False):
            result_quantizer.with_amax_reduction = False
            result_quantizer.amax_reduction_group = None
        return result

    def __call__(self, tensor: torch.Tensor) -> QuantizedTensor:
        return self.quantize(tensor)

    def multi_quantize(self, list_of_tensors: Iterable[torch.Tensor]) -> list[QuantizedTensor]:
        return [self.quantize(t) for t in list_of_tensors]

    def make_empty(
        self,
        shape: Iterable[int],
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        requires_grad: bool = False,
        pin_memory: bool = False,
    ) -> QuantizedTensor:
        """A quantized tensor of ``shape`` with this quantizer's usages (its data: quantized zeros,
        where TE leaves it uninitialised)."""
        del pin_memory
        out = self.quantize_impl(torch.zeros(tuple(shape), dtype=dtype, device=device or "cpu"))
        out.requires_grad_(requires_grad)
        return out

    def calibrate(self, tensor: torch.Tensor) -> None:
        """Record statistics without quantizing (no-op unless the scaling keeps state)."""
        del tensor

    def is_quantizable(self, inp: torch.Tensor) -> bool:
        del inp
        return True


# TE's refusals of a destination of the wrong class (each quantizer's ``update_quantized``).
_DESTINATIONS = {
    "Float8Quantizer": ("Float8Tensor", ValueError, "Float8Quantizer can only update Float8Tensor"),
    "Float8CurrentScalingQuantizer": (
        "Float8Tensor",
        ValueError,
        "Float8CurrentScalingQuantizer can only update Float8Tensor",
    ),
    "MXFP8Quantizer": ("MXFP8Tensor", AssertionError, "Cannot store quantized MXFP8 in {} type."),
    "Float8BlockQuantizer": (
        "Float8BlockwiseQTensor",
        AssertionError,
        "Cannot store quantized blockwise tensor in {} type.",
    ),
    "NVFP4Quantizer": ("NVFP4Tensor", AssertionError, "Cannot store quantized NVFP4 in {} type."),
}


def _check_destination(quantizer: Quantizer, dst: Any) -> None:
    for cls in type(quantizer).__mro__:
        if cls.__name__ in _DESTINATIONS:
            want, exc, message = _DESTINATIONS[cls.__name__]
            if not any(c.__name__ == want for c in type(dst).__mro__):
                raise exc(message.format(type(dst)))
            return


def _check_high_precision(tensor: torch.Tensor, who: str) -> None:
    if tensor.dtype not in _HIGH_PRECISION:
        allowed = ", ".join(str(d) for d in _HIGH_PRECISION)
        raise TypeError(f"{who} quantizes {allowed} tensors, got {tensor.dtype}")


class QuantizedTensor(torch.Tensor):
    """A tensor with quantized data: shape and nominal ``dtype`` of the high-precision tensor it
    stands for, data in subclass attributes (``_data``, ``_scale_inv``, ...)."""

    _quantizer: Quantizer | None

    def __new__(
        cls,
        shape: Iterable[int],
        dtype: torch.dtype,
        *,
        requires_grad: bool = False,
        device: torch.device | str | None = None,
        fake_dtype: torch.dtype | None = None,
        **kwargs: Any,
    ) -> QuantizedTensor:
        if fake_dtype is not None and fake_dtype != dtype:
            raise ValueError(f"fake_dtype ({fake_dtype}) does not match dtype ({dtype})")
        shape = torch.Size(shape)
        stride, acc = [], 1
        for n in reversed(shape):
            stride.append(acc)
            acc *= max(n, 1)
        instance = torch.Tensor._make_wrapper_subclass(
            cls,
            shape,
            strides=tuple(reversed(stride)),
            dtype=dtype,
            layout=torch.strided,
            requires_grad=requires_grad,
            device=torch.device("cpu") if device is None else device,
        )
        instance._init(**kwargs)
        return instance

    def _init(self, **kwargs: Any) -> None:  # subclasses store their data
        if kwargs:
            raise TypeError(f"unexpected arguments {', '.join(kwargs)}")

    def get_metadata(self) -> dict[str, Any]:
        """Constructor keyword arguments (besides shape/dtype) giving a tensor over the same data."""
        raise NotImplementedError(f"{type(self).__name__} class does not implement get_metadata function")

    def _assign_from(self, other: QuantizedTensor) -> None:
        """Take over ``other``'s data (same shape): the in-place quantize.  As TE's kernels write into
        the destination's buffers (``csrc/quantizer.cpp`` ``convert_and_update_tensor``), a buffer
        of the same shape and dtype is overwritten in place (views of it see the new data), and the
        destination keeps its own ``_quantizer`` (TE's C++ never assigns it)."""
        if tuple(other.shape) != tuple(self.shape):
            raise ValueError(f"cannot quantize a tensor of shape {tuple(other.shape)} into {tuple(self.shape)}")
        old, meta = self.get_metadata(), other.get_metadata()
        with torch.no_grad():
            for key, value in meta.items():
                buf = old.get(key)
                if (
                    isinstance(value, torch.Tensor)
                    and isinstance(buf, torch.Tensor)
                    and buf is not value
                    and buf.shape == value.shape
                    and buf.dtype == value.dtype
                ):
                    buf.copy_(value)
                    meta[key] = buf
        quantizer = self._quantizer
        self._init(**meta)
        self._quantizer = quantizer

    def _copy_raw_from(self, src: QuantizedTensor) -> None:
        """TE's ``copy_`` between tensors of one quantizer type and the same usages
        (``quantized_tensor.py`` ``__torch_dispatch__``): each data/scale buffer of ``src`` is copied
        into this tensor's buffer, in place; the quantizer and other attributes stay this tensor's."""
        dst_meta, src_meta = self.get_metadata(), src.get_metadata()
        with torch.no_grad():
            for key, buf in dst_meta.items():
                value = src_meta.get(key)
                if isinstance(buf, torch.Tensor) and isinstance(value, torch.Tensor):
                    buf.copy_(value)

    _saved_fields: tuple[str, ...] = ()
    """The buffers ``prepare_for_saving`` hands out, in TE's order (attribute names)."""

    def prepare_for_saving(self) -> tuple[list[torch.Tensor | None], QuantizedTensor]:
        """TE's ``prepare_for_saving``: the data/scale buffers in TE's order, detached from this
        tensor (its attributes become None) until :meth:`restore_from_saved`."""
        tensors = [getattr(self, name) for name in self._saved_fields]
        for name in self._saved_fields:
            setattr(self, name, None)
        return tensors, self

    def restore_from_saved(self, tensors: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
        """Put back the buffers :meth:`prepare_for_saving` gave; returns the rest of the list."""
        n = len(self._saved_fields)
        for name, t in zip(self._saved_fields, tensors[:n], strict=True):
            setattr(self, name, t)
        return tensors[n:]

    def quantized_data(self, columnwise: bool = False) -> Any:
        """fp8sim's record of this tensor's codes and scales (:class:`fp8sim.scaling.QuantizedData`): the
        rowwise copy, or the columnwise one (``tensor/_quantized_data.py``)."""
        from ._quantized_data import quantized_data

        return quantized_data(self, columnwise)

    def dequantize(self, *, dtype: torch.dtype | None = None) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} class does not implement dequantize function")

    def quantize_(self, tensor: torch.Tensor, *, noop_flag: torch.Tensor | None = None) -> QuantizedTensor:
        """Overwrite the data with the quantization of ``tensor`` (with this tensor's quantizer, TE's
        ``_get_quantizer``: else the class's default one)."""
        if isinstance(self, QuantizedTensorStorage):
            return self._get_quantizer().update_quantized(tensor, self, noop_flag=noop_flag)
        if self._quantizer is None:
            raise RuntimeError(f"{type(self).__name__} has no quantizer; cannot quantize in place")
        return self._quantizer.update_quantized(tensor, self, noop_flag=noop_flag)

    @classmethod
    def make_like(
        cls,
        tensor: QuantizedTensor,
        *,
        shape: Iterable[int] | None = None,
        dtype: torch.dtype | None = None,
        requires_grad: bool = False,
    ) -> QuantizedTensor:
        """A new tensor over the same data (optionally another nominal dtype)."""
        return cls(
            shape=tensor.shape if shape is None else shape,
            dtype=tensor.dtype if dtype is None else dtype,
            requires_grad=requires_grad,
            device=tensor.device,
            **tensor.get_metadata(),
        )

    def to_dtype(self, dtype: torch.dtype) -> QuantizedTensor:
        return type(self).make_like(self, dtype=dtype)

    def detach(self) -> QuantizedTensor:
        return type(self).make_like(self)

    def clone(self, *, memory_format: Any = None) -> QuantizedTensor:
        del memory_format
        return _IdentityFunc.apply(self, self._cloned_data())

    def _cloned_data(self) -> dict[str, Any]:
        return {k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in self.get_metadata().items()}

    def float(self) -> torch.Tensor:  # type: ignore[override]
        return self.dequantize(dtype=torch.float32)

    def bfloat16(self) -> torch.Tensor:  # type: ignore[override]
        return self.dequantize(dtype=torch.bfloat16)

    def half(self) -> torch.Tensor:  # type: ignore[override]
        return self.dequantize(dtype=torch.float16)

    def contiguous(self, memory_format: torch.memory_format = torch.contiguous_format) -> QuantizedTensor:
        del memory_format
        return self

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        return f"{type(self).__name__}(data={self.dequantize()})"

    def __reduce_ex__(self, protocol: int) -> tuple:
        meta = {k: v for k, v in self.get_metadata().items()}
        return (_rebuild, (type(self), tuple(self.shape), self.dtype, meta))

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func == torch.ops.aten.detach.default:
            return args[0].detach()
        if func == torch.ops.aten.clone.default:
            return type(args[0]).make_like(args[0])._with_data(args[0]._cloned_data())
        if func == torch.ops.aten.numel.default:
            return math.prod(args[0].shape)
        if func == torch.ops.aten.view.default:  # TE: subclasses implement views, the base refuses them
            raise NotImplementedError(f"{cls.__name__} class does not support tensor views")
        if func == torch.ops.aten.new_empty.default:  # TE: a quantized tensor from the quantizer
            tensor = args[0]
            if tensor._quantizer is None:
                raise RuntimeError(
                    f"{type(tensor).__name__} does not have a quantizer; cannot create new_empty QuantizedTensor"
                )
            return tensor._quantizer.make_empty(
                torch.Size(args[1]),
                dtype=kwargs.get("dtype") or tensor.dtype,
                device=kwargs.get("device") or tensor.device,
                requires_grad=tensor.requires_grad,
            )
        if func == torch.ops.aten.empty_like.default and args[0]._quantizer is not None:
            tensor = args[0]  # TE: the quantizer with the tensor's usages makes it
            quantizer = tensor._quantizer.copy()
            quantizer.set_usage(**tensor.get_usages())
            return quantizer.make_empty(
                tensor.shape,
                dtype=tensor.dtype,
                device=kwargs.get("device") or tensor.device,
                requires_grad=kwargs.get("requires_grad", tensor.requires_grad),
            )
        if func == torch.ops.aten.copy_.default:
            dst, src = args[0], args[1]
            if isinstance(dst, QuantizedTensor):
                if (
                    isinstance(src, QuantizedTensor)
                    and type(dst._quantizer) is type(src._quantizer)
                    and src.get_usages() == dst.get_usages()
                ):
                    dst._copy_raw_from(src)
                else:
                    dst.quantize_(src.dequantize() if isinstance(src, QuantizedTensor) else src)
            else:
                if isinstance(src, QuantizedTensor):
                    dt = dst.dtype if dst.dtype in _HIGH_PRECISION else torch.float32
                    src = src.dequantize(dtype=dt)
                dst.copy_(src)
            return dst

        def unwrap(a: Any) -> Any:
            return a.dequantize() if isinstance(a, QuantizedTensor) else a

        if func._schema.is_mutable:  # in place: dequantize, run, quantize back (TE's rule)
            new_args, new_kwargs = tree_map(unwrap, args), tree_map(unwrap, kwargs)
            out = func(*new_args, **new_kwargs)
            schema = {sa.name: sa for sa in func._schema.arguments}
            for a, na, sa in zip(args, new_args, func._schema.arguments, strict=False):
                _requantize_written(a, na, sa)
            for name, a in kwargs.items():  # e.g. ``out=``: TE re-quantizes keyword arguments too
                _requantize_written(a, new_kwargs[name], schema.get(name))
            return args[0] if args and isinstance(args[0], QuantizedTensor) else out
        return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))

    def _with_data(self, data: dict[str, Any]) -> QuantizedTensor:
        self._init(**data)
        return self


def _requantize_written(arg: Any, new_arg: Any, schema_arg: Any) -> None:
    """TE's ``maybe_update_inplace``: quantize back what an in-place op wrote (lists recursively)."""
    alias = getattr(schema_arg, "alias_info", None)
    if isinstance(arg, QuantizedTensor) and isinstance(new_arg, torch.Tensor):
        if alias is not None and alias.is_write:
            arg.quantize_(new_arg)
    elif isinstance(arg, list | tuple) and isinstance(new_arg, list | tuple):
        for a, na in zip(arg, new_arg, strict=False):
            _requantize_written(a, na, schema_arg)


def prepare_for_saving(*tensors: Any) -> tuple[list[Any], list[Any]]:
    """TE's module-level ``prepare_for_saving`` (``quantized_tensor.py``): tensors (quantized tensors
    included, being ``torch.Tensor`` subclasses) and None are kept as they are; other storages give
    their buffers.  Returns the tensors for ``save_for_backward`` and the objects to restore into."""
    tensor_list: list[Any] = []
    objects: list[Any] = []
    for tensor in tensors:
        if tensor is None or isinstance(tensor, torch.Tensor):
            tensor_list.append(tensor)
            objects.append(None)
        else:
            t, obj = tensor.prepare_for_saving()
            tensor_list.extend(t)
            objects.append(obj)
    return tensor_list, objects


def restore_from_saved(tensors: list[Any], saved_tensors: list[Any], return_saved_tensors: bool = False) -> Any:
    """TE's ``restore_from_saved``: recombine what :func:`prepare_for_saving` split (``tensors``: its
    second result)."""
    out = []
    saved = list(saved_tensors)
    for tensor in tensors:
        if tensor is None or isinstance(tensor, torch.Tensor):
            out.append(saved[0])
            saved = saved[1:]
        else:
            saved = tensor.restore_from_saved(saved)
            out.append(tensor)
    return (out, saved) if return_saved_tensors else out


def _rebuild(cls: type, shape: tuple, dtype: torch.dtype, meta: dict[str, Any]) -> QuantizedTensor:
    """Unpickling (``torch.save``/``torch.load``) of a quantized tensor."""
    return cls(shape=shape, dtype=dtype, **meta)
