"""TE's NVFP4 stochastic rounding, bit for bit: which Philox word each group of four values takes.

Oracle: the kernel walked literally, thread by thread and loop by loop, as written in
``transformer_engine/common/transpose/quantize_transpose_vector_blockwise_fp4.cu`` (TE mirror
d0067d0): ``kTileDim = 128``, ``kThreadsPerBlock = 256`` (lines 127-134); ``rng_sequence = threadIdx.x +
blockIdx.x * 256 + blockIdx.y * gridDim.x * 256`` and one ``generate4()`` at start (lines 341-348);
``get_rbits`` (lines 203-216); Step 2 (rowwise) ``c_s = (t % 8) * 8``, ``r_s = t / 8``, 4 iterations of
stride 32, ``i = 0, 2, 4, 6`` one word each (lines 397-552); Step 3 (transpose) ``r_s = (t % 8) * 16``,
``c_s = t / 8``, 2 iterations of stride 32, ``smem_idx = 0, 1``, ``i = 0, 2, 4, 6`` (lines 614-744); the grid
``(DIVUP(cols, 128), DIVUP(rows, 128))`` (lines 816-817, 857).  The Philox words come from a scalar
Philox4x32-10 written here from the published algorithm (Salmon et al. SC'11) and checked on a Random123
known answer; the counter layout from ``common/util/curanddx.hpp`` (``init``: ``(offset lo, offset hi,
subsequence lo, subsequence hi)``).  The E2M1 carry rule is gfloat's ``StochasticFastest`` with 8 bits.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fp8sim.cast.te_nvfp4_sr import te_fallback_launch, te_nvfp4_sr_words
from fp8sim.scaling.nvfp4_te_sr import quantize_nvfp4_te_sr
from fp8sim.testing.oracles import require

_M32 = 0xFFFFFFFF


def _philox(ctr: list[int], key: list[int], rounds: int = 10) -> list[int]:
    c, k = list(ctr), list(key)
    for r in range(rounds):
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k[0], p1 & _M32, (p0 >> 32) ^ c[3] ^ k[1], p0 & _M32]
        if r < rounds - 1:
            k = [(k[0] + 0x9E3779B9) & _M32, (k[1] + 0xBB67AE85) & _M32]
    return c


def test_scalar_reference_philox_known_answer():
    """Random123 kat_vectors, philox4x32_10 with counter and key all ones."""
    assert _philox([_M32] * 4, [_M32] * 2) == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]


class _Thread:
    """``philox4x32_native_state`` after ``init(seed, seq, offset)`` and the kernel's first ``generate4``."""

    def __init__(self, seed: int, seq: int, offset: int) -> None:
        self.key = [seed & _M32, seed >> 32]
        self.ctr = (seq << 64) + offset
        self.buf = self._gen()
        self.idx = 0

    def _gen(self) -> list[int]:
        out = _philox([(self.ctr >> (32 * j)) & _M32 for j in range(4)], self.key)
        self.ctr += 1
        return out

    def rbits(self) -> int:  # get_rbits
        if self.idx == 4:
            self.idx, self.buf = 0, self._gen()
        self.idx += 1
        return self.buf[self.idx - 1]


def _kernel_words(rows, cols, seed, offset, rowwise, columnwise):
    """(row_words, col_words) by running every thread of the launch through Steps 2 and 3."""
    gx, gy = -(-cols // 128), -(-rows // 128)
    rw = np.zeros((rows, cols // 4), np.uint32) if rowwise else None
    cw = np.zeros((cols, rows // 4), np.uint32) if columnwise else None
    for by in range(gy):
        for bx in range(gx):
            for t in range(256):
                th = _Thread(seed, t + bx * 256 + by * gx * 256, offset)
                if rowwise:
                    r_s, c_s = t // 8, (t % 8) * 8
                    for _ in range(4):
                        for i in range(0, 8, 2):  # smem_vec[i], [i+1]: columns 2 (c_s + i) .. + 3
                            w = th.rbits()
                            r, c = by * 128 + r_s, bx * 128 + 2 * (c_s + i)
                            if r < rows and c < cols:
                                rw[r, c // 4] = w
                        r_s += 32
                if columnwise:
                    r_s, c_s = (t % 8) * 16, t // 8
                    for _ in range(2):
                        for s in range(2):
                            for i in range(0, 8, 2):  # smem_vec[2i .. 2i+3]: rows r_s + 2i .. + 3
                                w = th.rbits()
                                c, r = bx * 128 + 2 * c_s + s, by * 128 + r_s + 2 * i
                                if c < cols and r < rows:
                                    cw[c, r // 4] = w
                        c_s += 32
    return rw, cw


def _first_diff(got, want):
    i = tuple(int(v) for v in np.argwhere(got != want)[0])
    return f"first difference at {i}: got {int(got[i]):#010x}, want {int(want[i]):#010x}"


@pytest.mark.parametrize(
    "rows,cols,rowwise,columnwise",
    [(160, 272, True, True), (144, 128, False, True), (128, 48, True, False)],
)
def test_word_map_equals_kernel_walk(rows, cols, rowwise, columnwise):
    """Several blocks in both grid dims (partial edge tiles), all 8 warps, both directions sharing a stream."""
    seed, offset = 0x0123456789ABCDEF, 2048
    got = te_nvfp4_sr_words(rows, cols, seed, offset, rowwise=rowwise, columnwise=columnwise)
    want = _kernel_words(rows, cols, seed, offset, rowwise, columnwise)
    for g, w in zip(got, want, strict=True):
        assert (g is None) == (w is None)
        if g is not None:
            assert g.shape == w.shape and np.array_equal(g, w), _first_diff(g, w)


def test_launch_grid_is_tiles_of_128():
    assert te_fallback_launch(160, 272) == (3, 2)
    assert te_fallback_launch(128, 128) == (1, 1)


def _scales_ref(x32: np.ndarray, amax: np.float32, block_2d: bool):
    """TE kernel scale math (``ComputeGlobalEncodeScaleFP4``, ``ComputeDecodeScaleFP4``,
    ``ComputeEncodeScaleFP4``, lines 170-200), per 1x16 block or 16x16 tile, via ml_dtypes' E4M3."""
    f = np.float32
    s_enc = f(min(f(2688) / amax, np.finfo(f).max)) if amax != 0 else f(1)
    s_enc = f(1) if s_enc == 0 else s_enc
    s_dec = f(1.0 / float(s_enc))
    m, k = x32.shape
    blk = np.abs(x32).reshape(m, k // 16, 16).max(axis=2)
    if block_2d:
        blk = blk.reshape(m // 16, 16, k // 16).max(axis=1).repeat(16, axis=0)
    dec = np.minimum(blk * (s_enc * (f(1) / f(6))), f(448)).astype(ml_dtypes.float8_e4m3fn).astype(f)
    with np.errstate(divide="ignore"):
        enc = np.minimum(f(1) / (dec * s_dec), np.finfo(f).max).astype(f)
    return np.repeat(enc, 16, axis=1)


def _e2m1_rs(v: np.ndarray, words: np.ndarray) -> np.ndarray:
    """cvt.rs.satfinite.e2m1x4.f32 with TE's operands {x3, x2, x1, x0} and the PTX ISA byte split
    (a = rbits[31:24], b = rbits[15:8], e = rbits[23:16], f = rbits[7:0]), via gfloat's carry rule."""
    gfloat = require("gfloat")
    from gfloat import formats as gf

    fi = gf.format_info_ocp_e2m1
    out = np.zeros(v.shape, np.uint8)
    flat, w = v.reshape(-1, 4), words.reshape(-1)
    res = out.reshape(-1, 4)
    for g in range(flat.shape[0]):
        word = int(w[g])
        for j, shift in enumerate((0, 16, 8, 24)):  # x0 = f, x1 = e, x2 = b, x3 = a
            rv = gfloat.round_float(
                fi,
                float(flat[g, j]),
                gfloat.RoundMode.StochasticFastest,
                sat=True,
                srbits=(word >> shift) & 0xFF,
                srnumbits=8,
            )
            res[g, j] = gfloat.encode_float(fi, rv)
    return out


@pytest.mark.parametrize("dtype,block_2d", [("float32", False), ("float16", True)])
def test_codes_equal_kernel_reference(dtype, block_2d):
    """The whole cast on a 160x64 input (2 row blocks): scales as TE's kernel computes them, each value
    rounded with the word its thread draws, in both copies."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((160, 64)) * np.exp2(rng.integers(-3, 4, (160, 64)))).astype(dtype)
    x32 = x.astype(np.float32)
    amax = np.float32(np.abs(x32).max())
    seed, offset = 987654321, 1024
    q = quantize_nvfp4_te_sr(x, seed, offset, block_2d=block_2d)
    rw, cw = _kernel_words(160, 64, seed, offset, True, True)
    want_r = _e2m1_rs(x32 * _scales_ref(x32, amax, block_2d), rw)
    xt = np.ascontiguousarray(x32.T)
    want_c = _e2m1_rs(xt * _scales_ref(xt, amax, block_2d), cw)
    assert np.array_equal(q.rowwise.codes, want_r), _first_diff(q.rowwise.codes, want_r)
    assert np.array_equal(q.columnwise.codes, want_c), _first_diff(q.columnwise.codes, want_c)


def test_other_kernels_and_bad_arguments_are_refused():

    with pytest.raises(ValueError, match="unknown kernel 'tma_2d'; known: vector_blockwise, tuned_1d, nvfp4_2d"):
        te_nvfp4_sr_words(32, 32, 1, 0, kernel="tma_2d")
    with pytest.raises(ValueError, match="multiples of 32"):
        te_nvfp4_sr_words(48, 32, 1, 0, kernel="tuned_1d")
    with pytest.raises(ValueError, match="multiples of 32"):
        te_nvfp4_sr_words(32, 48, 1, 0, kernel="nvfp4_2d")
    with pytest.raises(ValueError, match="offset must be an int"):
        te_nvfp4_sr_words(16, 16, 1, -4)
    with pytest.raises(ValueError, match="at least one of rowwise or columnwise"):
        te_nvfp4_sr_words(16, 16, 1, 0, rowwise=False, columnwise=False)
    with pytest.raises(ValueError, match="must be 2-D"):
        quantize_nvfp4_te_sr(np.zeros((2, 16, 16), np.float32), 1, 0)


@pytest.mark.torch
def test_nvfp4_quantizer_draws_te_rng_state_per_cast():
    """``NVFP4Quantizer`` with ``te_rng_generator``: each cast takes ``(seed, offset)`` and advances the offset
    by 1024 (``pytorch/csrc/quantizer.cpp`` ``rng_elts_per_thread = 1024``, ``init_philox_state``); both copies
    come from one launch.  The second cast is checked against the kernel walk at offset 1024."""
    import torch

    from fp8sim.pytorch.tensor.nvfp4_tensor import NVFP4Quantizer
    from fp8sim.scaling.nvfp4_te_sr import TEPhiloxGenerator
    from fp8sim.scaling.packing import unpack_fp4

    rng = np.random.default_rng(3)
    x32 = rng.standard_normal((144, 32)).astype(np.float32)
    q = NVFP4Quantizer(stochastic_rounding=True)
    q.te_rng_generator = TEPhiloxGenerator(seed=42)
    q(torch.from_numpy(x32))
    t = q(torch.from_numpy(x32))
    assert q.te_rng_generator.offset == 2048
    rw, cw = _kernel_words(144, 32, 42, 1024, True, True)
    amax = np.float32(np.abs(x32).max())
    want_r = _e2m1_rs(x32 * _scales_ref(x32, amax, False), rw)
    xt = np.ascontiguousarray(x32.T)
    want_c = _e2m1_rs(xt * _scales_ref(xt, amax, False), cw)
    got_r = unpack_fp4(t._rowwise_data.reshape(144, 16)).numpy()
    got_c = unpack_fp4(t._columnwise_data.reshape(32, 72)).numpy()
    assert np.array_equal(got_r, want_r), _first_diff(got_r, want_r)
    assert np.array_equal(got_c, want_c), _first_diff(got_c, want_c)
    q(torch.zeros(0, 32))  # quantizer.cpp returns before init_philox_state on an empty input
    assert q.te_rng_generator.offset == 2048


def test_block_words_equal_thread_state():
    """``te_philox_block_words(seed, b, n)[t]`` is what ``init(seed, t, b)`` + ``generate4()`` returns."""
    from fp8sim.cast.te_nvfp4_sr import te_philox_block_words

    seed = 2**64 - 5
    got = te_philox_block_words(seed, 3, 40)
    for t in (0, 1, 39):
        th = _Thread(seed, t, 3)
        assert [int(v) for v in got[t]] == [th.rbits() for _ in range(4)]


def _tuned_kernel_words(rows, cols, seed, offset, columnwise):
    """``quantize_transpose_nvfp4_tuned_1D_kernel`` walked thread by thread (``specialized/
    quantize_transpose_nvfp4_tuned_1D.cuh``, TE mirror d0067d0): ``THREADS_NUM = 128``, 64x64 tiles, 4 stages
    (lines 37-47, 528); ``rng_sequence`` (line 383); per stage ``rowwise_scaling`` then ``colwise_scaling``
    (lines 591-599).  Rowwise (lines 271-366): ``tid_Y = t / 4``, ``tid_X = t % 4``, 2 iterations of 32 rows,
    2 waves, wave ``w`` at ``((w + bank_group) * 8) % 16`` with ``bank_group = lane / 16`` (lines 283, 309),
    ``rbits03`` then ``rbits47``.  Colwise (lines 188-268): ``tid_Y = (lane / 2 + warp) % 4`` (line 202), columns
    ``2 lane + w``, for ``e`` in 0, 1 rows ``16 tid_Y + 8 e`` .. ``+3`` then ``+4`` .. ``+7``."""
    gx, gy = -(-cols // 128), -(-rows // 128)
    rw = np.zeros((rows, cols // 4), np.uint32)
    cw = np.zeros((cols, rows // 4), np.uint32) if columnwise else None
    for by in range(gy):
        for bx in range(gx):
            for t in range(128):
                th = _Thread(seed, t + bx * 128 + by * gx * 128, offset)
                lane, warp = t % 32, t // 32
                for stage in range(4):
                    y0, x0 = by * 128 + (stage // 2) * 64, bx * 128 + (stage % 2) * 64
                    for it in range(2):
                        r = y0 + t // 4 + it * 32
                        for w in range(2):
                            c = x0 + (t % 4) * 16 + ((w + lane // 16) * 8) % 16
                            for half in range(2):
                                word = th.rbits()
                                if r < rows and c + 4 * half < cols:
                                    rw[r, (c + 4 * half) // 4] = word
                    if columnwise:
                        tid_y = (lane // 2 + warp) % 4
                        for w in range(2):
                            c = x0 + 2 * lane + w
                            for e in range(2):
                                for half in range(2):
                                    word = th.rbits()
                                    r = y0 + 16 * tid_y + 8 * e + 4 * half
                                    if c < cols and r < rows:
                                        cw[c, r // 4] = word
    return rw, cw


@pytest.mark.parametrize("rows,cols,columnwise", [(160, 288, True), (96, 128, False)])
def test_tuned_1d_word_map_equals_kernel_walk(rows, cols, columnwise):
    """Partial chunks in both dims, all 4 warps, both bank groups, both directions on one stream."""
    seed, offset = 0xFEDCBA9876543210, 3072
    got = te_nvfp4_sr_words(rows, cols, seed, offset, columnwise=columnwise, kernel="tuned_1d")
    want = _tuned_kernel_words(rows, cols, seed, offset, columnwise)
    for g, w in zip(got, want, strict=True):
        assert (g is None) == (w is None)
        if g is not None:
            assert g.shape == w.shape and np.array_equal(g, w), _first_diff(g, w)


@pytest.mark.torch
def test_bf16_codes_use_the_tuned_kernel_map():
    """TE's dispatch (``cast/dispatch/quantize.cuh`` line 132, ``quantize_transpose_nvfp4.cuh`` line 1431):
    bfloat16 with both dims multiples of 32 goes to the tuned kernel; the element math is
    ``mul.f32(cvt.f32.bf16(x), coefficient)`` then ``cvt.rs`` with ``{v3, v2, v1, v0}``
    (``util/ptx_arch_spec.cuh`` ``mul_cvt_bf16_to_fp4_8x_stochastic_rounding``)."""
    import torch

    rng = np.random.default_rng(11)
    x32 = rng.standard_normal((64, 96)).astype(np.float32)
    xb = torch.from_numpy(x32).to(torch.bfloat16)
    x32 = xb.float().numpy()
    amax = np.float32(np.abs(x32).max())
    q = quantize_nvfp4_te_sr(xb, 5, 0)
    rw, cw = _tuned_kernel_words(64, 96, 5, 0, True)
    want_r = _e2m1_rs(x32 * _scales_ref(x32, amax, False), rw)
    xt = np.ascontiguousarray(x32.T)
    want_c = _e2m1_rs(xt * _scales_ref(xt, amax, False), cw)
    assert np.array_equal(q.rowwise.codes, want_r), _first_diff(q.rowwise.codes, want_r)
    assert np.array_equal(q.columnwise.codes, want_c), _first_diff(q.columnwise.codes, want_c)


@settings(max_examples=12, deadline=None)
@given(
    st.integers(1, 2),
    st.integers(1, 3),
    st.booleans(),
    st.sampled_from(["vector_blockwise", "tuned_1d", "nvfp4_2d"]),
    st.integers(0, 2**64 - 1),
)
def test_full_tiles_use_every_drawn_word_once(ty, tx, columnwise, kernel, seed):
    """On whole 128x128 chunks every word each thread draws feeds exactly one group of four (no word is
    skipped or reused): the maps are bijections onto the threads' streams (32 or 64 words a thread with
    both directions, 16 or 32 with the rowwise one)."""
    from fp8sim.cast.te_nvfp4_sr import te_philox_block_words

    rows, cols = 128 * ty, 128 * tx
    rw, cw = te_nvfp4_sr_words(rows, cols, seed, 0, columnwise=columnwise, kernel=kernel)
    threads = ty * tx * (256 if kernel == "vector_blockwise" else 128)
    blocks = (4 if kernel == "vector_blockwise" else 8) * (1 + columnwise)
    drawn = np.concatenate([te_philox_block_words(seed, b, threads).reshape(-1) for b in range(blocks)])
    used = np.concatenate([rw.reshape(-1)] + ([cw.reshape(-1)] if columnwise else []))
    assert used.size == drawn.size and np.array_equal(np.sort(used), np.sort(drawn))


_TE_SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)  # nvfp4_tensor.py get_wgrad_sign_vector


def _rht_bf16_ref(x32: np.ndarray, signs: bool) -> np.ndarray:
    """``x.reshape(-1, 16) @ (diag(s) H / 4)`` (TE ``pytorch/tensor/nvfp4_tensor.py`` lines 49-104: the Sylvester
    Hadamard ``H[i, j] = (-1)^popcount(i & j)``), summed exactly in float64 (16 products of bf16 values by
    ±1/4 on normal inputs) and rounded once to bfloat16 by ml_dtypes, as the unfused ``nvte_hadamard_transform``
    stores it (``mma_m16_n16_k16_b16_b16_b16_noacc``: float32 accumulators written as bf16)."""
    i = np.arange(16)
    h = np.where(np.array([[bin(a & b).count("1") % 2 for b in i] for a in i]) == 1, -1.0, 1.0)
    s = np.asarray(_TE_SIGNS if signs else (1,) * 16, np.float64)[:, None]
    out = x32.astype(np.float64).reshape(-1, 16) @ (s * h / 4)
    return out.reshape(x32.shape).astype(ml_dtypes.bfloat16).astype(np.float32)


@pytest.mark.torch
@pytest.mark.parametrize(
    "rows,cols,signs,usage",
    [(32, 160, True, "both"), (80, 48, False, "both"), (96, 64, True, "columnwise")],
)
def test_unfused_rht_sr_equals_two_launch_reference(rows, cols, signs, usage):
    """``NVFP4Quantizer(with_rht=True, stochastic_rounding=True)`` on shapes TE keeps off the fused kernel
    (``pytorch/csrc/quantizer.cpp`` ``is_eligible_for_rht_cast_fusion``: rows % 64, cols % 128, lines 1934-1940):
    ``quantize_with_rht_unfused_helper`` (lines 2434-2505) casts ``x`` rowwise-only with the first
    ``rng_state`` and ``RHT(x.T)`` (bf16) rowwise-only with a second one (``need_separate_columnwise_rng``,
    lines 2600-2625), each on the 1x16 kernel the shape picks (tuned for bf16 with dims multiples of 32, else
    the vector-blockwise one), walked here with its rowwise pass only.  Generator advances 2048 a cast."""
    import torch

    from fp8sim.pytorch.tensor.nvfp4_tensor import NVFP4Quantizer
    from fp8sim.scaling.nvfp4_te_sr import TEPhiloxGenerator
    from fp8sim.scaling.packing import unpack_fp4

    rng = np.random.default_rng(rows + cols)
    xb = torch.from_numpy(rng.standard_normal((rows, cols)).astype(np.float32)).to(torch.bfloat16)
    x32 = xb.float().numpy()
    q = NVFP4Quantizer(
        with_rht=True,
        with_post_rht_amax=True,
        with_random_sign_mask=signs,
        stochastic_rounding=True,
        rowwise=usage == "both",
    )
    q.te_rng_generator = TEPhiloxGenerator(seed=77, offset=4096)
    t = q(xb)
    assert q.te_rng_generator.offset == 4096 + 2048
    tuned = rows % 32 == 0 and cols % 32 == 0

    def words(r, c, off):
        return (_tuned_kernel_words(r, c, 77, off, False) if tuned else _kernel_words(r, c, 77, off, True, False))[0]

    if usage == "both":
        want_r = _e2m1_rs(x32 * _scales_ref(x32, np.float32(np.abs(x32).max()), False), words(rows, cols, 4096))
        got_r = unpack_fp4(t._rowwise_data.reshape(rows, cols // 2)).numpy()
        assert np.array_equal(got_r, want_r), _first_diff(got_r, want_r)
    ht = _rht_bf16_ref(np.ascontiguousarray(x32.T), signs)
    want_c = _e2m1_rs(ht * _scales_ref(ht, np.float32(np.abs(ht).max()), False), words(cols, rows, 5120))
    got_c = unpack_fp4(t._columnwise_data.reshape(cols, rows // 2)).numpy()
    assert np.array_equal(got_c, want_c), _first_diff(got_c, want_c)
    assert float(t._amax_columnwise) == float(np.abs(ht).max())


def _fused_rht_kernel_words(rows, cols, seed, offset):
    """``row_col_rht_gemm_device`` walked tile by tile and thread by thread
    (``hadamard_transform/row_cast_col_hadamard_transform_cast_fusion.cu``, TE mirror d0067d0): grid
    ``(ceil(cols / 128), ceil(rows / 1024))`` of 512 threads (lines 1166-1171, ``k_tile_size = 1024`` line 1315);
    ``K_TILE_MAX = ceil(min(N, K) / 128)`` (line 247); ``get_linear_tile_idx = m_idx + n_idx * tiles_in_m``
    (line 318; work stealing keeps each tile's own ``(m_idx, n_idx)``, so the order of tiles does not matter).
    Columnwise epilogue, warps 4-7 (lines 650-850): ``rng.init(seed, t + k_tile * 512 + lin * K_TILE_MAX * 512,
    offset)`` per 128-row slab, thread ``t`` loads TMEM lane ``t % 128`` (``SM100_TMEM_LOAD_32dp32b64x``: tile column
    ``t - 128``, its 128 accumulator columns = the slab's rows, the MMA writing k-block ``i`` to columns ``16 i``,
    lines 609-618), 8 vectors of 16, one ``generate4`` each; ``StochasticNumericConverter`` (lines 60-100) feeds
    ``rbits[j]`` to values ``4 j`` .. ``+3``.  Rowwise epilogue, warps 8-15 (lines 858-1000): ``++k_tile`` before
    ``rng.init`` (lines 946-947), the S2R thread layout ``blocked_product((2, 16), (1, 8))`` with 64 values a
    thread along the tile's columns: slab row ``(t - 256) // 2``, columns ``64 (t % 2)`` .. ``+64``, 4 vectors."""
    tiles_m, k_max = -(-cols // 128), -(-min(rows, 1024) // 128)
    slabs = -(-rows // 128)
    rw = np.zeros((rows, cols // 4), np.uint32)
    cw = np.zeros((cols, rows // 4), np.uint32)
    for n_idx in range(-(-rows // 1024)):
        for m_idx in range(tiles_m):
            lin = m_idx + n_idx * tiles_m
            for k_tile in range(k_max):
                slab = n_idx * k_max + k_tile
                if slab >= slabs:
                    break
                for t in range(128, 256):
                    th = _Thread(seed, t + k_tile * 512 + lin * k_max * 512, offset)
                    for v in range(8):
                        for j in range(4):
                            word = th.rbits()
                            r = slab * 128 + 16 * v + 4 * j
                            if r < rows:
                                cw[m_idx * 128 + t - 128, r // 4] = word
                for t in range(256, 512):
                    th = _Thread(seed, t + (k_tile + 1) * 512 + lin * k_max * 512, offset)
                    r = slab * 128 + (t - 256) // 2
                    for v in range(4):
                        for j in range(4):
                            word = th.rbits()
                            if r < rows:
                                rw[r, (m_idx * 128 + 64 * (t % 2) + 16 * v + 4 * j) // 4] = word
    return rw, cw


@pytest.mark.parametrize("rows,cols", [(1088, 256), (192, 128)])
def test_rht_cast_fusion_word_map_equals_kernel_walk(rows, cols):
    """Two 1024-row grid rows (a partial 64-row slab), two column tiles; and K_TILE_MAX < 8."""
    seed, offset = 0xA5A5A5A5DEADBEEF, 6144
    got = te_nvfp4_sr_words(rows, cols, seed, offset, kernel="rht_cast_fusion")
    want = _fused_rht_kernel_words(rows, cols, seed, offset)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and np.array_equal(g, w), _first_diff(g, w)


@pytest.mark.torch
def test_fused_rht_sr_equals_kernel_reference():
    """``NVFP4Quantizer(with_rht=True, stochastic_rounding=True)`` on a shape TE sends to the fused kernel
    (bf16, rows % 64, cols % 128, sm_arch 100): one ``rng_state`` for both copies (no second draw,
    ``quantizer.cpp`` lines 2600-2602); rowwise codes of ``x`` and columnwise codes of ``RHT(x.T)`` rounded to
    bf16 (the kernel's non-fast-math downcast, lines 774-786) with the fused kernel's words; 2D refused."""
    import torch

    from fp8sim.pytorch.tensor.nvfp4_tensor import NVFP4Quantizer
    from fp8sim.scaling.nvfp4_te_sr import TEPhiloxGenerator
    from fp8sim.scaling.packing import unpack_fp4

    rows, cols = 64, 256
    rng = np.random.default_rng(17)
    xb = torch.from_numpy(rng.standard_normal((rows, cols)).astype(np.float32)).to(torch.bfloat16)
    x32 = xb.float().numpy()
    q = NVFP4Quantizer(with_rht=True, with_post_rht_amax=True, stochastic_rounding=True)
    q.te_rng_generator = TEPhiloxGenerator(seed=123, offset=1024)
    t = q(xb)
    assert q.te_rng_generator.offset == 2048
    rw, cw = _fused_rht_kernel_words(rows, cols, 123, 1024)
    want_r = _e2m1_rs(x32 * _scales_ref(x32, np.float32(np.abs(x32).max()), False), rw)
    got_r = unpack_fp4(t._rowwise_data.reshape(rows, cols // 2)).numpy()
    assert np.array_equal(got_r, want_r), _first_diff(got_r, want_r)
    ht = _rht_bf16_ref(np.ascontiguousarray(x32.T), True)
    want_c = _e2m1_rs(ht * _scales_ref(ht, np.float32(np.abs(ht).max()), False), cw)
    got_c = unpack_fp4(t._columnwise_data.reshape(cols, rows // 2)).numpy()
    assert np.array_equal(got_c, want_c), _first_diff(got_c, want_c)
    q2 = NVFP4Quantizer(with_rht=True, with_post_rht_amax=True, stochastic_rounding=True, with_2d_quantization=True)
    q2.te_rng_generator = TEPhiloxGenerator(seed=1)
    with pytest.raises(NotImplementedError, match="fused RHT cast"):
        q2(xb)
    assert q2.te_rng_generator.offset == 0
    q.te_sm_arch = 120  # e.g. sm_120: TE takes the unfused path, two rng_states
    q(xb)
    assert q.te_rng_generator.offset == 4096


def _kernel_2d_words(rows, cols, seed, offset, rowwise, columnwise):
    """``quantize_transpose_nvfp4_2D_kernel`` walked thread by thread (``cast/nvfp4/quantize_transpose_nvfp4.cuh``,
    TE mirror d0067d0): ``CHUNK_DIM = 128``, ``THREADS_NUM = 128``, 32x128 tiles, ``STAGES = 4`` (lines 241-262);
    ``rng_sequence`` and the first ``generate4`` (lines 876-882); per stage the colwise pass then the rowwise one
    (lines 1097-1337).  Colwise: ``tid_X_colwise = t`` takes column ``t``, ``ITERATIONS_TRANSPOSE = 2`` blocks of
    16 rows, ``e`` in 0..3 one ``get_rbits`` for rows ``4 e`` .. ``+3`` (lines 1100-1171).  Rowwise:
    ``ITERATIONS_NORMAL = 2``, row ``t / 8 + 16 it``, columns ``16 (t % 8)``, waves ``w`` at
    ``((w + bank_group) * 8) % 16`` with ``bank_group = lane / 8`` (lines 928-929, 1305-1332), 2 words a wave."""
    gx, gy = -(-cols // 128), -(-rows // 128)
    rw = np.zeros((rows, cols // 4), np.uint32) if rowwise else None
    cw = np.zeros((cols, rows // 4), np.uint32) if columnwise else None
    for by in range(gy):
        for bx in range(gx):
            for t in range(128):
                th = _Thread(seed, t + bx * 128 + by * gx * 128, offset)
                bank_group = (t % 32) // 8
                for stage in range(4):
                    y0 = by * 128 + stage * 32
                    if columnwise:
                        for it in range(2):
                            for e in range(4):
                                word = th.rbits()
                                c, r = bx * 128 + t, y0 + 16 * it + 4 * e
                                if c < cols and r < rows:
                                    cw[c, r // 4] = word
                    if rowwise:
                        for it in range(2):
                            r = y0 + t // 8 + 16 * it
                            for w in range(2):
                                c = bx * 128 + (t % 8) * 16 + ((w + bank_group) * 8) % 16
                                for e in range(2):
                                    word = th.rbits()
                                    if r < rows and c + 4 * e < cols:
                                        rw[r, (c + 4 * e) // 4] = word
    return rw, cw


@pytest.mark.parametrize(
    "rows,cols,rowwise,columnwise", [(160, 288, True, True), (96, 160, False, True), (64, 160, True, False)]
)
def test_nvfp4_2d_word_map_equals_kernel_walk(rows, cols, rowwise, columnwise):
    """Partial chunks in both dims, all 4 bank groups, both directions on one stream, columnwise-only too."""
    seed, offset = 0x0F1E2D3C4B5A6978, 5120
    got = te_nvfp4_sr_words(rows, cols, seed, offset, rowwise=rowwise, columnwise=columnwise, kernel="nvfp4_2d")
    want = _kernel_2d_words(rows, cols, seed, offset, rowwise, columnwise)
    for g, w in zip(got, want, strict=True):
        assert (g is None) == (w is None)
        if g is not None:
            assert g.shape == w.shape and np.array_equal(g, w), _first_diff(g, w)


@pytest.mark.torch
def test_bf16_16x16_codes_use_the_2d_kernel_map():
    """TE's dispatch (``cast/dispatch/quantize.cuh`` lines 132-147): bfloat16 16x16 tiles with both dims multiples
    of 32 go to ``quantize_transpose_nvfp4_2D_kernel``; the element math is ``mul_cvt_bf16_to_fp4_4x`` (the same
    ``cvt.rs`` on ``{v3, v2, v1, v0}``, ``util/ptx_arch_spec.cuh`` lines 120-152) with the 16x16 tile's scale."""
    import torch

    rng = np.random.default_rng(13)
    x32 = (rng.standard_normal((64, 160)) * np.exp2(rng.integers(-3, 4, (64, 160)))).astype(np.float32)
    xb = torch.from_numpy(x32).to(torch.bfloat16)
    x32 = xb.float().numpy()
    amax = np.float32(np.abs(x32).max())
    q = quantize_nvfp4_te_sr(xb, 9, 2048, block_2d=True)
    rw, cw = _kernel_2d_words(64, 160, 9, 2048, True, True)
    want_r = _e2m1_rs(x32 * _scales_ref(x32, amax, True), rw)
    xt = np.ascontiguousarray(x32.T)
    want_c = _e2m1_rs(xt * _scales_ref(xt, amax, True), cw)
    assert np.array_equal(q.rowwise.codes, want_r), _first_diff(q.rowwise.codes, want_r)
    assert np.array_equal(q.columnwise.codes, want_c), _first_diff(q.columnwise.codes, want_c)


@settings(max_examples=6, deadline=None)
@given(st.integers(1, 3), st.integers(1, 2), st.integers(0, 2**64 - 1))
def test_rht_cast_fusion_uses_every_drawn_word_once(ty, tx, seed):
    """The fused RHT cast on whole tiles: the columnwise threads (128..255) draw 32 words a slab, the rowwise
    threads (256..511) 16 words from the next slab's subsequence; each such word feeds exactly one group of four."""
    from fp8sim.cast.te_nvfp4_sr import te_philox_block_words

    rows, cols = 128 * ty, 128 * tx
    rw, cw = te_nvfp4_sr_words(rows, cols, seed, 0, kernel="rht_cast_fusion")
    lin_stride = 512 * ty  # K_TILE_MAX = ty slabs (rows < 1024), one grid row
    n = lin_stride * tx + 512
    blocks = [te_philox_block_words(seed, b, n) for b in range(8)]
    drawn = []
    for lin in range(tx):
        for k in range(ty):
            col = np.arange(128, 256) + 512 * k + lin_stride * lin
            row = np.arange(256, 512) + 512 * (k + 1) + lin_stride * lin
            drawn += [blocks[b][col].reshape(-1) for b in range(8)] + [blocks[b][row].reshape(-1) for b in range(4)]
    drawn = np.concatenate(drawn)
    used = np.concatenate([rw.reshape(-1), cw.reshape(-1)])
    assert used.size == drawn.size and np.array_equal(np.sort(used), np.sort(drawn))


def test_philox_block_words_refuses_an_absurd_thread_count_before_allocating() -> None:
    """``n_threads`` up to 2^40 was accepted and then tried to allocate 16 TiB (issue 29's rule: absurd sizes
    are ValueErrors naming the argument before any allocation)."""
    from fp8sim.cast.te_nvfp4_sr import te_philox_block_words

    with pytest.raises(ValueError, match=r"n_threads must be an int in \[1, 134217728\], got 1099511627775"):
        te_philox_block_words(1, 0, 2**40 - 1)
    with pytest.raises(ValueError, match=r"n_threads must be an int in \[1, 134217728\], got 0"):  # crashed in reshape
        te_philox_block_words(1, 0, 0)
    assert te_philox_block_words(1, 0, 1).shape == (1, 4)
