"""Arguments of the scaling entry points: every refusal names the argument and the allowed values (TE's
wording where TE has one), and the documented defaults hold: TE's ``Float8BlockScaling`` scales are powers of
two by default (``power_2_scale``), 1x1 blocks are allowed, NVFP4 role copies take the same
``reference_zero_handling`` and ``seed + 1 (mod 2^64)`` for the columnwise copy."""

from __future__ import annotations

import numpy as np
import pytest

from fp8sim.recipe import DelayedScaling
from fp8sim.scaling.block import input_dtype_max, quantize_block_scaling
from fp8sim.scaling.delayed import DelayedScaler
from fp8sim.scaling.nvfp4 import NVFP4QParams, nvfp4_role_settings, quantize_nvfp4, quantize_nvfp4_role

X = np.linspace(-3, 3, 4 * 128, dtype=np.float32).reshape(4, 128)


@pytest.mark.parametrize(
    ("kw", "exc", "msg"),
    [
        ({"block_size": 0}, ValueError, r"^block_size must be an int in \[1, 65536\] \(TE uses 128\), got 0$"),
        (
            {"block_size": 1 << 20},
            ValueError,
            r"^block_size must be an int in \[1, 65536\] \(TE uses 128\), got 1048576",
        ),
        ({"eps": -1.0}, ValueError, r"^eps must be a number >= 0.0, got -1.0$"),
        ({"eps": float("inf")}, ValueError, r"^eps must be a finite number, got inf$"),
        ({"block_dim": True}, ValueError, r"^block_dim must be 1 \(1x128\) or 2 \(128x128\); got True$"),
    ],
)
def test_block_scaling_arguments_are_named(kw: dict, exc: type, msg: str) -> None:
    with pytest.raises(exc, match=msg):
        quantize_block_scaling(X, **kw)


def test_block_scaling_defaults_e4m3_power_of_two_scales_and_allows_1x1_blocks() -> None:
    q = quantize_block_scaling(X)
    assert q.fmt.name == "e4m3" and q.block == (1, 128)
    amax = np.abs(X).max(axis=1)  # scale = 448 / amax, then the power of two at or below it (TE's default)
    want = [2.0 ** -np.floor(np.log2(np.float32(448) / a)) for a in amax]
    assert q.scales.reshape(-1).tolist() == want and want[0] == 1 / 128
    q1 = quantize_block_scaling(X[:1, :4], block_size=1, pow2=False)
    assert q1.block == (1, 1) and q1.scales.shape == (1, 4)
    with pytest.raises(ValueError, match=r"^input dtype must be one of float32, bfloat16, float16; got 'int8'$"):
        input_dtype_max("int8")


def test_nvfp4_role_arguments_are_named() -> None:
    with pytest.raises(ValueError, match=r"^unknown NVFP4 role 'x'; known: input, weight, grad$"):
        nvfp4_role_settings("x")
    for name in ("disable_rht", "disable_stochastic_rounding", "disable_2d_quantization"):
        with pytest.raises(TypeError, match=rf"^{name} must be True or False, got 1$"):
            nvfp4_role_settings("grad", **{name: 1})
    with pytest.raises(TypeError, match=r"^random_hadamard_transform must be True or False, got 1$"):
        NVFP4QParams(random_hadamard_transform=1)
    with pytest.raises(TypeError, match=r"^role must be one of input, weight, grad or an NVFP4QParams; got int$"):
        quantize_nvfp4_role(X, 3)
    with pytest.raises(ValueError, match=r"^seed is used only when the role has stochastic rounding$"):
        quantize_nvfp4_role(X, "weight", seed=1)


@pytest.mark.torch  # the grad role's columnwise copy takes the Hadamard transform, which runs in torch
def test_nvfp4_role_copies_share_the_zero_rule_and_seed_plus_one_wraps() -> None:
    zeros = np.zeros((16, 32), np.float32)
    te = quantize_nvfp4_role(zeros, "weight")
    assert te.rowwise.global_scale == te.columnwise.global_scale == 1.0  # TE's kernel: amax 0 -> S_enc 1
    ref = quantize_nvfp4_role(zeros, "weight", reference_zero_handling=True)
    want = quantize_nvfp4(zeros, reference_zero_handling=True).global_scale
    assert want != 1.0 and ref.rowwise.global_scale == ref.columnwise.global_scale == want
    x = np.random.default_rng(4).standard_normal((16, 32)).astype(np.float32)
    grad = quantize_nvfp4_role(x, "grad", seed=2**64 - 1)  # numpy input; columnwise seed wraps to 0
    col = quantize_nvfp4(np.ascontiguousarray(x.T), rht=True, stochastic=True, seed=0)
    np.testing.assert_array_equal(grad.columnwise.codes, col.codes)


def test_delayed_index_is_named() -> None:
    s = DelayedScaler(DelayedScaling(), n=2)
    with pytest.raises((TypeError, ValueError), match=r"^index must be"):
        s.record(1.5, np.ones(2, np.float32))
    with pytest.raises(IndexError, match=r"^quantizer index 2 out of range for n=2$"):
        s.record(2, np.ones(2, np.float32))


def test_block_scaling_flags_ranks_dtypes_and_eps() -> None:
    for kw, msg in (({"pow2": "yes"}, "pow2 must be True or False, got 'yes'"), ({"columnwise": 1}, "columnwise must")):
        with pytest.raises(ValueError, match=rf"^{msg}"):
            quantize_block_scaling(X, **kw)
    with pytest.raises(ValueError, match=r"^block scaling needs a tensor with at least one dimension$"):
        quantize_block_scaling(np.float32(1.0))
    with pytest.raises(ValueError, match=r"^128x128 blocks need a 2-D tensor \(flatten leading dims first\); got"):
        quantize_block_scaling(X[0], block_dim=2)
    with pytest.raises(ValueError, match=r"^columnwise blocks need a 2-D tensor \(flatten leading dims first\); got"):
        quantize_block_scaling(X[0], columnwise=True)
    one_d = quantize_block_scaling(X[0])  # 1-D input: one 1x128 block; float64 input: the float32 value_for_inf
    assert one_d.block == (128,) and one_d.dtype == "float32"
    q64 = quantize_block_scaling(X.astype(np.float64))
    assert q64.dtype == "float64" and np.array_equal(q64.codes, quantize_block_scaling(X).codes)
    qe = quantize_block_scaling(X, eps=1000.0, pow2=False)  # amax below eps: scale 448 / 1000
    assert (qe.scales == np.float32(1) / (np.float32(448) / np.float32(1000))).all()
