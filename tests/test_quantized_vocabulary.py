"""One quantized-data record flows up from ``fp8sim.scaling`` (issue 25): TE's tensor classes and torchao's
cast give :class:`~fp8sim.scaling.QuantizedData`, bit for bit the record of the scaling layer's quantizer
for the same input (those quantizers are tested against TE and torchao elsewhere); the old scaling name
``QuantizedTensor`` is a deprecated alias; the NaN-skipping amax of a torch tensor is the scaling layer's.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

from fp8sim.formats import get_format  # noqa: E402
from fp8sim.pytorch.constants import DType  # noqa: E402
from fp8sim.scaling import QuantizedData, quantize_current_scaling, quantize_mx  # noqa: E402
from fp8sim.scaling.amax import amax_nan_skipping, amax_nan_skipping_tensor  # noqa: E402


def _same(a: QuantizedData, b: QuantizedData) -> None:
    assert a.fmt == b.fmt and a.block == b.block and a.shape == b.shape and a.scale_format == b.scale_format
    assert np.array_equal(a.codes, b.codes) and np.array_equal(a.scales.view(np.uint8), b.scales.view(np.uint8))
    assert np.array_equal(a.dequantize().view(np.uint32), b.dequantize().view(np.uint32))


def _x(shape: tuple[int, ...] = (64, 96)) -> torch.Tensor:
    g = torch.Generator().manual_seed(25)
    return torch.randn(shape, generator=g) * torch.logspace(-3, 3, shape[-1])


def test_float8_tensor_record_is_the_current_scaling_record() -> None:
    from fp8sim.pytorch.tensor import Float8CurrentScalingQuantizer

    x = _x()
    q = Float8CurrentScalingQuantizer(DType.kFloat8E4M3)
    _same(q(x).quantized_data(), quantize_current_scaling(x, "e4m3"))


def test_mxfp8_tensor_records_are_the_te_mx_records() -> None:
    from fp8sim.pytorch.tensor import MXFP8Quantizer

    x = _x()
    t = MXFP8Quantizer(DType.kFloat8E4M3)(x)
    _same(t.quantized_data(), quantize_mx(x, "e4m3", axis=-1, scale_rule="rceil", flavor="te"))
    _same(t.quantized_data(columnwise=True), quantize_mx(x, "e4m3", axis=0, scale_rule="rceil", flavor="te"))


def test_torchao_float8_cast_record_is_quantize_torchao() -> None:
    from fp8sim.scaling.current import quantize_torchao
    from fp8sim.torchao.config import ScalingGranularity
    from fp8sim.torchao.linear import _cast

    x = _x()
    for g in (ScalingGranularity.TENSORWISE, ScalingGranularity.AXISWISE):
        got = _cast(x, torch.float8_e4m3fn, g, -1, False).quantized_data()
        _same(got, quantize_torchao(x, get_format("e4m3"), granularity=g.value, axiswise_dim=-1))


def test_tensor_amax_is_the_scaling_layers_nan_skipping_amax() -> None:
    x = _x((8, 33))
    x[0, 3], x[5, 7], x[6, 0] = float("nan"), float("inf"), -float("nan")
    for t in (x, x.bfloat16(), x[:, :0], torch.full((3,), float("nan"))):
        want = amax_nan_skipping(t.float().numpy())
        assert np.float32(amax_nan_skipping_tensor(t)) == want


def test_old_scaling_name_is_a_deprecated_alias() -> None:
    import fp8sim.scaling
    import fp8sim.scaling.quantized
    from fp8sim.pytorch.tensor import QuantizedTensor as TEQuantizedTensor

    for mod in (fp8sim.scaling, fp8sim.scaling.quantized):
        with pytest.warns(DeprecationWarning, match="QuantizedTensor is now .*QuantizedData"):
            assert mod.QuantizedTensor is QuantizedData
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert TEQuantizedTensor is not QuantizedData and issubclass(TEQuantizedTensor, torch.Tensor)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        fp8sim.scaling.Nope  # noqa: B018


def test_attention_operands_are_views_of_the_scaling_records() -> None:
    """DotProductAttention's quantization points (backends.Quantizer) give module Operands over the scaling
    layer's records: current scaling one scale over Q, K, V (TE's combine_and_quantize), delayed scaling
    ``DelayedScaler.quantize`` of the slot, MXFP8 TE's 1x32 record; the operand's values are the record's."""
    from fp8sim.pytorch.attention.dot_product_attention.backends import Quantizer
    from fp8sim.pytorch.module._operands import Operand
    from fp8sim.recipe import DelayedScaling
    from fp8sim.scaling.current import quantize_with_scale
    from fp8sim.scaling.delayed import DelayedScaler

    e4m3 = get_format("e4m3")
    q, k = _x((2, 4, 16, 32)), _x((2, 4, 16, 32)) * 1e-3
    ops = Quantizer("current", e4m3)(q, k)
    scale = np.float32(448) / np.float32(q.abs().max())  # the larger amax of the two sets the one scale
    for op, x in zip(ops, (q, k), strict=True):
        assert isinstance(op, Operand) and isinstance(op.qt, QuantizedData)
        _same(op.qt, quantize_with_scale(x, scale, e4m3))
        assert np.array_equal(op.dequant().numpy().view(np.uint32), op.qt.dequantize().view(np.uint32))
    state, ref = (DelayedScaler(DelayedScaling(), n=3) for _ in range(2))
    state.scale[1] = ref.scale[1] = np.float32(0.25)
    (op,) = Quantizer("delayed", e4m3, state, 1)(q)
    _same(op.qt, ref.quantize(1, q))
    assert np.array_equal(state.amax_history, ref.amax_history)
    (op,) = Quantizer("mxfp8", e4m3)(q, axis=-2)
    _same(op.qt, quantize_mx(q, "e4m3", axis=-2, scale_rule="rceil", flavor="te"))
    assert np.array_equal(op.dequant().numpy().view(np.uint32), op.qt.dequantize().view(np.uint32))


def test_attention_per_tensor_nan_keeps_torchs_float8_cast() -> None:
    """A NaN element of an attention operand is what torch's float8 cast writes (0x7F | sign, torch's float32
    NaN when decoded), as the attention core always had it; the record keeps the scaling layer's code."""
    from fp8sim.pytorch.attention.dot_product_attention.backends import Quantizer

    x = _x((4, 8))
    x[0, 1], x[2, 3] = float("nan"), -float("nan")
    for name, dt in (("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
        (op,) = Quantizer("current", get_format(name))(x)
        scale = torch.tensor(float(np.float32(get_format(name).max) / np.float32(x.nan_to_num(0).abs().max())))
        want = (x * scale).clamp(-get_format(name).max, get_format(name).max).to(dt)
        assert torch.equal(op.codes, want.view(torch.uint8))
        assert torch.equal(op.vals.view(torch.int32), want.float().view(torch.int32))


def test_torchao_float8_operand_holds_the_record_it_came_from() -> None:
    """torchao's cast of a dtype its torch-op path does not take (float64) is the scaling layer's
    ``quantize_torchao`` record, held by the operand; a relaid (transposed) operand rebuilds its record."""
    from fp8sim.scaling.current import quantize_torchao
    from fp8sim.torchao.config import ScalingGranularity
    from fp8sim.torchao.linear import _cast

    x = _x().double()
    for g in (ScalingGranularity.TENSORWISE, ScalingGranularity.AXISWISE):
        f = _cast(x, torch.float8_e4m3fn, g, -1, False)
        assert f.qt is not None and f.quantized_data() is f.qt
        _same(f.qt, quantize_torchao(x, get_format("e4m3"), granularity=g.value, axiswise_dim=-1))
        assert f.axiswise == (g is ScalingGranularity.AXISWISE) and f.scale.numel() == (x.shape[0] if f.axiswise else 1)
        t = _cast(x.t(), torch.float8_e4m3fn, g, 0, False)  # a transposed view: cast along the other dim
        assert t.qt is None
        _same(t.quantized_data(), quantize_torchao(x.t(), get_format("e4m3"), granularity=g.value, axiswise_dim=0))
