"""The written schema of a capture header (``__meta__.json``), and its validator.

A header is a JSON object::

    format         "fp8sim-capture"
    version        integer >= 1 (not a boolean, not a string); above FORMAT_VERSION: a newer fp8sim
    meta           object: device "cpu" | "cuda[:i]"; torch a version "X.Y[...]"; compute_capability
                   null or [major, minor]; other values (device_name, cuda, driver, date, versions) string or null
    ops            array of op objects with unique names:
                     name string, kind string, skipped (optional) string
                     kind "cast":           format (a format torch has), inputs (an input set), seed integer
                     kind "cast_float":     format (bfloat16 | float16), inputs (an input set), seed integer
                     kind "scaled_mm":      m, n, k positive integers, a_format, b_format (e4m3 | e5m2),
                     kind "scaled_mm":      m, n, k positive integers (n, k multiples of 16, as
                                            torch._scaled_mm takes them), a_format, b_format (e4m3 | e5m2,
                                            not both e5m2),
                                            layout (tensorwise | rowwise), fast_accum boolean,
                                            out_dtype (float32 | bfloat16), seed integer
                     kind "torchao_float8": format (e4m3 | e5m2), granularity (tensorwise | axiswise), pow2 boolean
                     other kinds are kept and reported as skipped by compare (a newer fp8sim's ops)
    sha256         object: array name -> 64 hex digits
    suite          optional "quick" | "full"; suite_version optional integer

Arrays: every op that is not skipped has its arrays (``name``, or ``name/codes`` and ``name/scale``
for torchao) with the dtype and shape the op implies (``cast``: uint8 codes, ``cast_float``: uint16 bit
patterns).  :func:`validate_header` and
:func:`validate_arrays` raise ``ValueError`` naming the field; the reader turns it into
``CaptureFileError``.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

__all__ = ["validate_header", "validate_arrays", "expected_arrays"]

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_TORCH_VERSION = re.compile(r"^\d+\.\d+")
_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")
_GEMM_FORMATS = ("e4m3", "e5m2")
_CAST_FIELDS = {"format": str, "inputs": str, "seed": int}
_GEMM_FIELDS = {
    "m": int,
    "n": int,
    "k": int,
    "a_format": str,
    "b_format": str,
    "layout": str,
    "fast_accum": bool,
    "out_dtype": str,
    "seed": int,
}
_TORCHAO_FIELDS = {"format": str, "granularity": str, "pow2": bool}
_KIND_FIELDS = {
    "cast": _CAST_FIELDS,
    "cast_float": _CAST_FIELDS,
    "scaled_mm": _GEMM_FIELDS,
    "torchao_float8": _TORCHAO_FIELDS,
}
TORCHAO_ROWS, TORCHAO_COLS = 64, 128  # shape of capture.torchao_input()


def _is(v: Any, t: type) -> bool:
    if t is int:
        return isinstance(v, int) and not isinstance(v, bool)
    return isinstance(v, t)


_WANT = {int: "an integer", str: "a string", bool: "a boolean", dict: "an object", list: "an array"}


def _type_name(v: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(v), type(v).__name__
    )


def _need(obj: dict, key: str, t: type, where: str) -> Any:
    if key not in obj:
        raise ValueError(f"{where} has no {key!r}")
    v = obj[key]
    if not _is(v, t):
        raise ValueError(f"{where}.{key} must be {_WANT[t]}, got {_type_name(v)} {v!r:.40}")
    return v


def _one_of(v: Any, allowed: tuple, where: str) -> None:
    if v not in allowed:
        raise ValueError(f"{where} is {v!r:.40}; allowed: {', '.join(map(str, allowed))}")


def validate_header(header: Any, format_name: str, format_version: int) -> None:
    """Raise ValueError naming the first field of ``header`` that breaks the schema (the format
    name and version first, so that a foreign or newer file is called that)."""
    from ..formats import FORMATS
    from .suite import ALL_INPUT_SETS, FLOAT_CASTS, INPUT_SETS

    if not isinstance(header, dict):
        raise ValueError(f"the header must be a JSON object, got {_type_name(header)}")
    if header.get("format") != format_name:
        raise ValueError(f"not an fp8sim capture (format {header.get('format')!r:.40})")
    version = header.get("version")
    if not _is(version, int):
        raise ValueError(f"version must be an integer, got {_type_name(version)} {version!r:.40}")
    if version < 1:
        raise ValueError(f"version {version} is not a capture format version (they start at 1)")
    if version > format_version:
        raise ValueError(
            f"capture format version {version}, newer than this fp8sim reads ({format_version}): upgrade fp8sim"
        )
    meta = _need(header, "meta", dict, "header")
    device = _need(meta, "device", str, "meta")
    if not _DEVICE.match(device):
        raise ValueError(f"meta.device is {device!r:.40}; allowed: cpu, cuda, cuda:N")
    torch_v = _need(meta, "torch", str, "meta")
    if not _TORCH_VERSION.match(torch_v):
        raise ValueError(f"meta.torch is {torch_v!r:.40}, not a version like '2.13.0'")
    cc = meta.get("compute_capability")
    if cc is not None and not (isinstance(cc, list) and len(cc) == 2 and all(_is(c, int) for c in cc)):
        raise ValueError(f"meta.compute_capability must be null or [major, minor], got {cc!r:.40}")
    for k, v in meta.items():
        if k not in ("compute_capability",) and v is not None and not isinstance(v, str):
            raise ValueError(f"meta.{k} must be a string or null, got {_type_name(v)}")
    if "suite" in header:
        _one_of(header["suite"], ("quick", "full"), "suite")
    if "suite_version" in header and not _is(header["suite_version"], int):
        raise ValueError("suite_version must be an integer")
    sums = _need(header, "sha256", dict, "header")
    for k, v in sums.items():
        if not (isinstance(v, str) and _HEX64.match(v)):
            raise ValueError(f"sha256[{k!r:.60}] must be 64 lowercase hex digits, got {_type_name(v)}")
    ops = _need(header, "ops", list, "header")
    names: set[str] = set()
    cast_formats = tuple(n for n, f in FORMATS.items() if f.torch_name is not None)  # not: installed here
    for i, op in enumerate(ops):
        where = f"ops[{i}]"
        if not isinstance(op, dict):
            raise ValueError(f"{where} must be an object, got {_type_name(op)}")
        name = _need(op, "name", str, where)
        kind = _need(op, "kind", str, where)
        if name in names:
            raise ValueError(f"{where}: op name {name!r:.60} appears twice")
        names.add(name)
        if "skipped" in op:
            _need(op, "skipped", str, where)
            continue
        for key, t in _KIND_FIELDS.get(kind, {}).items():
            _need(op, key, t, where)
        if kind == "cast":
            _one_of(op["format"], cast_formats, f"{where}.format")
            _one_of(op["inputs"], INPUT_SETS, f"{where}.inputs")
        elif kind == "cast_float":
            _one_of(op["format"], tuple(FLOAT_CASTS), f"{where}.format")
            _one_of(op["inputs"], ALL_INPUT_SETS, f"{where}.inputs")
        elif kind == "scaled_mm":
            for key in ("m", "n", "k"):
                if not 1 <= op[key] <= 1 << 16:
                    raise ValueError(f"{where}.{key} is {op[key]}; allowed: 1 ... 65536")
            _one_of(op["a_format"], _GEMM_FORMATS, f"{where}.a_format")
            _one_of(op["b_format"], _GEMM_FORMATS, f"{where}.b_format")
            _one_of(op["layout"], ("tensorwise", "rowwise"), f"{where}.layout")
            _one_of(op["out_dtype"], ("float32", "bfloat16"), f"{where}.out_dtype")
            # what torch._scaled_mm refuses cannot have been captured (compare would hit the refusal)
            for key in ("k", "n"):
                if op[key] % 16:
                    raise ValueError(f"{where}.{key} is {op[key]}; torch._scaled_mm takes multiples of 16 only")
            if op["a_format"] == op["b_format"] == "e5m2":
                raise ValueError(f"{where}: a_format and b_format are both e5m2, which torch._scaled_mm refuses")
        elif kind == "torchao_float8":
            _one_of(op["format"], _GEMM_FORMATS, f"{where}.format")
            _one_of(op["granularity"], ("tensorwise", "axiswise"), f"{where}.granularity")


def expected_arrays(op: dict) -> dict[str, tuple[np.dtype, tuple[int, ...] | None, int | None]]:
    """The arrays a (valid, not skipped) op needs: name -> (dtype, shape or None, size or None)."""
    from .suite import input_set

    name, kind = op["name"], op["kind"]
    if kind in ("cast", "cast_float"):
        dt = np.uint8 if kind == "cast" else np.uint16
        return {name: (np.dtype(dt), input_set(op["inputs"], op["seed"]).shape, None)}
    if kind == "scaled_mm":
        dt = np.int32 if op["out_dtype"] == "float32" else np.int16
        return {name: (np.dtype(dt), (op["m"], op["n"]), None)}
    if kind == "torchao_float8":
        n_scales = 1 if op["granularity"] == "tensorwise" else TORCHAO_ROWS
        return {
            f"{name}/codes": (np.dtype(np.uint8), (TORCHAO_ROWS, TORCHAO_COLS), None),
            f"{name}/scale": (np.dtype(np.float32), None, n_scales),
        }
    return {}


def validate_arrays(header: dict, arrays: dict[str, np.ndarray]) -> None:
    """Every op that is not skipped has its arrays, with the dtype and shape it implies."""
    for op in header["ops"]:
        if "skipped" in op:
            continue
        for key, (dtype, shape, size) in expected_arrays(op).items():
            if key not in arrays:
                raise ValueError(f"op {op['name']!r:.60} has no array {key!r:.60}")
            a = arrays[key]
            if a.dtype != dtype:
                raise ValueError(f"array {key!r:.60} has dtype {a.dtype}, expected {dtype}")
            if shape is not None and a.shape != shape:
                raise ValueError(f"array {key!r:.60} has shape {a.shape}, expected {shape}")
            if size is not None and a.size != size:
                raise ValueError(f"array {key!r:.60} has {a.size} elements, expected {size}")
