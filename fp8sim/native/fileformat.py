"""The capture file: a versioned, checksummed bundle of named arrays plus JSON metadata.

Layout: a zip archive (numpy ``.npz``) holding the arrays and ``__meta__.json``::

    {"format": "fp8sim-capture", "version": 1, "meta": {...}, "ops": [...],
     "sha256": {"<array name>": "<hex digest of its raw bytes>", ...}}

Files are written to a temporary name in the same folder and published in one step
(:mod:`fp8sim._util.atomic`), so a crash never leaves a partial file and an existing file is never
replaced unless ``force=True``, even by a concurrent writer.  Reading checks the container, the
header against its schema (:mod:`fp8sim.native.schema`), every checksum and every array's shape,
and names what is wrong.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from .._util.atomic import atomic_file
from .._util.outpaths import OutputPathError, check_input_file
from .schema import validate_arrays, validate_header

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "CaptureFileError", "write_bundle", "read_bundle"]

FORMAT_NAME = "fp8sim-capture"
FORMAT_VERSION = 1
_META = "__meta__.json"
MAX_UNCOMPRESSED = 8 << 30  # a full GPU capture is about 20 MB; more than this is a forged size


class CaptureFileError(ValueError):
    """A capture file that cannot be used: corrupt, truncated, foreign or from a newer fp8sim."""


def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def write_bundle(
    path: str | os.PathLike, arrays: dict[str, np.ndarray], doc: dict[str, Any], *, force: bool = False
) -> Path:
    """Write ``arrays`` and the JSON-able ``doc`` (``meta`` and ``ops``) atomically to ``path``: of
    two writers racing for a new ``path`` exactly one succeeds; the other gets FileExistsError."""
    path = Path(path)
    header = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        **doc,
        "sha256": {k: _digest(v) for k, v in arrays.items()},
    }
    with atomic_file(path, force=force) as f, zipfile.ZipFile(f, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr(_META, json.dumps(header, indent=1, sort_keys=True))
        for name, arr in arrays.items():
            buf = io.BytesIO()
            np.save(buf, np.ascontiguousarray(arr), allow_pickle=False)
            z.writestr(f"{name}.npy", buf.getvalue())
    return path


def _check_members(path: Path, z: zipfile.ZipFile) -> None:
    """Refuse what zipfile would fail on late (other compressions, encryption) or what would not fit
    in memory (a forged size), before reading any data."""
    total = 0
    for info in z.infolist():
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise CaptureFileError(
                f"{path} is corrupt or foreign: member {info.filename!r:.60} uses zip compression "
                f"{info.compress_type} (captures use stored or deflated)"
            )
        if info.flag_bits & 0x1:
            raise CaptureFileError(f"{path} is corrupt or foreign: member {info.filename!r:.60} is encrypted")
        total += info.file_size
    if total > MAX_UNCOMPRESSED:
        raise CaptureFileError(f"{path} is corrupt: its members claim {total:,} bytes (at most {MAX_UNCOMPRESSED:,})")


def read_bundle(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(header, arrays) of a capture file, after checking it end to end: a regular file, an intact
    zip archive, a header that meets :mod:`fp8sim.native.schema`, every checksum, every array's
    dtype and shape.  Anything else raises CaptureFileError (FileNotFoundError if there is no file)."""
    path = Path(path)
    if not os.path.lexists(path):
        raise FileNotFoundError(f"no capture file at {path}")
    try:
        check_input_file(path)
    except OutputPathError as exc:
        raise CaptureFileError(f"{exc}; a capture is a regular file") from None
    try:
        with zipfile.ZipFile(path) as z:
            _check_members(path, z)
            bad = z.testzip()
            if bad is not None:
                raise CaptureFileError(f"{path} is corrupt: member {bad!r} fails its CRC check")
            try:
                header = json.loads(z.read(_META))
            except KeyError:
                raise CaptureFileError(f"{path} is not an fp8sim capture (no {_META})") from None
            try:
                validate_header(header, FORMAT_NAME, FORMAT_VERSION)
            except ValueError as exc:
                raise CaptureFileError(f"{path}: {exc}") from None
            arrays = {
                n[:-4]: np.load(io.BytesIO(z.read(n)), allow_pickle=False) for n in z.namelist() if n.endswith(".npy")
            }
    except CaptureFileError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError) as exc:
        raise CaptureFileError(f"{path} is truncated or not a capture file ({exc})") from None
    except zlib.error as exc:
        raise CaptureFileError(f"{path} is corrupt: compressed data do not decode ({exc})") from None
    except (ValueError, TypeError, KeyError, NotImplementedError, RuntimeError, UnicodeDecodeError) as exc:
        # json, np.load or zipfile on a damaged header or member
        raise CaptureFileError(f"{path} is corrupt: {type(exc).__name__}: {exc}") from None
    sums = header["sha256"]
    if set(sums) != set(arrays):
        missing = sorted(set(sums) ^ set(arrays))
        raise CaptureFileError(f"{path} is corrupt: arrays and checksums disagree on {missing[:5]}")
    for name, arr in arrays.items():
        if _digest(arr) != sums[name]:
            raise CaptureFileError(f"{path} is corrupt: checksum mismatch in array {name!r}")
    try:
        validate_arrays(header, arrays)
    except ValueError as exc:
        raise CaptureFileError(f"{path}: {exc}") from None
    return header, arrays
