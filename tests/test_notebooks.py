"""The notebooks run top to bottom without a cell error, and the committed copies are executed and
current with their sources in ``notebooks/src/`` (``notebooks/README.md``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from fp8sim.testing.oracles import require

nbformat = require("nbformat")
nbclient = require("nbclient")
require("ipykernel")

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
EXPECTED = ("01_format_explorer", "02_scaling_under_outliers", "04_validate_gpu_outputs")
CELL_TIMEOUT_S = 3600  # a guard against a hung kernel only: no cell is near it, even on a loaded CPU
REBUILD = "python notebooks/build_notebooks.py"


def _builder():
    spec = importlib.util.spec_from_file_location("build_notebooks", NOTEBOOK_DIR / "build_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ids(paths: list[Path]) -> list[str]:
    return [p.stem for p in paths]


def test_every_notebook_is_committed_and_built_from_a_source() -> None:
    stems = {p.stem for p in NOTEBOOKS}
    sources = {p.stem for p in _builder().sources()}
    assert set(EXPECTED) <= stems, f"missing notebooks: {sorted(set(EXPECTED) - stems)}; run {REBUILD}"
    assert stems == sources, (
        f"notebooks without a source in notebooks/src/: {sorted(stems - sources)}; "
        f"sources never built: {sorted(sources - stems)} (run {REBUILD})"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_executes_top_to_bottom_without_cell_errors(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MPLBACKEND", raising=False)  # let ipykernel use its inline backend, as in Jupyter
    monkeypatch.setenv("FP8SIM_NOTEBOOK_QUICK", "1")  # long trainings run shortened: this checks that cells run
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK_DIR)}}
    )
    client.execute()  # raises CellExecutionError with the cell's traceback
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, f"{path.name}: {errors[0].ename}: {errors[0].evalue}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_committed_notebook_holds_the_outputs_of_one_run(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3", f"{path.name}: kernel must be python3"
    code = [c for c in nb.cells if c.cell_type == "code"]
    counts = [c.execution_count for c in code]
    assert counts == list(range(1, len(code) + 1)), (
        f"{path.name} was not executed top to bottom in one run (execution counts {counts}); run {REBUILD}"
    )
    outputs = [o for c in code for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"], f"{path.name} was saved with an error output"
    assert any("image/png" in o.get("data", {}) for o in outputs), f"{path.name} has no inline PNG figure"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_committed_notebook_matches_its_source(path: Path) -> None:
    builder = _builder()
    source = builder.SOURCE_DIR / f"{path.stem}.py"
    if not source.exists():
        pytest.fail(f"{path.name} has no source {source.relative_to(NOTEBOOK_DIR.parent)}")
    want = builder.parse_cells(source.read_text())
    got = [(c.cell_type, c.source) for c in nbformat.read(path, as_version=4).cells]
    assert got == want, f"{path.name} is out of date with {source.name}: run {REBUILD} {path.stem[:2]}"
