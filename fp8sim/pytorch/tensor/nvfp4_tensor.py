"""TE's ``NVFP4Quantizer`` and ``NVFP4Tensor`` (TE: ``pytorch/tensor/nvfp4_tensor.py``).

Numerics are ``fp8sim.scaling.quantize_nvfp4(flavor="te")`` over the 2-D view ``(M, K)``: the
rowwise copy blocks the last dim; the columnwise copy is the transposed ``(K, M)`` tensor, with the
random Hadamard transform when ``with_rht`` (its amax then taken after the transform, TE's
``with_post_rht_amax``).  Layouts are TE's (``get_scale_shape``): E2M1 codes packed two per byte
(element 2i in the low nibble), rowwise ``(*shape[:-1], K/2)`` and columnwise ``(K, M/2)``; E4M3
block scales (uint8) of shape ``(round_up(M, 128), round_up(ceil(K/16), 4))`` and
``(round_up(K, 128), round_up(ceil(M/16), 4))``; ``_amax_rowwise`` / ``_amax_columnwise`` float32
(for ``row_scaled_nvfp4`` one per row, and one per column for the columnwise copy, TE's
``compute_columnwise_amax``; that copy needs bf16 input and dims multiples of 32, as TE's kernel).
Dequantization is TE's (``dequantize_nvfp4.cuh``, via ``fp8sim.scaling.dequantize_nvfp4``).
Stochastic rounding uses fp8sim's seeded generator, or TE's
Philox bits when ``te_rng_generator`` is set (``fp8sim.scaling.nvfp4_te_sr``: TE's 1x16 and 16x16 kernels, its
fused and unfused RHT casts, chosen as TE's dispatch does, the fused one by shape and ``te_sm_arch``);
``with_random_sign_mask=False`` transforms with the unsigned Hadamard matrix; ``with_post_rht_amax``
without RHT changes nothing (TE ignores it there); what TE's ``quantize_impl`` refuses raises its
``RuntimeError``.  ``nvfp4_use_4over6``: TE's 4over6 kernel
(``fp8sim.scaling.quantize_nvfp4_4over6``; ``quantize_4over6_nvfp4.cuh``) for both copies, the columnwise one
on the transposed tensor with the same global amax (1x16 blocks or 16x16 tiles, row-scaled rowwise), and
the candidate error in f16 when ``NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH`` is set, and
dequantization with the tensor's ``_nvfp4_e4m3_max`` (``dequantize_nvfp4.cuh``: ``1 / (6 * E4M3_MAX)``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ...formats import get_format
from ...scaling.nvfp4 import RHT_SIGNS, apply_rht, dequantize_nvfp4, quantize_nvfp4, rht_matrix
from ...scaling.nvfp4_4over6 import (
    dequantize_nvfp4_te,
    quantize_nvfp4_4over6,
    quantize_nvfp4_4over6_columnwise,
    te_err_use_fast_math,
)
from ...scaling.nvfp4_te_sr import (
    TE_RNG_ELTS_PER_THREAD,
    TEPhiloxGenerator,
    TESRCopies,
    quantize_nvfp4_te_sr,
    quantize_nvfp4_te_sr_rht,
    te_rht_cast_fusion_eligible,
)
from ...scaling.packing import pack_fp4, unpack_fp4
from ...scaling.quantized import QuantizedData as _SimQT
from ..constants import NVFP4_BLOCK_SCALING_SIZE, DType, TE_DType
from . import _fsdp2, _fsdp2_nvfp4
from ._blockwise import _FSDP_NOTE, BlockScaledTensor, check_usage, flatten_2d, padded, round_up
from ._data_setter import data_property
from .quantized_tensor import Quantizer, _check_high_precision
from .storage.nvfp4_tensor_storage import NVFP4TensorStorage

__all__ = ["NVFP4Quantizer", "NVFP4Tensor"]

_B = NVFP4_BLOCK_SCALING_SIZE
_E2M1, _E4M3 = get_format("e2m1"), get_format("e4m3")
_OUT = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def is_nvfp4_quantizable(shape: tuple[int, ...], row_scaled: bool = False) -> bool:
    """TE ``NVFP4Quantizer.is_quantizable`` for a shard of ``shape``."""
    return not row_scaled and len(shape) >= 2 and shape[-1] % _B == 0 and math.prod(shape[:-1]) % _B == 0


class NVFP4Quantizer(Quantizer):
    """NVFP4: E2M1 elements, E4M3 scales per 16 (or per 16x16 tile with ``with_2d_quantization``),
    a float32 global scale from the amax (all-reduced with MAX when ``with_amax_reduction``)."""

    def __init__(
        self,
        fp4_dtype: DType | int = DType.kFloat4E2M1,
        rowwise: bool = True,
        columnwise: bool = True,
        with_amax_reduction: bool = False,
        amax_reduction_group: Any = None,
        with_rht: bool = False,
        with_post_rht_amax: bool = False,
        with_2d_quantization: bool = False,
        stochastic_rounding: bool = False,
        row_scaled_nvfp4: bool = False,
        nvfp4_use_4over6: bool = False,
        nvfp4_e4m3_max: int = 448,
        nvfp4_4over6_err_mode: str = "MAE",
        with_random_sign_mask: bool = True,
    ) -> None:
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        self.dtype = DType.cast(fp4_dtype)
        if self.dtype != DType.kFloat4E2M1:
            raise ValueError(f"fp4_dtype must be DType.kFloat4E2M1, got {self.dtype!r}")
        self.with_rht = with_rht
        self.with_post_rht_amax = with_post_rht_amax
        self.with_amax_reduction = with_amax_reduction
        self.amax_reduction_group = amax_reduction_group
        self.with_2d_quantization = with_2d_quantization
        self.stochastic_rounding = stochastic_rounding
        self.row_scaled_nvfp4 = row_scaled_nvfp4
        self.nvfp4_use_4over6 = nvfp4_use_4over6
        self.nvfp4_e4m3_max = nvfp4_e4m3_max if nvfp4_use_4over6 else 448
        if self.nvfp4_e4m3_max not in (448, 256):
            raise ValueError("nvfp4_e4m3_max must be 448 or 256.")
        self.nvfp4_4over6_err_mode = nvfp4_4over6_err_mode.upper()
        if self.nvfp4_4over6_err_mode not in ("MAE", "MSE"):
            raise ValueError("nvfp4_4over6_err_mode must be 'MAE' or 'MSE'.")
        self.with_random_sign_mask = with_random_sign_mask
        self._calls = 0  # stochastic-rounding seed counter

    update_quantized = _fsdp2.current_scaling_update_quantized  # honours dst.amax_reduction_group (FSDP2)

    def copy(self) -> NVFP4Quantizer:
        q = NVFP4Quantizer.__new__(NVFP4Quantizer)
        q.__dict__.update(self.__dict__)
        return q

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["amax_reduction_group"] = None
        return state

    def get_scale_shape(self, shape: tuple[int, ...], columnwise: bool) -> tuple[int, int]:
        m, k = flatten_2d(shape)
        if columnwise:
            return round_up(k, 128), round_up(-(-m // _B), 4)
        return round_up(m, 128), round_up(-(-k // _B), 4)

    def _check(self, tensor: torch.Tensor) -> None:
        """TE's refusals (``csrc/quantizer.cpp`` ``NVFP4Quantizer::quantize_impl``, then ``dispatch/quantize.cuh``
        and ``quantize_4over6``), in its order."""
        if self.nvfp4_use_4over6:
            if self.with_rht:
                raise RuntimeError("NVFP4 4over6 quantization does not support RHT.")
            if self.stochastic_rounding:
                raise RuntimeError("NVFP4 4over6 quantization does not support stochastic rounding.")
        if self.row_scaled_nvfp4:
            for flag, what in (
                (self.with_rht, "RHT"),
                (self.with_2d_quantization, "2D quantization"),
                (self.stochastic_rounding, "stochastic rounding"),
                (self.with_amax_reduction, "amax reduction"),
            ):
                if flag:
                    raise RuntimeError(f"Row-scaled NVFP4 quantization does not support {what}.")
        if self.with_rht:
            if tensor.dtype != torch.bfloat16:
                dt = int(TE_DType[tensor.dtype])
                raise RuntimeError(f"RHT is only supported for bfloat16 input, got dtype enum value {dt}")
            if not self.with_post_rht_amax:
                raise RuntimeError("Pre-RHT amax is not supported yet. Use with_post_rht_amax=true instead.")
        if self.nvfp4_use_4over6 and tensor.numel():
            self._check_4over6(tensor)
        if self.row_scaled_nvfp4 and self.columnwise_usage and tensor.numel():  # dispatch/quantize.cuh
            rows, cols = flatten_2d(tuple(tensor.shape))
            if tensor.dtype != torch.bfloat16 or rows % 32 or cols % 32:
                raise RuntimeError(
                    "Row-scaled NVFP4 transpose quantization requires BF16 input and dimensions that are "
                    "multiples of 32."
                )

    def _check_4over6(self, tensor: torch.Tensor) -> None:
        """TE's 4over6 refusals (``dispatch/quantize.cuh`` and ``quantize_4over6_nvfp4.cuh`` ``quantize_4over6``)."""
        self._err_fast_math = te_err_use_fast_math()  # TE reads the variable on every cast
        rows, cols = flatten_2d(tuple(tensor.shape))
        if self.row_scaled_nvfp4 and self.columnwise_usage:
            raise RuntimeError(
                "Row-scaled NVFP4 transpose quantization is not supported with 4over6 mode. The 4over6 "
                "kernel does not consume the per-row/per-column amaxes, so the columnwise output would "
                "be incorrect."
            )
        if cols % _B:
            raise RuntimeError(f"NVFP4 4over6 quantization requires columns divisible by {_B}.")
        if (self.columnwise_usage or self.with_2d_quantization) and rows % _B:
            raise RuntimeError(f"NVFP4 4over6 columnwise or 2D quantization requires rows divisible by {_B}.")
        if self.with_2d_quantization and not self.rowwise_usage:
            raise RuntimeError("NVFP4 4over6 2D quantization requires rowwise output.")

    def quantize_impl(self, tensor: torch.Tensor) -> NVFP4Tensor:
        _check_high_precision(tensor, type(self).__name__)
        check_usage(self)
        self._check(tensor)
        shape = tuple(tensor.shape)
        m, k = flatten_2d(shape)
        x = tensor.detach().to("cpu").reshape(m, k)
        seed = None
        if self.stochastic_rounding:
            self._calls += 1
            seed = self._calls
        common = dict(flavor="te", block_2d=self.with_2d_quantization, stochastic=self.stochastic_rounding)
        # TE returns before drawing an rng_state when the input is empty (quantizer.cpp quantize_impl)
        te_sr = self._te_sr_copies(x) if self.stochastic_rounding and self.te_rng_generator and x.numel() else None
        out: dict[str, Any] = {}
        if self.rowwise_usage:
            amax = self._global_amax(x)
            if self.nvfp4_use_4over6:
                q = self._4over6(x, amax)
            else:
                q = (
                    te_sr.rowwise
                    if te_sr
                    else quantize_nvfp4(x, **common, seed=seed, row_scaled=self.row_scaled_nvfp4, global_amax=amax)
                )
            out.update(
                rowwise_data=pack_fp4(torch.from_numpy(q.codes[:m, :k])).reshape(*shape[:-1], k // 2),
                rowwise_scale_inv=padded(self._per_row(q.scales), self.get_scale_shape(shape, False), torch.uint8),
                amax_rowwise=torch.as_tensor(np.asarray(q.global_amax, np.float32)).reshape(-1),
            )
        if self.columnwise_usage:
            xt = x.t().contiguous()
            s2 = None if seed is None else seed + 2**32
            if self.nvfp4_use_4over6:  # quantize_stage_colwise: the transposed tensor, the same global amax
                amax = self._global_amax(x)
                q = quantize_nvfp4_4over6_columnwise(
                    x,
                    err_mode=self.nvfp4_4over6_err_mode,
                    e4m3_max=self.nvfp4_e4m3_max,
                    global_amax=amax,
                    block_2d=self.with_2d_quantization,
                    err_fast_math=self._err_fast_math,
                )
            elif te_sr:
                q = te_sr.columnwise
            else:
                if self.with_rht and not self.with_random_sign_mask:  # TE's sign mask 0: the plain Hadamard/4
                    xt = _hadamard_bf16(xt)
                rht = self.with_rht and self.with_random_sign_mask
                amax_t = self._global_amax(xt) if self._supplied_amax is not None else None
                if amax_t is None and self.with_amax_reduction:  # TE reduces the (post-RHT) columnwise amax too
                    amax_t = self._reduced((apply_rht(xt) if rht else xt).abs().float().nan_to_num(0.0).amax())
                # row-scaled: TE's compute_columnwise_amax gives one amax per column of x (per row of x.T),
                # each block of the transposed copy encoded with its own (tuned 1D kernel, ROW_SCALED_NVFP4)
                q = quantize_nvfp4(xt, **common, rht=rht, seed=s2, global_amax=amax_t, row_scaled=self.row_scaled_nvfp4)
            out.update(
                columnwise_data=pack_fp4(torch.from_numpy(q.codes[:k, :m])),
                columnwise_scale_inv=padded(self._per_row(q.scales), self.get_scale_shape(shape, True), torch.uint8),
                amax_columnwise=torch.as_tensor(np.asarray(q.global_amax, np.float32)).reshape(-1),
            )
        dev = tensor.device
        out = {key: v.to(dev) for key, v in out.items()}
        return NVFP4Tensor(
            shape=shape,
            dtype=tensor.dtype,
            device=dev,
            rowwise_data=out.get("rowwise_data"),
            rowwise_scale_inv=out.get("rowwise_scale_inv"),
            columnwise_data=out.get("columnwise_data"),
            columnwise_scale_inv=out.get("columnwise_scale_inv"),
            amax_rowwise=out.get("amax_rowwise"),
            amax_columnwise=out.get("amax_columnwise"),
            fp4_dtype=self.dtype,
            quantizer=self,
            with_2d_quantization=self.with_2d_quantization,
            nvfp4_use_4over6=self.nvfp4_use_4over6,
            nvfp4_e4m3_max=self.nvfp4_e4m3_max,
            row_scaled_nvfp4=self.row_scaled_nvfp4,
        )

    def _4over6(self, x: torch.Tensor, amax: float | None) -> _SimQT:
        """TE's 4over6 kernel on the 2-D ``x`` (rows blocked along its last dim)."""
        return quantize_nvfp4_4over6(
            x,
            err_mode=self.nvfp4_4over6_err_mode,
            e4m3_max=self.nvfp4_e4m3_max,
            global_amax=amax,
            block_2d=self.with_2d_quantization,
            row_scaled=self.row_scaled_nvfp4,
            err_fast_math=self._err_fast_math,
        )

    _err_fast_math = False  # NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH at the current cast (_check_4over6)
    _supplied_amax: float | None = None  # quantize_with_amax: the producer's amax for both copies

    def quantize_with_amax(self, tensor: torch.Tensor, amax: Any) -> NVFP4Tensor:
        """TE's C++ ``NVFP4Quantizer::quantize_with_amax``: both copies' global amax is the one the producer
        computed (TE's activation kernels take it on their float32 results before rounding them to the
        output dtype), all-reduced when ``with_amax_reduction``; the block scales come from ``tensor``."""
        if self.row_scaled_nvfp4:
            raise RuntimeError("quantize_with_amax is not supported for row-scaled NVFP4 quantization.")
        saved, self._supplied_amax = self._supplied_amax, float(np.float32(amax))
        try:
            return self.quantize_impl(tensor)
        finally:
            self._supplied_amax = saved

    def _global_amax(self, x: torch.Tensor) -> float | None:
        """The global amax to cast ``x`` with: the supplied one, or the all-reduced one, else None
        (the quantizer takes ``max|x|`` itself)."""
        if self._supplied_amax is not None:
            a = torch.tensor([self._supplied_amax], dtype=torch.float32)
            return self._reduced(a) if self.with_amax_reduction else float(a[0])
        return self._reduced(x.abs().float().nan_to_num(0.0).amax()) if self.with_amax_reduction else None

    te_rng_generator: TEPhiloxGenerator | None = None  # set: TE's Philox SR bits; None: fp8sim's own SR
    te_sm_arch: int = 100  # the compute capability TE's RHT dispatch reads (sm_arch()): 100 = B200/GB200

    def _te_sr_copies(self, x: torch.Tensor) -> TESRCopies:
        """TE's SR bits (``fp8sim.scaling.nvfp4_te_sr``): one ``rng_state`` per cast from ``te_rng_generator``,
        as ``NVFP4Quantizer::quantize_impl`` takes it from torch's CUDA generator (offset += 1024); with RHT
        off the fused kernel (``te_sm_arch``, shape) a second one for the columnwise launch
        (``need_separate_columnwise_rng``)."""
        if self.row_scaled_nvfp4:
            raise NotImplementedError(
                "NVFP4Quantizer: TE's Philox SR bits are not modelled with row scaling "
                "(TE refuses SR with row-scaled NVFP4)"
            )
        m, k = x.shape
        fused = self.with_rht and te_rht_cast_fusion_eligible(str(x.dtype).replace("torch.", ""), m, k, self.te_sm_arch)
        if fused and self.with_2d_quantization:  # refused before TE would draw an rng_state
            raise NotImplementedError(
                "NVFP4Quantizer: TE's fused RHT cast writes 1x16 scales whatever with_2d_quantization says; "
                "fp8sim does not model 2D quantization with it"
            )
        amax = self._global_amax(x)
        state = self.te_rng_generator.philox_cuda_state(TE_RNG_ELTS_PER_THREAD)
        if not self.with_rht:
            return quantize_nvfp4_te_sr(
                x,
                *state,
                rowwise=self.rowwise_usage,
                columnwise=self.columnwise_usage,
                block_2d=self.with_2d_quantization,
                global_amax=amax,
            )
        # the unfused path launches the columnwise cast separately, with its own rng_state
        separate = self.columnwise_usage and not fused
        state_t = self.te_rng_generator.philox_cuda_state(TE_RNG_ELTS_PER_THREAD) if separate else None
        rht_xt = amax_t = None
        if self.columnwise_usage:  # nvte_hadamard_transform(x.T), stored in bf16; the RN path's transform
            xt = x.t().contiguous()
            rht_xt = apply_rht(xt) if self.with_random_sign_mask else _hadamard_bf16(xt)
            if self.with_amax_reduction:
                amax_t = self._reduced(rht_xt.abs().float().nan_to_num(0.0).amax())
        return quantize_nvfp4_te_sr_rht(
            x,
            rht_xt,
            state,
            state_t,
            fused=fused,
            rowwise=self.rowwise_usage,
            columnwise=self.columnwise_usage,
            block_2d=self.with_2d_quantization,
            global_amax=amax,
            global_amax_columnwise=amax_t,
        )

    def _per_row(self, scales: np.ndarray) -> np.ndarray:
        """16x16 tile scales written on every row of their tile (the 1-D layout; fp8sim's choice)."""
        return np.repeat(scales, _B, axis=0) if self.with_2d_quantization else scales

    def _reduced(self, amax: torch.Tensor) -> float:
        import torch.distributed as dist

        t = amax.reshape(1).clone()
        if dist.is_available() and dist.is_initialized() and dist.get_world_size(self.amax_reduction_group) > 1:
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.amax_reduction_group)
        return float(t.item())


def _hadamard_bf16(x: torch.Tensor) -> torch.Tensor:
    """``x.reshape(-1, 16) @ H/4`` in bf16 (TE ``get_rht_matrix(with_random_sign_mask=False)``: no signs),
    as :func:`fp8sim.scaling.nvfp4.apply_rht` computes the signed one."""
    h = torch.from_numpy(rht_matrix() * np.asarray(RHT_SIGNS, np.float32)[:, None]).to(torch.bfloat16)
    return (x.contiguous().reshape(-1, _B) @ h).reshape(x.shape)


class NVFP4Tensor(NVFP4TensorStorage, BlockScaledTensor):
    """NVFP4 data: packed ``_rowwise_data`` / ``_columnwise_data``, uint8 E4M3
    ``_rowwise_scale_inv`` / ``_columnwise_scale_inv``, float32 ``_amax_rowwise`` /
    ``_amax_columnwise``, ``_fp4_dtype``."""

    _extra_fields = (
        "amax_rowwise",
        "amax_columnwise",
        "with_2d_quantization",
        "nvfp4_use_4over6",
        "nvfp4_e4m3_max",
        "row_scaled_nvfp4",
    )
    _saved_fields = (*BlockScaledTensor._saved_fields, "_amax_rowwise", "_amax_columnwise")
    data = data_property("update")  # TE: assigning .data quantizes into this tensor
    fsdp_pre_all_gather = _fsdp2_nvfp4.fsdp_pre_all_gather
    fsdp_post_all_gather = _fsdp2_nvfp4.fsdp_post_all_gather

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        """The FSDP2 ops (``_fsdp2_nvfp4``); the rest run on the dequantized values."""
        kwargs = kwargs or {}
        out = _fsdp2_nvfp4.dispatch(func, args, kwargs)
        if out is not NotImplemented:
            return out
        return super().__torch_dispatch__(func, types, args, kwargs)

    def _init(self, **kwargs: Any) -> None:
        """TE ``NVFP4TensorStorage.__new__``: ``_nvfp4_e4m3_max`` is 448 unless the tensor is 4over6."""
        super()._init(**kwargs)
        self._nvfp4_use_4over6 = bool(self._nvfp4_use_4over6)
        if self._row_scaled_nvfp4 is None:  # TE's default False; a row-scaled tensor has one amax per row
            self._row_scaled_nvfp4 = self._amax_rowwise is not None and self._amax_rowwise.numel() > 1
        self._row_scaled_nvfp4 = bool(self._row_scaled_nvfp4)
        self._nvfp4_e4m3_max = (self._nvfp4_e4m3_max or 448) if self._nvfp4_use_4over6 else 448

    def _create_columnwise(self) -> None:
        """TE ``storage/nvfp4_tensor_storage.py`` ``_create_columnwise`` (2D quantization only): the E2M1
        codes transposed (nibbles repacked), each 16x16 tile's scale written on the rows of the transposed
        tile, ``_amax_columnwise`` the rowwise amax."""
        if self._quantizer is None or not self._quantizer.with_2d_quantization:
            raise RuntimeError("Cannot create columnwise data without 2D quantization enabled.")
        m, k = flatten_2d(self.shape)
        codes = unpack_fp4(self._rowwise_data.reshape(m, k // 2).cpu())
        self._columnwise_data = pack_fp4(codes.t().contiguous()).to(self._rowwise_data.device)
        tiles = self._rowwise_scale_inv[: round_up(m, _B) : _B, : -(-k // _B)]  # one row per tile row
        cs = torch.zeros(self._quantizer.get_scale_shape(tuple(self.shape), True), dtype=torch.uint8)
        cs[: -(-k // _B) * _B, : tiles.shape[0]] = tiles.t().repeat_interleave(_B, dim=0)
        self._columnwise_scale_inv = cs.to(self._rowwise_scale_inv.device)
        self._amax_columnwise = self._amax_rowwise.clone()

    def _build_default_quantizer(self) -> NVFP4Quantizer:
        """TE ``nvfp4_tensor.py`` ``_get_quantizer``: a default ``NVFP4Quantizer()``."""
        return NVFP4Quantizer()

    def _view_refusal(self, shape: tuple[int, ...], view: bool) -> tuple[type | None, str] | None:
        """TE (``nvfp4_tensor.py`` ``_ViewFunc``): the last dim must stay, else a warning and the
        dequantized values."""
        if shape[-1] == self.shape[-1]:
            return None
        return None, (
            "NVFP4Tensor does not support reshaping inner dimension "
            f"(attempted to reshape dims={tuple(self.shape)} to {shape}). {_FSDP_NOTE}"
        )

    def _data_shape(self, shape: tuple[int, ...], columnwise: bool) -> tuple[int, ...]:
        """Packed bytes: rowwise ``(..., K / 2)``, columnwise 2-D ``(K, M / 2)``."""
        if columnwise:
            return (shape[-1], math.prod(shape[:-1]) // 2)
        return (*shape[:-1], shape[-1] // 2)

    _dtype_field = "fp4_dtype"

    def _copy(self, data: torch.Tensor, scale: torch.Tensor, amax: torch.Tensor, rows: int, cols: int) -> np.ndarray:
        codes = unpack_fp4(data.reshape(rows, cols // 2).cpu()).numpy()
        if self._nvfp4_use_4over6 and self._nvfp4_e4m3_max == 256:  # TE's kernel with E4M3_MAX = 256
            per_row = scale[:rows, : cols // _B].cpu().numpy()  # 16x16 tile scales sit on every row
            return dequantize_nvfp4_te(codes, per_row, amax.cpu().numpy(), 256)
        tiles = bool(self._with_2d_quantization)
        block = (_B, _B) if tiles else (1, _B)
        # the 2-D tile scale is repeated on each row of its tile in TE's (rows, cols/16) layout
        scales = scale[:rows, : -(-cols // _B)].cpu().numpy()
        if tiles:
            scales = scales[::_B]
        a = amax.cpu().numpy().astype(np.float32)
        qt = _SimQT(codes, scales, _E2M1, block, (rows, cols), "float32", scale_format=_E4M3, global_scale=1.0)
        return dequantize_nvfp4(qt, "te", global_amax=a if a.size > 1 else float(a.reshape(-1)[0]))

    def _dequantize_rowwise(self) -> torch.Tensor:
        m, k = flatten_2d(self.shape)
        out = self._copy(self._rowwise_data, self._rowwise_scale_inv, self._amax_rowwise, m, k)
        return torch.from_numpy(out).reshape(self.shape)

    def _dequantize_columnwise(self) -> torch.Tensor:
        m, k = flatten_2d(self.shape)
        out = self._copy(self._columnwise_data, self._columnwise_scale_inv, self._amax_columnwise, k, m)
        return torch.from_numpy(np.ascontiguousarray(out.T)).reshape(self.shape)
