"""The project documents itself, and the documents stay true: ``docs/semantics.md`` exists and is what the
README, notebook 01 and the tests point to (never a file outside the repository); the README is a front page
(two set-up commands, links into ``docs/`` that resolve, a layout that names every package); the docs pages
name every format, convention, accumulator, profile and CLI option the code has.  The site build and the
code blocks are run by ``tests/test_docs_site.py``."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import fp8sim

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _doc(name: str) -> str:
    return (ROOT / "docs" / name).read_text()


def test_semantics_are_documented_in_the_repository_and_pointed_to() -> None:
    doc = _doc("semantics.md")
    headings = re.findall(r"^## (\d+)\. ", doc, re.M)
    assert headings == [str(i) for i in range(1, 12)]  # the numbering the tests' "spec section N" cite
    assert "docs/semantics.md" in README
    assert "../docs/semantics.md" in (ROOT / "notebooks" / "src" / "01_format_explorer.py").read_text()
    pointing = [ROOT / "README.md", *(ROOT / "tests").glob("*.py"), *(ROOT / "notebooks" / "src").glob("*.py")]
    for path in pointing:
        if path.name != "test_docs.py":
            assert "shared/spec" not in path.read_text(), f"{path.relative_to(ROOT)} points outside the repository"


def test_readme_set_up_is_two_commands_and_the_first_runs_the_main_job() -> None:
    setup = README.split("## Set up", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", setup, re.S)
    assert len(blocks) == 2, blocks
    assert blocks[0].strip().endswith("&& fp8sim report")
    # the newest pinned oracles on 2 workers (pytest-xdist, in the test extra), then the oldest end (nox)
    assert blocks[1].strip().endswith("&& python -m pytest -q -n 2 && nox -s oldest")
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert "pytest-xdist==" in pyproject and '"nox>=' in pyproject
    assert "<!-- test-command -->\n```bash\npython3 " in setup  # the line .ci/run finds and runs
    assert "saturate=True` (the default)" in _doc("cast.md")
    assert 'pip install torch==2.13.0 -e ".[notebooks]"' in _doc("notebooks.md")


def test_readme_is_a_front_page() -> None:
    lines = README.splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; long text belongs in docs/"
    # the two set-up commands stay one pasteable line each
    long = [i + 1 for i, line in enumerate(lines) if len(line) > 120 and not line.startswith("python3 -m venv ")]
    assert not long, f"README.md lines over 120 characters: {long}"
    assert "## Test your FP8 code in CI" not in README  # docs/testing_in_ci.md is the one copy


def test_relative_links_of_readme_and_docs_resolve() -> None:
    pages = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target:
                assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links to a missing {target}"
    for name in ("cast", "conventions", "scaling", "gemm", "te", "torchao", "accelerate", "distributed"):
        assert f"(docs/{name}.md" in README, f"README.md does not link docs/{name}.md"
    for name in ("evidence", "testing_in_ci", "cli", "notebooks"):
        assert f"(docs/{name}.md" in README, f"README.md does not link docs/{name}.md"


def test_readme_layout_names_every_package() -> None:
    layout = README.split("## Layout", 1)[1].split("\n## ", 1)[0]
    packages = sorted(p.parent.name for p in (ROOT / "fp8sim").glob("*/__init__.py"))
    missing = [name for name in packages if f"fp8sim/{name}/" not in layout]
    assert not missing, f"README.md's layout omits fp8sim/{missing}"
    stale = [path for path in re.findall(r"\bfp8sim/[\w/.*]+", layout) if not list(ROOT.glob(path.rstrip("/")))]
    assert not stale, f"README.md's layout names paths that do not exist: {stale}"
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    words = {3: "Three", 4: "Four", 5: "Five", 6: "Six", 7: "Seven"}
    assert f"{words[len(notebooks)]} notebooks" in README


def test_docs_name_every_format_convention_accumulator_and_profile() -> None:
    from fp8sim.gemm import ACCUMULATORS, INSTRUCTION_MODELS, PROFILES

    cast, conventions, gemm = _doc("cast.md"), _doc("conventions.md"), _doc("gemm.md")
    assert [f for f in fp8sim.FORMATS if f"`{f}`" not in cast] == []
    assert [c for c in fp8sim.CONVENTIONS if f"| `{c}`" not in conventions] == []
    assert [m for m in (*fp8sim.ROUNDING_MODES,) if f"`{m}`" not in cast] == []
    for names in (ACCUMULATORS, INSTRUCTION_MODELS, PROFILES):
        assert [n for n in names if f"`{n}`" not in gemm] == []


def test_cli_reference_names_every_command_and_option() -> None:
    from fp8sim import cli

    cli_doc = _doc("cli.md")
    commands = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    flags = {name: [f for a in sub._actions for f in a.option_strings] for name, sub in commands.choices.items()}
    # `fp8sim run` parses its own options (the rest belongs to the script): read them from its --help
    run_help = subprocess.run(
        [sys.executable, "-m", "fp8sim", "run", "--help"], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    flags["run"] = re.findall(r"^\s+(--[a-z][a-z-]*)", run_help, re.M)
    assert "--device-map" in flags["run"], run_help
    for name, options in flags.items():
        assert f"`fp8sim {name}" in cli_doc, f"docs/cli.md does not document `fp8sim {name}`"
        for flag in options:
            if flag.startswith("--") and flag != "--help":
                assert flag in cli_doc, f"docs/cli.md does not document `fp8sim {name} {flag}`"
