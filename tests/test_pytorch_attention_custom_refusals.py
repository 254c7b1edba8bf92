"""FP8 DotProductAttention under a CustomRecipe: each slot quantizer fp8sim does not model is refused with its
whole message, naming the slot by TE's name (``dot_product_attention/utils.py`` ``get_attention_quantizers``
at d0067d0 for the TypeError's words)."""

from __future__ import annotations

import re

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

import fp8sim.pytorch as te  # noqa: E402
from fp8sim.pytorch.attention import DotProductAttention  # noqa: E402
from fp8sim.pytorch.quantization import DelayedScalingRequest  # noqa: E402
from fp8sim.recipe import CustomRecipe  # noqa: E402

E4, E5 = te.DType.kFloat8E4M3, te.DType.kFloat8E5M2


def _cs(dt=E4, **kw):
    return lambda: te.Float8CurrentScalingQuantizer(dt, **kw)


def _ds():
    return lambda: DelayedScalingRequest(amax_history_len=1)


def _other_dtype():
    q = te.Float8CurrentScalingQuantizer(E4)
    q.dtype = te.DType.kBFloat16  # a quantizer whose dtype is not FP8
    return q


def _run(**slots) -> None:
    parts = {"qkv": _cs(), "o": _cs(), "s": _ds(), "do": _cs(E5), "dp": _ds(), "dqkv": _cs(E5), **slots}

    def factory(role):  # noqa: ANN001, ANN202
        if role.module_type == "dpa":
            return parts[role.tensor_type]()
        return parts["o" if "dpa_output" in role.name else "dqkv"]()

    q, k, v = (torch.randn(1, 16, 2, 16, requires_grad=True) for _ in range(3))
    dpa = DotProductAttention(2, 16, qkv_format="bshd")
    with te.autocast(enabled=True, recipe=CustomRecipe(qfactory=factory, fp8_dpa=True)):
        dpa(q, k, v)


_CS_OPTIONS = (
    "fp8sim's FP8 attention emulates a QKV Float8CurrentScalingQuantizer without force_pow_2_scales, amax_epsilon "
    "or with_amax_reduction"
)


@pytest.mark.parametrize(
    ("slots", "exc", "message"),
    [
        (dict(qkv=_cs(amax_epsilon=1e-3)), NotImplementedError, _CS_OPTIONS),
        (dict(qkv=_cs(with_amax_reduction=True)), NotImplementedError, _CS_OPTIONS),
        (dict(qkv=_other_dtype), ValueError, "QKV quantizer: fp8_dtype must be E4M3 or E5M2, got <DType.kBFloat16: 6>"),
        (
            dict(qkv=lambda: te.MXFP8Quantizer(E4, with_2d_quantization=True)),
            NotImplementedError,
            "fp8sim's FP8 attention does not emulate a 2D MXFP8 QKV slot",
        ),
        (
            dict(s=_cs()),
            NotImplementedError,
            "fp8sim's FP8 attention takes a delayed-scaling S slot (a DelayedScalingRequest) outside MXFP8; the "
            "CustomRecipe factory gave Float8CurrentScalingQuantizer",
        ),
        (
            dict(do=lambda: te.Float8Quantizer(torch.ones(1), torch.zeros(1), E5)),
            NotImplementedError,
            "fp8sim's FP8 attention takes a dO Float8Quantizer only from a DelayedScalingRequest (its delayed-scaling "
            "state is the module's); return DelayedScalingRequest(...) from the factory",
        ),
        (
            dict(dp=lambda: te.NVFP4Quantizer()),
            TypeError,
            "FP8 attention requires FP8-compatible quantizers for all DPA tensor slots, but dP quantizer is "
            "NVFP4Quantizer. When using CustomRecipe with fp8_dpa=True, ensure the factory returns an FP8 quantizer "
            "(Float8Quantizer, Float8CurrentScalingQuantizer, or MXFP8Quantizer) for all DPA roles "
            "(module_type='dpa') and for None roles (boundary slots like O output and dQKV grad-input).",
        ),
    ],
)
def test_unmodelled_slot_quantizers_are_refused_with_the_whole_message(slots, exc, message: str) -> None:
    with pytest.raises(exc, match="^" + re.escape(message) + "$"):
        _run(**slots)
