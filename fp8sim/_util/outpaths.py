"""Checks on output paths, made before any work starts, so that an hour-long capture never ends in
a PermissionError.  Each failure is an :class:`OutputPathError` naming the path and the reason."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path

__all__ = ["OutputPathError", "check_output_file", "check_output_dir", "check_input_file", "MARKER", "write_marker"]

MARKER = ".fp8sim-output.json"  # marks a folder fp8sim wrote, so that a rerun may replace it
MARKER_VERSION = 1


class OutputPathError(ValueError):
    """An output (or input) path that cannot be used; the message names the path and why."""

    def __init__(self, path: str | os.PathLike, reason: str) -> None:
        self.path, self.reason = os.fspath(path), reason
        super().__init__(f"{self.path}: {reason}")


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return 255


def _existing_ancestor(path: Path) -> Path:
    p = path.parent if str(path.parent) else Path(".")
    while not os.path.lexists(p) and p != p.parent:
        p = p.parent
    return p


def _check_parent(path: Path) -> None:
    anc = _existing_ancestor(path)
    if not anc.is_dir():
        raise OutputPathError(path, f"{anc} is not a folder")
    n, limit = len(os.fsencode(path.name)), _name_max(anc)
    if n > limit:
        raise OutputPathError(path, f"file name too long ({n} bytes; this file system allows {limit})")
    # try it: os.access says yes to root even on a read-only file system
    try:
        fd, probe = tempfile.mkstemp(prefix=".fp8sim-probe.", dir=anc)
    except OSError as exc:
        raise OutputPathError(path, f"cannot write in {anc} ({exc.strerror or exc})") from None
    os.close(fd)
    os.unlink(probe)


def check_output_file(path: str | os.PathLike, *, force: bool = False) -> Path:
    """``path`` can receive a new file: not a folder, not taken (unless ``force``; a dangling
    symlink counts as taken), in a folder that exists or can be made and is writable."""
    path = Path(path)
    if os.path.lexists(path):
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode):
            raise OutputPathError(path, "is a folder, not a file" + ("; --force replaces files only" if force else ""))
        if not force:
            what = "a dangling symlink" if stat.S_ISLNK(st.st_mode) and not path.exists() else "a file"
            raise OutputPathError(path, f"exists ({what}); pass --force to overwrite it")
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
            raise OutputPathError(path, "is not a regular file; refusing to replace it")
    _check_parent(path)
    return path


def _is_fp8sim_output(path: Path) -> bool:
    try:
        doc = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("format") == "fp8sim-output"


def check_output_dir(path: str | os.PathLike, *, force: bool = False) -> bool:
    """``path`` can receive an output folder.  An existing folder may be replaced if fp8sim wrote it
    (it holds the marker), if it is empty, or with ``force``.  Returns whether it exists."""
    path = Path(path)
    if not os.path.lexists(path):
        _check_parent(path)
        return False
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise OutputPathError(path, "is a symlink; name the folder itself")
    if not stat.S_ISDIR(st.st_mode):
        raise OutputPathError(path, "is a file, not a folder")
    if not force and any(os.scandir(path)) and not _is_fp8sim_output(path):
        raise OutputPathError(path, f"is a folder fp8sim did not write (no {MARKER}); pass --force to replace it")
    _check_parent(path)
    return True


def write_marker(folder: str | os.PathLike, kind: str) -> None:
    """Mark ``folder`` as fp8sim's output of ``kind`` (``report``, ``study``)."""
    doc = {"format": "fp8sim-output", "version": MARKER_VERSION, "kind": kind}
    (Path(folder) / MARKER).write_text(json.dumps(doc) + "\n")


def check_input_file(path: str | os.PathLike) -> Path:
    """``path`` is a regular file that can be read (a FIFO, device or folder would hang or flood the
    reader; they are refused before opening)."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise OutputPathError(path, "no such file" + (" (dangling symlink)" if os.path.lexists(path) else "")) from None
    except OSError as exc:
        raise OutputPathError(path, exc.strerror or str(exc)) from None
    if not stat.S_ISREG(st.st_mode):
        kind = (
            "a folder"
            if stat.S_ISDIR(st.st_mode)
            else "a FIFO"
            if stat.S_ISFIFO(st.st_mode)
            else "a device"
            if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
            else "a socket"
            if stat.S_ISSOCK(st.st_mode)
            else "not a regular file"
        )
        raise OutputPathError(path, f"is {kind}, not a regular file")
    if not os.access(path, os.R_OK):
        raise OutputPathError(path, "is not readable")
    return path
