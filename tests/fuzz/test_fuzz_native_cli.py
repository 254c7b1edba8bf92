"""Fuzz of the capture reader (``fp8sim.native.read_bundle``) and the command line.

Capture files: a small valid capture with bytes flipped, cut short or appended to, or its header
edited; each read gives back exactly what was written or raises ``CaptureFileError`` naming the
file, never another exception.  The CLI: argument lists drawn from its grammar, run in an empty
folder: exit status 0, 1 or 2 (argparse's SystemExit included), a refusal is one line on stderr with
no traceback, and nothing is written but the path the arguments name.  Commands that would run a
long job (``verify``, ``report``, ``study``, ``capture``) are drawn only with at least one bad argument.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
import zipfile
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from _contract import FUZZ, deadline
from hypothesis import given
from hypothesis import strategies as st

from fp8sim import cli
from fp8sim.native.fileformat import CaptureFileError, read_bundle, write_bundle

pytestmark = pytest.mark.fuzz


@cache
def _capture() -> tuple[bytes, dict, dict]:
    """A valid capture (one cast op, one GEMM op), its bytes, header and arrays."""
    from test_native_files import _doc

    doc, arrays = _doc()
    path = Path(tempfile.mkdtemp(prefix="fp8sim-fuzz-")) / "good.fp8cap"
    write_bundle(path, arrays, doc)
    header, arrays = read_bundle(path)
    return path.read_bytes(), header, arrays


def _read(data: bytes) -> tuple[bool, object]:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "cap.fp8cap"
        path.write_bytes(data)
        try:
            with deadline():
                return True, read_bundle(path)
        except CaptureFileError as exc:
            assert str(path) in str(exc) and "Traceback" not in str(exc), str(exc)
            return False, exc
        except MemoryError as exc:
            raise AssertionError("MemoryError reading a damaged capture") from exc
        except Exception as exc:
            raise AssertionError(f"undocumented {type(exc).__name__} reading a damaged capture: {exc}") from exc


def _same_capture(got: tuple, header: dict, arrays: dict) -> bool:
    h, a = got
    return h == header and a.keys() == arrays.keys() and all(np.array_equal(a[k], arrays[k]) for k in a)


@st.composite
def damaged(draw: st.DrawFn) -> bytes:
    data = bytearray(_capture()[0])
    how = draw(st.sampled_from(["flip", "cut", "append", "splice"]))
    if how == "flip":
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, len(data) - 1))
            data[i] ^= draw(st.integers(1, 255))
    elif how == "cut":
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif how == "append":
        data += draw(st.binary(min_size=1, max_size=64))
    else:
        i = draw(st.integers(0, len(data)))
        data[i:i] = draw(st.binary(min_size=1, max_size=16))
    return bytes(data)


@FUZZ
@given(damaged())
def test_damaged_captures_read_back_whole_or_raise_capture_file_error(data: bytes) -> None:
    ok, got = _read(data)
    if ok:
        _, header, arrays = _capture()
        assert _same_capture(got, header, arrays), "a damaged capture read back as different data"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


@st.composite
def edited_headers(draw: st.DrawFn) -> bytes:
    """The capture with one header field (at any depth) replaced or dropped; array checksums kept."""
    raw, header, _ = _capture()
    header = json.loads(json.dumps(header))
    node, path = header, []
    while isinstance(node, (dict, list)) and node and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(node) if isinstance(node, dict) else list(range(len(node)))))
        path.append(key)
        if not isinstance(node[key], (dict, list)) or not node[key]:
            break
        node = node[key]
    parent = header
    for key in path[:-1]:
        parent = parent[key]
    if path and isinstance(parent, dict) and draw(st.booleans()):
        del parent[path[-1]]
    elif path:
        parent[path[-1]] = draw(JSON)
    else:
        header = draw(JSON)
    src = io.BytesIO(raw)
    out = io.BytesIO()
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(out, "w") as zout:
        for name in zin.namelist():
            data = zin.read(name)
            if name.endswith(".json"):
                data = json.dumps(header, allow_nan=True).encode()
            zout.writestr(name, data)
    return out.getvalue()


@FUZZ
@given(edited_headers())
def test_edited_headers_are_refused_naming_the_file(data: bytes) -> None:
    _read(data)  # the contract: the data back, or CaptureFileError naming the file


# -- the command line -----------------------------------------------------------------------------------
BAD_TOKENS = [
    "--bogus",
    "-x",
    "--steps",
    "0",
    "-1",
    "nan",
    "--out",
    "",
    "--device",
    "tpu",
    "--suite",
    "huge",
    "--",
    "\x00",
]


@st.composite
def argvs(draw: st.DrawFn) -> tuple[list[str], bool]:
    """(argv, heavy): heavy commands always carry a bad argument, so they stop before the work."""
    cmd = draw(st.sampled_from(["formats", "verify", "capture", "compare", "report", "study", "run", "bogus", ""]))
    argv = [cmd] if cmd else []
    bad = {
        "verify": [["--format", "e4m4"], ["--format"], ["--exhaustive", "--bogus"]],
        "capture": [["--out", "out.fp8cap", "--device", "tpu"], ["--out", "x.fp8cap", "--suite", "huge"],
                    ["--device", "cpu"]],
        "report": [["--captures", "missing-folder"], ["--out", "existing-file"], ["--quick", "--bogus"]],
        "study": [["--steps", "0"], ["--steps", "x"], ["--recipes", "nope"], ["--world-size", "two"],
                  ["--out", "existing-file"], ["--steps", "100001"]],
        "run": [["missing_script.py"], ["--scaled-mm"], ["--bogus", "x.py"], ["-m"]],
        "compare": [["missing.fp8cap"], ["good.fp8cap", "--ops", "nomatch*"],
                    ["good.fp8cap", "--require-bit-exact", "x"], ["good.fp8cap", "--report", "existing-file"],
                    ["existing-file"]],
    }  # fmt: skip
    if cmd in bad:
        argv += draw(st.sampled_from(bad[cmd]))
    argv += draw(st.lists(st.sampled_from(BAD_TOKENS), max_size=2)) if cmd in ("formats", "bogus", "") else []
    heavy = cmd in ("verify", "capture", "report", "study")
    return argv, heavy


@FUZZ
@given(argvs())
def test_cli_exits_0_1_or_2_with_one_line_and_writes_nothing_else(case: tuple[list[str], bool]) -> None:
    argv, _heavy = case
    raw = _capture()[0]
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "good.fp8cap").write_bytes(raw)
        (root / "existing-file").write_text("keep")
        before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
        out, err = io.StringIO(), io.StringIO()
        cwd = os.getcwd()
        os.chdir(root)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), deadline():
                try:
                    rc = cli.main(argv)
                except SystemExit as exc:  # argparse's usage errors and --help
                    rc = exc.code if isinstance(exc.code, int) else 2
        finally:
            os.chdir(cwd)
        text = err.getvalue()
        assert rc in (0, 1, 2), (argv, rc, text)
        assert "Traceback" not in text and "Traceback" not in out.getvalue(), (argv, text)
        if rc == 2:
            last = text.strip().splitlines()[-1] if text.strip() else ""
            assert last.startswith(("fp8sim", "usage:")) or "error" in last, (argv, text)
        after = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
        assert {p: b for p, b in after.items() if p in before} == before, f"{argv} changed an existing file"
        new = [p.relative_to(root) for p in after if p not in before]
        assert not new, f"{argv} wrote {new}"
