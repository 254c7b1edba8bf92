"""Which Philox word each group of four NVFP4 elements takes in TE's stochastic rounding, for the two kernels
TE's dispatch (``common/cast/dispatch/quantize.cuh``, ``use_optimized_kernel``) sends 1x16 casts to:

- ``"vector_blockwise"``: ``quantize_transpose_vector_blockwise_fp4``
  (``common/transpose/quantize_transpose_vector_blockwise_fp4.cu``) for float32/float16 inputs, bfloat16
  inputs with a flattened dim not a multiple of 32, columnwise-only casts and 16x16 tiles off bfloat16.
- ``"tuned_1d"``: ``quantize_transpose_nvfp4_tuned_1D_kernel``
  (``common/cast/nvfp4/specialized/quantize_transpose_nvfp4_tuned_1D.cuh``) for bfloat16 with both dims
  multiples of 32 and a rowwise output (TE's default, non-fast-math build: float32 scaling coefficient).

- ``"nvfp4_2d"``: ``quantize_transpose_nvfp4_2D_kernel`` (``common/cast/nvfp4/quantize_transpose_nvfp4.cuh``)
  for bfloat16 16x16 tiles with both dims multiples of 32.

- ``"rht_cast_fusion"``: ``row_col_rht_gemm_device``
  (``common/hadamard_transform/row_cast_col_hadamard_transform_cast_fusion.cu``): TE's fused RHT cast (bfloat16,
  rows % 64 == 0, cols % 128 == 0, sm_arch 100..110): rowwise copy of ``x`` and columnwise copy of ``RHT(x.T)``.

TE's unfused RHT path runs the first three kernels (``fp8sim.scaling.nvfp4_te_sr.quantize_nvfp4_te_sr_rht``).
Not modelled: 4over6 (no SR in TE).

Both launches are fixed by the shape (no runtime device query): one 128x128 chunk per block, a grid of
``(ceil(cols/128), ceil(rows/128))``.  Each thread takes Philox subsequence ``t + T bx + T gridDim.x by``
(``T`` threads a block), seed and offset from TE's ``rng_state``, one ``generate4()`` at start and one per
four words (:func:`fp8sim.cast.philox.te_philox_words`; ``get_rbits``), one word per
``cvt.rs.satfinite.e2m1x4.f32``, whose operands are TE's ``{x3, x2, x1, x0}``
(:func:`fp8sim.cast.ptx_sr.encode_ptx_rs`).  Rows and columns past the tensor's edge are computed on zeros
and not stored, so the maps depend on positions only.

``"vector_blockwise"`` (``T = 256``): the rowwise pass first, 4 iterations: in iteration ``i`` the thread
takes chunk row ``t // 8 + 32 i``, columns ``16 (t % 8)`` to ``+16`` as 4 groups of 4 (words ``4 i`` ..
``4 i + 3``); then the columnwise pass on the same stream (from word 16, or 0 without a rowwise output),
2 iterations x 2 columns: column ``2 (t // 8 + 32 i) + s``, chunk rows ``16 (t % 8)`` to ``+16`` as 4 groups
of 4 (words ``16 + 8 i + 4 s`` ..).  32 words a thread for both directions.

``"tuned_1d"`` (``T = 128``): 4 stages over the chunk's 64x64 tiles (``stage = 2 Y + X``), each a rowwise
then (with a columnwise output) a columnwise step on one stream, 8 words each.  Rowwise: 2 iterations; in
iteration ``i`` tile row ``t // 4 + 32 i``, columns ``16 (t % 4)`` to ``+16`` as 2 waves of 8, wave ``w``
reading the 8 at ``8 ((w + (t % 32) // 16) % 2)`` (the shared-memory bank swizzle), 2 words a wave.
Columnwise: lane ``l = t % 32`` and warp ``t // 32`` take tile columns ``2 l`` and ``2 l + 1`` and tile rows
``16 ((l // 2 + warp) % 4)`` to ``+16``, 4 words a column.  64 words a thread for both directions.
``"nvfp4_2d"`` (``T = 128``): 4 stages over the chunk's 32-row slabs (``stage = chunk row // 32``), each a
columnwise then a rowwise step on one stream, 8 words each.  Columnwise: thread ``t`` takes chunk column ``t``,
2 iterations of 16 slab rows, 4 words each (rows ``4 e`` .. ``+3``).  Rowwise: 2 iterations; in iteration ``i``
slab row ``t // 8 + 16 i``, columns ``16 (t % 8)`` to ``+16`` as 2 waves of 8, wave ``w`` reading the 8 at
``8 ((w + (t % 32) // 8) % 2)``, 2 words a wave.  64 words a thread for both directions.
``"rht_cast_fusion"`` (512 threads a CTA, a CTA per 128 columns x up to 1024 rows; the persistent scheduler's
cluster-launch-control work stealing hands a CTA other CTAs' tiles, but each tile keeps its own coordinates, and
the subsequence depends on those only, so the SM count does not enter): for column tile ``m`` and 128-row slab
``s`` (``n = s // K``, ``k = s % K``, ``K = ceil(min(rows, 1024) / 128)``, ``lin = m + n ceil(cols / 128)``),
every thread re-inits at block 0 of subsequence ``t + 512 k' + 512 K lin``.  Columnwise (threads 128..255, the
TMEM lane = tile column ``t - 128``; ``k' = k``): 128 rows as 8 vectors of 16, one ``generate4`` each, word ``j``
for rows ``4 j`` .. ``+3`` of the vector.  Rowwise (threads 256..511; ``k' = k + 1``: the kernel increments
``k_tile`` before it seeds): slab row ``(t - 256) // 2``, tile columns ``64 (t % 2)`` to ``+64`` as 4 vectors of 16,
likewise.
TE advances the generator's offset by 1024 per cast (``pytorch/csrc/quantizer.cpp``, ``rng_elts_per_thread``).
"""

from __future__ import annotations

import numpy as np

from .._util.args import as_int
from .philox import philox4x32

__all__ = [
    "TE_SR_KERNELS",
    "TE_SR_TILE",
    "TE_SR_THREADS",
    "te_fallback_launch",
    "te_philox_block_words",
    "te_nvfp4_sr_words",
]

TE_SR_TILE = 128  # kTileDim
TE_SR_THREADS = 256  # kThreadsPerBlock
_WORDS_PER_PASS = 16
_TUNED_THREADS = 128  # quantize_transpose_nvfp4_tuned_1D.cuh THREADS_NUM
TE_SR_KERNELS = ("vector_blockwise", "tuned_1d", "nvfp4_2d", "rht_cast_fusion")
_RHT_K_TILE = 1024  # hadamard_transform_cast_fusion: k_tile_size
_RHT_THREADS = 512  # row_col_rht_gemm_ntt_w_sfc: dimBlock


def te_fallback_launch(rows: int, cols: int) -> tuple[int, int]:
    """The grid ``(gridDim.x, gridDim.y)`` TE launches for a ``(rows, cols)`` input (256 threads a block)."""
    return -(-cols // TE_SR_TILE), -(-rows // TE_SR_TILE)


def _thread_words(seed: int, offset: int, n_threads: int, n_words: int, rounds: int) -> np.ndarray:
    """``(n_threads, n_words)`` uint32: each thread's first words (subsequence = thread id)."""
    blocks = -(-n_words // 4)
    sub = np.arange(n_threads, dtype=np.uint64)
    ctr = np.zeros((n_threads, blocks, 4), np.uint64)
    for b in range(blocks):  # offset + b < 2^64 is checked by the caller; no carry into the subsequence
        ctr[:, b, 0] = np.uint64((offset + b) & 0xFFFFFFFF)
        ctr[:, b, 1] = np.uint64((offset + b) >> 32)
    ctr[:, :, 2] = (sub & np.uint64(0xFFFFFFFF))[:, None]
    ctr[:, :, 3] = (sub >> np.uint64(32))[:, None]
    key = np.array([seed & 0xFFFFFFFF, seed >> 32], np.uint64)
    return philox4x32(ctr, key, rounds).reshape(n_threads, -1)[:, :n_words]


def te_philox_block_words(seed: int, block: int, n_threads: int, *, rounds: int = 10) -> np.ndarray:
    """``(n_threads, 4)`` uint32: the words ``generate4()`` gives at 128-bit block ``block`` for subsequences
    ``0 .. n_threads - 1`` (TE's per-thread state after ``init(seed, thread, block)``)."""
    seed, block = _check("seed", seed, 0, 2**64), _check("block", block, 0, 2**64)
    # bounded before allocating: 2^27 threads are 2 GiB of words (a kernel launch of TE has far fewer)
    return _thread_words(seed, block, _check("n_threads", n_threads, 1, 2**27 + 1), 4, rounds)


def _check(name: str, v: object, lo: int, hi: int) -> int:
    return as_int(v, name, lo=lo, hi=hi - 1)


def _tuned_1d_words(
    rows: int, cols: int, seed: int, offset: int, columnwise: bool, rounds: int
) -> tuple[np.ndarray, np.ndarray | None]:
    """The word map of ``quantize_transpose_nvfp4_tuned_1D_kernel`` (module docstring)."""
    gx, gy = te_fallback_launch(rows, cols)
    per_stage = 16 if columnwise else 8
    words = _thread_words(seed, offset, gx * gy * _TUNED_THREADS, 4 * per_stage, rounds)
    r = np.arange(rows)[:, None]
    c = 4 * np.arange(cols // 4)[None, :]
    rr, cc = r % TE_SR_TILE, c % TE_SR_TILE
    stage = (rr // 64) * 2 + cc // 64
    tr, tc = rr % 64, cc % 64
    t = (tr % 32) * 4 + tc // 16
    wave = ((tc % 16) // 8 - (t % 32) // 16) % 2  # the bank-group swizzle: wave w reads 8-pack (w + group) % 2
    k = stage * per_stage + (tr // 32) * 4 + wave * 2 + (tc % 8) // 4
    seq = t + _TUNED_THREADS * (c // TE_SR_TILE) + _TUNED_THREADS * gx * (r // TE_SR_TILE)
    row_words = words[seq, k]
    if not columnwise:
        return row_words, None
    c = np.arange(cols)[:, None]
    r = 4 * np.arange(rows // 4)[None, :]
    rr, cc = r % TE_SR_TILE, c % TE_SR_TILE
    stage = (rr // 64) * 2 + cc // 64
    tr, tc = rr % 64, cc % 64
    lane = tc // 2
    warp = (tr // 16 - lane // 2) % 4  # tid_Y_colwise = (lane / 2 + warp) % 4 picks the 16-row block
    t = warp * 32 + lane
    k = stage * per_stage + 8 + (tc % 2) * 4 + ((tr % 16) // 8) * 2 + (tr % 8) // 4
    seq = t + _TUNED_THREADS * (c // TE_SR_TILE) + _TUNED_THREADS * gx * (r // TE_SR_TILE)
    return row_words, words[seq, k]


def _nvfp4_2d_words(
    rows: int, cols: int, seed: int, offset: int, rowwise: bool, columnwise: bool, rounds: int
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The word map of ``quantize_transpose_nvfp4_2D_kernel`` (module docstring)."""
    gx, gy = te_fallback_launch(rows, cols)
    per_stage = 8 * (bool(rowwise) + bool(columnwise))
    words = _thread_words(seed, offset, gx * gy * _TUNED_THREADS, 4 * per_stage, rounds)
    row_words = col_words = None
    if rowwise:
        r = np.arange(rows)[:, None]
        c = 4 * np.arange(cols // 4)[None, :]
        rr, cc = r % TE_SR_TILE, c % TE_SR_TILE
        tr = rr % 32
        t = (tr % 16) * 8 + cc // 16
        wave = ((cc % 16) // 8 - (t % 32) // 8) % 2  # wave w reads 8-pack (w + bank_group) % 2
        k = (rr // 32) * per_stage + 8 * bool(columnwise) + (tr // 16) * 4 + wave * 2 + (cc % 8) // 4
        seq = t + _TUNED_THREADS * (c // TE_SR_TILE) + _TUNED_THREADS * gx * (r // TE_SR_TILE)
        row_words = words[seq, k]
    if columnwise:
        c = np.arange(cols)[:, None]
        r = 4 * np.arange(rows // 4)[None, :]
        rr, cc = r % TE_SR_TILE, c % TE_SR_TILE
        k = (rr // 32) * per_stage + ((rr % 32) // 16) * 4 + (rr % 16) // 4
        seq = cc + _TUNED_THREADS * (c // TE_SR_TILE) + _TUNED_THREADS * gx * (r // TE_SR_TILE)
        col_words = words[seq, k]
    return row_words, col_words


def _seq_words(seed: int, offset: int, seq: np.ndarray, k: np.ndarray, n_words: int, rounds: int) -> np.ndarray:
    """uint32 of ``seq``'s shape: word ``k`` (``< n_words``) of each subsequence in ``seq``, from block 0."""
    flat = np.asarray(seq, np.uint64).reshape(-1)
    uniq, inv = np.unique(flat, return_inverse=True)
    blocks = -(-n_words // 4)
    ctr = np.zeros((uniq.size, blocks, 4), np.uint64)
    for b in range(blocks):
        ctr[:, b, 0] = np.uint64((offset + b) & 0xFFFFFFFF)
        ctr[:, b, 1] = np.uint64((offset + b) >> 32)
    ctr[:, :, 2] = (uniq & np.uint64(0xFFFFFFFF))[:, None]
    ctr[:, :, 3] = (uniq >> np.uint64(32))[:, None]
    key = np.array([seed & 0xFFFFFFFF, seed >> 32], np.uint64)
    words = philox4x32(ctr, key, rounds).reshape(uniq.size, -1)
    return words[inv.reshape(np.shape(seq)), k]


def _rht_fusion_words(
    rows: int, cols: int, seed: int, offset: int, rowwise: bool, columnwise: bool, rounds: int
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The word map of ``row_col_rht_gemm_device`` (module docstring)."""
    k_max = -(-min(rows, _RHT_K_TILE) // TE_SR_TILE)
    tiles_m = -(-cols // TE_SR_TILE)

    def base(r: np.ndarray, c: np.ndarray, shift: int) -> np.ndarray:
        slab = r // TE_SR_TILE
        lin = c // TE_SR_TILE + (slab // k_max) * tiles_m
        return _RHT_THREADS * (slab % k_max + shift) + _RHT_THREADS * k_max * lin

    row_words = col_words = None
    if rowwise:
        r = np.arange(rows)[:, None]
        c = 4 * np.arange(cols // 4)[None, :]
        rr, cc = r % TE_SR_TILE, c % TE_SR_TILE
        seq = 256 + 2 * rr + cc // 64 + base(r, c, 1)
        k = ((cc % 64) // 16) * 4 + (cc % 16) // 4
        row_words = _seq_words(seed, offset, seq, k, 16, rounds)
    if columnwise:
        c = np.arange(cols)[:, None]
        r = 4 * np.arange(rows // 4)[None, :]
        rr, cc = r % TE_SR_TILE, c % TE_SR_TILE
        seq = 128 + cc + base(r, c, 0)
        k = (rr // 16) * 4 + (rr % 16) // 4
        col_words = _seq_words(seed, offset, seq, k, 32, rounds)
    return row_words, col_words


def te_nvfp4_sr_words(
    rows: int,
    cols: int,
    seed: int,
    offset: int,
    *,
    rowwise: bool = True,
    columnwise: bool = True,
    kernel: str = "vector_blockwise",
    rounds: int = 10,
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The random words of one TE NVFP4 cast of a ``(rows, cols)`` tensor with ``rng_state = (seed, offset)``.

    Returns ``(row_words, col_words)``: ``row_words[r, j]`` (shape ``(rows, cols // 4)``) feeds columns
    ``4j .. 4j+3`` of row ``r``; ``col_words[c, j]`` (shape ``(cols, rows // 4)``) feeds rows ``4j .. 4j+3``
    of column ``c`` (the transposed copy's row ``c``); None for a direction not asked for.  ``kernel``: one of
    :data:`TE_SR_KERNELS` (TE's dispatch picks it: ``fp8sim.scaling.nvfp4_te_sr``).  ``rounds``: TE's
    build-time ``NVTE_BUILD_NUM_PHILOX_ROUNDS`` (default 10).  See the module docstring."""
    if kernel not in TE_SR_KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; known: {', '.join(TE_SR_KERNELS)}")
    rows, cols = _check("rows", rows, 0, 2**62), _check("cols", cols, 0, 2**62)
    seed, offset = _check("seed", seed, 0, 2**64), _check("offset", offset, 0, 2**64 - 8)
    if rows % 4 or cols % 4:
        raise ValueError(f"rows and cols must be multiples of 4 (one cvt.rs per 4 values); got ({rows}, {cols})")
    if not (rowwise or columnwise):
        raise ValueError(
            "at least one of rowwise or columnwise must be True (TE: 'At least one of return_identity "
            "or return_transpose must be true.')"
        )
    if kernel == "tuned_1d":
        if not rowwise or rows % 32 or cols % 32:
            raise ValueError(
                f"kernel='tuned_1d' takes a rowwise output and dims that are multiples of 32; got ({rows}, {cols}), "
                f"rowwise={rowwise}"
            )
        return _tuned_1d_words(rows, cols, seed, offset, columnwise, rounds)
    if kernel == "nvfp4_2d":
        if rows % 32 or cols % 32:
            raise ValueError(f"kernel='nvfp4_2d' takes dims that are multiples of 32; got ({rows}, {cols})")
        return _nvfp4_2d_words(rows, cols, seed, offset, rowwise, columnwise, rounds)
    if kernel == "rht_cast_fusion":
        if rows % 64 or cols % 128:
            raise ValueError(f"kernel='rht_cast_fusion' takes rows % 64 == 0 and cols % 128 == 0; got ({rows}, {cols})")
        return _rht_fusion_words(rows, cols, seed, offset, rowwise, columnwise, rounds)
    gx, gy = te_fallback_launch(rows, cols)
    n_words = _WORDS_PER_PASS * (bool(rowwise) + bool(columnwise))
    words = _thread_words(seed, offset, gx * gy * TE_SR_THREADS, n_words, rounds) if rows and cols else None
    row_words = col_words = None
    if rowwise:
        r = np.arange(rows)[:, None]
        c = 4 * np.arange(cols // 4)[None, :]
        rr, cc = r % TE_SR_TILE, c % TE_SR_TILE
        t = (rr % 32) * 8 + cc // 16
        seq = t + TE_SR_THREADS * (c // TE_SR_TILE) + TE_SR_THREADS * gx * (r // TE_SR_TILE)
        k = (rr // 32) * 4 + (cc % 16) // 4
        row_words = words[seq, k] if words is not None else np.zeros((rows, cols // 4), np.uint32)
    if columnwise:
        c = np.arange(cols)[:, None]
        r = 4 * np.arange(rows // 4)[None, :]
        rr, cc = r % TE_SR_TILE, c % TE_SR_TILE
        pair = cc // 2  # c_s: the thread's column pair in shared memory, t // 8 + 32 * iteration
        t = (pair % 32) * 8 + rr // 16
        seq = t + TE_SR_THREADS * (c // TE_SR_TILE) + TE_SR_THREADS * gx * (r // TE_SR_TILE)
        k = _WORDS_PER_PASS * bool(rowwise) + ((pair // 32) * 2 + cc % 2) * 4 + (rr % 16) // 4
        col_words = words[seq, k] if words is not None else np.zeros((cols, rows // 4), np.uint32)
    return row_words, col_words
