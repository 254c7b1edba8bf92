"""A TE ``Float8Tensor`` passed into ``Linear`` is used as it is (issue 25): TE ``module/linear.py`` skips the
INPUT quantizer for a ``QuantizedTensorStorage`` input (``if not isinstance(inputmat, QuantizedTensorStorage):
inputmat = input_quantizer(inputmat)``), so the GEMM reads the tensor's own codes and ``scale_inv`` and its
amax joins no amax history.

The oracle is exact arithmetic: every input value is twice an E4M3 value (``scale_inv`` 2), every weight
an E4M3 value (delayed scaling's first step casts with scale 1), so each product and each sum of 32 of
them is exact in float32 whatever the order of the sum; ml_dtypes decodes the codes.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from fp8sim.testing.oracles import require

torch = require("torch")

import fp8sim.pytorch as te  # noqa: E402
from fp8sim.pytorch.constants import DType  # noqa: E402
from fp8sim.pytorch.tensor.float8_tensor import Float8Quantizer  # noqa: E402
from fp8sim.recipe import DelayedScaling  # noqa: E402

E4M3_BIG = np.array([128, 160, 192, 224, 256, 320, 384, 448], np.float32)  # E4M3 values (spec 1.1 table)


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(25)
    x = rng.choice(E4M3_BIG, size=(8, 32)) * rng.choice([-2.0, 2.0], size=(8, 32))  # up to 896: past E4M3's max
    w = rng.choice(np.array([0.0, 0.5, 1.0, 2.0, -0.5, -1.0, -2.0], np.float32), size=(16, 32))
    return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(w.astype(np.float32))


def _float8(x: torch.Tensor) -> torch.Tensor:
    q = Float8Quantizer(scale=torch.tensor([0.5]), amax=torch.zeros(1), fp8_dtype=DType.kFloat8E4M3)
    return q(x)


def test_float8_tensor_input_is_used_as_it_is_not_quantized_again() -> None:
    x, w = _inputs()
    xf = _float8(x)
    codes = xf._data.numpy().view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    assert float(xf._scale_inv) == 2.0 and np.array_equal(codes * 2.0, x.numpy())  # the input is exact
    want = (codes * 2.0) @ w.numpy().astype(np.float64).T  # exact: integers and halves far below 2^24
    lin = te.Linear(32, 16, bias=False)
    with torch.no_grad():
        lin.weight.copy_(w)
    with te.autocast(enabled=True, recipe=DelayedScaling()):
        y = lin(xf)
    got = y.detach().numpy()
    assert np.array_equal(got, want.astype(np.float32)), f"max |diff| {np.abs(got - want).max()}"


def test_float8_tensor_input_leaves_the_input_amax_history_alone() -> None:
    """TE runs no INPUT quantizer, so the INPUT slot's amax history stays zero and its scale stays 1 after
    the update (TE keeps the scale where the amax is 0); the WEIGHT slot is quantized and updated."""
    x, w = _inputs()
    lin = te.Linear(32, 16, bias=False)
    with torch.no_grad():
        lin.weight.copy_(w)
    with te.autocast(enabled=True, recipe=DelayedScaling()):
        lin(_float8(x))
    fwd = lin.fp8_gemms["gemm"].fwd
    assert not fwd.amax_history[:, 0].any() and fwd.scale[0] == 1.0
    assert fwd.amax_history[:, 1].max() == 2.0 and fwd.scale[1] == np.float32(448.0 / 2.0)


def test_float8_tensor_input_gets_a_high_precision_gradient() -> None:
    x, w = _inputs()
    xf = _float8(x).requires_grad_()
    lin = te.Linear(32, 16, bias=False)
    with torch.no_grad():
        lin.weight.copy_(w)
    with te.autocast(enabled=True, recipe=DelayedScaling()):
        y = lin(xf)
    y.sum().backward()
    assert xf.grad is not None and xf.grad.shape == x.shape and xf.grad.dtype == torch.float32
