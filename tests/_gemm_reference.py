"""Module-layer GEMM references written independently of ``fp8sim/pytorch/module/_gemm.py`` (issue 30.3).

The operands are decoded FP8 values (exact in float32), so every product is exact.  From them:

* :func:`exact_sums`: the exact sum of every dot product, in Python integers (units of ``2**-UNIT``);
  shares no code with fp8sim (not ``fp8sim.gemm._exact``'s float64 two-sums, not ``torch.matmul``).
* :func:`rn_f32`: that sum rounded once to float32, nearest even, with subnormals and overflow, written
  from IEEE 754 here: the ``exact`` accumulator's result (``docs/semantics.md`` 9, "exact sum, one float32
  rounding").
* :func:`order_free`: where *every* float32 summation order gives the exact sum (all products are multiples
  of ``2**t`` and their absolute sum is below ``2**(t + 24)``, so each partial sum is a float32).  The
  default accumulator (``accumulator=None``: the products summed in float32 by BLAS, order unspecified,
  ``docs/semantics.md`` 4.7) is bit-exact against :func:`rn_f32` exactly there; elsewhere
  :func:`sum_error_bound` (``gamma_K * sum |p|``, Higham's bound for any summation order) bounds it.
* :func:`chain`: a tensor-core GEMM built in the test from ``fp8sim.gemm.dot_add``, the per-instruction model
  that ``tests/test_gemm_instructions.py`` checks against MMA-Sim's golden vectors and real-hardware
  measurements: instructions of K elements chained along K from ``c = 0``; with ``promote_every`` the chain
  restarts from 0 every that many elements and its result is added into a float32 register with RN
  (FAST_ACCUM=0); without, one chain over all of K (FAST_ACCUM=1), ``docs/semantics.md`` 9.
* :func:`current_scaling_cast`: the module's operands as TE's current-scaling quantizer makes them (ml_dtypes).
* :func:`epilogue`: ``fl32(D * fl32(sa * sb))``, then a float32 bias, then one rounding to the output dtype
  (``docs/semantics.md`` 4.7, 8: cuBLAS's alpha and bias epilogue, TE's ``general_gemm``).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import torch

from fp8sim.formats import get_format
from fp8sim.gemm import dot_add, get_instruction_model

UNIT = 160  # every finite float32 value is an integer multiple of 2**-149


def _np(x: torch.Tensor | np.ndarray) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().float().numpy()
    return np.asarray(x, dtype=np.float64)


def _ints(x: np.ndarray) -> np.ndarray:
    """``x * 2**UNIT`` as Python integers (exact: float32 values times a power of two)."""
    if not np.isfinite(x).all():
        raise ValueError("the exact references take finite operands")
    return np.vectorize(lambda v: int(math.ldexp(float(v), UNIT)), otypes=[object])(x)


def exact_sums(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray) -> np.ndarray:
    """Exact ``a @ b`` as Python integers in units of ``2**(-2 * UNIT)`` (object array, shape (M, N))."""
    ai, bi = _ints(_np(a)), _ints(_np(b))
    return ai.dot(bi)


def rn_f32_scalar(num: int, exp: int) -> np.float32:
    """``num * 2**exp`` rounded once to float32, nearest even (subnormal grid 2**-149, overflow to Inf)."""
    if num == 0:
        return np.float32(0.0)
    n = abs(num)
    ulp = max(exp + n.bit_length() - 24, -149)  # exponent of the float32 grid at this magnitude
    shift = ulp - exp
    if shift > 0:
        q, r = divmod(n, 1 << shift)
        half = 1 << (shift - 1)
        if r > half or (r == half and q & 1):
            q += 1
    else:
        q = n << -shift
    if ulp + q.bit_length() - 1 >= 128:  # 2**128 or more after rounding: overflow
        v = math.inf
    else:
        v = math.ldexp(q, ulp)  # q <= 2**24: exact in float64 and in float32
    return np.float32(-v if num < 0 else v)


def rn_f32(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray) -> np.ndarray:
    """``a @ b``: the exact sum of the exact products, rounded once to float32 (nearest even)."""
    s = exact_sums(a, b)
    return np.vectorize(lambda v: rn_f32_scalar(int(v), -2 * UNIT), otypes=[np.float32])(s).astype(np.float32)


def _trailing_zeros(x: np.ndarray) -> np.ndarray:
    """Trailing zero bits of each integer of ``x`` (a large sentinel for 0)."""
    return np.vectorize(lambda v: (v & -v).bit_length() - 1 if v else 10**6, otypes=[np.int64])(x)


def order_free(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray) -> np.ndarray:
    """Boolean (M, N): every order of float32 additions of the products of this dot product is exact."""
    ai, bi = _ints(_np(a)), _ints(_np(b))
    total = np.abs(ai).dot(np.abs(bi))
    ta, tb = _trailing_zeros(ai), _trailing_zeros(bi)
    tz = (ta[:, :, None] + tb[None, :, :]).min(axis=1)  # of the nonzero products (zeros carry the sentinel)
    ok = np.vectorize(lambda t, z: t == 0 or (t < 1 << (z + 24) and z - 2 * UNIT >= -149), otypes=[bool])
    return ok(total, tz)


def sum_error_bound(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray) -> np.ndarray:
    """``gamma_K * sum_k |a_ik b_kj|`` (float64): how far any float32 summation of the K exact products
    can be from their exact sum (Higham, Accuracy and Stability, 2nd ed., (3.5)/(4.4))."""
    aa, bb = np.abs(_np(a)), np.abs(_np(b))
    k = aa.shape[1]
    u = 2.0**-24
    return (k * u / (1 - k * u)) * (aa @ bb) * (1 + 2.0**-40)


def epilogue(
    d: np.ndarray, sa: float, sb: float, bias: torch.Tensor | None = None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """cuBLAS's epilogue as TE uses it: ``fl32(D * fl32(sa * sb))``, ``+ bias`` in float32, one rounding to
    ``dtype``.  ``sa``, ``sb``: the operands' float32 ``scale_inv``."""
    alpha = np.float32(np.float32(sa) * np.float32(sb))
    out = (np.asarray(d, np.float32) * alpha).astype(np.float32)
    if bias is not None:
        out = (out + bias.detach().float().numpy()).astype(np.float32)
    return torch.from_numpy(out).to(dtype)


def assert_default_accumulation(
    got: torch.Tensor, a: torch.Tensor, b: torch.Tensor, sa: float = 1.0, sb: float = 1.0, what: str = "D"
) -> int:
    """The default (``accumulator=None``) GEMM's float32 result ``got`` against the exact products of the
    decoded operands ``a`` (M, K), ``b`` (K, N) and the epilogue ``fl32(. * fl32(sa * sb))``: equal bits where
    every float32 summation order is exact, within ``gamma_K * sum |p| * alpha`` (plus the epilogue's
    rounding) elsewhere: there BLAS's order is the contract, not bits.  Returns how many elements were
    checked bit for bit."""
    got = got.detach().float().numpy()
    want = epilogue(rn_f32(a, b), sa, sb).numpy()
    free = order_free(a, b)
    exact_bits = free & (got.view(np.uint32) != want.view(np.uint32))
    if exact_bits.any():
        i = tuple(int(j) for j in np.argwhere(exact_bits)[0])
        raise AssertionError(
            f"{what}: element {i} is exact in every float32 order: {got[i]!r} ({got.view(np.uint32)[i]:#010x}) "
            f"!= {want[i]!r} ({want.view(np.uint32)[i]:#010x})"
        )
    alpha = float(np.float32(np.float32(sa) * np.float32(sb)))
    tol = sum_error_bound(a, b) * abs(alpha) * (1 + 2.0**-23) + np.abs(want).astype(np.float64) * 2.0**-23
    far = ~free & (np.abs(got.astype(np.float64) - want.astype(np.float64)) > tol)
    if far.any():
        i = tuple(int(j) for j in np.argwhere(far)[0])
        raise AssertionError(f"{what}: element {i}: {got[i]!r} is more than {tol[i]:.3g} from {want[i]!r}")
    return int(free.sum())


def chain(
    a_codes: torch.Tensor | np.ndarray,
    b_codes: torch.Tensor | np.ndarray,
    a_format: str,
    b_format: str,
    instruction: str,
    promote_every: int | None,
) -> np.ndarray:
    """A tensor-core GEMM ``A (M, K) @ B (K, N)`` on FP8 codes from the per-instruction model ``dot_add``:
    K-element instructions chained from ``c = 0``; every ``promote_every`` elements (None: never) the
    chain's value is added into a float32 register with RN and the chain restarts from 0.  K must be a
    K that is not a multiple of the instruction's K is padded with zero codes (+0 adds nothing, as a kernel pads
    its last instruction).  float32 (M, N), unscaled."""
    ac = np.asarray(a_codes.numpy() if isinstance(a_codes, torch.Tensor) else a_codes).astype(np.int64)
    bc = np.asarray(b_codes.numpy() if isinstance(b_codes, torch.Tensor) else b_codes).astype(np.int64)
    k_instr = get_instruction_model(instruction).k
    if ac.shape[1] % k_instr:
        pad = k_instr - ac.shape[1] % k_instr
        ac, bc = np.pad(ac, ((0, 0), (0, pad))), np.pad(bc, ((0, pad), (0, 0)))
    m, k = ac.shape
    n = bc.shape[1]
    a3 = np.broadcast_to(ac[:, None, :], (m, n, k))
    b3 = np.broadcast_to(bc.T[None, :, :], (m, n, k))
    reg = np.zeros((m, n), np.float32)
    c = np.zeros((m, n), np.float32)
    for start in range(0, k, k_instr):
        part = slice(start, start + k_instr)
        c = dot_add(a3[..., part], b3[..., part], c, model=instruction, a_format=a_format, b_format=b_format)
        if promote_every is not None and (start + k_instr) % promote_every == 0:
            reg = (reg + c).astype(np.float32)
            c = np.zeros((m, n), np.float32)
    if promote_every is None:
        return c
    return (reg + c).astype(np.float32) if k % promote_every else reg


def codes_of(values: torch.Tensor | np.ndarray, fmt: str) -> np.ndarray:
    """FP8 codes of exactly representable values (through ml_dtypes, independent of fp8sim.cast)."""
    f = get_format(fmt)
    v = _np(values).astype(np.float32)
    codes = v.astype(f.ml_dtype).view(np.uint8)
    if not np.array_equal(codes.view(f.ml_dtype).astype(np.float32), v, equal_nan=True):
        raise ValueError(f"values are not all {fmt} values")
    return codes


_ML = {"e4m3": (ml_dtypes.float8_e4m3fn, 448.0), "e5m2": (ml_dtypes.float8_e5m2, 57344.0)}


def current_scaling_cast(
    x: torch.Tensor, fmt: str, pow2: bool = False, eps: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """The module's operand as TE's Float8CurrentScalingQuantizer makes it (NVIDIA/TransformerEngine d0067d0
    ``csrc/quantizer.cpp`` 980-1033): amax, scale (``common/recipe/recipe_common.cuh`` 14-49: an amax below
    ``eps`` is ``eps``, an infinite scale is FLT_MAX as ``current_scaling.cu`` 274-275, ``pow2`` keeps sign and
    exponent bits), the cast ``satfinite(RN(fl32(x) * scale))`` with ml_dtypes.  Returns (decoded values,
    codes, scale_inv)."""
    dt, fmax = _ML[fmt]
    xf = x.detach().float().numpy()
    amax = np.float32(np.abs(xf).max())
    if amax < np.float32(eps):
        amax = np.float32(eps)
    with np.errstate(over="ignore", divide="ignore"):
        scale = np.float32(1) if amax == 0 or not np.isfinite(amax) else np.float32(fmax) / amax
    if np.isinf(scale):
        scale = np.finfo(np.float32).max
    if pow2:
        scale = (np.array(scale, np.float32).view(np.uint32) & np.uint32(0xFF800000)).view(np.float32)[()]
    q = np.clip(xf * np.float32(scale), -fmax, fmax).astype(dt)
    return (
        torch.from_numpy(q.astype(np.float32)),
        torch.from_numpy(q.view(np.uint8).copy()),
        float(np.float32(1) / scale),
    )
