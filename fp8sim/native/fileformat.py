"""The capture file: a versioned, checksummed bundle of named arrays plus JSON metadata.

Layout: a zip archive (numpy ``.npz``) holding the arrays and ``__meta__.json``::

    {"format": "fp8sim-capture", "version": 1, "meta": {...}, "ops": [...],
     "sha256": {"<array name>": "<hex digest of its raw bytes>", ...}}

Files are written to a temporary name in the same folder and renamed into place, so a crash never
leaves a partial file; an existing file is never replaced unless ``force=True``.  Reading checks
the container, the format name, the version and every checksum, and names what is wrong.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "CaptureFileError", "write_bundle", "read_bundle"]

FORMAT_NAME = "fp8sim-capture"
FORMAT_VERSION = 1
_META = "__meta__.json"


class CaptureFileError(ValueError):
    """A capture file that cannot be used: corrupt, truncated, foreign or from a newer fp8sim."""


def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def write_bundle(
    path: str | os.PathLike, arrays: dict[str, np.ndarray], doc: dict[str, Any], *, force: bool = False
) -> Path:
    """Write ``arrays`` and the JSON-able ``doc`` (``meta`` and ``ops``) atomically to ``path``."""
    path = Path(path)
    if path.exists() and not force:
        raise FileExistsError(f"{path} exists; pass --force (force=True) to overwrite it")
    header = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        **doc,
        "sha256": {k: _digest(v) for k, v in arrays.items()},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f, zipfile.ZipFile(f, "w", compression=zipfile.ZIP_DEFLATED) as z:
            z.writestr(_META, json.dumps(header, indent=1, sort_keys=True))
            for name, arr in arrays.items():
                buf = io.BytesIO()
                np.save(buf, np.ascontiguousarray(arr), allow_pickle=False)
                z.writestr(f"{name}.npy", buf.getvalue())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def read_bundle(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(header, arrays) of a capture file, after checking it end to end."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no capture file at {path}")
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
            if bad is not None:
                raise CaptureFileError(f"{path} is corrupt: member {bad!r} fails its CRC check")
            try:
                header = json.loads(z.read(_META))
            except KeyError:
                raise CaptureFileError(f"{path} is not an fp8sim capture (no {_META})") from None
            arrays = {
                n[:-4]: np.load(io.BytesIO(z.read(n)), allow_pickle=False) for n in z.namelist() if n.endswith(".npy")
            }
    except (zipfile.BadZipFile, EOFError, OSError) as exc:
        raise CaptureFileError(f"{path} is truncated or not a capture file ({exc})") from None
    except zlib.error as exc:
        raise CaptureFileError(f"{path} is corrupt: compressed data do not decode ({exc})") from None
    except (ValueError, json.JSONDecodeError) as exc:
        if isinstance(exc, CaptureFileError):
            raise
        raise CaptureFileError(f"{path} is corrupt: {exc}") from None
    if header.get("format") != FORMAT_NAME:
        raise CaptureFileError(f"{path} is not an fp8sim capture (format {header.get('format')!r})")
    version = header.get("version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CaptureFileError(
            f"{path} has capture format version {version!r}, newer than this fp8sim reads "
            f"({FORMAT_VERSION}): upgrade fp8sim"
        )
    sums = header.get("sha256", {})
    if set(sums) != set(arrays):
        missing = sorted(set(sums) ^ set(arrays))
        raise CaptureFileError(f"{path} is corrupt: arrays and checksums disagree on {missing[:5]}")
    for name, arr in arrays.items():
        if _digest(arr) != sums[name]:
            raise CaptureFileError(f"{path} is corrupt: checksum mismatch in array {name!r}")
    return header, arrays
