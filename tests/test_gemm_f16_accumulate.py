"""Float16 accumulation (``mma.sync ... .f16``): the Ada rule against real-GPU measurements, the
float16 chain of ``ada_fast_f16`` in GEMMs, and the refusal where the rule is not known.

Evidence: ``tests/data/hardware/Ada_E4M3.npz`` / ``Ada_E5M2.npz`` (Khattak & Mikaitis, an RTX 1000 Ada:
``models/AdaTC.m`` lines 3-4; ``model_validation/CUDA/mma_fp8_output_fp16.cu`` issues
``mma.sync.aligned.m16n8k32.row.col.f16.{e4m3,e5m2}.{e4m3,e5m2}.f16`` with ``c = __float2half(cc)``, so the
GPU received the published float32 c rounded to float16).  The L40S set has no float16 outputs.
"""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from fp8sim.gemm import PROFILES, Accumulator, dot_add, get_accumulator, scaled_mm
from fp8sim.testing.oracles import require

DATA = Path(__file__).parent / "data" / "hardware"
DT = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}


def _ada(fmt: str) -> dict:
    z = dict(np.load(DATA / f"Ada_{fmt.upper()}.npz"))
    for x in "ab":
        codes = z[x].astype(DT[fmt])
        assert np.array_equal(codes.astype(np.float32), z[x])
        z[x] = codes.view(np.uint8)
    return z


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_ada_mma_with_float16_output_reproduces_every_measured_f16_result(fmt: str) -> None:
    z = _ada(fmt)
    got = dot_add(z["a"], z["b"], z["c"].astype(np.float16), model="ada_mma", a_format=fmt, b_format=fmt,
                  out_dtype="float16")  # fmt: skip
    want = z["d16"].view(np.float32).astype(np.float16)  # exact: float16 values widened for printing
    assert np.array_equal(want.astype(np.float32).view(np.uint32), z["d16"])
    bad = np.flatnonzero(got.view(np.uint16) != want.view(np.uint16))
    assert bad.size == 0, f"{bad.size} differ, first case {bad[:1]}"
    # the same instruction accumulating in float32 (its .f32 variant) is measured too: a different rule
    f32 = dot_add(z["a"], z["b"], z["c"], model="ada_mma", a_format=fmt, b_format=fmt)
    assert np.array_equal(f32.view(np.uint32), z["d32"])
    assert (f32.astype(np.float16).view(np.uint16) != want.view(np.uint16)).sum() > 100


def _codes(rng: np.random.Generator, shape: tuple, fmt: str, scale: float) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32).astype(DT[fmt]).view(np.uint8)


def _chain_reference(a: np.ndarray, b: np.ndarray, fmt: str, every: int | None) -> np.ndarray:
    """Each k32 instruction gets the previous float16 d as c (``mma.sync ... .f16`` chained through D);
    with ``every``, the chain restarts from 0 every ``every`` K and is added into a float32 register."""
    m, k = a.shape
    n = b.shape[1]
    out = np.zeros((m, n), np.float32)
    for i in range(m):
        for j in range(n):
            reg, d = np.float32(0), np.float16(0)
            for k0 in range(0, k, 32):
                if every and k0 and k0 % every == 0:
                    reg, d = np.float32(reg + np.float32(d)), np.float16(0)
                d = dot_add(a[i, k0 : k0 + 32], b[k0 : k0 + 32, j], d, model="ada_mma", a_format=fmt, b_format=fmt,
                            out_dtype="float16")  # fmt: skip
            out[i, j] = np.float32(reg + np.float32(d)) if every else np.float32(d)
    return out


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("every", [None, 64])
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_ada_fast_f16_gemm_carries_float16_between_instructions(fmt: str, every: int | None, backend: str) -> None:
    if backend == "torch":
        require("torch")
    rng = np.random.default_rng(7)
    a = _codes(rng, (4, 128), fmt, 3.0)
    b = _codes(rng, (128, 5), fmt, 2.0)
    a[0] = np.array(448 if fmt == "e4m3" else 2048, np.float32).astype(DT[fmt]).view(np.uint8)  # overflows float16
    b[:, 0] = a[0, 0]
    acc = get_accumulator("ada_fast_f16")
    acc = acc if every is None else acc.with_promotion(every)
    got = scaled_mm(a, b, np.float32(1), np.float32(1), out_dtype="float32", accumulator=acc, a_format=fmt,
                    b_format=fmt, strict=False, backend=backend)  # fmt: skip
    want = _chain_reference(a, b, fmt, every)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.isinf(got[0, 0])
    f32 = scaled_mm(a, b, np.float32(1), np.float32(1), out_dtype="float32", accumulator="ada_fast", a_format=fmt,
                    b_format=fmt, strict=False)  # fmt: skip
    assert (f32 != got).sum() > 5  # float16 accumulation is not the float32 chain


def test_torch_and_numpy_float16_chains_agree_on_special_codes() -> None:
    require("torch")
    rng = np.random.default_rng(3)
    a = _codes(rng, (6, 64), "e5m2", 4.0)
    b = _codes(rng, (64, 7), "e5m2", 4.0)
    a[1, 3], a[2, 40], b[5, 4] = 0x7C, 0xFE, 0x7D  # +Inf, NaN, NaN
    kw = {"out_dtype": "float32", "accumulator": "ada_f16", "a_format": "e5m2", "b_format": "e5m2", "strict": False}
    ref = scaled_mm(a, b, np.float32(1), np.float32(1), backend="numpy", **kw)
    got = scaled_mm(a, b, np.float32(1), np.float32(1), backend="torch", **kw)
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))
    assert np.isnan(ref).any() and np.isinf(ref).any()


@pytest.mark.parametrize("instruction", ["hopper_wgmma", "blackwell_mma", "blackwell_tcgen05"])
def test_float16_accumulation_is_refused_where_the_rule_is_not_known(instruction: str) -> None:
    with pytest.raises(ValueError, match=r"accumulate='float16' is modelled for ada_mma .*Hopper and Blackwell"):
        Accumulator("mine", "tensor_core", instruction, accumulate="float16")
    with pytest.raises(ValueError, match="accumulate must be 'float32' or 'float16'"):
        Accumulator("mine", "tensor_core", "ada_mma", accumulate="bfloat16")


def test_profiles_name_their_float16_accumulate_model() -> None:
    for name in ("rtx4060_cublaslt_12_8", "l40s"):
        assert PROFILES[name].accumulator_for(False, accumulate="float16") == "ada_fast_f16"
        assert PROFILES[name].accumulator_for(False) == "ada_split"
    for name in ("h100_pcie_cublaslt_12_8", "h200", "b200"):
        with pytest.raises(ValueError, match=f"profile '{name}' has no float16-accumulate model"):
            PROFILES[name].accumulator_for(True, accumulate="float16")
