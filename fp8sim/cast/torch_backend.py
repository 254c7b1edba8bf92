"""torch backend: the same bits as the numpy backend, on any device.

Deterministic float32/float16/bfloat16 casts gather from the same tables as numpy.  For
``nearest_even`` a native ``.to(float8)`` (optionally after a clamp to the format's range) is used
instead when it reproduces the table on a probe (every table class of float32 at several low-bit
patterns, every float16/bfloat16 value, and the critical values one at a time); the probe runs once
per device, dtype, format and saturation.  float64 runs the exact algorithm in torch float64.
float32 stochastic rounding on the CPU runs the compiled pass of :mod:`fp8sim.cast._sr_numba` where
numba is installed (on torch's thread count), else the numpy backend on shared memory.
"""

from __future__ import annotations

import os
from functools import cache
from typing import Any

import numpy as np
import torch

from ..formats import FloatFormat
from ._random import torch_bits, torch_bits_at
from ._rounding import round_codes
from ._tables import (
    SR_EXACT,
    decode_table,
    f16_code_table,
    f32_code_table,
    f32_stochastic_tables,
    f32_table_ok,
)

_CPU_CHUNK = 1 << 18
_NATIVE: dict[tuple, str] = {}


@cache
def _on(table_key: tuple, device: torch.device) -> torch.Tensor:
    kind, *args = table_key
    builders = {
        "f32": f32_code_table,
        "f16": f16_code_table,
        "sr_shift": lambda *a: f32_stochastic_tables(*a)[0],
        "sr_lo": lambda *a: f32_stochastic_tables(*a)[1],
        "dec": decode_table,
    }
    return torch.from_numpy(builders[kind](*args)).to(device)


def _chunks(n: int, device: torch.device) -> range:
    step = _CPU_CHUNK if device.type == "cpu" else max(n, 1)
    return range(0, n, step)


def encode(x: torch.Tensor, fmt: FloatFormat, rounding: str, saturate: bool, seed: int | None) -> torch.Tensor:
    """uint8 codes of a float16/bfloat16/float32/float64 tensor, same shape and device."""
    flat = x.detach().contiguous().reshape(-1)
    dev = flat.device
    out = torch.empty(flat.shape, dtype=torch.uint8, device=dev)
    f16_table = flat.dtype == torch.float16 and rounding != "stochastic"
    if flat.dtype == torch.float64 or not (f16_table or f32_table_ok(fmt)):
        _encode_exact(flat, out, fmt, rounding, saturate, seed)
    elif rounding == "stochastic":
        _encode_f32_stochastic(_to_f32_exact(flat), out, fmt, saturate, seed)
    elif rounding == "nearest_even" and (how := _native_choice(fmt, saturate, flat.dtype, dev)) != "table":
        out = _native(flat, fmt, how)
    elif flat.dtype == torch.float16:
        idx = flat.view(torch.int16).to(torch.int32) & 0xFFFF
        torch.index_select(_on(("f16", fmt, rounding, saturate), dev), 0, idx, out=out)
    else:
        flat = _to_f32_exact(flat)
        table = _on(("f32", fmt, rounding, saturate), dev)
        u_all = flat.view(torch.int32)
        for s in _chunks(u_all.numel(), dev):
            u = u_all[s : s + _CPU_CHUNK] if dev.type == "cpu" else u_all
            torch.index_select(table, 0, _class_index(u), out=out[s : s + u.numel()])
    return out.reshape(x.shape)


def _to_f32_exact(flat: torch.Tensor) -> torch.Tensor:
    """float32 with the same value and, for NaN, the same sign (torch's float16 -> float32
    conversion returns a positive NaN, which would change FP4/FP6 codes)."""
    if flat.dtype == torch.bfloat16:
        return (flat.view(torch.int16).to(torch.int32) << 16).view(torch.float32)
    if flat.dtype == torch.float16:
        u = flat.float().view(torch.int32)
        neg_nan = torch.isnan(flat) & (flat.view(torch.int16) < 0)
        return torch.where(neg_nan, u | -(2**31), u).view(torch.float32)
    return flat


def _class_index(u: torch.Tensor) -> torch.Tensor:
    return ((u >> 15) & 0x1FFFF) | (u & 0x7FFF).clamp_(max=1)


def _native(flat: torch.Tensor, fmt: FloatFormat, how: str) -> torch.Tensor:
    if how == "clamp_native":
        lo = -fmt.max if fmt.signed else fmt.min_normal
        flat = flat.clamp(lo, fmt.max)
    return flat.to(fmt.torch_dtype).view(torch.uint8)


def _encode_f32_stochastic(flat: torch.Tensor, out: torch.Tensor, fmt: FloatFormat, saturate: bool, seed: int) -> None:
    dev = flat.device
    if dev.type == "cpu":  # torch's int64 hash is ~20x slower than the numpy reference's uint32 one
        if _sr_kernel() is not None and _stochastic_compiled(flat.numpy(), out.numpy(), fmt, saturate, seed):
            return
        from .numpy_backend import _encode_f32_stochastic as numpy_stochastic

        numpy_stochastic(flat.numpy(), out.numpy(), fmt, saturate, seed)  # same bits, shared memory
        return
    shift_table, lo_table = _on(("sr_shift", fmt, saturate), dev), _on(("sr_lo", fmt, saturate), dev)
    u_all = flat.view(torch.int32)
    for s in _chunks(u_all.numel(), dev):
        u = (u_all[s : s + _CPU_CHUNK] if dev.type == "cpu" else u_all).long() & 0xFFFFFFFF
        shift = shift_table[u >> 23].long()
        v = (u + (torch_bits(seed, s, u.numel(), dev) >> shift.clamp(max=32))) >> 16
        code = lo_table[v]
        exact = shift == SR_EXACT
        if bool(exact.any()):
            pos = exact.nonzero().reshape(-1)
            x64 = u_all[s + pos].view(torch.float32).double()
            code[pos] = round_codes(torch, x64, fmt, "stochastic", saturate, torch_bits_at(seed, s + pos)).to(
                torch.uint8
            )
        out[s : s + u.numel()] = code


_SR_BLOCK = 1 << 16
"""Elements per task of the compiled pass; a block's exact-path offsets fit in uint16."""


def _sr_classes(shift_table: np.ndarray) -> tuple[int, int, int] | None:
    """``(a, b, S)`` with the shift table, per sign, equal to: 32 (no noise) for exponent fields below
    ``a``, SR_EXACT for ``[a, b)`` and 255, ``S`` for ``[b, 255)``; None where it has another shape
    (non-saturating UE5M3: its negative-subnormal class takes the exact path, so the halves differ and
    it runs the numpy pass, the same bits)."""
    half = shift_table[:256]
    main = [int(v) for v in np.unique(half) if v not in (32, SR_EXACT)]
    if len(main) != 1 or not np.array_equal(half, shift_table[256:]):
        return None
    a, b = int(np.argmax(half != 32)), int(np.argmax(half == main[0]))
    want = np.full(256, SR_EXACT, np.uint8)
    want[:a], want[b:255] = 32, main[0]
    return (a, b, main[0]) if np.array_equal(half, want) else None


@cache
def _sr_arith(fmt: FloatFormat, saturate: bool) -> tuple[int, ...] | None:
    """``(off, cap, sign, zsign, t, sub_off)`` for the compiled pass to compute codes instead of looking
    them up.  Normal range: for every code-table index ``h`` a non-exact element can reach (exponent
    field below ``a``: the input's own bits; from ``b`` up: after a carry), ``lo_table[h] ==
    clip(((h & 0x7FFF) >> (7 - m)) - off, 0, cap) | (sign, or zsign for code 0, where h is negative)``:
    the code toward zero is the float32 exponent and top m mantissa bits, rebased and clipped.  The
    table stays the definition; this is checked against it.  The format's subnormal range (round_codes'
    rule on the fixed grid ``q = 2^(emin - m)``): ``floor(|x| / q * 2^32) = M * 2^(ef - t)`` for the
    24-bit significand M, and ``sub_off`` is the code of magnitude 0 (0 where exponent field 0 is the
    subnormal binade).  None where either does not apply (E8M0, fnuz without saturation): the table
    lookup and the exact path run instead."""
    shift_table, lo_table = f32_stochastic_tables(fmt, saturate)
    classes = _sr_classes(shift_table)
    if classes is None or not fmt.subnormals:
        return None
    a, b = classes[:2]
    h = np.arange(1 << 16, dtype=np.int64)
    ef = (h >> 7) & 0xFF
    reach = (ef < a) | (ef >= b)
    mag = (h & 0x7FFF) >> (7 - fmt.mbits)
    first = (b << 7) >> (7 - fmt.mbits)  # the smallest noisy-class magnitude: its code fixes the offset
    off = first - int(lo_table[b << 7])
    cap = int(lo_table[0x7F80])  # a carry past float32 max: the overflow code
    sign, zsign = int(lo_table[0xFF80]) ^ cap, int(lo_table[0x8000])
    code = np.clip(mag - off, 0, cap)
    code = code | np.where(h >= 0x8000, np.where(code == 0, zsign, sign), 0)
    if not np.array_equal(code[reach], lo_table[reach]):  # the kernel's codes depend on h alone: this proves them
        return None
    t = 118 + fmt.emin - fmt.mbits  # 127 - 9 + qe: W = M * 2^(e - 23 - qe + 32)
    sub_off = ((fmt.emin + fmt.bias) << fmt.mbits) - (1 << fmt.mbits)
    if t < 0 or t - a > 23 or b - 1 - t > 14 or sub_off < 0 or off < 0:  # shifts the uint32 lanes hold
        return None
    return off, cap, sign, zsign, t, sub_off


@cache
def _sr_kernel() -> Any:
    """The compiled pass, ``(sr, gather)`` of :mod:`fp8sim.cast._sr_numba` (numba, optional;
    FP8SIM_NUMBA=0: off), or None."""
    if os.environ.get("FP8SIM_NUMBA", "1") == "0":
        return None
    try:
        from . import _sr_numba
    except ImportError:
        return None
    return _sr_numba.sr, _sr_numba.gather


def _on_torch_threads(fn: Any, *args: Any) -> Any:
    """Run a numba parallel kernel on torch's thread count, as torch's own ops would, and leave that
    count as it was: numba's OpenMP layer, started on first use, resets the OpenMP thread count that
    torch reads (``torch.set_num_threads(1)`` would silently become 2)."""
    import numba

    want = torch.get_num_threads()
    prev = numba.get_num_threads()  # starts numba's threading layer on first use
    if torch.get_num_threads() != want:
        torch.set_num_threads(want)
    numba.set_num_threads(max(1, min(want, numba.config.NUMBA_NUM_THREADS)))
    try:
        return fn(*args)
    finally:
        numba.set_num_threads(prev)


def _stochastic_compiled(flat: np.ndarray, out: np.ndarray, fmt: FloatFormat, saturate: bool, seed: int) -> bool:
    """The compiled pass; False (nothing written) where the shift table has no three-class shape."""
    from ._random import numpy_bits_at, seed_keys

    shift_table, lo_table = f32_stochastic_tables(fmt, saturate)
    classes = _sr_classes(shift_table)
    if classes is None:
        return False
    arith = _sr_arith(fmt, saturate)
    arith = np.array([23 - fmt.mbits, *arith] if arith is not None else [-1] + [0] * 6, np.int64)
    a, b, sh = (np.uint32(v) for v in classes)
    k0, k1 = (np.uint32(k) for k in seed_keys(seed))
    # only each block's head is ever written and paged in: torch's allocator, not numpy's, which asks for
    # transparent huge pages on large arrays (each touched head would then zero 2 MB)
    offsets = torch.empty(flat.size, dtype=torch.int16).numpy().view(np.uint16)
    counts = np.empty(-(-flat.size // _SR_BLOCK), np.int64)
    sr, gather = _sr_kernel()
    _on_torch_threads(sr, flat.view(np.uint32), lo_table, arith, k0, k1, a, b, sh, _SR_BLOCK, out, offsets, counts)
    if counts.any():  # Inf/NaN and the format's subnormal range: the exact path, as the numpy backend
        index = gather(offsets, counts, _SR_BLOCK)
        with np.errstate(invalid="ignore"):
            x64 = flat[index].astype(np.float64)
        rbits = numpy_bits_at(seed, index).astype(np.int64)
        out[index] = round_codes(np, x64, fmt, "stochastic", saturate, rbits)
    return True


def _encode_exact(
    flat: torch.Tensor, out: torch.Tensor, fmt: FloatFormat, rounding: str, saturate: bool, seed: int | None
) -> None:
    for s in _chunks(flat.numel(), flat.device):
        part = flat[s : s + _CPU_CHUNK] if flat.device.type == "cpu" else flat
        part = part.double()
        rbits = torch_bits(seed, s, part.numel(), part.device) if rounding == "stochastic" else None
        out[s : s + part.numel()] = round_codes(torch, part, fmt, rounding, saturate, rbits).to(torch.uint8)


def decode(codes: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    flat = codes.detach().reshape(-1).long()
    return _on(("dec", fmt), codes.device)[flat].reshape(codes.shape)


# -- native fast path -------------------------------------------------------------------------


def _probe_inputs(dtype: torch.dtype, fmt: FloatFormat) -> np.ndarray:
    if dtype in (torch.float16, torch.bfloat16):
        return np.arange(1 << 16, dtype=np.uint16)
    cls = np.arange(1 << 17, dtype=np.uint32)
    hi = (cls >> 1) << 16
    lows = [np.where(cls & 1, low, 0) for low in (1, 0x7FFF, 0x8000, 0x8001, 0xFFFF)]
    return np.concatenate([hi] + [hi | low for low in lows]).astype(np.uint32)


def _critical_values(fmt: FloatFormat) -> list[float]:
    """Midpoints between adjacent codes and their float32 neighbours, overflow edges, specials."""
    vals = decode_table(fmt)
    fin = np.unique(np.abs(vals[np.isfinite(vals)].astype(np.float64)))
    mids = (fin[1:] + fin[:-1]) / 2
    top = fmt.max + (fmt.max - (fin[-2] if fin.size > 1 else 0)) / 2
    with np.errstate(over="ignore"):
        pts = np.concatenate([fin, mids, [top, fmt.max * 2, 0.0, np.inf, np.nan]]).astype(np.float32)
    pts = np.concatenate([pts, np.nextafter(pts, np.float32(np.inf)), np.nextafter(pts, np.float32(0))])
    return list(np.concatenate([pts, -pts]))


def _native_choice(fmt: FloatFormat, saturate: bool, dtype: torch.dtype, device: torch.device) -> str:
    key = (device.type, device.index, dtype, fmt, saturate)
    if key in _NATIVE:
        return _NATIVE[key]
    choice = "table"
    if fmt.torch_dtype is not None:
        bits = _probe_inputs(dtype, fmt)
        if dtype == torch.float32:
            probe = torch.from_numpy(bits.view(np.int32)).view(torch.float32)
        else:
            probe = torch.from_numpy(bits.view(np.int16)).view(dtype)
        probe = probe.to(device)
        want = encode_via_tables(probe, fmt, saturate)
        crit = torch.tensor(_critical_values(fmt), dtype=torch.float32).to(dtype).to(device)
        crit_want = encode_via_tables(crit, fmt, saturate)
        for how in ("native", "clamp_native"):
            try:
                ok = torch.equal(_native(probe, fmt, how), want) and torch.equal(_native(probe[3:], fmt, how), want[3:])
                ok = ok and all(
                    torch.equal(_native(crit[i : i + 1], fmt, how), crit_want[i : i + 1]) for i in range(crit.numel())
                )
            except (RuntimeError, TypeError):
                ok = False
            if ok:
                choice = how
                break
    _NATIVE[key] = choice
    return choice


def encode_via_tables(x: torch.Tensor, fmt: FloatFormat, saturate: bool) -> torch.Tensor:
    """nearest_even codes from the tables only (never the native cast)."""
    key = (x.device.type, x.device.index, x.dtype, fmt, saturate)
    saved = _NATIVE.get(key)
    _NATIVE[key] = "table"
    try:
        return encode(x, fmt, "nearest_even", saturate, None)
    finally:
        if saved is None:
            del _NATIVE[key]
        else:
            _NATIVE[key] = saved


def native_choices() -> dict[tuple, str]:
    """Which path each probed (device, dtype, format, saturate) uses: 'native', 'clamp_native' or 'table'."""
    return dict(_NATIVE)
