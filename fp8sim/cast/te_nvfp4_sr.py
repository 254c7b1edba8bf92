"""Which Philox word each group of four NVFP4 elements takes in TE's stochastic rounding, as TE's
``quantize_transpose_vector_blockwise_fp4`` kernel hands them out
(``common/transpose/quantize_transpose_vector_blockwise_fp4.cu``, ``block_scaled_1d_cast_transpose_kernel``).

TE routes an NVFP4 cast to that kernel unless the input is bfloat16 with both flattened dims multiples
of 32 and a rowwise output (or a columnwise-only 2-D one) is asked for, and unless RHT or 4over6 is on
(``common/cast/dispatch/quantize.cuh``, ``use_optimized_kernel``): so float32 and float16 inputs, bfloat16
inputs with a dim not a multiple of 32, and columnwise-only 1x16 casts.  The other kernels
(``quantize_transpose_nvfp4_tuned_1D``, the 2-D TMA kernel, the RHT cast fusions) draw differently and
are not modelled here.

The launch is fixed by the shape (no runtime device query): a grid of ``(ceil(cols/128), ceil(rows/128))``
blocks of 256 threads, one 128x128 tile per block.  Thread ``t`` of block ``(bx, by)``:

- Philox subsequence ``t + 256 * bx + 256 * gridDim.x * by``, seed and offset from TE's ``rng_state``
  (:func:`fp8sim.cast.philox.te_philox_words`: one ``generate4()`` at start, then one per four words),
  taking the words in order, one per ``cvt.rs.satfinite.e2m1x4.f32`` (``get_rbits``).
- Rowwise pass first (Step 2): 4 iterations; in iteration ``i`` the thread quantizes tile row
  ``t // 8 + 32 i``, columns ``16 (t % 8)`` to ``+16``, as 4 groups of 4 consecutive columns: words
  ``4 i`` .. ``4 i + 3`` (16 words).
- Columnwise pass next (Step 3), continuing the same stream (from word 16 when the rowwise pass ran, else
  from word 0): 2 iterations x 2 columns; in iteration ``i``, column ``2 (t // 8 + 32 i) + s``
  (``s`` = 0, 1), tile rows ``16 (t % 8)`` to ``+16`` as 4 groups of 4 consecutive rows: words
  ``16 + 8 i + 4 s`` .. ``+3`` (16 words).

Rows and columns past the tensor's edge are computed on zeros and not stored, so the mapping depends on
positions only.  Within a group the element order is TE's ``{x3, x2, x1, x0}`` operand order, as
:func:`fp8sim.cast.ptx_sr.encode_ptx_rs` takes it.  So a both-direction cast takes 32 words per thread;
TE advances the generator's offset by 1024 per call (``quantizer.cpp``, ``rng_elts_per_thread``).
"""

from __future__ import annotations

import numpy as np

from .philox import philox4x32

__all__ = ["TE_SR_TILE", "TE_SR_THREADS", "te_fallback_launch", "te_philox_block_words", "te_nvfp4_sr_words"]

TE_SR_TILE = 128  # kTileDim
TE_SR_THREADS = 256  # kThreadsPerBlock
_WORDS_PER_PASS = 16


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
    return _thread_words(seed, block, _check("n_threads", n_threads, 0, 2**40), 4, rounds)


def _check(name: str, v: object, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not lo <= int(v) < hi:
        raise ValueError(f"{name} must be an int in [{lo}, {hi}), got {v!r}")
    return int(v)


def te_nvfp4_sr_words(
    rows: int,
    cols: int,
    seed: int,
    offset: int,
    *,
    rowwise: bool = True,
    columnwise: bool = True,
    rounds: int = 10,
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The random words of one TE NVFP4 cast of a ``(rows, cols)`` tensor with ``rng_state = (seed, offset)``.

    Returns ``(row_words, col_words)``: ``row_words[r, j]`` (shape ``(rows, cols // 4)``) feeds columns
    ``4j .. 4j+3`` of row ``r``; ``col_words[c, j]`` (shape ``(cols, rows // 4)``) feeds rows ``4j .. 4j+3``
    of column ``c`` (the transposed copy's row ``c``); None for a direction not asked for.  ``rounds``:
    TE's build-time ``NVTE_BUILD_NUM_PHILOX_ROUNDS`` (default 10).  See the module docstring."""
    rows, cols = _check("rows", rows, 0, 2**62), _check("cols", cols, 0, 2**62)
    seed, offset = _check("seed", seed, 0, 2**64), _check("offset", offset, 0, 2**64 - 8)
    if rows % 4 or cols % 4:
        raise ValueError(f"rows and cols must be multiples of 4 (one cvt.rs per 4 values); got ({rows}, {cols})")
    if not (rowwise or columnwise):
        raise ValueError(
            "at least one of rowwise or columnwise must be True (TE: 'At least one of return_identity "
            "or return_transpose must be true.')"
        )
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
