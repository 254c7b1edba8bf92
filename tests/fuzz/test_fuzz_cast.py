"""Fuzz of the cast API (``encode``, ``decode``, ``quantize``) under the contract of ``_contract``.

Oracle for valid calls: ``conftest.ref_encode_vec`` / ``ref_encode_array`` (the exact rounding rule
over Fractions, sharing no code with ``fp8sim.cast``), with the stochastic stream's bits; decode:
ml_dtypes' own view of the codes (``FloatFormat.code_value`` where ml_dtypes has no type).
"""

from __future__ import annotations

import numpy as np
import pytest
from _contract import ARRAY_BAD, BOOL_BAD, CODES_BAD, FUZZ, INT_BAD, STR_BAD, Call, check_call, one_bad
from conftest import DETERMINISTIC_MODES, ref_encode_array, ref_encode_vec
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fp8sim
from fp8sim.cast._random import numpy_bits
from fp8sim.testing.oracles import require

pytestmark = pytest.mark.fuzz

FORMATS = tuple(fp8sim.FORMATS)
SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)


def _floats(dtype: type) -> st.SearchStrategy:
    return hnp.arrays(dtype, SHAPES, elements=hnp.from_dtype(np.dtype(dtype), allow_nan=True, allow_infinity=True))


def _want(x: np.ndarray, fmt: str, rounding: str, saturate: bool, seed: int | None) -> np.ndarray:
    if rounding == "stochastic":
        return ref_encode_array(x, fmt, "stochastic", saturate, numpy_bits(seed, 0, x.size).reshape(x.shape))
    if x.dtype == np.float64:
        return ref_encode_array(x, fmt, rounding, saturate)
    return ref_encode_vec(x, fmt, rounding, saturate).reshape(x.shape)


@st.composite
def encode_calls(draw: st.DrawFn) -> Call:
    x = draw(st.one_of(_floats(np.float16), _floats(np.float32), _floats(np.float64).filter(lambda a: a.size <= 8)))
    rounding = draw(st.sampled_from((*DETERMINISTIC_MODES, "stochastic")))
    valid = {
        "x": x,
        "fmt": draw(st.sampled_from(FORMATS)),
        "rounding": rounding,
        "saturate": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**64 - 1)) if rounding == "stochastic" else None,
    }
    pools = {"x": ARRAY_BAD, "fmt": STR_BAD, "rounding": STR_BAD, "saturate": BOOL_BAD}
    if rounding == "stochastic":
        pools["seed"] = [v for v in INT_BAD if v is not None] + [-1, 2**64]
    kwargs, bad = one_bad(draw, valid, pools)
    return Call(fp8sim.encode, kwargs, bad)


@FUZZ
@given(encode_calls())
def test_encode_keeps_the_contract_and_matches_the_exact_rule(call: Call) -> None:
    ok, got = check_call(call)
    if not ok:
        return
    kw = call.kwargs
    want = _want(kw["x"], kw["fmt"], kw["rounding"], kw["saturate"], kw["seed"])
    got = np.asarray(got)
    assert got.dtype == np.uint8 and got.shape == kw["x"].shape
    f = fp8sim.get_format(kw["fmt"])
    nan = np.array([f.is_nan_code(c) for c in range(f.num_codes)], bool)
    same = (got == want) | (nan[got] & nan[want])
    assert same.all(), (
        f"{kw['fmt']} {kw['rounding']}: input {kw['x'][~same][:3]} got {got[~same][:3]} want {want[~same][:3]}"
    )


@st.composite
def decode_calls(draw: st.DrawFn) -> Call:
    fmt = draw(st.sampled_from(FORMATS))
    n = fp8sim.get_format(fmt).num_codes
    dtype = draw(st.sampled_from([np.uint8, np.int16, np.int64, np.uint32]))
    codes = draw(hnp.arrays(dtype, SHAPES, elements=st.integers(0, n - 1)))
    kwargs, bad = one_bad(draw, {"codes": codes, "fmt": fmt}, {"codes": CODES_BAD, "fmt": STR_BAD})
    return Call(fp8sim.decode, kwargs, bad)


@FUZZ
@given(decode_calls())
def test_decode_keeps_the_contract_and_matches_the_format_table(call: Call) -> None:
    ok, got = check_call(call)
    if not ok:
        return
    f = fp8sim.get_format(call.kwargs["fmt"])
    codes = call.kwargs["codes"]
    if f.ml_dtype is not None:
        want = codes.astype(np.uint8).view(f.ml_dtype).astype(np.float32)
    else:
        want = np.array([f.code_value(int(c)) for c in codes.reshape(-1)], np.float32).reshape(codes.shape)
    assert got.shape == codes.shape and got.dtype == np.float32
    assert np.array_equal(got, want, equal_nan=True)


@st.composite
def quantize_calls(draw: st.DrawFn) -> Call:
    call = draw(encode_calls())
    return Call(fp8sim.quantize, call.kwargs, call.bad)


@FUZZ
@given(quantize_calls())
def test_quantize_keeps_the_contract_and_is_decode_of_encode(call: Call) -> None:
    ok, got = check_call(call)
    if not ok:
        return
    kw = call.kwargs
    want = fp8sim.decode(_want(kw["x"], kw["fmt"], kw["rounding"], kw["saturate"], kw["seed"]), kw["fmt"])
    assert np.array_equal(np.asarray(got), want, equal_nan=True)


@FUZZ
@given(st.sampled_from(FORMATS), st.integers(0, 2**31), st.data())
def test_torch_inputs_give_the_numpy_result(fmt: str, seed: int, data: st.DataObject) -> None:
    torch = require("torch")
    x = data.draw(_floats(np.float32))
    t = torch.from_numpy(x.copy())
    kwargs = {"x": t, "fmt": fmt, "rounding": "stochastic", "seed": seed}
    ok, got = check_call(Call(fp8sim.encode, kwargs))
    assert ok and np.array_equal(got.numpy(), fp8sim.encode(x, fmt, rounding="stochastic", seed=seed))
