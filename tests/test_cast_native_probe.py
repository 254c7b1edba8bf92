"""The torch backend's probe of a native ``.to(float8)`` cast (``torch_backend._native_choice``).

The backend may use torch's own cast for ``nearest_even`` only where it reproduces the lookup tables on
every float32 table class at several low-bit patterns (sticky bits included), the vectorised way, and on
each critical value one element at a time (the scalar path: torch's vectorised body and scalar tail are
different code).  The oracle is the table cast itself (``encode_via_tables``, tested against ml_dtypes and
the spec's reference elsewhere); the "native" casts here are fakes that are that cast except in one
place, each a way a real kernel can go wrong, and the probe must refuse every one.
"""

from __future__ import annotations

import pytest

import fp8sim
from fp8sim.testing.oracles import require

torch = require("torch")
from fp8sim.cast import torch_backend as tb  # noqa: E402  (needs torch: after the lean session's marker)


def _choice(monkeypatch, fmt: str, saturate: bool, dtype, wrong) -> str:
    """The probe's choice for a fake native cast: the table cast, changed where ``wrong(x, codes)`` says."""
    f = fp8sim.get_format(fmt)
    monkeypatch.setattr(tb, "_NATIVE", {})

    def fake(flat, fmt_, how):
        codes = tb.encode_via_tables(flat, fmt_, saturate)
        return wrong(flat, codes)

    monkeypatch.setattr(tb, "_native", fake)
    return tb._native_choice(f, saturate, dtype, torch.device("cpu"))


def test_a_native_cast_equal_to_the_tables_is_taken(monkeypatch):
    assert _choice(monkeypatch, "e4m3", True, torch.bfloat16, lambda x, c: c) == "native"


def test_a_vectorised_body_that_rounds_through_bfloat16_is_refused(monkeypatch):
    """Double rounding (float32 -> bfloat16 -> float8) differs only where the low 16 bits of the float32
    input decide the rounding: the probe's sticky-bit patterns must catch it, though every one-element
    (scalar-path) cast is exact."""

    def wrong(x, codes):
        if x.numel() == 1:
            return codes
        narrowed = torch.where(torch.isnan(x), x, x.to(torch.bfloat16).float())  # NaN kept as it is
        return tb.encode_via_tables(narrowed, fp8sim.get_format("e4m3"), True)

    assert _choice(monkeypatch, "e4m3", True, torch.float32, wrong) == "table"


def test_a_scalar_path_wrong_at_twice_max_is_refused(monkeypatch):
    """An overflow edge (2 max: far past the last midpoint) checked on its own."""
    f = fp8sim.get_format("e4m3")

    def wrong(x, codes):
        if x.numel() == 1 and abs(float(x[0])) == 2 * f.max:
            return codes ^ 1
        return codes

    assert _choice(monkeypatch, "e4m3", True, torch.bfloat16, wrong) == "table"


def test_a_scalar_path_wrong_at_zero_is_refused_for_a_format_without_zero(monkeypatch):
    """E8M0 has no zero code, so 0.0 is no grid value: the probe checks it explicitly."""

    def wrong(x, codes):
        if x.numel() == 1 and float(x[0]) == 0.0:
            return codes ^ 1
        return codes

    assert _choice(monkeypatch, "e8m0", True, torch.bfloat16, wrong) == "table"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_chosen_path_gives_the_table_codes(dtype):
    """Whatever torch's cast does on this version, ``encode`` equals the tables on the probe's own inputs."""
    f = fp8sim.get_format("e4m3")
    dt = getattr(torch, dtype)
    x = torch.tensor(tb._critical_values(f), dtype=torch.float32).to(dt)
    assert torch.equal(fp8sim.encode(x, f), tb.encode_via_tables(x, f, True))
