"""NVFP4 linear training as torchao 0.18 defines it (``torchao/prototype/moe_training/nvfp4_training/``).

torchao runs it only as Triton kernels on SM100, so the oracle is a reference written here from that source:
torch float32 arithmetic for the casts (``hadamard_utils.py`` ``_nvfp4_quantize`` l. 226-257,
``quantize_2d_triton.py`` ``_nvfp4_2d_quantize`` l. 44-95), torchao's own CPU helpers where it has them
(``get_rht_matrix``, ``per_tensor_amax_to_scale``), torch's float8 cast, a pure-Python Philox4x64-10 checked
on Random123's known answers (``_pack_fp4`` l. 191-223 draws ``tl.randint``, Triton ``language/random.py``),
the ``cvt.rs.satfinite.e2m1x4`` rule from the PTX ISA, and exact float64 GEMMs.  Construction (names,
defaults, seeded buffers) against torchao's real ``NVFP4Linear``.
"""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fp8sim.testing.oracles import require

torch = require("torch")
ao_train = require("torchao.prototype.moe_training.nvfp4_training.nvfp4_training")
ao_had = require("torchao.prototype.moe_training.nvfp4_training.hadamard_utils")
ao_nv = require("torchao.prototype.mx_formats.nvfp4_tensor")

from torch import nn  # noqa: E402

import fp8sim.torchao as fs  # noqa: E402
from fp8sim.testing import assert_bit_exact  # noqa: E402
from fp8sim.torchao.nvfp4_linear import philox4x64  # noqa: E402

M64 = (1 << 64) - 1


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # bit-exact: reductions split by thread


# -- Philox4x64-10 (Triton's randint for 64-bit offsets) ----------------------------------------------------

_KATS = [  # Random123 tests/kat_vectors, philox4x64 10: counter, key, result
    ((0, 0, 0, 0), (0, 0), (0x16554D9ECA36314C, 0xDB20FE9D672D0FDC, 0xD7E772CEE186176B, 0x7E68B68AEC7BA23B)),
    ((M64,) * 4, (M64,) * 2, (0x87B092C3013FE90B, 0x438C3C67BE8D0224, 0x9CC7D7C69CD777B6, 0xA09CAEBF594F0BA0)),
]


def _py_philox4x64(ctr, key):
    """Random123 ``philox4x64_R(10, ...)``: ``mulhilo64`` rounds, key bumped by the golden-ratio words."""
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for _ in range(10):
        p0, p1 = 0xD2E7470EE14C6C93 * c0, 0xCA5A826395121157 * c2
        c0, c1, c2, c3 = (p1 >> 64) ^ c1 ^ k0, p1 & M64, (p0 >> 64) ^ c3 ^ k1, p0 & M64
        k0, k1 = (k0 + 0x9E3779B97F4A7C15) & M64, (k1 + 0xBB67AE8584CAA73B) & M64
    return c0, c1, c2, c3


@pytest.mark.parametrize("ctr, key, want", _KATS)
def test_philox4x64_matches_random123_known_answers(ctr, key, want):
    assert _py_philox4x64(ctr, key) == want
    got = philox4x64(np.array([ctr], dtype=np.uint64), key)[0]
    assert tuple(int(v) for v in got) == want


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, M64), min_size=6, max_size=6))
def test_philox4x64_vectorized_equals_random123_rounds(words):
    ctr, key = tuple(words[:4]), tuple(words[4:])
    got = philox4x64(np.array([ctr, ctr], dtype=np.uint64), key)
    assert [tuple(int(v) for v in row) for row in got] == [_py_philox4x64(ctr, key)] * 2


# -- the reference, from torchao's source -------------------------------------------------------------------

_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


def _e2m1_rn(v):
    """``cvt.rn.satfinite.e2m1x2.f32`` on |v| <= 6: nearest grid value, ties to the even code."""
    a = v.double().abs()
    mids = (_GRID[1:] + _GRID[:-1]) / 2
    idx = torch.bucketize(a, mids, right=True)  # ties go up ...
    tie = (idx > 0) & (a == mids[(idx - 1).clamp(min=0)])
    idx = torch.where(tie & ((idx - 1) % 2 == 0), idx - 1, idx)  # ... unless the code below is even
    return torch.copysign(_GRID[idx], v.double())


def _e2m1_rs(v, rand8):
    """``cvt.rs.satfinite.e2m1x4.f32`` (PTX ISA, cvt): away from zero iff the top 8 discarded bits plus the
    element's 8 random bits carry out."""
    a = v.double().abs()
    lo_idx = torch.bucketize(a, _GRID, right=True) - 1
    lo = _GRID[lo_idx]
    hi = _GRID[(lo_idx + 1).clamp(max=7)]
    frac = torch.where(hi > lo, (a - lo) / (hi - lo), torch.zeros_like(a))
    away = torch.floor(frac * 256) + rand8.double() >= 256
    return torch.copysign(torch.where(away, hi, lo), v.double())


def _rand8(words):
    """The 8 random bits of each element of a group of four (memory order x0..x3): PTX passes
    ``{x3, x2, x1, x0}`` as ``{a, b, e, f}`` (``hadamard_utils.py`` l. 177); a = rbits[31:24], b = rbits[15:8],
    e = rbits[23:16], f = rbits[7:0]."""
    w = words.long()
    return torch.stack([w & 0xFF, (w >> 16) & 0xFF, (w >> 8) & 0xFF, (w >> 24) & 0xFF], dim=-1).flatten(-2)


def _words(rows, cols, tile, tile_of, seed, offset):
    """``_pack_fp4``: pair (r, c) of tile t draws word 0 of Philox4x64(counter ((t*TR*TC/2 + lr*TC/2 + lc) << 32
    | offset_lo), key (seed, 0)), low 32 bits; group g of 4 elements uses pair 4*(g//2) + g%2."""
    tr, tc = tile
    out = torch.empty(rows, cols // 4, dtype=torch.int64)
    for r in range(rows):
        for g in range(cols // 4):
            c = 4 * (g // 2) + g % 2
            t = tile_of(r // tr, c // (tc // 2))
            lin = t * (tr * tc // 2) + (r % tr) * (tc // 2) + c % (tc // 2)
            out[r, g] = _py_philox4x64((((lin << 32) | (offset & 0xFFFFFFFF)) & M64, 0, 0, 0), (seed & M64, 0))[0] & (
                0xFFFFFFFF
            )
    return out


def _pid_table(rows, cols, bm, bn):
    """``hadamard_utils._compute_pid`` (GROUP_SIZE_N = 8) inverted: tile id at (pid_m, pid_n)."""
    pm, pn = rows // bm, cols // bn
    table = {}
    for t in range(pm * pn):
        first = (t // (8 * pm)) * 8
        size = min(pn - first, 8)
        table[((t % (8 * pm)) // size, first + t % size)] = t
    return table


def _quant(x, amax, block, rand8=None):
    """``_nvfp4_quantize`` / ``_nvfp4_2d_quantize`` in torch float32: returns the dequantized values
    ``e2m1 * e4m3_scale`` (float64, exact) and the global decode scale torchao passes to the GEMM."""
    br, bc = block
    rows, cols = x.shape
    x = x.float()
    safe = torch.where(amax == 0, torch.ones_like(amax), amax)
    # IEEE float32 division (torch's ``scalar / tensor`` would be a reciprocal times the scalar); on the GPU
    # Triton lowers ``/`` to the approximate div.full.f32, which fp8sim does not model (module docstring)
    cand = torch.clamp(torch.full_like(safe, 2688.0) / safe, max=torch.finfo(torch.float32).max)
    cand = torch.where(cand == 0, torch.ones_like(cand), cand)
    enc = torch.where(amax == 0, torch.ones_like(amax), cand)
    dec = torch.ones_like(enc) / enc
    t = x.reshape(rows // br, br, cols // bc, bc)
    vmax = t.abs().amax(dim=(1, 3), keepdim=True)
    pv = torch.clamp((vmax / 6.0) * enc, torch.finfo(torch.float8_e4m3fn).tiny, 448.0).to(torch.float8_e4m3fn)
    es = torch.clamp(torch.ones_like(vmax) / (pv.float() * dec), max=torch.finfo(torch.float32).max)
    v = torch.clamp(t * es, -6.0, 6.0).reshape(rows, cols)
    q = _e2m1_rn(v) if rand8 is None else _e2m1_rs(v, rand8.reshape(rows, cols))
    deq = (q.reshape(t.shape) * pv.double()).reshape(rows, cols)
    return deq, ao_nv.per_tensor_amax_to_scale(amax)


def _rht_t(a, signs):
    """RHT(a.t()): torchao's own ``get_rht_matrix`` (bf16), 16-token blocks, float32 result to bf16."""
    mat = ao_had.get_rht_matrix(tuple(signs), "cpu", torch.bfloat16, 16).double()
    m, n = a.shape
    return (a.t().double().reshape(n, m // 16, 16) @ mat).float().to(torch.bfloat16).reshape(n, m)


def _gemm(a, ga, b, gb):
    """F.scaled_mm(..., output_dtype=bf16) with the exact accumulator: exact sum to float32, times
    fl32(gs_a * gs_b), to bf16."""
    return ((a @ b.t()).float() * (ga * gb)).to(torch.bfloat16)


class _Ref(torch.autograd.Function):
    """``nvfp4_linear.py`` ``nvfp4_mm_triton`` (l. 77-238), all three GEMMs."""

    @staticmethod
    def forward(ctx, x, w, bias, seed, signs, tile):
        k, n = x.shape[-1], w.shape[0]
        x2 = x.to(torch.bfloat16).reshape(-1, k)
        w = w.to(torch.bfloat16)
        xr, xg = _quant(x2, x2.float().abs().max(), (1, 16))
        w_amax = w.float().abs().max()
        wq, wg = _quant(w, w_amax, (16, 16))
        out = _gemm(xr, xg, wq, wg).reshape(*x.shape[:-1], n)
        if bias is not None:
            out = out + bias
        xc = _rht_t(x2, signs)
        ctx.xcol = _quant(xc, xc.float().abs().max(), (1, 16))
        ctx.wt = _quant(w.t().contiguous(), w_amax, (16, 16))
        ctx.meta = (x.shape, bias is not None, seed, signs, tile)
        return out

    @staticmethod
    def backward(ctx, dy):
        shape, has_bias, seed, signs, tile = ctx.meta
        dy2 = dy.contiguous().reshape(-1, dy.shape[-1]).to(torch.bfloat16)
        off_row = int(torch.randint(0, 2**32, (1,), dtype=torch.int64))  # l. 174-175: rowwise first
        off_col = int(torch.randint(0, 2**32, (1,), dtype=torch.int64))
        m, n = dy2.shape
        bm, bn = tile
        pid = _pid_table(m, n, bm, bn)
        r8 = _rand8(_words(m, n, (bm, bn), lambda i, j: pid[(i, j)], seed ^ 1, off_row))
        dr, drg = _quant(dy2, dy2.float().abs().max(), (1, 16), r8)
        dc = _rht_t(dy2, signs)
        c8 = _rand8(_words(n, m, (bn, bm), lambda i, j: pid[(j, i)], seed, off_col))
        dcq, dcg = _quant(dc, dc.float().abs().max(), (1, 16), c8)
        gi = _gemm(dr, drg, *ctx.wt).reshape(shape)
        gw = _gemm(dcq, dcg, *ctx.xcol)
        gb = dy.sum(dim=tuple(range(dy.dim() - 1))) if has_bias else None
        return gi, gw, gb, None, None, None


def _heavy(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * torch.exp(torch.randn(shape, generator=g))).to(torch.bfloat16)


def _pair(bias, tile=(128, 128), n_in=128, n_out=256):
    torch.manual_seed(0)
    ours = fs.NVFP4Linear(n_in, n_out, bias=bias, dtype=torch.bfloat16, sr_tile=tile, accumulator="exact")
    seed = int(ours._sr_seed) & M64

    def ref(x):
        return _Ref.apply(x, ours.weight, ours.bias, seed, ours.rht_sign_vector, tile)

    return ours, ref


def _grads(fn, params, x, rng_seed):
    x = x.clone().requires_grad_(True)
    y = fn(x)
    torch.manual_seed(rng_seed)  # both sides draw the SR offsets from the default generator
    y.float().square().sum().backward()
    out = {"output": y.detach(), "grad_input": x.grad}
    for name, p in params.items():
        out[name] = p.grad.clone()
        p.grad = None
    return out


@pytest.mark.parametrize("tile", [(128, 128), (256, 128)], ids=["tile128x128", "tile256x128"])
def test_nvfp4linear_forward_and_gradients_equal_reference(tile):
    ours, ref = _pair(bias=True, tile=tile)
    params = dict(ours.named_parameters())
    x = _heavy((2, 128, 128), 1)  # M = 256 tokens: 2x2 tiles of 128, grouped by _compute_pid
    got, want = _grads(ours, params, x, 5), _grads(ref, params, x, 5)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype == torch.bfloat16, k
        assert_bit_exact(got[k], want[k])


def test_stochastic_rounding_draws_fresh_offsets_each_backward():
    ours, _ = _pair(bias=False)
    x = _heavy((128, 128), 2)
    params = dict(ours.named_parameters())
    a, b, c = _grads(ours, params, x, 1), _grads(ours, params, x, 2), _grads(ours, params, x, 1)
    assert_bit_exact(a["weight"], c["weight"])
    assert not torch.equal(a["weight"], b["weight"]) and not torch.equal(a["grad_input"], b["grad_input"])
    assert torch.equal(a["output"], b["output"])  # the forward rounds to nearest


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(128, 128, bias=True)
        self.fc2 = nn.Linear(128, 128, bias=False)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def test_training_loop_two_steps_bit_equal_to_reference_and_loss_decreases():
    torch.manual_seed(3)
    net = _Net().to(torch.bfloat16)
    fs.convert_to_nvfp4_training(net, accumulator="exact")
    assert isinstance(net.fc1, fs.NVFP4Linear) and net.fc1.bias is not None and net.fc2.bias is None
    ref = _Net().to(torch.bfloat16)
    ref.load_state_dict({k: v for k, v in net.state_dict().items() if not k.split(".")[-1].startswith("_")})

    def ref_fwd(x):
        h = torch.relu(
            _Ref.apply(
                x, ref.fc1.weight, ref.fc1.bias, int(net.fc1._sr_seed) & M64, net.fc1.rht_sign_vector, (128, 128)
            )
        )
        return _Ref.apply(h, ref.fc2.weight, None, int(net.fc2._sr_seed) & M64, net.fc2.rht_sign_vector, (128, 128))

    g = torch.Generator().manual_seed(4)
    x = torch.randn(128, 128, generator=g).to(torch.bfloat16)
    target = (x.float() @ (torch.randn(128, 128, generator=g) / 12)).to(torch.bfloat16)
    runs = {}
    for name, fwd, model in (("ours", net, net), ("ref", ref_fwd, ref)):
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        losses, grads = [], []
        for step in range(2 if name == "ref" else 6):
            opt.zero_grad()
            torch.manual_seed(100 + step)
            loss = (fwd(x).float() - target.float()).square().mean()
            loss.backward()
            grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
            opt.step()
            losses.append(loss.detach())
        runs[name] = (losses, grads)
    for a, b in zip(runs["ours"][0][:2], runs["ref"][0], strict=True):
        assert_bit_exact(a, b)
    for ga, gb in zip(runs["ours"][1][:2], runs["ref"][1], strict=True):
        assert ga.keys() == gb.keys()
        for k in gb:
            assert_bit_exact(ga[k], gb[k])
    assert runs["ours"][0][-1] < runs["ours"][0][0]


# -- names, defaults and construction against torchao's real classes ---------------------------------------


def test_config_fields_and_module_signature_equal_torchao():
    ours, theirs = fs.NVFP4TrainingConfig(), ao_train.NVFP4TrainingConfig()
    assert [f.name for f in dataclasses.fields(ours)] == [f.name for f in dataclasses.fields(theirs)]
    for f in dataclasses.fields(theirs):
        va, vb = getattr(ours, f.name), getattr(theirs, f.name)
        assert getattr(va, "value", va) == getattr(vb, "value", vb), f.name
    p_ours = list(inspect.signature(fs.NVFP4Linear.__init__).parameters)
    p_theirs = list(inspect.signature(ao_train.NVFP4Linear.__init__).parameters)
    assert p_ours[: len(p_theirs)] == p_theirs


def test_seeded_construction_draws_torchaos_buffers():
    torch.manual_seed(11)
    theirs = ao_train.NVFP4Linear(128, 256, bias=True, dtype=torch.bfloat16)
    torch.manual_seed(11)
    ours = fs.NVFP4Linear(128, 256, bias=True, dtype=torch.bfloat16)
    a, b = ours.state_dict(), theirs.state_dict()
    assert a.keys() == b.keys()
    for k in b:
        assert_bit_exact(a[k], b[k])
    assert ours.rht_sign_vector == theirs.rht_sign_vector


def test_bad_arguments():
    with pytest.raises(ValueError, match="only supports kernel_preference=KernelPreference.TRITON"):
        fs.NVFP4TrainingConfig(kernel_preference="emulated")
    with pytest.raises(ValueError, match="M, K, N all divisible by 128; got M=64, K=128, N=128"):
        fs.NVFP4Linear(128, 128)(torch.randn(64, 128))
    with pytest.raises(ValueError, match="rht_sign_vector must have 16 elements"):
        fs.NVFP4Linear(128, 128, rht_sign_vector=[1] * 8)
    with pytest.raises(ValueError, match="sr_tile must be"):
        fs.NVFP4Linear(128, 128, sr_tile=(64, 128))(torch.randn(128, 128))
    with pytest.raises(NotImplementedError, match="tensor-parallel"):
        fs.NVFP4TrainingConfig(process_group=object())
    with pytest.raises(TypeError, match="config must be"):
        fs.convert_to_nvfp4_training(nn.Linear(128, 128), config="nvfp4")


def test_rht_rounds_the_exact_sum_once_to_float32():
    """``tl.dot`` gives float32: 1 + 2^-8 + 2^-24 + 2^-80 rounds (once) up to 1 + 2^-8 + 2^-23, which bf16
    rounds up to 1 + 2^-7; a float64 sum (2^-80 lost) would tie and give 1."""
    from fp8sim.torchao.nvfp4_linear import _rht_t

    col = torch.zeros(16, 1)
    col[:4, 0] = torch.tensor([4.0, 4 * 2.0**-8, 4 * 2.0**-24, 4 * 2.0**-80])
    out = _rht_t(col.to(torch.bfloat16).float().numpy(), (1,) * 16)
    assert out[0, 0] == 1 + 2.0**-7


def test_create_graph_gives_constant_gemm_gradients_with_a_quirk_warning() -> None:
    """torchao's nvfp4_mm_triton backward runs Triton casts and F.scaled_mm on FP4 codes (nvfp4_linear.py
    backward): autograd records nothing, so grad_input and grad_weight are constants; the bias gradient
    (``grad_output.sum``) keeps its graph (issue 29.7)."""
    from fp8sim._util.upstream_quirk import UpstreamQuirkWarning

    torch.manual_seed(0)
    m = fs.NVFP4Linear(128, 128, bias=True, dtype=torch.bfloat16)
    x = torch.randn(128, 128, dtype=torch.bfloat16, requires_grad=True)
    with pytest.warns(UpstreamQuirkWarning, match="torchao-double-backward-graphless"):
        gx, gw, gb = torch.autograd.grad(m(x).float().square().sum(), (x, m.weight, m.bias), create_graph=True)
    assert (gx.requires_grad, gw.requires_grad, gb.requires_grad) == (False, False, True)
