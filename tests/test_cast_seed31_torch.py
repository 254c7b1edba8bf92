"""torch-side cast semantics the second sampled mutation run of ``cast`` (seed 31) found untested.

Oracles: torch's own ``.to(float8)`` casts (float64 inputs), ml_dtypes' cast of values clipped to +-max
(CUDA's satfinite: what ``clamp_native`` must give), and, for the native-cast probe, the lookup-table cast
(``encode_via_tables``, tested against ml_dtypes and the spec elsewhere) with a fake native kernel that
equals it except in one place, as in ``tests/test_cast_native_probe.py``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import fp8sim
from fp8sim.cast.conventions import CONVENTIONS
from fp8sim.testing.oracles import require

torch = require("torch")
from fp8sim.cast import torch_backend as tb  # noqa: E402  (needs torch)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# float64 values that round differently once and through float32: 1.1875 - 2^-30 is just below the E4M3
# midpoint 1.1875 (once: 1.125), and float32 rounds it to that midpoint, whose tie goes to 1.25
_TWICE = [1.1875 - 2.0**-30, -(1.1875 - 2.0**-30), 3.0, 0.1]


@pytest.mark.parametrize("name", ["torch_eager", "torch_eager_legacy", "torchao"])
def test_torch_conventions_round_float64_through_float32_as_torch_does(name):
    t64 = torch.tensor(_TWICE, dtype=torch.float64)
    want = t64.to(torch.float8_e4m3fn).view(torch.uint8)
    assert want.tolist()[:2] == [0x3A, 0xBA]  # torch: through float32 (double rounding) on this version
    conv = CONVENTIONS[name]
    assert torch.equal(conv.encode(t64, "e4m3"), want)
    assert conv.encode(t64.numpy(), "e4m3").tolist() == want.tolist()
    assert fp8sim.encode(t64, "e4m3").tolist()[:2] == [0x39, 0xB9]  # the core rounds once


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_clamp_native_is_a_saturating_cast(fmt):
    """``clamp_native`` (the native cast after a clamp to the range) gives CUDA satfinite's codes: ml_dtypes'
    cast of the values clipped to +-max; it is what the probe takes where torch's cast does not saturate."""
    f = fp8sim.get_format(fmt)
    x = np.array([-1e9, -f.max * 1.2, -3.0, -0.0, 0.5, 7.0, f.max * 1.2, 1e9, np.inf, -np.inf], np.float32)
    got = tb._native(torch.from_numpy(x), f, "clamp_native")
    want = np.clip(x, -f.max, f.max).astype(getattr(ml_dtypes, f"float8_{fmt}" + ("fn" if fmt == "e4m3" else "")))
    assert got.tolist() == want.view(np.uint8).tolist()


def _choice(monkeypatch, fmt: str, saturate: bool, dtype, wrong) -> str:
    """The probe's choice for a fake native cast: the table cast, changed where ``wrong(x, codes)`` says."""
    f = fp8sim.get_format(fmt)
    monkeypatch.setattr(tb, "_NATIVE", {})

    def fake(flat, fmt_, how):
        return wrong(flat, tb.encode_via_tables(flat, fmt_, saturate))

    monkeypatch.setattr(tb, "_native", fake)
    return tb._native_choice(f, saturate, dtype, torch.device("cpu"))


def test_a_vectorised_body_that_truncates_the_low_16_bits_is_refused(monkeypatch):
    """Narrowing float32 to bfloat16 by truncation (dropping the sticky bits) turns an input just above an
    E4M3 midpoint into the midpoint, whose tie may go the other way; every midpoint has bit 16 clear, so the
    probe's sticky-bit patterns must reach the classes with an even upper half too."""
    f = fp8sim.get_format("e4m3")

    def wrong(x, codes):
        if x.numel() == 1:
            return codes
        cut = (x.view(torch.int32) & -(1 << 16)).view(torch.float32)
        return tb.encode_via_tables(torch.where(torch.isnan(x), x, cut), f, True)

    x = torch.tensor([1.0625 + 2.0**-20], dtype=torch.float32)  # E4M3 midpoint 1.0625, then one low bit
    assert wrong(x.repeat(2), tb.encode_via_tables(x.repeat(2), f, True)).tolist() != [0x39, 0x39]
    assert _choice(monkeypatch, "e4m3", True, torch.float32, wrong) == "table"


def test_a_scalar_path_wrong_just_above_a_midpoint_is_refused(monkeypatch):
    """The critical values include each midpoint's float32 neighbour upwards, checked one element at a time."""
    above = float(np.nextafter(np.float32(1.0625), np.float32(np.inf)))  # just above the 1.0 / 1.125 midpoint

    def wrong(x, codes):
        if x.numel() == 1 and float(x[0]) == above:
            return codes ^ 1
        return codes

    assert _choice(monkeypatch, "e4m3", True, torch.float32, wrong) == "table"


@pytest.mark.parametrize("name", ["uint16", "uint32", "uint64"])
def test_decode_takes_wide_unsigned_code_tensors(name):
    """torch has no min/max for uint16/32/64 ("min_all" not implemented): such codes are checked and decoded
    all the same, as ml_dtypes decodes them, and a code out of range is named."""
    dt = getattr(torch, name)  # torch >= 2.3 has all three (pyproject: torch >= 2.7)
    codes = [3, 0x7E, 0x80, 0xC8, 0xFF]
    want = np.array(codes, np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    got = fp8sim.decode(torch.tensor(codes, dtype=dt), "e4m3")
    assert got.dtype == torch.float32 and np.array_equal(got.numpy(), want, equal_nan=True)
    with pytest.raises(ValueError, match=r"^code 256 out of range for e4m3: codes must be in \[0, 255\]$"):
        fp8sim.decode(torch.tensor([1, 256], dtype=dt), "e4m3")


def test_a_torch_tensor_without_a_float_dtype_is_refused_by_its_argument_name_as_numpy_is():
    for t, a in ((torch.tensor([1, 2]), np.array([1, 2])), (torch.tensor([True]), np.array([True]))):
        with pytest.raises(TypeError) as from_numpy:
            fp8sim.encode(a, "e4m3")
        with pytest.raises(TypeError, match=r"^x must have a floating dtype \(float16, bfloat16, float32, float64\); "):
            fp8sim.encode(t, "e4m3")
        assert str(from_numpy.value).startswith("x must have a floating dtype (")
