"""Capture files under races, kills and damage: one writer wins, nothing partial is left, and every
damaged or hand-edited file is refused with CaptureFileError before it is used."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from fp8sim._util import atomic as _atomic
from fp8sim.native.fileformat import CaptureFileError, read_bundle, write_bundle
from fp8sim.native.suite import input_set

# -- a small valid capture (one op of each kind; the schema checks shapes, not values) ------------


def _doc() -> tuple[dict, dict]:
    cast = {"name": "cast/e4m3/f16_all", "kind": "cast", "format": "e4m3", "inputs": "f16_all", "seed": 0}
    gemm = {
        "name": "scaled_mm/e4m3xe4m3/tensorwise/fast/float32/4x16x32",
        "kind": "scaled_mm",
        **dict(m=4, n=16, k=32, a_format="e4m3", b_format="e4m3", layout="tensorwise", fast_accum=True),
        **dict(out_dtype="float32", seed=100),
    }
    ao = {"name": "torchao/e4m3/axiswise/pow2=False", "kind": "torchao_float8"}
    ao |= {"format": "e4m3", "granularity": "axiswise", "pow2": False}
    meta = {"device": "cpu", "torch": "2.13.0+cpu", "compute_capability": None, "device_name": "x86_64"}
    arrays = {
        cast["name"]: np.zeros(input_set("f16_all").shape, np.uint8),
        gemm["name"]: np.zeros((4, 16), np.int32),
        ao["name"] + "/codes": np.zeros((64, 128), np.uint8),
        ao["name"] + "/scale": np.ones((64, 1), np.float32),
    }
    return {"meta": meta, "ops": [cast, gemm, ao], "suite": "quick", "suite_version": 1}, arrays


@pytest.fixture
def good(tmp_path: Path) -> Path:
    doc, arrays = _doc()
    return write_bundle(tmp_path / "good.fp8cap", arrays, doc)


def _rewrite(src: Path, dst: Path, edit) -> Path:  # noqa: ANN001
    """Copy the capture with its header edited by ``edit(header) -> header`` (checksums kept)."""
    with zipfile.ZipFile(src) as z:
        members = {n: z.read(n) for n in z.namelist()}
    members["__meta__.json"] = json.dumps(edit(json.loads(members["__meta__.json"]))).encode()
    with zipfile.ZipFile(dst, "w") as z:
        for n, b in members.items():
            z.writestr(n, b)
    return dst


def _set(path: tuple, value: object):  # noqa: ANN202
    def edit(h: dict) -> dict:
        node = h
        for p in path[:-1]:
            node = node[p]
        node[path[-1]] = value
        return h

    return edit


def _drop(key: str):  # noqa: ANN202
    return lambda h: {k: v for k, v in h.items() if k != key}


DAMAGE = {
    "header is a list": (lambda h: [h], "must be a JSON object"),
    "header is a string": (lambda h: "fp8sim-capture", "must be a JSON object"),
    "no ops": (_drop("ops"), "no 'ops'"),
    "no meta": (_drop("meta"), "no 'meta'"),
    "ops not a list": (_set(("ops",), {"a": 1}), "ops must be an array"),
    "op not an object": (_set(("ops", 0), "cast"), r"ops\[0\] must be an object"),
    "unknown format": (_set(("ops", 0, "format"), "e4m4"), r"ops\[0\].format is 'e4m4'; allowed: e4m3"),
    "unknown input set": (_set(("ops", 0, "inputs"), "f8_all"), "inputs is 'f8_all'"),
    "seed a string": (_set(("ops", 0, "seed"), "0"), "seed must be an integer"),
    "m a bool": (_set(("ops", 1, "m"), True), "m must be an integer"),
    "k zero": (_set(("ops", 1, "k"), 0), "k is 0; allowed"),
    # issue 29.10: a GEMM torch._scaled_mm refuses cannot have been captured; compare would raise its RuntimeError
    "n not a multiple of 16": (_set(("ops", 1, "n"), 20), r"ops\[1\].n is 20; torch._scaled_mm takes multiples of 16"),
    "e5m2 x e5m2": (
        lambda h: _set(("ops", 1, "b_format"), "e5m2")(_set(("ops", 1, "a_format"), "e5m2")(h)),
        "both e5m2",
    ),
    "layout unknown": (_set(("ops", 1, "layout"), "colwise"), "layout is 'colwise'"),
    "pow2 a string": (_set(("ops", 2, "pow2"), "no"), "pow2 must be a boolean"),
    "duplicate op": (lambda h: h | {"ops": h["ops"] + h["ops"][:1]}, "appears twice"),
    "checksum a number": (_set(("sha256", "cast/e4m3/f16_all"), 12), "must be 64 lowercase hex digits"),
    "checksums a list": (_set(("sha256",), []), "sha256 must be an object"),
    "torch version garbage": (_set(("meta", "torch"), "two point thirteen"), "not a version"),
    "torch version a number": (_set(("meta", "torch"), 2.13), "meta.torch must be a string"),
    "device unknown": (_set(("meta", "device"), "tpu"), "meta.device is 'tpu'"),
    "compute capability a string": (_set(("meta", "compute_capability"), "9.0"), "compute_capability"),
    "version 0": (_set(("version",), 0), "version 0 is not a capture format version"),
    "version -1": (_set(("version",), -1), "version -1 is not a capture format version"),
    "version true": (_set(("version",), True), "version must be an integer, got boolean"),
    "version '1'": (_set(("version",), "1"), "version must be an integer, got string"),
    "version 1.0": (_set(("version",), 1.0), "version must be an integer, got float"),
    "version missing": (_drop("version"), "version must be an integer, got null"),
    "foreign format": (_set(("format",), "npz"), "not an fp8sim capture"),
}


@pytest.mark.parametrize("case", list(DAMAGE), ids=list(DAMAGE))
def test_hand_edited_header_is_refused_naming_the_field(good: Path, tmp_path: Path, case: str) -> None:
    edit, message = DAMAGE[case]
    bad = _rewrite(good, tmp_path / "bad.fp8cap", edit)
    with pytest.raises(CaptureFileError, match=message) as info:
        read_bundle(bad)
    if case == "version '1'":
        assert "newer" not in str(info.value)


@pytest.mark.parametrize(
    "name,array",
    [
        ("cast/e4m3/f16_all", np.zeros(1000, np.uint8)),  # wrong length
        ("cast/e4m3/f16_all", np.zeros(input_set("f16_all").shape, np.int16)),  # wrong dtype
        ("scaled_mm/e4m3xe4m3/tensorwise/fast/float32/4x16x32", np.zeros((4, 5), np.int32)),  # 4x16 expected
        ("torchao/e4m3/axiswise/pow2=False/scale", np.ones(3, np.float32)),
    ],
)
def test_wrong_shaped_or_typed_array_is_refused(tmp_path: Path, name: str, array: np.ndarray) -> None:
    doc, arrays = _doc()
    arrays[name] = array  # write_bundle recomputes the checksums: only the schema can tell
    bad = write_bundle(tmp_path / "bad.fp8cap", arrays, doc)
    with pytest.raises(CaptureFileError, match=r"has (shape|dtype|\d+ elements)"):
        read_bundle(bad)
    doc, arrays = _doc()
    del arrays[name]
    with pytest.raises(CaptureFileError, match="has no array"):
        read_bundle(write_bundle(tmp_path / "missing.fp8cap", arrays, doc))


def _central_entries(data: bytes) -> list[int]:
    out, i = [], data.find(b"PK\x01\x02")
    while i >= 0:
        out.append(i)
        i = data.find(b"PK\x01\x02", i + 4)
    return out


@pytest.mark.parametrize("field", ["compression 99", "compression bzip2 claimed", "encrypted flag"])
def test_zip_fields_selecting_other_compression_or_encryption_are_refused(
    good: Path, tmp_path: Path, field: str
) -> None:
    data = bytearray(good.read_bytes())
    for off in _central_entries(bytes(data)) + [0]:  # every central entry and the first local header
        local = off == 0
        if field == "encrypted flag":
            pos = off + (6 if local else 8)
            data[pos : pos + 2] = struct.pack("<H", struct.unpack("<H", data[pos : pos + 2])[0] | 1)
        else:
            pos = off + (8 if local else 10)
            data[pos : pos + 2] = struct.pack("<H", 99 if field == "compression 99" else zipfile.ZIP_BZIP2)
    bad = tmp_path / "bad.fp8cap"
    bad.write_bytes(bytes(data))
    with pytest.raises(CaptureFileError):
        read_bundle(bad)


def test_non_regular_files_are_refused_before_reading(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.fp8cap"
    os.mkfifo(fifo)  # opening it would block until a writer came
    with pytest.raises(CaptureFileError, match="is a FIFO, not a regular file"):
        read_bundle(fifo)
    with pytest.raises(CaptureFileError, match="is a folder, not a regular file"):
        read_bundle(tmp_path)
    if os.path.exists("/dev/zero"):
        with pytest.raises(CaptureFileError, match="is a device, not a regular file"):
            read_bundle("/dev/zero")
    from fp8sim import cli

    assert cli.main(["compare", str(fifo), "--no-progress"]) == 2


# -- races, kills and leftovers -----------------------------------------------------------------


def _race(target: Path, n: int) -> list[object]:
    doc, arrays = _doc()
    barrier = threading.Barrier(n)
    results: list[object] = [None] * n

    def writer(i: int) -> None:
        a = dict(arrays)
        a["torchao/e4m3/axiswise/pow2=False/scale"] = np.full((64, 1), i + 1, np.float32)  # who wrote it
        barrier.wait()
        try:
            write_bundle(target, a, doc)
            results[i] = "ok"
        except FileExistsError as exc:
            results[i] = exc

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_concurrent_writers_in_threads_exactly_one_wins(tmp_path: Path) -> None:
    for trial in range(15):
        target = tmp_path / f"race{trial}.fp8cap"
        results = _race(target, 4)
        winners = [i for i, r in enumerate(results) if r == "ok"]
        assert len(winners) == 1, f"trial {trial}: {results}"
        assert all("exists; pass --force" in str(r) for r in results if r != "ok")
        _, arrays = read_bundle(target)
        assert arrays["torchao/e4m3/axiswise/pow2=False/scale"][0, 0] == winners[0] + 1  # the winner's file
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


_PROC_WRITER = """
import sys, time, os, numpy as np
sys.path.insert(0, {root!r})
from fp8sim.native.fileformat import write_bundle
go = {go!r}
while not os.path.exists(go):
    time.sleep(0.001)
doc = {{"meta": {{"device": "cpu", "torch": "2.13"}}, "ops": []}}
try:
    write_bundle({target!r}, {{"x": np.arange(1000) + {i}}}, doc)
    print("ok")
except FileExistsError:
    print("exists")
"""


def test_concurrent_writers_in_processes_exactly_one_wins(tmp_path: Path) -> None:
    root = str(Path(__file__).resolve().parents[1])
    for trial in range(3):
        target, go = tmp_path / f"p{trial}.fp8cap", tmp_path / f"go{trial}"
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _PROC_WRITER.format(root=root, go=str(go), target=str(target), i=i)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in range(3)
        ]
        time.sleep(0.5)  # not an assertion: lets the writers reach the start line together
        go.touch()
        outs = [p.communicate()[0].strip() for p in procs]
        assert sorted(outs) == ["exists", "exists", "ok"], f"trial {trial}: {outs}"
        read_bundle(target)


def test_publish_without_hard_links_still_refuses_an_existing_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    def no_links(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(_atomic.os, "link", no_links)
    doc, arrays = _doc()
    target = write_bundle(tmp_path / "a.fp8cap", arrays, doc)
    read_bundle(target)
    with pytest.raises(FileExistsError):
        write_bundle(target, arrays, doc)
    results = _race(tmp_path / "b.fp8cap", 4)
    assert sum(r == "ok" for r in results) == 1


def test_dangling_symlink_at_the_target_is_not_replaced_without_force(tmp_path: Path) -> None:
    link = tmp_path / "link.fp8cap"
    link.symlink_to(tmp_path / "nowhere")
    doc, arrays = _doc()
    with pytest.raises(FileExistsError):
        write_bundle(link, arrays, doc)
    assert link.is_symlink() and not link.exists()
    from fp8sim import cli

    assert cli.main(["capture", "--out", str(link), "--no-progress"]) == 2
    write_bundle(link, arrays, doc, force=True)  # --force replaces the link itself
    assert not link.is_symlink() and read_bundle(link)


_KILLED_WRITER = """
import sys, time
sys.path.insert(0, {root!r})
from fp8sim._util.atomic import atomic_dir, atomic_file, install_signal_cleanup
install_signal_cleanup()
if {folder!r}:
    with atomic_dir({target!r}, replace=True) as d:
        (d / "README.md").write_text("new, half done")
        print("writing", flush=True)
        time.sleep(600)
with atomic_file({target!r}) as f:
    f.write(b"partial")
    f.flush()
    print("writing", flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize("folder", [False, True], ids=["file", "report folder"])
def test_sigterm_during_a_write_leaves_nothing_behind(tmp_path: Path, folder: bool) -> None:
    target = tmp_path / ("report" if folder else "out.fp8cap")
    if folder:  # an old report that must survive
        target.mkdir()
        (target / "README.md").write_text("old")
    root = str(Path(__file__).resolve().parents[1])
    script = _KILLED_WRITER.format(root=root, target=str(target), folder=folder)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "writing"
    assert [n for n in os.listdir(tmp_path) if ".tmp" in n]  # the temporary exists while writing
    p.send_signal(signal.SIGTERM)
    assert p.wait() == -signal.SIGTERM
    assert os.listdir(tmp_path) == (["report"] if folder else [])
    if folder:
        assert os.listdir(target) == ["README.md"] and (target / "README.md").read_text() == "old"


_SIGTERM_AT_EVERY_STEP = """
import importlib.util, os, signal, sys
spec = importlib.util.spec_from_file_location("atomic", {module!r})  # alone: forks stay cheap without numpy
_atomic = importlib.util.module_from_spec(spec)
spec.loader.exec_module(_atomic)
assert _atomic.install_signal_cleanup()
target, folder = {target!r}, {folder!r}
STEPS = {{"atomic_file", "atomic_dir", "_create", "_register", "_forget", "_put_back", "publish_file"}}


def write(n):
    count = [0]

    def step(frame, event, arg):
        if event == "line":
            count[0] += 1
            if count[0] == n:
                os.kill(os.getpid(), signal.SIGTERM)
        return step

    def tracer(frame, event, arg):
        if frame.f_code.co_filename != _atomic.__file__ or frame.f_code.co_name not in STEPS:
            return None
        return step(frame, event, arg)

    signal.alarm(5)  # a handler that deadlocks is killed by SIGALRM (and reported as such)
    sys.settrace(tracer)
    if folder:
        with _atomic.atomic_dir(target, replace=True) as d:
            (d / "README.md").write_text("new")
    else:
        with _atomic.atomic_file(target) as f:
            f.write(b"new")
    sys.settrace(None)
    os._exit(0)


for n in range(1, 10_000):
    pid = os.fork()
    if pid == 0:
        write(n)
    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    left = sorted(os.listdir(os.path.dirname(target)))
    if status == -signal.SIGALRM:
        print(f"step {{n}}: hung in the SIGTERM handler", flush=True)
        sys.exit(1)
    if left != [os.path.basename(target)] and (left or folder):
        print(f"step {{n}} (exit {{status}}): left {{left}}", flush=True)
        sys.exit(1)
    if status == 0:
        print(f"ok {{n}}")
        break
    if not folder and left:
        os.unlink(target)
"""


@pytest.mark.parametrize("folder", [False, True], ids=["file", "report folder"])
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_sigterm_at_every_step_of_a_write_leaves_nothing_behind(tmp_path: Path, folder: bool) -> None:
    """SIGTERM delivered at each line of a write in turn: no temporary survives, the handler
    never deadlocks on its own lock, and an old report folder is never lost (issue 29.1: the
    temporary was created before it was registered for cleanup)."""
    target = tmp_path / ("report" if folder else "out.fp8cap")
    if folder:
        target.mkdir()
        (target / "README.md").write_text("old")
    script = _SIGTERM_AT_EVERY_STEP.format(module=_atomic.__file__, target=str(target), folder=folder)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stdout + r.stderr[-2000:]


def test_temporaries_of_dead_writers_are_swept_by_the_next_write(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".out.fp8cap.{dead.pid}.abcd1234.tmp"  # as kill -9 leaves it
    alive = tmp_path / f".out.fp8cap.{os.getppid()}.efgh5678.tmp"  # a writer that still runs
    other = tmp_path / f".other.fp8cap.{dead.pid}.abcd1234.tmp"  # another target's
    for p in (stale, alive, other):
        p.write_bytes(b"partial")
        os.utime(p, (time.time() - 3600, time.time() - 3600))
    doc, arrays = _doc()
    write_bundle(tmp_path / "out.fp8cap", arrays, doc)
    assert not stale.exists() and alive.exists() and other.exists()


def test_failed_folder_build_keeps_the_old_folder(tmp_path: Path) -> None:
    out = tmp_path / "report"
    with _atomic.atomic_dir(out) as d:
        (d / "README.md").write_text("old\n")
    with pytest.raises(RuntimeError, match="interrupted"), _atomic.atomic_dir(out, replace=True) as d:
        (d / "README.md").write_text("new, half done\n")
        (d / "plot.png").write_bytes(b"x")
        raise RuntimeError("interrupted")
    assert sorted(os.listdir(out)) == ["README.md"] and (out / "README.md").read_text() == "old\n"
    assert os.listdir(tmp_path) == ["report"]
    with _atomic.atomic_dir(out, replace=True) as d:
        (d / "README.md").write_text("new\n")
    assert (out / "README.md").read_text() == "new\n" and os.listdir(tmp_path) == ["report"]
