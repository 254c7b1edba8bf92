"""The project documents itself: ``docs/semantics.md`` exists and is what the README, notebook 01 and
the tests point to (never a file outside the repository); the README's set-up is two commands."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_semantics_are_documented_in_the_repository_and_pointed_to() -> None:
    doc = (ROOT / "docs" / "semantics.md").read_text()
    headings = re.findall(r"^## (\d+)\. ", doc, re.M)
    assert headings == [str(i) for i in range(1, 12)]  # the numbering the tests' "spec section N" cite
    assert "docs/semantics.md" in (ROOT / "README.md").read_text()
    assert "../docs/semantics.md" in (ROOT / "notebooks" / "src" / "01_format_explorer.py").read_text()
    pointing = [ROOT / "README.md", *(ROOT / "tests").glob("*.py"), *(ROOT / "notebooks" / "src").glob("*.py")]
    for path in pointing:
        if path.name != "test_docs.py":
            assert "shared/spec" not in path.read_text(), f"{path.relative_to(ROOT)} points outside the repository"


def test_readme_set_up_is_two_commands_and_the_first_runs_the_main_job() -> None:
    readme = (ROOT / "README.md").read_text()
    setup = readme.split("## Set up", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", setup, re.S)
    assert len(blocks) == 2, blocks
    assert blocks[0].strip().endswith("&& fp8sim report")
    # the newest pinned oracles on 2 workers (pytest-xdist, in the test extra), then the oldest end (nox)
    assert blocks[1].strip().endswith("&& python -m pytest -q -n 2 && nox -s oldest")
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert "pytest-xdist==" in pyproject and '"nox>=' in pyproject
    assert "saturate=True` (the default)" in readme
    assert 'pip install torch==2.13.0 -e ".[notebooks]"' in readme
