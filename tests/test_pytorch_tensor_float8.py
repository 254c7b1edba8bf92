"""TE's Float8Quantizer / Float8CurrentScalingQuantizer / Float8Tensor against references written
from TE's code (NVIDIA/TransformerEngine at d0067d0).

- current scaling: ``tests/pytorch/references/ref_per_tensor_cs.py`` (``ref_per_tensor_cs_cast``,
  lines 13-60) with ``references/quantize_scale_calc.py`` (``scale_from_amax_tensor``); TE's test
  compares ``_data``, ``_scale_inv`` and ``_transpose`` exactly (``tests/pytorch/test_quantized_tensor.py``
  lines 527-532);
- delayed scaling: the cast kernel ``satfinite(RN(fl32(x) * scale))`` (clamp then cast is the same for
  non-NaN inputs, spec 2.3), ``scale_inv = 1/scale``;
- dequantize: the CPU path of ``_FromFloat8Func`` (``tensor/storage/float8_tensor_storage.py`` lines 36-41).
"""

from __future__ import annotations

import io
import math

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

from fp8sim.pytorch import constants as C  # noqa: E402
from fp8sim.pytorch.tensor import (  # noqa: E402
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    Float8Tensor,
    QuantizedTensor,
    delayed_scaling_quantizers,
)
from fp8sim.recipe import DelayedScaling, Format  # noqa: E402
from fp8sim.scaling import DelayedScaler  # noqa: E402

torch.set_num_threads(1)
FP8 = {C.DType.kFloat8E4M3: torch.float8_e4m3fn, C.DType.kFloat8E5M2: torch.float8_e5m2}
DIMS = [[], [1], [311], [7, 11], [7, 5, 3], [2, 3, 5, 3]]


def _multi_dim_transpose(t: torch.Tensor) -> torch.Tensor:  # ref_per_tensor_cs.py lines 21-37
    if t.dim() <= 1:
        return t
    return t.permute([t.dim() - 1, *range(t.dim() - 1)]).contiguous()


def _ref_scale(amax: torch.Tensor, quant_dtype: torch.dtype, eps: float, pow_2_scales: bool) -> tuple:
    """quantize_scale_calc.py scale_from_amax_tensor, x_dtype float32."""
    fp8_max = torch.finfo(quant_dtype).max
    amax = torch.max(amax, torch.tensor(eps))
    scale = torch.div(fp8_max, amax)
    scale = torch.where(scale == torch.inf, torch.finfo(torch.float32).max, scale)
    if pow_2_scales:
        _, exp = torch.frexp(scale)
        scale = torch.ldexp(torch.tensor([1.0]), exp - 1)
        scale = torch.where(amax == float("inf"), 0.0, scale)
    scale = torch.where(amax == 0, 1.0, scale)
    return scale, torch.reciprocal(scale)


def _ref_cs_cast(x: torch.Tensor, fp8_dtype: C.DType, pow2: bool, eps: float) -> tuple:
    q = FP8[fp8_dtype]
    amax = torch.amax(torch.abs(x.to(torch.float32))).view(1)
    scale, scale_inv = _ref_scale(amax, q, eps, pow2)
    qx = (x.float() * scale).to(q)
    if x.shape == torch.Size([]):
        qx = qx.view([])
    return qx, scale_inv, _multi_dim_transpose(qx)


def _rand(dims: list, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(dims, generator=g) * 3).to(dtype)


@pytest.mark.parametrize("dims", DIMS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("fp8_dtype", list(FP8), ids=lambda d: d.name)
@pytest.mark.parametrize(("pow2", "eps"), [(False, 0.0), (True, 0.0), (False, 1e3)])
def test_current_scaling_matches_tes_reference(
    dims: list, dtype: torch.dtype, fp8_dtype: C.DType, pow2: bool, eps: float
) -> None:
    x = _rand(dims, dtype)
    q = Float8CurrentScalingQuantizer(fp8_dtype, "cpu", force_pow_2_scales=pow2, amax_epsilon=eps)
    got = q(x)
    qx, sx, qx_t = _ref_cs_cast(x, fp8_dtype, pow2, eps)
    assert isinstance(got, Float8Tensor) and got.dtype == dtype and got.shape == x.shape
    assert torch.equal(got._data, qx.view(torch.uint8))
    assert torch.equal(got._scale_inv, sx)
    assert torch.equal(got._transpose, qx_t.view(torch.uint8))


@pytest.mark.parametrize("scale", [0.375, 1.0, 3.5, 1e6])
@pytest.mark.parametrize("fp8_dtype", list(FP8), ids=lambda d: d.name)
def test_delayed_scaling_cast_and_amax(scale: float, fp8_dtype: C.DType) -> None:
    x = torch.cat([_rand([50], torch.float32), torch.tensor([float("nan"), 1e30, -1e30, 0.0, -0.0])])
    amax = torch.tensor([5.0])
    got = Float8Quantizer(torch.full([1], scale), amax, fp8_dtype)(x)
    fmax = torch.finfo(FP8[fp8_dtype]).max
    want = torch.clamp(x.float() * scale, -fmax, fmax).to(FP8[fp8_dtype])
    finite = ~torch.isnan(x)
    assert torch.equal(got._data[finite], want.view(torch.uint8)[finite])
    assert torch.isnan(got.dequantize()[~finite]).all()
    assert torch.equal(got._scale_inv, torch.reciprocal(torch.tensor([scale])))
    assert amax.item() == torch.tensor(1e30).item()  # max(5, max|x|), NaN skipped, written in place


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_dequantize_is_tes_cpu_path(dtype: torch.dtype) -> None:
    t = Float8Quantizer(torch.full([1], 3.5), torch.zeros(1), C.DType.kFloat8E5M2)(_rand([7, 5], torch.float32))
    want = (t._data.view(torch.float8_e5m2).float() * t._scale_inv).to(dtype)
    assert torch.equal(t.dequantize(dtype=dtype), want)
    assert t.dequantize().dtype == torch.float32


@pytest.mark.parametrize("current", [True, False], ids=["current", "delayed"])
def test_zero_dim_tensor_dequantizes_to_zero_dim(current: bool) -> None:
    """TE on its device: ``tex.dequantize`` (csrc/extensions/cast.cpp 588-606) allocates the output with
    the input's shape, so a 0-d tensor stays 0-d (only TE's CPU fallback, float8_tensor_storage.py 36-41,
    broadcasts it against the [1] scale_inv; TE's tests run on CUDA)."""
    if current:
        q = Float8CurrentScalingQuantizer(C.DType.kFloat8E4M3)
    else:
        q = Float8Quantizer(torch.full([1], 2.0), torch.zeros(1), C.DType.kFloat8E4M3)
    t = q(torch.tensor(3.0))
    assert t.shape == () and t.dequantize().shape == () and t.float().shape == ()
    want = (t._data.view(torch.float8_e4m3fn).float() * t._scale_inv).reshape(())
    assert torch.equal(t.dequantize(), want)


def test_columnwise_only_and_usages() -> None:
    x = _rand([4, 3, 8], torch.float32)
    q = Float8CurrentScalingQuantizer(C.DType.kFloat8E4M3, "cpu")
    full = q(x)
    q.set_usage(rowwise=False)
    col = q(x)
    assert col._data is None and torch.equal(col._transpose, full._transpose)
    assert col._transpose.shape == (8, 4, 3)  # TE's columnwise layout: last dim first
    assert torch.equal(col.dequantize(), full.dequantize())
    assert col.get_usages() == {"rowwise": False, "columnwise": True}
    q.set_usage(rowwise=True, columnwise=False)
    row = q(x)
    assert row._transpose is None and row.get_usages() == {"rowwise": True, "columnwise": False}
    row.update_usage(columnwise_usage=True)
    assert torch.equal(row._transpose, full._transpose)


def test_delayed_scaling_quantizers_share_the_scaler_state() -> None:
    """TE's DelayedScalingRecipeState.make_quantizers (pytorch/quantization.py lines 1444-1452):
    quantizer i uses scale[i] and amax_history[0][i] in place."""
    scaler = DelayedScaler(DelayedScaling(fp8_format=Format.HYBRID, amax_history_len=2, reduce_amax=False), n=3)
    qs = delayed_scaling_quantizers(scaler)
    x = _rand([16, 16], torch.float32)
    first = qs[1](x)
    assert scaler.amax_history[0, 1] == x.abs().max().item() and first._scale_inv.item() == 1.0
    scaler.update()
    second = qs[1](x)
    assert second._scale_inv.item() == (1 / torch.tensor(scaler.scale[1])).item()
    # torch's own cast (|x| * scale stays below E4M3's rounding-to-NaN midpoint 464: no saturation)
    ref = (x * torch.from_numpy(scaler.scale[1:2])).to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(second._data, ref)
    assert qs[0].dtype == C.DType.kFloat8E4M3


def test_tensor_ops_te_tests_use() -> None:
    """The ops of TE's test_quantized_tensor.py TestFloat8Tensor (lines 286-470): exact results on
    the dequantized values, views and clones that stay Float8Tensors, in-place ops re-quantized."""
    q = Float8Quantizer(torch.full([1], 3.5), torch.zeros(1), C.DType.kFloat8E4M3)
    x, y = q(_rand([4, 6], torch.float32, 1)), q(_rand([4, 6], torch.float32, 2))
    xr, yr = x.dequantize(), y.dequantize()
    assert isinstance(x, torch.Tensor) and isinstance(x, QuantizedTensor)
    assert torch.equal(-x, -xr) and torch.equal(x + y, xr + yr) and torch.equal(torch.sin(x), torch.sin(xr))
    assert torch.equal(x, xr) and x.shape == (4, 6) and x.dtype == torch.float32 and x.numel() == 24
    v = x.view(6, 4)
    assert isinstance(v, Float8Tensor) and torch.equal(v.dequantize(), xr.view(6, 4))
    assert torch.equal(x.reshape(-1).dequantize(), xr.reshape(-1))
    assert torch.equal(x.transpose(0, 1), xr.t()) and torch.equal(x.t(), xr.t())
    c = x.clone()
    assert isinstance(c, Float8Tensor) and c._data is not x._data and torch.equal(c, x)
    d = x.detach()
    assert isinstance(d, Float8Tensor) and d._data is x._data
    z = q(torch.zeros(4, 6))
    z.copy_(x)
    assert torch.equal(z, x)
    plain = torch.empty(4, 6)
    plain.copy_(x)
    assert torch.equal(plain, xr)
    x += yr
    assert isinstance(x, Float8Tensor)
    assert torch.equal(x.dequantize(), q(xr + yr).dequantize())
    chunk1, chunk2 = y.chunk(2, dim=0)
    assert torch.equal(chunk1, yr[:2]) and torch.equal(chunk2, yr[2:])


def test_serialization_round_trip() -> None:
    """TE's test_serialization (test_quantized_tensor.py lines 389-425)."""
    x = Float8Quantizer(torch.full([1], 0.5), torch.zeros(1), C.DType.kFloat8E4M3)(_rand([2, 3, 5], torch.float32))
    ref = x.dequantize()
    buf = io.BytesIO()
    torch.save(x, buf)
    x._data.zero_()
    x._scale_inv.zero_()
    back = torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
    assert isinstance(back, Float8Tensor) and torch.equal(back.dequantize(), ref)


def test_gradient_passes_straight_through() -> None:
    x = _rand([3, 4], torch.float32).requires_grad_()
    q = Float8CurrentScalingQuantizer(C.DType.kFloat8E4M3, "cpu")
    y = q(x)
    (y.dequantize() * 2).sum().backward()
    assert torch.equal(x.grad, torch.full((3, 4), 2.0))


def test_constructor_and_quantize_into() -> None:
    """TE's test_constructor (lines 200-219) and ``quantize_(noop_flag=...)`` (lines 263-284)."""
    t = Float8Tensor(
        shape=[3, 2],
        dtype=torch.bfloat16,
        data=torch.zeros(3, 2, dtype=torch.uint8),
        fp8_scale_inv=torch.full([1], 0.375),
    )
    assert list(t.size()) == [3, 2] and t.dtype == torch.bfloat16 and t._fp8_dtype == C.DType.kFloat8E4M3
    q = Float8Quantizer(torch.full([1], 2.0), torch.zeros(1), C.DType.kFloat8E4M3)
    x = q(_rand([5], torch.float32))
    before = x.dequantize()
    x.quantize_(torch.ones(5), noop_flag=torch.ones(1))
    assert torch.equal(x.dequantize(), before)
    x.quantize_(torch.ones(5), noop_flag=torch.zeros(1))
    assert torch.equal(x.dequantize(), torch.ones(5))


def test_bad_arguments_name_what_is_allowed() -> None:
    with pytest.raises(ValueError, match=r"fp8_dtype must be DType.kFloat8E4M3 or DType.kFloat8E5M2"):
        Float8Quantizer(torch.ones(1), torch.zeros(1), C.DType.kBFloat16)
    with pytest.raises(TypeError, match="quantizes torch.float32"):
        Float8CurrentScalingQuantizer(C.DType.kFloat8E4M3, "cpu")(torch.ones(2, dtype=torch.int32))
    with pytest.warns(DeprecationWarning, match="ignores `use_existing_amax`"):
        Float8CurrentScalingQuantizer(C.DType.kFloat8E4M3, "cpu", use_existing_amax=True)


def test_constants_are_tes() -> None:
    """``common/include/transformer_engine/transformer_engine.h`` lines 681-692 (enum values),
    ``pytorch/constants.py`` TE_DType (lines 92-100), ``pytorch/csrc/common.h`` lines 76-97."""
    assert [(d.name, int(d)) for d in C.DType] == [
        ("kByte", 0),
        ("kInt32", 2),
        ("kFloat32", 4),
        ("kFloat16", 5),
        ("kBFloat16", 6),
        ("kFloat8E4M3", 7),
        ("kFloat8E5M2", 8),
        ("kFloat4E2M1", 10),
    ]
    assert (
        C.TE_DType[torch.float8_e5m2] is C.DType.kFloat8E5M2
        and C.TE_DType_To_Torch[C.DType.kBFloat16] is torch.bfloat16
    )
    assert (C.FP8FwdTensorIdx.GEMM2_WEIGHT, C.FP8BwdTensorIdx.GRAD_INPUT2) == (4, 3)
    hybrid = DelayedScaling()
    assert C.get_fp8_torch_dtype(hybrid) is torch.float8_e4m3fn
    assert C.get_fp8_torch_dtype(hybrid, fprop_tensor=False) is torch.float8_e5m2
    assert C.get_fp8_te_dtype(DelayedScaling(fp8_format=Format.E4M3), False) is C.DType.kFloat8E4M3
    assert C.get_fp8_max(hybrid, False) == 57344 and isinstance(C.get_fp8_max(hybrid), int)
    assert C.DType.cast(7) is C.DType.kFloat8E4M3 and C.MXFP8_BLOCK_SCALING_SIZE == 32
    assert math.isclose(C.NVFP4_BLOCK_SCALING_SIZE, 16)


def test_make_empty_and_parameters() -> None:
    """``Quantizer.make_empty`` (TE ``quantized_tensor.py`` line 467) and FP8 parameters
    (``torch.nn.Parameter`` of a Float8Tensor keeps the subclass, gradients reach it)."""
    q = Float8CurrentScalingQuantizer(C.DType.kFloat8E4M3, "cpu")
    e = q.make_empty((3, 4), dtype=torch.bfloat16, requires_grad=True)
    assert isinstance(e, Float8Tensor) and e.shape == (3, 4) and e.dtype == torch.bfloat16 and e.requires_grad
    p = torch.nn.Parameter(q(_rand([16, 32], torch.float32)))
    assert isinstance(p, Float8Tensor) and isinstance(p, torch.nn.Parameter) and p.requires_grad
    torch.nn.functional.linear(torch.ones(2, 32), p).sum().backward()
    assert torch.equal(p.grad, torch.full((16, 32), 2.0))
