"""torch's CPU ``_scaled_mm`` is two kernels (issue 24): which one a call takes, and both models.

Oracles: the routing in torch 2.13's ``aten/src/ATen/native/Blas.cpp`` ``_scaled_mm_out_cpu`` (written
out here as a table), ``/proc/cpuinfo`` for the CPU flags, the installed torch's behaviour on this
host (bfloat16 scales: oneDNN takes them, the fallback refuses), references for each kernel's epilogue
written from ``mkldnn/Linear.cpp`` ``mkldnn_scaled_mm`` with oneDNN's ``ref_matmul.cpp`` (dst scale
divides) and ``scale_utils.hpp`` (src x wei scale precomputed), and from ``Blas.cpp``
``_scaled_mm_out_cpu_emulated`` (``1 / output_scale``, torch's ``.to()``).  Kernel-sensitive torch
calls run under ``fallback_kernel()`` unless they assert oneDNN, which only an AMX host can.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fp8sim.gemm import scaled_mm, torch_cpu_kernel
from fp8sim.gemm.torch_cpu import (
    CPU_FLAGS,
    cpu_flags,
    fallback_kernel,
    kernel_of_capture,
    onednn_version,
    torch_cpu_kernel_meta,
)
from fp8sim.testing.oracles import require

torch = require("torch")
E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
ONE = torch.tensor(1.0)
TORCH_2_13 = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 13)


# -- routing ------------------------------------------------------------------------------------------

# (amx_int8, amx_fp16, mixed dtypes, tensorwise, oneDNN enabled) -> kernel, as _scaled_mm_out_cpu decides
ROUTES = [
    ((True, False, False, True, True), "onednn"),
    ((True, False, True, True, True), "fallback"),  # mixed FP8 dtypes need AMX-FP16
    ((True, True, True, True, True), "onednn"),
    ((False, True, False, True, True), "fallback"),  # one dtype needs AMX-INT8
    ((True, True, False, False, True), "fallback"),  # rowwise: the single-element gate
    ((True, True, False, True, False), "fallback"),  # oneDNN disabled
    ((False, False, False, True, True), "fallback"),  # AVX2 (this kind of host)
]


@pytest.mark.parametrize(("case", "want"), ROUTES)
def test_routing_is_blas_cpp_scaled_mm_out_cpu(case: tuple, want: str) -> None:
    int8, fp16, mixed, tensorwise, enabled = case
    flags = {"amx_int8": int8, "amx_fp16": fp16}
    got = torch_cpu_kernel(mixed_dtypes=mixed, tensorwise=tensorwise, flags=flags, mkldnn_enabled=enabled)
    assert got == want


def test_cpu_flags_are_probed_once_and_agree_with_proc_cpuinfo() -> None:
    assert cpu_flags() is cpu_flags()  # cached
    assert set(cpu_flags()) == set(CPU_FLAGS)
    path = Path("/proc/cpuinfo")
    if not path.exists():
        pytest.skip("no /proc/cpuinfo on this OS to check the flags against")
    line = next(ln for ln in path.read_text().splitlines() if ln.startswith("flags"))
    have = set(line.split(":", 1)[1].split())
    for f in ("amx_int8", "amx_fp16", "avx512_fp16"):
        assert cpu_flags()[f] == (f in have), f


def test_the_detected_kernel_is_the_one_torch_runs_here() -> None:
    """oneDNN reads a bfloat16 scale with ``item<float>()``; torch 2.13's fallback refuses it.  So the call
    succeeds exactly where the detection says oneDNN, and fails everywhere under ``fallback_kernel()``."""
    if not TORCH_2_13:
        pytest.skip(f"torch {torch.__version__}'s fallback does not check the scale dtype (2.13 does)")
    a = torch.ones(16, 32).to(E4)
    b = torch.ones(16, 32).to(E4).t()
    s = ONE.bfloat16()

    def call() -> object:
        return torch._scaled_mm(a, b, s, s, out_dtype=torch.float32)

    if torch_cpu_kernel() == "onednn":
        assert torch.equal(call(), torch.full((16, 16), 32.0))
    else:
        with pytest.raises(ValueError, match="Invalid scaling configuration"):
            call()
    with fallback_kernel():
        assert torch_cpu_kernel() == "fallback"
        with pytest.raises(ValueError, match="Invalid scaling configuration"):
            call()


def test_fallback_kernel_switches_only_scaled_mm() -> None:
    """oneDNN also runs float32 GELU & co on some hosts: the context leaves them alone and restores torch."""
    native, enabled = torch._scaled_mm, torch.backends.mkldnn.enabled
    with fallback_kernel():
        assert torch.backends.mkldnn.enabled == enabled
        assert torch._scaled_mm is not native and torch_cpu_kernel() == "fallback"
        with fallback_kernel():  # nests
            assert torch_cpu_kernel(flags={"amx_int8": True}) == "fallback"
        assert torch_cpu_kernel(flags={"amx_int8": True}) == "fallback"
    assert torch._scaled_mm is native and torch.backends.mkldnn.enabled == enabled
    assert torch_cpu_kernel(flags={"amx_int8": True}) == ("onednn" if enabled else "fallback")


def test_kernel_meta_names_flags_onednn_and_kernels() -> None:
    meta = torch_cpu_kernel_meta()
    assert {f"cpu_{f}" for f in CPU_FLAGS} <= set(meta)
    assert meta["torch_cpu_kernel"] == torch_cpu_kernel() and meta["onednn"] == onednn_version()
    assert all(isinstance(v, str) or v is None for v in meta.values())  # capture metadata: strings
    with fallback_kernel():
        off = torch_cpu_kernel_meta()
    assert off["mkldnn_enabled"] == "no" and off["torch_cpu_kernel"] == off["torch_cpu_kernel_mixed"] == "fallback"
    amx = {**meta, "device": "cpu", "cpu_amx_int8": "yes", "cpu_amx_fp16": "no", "mkldnn_enabled": "yes"}
    assert kernel_of_capture(amx, mixed_dtypes=False, tensorwise=True) == "onednn"
    assert kernel_of_capture(amx, mixed_dtypes=True, tensorwise=True) == "fallback"
    assert kernel_of_capture({"device": "cpu"}, False, True) is None  # captured before the record
    assert kernel_of_capture({**amx, "device": "cuda:0"}, False, True) is None


# -- the two models -----------------------------------------------------------------------------------


def _int_operands(m: int = 16, k: int = 32, n: int = 16, seed: int = 0):  # noqa: ANN202
    """E4M3 operands holding small integers: every sum is exact in float32, whatever the order."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-6, 7, (m, k), generator=g).float().to(E4)
    b = torch.randint(-6, 7, (n, k), generator=g).float().to(E4).t()
    exact = a.float().double() @ b.float().double()
    return a, b, exact


def test_onednn_model_scales_the_sum_once_and_the_fallback_each_operand() -> None:
    """oneDNN: ``fl32(fl32(sa * sb) * sum)``; fallback: ``sum(fl32(a * sa) * fl32(b * sb))`` (exact here)."""
    a, b, exact = _int_operands()
    sa, sb = torch.tensor(0.1), torch.tensor(0.3)
    f32 = np.float32
    want_onednn = (f32(f32(0.1) * f32(0.3)) * exact.numpy().astype(f32)).astype(f32)
    got = scaled_mm(a, b, sa, sb, out_dtype=torch.float32, accumulator="cpu_onednn")
    assert np.array_equal(got.numpy().view(np.int32), want_onednn.view(np.int32))
    da = (a.float().numpy() * f32(0.1)).astype(np.float64)  # one float32 rounding per element
    db = (b.float().numpy() * f32(0.3)).astype(np.float64)
    want_fallback = (da @ db).astype(f32)  # a sum of at most 32 products of 24-bit values: rounded once here
    fallback = scaled_mm(a, b, sa, sb, out_dtype=torch.float32, accumulator="cpu_reference")
    assert np.abs(fallback.numpy() - want_fallback).max() <= np.abs(want_fallback).max() * 2**-20
    assert not torch.equal(got, fallback), "the two kernels' epilogues must differ on these scales"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float64"])
def test_onednn_model_takes_any_float_scale_as_item_float(dtype: str) -> None:
    a, b, _ = _int_operands()
    s = torch.tensor(1 / 3, dtype=torch.float64).to(getattr(torch, dtype))
    got = scaled_mm(a, b, s, s, out_dtype=torch.float32, accumulator="cpu_onednn")
    s32 = torch.tensor(float(s), dtype=torch.float64).float()  # C++ item<float>(): nearest float32
    assert torch.equal(got, scaled_mm(a, b, s32, s32, out_dtype=torch.float32, accumulator="cpu_onednn"))
    with pytest.raises(ValueError, match="Invalid scaling configuration"):  # the fallback refuses them
        scaled_mm(a, b, s, s, out_dtype=torch.float32, accumulator="cpu_reference")


def test_onednn_model_refuses_what_torch_never_sends_it() -> None:
    a, b, _ = _int_operands()
    with pytest.raises(ValueError, match="one float scale per operand .* accumulator 'cpu_reference'"):
        scaled_mm(a, b, torch.ones(16, 1), torch.ones(1, 16), out_dtype=torch.float32, accumulator="cpu_onednn")
    with pytest.raises(ValueError, match="pass out_dtype with scale_result"):
        scaled_mm(a, b, ONE, ONE, scale_result=torch.tensor(2.0), accumulator="cpu_onednn")


@pytest.mark.parametrize(("out", "onednn_code", "fallback_code"), [(E4, 0x7F, 0x7E), (E5, 0x7C, 0x7C)])
def test_fp8_output_overflow_nan_on_onednn_saturated_or_inf_on_the_fallback(out, onednn_code, fallback_code) -> None:  # noqa: ANN001
    """oneDNN converts without saturating (``float8.cpp``: E4M3 overflow -> NaN, E5M2 -> Inf); the fallback
    casts with torch's ``.to()`` (torch 2.13: E4M3 saturates to 448, E5M2 overflows to Inf)."""
    a = torch.full((16, 32), 448.0).to(E4)
    b = torch.full((16, 32), 448.0).to(E4).t()
    on = scaled_mm(a, b, ONE, ONE, out_dtype=out, accumulator="cpu_onednn").view(torch.uint8)
    fb = scaled_mm(a, b, ONE, ONE, out_dtype=out, accumulator="cpu_reference").view(torch.uint8)
    assert (on == onednn_code).all()
    if TORCH_2_13:
        assert (fb == fallback_code).all()
    with fallback_kernel():
        native = torch._scaled_mm(a, b, ONE, ONE, out_dtype=out).view(torch.uint8)
    assert torch.equal(fb, native)


def test_scale_result_divides_on_onednn_and_multiplies_by_the_reciprocal_on_the_fallback() -> None:
    """Row 0 sums to 175: / 7 is 25, the E4M3 tie between 24 and 26 (-> 24, even mantissa); * fl32(1/7) is a
    hair above it (-> 26).  The other rows are random integers."""
    a, b, exact = _int_operands(seed=3)
    a = a.float()
    a[0] = 0.0
    a[0, :2] = torch.tensor([160.0, 15.0])
    bf = b.float()
    bf[:2, 0] = 1.0
    a, b = a.to(E4), bf.t().contiguous().to(E4).t()
    sr = torch.tensor(7.0)
    f32 = np.float32
    d = (a.float().double() @ b.float().double()).numpy().astype(f32)
    from fp8sim import encode

    want_on = encode((d / f32(7)).astype(f32), "e4m3", saturate=False)
    want_fb = encode((d * (f32(1) / f32(7))).astype(f32), "e4m3", saturate=True)
    assert (want_on[0, 0], want_fb[0, 0]) == (0x5C, 0x5D)  # 24 and 26
    on = scaled_mm(a, b, ONE, ONE, scale_result=sr, out_dtype=E4, accumulator="cpu_onednn")
    fb = scaled_mm(a, b, ONE, ONE, scale_result=sr, out_dtype=E4, accumulator="cpu_reference")
    assert np.array_equal(on.view(torch.uint8).numpy(), want_on)
    assert np.array_equal(fb.view(torch.uint8).numpy(), want_fb)
    with fallback_kernel():
        native = torch._scaled_mm(a, b, ONE, ONE, scale_result=sr, out_dtype=E4)
    assert torch.equal(fb.view(torch.uint8), native.view(torch.uint8))


def test_onednn_kernel_on_this_host_equals_the_model_where_the_sum_is_exact() -> None:
    """Only an AVX-512-FP16/AMX host runs oneDNN: there, integer operands (exact sums in any order), a
    bfloat16 scale pair and a bias give the model's bits; the summation order is never claimed."""
    if torch_cpu_kernel() != "onednn":
        pytest.skip("this host's torch CPU _scaled_mm is the fallback (no AMX-INT8): nothing of oneDNN to compare")
    a, b, _ = _int_operands(16, 64, 16, seed=4)
    sa, sb = torch.tensor(0.5).bfloat16(), torch.tensor(0.25).bfloat16()
    bias = torch.randn(16).bfloat16()
    native = torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.bfloat16)
    ours = scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.bfloat16, accumulator="cpu_onednn", strict=False)
    assert torch.equal(native.view(torch.int16), ours.view(torch.int16))
