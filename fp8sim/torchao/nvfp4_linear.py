"""NVFP4 linear training as torchao 0.18 defines it (``torchao/prototype/moe_training/nvfp4_training/``:
``nvfp4_training.py`` config and module, ``nvfp4_linear.py`` autograd function, ``hadamard_*_triton.py`` and
``quantize_2d_triton.py`` kernels), emulated.  torchao runs it only as Triton kernels on SM100; fp8sim
re-derives the arithmetic from that source.  Needs torch.

The three GEMMs (bf16 operands; M tokens, K in, N out; all multiples of 128)::

    output      = x_row  [M,K] 1x16 along K, RN      @ W   [N,K] 16x16 tiles, RN
    grad_input  = dy_row [M,N] 1x16 along N, SR      @ W.t [K,N] the same tiles transposed
    grad_weight = RHT(dy.t()) [N,M] along M, SR      @ RHT(x.t()) [K,M] along M, RN

Each NVFP4 cast (``hadamard_utils._nvfp4_quantize``, float32 arithmetic): per-tensor
``enc = min(2688 / amax, FLT_MAX)`` (1 where amax is 0 or the quotient is 0), ``dec = 1 / enc``; per
block ``s = e4m3(clamp((bmax / 6) * enc, 2^-6, 448))``; elements ``clamp(x * min(1 / (s * dec), FLT_MAX),
-6, 6)`` to E2M1, round-to-nearest-even (``cvt.rn.satfinite.e2m1x2``) or stochastic (``cvt.rs.satfinite.
e2m1x4``, :mod:`fp8sim.cast.ptx_sr`).  amax: ``max|x|`` for the rowwise copy, ``max|RHT(x.t())|`` for the
columnwise one, the weight's ``max|W|``.  RHT: 16 consecutive tokens of each column times the bf16 matrix
``diag(sign_vector) @ H16 / 4`` (``tl.dot``, float32 result rounded to bf16); fp8sim takes the float32
result as the exact sum rounded once (not measured).  The GEMM (``F.scaled_mm`` with 1x16 UE4M3 block scales
and per-tensor scales ``amax / 2688``): :func:`fp8sim.gemm.scaled_mm` in float32 (``accumulator``, default
``"blackwell"``), times ``fl32(gs_a * gs_b)``, to bf16; ``+ bias``; grad_bias ``dy.sum(0)``.

Stochastic rounding, as ``hadamard_utils._pack_fp4`` draws it: each packed byte (element pair) at row ``r``,
pair column ``c`` of tile ``t`` of a ``(rows, cols)`` tile gets ``tl.randint(seed, (t * rows * cols / 2 +
r * cols / 2 + c) << 32 | offset_lo32)``, Triton's Philox4x64-10 (64-bit offsets select it; key ``(seed,
0)``, counter ``(offset, 0, 0, 0)``, first word), of which the ``cvt.rs`` register takes the low 32 bits;
a group of 8 elements (4 pairs, one ``pack=4`` asm call) uses the words of its first two pairs, one per
``e2m1x4``.  Tiles: ``sr_tile=(BLOCK_M, BLOCK_N)`` of the fused row/col kernel (its autotuner picks 128 or
256 each on the GPU; fp8sim's default is (128, 128)), numbered by ``_compute_pid`` (``GROUP_SIZE_N = 8``).
Seeds: the module's ``_sr_seed`` (columnwise) and ``_sr_seed ^ 1`` (rowwise); offsets: two
``torch.randint(0, 2**32, (1,))`` on the default generator of the gradient's device per backward (rowwise
first), as torchao draws them.  The register truncation and the element order inside a ``pack=4`` group are
inferred from the source, not measured.  Divisions are IEEE float32 here; Triton lowers the kernels' ``/``
to the approximate ``div.full.f32``, so on a GPU an element at an E2M1 rounding boundary can land one step
away (not modelled).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from .._util.args import as_int
from ..cast import decode, encode
from ..cast.ptx_sr import encode_ptx_rs
from ..formats import E2M1, E4M3
from ..gemm import scaled_mm
from ..gemm._exact import exact_matmul_f32
from ..scaling.quantized import QuantizedData
from ._double_backward import warn_graphless
from .float8_linear_utils import swap_linear_layers
from .mx_linear import KernelPreference

__all__ = ["NVFP4TrainingConfig", "NVFP4Linear", "nvfp4_linear", "convert_to_nvfp4_training", "philox4x64"]

_F32 = np.float32
_FLT_MAX = _F32(np.finfo(np.float32).max)
_U64 = np.uint64
_M32 = _U64(0xFFFFFFFF)
_PHILOX64_M = (_U64(0xD2E7470EE14C6C93), _U64(0xCA5A826395121157))
_PHILOX64_W = (_U64(0x9E3779B97F4A7C15), _U64(0xBB67AE8584CAA73B))
_GROUP_SIZE_N = 8
_H16 = np.array([[1.0]], dtype=np.float64)
while _H16.shape[0] < 16:
    _H16 = np.block([[_H16, _H16], [_H16, -_H16]])


# -- Triton's Philox4x64-10 ------------------------------------------------------------------------------


def _umulhi64(a: np.ndarray, b: np.uint64) -> np.ndarray:
    a_lo, a_hi = a & _M32, a >> _U64(32)
    b_lo, b_hi = b & _M32, b >> _U64(32)
    lo_lo, hi_lo, lo_hi = a_lo * b_lo, a_hi * b_lo, a_lo * b_hi
    cross = (lo_lo >> _U64(32)) + (hi_lo & _M32) + (lo_hi & _M32)
    return a_hi * b_hi + (hi_lo >> _U64(32)) + (lo_hi >> _U64(32)) + (cross >> _U64(32))


def philox4x64(counter: np.ndarray, key: tuple[int, int], rounds: int = 10) -> np.ndarray:
    """Philox4x64 as Triton's ``philox_impl`` for uint64 state: ``counter`` (..., 4) uint64, ``key`` two
    uint64; returns (..., 4) uint64 (Triton's ``randint`` keeps word 0)."""
    c = np.asarray(counter, dtype=_U64)
    c0, c1, c2, c3 = (c[..., i].copy() for i in range(4))
    k0, k1 = _U64(key[0] & 0xFFFFFFFFFFFFFFFF), _U64(key[1] & 0xFFFFFFFFFFFFFFFF)
    with np.errstate(over="ignore"):
        for _ in range(rounds):
            a, b = _PHILOX64_M
            n0 = _umulhi64(c2, b) ^ c1 ^ k0
            n2 = _umulhi64(c0, a) ^ c3 ^ k1
            c1, c3 = b * c2, a * c0
            c0, c2 = n0, n2
            k0, k1 = k0 + _PHILOX64_W[0], k1 + _PHILOX64_W[1]
    return np.stack([c0, c1, c2, c3], axis=-1)


def _tile_ids(rows: int, cols: int, bm: int, bn: int) -> np.ndarray:
    """Tile id of each (pid_m, pid_n) tile of an (rows, cols) tensor under torchao's ``_compute_pid``."""
    pm, pn = -(-rows // bm), -(-cols // bn)
    ids = np.empty((pm, pn), dtype=np.int64)
    in_group = _GROUP_SIZE_N * pm
    for t in range(pm * pn):
        first = (t // in_group) * _GROUP_SIZE_N
        size = min(pn - first, _GROUP_SIZE_N)
        ids[(t % in_group) // size, first + t % size] = t
    return ids


def _sr_words(
    shape: tuple[int, int], tile: tuple[int, int], tile_ids: np.ndarray, seed: int, offset: int
) -> np.ndarray:
    """One uint32 word per group of four elements of a (rows, cols) quantized copy whose tiles are
    ``tile`` = (tile rows, tile cols); ``tile_ids[i, j]`` numbers the tile at block row i, block col j."""
    rows, cols = shape
    tr, tc = tile
    r = np.arange(rows)[:, None]
    c = np.arange(cols // 2)[None, :]  # pair column
    t = tile_ids[r // tr, c // (tc // 2)].astype(_U64)
    lin = t * _U64(tr * tc // 2) + (r % tr).astype(_U64) * _U64(tc // 2) + (c % (tc // 2)).astype(_U64)
    off = (lin << _U64(32)) | (_U64(offset & 0xFFFFFFFF))
    ctr = np.zeros((*off.shape, 4), dtype=_U64)
    ctr[..., 0] = off
    words = (philox4x64(ctr, (seed & 0xFFFFFFFFFFFFFFFF, 0))[..., 0] & _M32).astype(np.uint32)
    # groups of 4 elements = pairs (2g, 2g+1); a pack of 4 pairs uses the words of its pairs 0 and 1
    g = np.arange(cols // 4)
    return words[:, 4 * (g // 2) + g % 2]


# -- the NVFP4 casts ----------------------------------------------------------------------------------


def _global_scales(amax: np.float32) -> tuple[np.float32, np.float32]:
    with np.errstate(divide="ignore", over="ignore"):
        safe = _F32(1) if amax == 0 else amax
        cand = np.minimum(_F32(2688) / safe, _FLT_MAX)
    enc = _F32(1) if (amax == 0 or cand == 0) else _F32(cand)
    return enc, _F32(_F32(1) / enc)


def _quantize(
    x: np.ndarray, amax: np.float32, block: tuple[int, int], words: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """float32 ``x`` (R, C) -> E2M1 codes (R, C), UE4M3 scale codes (R, C/16); ``block`` is (1, 16) or
    (16, 16) (then every row of a block repeats its scale, as torchao's ``expand_sf``)."""
    br, bc = block
    rows, cols = x.shape
    enc, dec = _global_scales(amax)
    mag = np.abs(x).reshape(rows // br, br, cols // bc, bc)
    bmax = mag.max(axis=(1, 3), keepdims=True)
    pv = np.clip((bmax / _F32(6)).astype(_F32) * enc, _F32(2.0**-6), _F32(448)).astype(_F32)
    s_codes = encode(pv, E4M3, saturate=True)
    with np.errstate(divide="ignore", over="ignore"):
        es = np.minimum(_F32(1) / (decode(s_codes, E4M3) * dec).astype(_F32), _FLT_MAX).astype(_F32)
    v = np.clip((x.reshape(mag.shape) * es).astype(_F32), _F32(-6), _F32(6)).reshape(rows, cols)
    codes = encode(v, E2M1, saturate=True) if words is None else encode_ptx_rs(v, "e2m1", words).reshape(rows, cols)
    s = np.broadcast_to(s_codes, (rows // br, br, cols // bc, 1)).reshape(rows, cols // bc)
    return codes, np.ascontiguousarray(s)


def _bf16_np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float32).cpu().numpy()


def _rht_t(a: np.ndarray, signs: tuple[int, ...]) -> np.ndarray:
    """``RHT(a.t())``: (N, M) float32 values of bf16, 16 consecutive rows of ``a`` per Hadamard block."""
    m, n = a.shape
    mat = np.asarray(signs, dtype=np.float64)[:, None] * _H16 * 0.25
    # the exact sum rounded once to float32 (bf16 entries: 8 significant bits; the matrix: +-1/4)
    f32 = exact_matmul_f32(a.T.astype(np.float64).reshape(n * m // 16, 16), mat, 7, 0)
    return torch.from_numpy(np.ascontiguousarray(f32).reshape(n, m)).to(torch.bfloat16).float().numpy()


def _record(codes: np.ndarray, scales: np.ndarray, amax: np.float32) -> QuantizedData:
    """One NVFP4 copy as fp8sim's record: E2M1 codes (R, C), UE4M3 scale codes per 1x16 block (a 16x16
    tile's scale repeated on each of its rows, torchao's layout), the per-tensor scale ``1 / enc`` and the
    amax it came from."""
    _, dec = _global_scales(amax)
    return QuantizedData(
        codes, scales, E2M1, (1, 16), codes.shape, "bfloat16", scale_format=E4M3, global_scale=dec, global_amax=amax
    )


def _amax(x: np.ndarray) -> np.float32:
    return _F32(np.max(np.abs(x), initial=_F32(0)))


def _rowwise(x: np.ndarray, words: np.ndarray | None) -> QuantizedData:
    amax = _amax(x)
    return _record(*_quantize(x, amax, (1, 16), words), amax)


def _mm(a: QuantizedData, b: QuantizedData, out_shape: tuple[int, ...], acc: Any) -> torch.Tensor:
    """``a @ b.t()`` of two NVFP4 copies blocked along their common last dim, bf16 out (module docstring)."""
    raw = scaled_mm(
        a.codes, np.ascontiguousarray(b.codes.T), a.scales, np.ascontiguousarray(b.scales.T),
        out_dtype="float32", accumulator=acc, a_format="e2m1", b_format="e2m1", strict=False,
    )  # fmt: skip
    alpha = _F32((a.global_amax / _F32(2688)) * (b.global_amax / _F32(2688)))
    with np.errstate(over="ignore", invalid="ignore"):
        out = (np.asarray(raw, dtype=_F32) * alpha).astype(_F32)
    return torch.from_numpy(out).to(torch.bfloat16).reshape(out_shape)


def _check_dims(m: int, k: int, n: int) -> None:
    if m % 128 or k % 128 or n % 128:
        raise ValueError(f"nvfp4_mm_triton requires M, K, N all divisible by 128; got M={m}, K={k}, N={n}")


class _NVFP4MM(torch.autograd.Function):
    """torchao's ``nvfp4_mm_triton`` (module docstring)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, bias: Any, seed: int, signs: tuple, tile: tuple, acc: Any):  # type: ignore[override]
        k, n = x.shape[-1], w.shape[0]
        x2 = x.to(torch.bfloat16).reshape(-1, k)
        _check_dims(x2.shape[0], k, n)
        xa, wa = _bf16_np(x2), _bf16_np(w.to(torch.bfloat16))
        w_amax = _amax(wa)
        wq = _record(*_quantize(wa, w_amax, (16, 16), None), w_amax)
        out = _mm(_rowwise(xa, None), wq, (*x.shape[:-1], n), acc)
        if bias is not None:
            out = out + bias
        xc = _rht_t(xa, signs)
        ctx.xcol = _rowwise(xc, None)
        ctx.wt = _record(*_quantize(np.ascontiguousarray(wa.T), w_amax, (16, 16), None), w_amax)  # torchao's a_t copy
        ctx.meta = (x.shape, bias is not None, seed, signs, tile, acc)
        return out

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
        shape, has_bias, seed, signs, tile, acc = ctx.meta
        warn_graphless("NVFP4 GEMMs (nvfp4_mm_triton)")
        dy = grad_output.contiguous()
        dy2 = dy.reshape(-1, dy.shape[-1])
        dev = dy.device
        off_row = int(torch.randint(0, 2**32, (1,), dtype=torch.int64, device=dev))
        off_col = int(torch.randint(0, 2**32, (1,), dtype=torch.int64, device=dev))
        m, n = dy2.shape
        bm, bn = tile
        ids = _tile_ids(m, n, bm, bn)
        d = _bf16_np(dy2.to(torch.bfloat16))
        dy_row = _rowwise(d, _sr_words((m, n), (bm, bn), ids, seed ^ 1, off_row))
        dc = _rht_t(d, signs)
        dy_col = _rowwise(dc, _sr_words((n, m), (bn, bm), ids.T, seed, off_col))
        grad_input = _mm(dy_row, ctx.wt, shape, acc)
        grad_weight = _mm(dy_col, ctx.xcol, (n, ctx.xcol.codes.shape[0]), acc)
        grad_bias = dy.sum(dim=tuple(range(dy.dim() - 1))) if has_bias else None
        return grad_input, grad_weight, grad_bias, None, None, None, None


def _signs(v: Any) -> tuple[int, ...]:
    t = tuple(int(s) for s in (v.detach().cpu().tolist() if isinstance(v, torch.Tensor) else v))
    if len(t) != 16 or any(s not in (-1, 1) for s in t):
        raise ValueError(f"rht_sign_vector must have 16 elements, each -1 or 1; got {t}")
    return t


def nvfp4_linear(
    input_hp: torch.Tensor,
    weight_hp: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    sign_vector: tuple[int, ...] | list[int],
    kernel_preference: KernelPreference = KernelPreference.TRITON,
    sr_seed: torch.Tensor | None = None,
    sr_tile: tuple[int, int] = (128, 128),
    accumulator: Any = "blackwell",
) -> torch.Tensor:
    """torchao's ``nvfp4_linear``: ``input @ weight.t() + bias`` with all three GEMMs in NVFP4 (module
    docstring); ``sr_tile`` and ``accumulator`` are fp8sim's (the GPU's autotuned tile and MMA)."""
    if KernelPreference(kernel_preference) != KernelPreference.TRITON:
        raise ValueError("NVFP4 training linear only supports kernel_preference=KernelPreference.TRITON")
    if tuple(sr_tile) not in {(a, b) for a in (128, 256) for b in (128, 256)}:
        raise ValueError(f"sr_tile must be (BLOCK_M, BLOCK_N) with each 128 or 256 (torchao's configs); got {sr_tile}")
    if sr_seed is None:
        sr_seed = torch.randint(-(2**63), 2**63 - 1, (1,), dtype=torch.int64, device=input_hp.device)
    if input_hp.dim() == 0:
        raise RuntimeError("both arguments to linear need to be at least 1D, but they are 0D and 2D")
    seed = int(sr_seed.reshape(-1)[0]) & 0xFFFFFFFFFFFFFFFF
    return _NVFP4MM.apply(input_hp, weight_hp, bias, seed, _signs(sign_vector), tuple(sr_tile), accumulator)


@dataclass
class NVFP4TrainingConfig:
    """torchao's ``NVFP4TrainingConfig`` fields and defaults (``process_group``/``world_size``, torchao's
    tensor-parallel path, are accepted; a process group is refused as not emulated)."""

    kernel_preference: KernelPreference = KernelPreference.TRITON
    process_group: Any | None = field(default=None, compare=False)
    world_size: int | None = None
    rht_sign_vector: Any | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        self.kernel_preference = KernelPreference(self.kernel_preference)
        if self.kernel_preference != KernelPreference.TRITON:
            raise ValueError("NVFP4 training linear only supports kernel_preference=KernelPreference.TRITON")
        if self.process_group is not None:
            raise NotImplementedError("the NVFP4 tensor-parallel path (process_group=) is not emulated")


def _make_sign_vector(v: Any, device: Any) -> torch.Tensor:
    """torchao's ``_make_rht_sign_vector``: the given 16 signs, or ``get_wgrad_sign_vector`` (one
    ``torch.rand(16) >= 0.5`` draw)."""
    if v is None:
        r = torch.rand(16, device=device)
        return torch.where(
            r >= 0.5, torch.ones(16, dtype=torch.int8, device=device), -torch.ones(16, dtype=torch.int8, device=device)
        )
    return torch.tensor(_signs(v), dtype=torch.int8, device=device)


class NVFP4Linear(nn.Linear):
    """torchao's ``NVFP4Linear`` (``bias=False`` by default, buffers ``_sr_seed`` and ``_rht_sign_vector``
    drawn in torchao's order, so a seeded construction matches torchao's); fp8sim adds ``sr_tile`` and
    ``accumulator`` (module docstring)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        kernel_preference: KernelPreference = KernelPreference.TRITON,
        process_group: Any = None,
        world_size: int | None = None,
        device: Any = None,
        dtype: Any = None,
        rht_sign_vector: Any = None,
        *,
        sr_tile: tuple[int, int] = (128, 128),
        accumulator: Any = "blackwell",
    ) -> None:
        cfg = NVFP4TrainingConfig(kernel_preference, process_group, world_size)
        in_features, out_features = as_int(in_features, "in_features", lo=1), as_int(out_features, "out_features", lo=1)
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.kernel_preference = cfg.kernel_preference
        self.process_group, self.world_size = None, world_size
        self.sr_tile, self.accumulator = tuple(sr_tile), accumulator
        self.register_buffer("_sr_seed", torch.randint(-(2**63), 2**63 - 1, (1,), dtype=torch.int64, device=device))
        self.register_buffer("_rht_sign_vector", _make_sign_vector(rht_sign_vector, device), persistent=True)

    @property
    def rht_sign_vector(self) -> tuple[int, ...]:
        return _signs(self._rht_sign_vector)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nvfp4_linear(
            x, self.weight, self.bias, sign_vector=self.rht_sign_vector, kernel_preference=self.kernel_preference,
            sr_seed=self._sr_seed, sr_tile=self.sr_tile, accumulator=self.accumulator,
        )  # fmt: skip

    @classmethod
    def from_linear(
        cls, mod: nn.Linear, kernel_preference: KernelPreference = KernelPreference.TRITON, process_group: Any = None,
        world_size: int | None = None, rht_sign_vector: Any = None, **kw: Any,
    ) -> NVFP4Linear:  # fmt: skip
        """torchao's ``from_linear``: a new module sharing ``mod``'s weight and bias Parameters."""
        if rht_sign_vector is None:
            rht_sign_vector = getattr(mod, "_rht_sign_vector", None)
        new = cls(
            mod.in_features, mod.out_features, mod.bias is not None, kernel_preference, process_group, world_size,
            device=mod.weight.device, dtype=mod.weight.dtype, rht_sign_vector=rht_sign_vector, **kw,
        )  # fmt: skip
        new.weight = mod.weight
        if mod.bias is not None:
            new.bias = mod.bias
        return new


# The numpy casts cannot be traced: under torch.compile the forward runs eagerly behind a graph break.
NVFP4Linear.forward = torch.compiler.disable(NVFP4Linear.forward)  # type: ignore[method-assign]


def convert_to_nvfp4_training(
    module: nn.Module,
    *,
    config: NVFP4TrainingConfig | None = None,
    module_filter_fn: Callable[[nn.Module, str], bool] | None = None,
    sr_tile: tuple[int, int] = (128, 128),
    accumulator: Any = "blackwell",
) -> nn.Module:
    """Swap the ``nn.Linear`` modules of ``module`` for :class:`NVFP4Linear` (torchao's
    ``quantize_(model, NVFP4TrainingConfig())``)."""
    config = NVFP4TrainingConfig() if config is None else config
    if not isinstance(config, NVFP4TrainingConfig):
        raise TypeError(f"config must be an fp8sim.torchao.NVFP4TrainingConfig, got {type(config).__name__}")

    def swap(m: nn.Linear) -> nn.Module:
        if isinstance(m, NVFP4Linear):
            return m
        return NVFP4Linear.from_linear(
            m, config.kernel_preference, None, config.world_size, config.rht_sign_vector,
            sr_tile=sr_tile, accumulator=accumulator,
        )  # fmt: skip

    return swap_linear_layers(module, swap, module_filter_fn=module_filter_fn)
