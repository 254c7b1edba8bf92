"""Fuzz of ``scaled_mm`` (numpy codes, nested lists, torch float8 tensors) under the contract.

Oracles for valid calls: the ``exact`` accumulator against the exact dot products as Fractions,
rounded once to float32 here (ties to even, a zero sum +0: ``D = A.B + C``, ``C = +0``), then torch's
epilogue ``fl32(fl32(sa * sb) * acc)``; ``cpu_reference`` against torch's own CPU ``torch._scaled_mm``.
torch's checks raise RuntimeError (its words), so RuntimeError is a documented refusal here.
"""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from _contract import ARRAY_BAD, BOOL_BAD, CODES_BAD, EXAMPLES, FUZZ, STR_BAD, Call, check_call, one_bad
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fp8sim
from fp8sim.gemm import scaled_mm
from fp8sim.testing.oracles import require

pytestmark = pytest.mark.fuzz

torch = require("torch")
DOCUMENTED = (TypeError, ValueError, RuntimeError)
ALIASES = {"a": ("mat1",), "b": ("mat2",), "bias": ("Bias",)}


def _f32(q: Fraction) -> np.float32:
    """The float32 nearest to ``q`` (ties to even); +0 for 0."""
    if q == 0:
        return np.float32(0.0)
    f = np.float32(float(q))
    cands = [np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf))]
    return min(cands, key=lambda c: (abs(Fraction(float(c)) - q), int(np.float32(c).view(np.uint32)) & 1))


def _exact(a: np.ndarray, b: np.ndarray, fa: str, fb: str) -> np.ndarray:
    va, vb = fp8sim.decode(a, fa).astype(np.float64), fp8sim.decode(b, fb).astype(np.float64)
    out = np.empty((a.shape[0], b.shape[1]), np.float32)
    for i in range(a.shape[0]):
        for j in range(b.shape[1]):
            out[i, j] = _f32(
                sum((Fraction(x) * Fraction(y) for x, y in zip(va[i], vb[:, j], strict=True)), Fraction(0))
            )
    return out


def _finite_codes(fmt: str) -> st.SearchStrategy:
    f = fp8sim.get_format(fmt)
    return st.sampled_from([c for c in range(f.num_codes) if np.isfinite(f.code_value(c))])


@st.composite
def mm_calls(draw: st.DrawFn) -> Call:
    fa, fb = draw(st.sampled_from([("e4m3", "e4m3"), ("e5m2", "e4m3"), ("e4m3", "e5m2")]))
    m, k, n = draw(st.integers(1, 4)), draw(st.integers(1, 40)), draw(st.integers(1, 4))
    a = draw(hnp.arrays(np.uint8, (m, k), elements=_finite_codes(fa)))
    b = draw(hnp.arrays(np.uint8, (k, n), elements=_finite_codes(fb)))
    scale = st.floats(2.0**-8, 2.0**8, width=32)
    rowwise = draw(st.booleans())
    sa = draw(hnp.arrays(np.float32, (m, 1) if rowwise else (), elements=scale))
    sb = draw(hnp.arrays(np.float32, (1, n) if rowwise else (), elements=scale))
    form = draw(st.sampled_from(["array", "list"]))
    valid = {"a": a.tolist() if form == "list" else a, "b": b.tolist() if form == "list" else b, "scale_a": sa,
             "scale_b": sb, "bias": None, "out_dtype": draw(st.sampled_from(["float32", "bfloat16"])),
             "use_fast_accum": False, "accumulator": "exact", "a_format": fa, "b_format": fb,
             "strict": False, "epilogue": "alpha", "split_k": None,
             "backend": draw(st.sampled_from([None, "torch"]))}  # fmt: skip
    pools = {"a": CODES_BAD, "b": CODES_BAD, "scale_a": [None, *ARRAY_BAD[1:], np.ones((m + 1, 3), np.float32)],
             "scale_b": [None, "x", np.ones(n + 2, np.float64)], "bias": ["x", np.ones(n + 1, np.float32), OBJS],
             "out_dtype": ["float8", 3, "int8", np.ones(2)], "use_fast_accum": BOOL_BAD, "accumulator": NOT_NONE,
             "a_format": STR_BAD, "b_format": STR_BAD, "strict": BOOL_BAD, "epilogue": STR_BAD,
             "split_k": [(0, "serial"), (2, "tiled"), 3, "x", (2.0, "serial"), (True, "serial")],
             "backend": ["cuda", 3, np.ones(2)]}  # fmt: skip
    kwargs, bad = one_bad(draw, valid, pools)
    return Call(scaled_mm, kwargs, bad, ALIASES)


OBJS = [object()]
NOT_NONE = [v for v in STR_BAD if v is not None]  # accumulator=None is the default


@FUZZ
@given(mm_calls())
def test_scaled_mm_keeps_the_contract_and_the_exact_accumulator_is_exact(call: Call) -> None:
    ok, got = check_call(call, DOCUMENTED)
    if not ok:
        return
    kw = call.kwargs
    a, b = np.asarray(kw["a"], np.uint8), np.asarray(kw["b"], np.uint8)
    acc = _exact(a, b, kw["a_format"], kw["b_format"])
    alpha = (kw["scale_a"].reshape(-1, 1) * kw["scale_b"].reshape(1, -1)).astype(np.float32)  # fl32(sa * sb)
    want = (alpha * acc).astype(np.float32)
    if kw["out_dtype"] == "bfloat16":
        want = want.astype(ml_dtypes.bfloat16).astype(np.float32)
    got = np.asarray(got, np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (got, want)


@settings(FUZZ, max_examples=min(EXAMPLES, 300))  # torch's CPU kernel is the slow part
@given(st.data())
def test_torch_operands_equal_torchs_cpu_scaled_mm(data: st.DataObject) -> None:
    m, k, n = 16 * data.draw(st.integers(1, 2)), 16 * data.draw(st.integers(1, 3)), 16 * data.draw(st.integers(1, 2))
    a = data.draw(hnp.arrays(np.uint8, (m, k), elements=_finite_codes("e4m3")))
    b = data.draw(hnp.arrays(np.uint8, (n, k), elements=_finite_codes("e4m3")))
    sa, sb = (torch.tensor(data.draw(st.floats(2.0**-4, 2.0**4, width=32))) for _ in range(2))
    at = torch.from_numpy(a).view(torch.float8_e4m3fn)
    bt = torch.from_numpy(b).view(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt wants
    out = data.draw(st.sampled_from([torch.float32, torch.bfloat16]))
    kwargs = {"a": at, "b": bt, "scale_a": sa, "scale_b": sb, "out_dtype": out, "accumulator": "cpu_reference"}
    ok, got = check_call(Call(scaled_mm, kwargs), DOCUMENTED)
    want = torch._scaled_mm(at, bt, sa, sb, out_dtype=out)
    assert ok and got.dtype == want.dtype and torch.equal(got.float().view(torch.int32), want.float().view(torch.int32))
