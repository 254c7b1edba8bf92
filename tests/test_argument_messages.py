"""Issue 29.10: every public function checks its arguments first and names them.

Each row is a refusal that used to surface as numpy's or torch's own text ("operands could not be
broadcast together", "The truth value of an array ... is ambiguous", "empty(): argument 'size' ...",
"unhashable type", ZeroDivisionError, IndexError) or was accepted silently (a truthy string for a flag).
The message must now name the argument; the exception is a TypeError or ValueError.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import fp8sim
from fp8sim import scaling as S
from fp8sim.gemm import dot_add, scaled_mm
from fp8sim.recipe import DelayedScaling
from fp8sim.scaling.delayed import DelayedScaler
from fp8sim.testing.oracles import require

X = np.linspace(-3, 3, 256, dtype=np.float32).reshape(4, 64)
RAGGED = [[1.0], [1.0, 2.0]]
A = np.full((16, 32), 0x38, np.uint8)
B = np.full((32, 16), 0x38, np.uint8)
MM = dict(a_format="e4m3", b_format="e4m3", out_dtype="float32")


def _scaler() -> DelayedScaler:
    return DelayedScaler(DelayedScaling(amax_history_len=4), n=2)


CASES: list[tuple[str, Callable[[], object], type, str]] = [
    # ragged nesting inside the input converters (numpy's "inhomogeneous shape")
    ("encode ragged x", lambda: fp8sim.encode(RAGGED, "e4m3"), ValueError, r"^x is not a rectangular array"),
    ("decode ragged codes", lambda: fp8sim.decode([[1], [1, 2]], "e4m3"), ValueError, r"^codes is not a rectangular"),
    ("block ragged x", lambda: S.quantize_block_scaling(RAGGED), ValueError, r"^x is not a rectangular"),
    ("current ragged x", lambda: S.quantize_current_scaling(RAGGED), ValueError, r"^x is not a rectangular"),
    ("mx ragged x", lambda: S.quantize_mx(RAGGED), ValueError, r"^x is not a rectangular"),
    ("pack_fp4 ragged", lambda: S.pack_fp4([[1], [1, 2]]), ValueError, r"^codes is not a rectangular"),
    ("amax ragged", lambda: S.torchao_amax_to_scale(RAGGED, "e4m3"), ValueError, r"^amax is not a rectangular"),
    # scalars given as arrays or text (numpy's broadcasting / float() errors)
    ("block eps array", lambda: S.quantize_block_scaling(X, eps=np.ones(3)), TypeError, r"^eps must be a real number"),
    ("block eps text", lambda: S.quantize_block_scaling(X, eps="x"), TypeError, r"^eps must be a real number"),
    ("block eps nan", lambda: S.quantize_block_scaling(X, eps=float("nan")), ValueError, r"^eps must be a finite"),
    ("scale fp8_max array", lambda: S.compute_scale_from_amax(1.0, np.ones(3)), TypeError, r"^fp8_max must be a real"),
    ("scale eps dict", lambda: S.compute_scale_from_amax(1.0, 448.0, eps={}), TypeError, r"^eps must be a real"),
    ("scale value_for_inf", lambda: S.compute_scale_from_amax(1.0, 448.0, value_for_inf="x"), TypeError, r"^value_for"),
    ("update reduced_amax", lambda: _scaler().update(np.ones(3)), ValueError, r"^reduced_amax must be 2 real amaxes"),
    ("update reduced_amax text", lambda: _scaler().update("x"), ValueError, r"^reduced_amax must be"),
    ("dot_add c text", lambda: dot_add(A[:4], A[:4], "x", model="hopper_wgmma"), TypeError, r"^c must hold real"),
    ("dot_add c shape", lambda: dot_add(A[:4], A[:4], np.ones(3), model="hopper_wgmma"), ValueError, r"^c has shape"),
    # flags that took anything truthy, or raised "The truth value of an array ... is ambiguous"
    ("scale pow2 text", lambda: S.compute_scale_from_amax(1.0, 448.0, pow2="no"), TypeError, r"^pow2 must be True"),
    ("ao round text", lambda: S.quantize_torchao(X, round_scales_to_power_of_2="no"), TypeError, r"^round_scales"),
    ("ao granularity", lambda: S.quantize_torchao(X, granularity=np.ones(2)), ValueError, r"^granularity must be"),
    ("block block_dim array", lambda: S.quantize_block_scaling(X, block_dim=np.ones(2)), ValueError, r"^block_dim"),
    ("delayed forward", lambda: DelayedScaler(forward="no"), TypeError, r"^forward must be True or False"),
    ("delayed fused", lambda: DelayedScaler(fused=np.ones(2)), TypeError, r"^fused must be True, False or None"),
    ("delayed eager", lambda: DelayedScaler(eager_division="no"), TypeError, r"^eager_division must be True"),
    ("mm use_fast_accum", lambda: scaled_mm(A, B, 1.0, 1.0, use_fast_accum="no", **MM), TypeError, r"^use_fast_accum"),
    ("mm strict", lambda: scaled_mm(A, B, 1.0, 1.0, strict=np.ones(2), **MM), TypeError, r"^strict must be True"),
    ("mm backend", lambda: scaled_mm(A, B, 1.0, 1.0, backend=np.ones(2), **MM), ValueError, r"^backend must be None"),
    ("mm device", lambda: scaled_mm(A, B, 1.0, 1.0, device=np.ones(2), **MM), ValueError, r"^device must be 'hopper'"),
    ("mm epilogue", lambda: scaled_mm(A, B, 1.0, 1.0, epilogue=[], **MM), ValueError, r"^epilogue must be 'alpha'"),
    ("mm scale_result", lambda: scaled_mm(A, B, 1.0, 1.0, scale_result=[1.0, 2.0], **MM), ValueError, r"^scale_result"),
    # names that are not strings (unhashable types), and the argument a format belongs to
    (
        "mm accumulator list",
        lambda: scaled_mm(A, B, 1.0, 1.0, accumulator=[], **MM),
        ValueError,
        r"unknown accumulator",
    ),
    ("mm profile dict", lambda: scaled_mm(A, B, 1.0, 1.0, profile={}, **MM), ValueError, r"unknown profile"),
    ("dot_add model", lambda: dot_add(A[:4], A[:4], 0.0, model=[]), ValueError, r"unknown instruction model"),
    ("convention list", lambda: fp8sim.get_convention([]), ValueError, r"unknown convention"),
    ("mx elem_format", lambda: S.quantize_mx(X, elem_format=3), TypeError, r"^elem_format must be a format name"),
    ("mm b_format", lambda: scaled_mm(A, B, 1.0, 1.0, a_format="e4m3", b_format=3), TypeError, r"^b_format must be"),
    ("delayed index text", lambda: _scaler().record("0", X), TypeError, r"^index must be an int"),
    ("delayed index array", lambda: _scaler().quantize(np.ones(2), X), TypeError, r"^index must be an int"),
]


@pytest.mark.parametrize(("call", "exc", "pattern"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_refusal_names_the_argument(call: Callable[[], object], exc: type, pattern: str) -> None:
    with pytest.raises(exc, match=pattern):
        call()


def _te():  # noqa: ANN202
    return require("fp8sim.pytorch")


MODULE_CASES: list[tuple[str, Callable[[object], object], str]] = [
    ("Linear in_features", lambda te: te.Linear("16", 16), r"^in_features must be an int"),
    ("Linear out_features", lambda te: te.Linear(16, 0), r"^out_features must be an int >= 1, got 0"),
    ("Linear float", lambda te: te.Linear(16.0, 16), r"^in_features must be an int, got float"),
    ("LayerNormLinear", lambda te: te.LayerNormLinear(16, None), r"^out_features must be an int"),
    ("LayerNormMLP", lambda te: te.LayerNormMLP(16, -1), r"^ffn_hidden_size must be an int >= 1"),
    ("GroupedLinear", lambda te: te.GroupedLinear(2, 16, [16]), r"^out_features must be an int"),
    ("LayerNorm eps", lambda te: te.LayerNorm(16, eps="x"), r"^eps must be a real number"),
    ("LayerNorm shape", lambda te: te.LayerNorm(16.0), r"^normalized_shape must be an int"),
    ("RMSNorm shape", lambda te: te.RMSNorm(True), r"^normalized_shape must be an int"),
    ("DPA heads 0", lambda te: te.DotProductAttention(0, 8), r"^num_attention_heads must be an int >= 1"),
    ("DPA kv_channels", lambda te: te.DotProductAttention(2, []), r"kv_channels must be an int or a \(k, v\) pair"),
    ("DPA kv text", lambda te: te.DotProductAttention(2, "8"), r"^kv_channels must be an int"),
    ("MHA heads", lambda te: te.MultiheadAttention(16, 0), r"^num_attention_heads must be an int >= 1"),
    ("MHA small hidden", lambda te: te.MultiheadAttention(2, 4), r"^hidden_size 2 is smaller than num_attention_heads"),
    ("TransformerLayer", lambda te: te.TransformerLayer(16, 32, None), r"^num_attention_heads must be an int"),
]


@pytest.mark.parametrize(("call", "pattern"), [c[1:] for c in MODULE_CASES], ids=[c[0] for c in MODULE_CASES])
def test_module_constructor_names_the_size_argument(call: Callable[[object], object], pattern: str) -> None:
    """torch's ``empty(): argument 'size' ...`` (or a ZeroDivisionError) named no argument."""
    with pytest.raises((TypeError, ValueError), match=pattern):
        call(_te())


def test_module_sizes_take_numpy_ints() -> None:
    te = _te()
    assert te.Linear(np.int64(16), np.int32(8)).weight.shape == (8, 16)
    assert te.LayerNorm(np.int64(16)).normalized_shape == (16,)
    assert te.DotProductAttention(np.int64(2), (np.int64(8), 4)).hidden_size_per_attention_head_v == 4
