"""TE's NVFP4 cast with stochastic rounding, bit for bit given TE's ``rng_state`` ``(seed, offset)``, on the
kernels TE uses for 1x16 and 16x16 casts and on its unfused RHT path; the word maps are
:mod:`fp8sim.cast.te_nvfp4_sr`, the kernel choice :func:`te_sr_kernel`.

The scales are those of the round-to-nearest cast (rounding does not enter them); each element is
``fl32(x * fl32(1 / fl32(s_blk * s_dec)))`` (``ComputeEncodeScaleFP4`` / ``compute_nvfp4_scaling_coefficient``)
rounded by ``cvt.rs.satfinite.e2m1x4.f32`` (:func:`fp8sim.cast.ptx_sr.encode_ptx_rs`) with the word TE's
thread draws.  Rowwise and columnwise copies come from one launch, so they share each thread's stream.
TE's fast-math build option (``NVTE_USE_FAST_MATH``: a bfloat16 coefficient) is not modelled.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .._util.args import as_int
from .._util.tensors import is_torch_tensor
from ..cast import decode
from ..cast.ptx_sr import encode_ptx_rs
from ..cast.te_nvfp4_sr import te_nvfp4_sr_words
from ..formats import E2M1, E4M3
from .nvfp4 import quantize_nvfp4
from .quantized import QuantizedData, expand_blocks

__all__ = [
    "TEPhiloxGenerator",
    "TESRCopies",
    "te_sr_kernel",
    "quantize_nvfp4_te_sr",
    "te_rht_cast_fusion_eligible",
    "quantize_nvfp4_te_sr_rht",
]

TE_RNG_ELTS_PER_THREAD = 1024  # quantizer.cpp: the offset increment TE asks the generator for per cast

_F32 = np.float32
_FLT_MAX = _F32(np.finfo(np.float32).max)


class TEPhiloxGenerator:
    """The ``(seed, offset)`` source TE reads from torch's CUDA generator: ``philox_cuda_state(n)`` returns
    the current ``(seed, offset)`` and advances the offset by ``n`` rounded up to a multiple of 4
    (ATen ``CUDAGeneratorImpl::philox_cuda_state``).  Give the seed and offset of
    ``torch.cuda.default_generators[device]`` (``initial_seed()``, ``get_offset()``) to follow a GPU run."""

    def __init__(self, seed: int, offset: int = 0) -> None:
        for name, v in (("seed", seed), ("offset", offset)):
            as_int(v, name, lo=0, hi=2**64 - 1)
        self.seed, self.offset = int(seed), int(offset)

    def philox_cuda_state(self, increment: int) -> tuple[int, int]:
        state = (self.seed, self.offset)
        self.offset += ((int(increment) + 3) // 4) * 4
        return state


class TESRCopies(NamedTuple):
    """The copies one TE launch writes: rowwise ``(M, K)`` and columnwise ``(K, M)``; None if not asked."""

    rowwise: QuantizedData | None
    columnwise: QuantizedData | None


def te_sr_kernel(dtype: str, rows: int, cols: int, rowwise: bool, block_2d: bool) -> str:
    """The kernel TE's dispatch picks for a 1x16 or 16x16 cast (``common/cast/dispatch/quantize.cuh``:
    ``use_optimized_kernel`` is bfloat16 with ``rows % 32 == cols % 32 == 0`` and a rowwise output or 2-D
    tiles; ``quantize_transpose`` sends its 1-D bfloat16 casts to the tuned kernel, its 16x16 ones to
    ``quantize_transpose_nvfp4_2D_kernel``): a name of :data:`fp8sim.cast.te_nvfp4_sr.TE_SR_KERNELS`."""
    optimized = dtype == "bfloat16" and rows % 32 == 0 and cols % 32 == 0 and (rowwise or block_2d)
    if not optimized:
        return "vector_blockwise"
    return "nvfp4_2d" if block_2d else "tuned_1d"


def _recode(q: QuantizedData, x32: np.ndarray, words: np.ndarray) -> QuantizedData:
    s_dec = _F32(q.global_scale)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        enc = np.fmin(_F32(1) / (decode(q.scales, E4M3) * s_dec), _FLT_MAX)
        v = x32 * expand_blocks(enc, q.block)
    codes = encode_ptx_rs(v.astype(np.float32), E2M1, words)
    return QuantizedData(
        codes,
        q.scales,
        E2M1,
        q.block,
        q.shape,
        q.dtype,
        scale_format=E4M3,
        global_scale=q.global_scale,
        global_amax=q.global_amax,
    )


def quantize_nvfp4_te_sr(
    x: Any,
    seed: int,
    offset: int,
    *,
    rowwise: bool = True,
    columnwise: bool = True,
    block_2d: bool = False,
    global_amax: Any = None,
    rounds: int = 10,
) -> TESRCopies:
    """One TE NVFP4 stochastic-rounding cast of the 2-D ``x`` (``(M, K)``, float32/bfloat16/float16 numpy or
    torch) with ``rng_state = (seed, offset)``.  ``global_amax``: the amax both copies use (TE computes one
    amax and copies it to both); default ``max |x|``."""
    if len(x.shape) != 2:
        raise ValueError(f"x must be 2-D (M, K), the flattened view TE quantizes; got shape {tuple(x.shape)}")
    m, k = (int(n) for n in x.shape)
    name = str(x.dtype).replace("torch.", "")
    kernel = te_sr_kernel(name, m, k, rowwise, block_2d)
    row_words, col_words = te_nvfp4_sr_words(
        m, k, seed, offset, rowwise=rowwise, columnwise=columnwise, kernel=kernel, rounds=rounds
    )
    if is_torch_tensor(x):
        x32 = x.detach().to("cpu").float().numpy()
        xt = x.detach().to("cpu").t().contiguous()
    else:
        x32 = np.asarray(x).astype(np.float32)
        xt = np.ascontiguousarray(np.asarray(x).T)
    if global_amax is None:
        global_amax = np.fmax.reduce(np.abs(x32).reshape(-1), initial=_F32(0))
    qr = qc = None
    if rowwise:
        q = quantize_nvfp4(x, flavor="te", block_2d=block_2d, global_amax=global_amax)
        qr = _recode(q, x32, row_words)
    if columnwise:
        q = quantize_nvfp4(xt, flavor="te", block_2d=block_2d, global_amax=global_amax)
        qc = _recode(q, np.ascontiguousarray(x32.T), col_words)
    return TESRCopies(qr, qc)


TE_RHT_FUSION_SM_ARCHS = (100, 110)  # quantizer.cpp is_eligible_for_rht_cast_fusion: sm_arch in [100, 110]


def te_rht_cast_fusion_eligible(dtype: str, rows: int, cols: int, sm_arch: int) -> bool:
    """Whether TE sends an RHT cast to the fused kernel ``nvte_quantize_with_hadamard_transform``
    (``pytorch/csrc/quantizer.cpp``: bfloat16, ``rows % 64 == 0``, ``cols % 128 == 0`` and
    ``100 <= sm_arch <= 110``); otherwise to the unfused path (:func:`quantize_nvfp4_te_sr_rht`)."""
    lo, hi = TE_RHT_FUSION_SM_ARCHS
    return dtype == "bfloat16" and rows % 64 == 0 and cols % 128 == 0 and lo <= int(sm_arch) <= hi


def _cast_with_words(x: Any, words: np.ndarray, global_amax: Any) -> QuantizedData:
    """The 1x16 round-to-nearest scales of the 2-D ``x`` and its values rounded with ``words`` (one per 4)."""
    x32 = x.detach().to("cpu").float().numpy() if is_torch_tensor(x) else np.asarray(x).astype(np.float32)
    if global_amax is None:
        global_amax = np.fmax.reduce(np.abs(x32).reshape(-1), initial=_F32(0))
    return _recode(quantize_nvfp4(x, flavor="te", global_amax=global_amax), x32, words)


def quantize_nvfp4_te_sr_rht(
    x: Any,
    rht_xt: Any,
    rng_state: tuple[int, int],
    rng_state_columnwise: tuple[int, int] | None = None,
    *,
    fused: bool = False,
    rowwise: bool = True,
    columnwise: bool = True,
    block_2d: bool = False,
    global_amax: Any = None,
    global_amax_columnwise: Any = None,
    rounds: int = 10,
) -> TESRCopies:
    """TE's RHT cast with stochastic rounding: the rowwise copy of ``x`` (``(M, K)``) and the columnwise copy of
    ``rht_xt`` (``(K, M)``: ``RHT(x.T)`` in bfloat16, as TE rounds it on both paths: the unfused
    ``nvte_hadamard_transform`` stores bf16, the fused kernel downcasts its float32 accumulators to bf16 "for
    bit-wise compatibility with unfused kernels" unless ``NVTE_USE_FAST_MATH``).

    ``fused=False`` (``quantizer.cpp`` ``quantize_with_rht_unfused_helper``): a rowwise-only ``nvte_quantize_v2``
    of ``x`` with ``rng_state`` and one of ``rht_xt`` with ``rng_state_columnwise`` (TE's second draw,
    ``need_separate_columnwise_rng``), each on the 1x16 or 16x16 kernel the shape picks (:func:`te_sr_kernel`).
    ``fused=True`` (``nvte_quantize_with_hadamard_transform``, :func:`te_rht_cast_fusion_eligible`): one launch,
    one ``rng_state``, the ``"rht_cast_fusion"`` word map, 1x16 scales (the fused kernel has no 2-D mode:
    refused).  ``global_amax_columnwise``: the post-RHT amax, default ``max |rht_xt|``."""
    if not (rowwise or columnwise):
        raise ValueError("at least one of rowwise or columnwise must be True")
    if columnwise and rht_xt is None:
        raise ValueError("rht_xt (RHT(x.T), shape (K, M)) is required for the columnwise copy")
    if fused:
        if block_2d:
            raise NotImplementedError(
                "TE's fused RHT cast (row_cast_col_hadamard_transform_cast_fusion.cu) reads no 2-D quantization "
                "flag and writes 1x16 scales; fp8sim does not model 16x16 tiles with it"
            )
        m, k = (int(n) for n in x.shape)
        rw, cw = te_nvfp4_sr_words(
            m, k, *rng_state, rowwise=rowwise, columnwise=columnwise, kernel="rht_cast_fusion", rounds=rounds
        )
        return TESRCopies(
            _cast_with_words(x, rw, global_amax) if rowwise else None,
            _cast_with_words(rht_xt, cw, global_amax_columnwise) if columnwise else None,
        )
    qr = qc = None
    if rowwise:
        qr = quantize_nvfp4_te_sr(
            x, *rng_state, rowwise=True, columnwise=False, block_2d=block_2d, global_amax=global_amax, rounds=rounds
        ).rowwise
    if columnwise:
        if rng_state_columnwise is None:
            raise ValueError("rng_state_columnwise is required for the columnwise copy (TE draws a second state)")
        qc = quantize_nvfp4_te_sr(
            rht_xt,
            *rng_state_columnwise,
            rowwise=True,
            columnwise=False,
            block_2d=block_2d,
            global_amax=global_amax_columnwise,
            rounds=rounds,
        ).rowwise
    return TESRCopies(qr, qc)
