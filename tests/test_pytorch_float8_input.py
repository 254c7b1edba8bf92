"""A TE ``Float8Tensor`` (and, below, an MXFP8 / FP8 block / NVFP4 tensor) passed into ``Linear`` is used
as it is (issue 25): TE ``module/linear.py`` skips the INPUT quantizer for a ``QuantizedTensorStorage`` input
(``if not isinstance(inputmat, QuantizedTensorStorage): inputmat = input_quantizer(inputmat)``), so the GEMM
reads the tensor's own codes and ``scale_inv`` and its amax joins no amax history.

The oracle is exact arithmetic: every input value is twice an E4M3 value (``scale_inv`` 2), every weight
an E4M3 value (delayed scaling's first step casts with scale 1), so each product and each sum of 32 of
them is exact in float32 whatever the order of the sum; ml_dtypes decodes the codes.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

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


# -- block-scaled TE tensors (MXFP8, FP8 block scaling, NVFP4) ----------------------------------------------
# TE module/linear.py 421-424 (2.20, d0067d0): any QuantizedTensorStorage input goes into the fprop GEMM as
# it is (its rowwise copy); the wgrad GEMM reads its columnwise copy (954-958, 1175-1177).  Each input below
# holds codes that quantizing its dequantized values again gives differently, so a module that re-quantizes
# it fails.  The references decode the stored bytes with ml_dtypes and the scale layouts TE documents, and
# sum in float64; every term is a short dyadic number, so float32 sums in any order are exact.  Each weight
# and gradient is exactly representable under its recipe (the module's quantization of it is the identity).

from fp8sim.pytorch.tensor.float8_blockwise_tensor import Float8BlockQuantizer  # noqa: E402
from fp8sim.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer  # noqa: E402
from fp8sim.pytorch.tensor.nvfp4_tensor import NVFP4Quantizer  # noqa: E402
from fp8sim.recipe import Float8BlockScaling, MXFP8BlockScaling, NVFP4BlockScaling  # noqa: E402

SMALL = np.array([0.0, 0.5, 1.0, 2.0, -0.5, -1.0, -2.0], np.float32)


def _linear(w: np.ndarray) -> te.Linear:
    lin = te.Linear(w.shape[1], w.shape[0], bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.from_numpy(w))
    return lin


def _run(lin: te.Linear, x: torch.Tensor, recipe: object, dy: np.ndarray) -> np.ndarray:
    with te.autocast(enabled=True, recipe=recipe):
        y = lin(x)
    y.backward(torch.from_numpy(dy))
    return y.detach().numpy()


def _check(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.dtype == np.float32
    bad = np.argwhere(got != want.astype(np.float32))
    assert bad.size == 0, f"{what}: first difference at {bad[0]}: got {got[tuple(bad[0])]}, want {want[tuple(bad[0])]}"


def _mx_input() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x (64, 64) as an E5M2 MXFP8 tensor under the E4M3 recipe: rows 0 and 32 and columns 0 and 32 hold 64, so
    every 32-block (either direction) has amax 64; the rest are E5M2 values near 2^-13, below E4M3's
    subnormal step at that block scale (2^-11), so an E4M3 re-quantization rounds them.  The weight is zero in
    columns 0 and 32, the gradient in rows 0 and 32: only the small values reach the checked sums."""
    rng = np.random.default_rng(251)
    x = rng.choice(np.array([1.0, 1.25, 1.5, 1.75]), size=(64, 64)) * rng.choice([-1, 1], size=(64, 64))
    x = (x * 2.0 ** rng.integers(-14, -11, size=(64, 64))).astype(np.float32)
    x[[0, 32], :] = 64.0
    x[:, [0, 32]] = 64.0
    w = rng.choice(SMALL, size=(16, 64))
    w[:, [0, 32]] = 0.0
    dy = rng.choice(SMALL, size=(64, 16))
    dy[[0, 32], :] = 0.0
    return x, w.astype(np.float32), dy.astype(np.float32)


def test_mxfp8_tensor_input_is_used_as_it_is_fprop_and_wgrad() -> None:
    x, w, dy = _mx_input()
    xt = MXFP8Quantizer(DType.kFloat8E5M2)(torch.from_numpy(x)).requires_grad_()
    e5m2 = lambda d: d.numpy().view(ml_dtypes.float8_e5m2).astype(np.float64)  # noqa: E731
    e8m0 = lambda s: np.exp2(s.numpy().astype(np.float64) - 127.0)  # noqa: E731
    # TE mxfp8_tensor_storage: both copies in the logical (m, k) shape; rowwise scales (m, k/32),
    # columnwise scales (m/32, k), padded
    row = e5m2(xt._rowwise_data) * np.repeat(e8m0(xt._rowwise_scale_inv[:64, :2]), 32, axis=1)
    col = e5m2(xt._columnwise_data) * np.repeat(e8m0(xt._columnwise_scale_inv[:2, :64]), 32, axis=0)
    assert np.array_equal(row, x) and np.array_equal(col, x)  # E5M2 holds x; E4M3 at these scales does not
    lin = _linear(w)
    got = _run(lin, xt, MXFP8BlockScaling(), dy)
    _check(got, row @ w.astype(np.float64).T, "MXFP8 fprop")
    _check(lin.weight.grad.numpy(), dy.astype(np.float64).T @ col, "MXFP8 wgrad")
    assert xt.grad is not None and xt.grad.shape == x.shape


def test_float8_blockwise_tensor_input_is_used_as_it_is_fprop_and_wgrad() -> None:
    """1x128 blocks, each copy's scale_inv multiplied by 3 in place (not a power of two: the recipe's
    power-of-two scales round such values again)."""
    rng = np.random.default_rng(252)
    x = rng.choice(np.arange(8, 16) / 8.0, size=(128, 128)) * rng.choice([-1, 1], size=(128, 128))
    w = rng.choice(SMALL, size=(16, 128)).astype(np.float32)
    dy = rng.choice(SMALL, size=(128, 16)).astype(np.float32)
    q = Float8BlockQuantizer(DType.kFloat8E4M3, rowwise=True, columnwise=True, block_scaling_dim=1)
    xt = q(torch.from_numpy(x.astype(np.float32))).requires_grad_()
    xt._rowwise_scale_inv.mul_(3.0)
    xt._columnwise_scale_inv.mul_(3.0)
    e4m3 = lambda d: d.numpy().view(ml_dtypes.float8_e4m3fn).astype(np.float64)  # noqa: E731
    # TE float8_blockwise_tensor_storage (1D): rowwise data (m, k), scales (k/128, m); columnwise data the
    # transpose (k, m), scales (m/128, k)
    row = e4m3(xt._rowwise_data) * xt._rowwise_scale_inv[0, :128].numpy().astype(np.float64)[:, None]
    col = e4m3(xt._columnwise_data).T * xt._columnwise_scale_inv[0, :128].numpy().astype(np.float64)[None, :]
    assert np.array_equal(row, 3 * x) and np.array_equal(col, 3 * x)
    lin = _linear(w)
    got = _run(lin, xt, Float8BlockScaling(), dy)
    _check(got, row @ w.astype(np.float64).T, "FP8 block fprop")
    _check(lin.weight.grad.numpy(), dy.astype(np.float64).T @ col, "FP8 block wgrad")


def _tiles(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """E2M1 values times a scale per 16x16 tile (1.75 for tile 0, else 2^-2..2^0), each tile's diagonal +-6:
    every 1x16 and 16x1 block has amax 6 x its tile scale, the tensor amax 10.5, so NVFP4's global scale
    is 256 and every block scale an exact E4M3 value: quantizing it (1D or 2D, either copy) is exact."""
    c = rng.choice(np.array([0, 0.5, 1, 1.5, 2, 3, 4]), size=(rows, cols)) * rng.choice([-1, 1], size=(rows, cols))
    s = np.exp2(rng.integers(-2, 1, size=(rows // 16, cols // 16)).astype(np.float64))
    s[0, 0] = 1.75
    for r in range(rows):
        c[r, (r % 16) + 16 * np.arange(cols // 16)] = 6.0 * rng.choice([-1, 1])
    return (c * np.kron(s, np.ones((16, 16)))).astype(np.float32)


def _fp4_edit(data: torch.Tensor, keep: tuple[int, int], shape: tuple[int, int]) -> None:
    """Magnitude 6 -> 4 (E2M1 code 7 -> 6) outside the ``keep`` corner, in place: blocks whose amax was 6 x
    scale now peak at 4 x scale, which a fresh NVFP4 scale (amax / 6, E4M3) cannot hold exactly."""
    codes = _unpack(data, shape)
    mask = (codes & 7) == 7
    mask[: keep[0], : keep[1]] = False
    codes[mask] -= 1
    data.copy_(torch.from_numpy((codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)).reshape(data.shape))


def _unpack(data: torch.Tensor, shape: tuple[int, int]) -> np.ndarray:
    """TE's FP4 packing: element 2i in the low nibble, 2i+1 in the high nibble."""
    b = data.numpy().reshape(shape[0], shape[1] // 2)
    out = np.empty(shape, np.uint8)
    out[:, 0::2], out[:, 1::2] = b & 15, b >> 4
    return out


def test_nvfp4_tensor_input_is_used_as_it_is_fprop_and_wgrad() -> None:
    rng = np.random.default_rng(253)
    m, k, n = 32, 64, 16
    x, w, dy = _tiles(rng, m, k), _tiles(rng, n, k), _tiles(rng, m, n)
    xt = NVFP4Quantizer(rowwise=True, columnwise=True)(torch.from_numpy(x)).requires_grad_()
    _fp4_edit(xt._rowwise_data, (16, 16), (m, k))
    _fp4_edit(xt._columnwise_data, (16, 16), (k, m))
    assert float(xt._amax_rowwise) == float(xt._amax_columnwise) == 10.5  # global scale 448 * 6 / 10.5 = 256
    fp4 = lambda c: c.view(ml_dtypes.float4_e2m1fn).astype(np.float64)  # noqa: E731
    e4m3 = lambda s: s.numpy().view(ml_dtypes.float8_e4m3fn).astype(np.float64)  # noqa: E731
    # TE nvfp4_tensor_storage: rowwise (m, k/2) bytes, scales (m, k/16); columnwise the transpose (k, m/2),
    # scales (k, m/16); values = code x scale / 256
    row = fp4(_unpack(xt._rowwise_data, (m, k))) * np.repeat(e4m3(xt._rowwise_scale_inv[:m, : k // 16]), 16, 1) / 256
    colt = fp4(_unpack(xt._columnwise_data, (k, m))) * np.repeat(e4m3(xt._columnwise_scale_inv[:k, : m // 16]), 16, 1)
    col = colt.T / 256
    assert not np.array_equal(row, x) and np.array_equal(row[:16, :16], x[:16, :16])
    recipe = NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True)
    lin = _linear(w)
    got = _run(lin, xt, recipe, dy)
    _check(got, row @ w.astype(np.float64).T, "NVFP4 fprop")
    _check(lin.weight.grad.numpy(), dy.astype(np.float64).T @ col, "NVFP4 wgrad")


def test_quantized_input_of_another_scaling_mode_raises_te_gemm_error() -> None:
    """TE common/gemm/cublaslt_gemm.cu 106-111 (A: the weight, B: the input); 580-582 for 2D by 2D."""
    x = torch.ones(32, 32)
    lin = te.Linear(32, 16, bias=False)
    cases = [
        (MXFP8Quantizer(DType.kFloat8E4M3)(x), DelayedScaling(), "DELAYED_TENSOR_SCALING, B.scaling_mode = NVTE_MX"),
        (_float8(x), MXFP8BlockScaling(), "A.scaling_mode = NVTE_MXFP8_1D_SCALING, B.scaling_mode = NVTE_DELAYED"),
        (NVFP4Quantizer()(x), Float8BlockScaling(), "NVTE_BLOCK_SCALING_2D, B.scaling_mode = NVTE_NVFP4_1D_SCALING"),
        (
            Float8BlockQuantizer(DType.kFloat8E4M3, rowwise=True, columnwise=True, block_scaling_dim=2)(x),
            Float8BlockScaling(),
            "but got 2D by 2D",
        ),
    ]
    for xt, recipe, message in cases:
        with te.autocast(enabled=True, recipe=recipe), pytest.raises(RuntimeError, match=message):
            lin(xt)


def test_float8_block_input_1d_by_2d_and_2d_by_1d_are_taken() -> None:
    x = torch.ones(128, 128)
    lin = te.Linear(128, 16, bias=False)
    for dim, recipe in ((1, Float8BlockScaling()), (2, Float8BlockScaling(w_block_scaling_dim=1))):
        xt = Float8BlockQuantizer(DType.kFloat8E4M3, rowwise=True, columnwise=True, block_scaling_dim=dim)(x)
        with te.autocast(enabled=True, recipe=recipe):
            assert lin(xt).shape == (128, 16)


def test_quantized_input_without_its_columnwise_copy_fails_in_wgrad_as_te() -> None:
    """The forward needs the rowwise copy only; the wgrad asks for the columnwise one (TE linear.py 1177), which
    an MXFP8 tensor cannot make from its rowwise copy (TE mxfp8_tensor_storage: its update_usage error)."""
    x = torch.ones(32, 32)
    xt = MXFP8Quantizer(DType.kFloat8E4M3, columnwise=False)(x)
    lin = te.Linear(32, 16, bias=False)
    with te.autocast(enabled=True, recipe=MXFP8BlockScaling()):
        y = lin(xt)
    with pytest.raises(RuntimeError, match="Requested column-wise usage, but MXFP8Tensor is missing column-scaled"):
        y.sum().backward()
    lin.weight.requires_grad_(False)  # no wgrad: the rowwise copy is all TE reads
    with te.autocast(enabled=True, recipe=MXFP8BlockScaling()):
        lin(xt)


def test_block_scaled_input_to_a_sequence_parallel_column_layer_is_refused() -> None:
    """TE all-gathers a quantized input as it is (linear.py 378-419); fp8sim refuses it before any collective."""
    lin = te.Linear(64, 64, tp_size=2, parallel_mode="column", sequence_parallel=True)
    lin.tp_group = object()  # never reached: the refusal comes first
    xt = MXFP8Quantizer(DType.kFloat8E4M3)(torch.ones(64, 64))
    with te.autocast(enabled=True, recipe=MXFP8BlockScaling()), pytest.raises(NotImplementedError, match="MXFP8Tensor"):
        lin(xt)
