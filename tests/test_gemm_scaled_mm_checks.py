"""``scaled_mm`` argument checks (issue 18 item 8): clear errors naming the argument and what is
accepted, in torch 2.13's words; torch's own behaviour where it differs (read against the installed
torch: its CPU fallback kernel is the oracle for the messages it shares with CUDA; on AVX-512-FP16/AMX
hosts torch runs oneDNN instead, so the oracle calls run under ``fallback_kernel()``)."""

from __future__ import annotations

import numpy as np
import pytest

from fp8sim.gemm import scaled_mm
from fp8sim.gemm.torch_cpu import fallback_kernel
from fp8sim.testing.oracles import require

torch = require("torch")
torch.set_num_threads(1)
E4 = torch.float8_e4m3fn
ONE = torch.tensor(1.0)


def _ab(m: int = 16, k: int = 32, n: int = 16):  # noqa: ANN202
    g = torch.Generator().manual_seed(0)
    return (torch.randn(m, k, generator=g) * 10).to(E4), (torch.randn(n, k, generator=g) * 10).to(E4).t()


def _torch_error(fn) -> tuple[type, str]:  # noqa: ANN001
    with pytest.raises(Exception) as info:  # noqa: PT011 - whatever torch raises is the oracle
        fn()
    return info.type, str(info.value)


def test_none_scales_are_a_type_error_naming_the_argument_as_torch() -> None:
    a, b = _ab()
    t_type, t_msg = _torch_error(lambda: torch._scaled_mm(a, b, None, ONE))
    with pytest.raises(TypeError) as info:
        scaled_mm(a, b, None, ONE)
    assert t_type is TypeError and str(info.value).split("(")[1:] == t_msg.split("(")[1:]  # same text after the name
    with pytest.raises(TypeError, match="argument 'scale_b' \\(position 4\\) must be a float32 scale"):
        scaled_mm(np.zeros((16, 32), np.uint8), np.zeros((32, 16), np.uint8), 1.0, None, a_format="e4m3",
                  b_format="e4m3")  # fmt: skip


def test_mixed_numpy_and_torch_operands_are_refused() -> None:
    a, _ = _ab()
    with pytest.raises(TypeError, match="mat1 and mat2 must both be torch float8 tensors or both numpy code arrays"):
        scaled_mm(a, np.zeros((32, 16), np.uint8), ONE, ONE, b_format="e4m3")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float64"])
def test_non_float32_scales_are_an_invalid_scaling_configuration_as_torch(dtype: str) -> None:
    a, b = _ab()
    s = ONE.to(getattr(torch, dtype))
    with fallback_kernel():
        t_type, t_msg = _torch_error(lambda: torch._scaled_mm(a, b, s, s, out_dtype=torch.float32))
    with pytest.raises(t_type) as info:
        scaled_mm(a, b, s, s, out_dtype=torch.float32)
    msg = str(info.value)
    assert msg.startswith("Invalid scaling configuration.") and t_msg.startswith("Invalid scaling configuration.")
    assert t_msg.splitlines()[1] in msg  # torch's TensorWise line
    assert "For BlockWise 1x128 / 128x128" in msg and "For MX (1x32)" in msg  # fp8sim's further layouts


def test_bad_scale_layout_lists_the_accepted_layouts() -> None:
    a, b = _ab(16, 32, 48)
    sa, sb = torch.ones(16, 2), torch.ones(1, 48)
    with fallback_kernel():
        _, t_msg = _torch_error(lambda: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16))
    with pytest.raises(ValueError) as info:
        scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    assert t_msg.splitlines()[2] in str(
        info.value
    )  # RowWise: "scale_a should be (16, 1) and scale_b should be (1, 48)"


def test_wrong_bias_length_uses_torchs_message() -> None:
    a, b = _ab()
    bias = torch.zeros(5, dtype=torch.bfloat16)
    with fallback_kernel():
        _, t_msg = _torch_error(lambda: torch._scaled_mm(a, b, ONE, ONE, bias=bias, out_dtype=torch.bfloat16))
    with pytest.raises(RuntimeError) as info:
        scaled_mm(a, b, ONE, ONE, bias=bias, out_dtype=torch.bfloat16)
    assert str(info.value) == t_msg == "Bias must be size 16 but got 5"


def test_cuda_bias_dtype_message() -> None:
    """CUDA's check (torch ``aten/src/ATen/native/cuda/ScaledBlas.cpp``: "Bias must be BFloat16 or
    Half, but got "); torch's CPU kernel accepts a float32 bias, so the text is checked as written."""
    a, b = _ab()
    with pytest.raises(RuntimeError, match="^Bias must be BFloat16 or Half, but got Float$"):
        scaled_mm(a, b, ONE, ONE, bias=torch.zeros(16), out_dtype=torch.bfloat16)


@pytest.mark.parametrize("out", [torch.int32, "int8", "float64"])
def test_out_dtype_outside_the_allowed_set_names_out_dtype(out) -> None:  # noqa: ANN001
    a, b = _ab()
    with pytest.raises(ValueError, match="^out_dtype must be float32, bfloat16, float16 or an FP8 format"):
        scaled_mm(a, b, ONE, ONE, out_dtype=out)


def test_cpu_reference_ignores_scale_result_without_out_dtype_as_torchs_cpu_kernel() -> None:
    a, b = _ab()
    sr = torch.tensor(2.0)
    for out_dtype in (None, E4):
        with fallback_kernel():  # oneDNN (AMX hosts) reads out_dtype unset here: undefined behaviour
            native = torch._scaled_mm(a, b, ONE, ONE, scale_result=sr, out_dtype=out_dtype)
        ours = scaled_mm(a, b, ONE, ONE, scale_result=sr, out_dtype=out_dtype, accumulator="cpu_reference")
        assert torch.equal(ours.view(torch.uint8), native.view(torch.uint8)), out_dtype


# -- issue 29.5: one input normalisation before the checks -------------------------------------------
@pytest.mark.parametrize("strict", [True, False])
def test_nested_list_operands_give_the_array_result_in_both_strict_modes(strict: bool) -> None:
    rng = np.random.default_rng(3)
    a = rng.integers(0, 0x7F, (16, 32)).astype(np.uint8)  # positive finite E4M3 codes
    b = rng.integers(0, 0x7F, (32, 16)).astype(np.uint8)
    kw = dict(a_format="e4m3", b_format="e4m3", out_dtype="float32", strict=strict)
    want = scaled_mm(a, b, np.float32(0.5), np.float32(2.0), **kw)
    for sa, sb in ((0.5, 2.0), ([0.5], [2.0]), (np.float32(0.5), np.float32(2.0))):
        got = scaled_mm(a.tolist(), b.tolist(), sa, sb, **kw)
        assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want.view(np.uint32))
    rowwise = scaled_mm(a.tolist(), tuple(map(tuple, b.tolist())), [[0.5]] * 16, [[2.0] * 16], **kw)
    assert np.array_equal(rowwise.view(np.uint32), want.view(np.uint32))


def test_list_bias_and_bad_list_inputs_are_named() -> None:
    a, b = np.full((16, 16), 0x38, np.uint8), np.full((16, 16), 0x38, np.uint8)  # 1.0 in E4M3
    kw = dict(a_format="e4m3", b_format="e4m3")
    out = scaled_mm(a, b, 1.0, 1.0, bias=[1.0] * 16, out_dtype="float32", strict=False, **kw)
    assert np.array_equal(out, np.full((16, 16), 17.0, np.float32))
    with pytest.raises(RuntimeError, match="Bias must be BFloat16 or Half, but got Float"):  # torch's words
        scaled_mm(a, b, 1.0, 1.0, bias=[1.0] * 16, out_dtype="bfloat16", **kw)
    with pytest.raises(RuntimeError, match="Bias must be size 16 but got 3"):
        scaled_mm(a, b, 1.0, 1.0, bias=[1.0] * 3, out_dtype="bfloat16", **kw)
    with pytest.raises(ValueError, match="mat1 is not a rectangular array"):
        scaled_mm([[1, 2], [3]], b, 1.0, 1.0, **kw)
    with pytest.raises(TypeError, match="mat2 must be a torch tensor, a numpy array or a nested list; got str"):
        scaled_mm(a, "b", 1.0, 1.0, **kw)
    with pytest.raises(TypeError, match="scale_a must hold numbers"):
        scaled_mm(a, b, ["x"], 1.0, **kw)
