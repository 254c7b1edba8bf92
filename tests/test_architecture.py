"""The import graph of ``fp8sim/`` has no circle and no arrow up (issue 25; docs/architecture.md).

The graph is read with ``ast`` from every ``.py`` file, every import statement counted wherever it
stands (module level, inside functions, under ``if TYPE_CHECKING``).  Each module, a package's
``__init__`` included, is a node:

* ``import a.b.c`` and ``from a.b import c`` where ``a.b.c`` is a module: an arrow to ``a.b.c``;
* ``from a.b import name`` where ``name`` is not a module: an arrow to ``a.b`` (its ``__init__``), so a
  module that takes a name from its own package's ``__init__``, which imports it back, closes a circle.

Importing ``a.b.c`` also runs ``a/__init__`` and ``a/b/__init__``; those implicit arrows are not drawn
(every submodule would otherwise be in a circle with the ``__init__`` that re-exports it).  Names
imported through ``importlib`` strings (the table of moved paths, ``fp8sim._util.moved``) are not arrows.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The layers, bottom first.  A module may import its own room and the rooms of lower layers, never a
# room of its own layer or of a higher one.  docs/architecture.md states the same table.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("fp8sim._util",),  # private plumbing: atomic files, output paths, progress, optional deps, moved paths
    ("fp8sim.formats",),  # FloatFormat records
    ("fp8sim.cast", "fp8sim.recipe"),  # bit-exact casts and conventions; TE's recipe records
    ("fp8sim",),  # the package face (fp8sim/__init__: formats, casts, conventions)
    ("fp8sim.scaling",),  # scaling recipes' quantizers and the quantized-data record
    ("fp8sim.collectives",),  # quantized data across processes, as bytes
    ("fp8sim.gemm",),  # emulated GEMMs and tensor-core accumulators
    ("fp8sim.pytorch", "fp8sim.torchao"),  # the integrations: TransformerEngine and torchao emulated
    ("fp8sim.accelerate",),  # accelerate over both
    ("fp8sim.native", "fp8sim.testing"),  # captures of native results and their comparison; the testing kit
    ("fp8sim.report", "fp8sim.run"),  # reports, conformance and studies; `fp8sim run` (the TE shim)
    ("fp8sim.cli",),  # the command line
    ("fp8sim.__main__",),  # python -m fp8sim
)


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """``{module: {modules it imports}}`` for every module of ``package`` under ``root`` (arrows to
    modules outside ``package`` left out)."""
    files = {module_name(root, p): p for p in sorted((root / package).rglob("*.py"))}

    def known(name: str) -> str | None:  # the module itself, or the package that holds the name
        parts = name.split(".")
        while parts and ".".join(parts) not in files:
            parts.pop()
        return ".".join(parts) or None

    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        arrows: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                arrows.update(known(a.name) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = here[: len(here) - node.level + 1] if node.level else []
                mod = ".".join(base + ([node.module] if node.module else []))
                for a in node.names:
                    arrows.add(f"{mod}.{a.name}" if f"{mod}.{a.name}" in files else known(mod))
        graph[name] = {a for a in arrows if a and a != name}
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle (a closed path, first module repeated last) per strongly connected component."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan, recursive: the graph is a few hundred nodes
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_circle(graph, comp) for comp in comps]


def _circle(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """A shortest closed path through the smallest module of ``comp`` (breadth first)."""
    start = min(comp)
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & comp):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [start, *reversed(path[:-1]), start] if len(path) > 1 else [start, v, start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError("not a strongly connected component")


def layer_of(module: str, layers: tuple[tuple[str, ...], ...]) -> tuple[int, str]:
    """``(layer index, room)`` of ``module``: the longest room name that is the module or a package above it."""
    best: tuple[int, str] | None = None
    for i, rooms in enumerate(layers):
        for room in rooms:
            if (module == room or module.startswith(room + ".")) and (best is None or len(room) > len(best[1])):
                best = (i, room)
    if best is None:
        raise ValueError(f"{module} is in no layer; add its room to the table")
    return best


def layer_violations(graph: dict[str, set[str]], layers: tuple[tuple[str, ...], ...]) -> list[str]:
    """Arrows that leave their room for a room of the same or a higher layer."""
    out = []
    for src, dsts in sorted(graph.items()):
        ls, rs = layer_of(src, layers)
        for dst in sorted(dsts):
            ld, rd = layer_of(dst, layers)
            if rd != rs and ld >= ls:
                out.append(f"{src} ({rs}, layer {ls}) -> {dst} ({rd}, layer {ld})")
    return out


def test_fp8sim_has_no_import_circle() -> None:
    cycles = find_cycles(import_graph(ROOT, "fp8sim"))
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_fp8sim_arrows_point_down_the_layers() -> None:
    bad = layer_violations(import_graph(ROOT, "fp8sim"), LAYERS)
    assert not bad, "arrows up or across a layer:\n" + "\n".join(bad)


def test_every_module_is_in_a_layer() -> None:
    for module in import_graph(ROOT, "fp8sim"):
        layer_of(module, LAYERS)


def test_the_graph_sees_imports_inside_functions_and_relative_ones() -> None:
    g = import_graph(ROOT, "fp8sim")
    assert "fp8sim.report.training_study" in g["fp8sim.cli"]  # `from .report.training_study import` in a function
    assert "fp8sim.cast.conventions" in g["fp8sim"]  # the package face's `from .cast.conventions import`


def test_docs_state_the_same_layer_table() -> None:
    rows = {}
    for line in (ROOT / "docs" / "architecture.md").read_text().splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 3 and cells[1].isdigit():
            rows[int(cells[1])] = tuple(c.strip("`") for c in cells[2].split(", "))
    assert rows == dict(enumerate(LAYERS))


# -- the checker fails where it must: synthetic packages ---------------------------------------------


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


def test_checker_finds_a_planted_circle_through_a_function_level_import(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from .b import g\n",
            "pkg/b.py": "def g():\n    from . import c\n",
            "pkg/c.py": "from pkg.a import x\n",
        },
    )
    assert find_cycles(import_graph(root, "pkg")) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]


def test_checker_finds_a_circle_through_a_package_init(tmp_path: Path) -> None:
    """A module taking a name from its package's ``__init__``, which imports the module back."""
    root = _package(
        tmp_path,
        {"pkg/__init__.py": "from .impl import f\nNAME = 1\n", "pkg/impl.py": "from . import NAME\n\ndef f(): ...\n"},
    )
    assert find_cycles(import_graph(root, "pkg")) == [["pkg", "pkg.impl", "pkg"]]


def test_checker_draws_no_arrow_for_a_sibling_module_imported_from_the_package(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {"pkg/__init__.py": "from .a import f\n", "pkg/a.py": "from . import b\n\ndef f(): ...\n", "pkg/b.py": ""},
    )
    g = import_graph(root, "pkg")
    assert g["pkg.a"] == {"pkg.b"} and not find_cycles(g)


def test_checker_finds_a_planted_arrow_up(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/low/__init__.py": "",
            "pkg/low/x.py": "def f():\n    from ..high.y import g\n",
            "pkg/high/__init__.py": "",
            "pkg/high/y.py": "from ..low.x import f\n",
            "pkg/mid.py": "from .low import x\n",
        },
    )
    layers = (("pkg.low",), ("pkg.mid", "pkg.high"), ("pkg",))
    bad = layer_violations(import_graph(root, "pkg"), layers)
    assert bad == ["pkg.low.x (pkg.low, layer 0) -> pkg.high.y (pkg.high, layer 1)"]
    assert find_cycles(import_graph(root, "pkg")) == [["pkg.high.y", "pkg.low.x", "pkg.high.y"]]
    with pytest.raises(ValueError, match="pkg.other is in no layer"):
        layer_of("pkg.other", (("pkg.low",),))


def test_checker_refuses_an_arrow_across_rooms_of_one_layer(tmp_path: Path) -> None:
    root = _package(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "import pkg.b\n", "pkg/b.py": ""})
    assert layer_violations(import_graph(root, "pkg"), (("pkg.a", "pkg.b"), ("pkg",))) == [
        "pkg.a (pkg.a, layer 0) -> pkg.b (pkg.b, layer 0)"
    ]



MAX_MODULE_LINES = 520  # "modules under ~500 lines" (BRIEF standards, docs/style.md), with a little slack
LONG_MODULES: dict[str, str] = {}  # path under fp8sim/ -> why it may be longer (none today)


def long_modules(pkg: Path, limit: int = MAX_MODULE_LINES) -> dict[str, int]:
    """The ``.py`` files under ``pkg`` longer than ``limit`` lines: path (relative, posix) -> lines."""
    out = {}
    for p in sorted(pkg.rglob("*.py")):
        n = len(p.read_text(encoding="utf-8").splitlines())
        if n > limit:
            out[p.relative_to(pkg).as_posix()] = n
    return out


def test_every_module_is_under_the_line_limit() -> None:
    """One idea per module, each readable in one sitting: no file in ``fp8sim/`` runs past
    :data:`MAX_MODULE_LINES` lines unless :data:`LONG_MODULES` names it with a reason."""
    pkg = ROOT / "fp8sim"
    assert all((pkg / p).is_file() for p in LONG_MODULES), "LONG_MODULES names a file that is gone"
    over = {p: n for p, n in long_modules(pkg).items() if p not in LONG_MODULES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines (split each along one idea): {over}"


def test_line_limit_checker_finds_a_planted_long_module(tmp_path: Path) -> None:
    (tmp_path / "room").mkdir()
    (tmp_path / "room" / "ok.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    (tmp_path / "room" / "long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert long_modules(tmp_path) == {"room/long.py": MAX_MODULE_LINES + 1}
