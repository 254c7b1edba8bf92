"""Device profiles (``fp8sim.gemm.profiles``): accumulator + split-K decision per shape, bit for bit
against mmaemu 0.1.0's ``splitk="auto"`` on the GPUs it recorded; unknown splits raise."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fp8sim.gemm import scaled_mm
from fp8sim.gemm.profiles import PROFILES, SplitKUnknownError, get_profile
from fp8sim.testing.oracles import require

torch = require("torch")
torch.set_num_threads(1)


def _operands(m: int, n: int, k: int, seed: int = 0):  # noqa: ANN202
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, k, generator=g) * 40).clamp(-448, 448).to(torch.float8_e4m3fn)
    w = (torch.randn(n, k, generator=g) * 40).clamp(-448, 448).to(torch.float8_e4m3fn)
    return x, w.t(), torch.tensor(0.125), torch.tensor(0.5)


@pytest.mark.parametrize(
    ("profile", "mmaemu_profile", "shape", "fast"),
    [
        ("h100_pcie_cublaslt_12_8", "hopper", (16, 128, 8192), True),  # S = 3 in the H100 table
        ("h100_pcie_cublaslt_12_8", "hopper", (16, 64, 1920), False),  # unsplit
        ("rtx4060_cublaslt_12_8", "ada", (16, 48, 3072), False),  # S = 3 pairwise
        ("rtx4060_cublaslt_12_8", "ada", (16, 16, 1024), True),  # unsplit
    ],
)
def test_profile_matches_mmaemu_auto_split(profile: str, mmaemu_profile: str, shape: tuple, fast: bool) -> None:
    mmaemu = require("mmaemu")
    args = _operands(*shape, seed=shape[2])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = mmaemu.scaled_mm(*args, out_dtype=torch.bfloat16, use_fast_accum=fast, profile=mmaemu_profile)
    got = scaled_mm(*args, out_dtype=torch.bfloat16, use_fast_accum=fast, profile=profile)
    assert np.array_equal(got.view(torch.int16).numpy(), ref.view(torch.int16).numpy())


def test_recorded_profile_reports_the_split_it_uses() -> None:
    require("mmaemu")
    p = get_profile("h100_pcie_cublaslt_12_8")
    assert p.split_for(16, 128, 8192, "bfloat16", True) == (3, "contiguous")
    assert p.split_for(16, 64, 1920, "bfloat16", True) == (1, "none")
    assert p.accumulator_for(True) == "hopper_fast" and p.accumulator_for(False) == "hopper_split"


def test_shape_outside_the_recorded_table_raises_naming_the_shape() -> None:
    require("mmaemu")
    p = get_profile("h100_pcie_cublaslt_12_8")
    with pytest.raises(SplitKUnknownError, match="M=16 N=32 K=2048"):
        p.split_for(16, 32, 2048, "bfloat16", True)


@pytest.mark.parametrize("name", ["h100_sxm", "h200", "l40s", "b200"])
def test_profiles_without_a_split_rule_raise_and_accept_a_user_split(name: str) -> None:
    args = _operands(16, 16, 1024)
    with pytest.raises(SplitKUnknownError, match="M=16 N=16 K=1024"):
        scaled_mm(*args, out_dtype=torch.float32, profile=name)
    scheme = "contiguous" if name != "l40s" else "serial"
    p = PROFILES[name].with_splits({(16, 16, 1024): (4, scheme)})
    got = scaled_mm(*args, out_dtype=torch.float32, profile=p)
    want = scaled_mm(*args, out_dtype=torch.float32, accumulator=p.split, split_k=(4, scheme))
    assert np.array_equal(got.view(torch.int32).numpy(), want.view(torch.int32).numpy())


def test_unknown_profile_and_bad_user_split_are_refused() -> None:
    with pytest.raises(ValueError, match="known: h100_pcie_cublaslt_12_8"):
        get_profile("a100")
    with pytest.raises(ValueError, match="split_k"):
        PROFILES["h200"].with_splits({(16, 16, 1024): (2, "diagonal")})


def test_is_profile_takes_a_profile_record_or_a_known_name_only() -> None:
    from fp8sim.gemm import DeviceProfile, is_profile

    assert all(is_profile(name) for name in PROFILES) and len(PROFILES) > 1
    assert is_profile(DeviceProfile("mine", "hopper_fast", "hopper_split"))  # a user's record, under no name
    for other in ("hopper_fast", "exact", "", "H100_PCIE_CUBLASLT_12_8", None, 0, [next(iter(PROFILES))]):
        assert not is_profile(other), other
