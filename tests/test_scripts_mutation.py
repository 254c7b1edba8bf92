"""scripts/mutation.py's sampled score: the Wilson interval and a reproducible uniform sample."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parent.parent / "scripts" / "mutation.py"


def _script():
    spec = importlib.util.spec_from_file_location("fp8sim_mutation_script", _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("k", "n", "low", "high"),
    [
        # published values: Newcombe (1998), Statistics in Medicine 17:857, Table I (95 %, Wilson "method 3")
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
    ],
)
def test_wilson_interval_matches_newcombes_table(k: int, n: int, low: float, high: float) -> None:
    got = _script()._wilson(k, n)
    assert got == pytest.approx((low, high), abs=5e-5)


def test_all_mutants_reads_every_meta_file_in_name_order(tmp_path: Path) -> None:
    script = _script()
    for rel, keys in (
        ("fp8sim/a.py.meta", ["a.f__mutmut_1", "a.f__mutmut_2"]),
        ("fp8sim/b/c.py.meta", ["c.g__mutmut_1"]),
    ):
        meta = tmp_path / "mutants" / rel
        meta.parent.mkdir(parents=True)
        meta.write_text(json.dumps({"exit_code_by_key": dict.fromkeys(keys)}), "utf-8")
    assert script._all_mutants(tmp_path) == ["a.f__mutmut_1", "a.f__mutmut_2", "c.g__mutmut_1"]


def test_sample_rejects_a_size_below_one(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit, match="--sample must be a positive number of mutants, got 0"):
        _script().main(["testing", "--sample", "0"])


def _fake_root(script, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "pyproject.toml").write_text((_PATH.parent.parent / "pyproject.toml").read_text("utf-8"), "utf-8")
    monkeypatch.setattr(script, "ROOT", tmp_path)
    return tmp_path / ".mutation" / "testing"


def test_a_second_seed_keeps_its_own_sample_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = _script()
    work = _fake_root(script, tmp_path, monkeypatch)
    work.mkdir(parents=True)
    (work / "sample.txt").write_text("a.f__mutmut_1\n", "utf-8")
    # the first sample's names stay where --seed 30 reads them; another seed has none yet
    with pytest.raises(SystemExit, match="no sample drawn yet for 'testing' with --seed 31"):
        script.main(["testing", "--recheck", "--sample", "1", "--seed", "31"])
    assert (work / "sample.txt").read_text("utf-8") == "a.f__mutmut_1\n"
    (work / "sample-seed31.txt").write_text("b.g__mutmut_2\n", "utf-8")
    with pytest.raises(SystemExit, match="no sampled mutant matches"):
        script.main(["testing", "--recheck", "--sample", "1", "--seed", "31", "a.f*"])
