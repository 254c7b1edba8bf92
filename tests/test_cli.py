"""The command line: `fp8sim formats`, `fp8sim verify` (exit status follows mismatches)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import fp8sim
from fp8sim import cli
from fp8sim.report import conformance


def test_formats_prints_every_format_with_its_limits(capsys: pytest.CaptureFixture[str]) -> None:
    import ml_dtypes

    from fp8sim.cast.conventions import ml_dtypes_rule

    assert cli.main(["formats"]) == 0
    out = capsys.readouterr().out
    for f in fp8sim.FORMATS.values():
        row = next(line for line in out.splitlines() if line.startswith(f"| {f.name} |"))
        assert f"{f.max:.6g} (0x{f.max_code:02x})" in row
    # the ml_dtypes release the ml_dtypes convention follows, and its rule, are named
    assert f"ml_dtypes {ml_dtypes.__version__} is installed" in out and f"`{ml_dtypes_rule().convention}`" in out
    ue5m3 = next(line for line in out.splitlines() if line.startswith("| ue5m3 |")).split(" | ")
    assert (ue5m3[-2] == "float8_e5m3fnu (absent here)") == (not hasattr(ml_dtypes, "float8_e5m3fnu"))


def test_verify_passes_and_prints_counts(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["verify", "--format", "e2m1", "--format", "e4m3", "--no-progress"]) == 0
    out = capsys.readouterr().out
    oracle = conformance.ml_dtypes_oracle()  # "ml_dtypes <installed version> (<its rule>)"
    assert f"| e4m3 | nearest_even | False | numpy | {oracle} | float16 (all 65,536) | 65,536 | 0 |" in out
    assert "| e4m3 | stochastic | True | torch | exact |" in out or "torch" not in sys.modules
    assert " 0 mismatches" in out


def test_verify_exits_nonzero_and_names_the_first_mismatch(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = conformance.encode

    def flipped(x, fmt, **kw):  # noqa: ANN001, ANN003, ANN202
        out = real(x, fmt, **kw)
        if isinstance(out, np.ndarray) and out.size > 300:
            out = out.copy()
            out[300] ^= 1  # one wrong low bit
        return out

    monkeypatch.setattr(conformance, "encode", flipped)
    monkeypatch.setattr(fp8sim.cast.conventions, "encode", flipped)  # the ml_dtypes rows run the convention
    assert cli.main(["verify", "--format", "e5m2", "--no-progress", "--no-torch"]) == 1
    out = capsys.readouterr().out
    assert f"MISMATCH e5m2 nearest_even saturate=False numpy vs {conformance.ml_dtypes_oracle()}: x=" in out
    assert "(#300)" in out


def test_module_entry_point_runs() -> None:
    res = subprocess.run([sys.executable, "-m", "fp8sim", "formats"], capture_output=True, text=True, check=True)
    assert "| e8m0 |" in res.stdout


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert "verify" in capsys.readouterr().out
