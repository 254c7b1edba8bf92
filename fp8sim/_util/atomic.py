"""Atomic publication of output files and folders, and cleanup of what an interrupted run leaves.

Every output is built under a temporary name next to its target (``.NAME.PID.RANDOM.tmp`` for a
file, ``.NAME.PID.RANDOM.tmpdir`` for a folder) and published in one step:

- a file without ``force`` is hard-linked to the target, which fails if anything (a file, a
  directory, a dangling symlink) already has that name, so of two concurrent writers exactly one
  wins; where hard links are unsupported the name is reserved with ``O_CREAT | O_EXCL`` first and
  the finished file renamed over the reservation;
- a file with ``force`` is renamed over the target (``os.replace``);
- a folder is renamed into place; a folder that replaces an old one moves the old one aside
  first and deletes it only after the new one is in place.

Temporary files of this process are deleted when it gets SIGTERM (:func:`install_signal_cleanup`)
or an exception: each is registered before it is created, so no instant leaves one unknown to the
handler, and a folder moved aside is put back.  Those of dead processes (kill -9) are swept by the
next write to the same target.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

__all__ = ["atomic_file", "atomic_dir", "publish_file", "install_signal_cleanup", "sweep_stale"]

_STARTED = time.time()
_live: set[str] = set()  # temporaries of this process, deleted on SIGTERM
_aside: dict[str, Path] = {}  # old folders moved aside -> their target, put back on SIGTERM if the new one is not in
# reentrant: the SIGTERM handler runs in the main thread, possibly while that thread holds the lock
_lock = threading.RLock()
# errors of os.link that mean "this file system has no hard links" rather than "the name is taken"
_NO_LINKS = {errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EACCES}


def _prefix(target: Path) -> str:
    # keep the temporary name within NAME_MAX even when the target's name is near it
    return f".{target.name[:120]}.{os.getpid()}."


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # exists but is not ours, or we cannot tell: keep its files
    return True


def sweep_stale(target: str | os.PathLike) -> list[Path]:
    """Delete temporaries left next to ``target`` by writers that died (kill -9, power loss):
    same target name, made before this process started, by a process that no longer runs."""
    target = Path(target)
    pat = re.compile(r"^\." + re.escape(target.name[:120]) + r"\.(\d+)\.[^.]+\.(tmp|tmpdir|old)$")
    removed = []
    try:
        entries = list(os.scandir(target.parent))
    except OSError:
        return removed
    for e in entries:
        m = pat.match(e.name)
        if m is None or int(m.group(1)) == os.getpid() or _pid_alive(int(m.group(1))):
            continue
        try:
            if e.stat(follow_symlinks=False).st_mtime >= _STARTED:
                continue
            if m.group(2) == "old" and not os.path.lexists(target):
                os.rename(e.path, target)  # died between moving the old folder aside and publishing
            elif e.is_dir(follow_symlinks=False):
                shutil.rmtree(e.path, ignore_errors=True)
            else:
                os.unlink(e.path)
            removed.append(Path(e.path))
        except OSError:
            pass
    return removed


def _register(path: str) -> None:
    with _lock:
        _live.add(path)


def _forget(path: str) -> None:
    with _lock:
        _live.discard(path)


def _create(target: Path, suffix: str, folder: bool) -> str:
    """Create a fresh temporary next to ``target``, registered for SIGTERM cleanup before it exists,
    so that no instant has the file on disk but unknown to the handler."""
    for _ in range(100):
        path = os.path.join(target.parent, f"{_prefix(target)}{secrets.token_hex(6)}{suffix}")
        _register(path)
        try:
            if folder:
                os.mkdir(path, 0o700)
            else:
                os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600))
            return path
        except FileExistsError:
            _forget(path)  # another writer's name: never ours to delete
        except BaseException:
            _remove(path)  # e.g. Ctrl-C just after the create
            _forget(path)
            raise
    raise FileExistsError(f"no free temporary name next to {target}")


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)


def _put_back(old: str, target: Path) -> None:
    """Resolve a folder moved aside: back to ``target`` if the new folder never arrived, else deleted."""
    with contextlib.suppress(OSError):
        if os.path.lexists(old):
            if not os.path.lexists(target):
                os.rename(old, target)
            else:
                _remove(old)


def _on_sigterm(signum: int, frame: object) -> None:
    with _lock:
        paths = list(_live)
        _live.clear()
        aside = list(_aside.items())
        _aside.clear()
    for p in paths:
        _remove(p)
    for old, target in aside:
        _put_back(old, target)
    # die of the signal, as an unhandled SIGTERM would (exit status 128 + 15 in a shell)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def install_signal_cleanup() -> bool:
    """Delete this process's temporaries on SIGTERM (main thread only; keeps a handler someone else
    installed).  Returns whether the handler is in place."""
    if threading.current_thread() is not threading.main_thread():
        return False
    current = signal.getsignal(signal.SIGTERM)
    if current is _on_sigterm:
        return True
    if current not in (signal.SIG_DFL, None):
        return False
    signal.signal(signal.SIGTERM, _on_sigterm)
    return True


def publish_file(tmp: str | os.PathLike, target: str | os.PathLike, *, force: bool = False) -> Path:
    """Move the finished file ``tmp`` to ``target`` in one step; without ``force`` fail with
    FileExistsError if ``target`` exists, even when another writer creates it at the same instant."""
    tmp, target = os.fspath(tmp), Path(target)
    if force:
        if target.is_dir() and not target.is_symlink():
            raise IsADirectoryError(f"{target} is a directory; --force replaces files only")
        os.replace(tmp, target)
        return target
    try:
        os.link(tmp, target, follow_symlinks=False)
    except FileExistsError:
        raise FileExistsError(f"{target} exists; pass --force (force=True) to overwrite it") from None
    except OSError as exc:
        if exc.errno not in _NO_LINKS:
            raise
        try:  # no hard links here: reserve the name atomically, then rename over the reservation
            os.close(os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            raise FileExistsError(f"{target} exists; pass --force (force=True) to overwrite it") from None
        os.replace(tmp, target)
        return target
    os.unlink(tmp)
    return target


@contextlib.contextmanager
def atomic_file(target: str | os.PathLike, *, force: bool = False) -> Iterator[IO[bytes]]:
    """``with atomic_file(path) as f: f.write(...)``: the bytes appear at ``path`` whole or not at
    all; an existing ``path`` is kept unless ``force``."""
    target = Path(target)
    if not force and os.path.lexists(target):
        raise FileExistsError(f"{target} exists; pass --force (force=True) to overwrite it")
    target.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale(target)
    tmp = _create(target, ".tmp", folder=False)
    try:
        with open(tmp, "wb") as f:
            yield f
        os.chmod(tmp, 0o666 & ~_umask())  # created 0600; a published file gets the usual mode
        publish_file(tmp, target, force=force)
    finally:
        _forget(tmp)
        if os.path.lexists(tmp):
            os.unlink(tmp)


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike, *, replace: bool = False) -> Iterator[Path]:
    """``with atomic_dir(path) as d: ...write into d...``: the folder appears at ``path`` whole;
    an existing folder at ``path`` is replaced only if ``replace`` (and stays intact until then)."""
    target = Path(target)
    if os.path.lexists(target) and not replace:
        raise FileExistsError(f"{target} exists; pass --force to replace it")
    target.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale(target)
    tmp = _create(target, ".tmpdir", folder=True)
    old = None
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o777 & ~_umask())  # created 0700
        if os.path.lexists(target):
            if not target.is_dir() or target.is_symlink():
                raise FileExistsError(f"{target} exists and is not a folder; refusing to replace it")
            # until the new folder is in place this is the report: SIGTERM puts it back, never deletes it
            old = os.path.join(target.parent, f"{_prefix(target)}{secrets.token_hex(6)}.old")
            with _lock:
                _aside[old] = target
            os.rename(target, old)
        os.rename(tmp, target)
    finally:
        _forget(tmp)
        if os.path.lexists(tmp):
            _remove(tmp)
        if old is not None:
            _put_back(old, target)  # the old one back if the new folder never arrived, else deleted
            with _lock:
                _aside.pop(old, None)


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask
