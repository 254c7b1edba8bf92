"""The documentation works: ``mkdocs build --strict`` builds the site (every page, link, heading anchor and
API-reference entry resolves), and every Python code block of README.md and docs/*.md runs.

Code blocks run with Sybil, one test per page: the blocks of a page share one namespace and run in order, as
a reader runs them, in a temporary working directory in which ``reports/`` is the repository's (so the paths
the pages use resolve and nothing is written into the checkout).  A block that cannot run here (it needs
several ranks, or it is a test file that another test runs) is preceded by ``<!-- skip: next -->``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fp8sim.testing.oracles import require

require("sybil")  # the docs run with torch: not part of the lean session
from sybil import Sybil  # noqa: E402
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
# pages whose blocks the suite runs: a page without a Python block is checked by the build only
PYTHON_PAGES = [p for p in PAGES if "```python" in p.read_text()]


def test_docs_site_builds_in_strict_mode(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(tmp_path / "site")]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    gemm = (tmp_path / "site" / "api" / "gemm" / "index.html").read_text()
    for anchor in ("fp8sim.gemm.dot_add", "fp8sim.gemm.scaled_mm.scaled_mm", "fp8sim.gemm.DeviceProfile"):
        assert f'id="{anchor}"' in gemm, f"the API reference lost {anchor}"


def test_every_page_is_in_the_site_navigation() -> None:
    config = (ROOT / "mkdocs.yml").read_text()
    missing = [str(p.relative_to(ROOT / "docs")) for p in PAGES if p.parent != ROOT and p.name != "README.md"]
    missing = [name for name in missing if f": {name}" not in config]
    assert not missing, f"docs pages missing from mkdocs.yml's nav: {missing}"


@pytest.fixture
def reader_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "reports").symlink_to(ROOT / "reports", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    return tmp_path


@pytest.mark.parametrize("page", PYTHON_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_code_blocks_run(page: Path, reader_cwd: Path) -> None:
    document = Sybil(parsers=[PythonCodeBlockParser(), SkipParser()]).parse(page)
    environ = dict(os.environ)
    try:
        for example in document:
            try:
                example.evaluate()
            except Exception as exc:
                raise AssertionError(f"{page.relative_to(ROOT)}, line {example.line}: the code block failed") from exc
    finally:
        import fp8sim.shim

        fp8sim.shim.uninstall()  # a page that shows the shim must not leave it installed
        os.environ.clear()
        os.environ.update(environ)
    assert list(document), f"{page.relative_to(ROOT)}: no code block found"
