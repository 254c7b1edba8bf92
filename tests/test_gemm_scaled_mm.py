"""scaled_mm (spec 8, 9.2): accumulators against independent computations, layouts, torch checks."""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from fp8sim.gemm import dot_add, get_accumulator, scaled_mm
from fp8sim.gemm.torch_cpu import fallback_kernel
from fp8sim.testing.oracles import require

ML = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2, "e2m1": ml_dtypes.float4_e2m1fn}


def _codes(rng: np.random.Generator, shape: tuple, fmt: str, scale: float = 1.0) -> np.ndarray:
    """Codes of N(0, scale) values (finite), via ml_dtypes."""
    with np.errstate(over="ignore"):
        return (rng.standard_normal(shape) * scale).astype(np.float32).clip(-400, 400).astype(ML[fmt]).view(np.uint8)


def _vals(codes: np.ndarray, fmt: str) -> np.ndarray:
    return codes.view(ML[fmt]).astype(np.float64)


def _f32_nearest(x: Fraction) -> np.float32:
    """Correctly rounded float32 (ties to even) of an exact rational, independent of fp8sim."""
    w = np.float32(float(x))
    cands = [np.nextafter(w, np.float32(-np.inf)), w, np.nextafter(w, np.float32(np.inf))]
    return min(cands, key=lambda c: (abs(Fraction(float(c)) - x), int(np.array(c).view(np.uint32)) & 1))


@pytest.mark.parametrize(("fa", "fb", "k"), [("e4m3", "e4m3", 64), ("e5m2", "e4m3", 96), ("e4m3", "e5m2", 32)])
def test_exact_accumulator_is_the_correctly_rounded_exact_sum(fa: str, fb: str, k: int) -> None:
    rng = np.random.default_rng(1)
    a = _codes(rng, (6, k), fa, 50.0)
    b = _codes(rng, (k, 5), fb, 0.01)
    b[:, 0] = _codes(rng, (k,), fb, 1e3)  # wide dynamic range in one column
    a[0, : k // 2] = a[0, k // 2 :]  # cancellation in row 0 against an antisymmetric column
    b[: k // 2, 1] = b[k // 2 :, 1] ^ 0x80
    got = scaled_mm(
        a,
        b,
        np.float32(1),
        np.float32(1),
        out_dtype="float32",
        accumulator="exact",
        a_format=fa,
        b_format=fb,
        strict=False,
    )
    va, vb = _vals(a, fa), _vals(b, fb)
    for i in range(6):
        for j in range(5):
            exact = sum(Fraction(float(va[i, t])) * Fraction(float(vb[t, j])) for t in range(k))
            assert got[i, j] == _f32_nearest(exact), (i, j)


def _manual_chain(a, b, fa, fb, instr, every):  # noqa: ANN001, ANN202
    """Chained dot_add per output element, promoting every `every` K with a float32 add."""
    m, k = a.shape
    n = b.shape[1]
    out = np.zeros((m, n), np.float32)
    for i in range(m):
        for j in range(n):
            reg = np.float32(0)
            for g in range(0, k, every):
                chain = np.float32(0)
                for t in range(g, min(g + every, k), 32):
                    chain = dot_add(a[i, t : t + 32], b[t : t + 32, j], chain, model=instr, a_format=fa, b_format=fb)
                reg = np.float32(reg + chain) if every < k else chain
            out[i, j] = reg
    return out


@pytest.mark.parametrize(
    ("acc", "instr", "every"),
    [
        ("hopper_fast", "hopper_wgmma", 256),
        ("hopper_split", "hopper_wgmma", 128),
        ("ada_split", "ada_mma", 128),
        ("blackwell", "blackwell_tcgen05", 256),
    ],
)
def test_tensor_core_chains_equal_chained_instructions(acc: str, instr: str, every: int) -> None:
    rng = np.random.default_rng(2)
    a, b = _codes(rng, (5, 256), "e4m3", 20.0), _codes(rng, (256, 4), "e4m3", 20.0)
    got = scaled_mm(
        a,
        b,
        np.float32(1),
        np.float32(1),
        out_dtype="float32",
        accumulator=acc,
        a_format="e4m3",
        b_format="e4m3",
        strict=False,
    )
    want = _manual_chain(a, b, "e4m3", "e4m3", instr, every)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


# torch._scaled_mm(use_fast_accum=) on each GPU (spec 8): fast = one tensor-core chain over all K (cuBLASLt
# CUBLASLT_MATMUL_DESC_FAST_ACCUM), else the chain promoted to a float32 register every 128 K.
_DEVICE_CHAINS = {
    ("hopper", True): ("hopper_wgmma", None),
    ("hopper", False): ("hopper_wgmma", 128),
    ("ada", True): ("ada_mma", None),
    ("ada", False): ("ada_mma", 128),
    ("blackwell", True): ("blackwell_tcgen05", None),
    ("blackwell", False): ("blackwell_tcgen05", 128),
}


def test_use_fast_accum_and_device_pick_the_chain_of_that_gpu() -> None:
    """``scaled_mm(use_fast_accum=, device=)`` without ``accumulator=``: the device's instruction chained over
    all K when fast, promoted every 128 K otherwise (``_manual_chain`` from single ``dot_add`` calls); the six
    choices give six different results on this data, so each argument is seen."""
    rng = np.random.default_rng(7)
    k = 512
    a = _codes(rng, (3, k), "e4m3", 1.0) & 0x7F  # positive: the sum grows with K, chains lose low bits
    b = _codes(rng, (k, 2), "e4m3", 1.0) & 0x7F
    got = {}
    for (device, fast), (instr, every) in _DEVICE_CHAINS.items():
        d = scaled_mm(a, b, np.float32(1), np.float32(1), out_dtype="float32", use_fast_accum=fast, device=device,
                      a_format="e4m3", b_format="e4m3", strict=False)  # fmt: skip
        want = _manual_chain(a, b, "e4m3", "e4m3", instr, every or k)
        assert np.array_equal(d.view(np.uint32), want.view(np.uint32)), (device, fast)
        got[device, fast] = d.tobytes()
    assert len(set(got.values())) == len(got)


def test_fast_accumulation_error_grows_with_k_while_split_stays_bounded() -> None:
    rng = np.random.default_rng(3)
    errs = {}
    for k in (256, 4096):
        a = _codes(rng, (8, k), "e4m3", 1.0) & 0x7F  # positive values: the sum grows with K
        b = _codes(rng, (k, 8), "e4m3", 1.0) & 0x7F
        ex = scaled_mm(
            a,
            b,
            np.float32(1),
            np.float32(1),
            out_dtype="float32",
            accumulator="exact",
            a_format="e4m3",
            b_format="e4m3",
            strict=False,
        ).astype(np.float64)
        for acc in ("hopper_fast", "hopper_split"):
            d = scaled_mm(
                a,
                b,
                np.float32(1),
                np.float32(1),
                out_dtype="float32",
                accumulator=acc,
                a_format="e4m3",
                b_format="e4m3",
                strict=False,
            )
            errs[acc, k] = float(np.mean(np.abs(d - ex) / np.abs(ex)))
    assert errs["hopper_fast", 4096] > 4 * errs["hopper_fast", 256]
    assert errs["hopper_split", 4096] < 2 * errs["hopper_split", 256] + 1e-6
    assert errs["hopper_split", 4096] < errs["hopper_fast", 4096] / 4


def test_tensorwise_epilogue_orders() -> None:
    rng = np.random.default_rng(4)
    a, b = _codes(rng, (4, 32), "e4m3", 10.0), _codes(rng, (32, 4), "e4m3", 10.0)
    sa, sb = np.float32(0.1), np.float32(3.3)
    raw = scaled_mm(
        a,
        b,
        np.float32(1),
        np.float32(1),
        out_dtype="float32",
        accumulator="exact",
        a_format="e4m3",
        b_format="e4m3",
        strict=False,
    )
    alpha = scaled_mm(
        a, b, sa, sb, out_dtype="float32", accumulator="exact", a_format="e4m3", b_format="e4m3", strict=False
    )
    seq = scaled_mm(
        a,
        b,
        sa,
        sb,
        out_dtype="float32",
        accumulator="exact",
        a_format="e4m3",
        b_format="e4m3",
        strict=False,
        epilogue="sequential",
    )
    assert np.array_equal(alpha, np.float32(sa * sb) * raw)
    assert np.array_equal(seq, (raw * sa).astype(np.float32) * sb)


def test_rowwise_scales_and_bias_and_bf16_output() -> None:
    rng = np.random.default_rng(5)
    a, b = _codes(rng, (16, 32), "e4m3", 10.0), _codes(rng, (32, 16), "e4m3", 10.0)
    sa = rng.random((16, 1)).astype(np.float32)
    sb = rng.random((1, 16)).astype(np.float32)
    bias = rng.standard_normal(16).astype(ml_dtypes.bfloat16)
    raw = scaled_mm(
        a,
        b,
        np.float32(1),
        np.float32(1),
        out_dtype="float32",
        accumulator="hopper_split",
        a_format="e4m3",
        b_format="e4m3",
        strict=False,
    )
    got = scaled_mm(
        a, b, sa, sb, bias=bias, out_dtype="bfloat16", accumulator="hopper_split", a_format="e4m3", b_format="e4m3"
    )
    want = (
        (((sa * sb).astype(np.float32) * raw).astype(np.float32) + bias.astype(np.float32)).astype(np.float32)
    ).astype(ml_dtypes.bfloat16)
    assert got.dtype == ml_dtypes.bfloat16 and np.array_equal(got.view(np.uint16), want.view(np.uint16))


def test_fp8_output_default_like_torch_with_scale_result() -> None:
    rng = np.random.default_rng(6)
    a, b = _codes(rng, (16, 32), "e4m3", 10.0), _codes(rng, (32, 16), "e4m3", 10.0)
    d32 = scaled_mm(a, b, np.float32(0.5), np.float32(1), out_dtype="float32", a_format="e4m3", b_format="e4m3")
    codes = scaled_mm(
        a, b, np.float32(0.5), np.float32(1), scale_result=np.float32(0.25), a_format="e4m3", b_format="e4m3"
    )
    want = np.clip(d32 * np.float32(0.25), -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    assert np.array_equal(codes, want)


def _te_blockwise_reference(a, b, sa, sb, a2d, b2d):  # noqa: ANN001, ANN202
    """TE CuBLASRefBlockwiseGemm as spec 8.3 states it, with exact per-tile partials P, in Fractions."""
    m, k = a.shape
    n = b.shape[1]
    va, vb = _vals(a, "e4m3"), _vals(b, "e4m3")
    y = np.zeros((m, n), np.float32)
    for t in range(k // 128):
        for i in range(m):
            for j in range(n):
                p = _f32_nearest(
                    sum(Fraction(float(va[i, q])) * Fraction(float(vb[q, j])) for q in range(128 * t, 128 * t + 128))
                )
                s_a = sa[i // 128, t] if a2d else sa[i, t]
                s_b = sb[t, j // 128] if b2d else sb[t, j]
                first, second = (s_b, s_a) if a2d else (s_a, s_b)
                x = np.float32(p * np.float32(first))
                y[i, j] = _f32_nearest(Fraction(float(x)) * Fraction(float(second)) + Fraction(float(y[i, j])))
    return y


@pytest.mark.parametrize(("a2d", "b2d"), [(False, False), (True, False), (False, True)])
def test_blockwise_matches_te_reference(a2d: bool, b2d: bool) -> None:
    rng = np.random.default_rng(7)
    m, k, n = 4, 256, 3
    a, b = _codes(rng, (m, k), "e4m3", 30.0), _codes(rng, (k, n), "e4m3", 30.0)
    sa = (rng.random((1, 2) if a2d else (m, 2)) + 0.1).astype(np.float32)
    sb = (rng.random((2, 1) if b2d else (2, n)) + 0.1).astype(np.float32)
    got = scaled_mm(
        a, b, sa, sb, out_dtype="float32", accumulator="exact", a_format="e4m3", b_format="e4m3", strict=False
    )
    want = _te_blockwise_reference(a, b, sa, sb, a2d, b2d)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_mx_and_nvfp4_layouts_run_block_scaled_instructions() -> None:
    rng = np.random.default_rng(8)
    a, b = _codes(rng, (3, 64), "e4m3", 10.0), _codes(rng, (64, 2), "e4m3", 10.0)
    sa = rng.integers(120, 135, (3, 2)).astype(np.uint8)
    sb = rng.integers(120, 135, (2, 2)).astype(np.uint8)
    sa[2, 0] = 0xFF  # a NaN scale: row 2 is NaN in every column
    got = scaled_mm(
        a, b, sa, sb, out_dtype="float32", accumulator="blackwell", a_format="e4m3", b_format="e4m3", strict=False
    )
    for i in range(3):
        for j in range(2):
            d = np.float32(0)
            for t in range(2):
                d = dot_add(
                    a[i, 32 * t : 32 * t + 32],
                    b[32 * t : 32 * t + 32, j],
                    d,
                    model="blackwell_mxf8f6f4",
                    scale_a=sa[i, t : t + 1],
                    scale_b=sb[t : t + 1, j],
                )
            assert got[i, j] == d or (np.isnan(got[i, j]) and np.isnan(d) and i == 2)
    exact = scaled_mm(
        a, b, sa, sb, out_dtype="float32", accumulator="exact", a_format="e4m3", b_format="e4m3", strict=False
    )
    va = _vals(a, "e4m3") * np.repeat(np.exp2(sa.astype(np.float64) - 127), 32, axis=1)
    vb = _vals(b, "e4m3") * np.repeat(np.exp2(sb.astype(np.float64) - 127), 32, axis=0)
    assert np.isnan(exact[2]).all()
    for i in range(2):
        for j in range(2):
            assert exact[i, j] == _f32_nearest(
                sum(Fraction(float(va[i, q])) * Fraction(float(vb[q, j])) for q in range(64))
            )
    fa = rng.integers(0, 16, (2, 64)).astype(np.uint8)
    fb = rng.integers(0, 16, (64, 2)).astype(np.uint8)
    s4a = rng.integers(0x20, 0x50, (2, 4)).astype(np.uint8)
    s4b = rng.integers(0x20, 0x50, (4, 2)).astype(np.uint8)
    nv = scaled_mm(
        fa, fb, s4a, s4b, out_dtype="float32", accumulator="blackwell", a_format="e2m1", b_format="e2m1", strict=False
    )
    for i in range(2):
        for j in range(2):
            want = dot_add(
                fa[i],
                fb[:, j],
                np.float32(0),
                model="blackwell_mxf4nvf4",
                a_format="e2m1",
                b_format="e2m1",
                scale_a=s4a[i],
                scale_b=s4b[:, j],
            )
            assert nv[i, j] == want
    with pytest.raises(ValueError, match="need a Blackwell accumulator"):
        scaled_mm(
            a, b, sa, sb, out_dtype="float32", accumulator="hopper_fast", a_format="e4m3", b_format="e4m3", strict=False
        )


def test_torch_operands_and_messages() -> None:
    torch = require("torch")
    a = (torch.randn(32, 64) * 4).to(torch.float8_e4m3fn)
    w = (torch.randn(48, 64) * 4).to(torch.float8_e4m3fn)
    one = torch.tensor(1.0)
    out = scaled_mm(a, w.t(), one, one, out_dtype=torch.float32, use_fast_accum=True)
    assert out.dtype == torch.float32 and out.shape == (32, 48)
    same = scaled_mm(
        a.view(torch.uint8).numpy(),
        w.t().contiguous().view(torch.uint8).numpy(),
        np.float32(1),
        np.float32(1),
        out_dtype="float32",
        accumulator="hopper_fast",
        a_format="e4m3",
        b_format="e4m3",
    )
    assert np.array_equal(out.numpy(), same)
    assert scaled_mm(a, w.t(), one, one).dtype == torch.float8_e4m3fn  # out_dtype defaults to mat1's
    cases = [
        (lambda: scaled_mm(a, w.t().contiguous(), one, one), "Only multiplication of row-major and column-major"),
        (lambda: scaled_mm(a[:, :40], w.t()[:40], one, one), "divisible by 16"),
        (
            lambda: scaled_mm(a.float().to(torch.float8_e5m2), w.float().to(torch.float8_e5m2).t(), one, one),
            "Multiplication of two Float8_e5m2 matrices is not supported",
        ),
        (
            lambda: scaled_mm(a, w.t(), one, one, bias=torch.zeros(48, dtype=torch.bfloat16), out_dtype=torch.float32),
            "Bias is not supported when out_dtype is set to Float32",
        ),
        (
            lambda: scaled_mm(a, w.t(), one, one, bias=torch.zeros(48, dtype=torch.float16), out_dtype=torch.bfloat16),
            "Bias must be BFloat16 to compute BFloat16 output, but got Half",
        ),
        (lambda: scaled_mm(a, w.t(), one.double(), one), "Invalid scaling configuration."),
    ]
    for fn, msg in cases:
        with pytest.raises((RuntimeError, ValueError), match=msg):
            fn()
    lifted = scaled_mm(a, w.t().contiguous(), one, one, out_dtype=torch.float32, strict=False)
    assert lifted.shape == (32, 48)


def test_accumulator_registry() -> None:
    assert get_accumulator("hopper_split128").promote_every == 128
    assert get_accumulator("torchao_emulate").kind == "dequantized_fp32"
    assert get_accumulator("hopper_fast").with_promotion(256).promote_every == 256
    with pytest.raises(ValueError, match="unknown accumulator 'volta'"):
        get_accumulator("volta")
    with pytest.raises(ValueError, match="promote_every must be a positive multiple"):
        get_accumulator("hopper_fast").with_promotion(48)


def test_error_vs_k_study_shows_fast_growing_and_split_bounded(tmp_path) -> None:  # noqa: ANN001
    require("matplotlib")
    from fp8sim.gemm.study import error_vs_k

    r = error_vs_k(ks=(128, 1024, 4096), accumulators=("hopper_fast", "hopper_split", "blackwell"), m=16, n=16)
    fast, split = r.rel_error["hopper_fast"], r.rel_error["hopper_split"]
    assert fast[0] < fast[1] < fast[2] and fast[2] > 20 * fast[0]
    assert max(split) < 1.5 * min(split)
    assert r.rel_error["blackwell"][2] < split[2] / 10  # 25 bits instead of 13
    assert "| 4096 |" in r.table()
    r.plot(str(tmp_path / "evk.png"))
    assert (tmp_path / "evk.png").stat().st_size > 10_000
    with pytest.raises(ValueError, match="distribution must be 'normal' or 'positive'"):
        error_vs_k(ks=(32,), distribution="uniform")


def test_torch_packed_fp4_operands_equal_unpacked_codes() -> None:
    torch = require("torch")
    from fp8sim.scaling.packing import pack_fp4

    rng = np.random.default_rng(9)
    a = rng.integers(0, 16, (32, 64)).astype(np.uint8)
    w = rng.integers(0, 16, (16, 64)).astype(np.uint8)
    ap = torch.from_numpy(np.asarray(pack_fp4(a))).view(torch.float4_e2m1fn_x2)
    wp = torch.from_numpy(np.asarray(pack_fp4(w))).view(torch.float4_e2m1fn_x2)
    sa = rng.integers(0x30, 0x40, (32, 4)).astype(np.uint8)
    sb = rng.integers(0x30, 0x40, (4, 16)).astype(np.uint8)
    got = scaled_mm(
        ap,
        wp.t(),
        torch.from_numpy(sa).view(torch.float8_e4m3fn),
        torch.from_numpy(sb).view(torch.float8_e4m3fn),
        out_dtype=torch.float32,
        accumulator="blackwell",
    )
    want = scaled_mm(
        a, w.T, sa, sb, out_dtype="float32", accumulator="blackwell", a_format="e2m1", b_format="e2m1", strict=False
    )
    assert np.array_equal(got.numpy(), want)


def test_block_scales_cover_a_partial_last_block_along_k() -> None:
    rng = np.random.default_rng(13)
    a, b = _codes(rng, (4, 48), "e4m3", 10.0), _codes(rng, (48, 16), "e4m3", 10.0)
    sa = rng.integers(120, 135, (4, 2)).astype(np.uint8)  # ceil(48 / 32) = 2 blocks
    sb = rng.integers(120, 135, (2, 16)).astype(np.uint8)
    va = _vals(a, "e4m3") * np.exp2(np.repeat(sa.astype(np.float64) - 127, 32, axis=1)[:, :48])
    vb = _vals(b, "e4m3") * np.exp2(np.repeat(sb.astype(np.float64) - 127, 32, axis=0)[:48])
    exact = scaled_mm(a, b, sa, sb, out_dtype="float32", accumulator="exact", a_format="e4m3", b_format="e4m3")
    for i, j in ((0, 0), (3, 15)):
        assert exact[i, j] == _f32_nearest(
            sum(Fraction(float(va[i, q])) * Fraction(float(vb[q, j])) for q in range(48))
        )
    bw = scaled_mm(a, b, sa, sb, out_dtype="float32", accumulator="blackwell", a_format="e4m3", b_format="e4m3")
    assert np.allclose(bw, exact, rtol=1e-6)
    with pytest.raises(ValueError, match="Invalid scaling configuration"):
        scaled_mm(a, b, sa[:, :1], sb[:1], out_dtype="float32", a_format="e4m3", b_format="e4m3")


def test_cpu_reference_divides_by_scale_result_like_torch() -> None:
    torch = require("torch")
    torch.manual_seed(14)
    a = (torch.randn(48, 80) * 4).to(torch.float8_e4m3fn)
    b = (torch.randn(32, 80) * 4).to(torch.float8_e4m3fn).t()
    args = (a, b, torch.tensor(0.5), torch.tensor(2.0))
    kw = {"scale_result": torch.tensor(4.0), "out_dtype": torch.float8_e4m3fn}
    with fallback_kernel():  # the kernel cpu_reference models, on AMX hosts too (fp8sim.gemm.torch_cpu)
        want = torch._scaled_mm(*args, **kw).view(torch.uint8)
    got = scaled_mm(*args, **kw, accumulator="cpu_reference").view(torch.uint8)
    assert torch.equal(got, want)
