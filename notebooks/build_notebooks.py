"""Build the notebooks from their sources in ``notebooks/src/``, execute them and save them with outputs.

Usage (from anywhere)::

    python notebooks/build_notebooks.py                 # every notebook
    python notebooks/build_notebooks.py 02_scaling      # the ones whose name starts with an argument

Each source is a Python file in the "percent" format: ``# %%`` starts a code cell and
``# %% [markdown]`` a Markdown cell whose lines are comments (``# `` is stripped).  The sources are
ordinary Python, so ruff checks them and they run as scripts too.  The build makes one notebook per
source with nbformat, runs it with nbclient in a ``python3`` kernel with ``notebooks/`` as the working
directory (what Jupyter does when you open it there), and writes ``notebooks/<name>.ipynb``.  A cell
error stops the build and leaves the committed notebook untouched.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOK_DIR = Path(__file__).resolve().parent
SOURCE_DIR = NOTEBOOK_DIR / "src"
KERNEL_NAME = "python3"
CELL_TIMEOUT_S = 3600  # a guard against a hung kernel only: no cell is near it, even on a loaded CPU
_CELL_MARK = "# %%"
_MARKDOWN_MARK = "# %% [markdown]"


def sources() -> list[Path]:
    """The notebook sources, in order."""
    return sorted(SOURCE_DIR.glob("[0-9][0-9]_*.py"))


def _markdown(lines: list[str]) -> str:
    out = []
    for line in lines:
        if line == "#":
            out.append("")
        elif line.startswith("# "):
            out.append(line[2:])
        else:
            raise ValueError(f"a Markdown cell line must start with '# ' (or be '#'): {line!r}")
    return "\n".join(out).strip("\n")


def parse_cells(text: str) -> list[tuple[str, str]]:
    """``[(kind, source), ...]`` of a percent-format source, kind ``"markdown"`` or ``"code"``."""
    cells: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith(_CELL_MARK):
            rest = line[len(_CELL_MARK) :].strip()
            if rest not in ("", "[markdown]"):
                raise ValueError(f"unknown cell marker {line!r}: use '# %%' or '# %% [markdown]'")
            cells.append(("markdown" if line.startswith(_MARKDOWN_MARK) else "code", []))
        elif cells:
            cells[-1][1].append(line)
        elif line.strip():
            raise ValueError(f"text before the first cell marker: {line!r}")
    out = []
    for kind, lines in cells:
        while lines and not lines[-1].strip():
            lines.pop()
        src = _markdown(lines) if kind == "markdown" else "\n".join(lines).strip("\n")
        if src:
            out.append((kind, src))
    return out


def build(source: Path) -> nbformat.NotebookNode:
    """An unexecuted notebook from a source file."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": KERNEL_NAME, "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for kind, src in parse_cells(source.read_text()):
        cell = nbformat.v4.new_markdown_cell(src) if kind == "markdown" else nbformat.v4.new_code_cell(src)
        nb.cells.append(cell)
    return nb


def execute(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Run every cell in a fresh kernel with ``notebooks/`` as the working directory."""
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name=KERNEL_NAME,
        resources={"metadata": {"path": str(NOTEBOOK_DIR)}},
        record_timing=False,
    )
    client.execute()
    return nb


def _cell_ids(nb: nbformat.NotebookNode, stem: str) -> None:
    """Stable cell ids (nbformat draws random ones), so that a rebuild only changes what changed."""
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"{stem[:2]}-{i:03d}"


def main(argv: list[str]) -> int:
    chosen = [s for s in sources() if not argv or any(s.stem.startswith(a) for a in argv)]
    if not chosen:
        print(f"no notebook source matches {argv} in {SOURCE_DIR}", file=sys.stderr)
        return 2
    # ipykernel shows figures inline unless MPLBACKEND names another backend (as CI often does).
    os.environ.pop("MPLBACKEND", None)
    for src in chosen:
        start = time.perf_counter()
        nb = build(src)
        _cell_ids(nb, src.stem)
        execute(nb)
        target = NOTEBOOK_DIR / f"{src.stem}.ipynb"
        nbformat.validate(nb)
        nbformat.write(nb, target)
        print(f"{target.relative_to(NOTEBOOK_DIR.parent)}: {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
