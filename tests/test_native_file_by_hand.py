"""A capture file written by hand, from the layout fileformat.py's docstring states (a zip holding
``__meta__.json`` and one ``<name>.npy`` per array, ``sha256`` the hex digest of each array's raw bytes,
computed here with hashlib), is read back as written; a damaged array or a header that breaks the
schema is refused with a message naming the field."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from fp8sim.native.fileformat import CaptureFileError, read_bundle

GEMM = {
    "name": "scaled_mm/e4m3xe4m3/tensorwise/fast/bfloat16/1x16x16",
    "kind": "scaled_mm",
    "m": 1,
    "n": 16,
    "k": 16,
    "a_format": "e4m3",
    "b_format": "e4m3",
    "layout": "tensorwise",
    "fast_accum": True,
    "out_dtype": "bfloat16",
    "seed": 3,
}
OUT = (np.arange(16, dtype=np.int16) * 97 - 700).reshape(1, 16)  # any bfloat16 bit patterns


def _header(**change: object) -> dict:
    header = {
        "format": "fp8sim-capture",
        "version": 1,
        "meta": {"device": "cpu", "torch": "2.13.0+cpu", "compute_capability": None},
        "ops": [GEMM],
        "sha256": {GEMM["name"]: hashlib.sha256(OUT.tobytes()).hexdigest()},
        "suite": "quick",
        "suite_version": 1,
    }
    header.update(change)
    return {k: v for k, v in header.items() if v is not None}


def _write(path: Path, header: dict, out: np.ndarray = OUT) -> Path:
    npy = io.BytesIO()
    np.save(npy, out, allow_pickle=False)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("__meta__.json", json.dumps(header))
        z.writestr(GEMM["name"] + ".npy", npy.getvalue())
    return path


def test_a_file_written_by_hand_reads_back_as_written(tmp_path: Path) -> None:
    header, arrays = read_bundle(_write(tmp_path / "hand.fp8cap", _header()))
    assert header == _header()
    assert list(arrays) == [GEMM["name"]]
    assert arrays[GEMM["name"]].dtype == np.int16 and np.array_equal(arrays[GEMM["name"]], OUT)


def test_an_array_that_does_not_match_its_digest_is_refused(tmp_path: Path) -> None:
    bad = OUT.copy()
    bad[0, 5] ^= 1  # one bit; the header keeps the digest of the original
    path = _write(tmp_path / "bad.fp8cap", _header(), bad)
    with pytest.raises(CaptureFileError) as err:
        read_bundle(path)
    assert str(err.value) == f"{path} is corrupt: checksum mismatch in array {GEMM['name']!r}"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"meta": None}, "header has no 'meta'"),
        ({"meta": ["cpu"]}, "header.meta must be an object, got array ['cpu']"),
        ({"meta": {"torch": "2.13.0"}}, "meta has no 'device'"),
        ({"meta": {"device": 0, "torch": "2.13.0"}}, "meta.device must be a string, got int 0"),
        ({"suite_version": "1"}, "suite_version must be an integer"),
        ({"suite_version": True}, "suite_version must be an integer"),
    ],
)
def test_a_header_that_breaks_the_schema_is_refused_naming_the_field(
    tmp_path: Path, change: dict, message: str
) -> None:
    path = _write(tmp_path / "h.fp8cap", _header(**change))
    with pytest.raises(CaptureFileError) as err:
        read_bundle(path)
    assert str(err.value) == f"{path}: {message}"
