"""``scaled_mm``: torch._scaled_mm's semantics (spec 8) with a chosen accumulator (spec 9.2).

``out = cast_out(epilogue(acc))`` where ``acc`` sums ``a @ b`` as the accumulator says and the
epilogue applies the dequantization scales, the bias and the output rounding:

- tensorwise / rowwise scales (float32): ``d = fl32(fl32(sa * sb) * acc)`` (``epilogue="alpha"``,
  default) or ``fl32(fl32(acc * sa) * sb)`` (``"sequential"``); then ``fl32(d + bias)``; then round
  to the output dtype (nearest even; FP8 output is ``satfinite(RN(d * scale_result))``).
- 1x128 / 128x128 block scales (float32): per 128-wide K tile ``P`` (the accumulator over the
  tile), ``y = fma(fl32(P * s1), s2, y)`` as TE's cuBLAS-exact blockwise reference does (spec 8.3);
  any other tiling (A per m-block x k-block, B per k-block x n-block, e.g. CUTLASS's 128x64x128)
  with ``block_shape=`` or ``strict=False``, in the FMA order ``block_order`` names
  (:mod:`fp8sim.gemm._blocks`).
- MX 1x32 (E8M0 codes) and NVFP4 1x16 (UE4M3 codes): the block scales enter the instructions
  (Blackwell ``kind::mxf8f6f4`` / ``kind::mxf4nvf4``); scales are given unswizzled, one per block,
  shaped ``(M, K/block)`` and ``(K/block, N)``.

Operands: torch float8 tensors (row-major ``a``, column-major ``b``, as cuBLASLt wants) or numpy
code arrays with ``a_format`` / ``b_format``.  ``strict=True`` raises torch's messages for what CUDA
refuses; ``strict=False`` lifts the layout and size checks for studies.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from .._util.args import as_bool
from .._util.tensors import is_torch_tensor
from ..cast import decode, encode
from ..formats import FloatFormat, get_format
from ..scaling.swizzle import unswizzle_mm_scales
from . import _numba
from ._block_formats import BLOCK_LAYOUTS, check_variant_accumulator, resolve_block_layout
from ._blocks import blockwise, expand_block_scales
from ._checks import (
    _OUT_FLOATS,
    check_arguments,
    check_bias,
    check_scale_dtypes,
    check_torch_rules,
    out_dtype_name,
)
from ._dispatch import _IN_INSTRUCTION, _block_instruction, _keep_on_device, _torch_backend, _torch_gemm
from ._exact import exact_matmul_f32
from ._scaled_mm_args import (  # noqa: F401  (the helpers stay importable from here)
    _as_input,
    _block_layout,
    _check_onednn_call,
    _layout,
    _operand,
    _pick_accumulator,
    _profile_split,
    _scale,
)
from .accumulators import Accumulator
from .instructions import _decoded, align_sum, get_instruction_model, run_instruction
from .splitk import check_split_k, split_accumulate

__all__ = ["scaled_mm"]


def scaled_mm(
    a: Any,
    b: Any,
    scale_a: Any,
    scale_b: Any,
    bias: Any = None,
    scale_result: Any = None,
    out_dtype: Any = None,
    use_fast_accum: bool = False,
    *,
    accumulator: str | Accumulator | None = None,
    device: str = "hopper",
    a_format: str | FloatFormat | None = None,
    b_format: str | FloatFormat | None = None,
    strict: bool = True,
    epilogue: str = "alpha",
    split_k: tuple[int, str] | None = None,
    profile: Any = None,
    backend: str | None = None,
    block_shape: tuple[int, int, int] | None = None,
    block_order: str | None = None,
    block_scale_format: str | None = None,
) -> Any:
    """Emulated ``torch._scaled_mm(a, b, scale_a, scale_b, bias, scale_result, out_dtype,
    use_fast_accum)``; scales are dequantization multipliers.

    ``accumulator``: a preset name (``exact``, ``dequantized_fp32``, ``hopper_fast``,
    ``hopper_split``, ``ada_fast``, ``ada_split``, ``blackwell``, ``blackwell_split``) or an
    :class:`Accumulator`; None picks ``{device}_fast`` when ``use_fast_accum`` else
    ``{device}_split`` (``device``: hopper, ada or blackwell).  ``out_dtype`` defaults to ``a``'s
    format (FP8 output, as torch); for numpy operands it may be "float32", "bfloat16", "float16" or
    a format name.  Returns a torch tensor for torch operands (on ``a``'s device), else numpy.

    ``split_k=(S, scheme)`` runs cuBLAS's split-K (:mod:`fp8sim.gemm.splitk`: ``"contiguous"``,
    ``"serial"``, ``"pairwise"``) for tensorwise and rowwise scales; None (default) is unsplit.
    ``profile``: a :mod:`fp8sim.gemm.profiles` name or record; it supplies the accumulator, the
    epilogue and the split for this shape wherever those arguments are not given.

    ``backend``: where the tensor-core chains run.  ``"numpy"``: numpy (compiled with numba when
    installed); ``"torch"``: torch ops on the operands' device (:mod:`fp8sim.gemm._torch_chain`, the
    same bits; every tensor-core accumulator, with tensorwise, rowwise, 1x128/128x128 block, MX or
    NVFP4 scales, and ``exact`` with tensorwise or rowwise scales); None (default): ``"torch"`` for
    torch operands on a CUDA (or other non-CPU, non-MPS) device where it applies, else ``"numpy"``.

    ``block_shape=(block_m, block_n, block_k)``: float32 block scales of any tiling (CUTLASS's scale
    granularity M x N x K, e.g. ``(128, 64, 128)``; ``scale_a`` shaped ``(ceil(M/block_m), ceil(K/block_k))``,
    ``scale_b`` ``(ceil(K/block_k), ceil(N/block_n))``, partial edge blocks allowed), as a reference for
    blockwise kernels; with ``strict=False`` a tiling whose blocks divide the shapes is also inferred
    from the scale shapes (torch's 1x128 / 128x128 shapes keep torch's meaning).  ``block_order``: how
    each K-block's partial enters the float32 result, ``"scale_a_first"`` ``fma(fl32(P*sa), sb, y)``,
    ``"scale_b_first"`` ``fma(fl32(P*sb), sa, y)`` or ``"scale_product"`` ``fma(P, fl32(sa*sb), y)``;
    None: TE's cuBLAS rule (``scale_b_first`` for 2D A with 1D B, else ``scale_a_first``).

    ``block_scale_format`` (fp8sim extension): how uint8 block-scale codes read, ``"e8m0"``, ``"e4m3"`` or
    ``"ue5m3"``; None infers MX (per 32) or NVFP4 E4M3 (per 16, E2M1 operands) from the shapes.  ``"ue5m3"``
    (per 16) and ``"e4m3"`` with ``(M, K/32)`` scales are the NVFP4 variants (:mod:`fp8sim.gemm._block_formats`).
    """
    a, b = _as_input(a, "mat1"), _as_input(b, "mat2")
    scale_a, scale_b = _as_input(scale_a, "scale_a", True), _as_input(scale_b, "scale_b", True)
    bias, scale_result = _as_input(bias, "bias", True), _as_input(scale_result, "scale_result", True)
    check_arguments(a, b, scale_a, scale_b)
    if backend is not None and (not isinstance(backend, str) or backend not in ("numpy", "torch")):
        raise ValueError(f"backend must be None, 'numpy' or 'torch'; got {backend!r:.60}")
    use_fast_accum, strict = as_bool(use_fast_accum, "use_fast_accum"), as_bool(strict, "strict")
    if scale_result is not None and (
        np.size(_scale(scale_result)) != 1 or _scale(scale_result).dtype.kind not in "iuf"
    ):
        raise ValueError(
            f"scale_result must be None or one real number (a 1-element tensor or array), got {scale_result!r:.60}"
        )
    torch_in = is_torch_tensor(a)
    host = not _keep_on_device(a, b, backend)
    ac, fa = _operand(a, a_format, "mat1", host)
    bc, fb = _operand(b, b_format, "mat2", host)
    if ac.ndim != 2 or bc.ndim != 2:
        raise RuntimeError(f"mat1 and mat2 must be matrices, got shapes {ac.shape} and {bc.shape}")
    m, k = ac.shape
    if bc.shape[0] != k:
        raise RuntimeError(f"mat_a and mat_b shapes cannot be multiplied ({m}x{k} and {bc.shape[0]}x{bc.shape[1]})")
    n = bc.shape[1]
    out = out_dtype_name(out_dtype, fa)
    if not isinstance(epilogue, str) or epilogue not in ("alpha", "sequential"):
        raise ValueError(f"epilogue must be 'alpha' or 'sequential', got {epilogue!r:.60}")
    if bias is not None:
        check_bias(bias, n)
    prof = None
    if profile is not None:
        from .profiles import get_profile

        prof = get_profile(profile)
        accumulator = prof.accumulator_for(use_fast_accum) if accumulator is None else accumulator
        epilogue = prof.epilogue
    acc = _pick_accumulator(accumulator, use_fast_accum, device)
    onednn = acc.kind == "fp32_matmul"  # torch's oneDNN CPU kernel: item<float>() takes any float scale
    if strict:
        check_torch_rules(a, b, fa, fb, bias, out)
        if not onednn:
            check_scale_dtypes(scale_a, scale_b, m, k, n)
    sa, sb = _scale(scale_a), _scale(scale_b)
    if onednn:
        _check_onednn_call(sa, sb, scale_result, out_dtype)
        sa, sb = np.asarray(sa, np.float32), np.asarray(sb, np.float32)  # float64 rounds to nearest, as C++
    # MX/NVFP4 scales may come flat in the 128x4 blocked layout, as torch._scaled_mm takes them (issue 17)
    sa, sb = unswizzle_mm_scales(scale_a, scale_b, sa, sb, m, k, n, fa.name == "e2m1")
    layout, tiling = _block_layout(sa, sb, m, k, n, fa, block_shape, block_order, strict)
    if block_scale_format is not None:
        layout = resolve_block_layout(layout, block_scale_format, sa, sb, m, k, n, fa.name == "e2m1")
        check_variant_accumulator(layout, acc.kind)
    if prof is not None and split_k is None:
        split_k = _profile_split(prof, layout, m, n, k, out, use_fast_accum, fa.name, fb.name)
    split = check_split_k(split_k)
    if split is not None and layout not in ("tensorwise", "rowwise"):
        raise ValueError(f"split_k applies to tensorwise and rowwise scales; these scales are {layout}")
    on_torch = _torch_backend(backend, acc, layout, host)
    if not (host or on_torch):  # the numpy path after all: codes to the host
        ac, bc = (x.cpu().numpy() if is_torch_tensor(x) else x for x in (ac, bc))
    if m == 0 or n == 0 or k == 0:
        d = np.zeros((m, n), np.float32)
    elif acc.kind == "dequantized_fp32":
        d = _dequantized(ac, bc, fa, fb, sa, sb, layout, split, tiling)
    elif on_torch and layout in _IN_INSTRUCTION:
        d = _torch_gemm(ac, bc, fa, fb, acc, None, _block_instruction(acc, layout), (sa, sb))
    elif on_torch and layout in ("tensorwise", "rowwise"):
        raw = _torch_gemm(ac, bc, fa, fb, acc, split)
        d = _alpha(raw, sa.reshape(-1, 1) if layout == "rowwise" else sa.reshape(1, 1), sb.reshape(1, -1), epilogue)
    elif layout in ("tensorwise", "rowwise"):
        if split is None:
            raw = _accumulate(ac, bc, fa, fb, acc)
        else:
            raw = split_accumulate(ac, bc, split, lambda x, y: _accumulate(x, y, fa, fb, acc))
        d = _alpha(raw, sa.reshape(-1, 1) if layout == "rowwise" else sa.reshape(1, 1), sb.reshape(1, -1), epilogue)
    elif layout.startswith("block"):
        d = _blockwise(ac, bc, fa, fb, acc, sa, sb, layout, tiling, block_order, on_torch)
    else:
        d = _block_scaled_in_instruction(ac, bc, fa, fb, acc, sa, sb, layout)
    if bias is not None:
        bvals = _scale(bias).astype(np.float32).reshape(1, -1)
        d = (d + bvals).astype(np.float32)
    kernel = "fallback" if acc.name == "cpu_reference" else "onednn" if onednn else None
    if kernel == "fallback" and out_dtype is None:
        scale_result = None  # torch's CPU fallback ignores scale_result unless out_dtype is given (torch 2.13)
    return _finish(d, out, scale_result, torch_in, a, cpu_kernel=kernel)


def _values(codes: np.ndarray, f: FloatFormat) -> np.ndarray:
    """float32 values of uint8 codes (exact)."""
    return decode(codes, f)


def _accumulate(ac: np.ndarray, bc: np.ndarray, fa: FloatFormat, fb: FloatFormat, acc: Accumulator) -> np.ndarray:
    """float32 (M, N): the unscaled sum of a @ b as ``acc`` computes it."""
    if acc.kind == "tensor_core":
        return _tensor_core(ac, bc, fa, fb, acc, None, None)
    va, vb = _values(ac, fa), _values(bc, fb)
    if acc.kind == "exact":
        return _exact_with_specials(va.astype(np.float64), vb.astype(np.float64), fa, fb)
    return _matmul_f32(va, vb)


def _matmul_f32(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """One float32 matmul: torch.matmul (CPU BLAS) on contiguous operands, as torch's CPU
    ``_scaled_mm`` runs it after dequantizing, when torch is installed; numpy's otherwise.  Summation
    order is the BLAS's."""
    try:
        import torch
    except ImportError:
        with np.errstate(invalid="ignore", over="ignore"):
            return np.matmul(a, b)
    return torch.matmul(torch.from_numpy(np.ascontiguousarray(a)), torch.from_numpy(np.ascontiguousarray(b))).numpy()


def _expand_scales(s: np.ndarray, rows: int, cols: int, layout: str, side: str, tiling: Any = None) -> np.ndarray:
    """Per-element dequantization scales (float32 or float64 for block-scale codes) of one operand."""
    if layout == "tensorwise":
        return s.reshape(1, 1).astype(np.float32)
    if layout == "rowwise":
        return s.astype(np.float32)
    if layout in BLOCK_LAYOUTS:
        fmt, block = get_format(BLOCK_LAYOUTS[layout][0]), BLOCK_LAYOUTS[layout][1]
        v = np.abs(decode(s, fmt)).astype(np.float32)  # a UE4M3 scale's sign bit is ignored
        return np.repeat(v, block, axis=1 if side == "a" else 0)[:rows, :cols]
    return expand_block_scales(s, rows, cols, tiling, side)


def _dequantized(ac, bc, fa, fb, sa, sb, layout, split=None, tiling=None) -> np.ndarray:  # noqa: ANN001
    """Dequantize each operand with its scales (float32 multiply), then one float32 matmul: torchao's
    ``emulate=True`` and torch's CPU ``_scaled_mm`` (spec 6.2, 8.3)."""
    m, k = ac.shape
    n = bc.shape[1]
    with np.errstate(invalid="ignore", over="ignore"):
        a = (_values(ac, fa) * _expand_scales(sa, m, k, layout, "a", tiling)).astype(np.float32)
        b = (_values(bc, fb) * _expand_scales(sb, k, n, layout, "b", tiling)).astype(np.float32)
    if split is not None:
        return split_accumulate(a, b, split, _matmul_f32)
    return _matmul_f32(a, b)


def _exact_with_specials(va: np.ndarray, vb: np.ndarray, fa: FloatFormat, fb: FloatFormat) -> np.ndarray:
    finite_a, finite_b = np.isfinite(va), np.isfinite(vb)
    out = exact_matmul_f32(np.where(finite_a, va, 0.0), np.where(finite_b, vb, 0.0), fa.mbits, fb.mbits)
    if not (finite_a.all() and finite_b.all()):
        with np.errstate(invalid="ignore", over="ignore"):
            special = np.matmul(va, vb)  # NaN/Inf propagate as IEEE says
        out = np.where(np.isfinite(special), out, special.astype(np.float32))
    return out


def _tensor_core(
    ac: np.ndarray,
    bc: np.ndarray,
    fa: FloatFormat,
    fb: FloatFormat,
    acc: Accumulator,
    sa: np.ndarray | None,
    sb: np.ndarray | None,
    instruction: str | None = None,
) -> np.ndarray:
    """Chains of instructions along K (float32 or float16 c/d) with optional float32 promotion; float32 (M, N)."""
    im = get_instruction_model(instruction or acc.instruction)
    cd = acc.accumulate
    m, k = ac.shape
    n = bc.shape[1]
    kk = -(-k // im.k) * im.k
    if kk != k:  # zero-pad K to whole instructions (zeros add nothing)
        ac = np.pad(ac, ((0, 0), (0, kk - k)))
        bc = np.pad(bc, ((0, kk - k), (0, 0)))
    if sa is not None and sa.shape[1] * im.scale_block < kk:  # scales for the padding: 1.0 (E8M0 127, E4M3 0x38)
        one = 127 if im.scale_format == "e8m0" else 0x38
        extra = kk // im.scale_block - sa.shape[1]
        sa = np.pad(sa, ((0, 0), (0, extra)), constant_values=one)
        sb = np.pad(sb, ((0, extra), (0, 0)), constant_values=one)
    bt = np.ascontiguousarray(bc.T)
    specials = bool(_has_specials(ac, fa) or _has_specials(bc, fb))
    block = im.k // im.halves
    if not specials and sa is None and im.rounding == "truncate" and cd == "float32" and _numba.available():
        ta, tb = _decoded(fa), _decoded(fb)
        return _numba.chain_gemm(
            ac, bt, (ta[0], ta[2]), (tb[0], tb[2]), block, im.frac_bits, im.out_mbits,
            acc.promote_every,
        )  # fmt: skip
    fast = not specials and im.scale_format != "ue4m3" and im.halves == 1
    if fast:  # decode once; each step is then products + exponents + align_sum (same arithmetic)
        va, _, ea = (t[ac] for t in _decoded(fa))
        vb, _, eb = (t[bt] for t in _decoded(fb))
        ea, eb = ea.astype(np.int16), eb.astype(np.int16)
        if sa is not None:
            xa = np.repeat(sa.astype(np.int16) - 127, im.scale_block, axis=1)
            xb = np.repeat(sb.T.astype(np.int16) - 127, im.scale_block, axis=1)
            va, vb = va * np.ldexp(1.0, xa), vb * np.ldexp(1.0, xb)
            ea, eb = ea + xa, eb + xb
    every = acc.promote_every or kk
    out = np.zeros((m, n), np.float32)
    rows = max(1, (1 << 16) // max(n * im.k, 1))
    with np.errstate(invalid="ignore", over="ignore"):
        for r0 in range(0, m, rows):
            r1 = min(r0 + rows, m)
            reg = np.zeros((r1 - r0, n), np.float32)
            for g0 in range(0, kk, every):
                chain = np.zeros((r1 - r0, n), np.float64)
                for j in range(g0, min(g0 + every, kk), im.k):
                    blk = slice(j, j + im.k)
                    if fast:
                        p = va[r0:r1, None, blk] * vb[None, :, blk]
                        e = ea[r0:r1, None, blk] + eb[None, :, blk]
                        # a NaN/Inf accumulator (NaN scale, overflow) stays what it is, as in the model
                        chain = np.where(np.isfinite(chain), align_sum(im, p, e, chain, cd), chain)
                        if sa is not None:
                            sj = j // im.scale_block  # NaN scale (0xFF) -> NaN, then carried along the chain
                            bad = (sa[r0:r1, sj, None] == 0xFF) | (sb[None, sj, :] == 0xFF)
                            chain = np.where(bad, np.float64(np.float32(np.nan)), chain)
                        continue
                    psa = psb = None
                    if sa is not None:
                        sblk = slice(j // im.scale_block, (j + im.k) // im.scale_block)
                        psa = sa[r0:r1, None, sblk]
                        psb = sb.T[None, :, sblk]
                    new = run_instruction(
                        im, fa, fb, ac[r0:r1, None, blk], bt[None, :, blk], chain, psa, psb, cd, specials=specials
                    )
                    # without special operands, a NaN (NaN scale) or Inf (overflow) chain stays what it is
                    chain = new if specials else np.where(np.isfinite(chain), new, chain)
                reg = (reg + chain.astype(np.float32)).astype(np.float32) if every != kk else chain.astype(np.float32)
            out[r0:r1] = reg
    return out


def _has_specials(codes: np.ndarray, f: FloatFormat) -> bool:
    if not (f.has_nan or f.has_inf):
        return False
    bad = np.array([not np.isfinite(f.code_value(c)) for c in range(f.num_codes)])
    return bool(bad[codes].any())


def _alpha(raw: np.ndarray, sa: np.ndarray, sb: np.ndarray, epilogue: str) -> np.ndarray:
    sa32, sb32 = sa.astype(np.float32), sb.astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        if epilogue == "alpha":
            return ((sa32 * sb32).astype(np.float32) * raw).astype(np.float32)
        return ((raw * sa32).astype(np.float32) * sb32).astype(np.float32)


def _blockwise(ac, bc, fa, fb, acc, sa, sb, layout, tiling, order, on_torch=False) -> np.ndarray:  # noqa: ANN001
    """Block scales (:mod:`fp8sim.gemm._blocks`): per K-block the accumulator's partial, then one FMA
    (``on_torch``: the blocks' chains in torch ops on the operands' device, the FMAs on the host)."""
    if layout == "block_2x2":  # torch's 128x128 x 128x128 (only ambiguous shapes get here): cuBLAS refuses
        raise RuntimeError("2D by 2D block gemm not supported.")
    m, k = ac.shape
    n = bc.shape[1]

    def tile_sum(sl: slice) -> np.ndarray:
        if on_torch:
            return _torch_gemm(ac[:, sl], bc[sl], fa, fb, acc, None)
        return _accumulate(ac[:, sl], bc[sl], fa, fb, acc)

    return blockwise(m, n, k, sa, sb, tiling, order, tile_sum)


def _block_scaled_in_instruction(ac, bc, fa, fb, acc, sa, sb, layout) -> np.ndarray:  # noqa: ANN001
    """MX (E8M0 per 32) and NVFP4 (UE4M3 per 16): scales inside the instruction."""
    sfmt, block = get_format(BLOCK_LAYOUTS[layout][0]), BLOCK_LAYOUTS[layout][1]
    if acc.kind == "tensor_core":
        instr = _block_instruction(acc, layout)
        return _tensor_core(ac, bc, fa, fb, acc, sa.astype(np.int64), sb.astype(np.int64), instr)
    k = ac.shape[1]
    sva = np.repeat(decode(sa, sfmt).astype(np.float64), block, axis=1)[:, :k]
    svb = np.repeat(decode(sb, sfmt).astype(np.float64), block, axis=0)[:k]
    if sfmt.name == "e4m3":
        sva, svb = np.abs(sva), np.abs(svb)  # the sign bit of a UE4M3 scale is ignored
    va, vb = _values(ac, fa).astype(np.float64) * sva, _values(bc, fb).astype(np.float64) * svb
    return _exact_with_specials(va, vb, fa, fb)


def _torch_eager_cast(d: np.ndarray, out: str) -> np.ndarray:
    """torch's ``.to(float8)`` of float32 values: the convention of the installed torch (torch_eager from
    2.13, torch_eager_legacy before; torch_eager without torch)."""
    from ..cast.conventions import CONVENTIONS

    try:
        import torch

        version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    except ImportError:
        version = (2, 13)
    return CONVENTIONS["torch_eager" if version >= (2, 13) else "torch_eager_legacy"].encode(d, out)


def _finish(d: np.ndarray, out: str, scale_result: Any, torch_in: bool, a: Any, cpu_kernel: str | None = None) -> Any:
    """Output rounding; ``cpu_kernel`` ("fallback" / "onednn") applies that torch CPU kernel's FP8 epilogue
    (:mod:`fp8sim.gemm.torch_cpu`), None the cuBLAS one (``satfinite(RN(d * scale_result))``)."""
    if out == "float32":
        res = d.astype(np.float32)
    elif out == "bfloat16":
        res = d.astype(ml_dtypes.bfloat16)
    elif out == "float16":
        with np.errstate(over="ignore"):
            res = d.astype(np.float16)
    else:
        sr = np.float32(1.0) if scale_result is None else np.asarray(_scale(scale_result), np.float32).reshape(())
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            if cpu_kernel == "fallback":  # at::mul(out, 1 / output_scale), then .to(): torch's eager cast
                res = _torch_eager_cast((d * (np.float32(1) / sr)).astype(np.float32), out)
            elif cpu_kernel == "onednn":  # oneDNN divides by the dst scale, then converts without saturating
                res = encode((d / sr).astype(np.float32), out, saturate=False)
            else:
                res = encode((d * sr).astype(np.float32), out, saturate=True)
    if not torch_in:
        return res
    import torch

    if out == "bfloat16":
        t = torch.from_numpy(res.view(np.int16)).view(torch.bfloat16)
    elif out in _OUT_FLOATS:
        t = torch.from_numpy(np.ascontiguousarray(res))
    else:
        t = torch.from_numpy(res).view(get_format(out).torch_dtype)
    return t.to(a.device)
