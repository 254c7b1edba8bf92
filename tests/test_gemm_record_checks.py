"""User-built records are checked when built, each refusal naming the field and its allowed values:
``InstructionModel`` (a tensor-core instruction), ``Accumulator``, ``DeviceProfile`` and
``DeviceProfile.with_splits``."""

from __future__ import annotations

import pytest

from fp8sim.gemm import DeviceProfile, get_profile
from fp8sim.gemm.accumulators import Accumulator
from fp8sim.gemm.instructions import InstructionModel

_MODELS = (
    "hopper_wgmma, ada_mma, blackwell_tcgen05, blackwell_mma, blackwell_mma_km, blackwell_mxf8f6f4, blackwell_mxf4nvf4"
)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"rounding": "rz"}, "rounding must be 'truncate' or 'rn'; got 'rz'"),
        ({"frac_bits": None}, "frac_bits=None (no alignment limit) needs rounding='rn'"),
        ({"frac_bits": -1}, "frac_bits must be None or an integer in [0, 60]; got -1"),
        ({"frac_bits": 61}, "frac_bits must be None or an integer in [0, 60]; got 61"),
        ({"k": 33, "halves": 2}, "k=33 must be a multiple of halves=2"),
        ({"scale_format": "e8m0"}, "scale_format and scale_block go together"),
        ({"scale_block": 32}, "scale_format and scale_block go together"),
        ({"scale_format": "ue8m0", "scale_block": 32}, "scale_format must be None, 'e8m0' or 'ue4m3'; got 'ue8m0'"),
    ],
)
def test_instruction_model_refusals(kw: dict, message: str) -> None:
    args = {"name": "mine", "k": 32, "frac_bits": 13, **kw}
    with pytest.raises(ValueError) as err:
        InstructionModel(**args)
    assert str(err.value) == message


@pytest.mark.parametrize(
    "kw",
    [
        {"frac_bits": 0},
        {"frac_bits": 60},
        {"frac_bits": None, "rounding": "rn"},
        {"scale_format": "e8m0", "scale_block": 32},
        {"scale_format": "ue4m3", "scale_block": 16},
    ],
)
def test_instruction_model_takes_the_edges(kw: dict) -> None:
    args = {"name": "mine", "k": 32, "frac_bits": 13, **kw}
    model = InstructionModel(**args)
    assert all(getattr(model, key) == value for key, value in kw.items())


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"kind": "fp16"}, "kind must be one of 'exact', 'dequantized_fp32', 'fp32_matmul', 'tensor_core'; got 'fp16'"),
        ({"kind": "tensor_core"}, f"instruction must be one of {_MODELS}; got None"),
        ({"kind": "tensor_core", "instruction": "volta_mma"}, f"instruction must be one of {_MODELS}; got 'volta_mma'"),
        (
            {"kind": "tensor_core", "instruction": "hopper_wgmma", "promote_every": 48},
            "promote_every must be a positive multiple of the instruction's K=32",
        ),
        ({"kind": "exact", "accumulate": "bfloat16"}, "accumulate must be 'float32' or 'float16'; got 'bfloat16'"),
    ],
)
def test_accumulator_refusals(kw: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        Accumulator("mine", **kw)
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"f16_accumulate": "hopper_fast"}, "f16_accumulate must name a float16-accumulate preset; got 'hopper_fast'"),
        ({"epilogue": "beta"}, "epilogue must be 'alpha' or 'sequential', got 'beta'"),
        ({"caller": "cublas"}, "caller must be one of torch._scaled_mm, transformer_engine; got 'cublas'"),
    ],
)
def test_device_profile_refusals(kw: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        DeviceProfile("mine", "hopper_fast", "hopper_split", **kw)
    assert str(err.value) == message


def test_device_profile_takes_both_epilogues_and_callers() -> None:
    for epilogue in ("alpha", "sequential"):
        assert DeviceProfile("mine", "hopper_fast", "hopper_split", epilogue=epilogue).epilogue == epilogue
    for caller in ("torch._scaled_mm", "transformer_engine"):
        assert DeviceProfile("mine", "hopper_fast", "hopper_split", caller=caller).caller == caller


@pytest.mark.parametrize("key", [[16, 16, 64], (16, 16), (16, 16, 64, "float32"), (16, 16, 64, "float32", True, 1)])
def test_with_splits_keys_are_3_or_5_tuples(key: object) -> None:
    prof = get_profile("h100_pcie_cublaslt_12_8")
    with pytest.raises(ValueError) as err:
        prof.with_splits(_mapping(key))
    assert str(err.value) == f"splits keys must be (M, N, K) or (M, N, K, out, use_fast_accum); got {key!r}"


def _mapping(key: object) -> object:
    """A mapping whose one key may be unhashable (a list), as a user's dict-like could hold."""

    class One:
        def items(self):  # noqa: ANN202
            return [(key, (1, "none"))]

    return One()


def test_with_splits_takes_3_and_5_tuples() -> None:
    prof = get_profile("h100_pcie_cublaslt_12_8").with_splits(
        {(16, 16, 64): (2, "contiguous"), (16, 16, 128, "float32", True): (1, "none")}
    )
    assert prof.split_for(16, 16, 64, "bfloat16", False) == (2, "contiguous")
    assert prof.split_for(16, 16, 128, "float32", True) == (1, "none")


def test_a_users_split_rule_may_return_a_plain_pair() -> None:
    from fp8sim.gemm.profiles import SplitChoice

    prof = DeviceProfile(
        "mine", "hopper_fast", "hopper_split", split_rule=lambda m, n, k, out, fast, fa, fb: (3, "serial")
    )
    got = prof.decide(16, 16, 4096, "bfloat16", True)
    assert got == SplitChoice(3, "serial", "rule", "the profile's split_rule")
    assert prof.split_for(16, 16, 4096, "bfloat16", False) == (3, "serial")


def test_a_profile_without_a_rule_names_the_call_and_the_ways_out() -> None:
    from fp8sim.gemm import SplitKUnknownError

    prof = DeviceProfile("mine", "hopper_fast", "hopper_split")
    call = "M=16 N=16 K=4096 (e4m3 x e4m3 -> bfloat16, use_fast_accum=True)"
    with pytest.raises(SplitKUnknownError) as err:
        prof.split_for(16, 16, 4096, "bfloat16", True)
    assert str(err.value) == (
        f"profile 'mine' does not know cuBLAS's split-K for {call}; pass split_k=(S, scheme) (contiguous, serial or "
        "pairwise) or profile.with_splits({(16, 16, 4096): (S, scheme)}) with the split your GPU used"
    )
    with pytest.raises(SplitKUnknownError) as err:
        prof.decide(16, 16, 4096, "bfloat16", True, what="fc1 fprop")
    assert str(err.value) == (
        f"profile 'mine' does not know cuBLAS's split-K for fc1 fprop: {call}. Ways out: run with "
        "accumulator=get_profile('mine').with_splits({(16, 16, 4096): (S, scheme)}) giving the split your GPU used "
        "(scheme contiguous, serial or pairwise; (1, 'none') if it does not split), or with an instruction preset "
        "(unsplit GEMMs); `fp8sim explain` lists every GEMM's decision at once"
    )
