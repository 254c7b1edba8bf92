"""Grouped GEMMs for MoE: ``torch._grouped_mm`` semantics, and a scaled (FP8 rowwise / MXFP8) variant.

``offs`` (int32, 1-D, non-decreasing) holds the *end* index of each group along the grouped dim; group
``g`` spans ``[offs[g-1], offs[g])`` (``offs[-1]`` is 0), so empty groups are allowed.  The layouts
(torch ``aten/src/ATen/native/GroupedMMUtils.h``, ``_grouped_mm``)::

    2d x 3d, offs along M:  a (M, K),    b (G, K, N)  -> out (M, N),     rows of group g: a[g] @ b[g]
    2d x 2d, offs along K:  a (M, K),    b (K, N)     -> out (G, M, N),  out[g] = a[:, g] @ b[g, :]
    3d x 2d, offs along N:  a (G, M, K), b (K, N)     -> out (M, N),     columns of group g: a[g] @ b[:, g]
    3d x 3d, no offs:       a (G, M, K), b (G, K, N)  -> out (G, M, N)   (a batched mm)

Each group is one ``torch.mm`` in the operands' dtype, which is what torch's CPU kernel computes (bit for
bit; ``out_dtype`` must be ``a``'s dtype there); ``out_dtype=torch.float32`` with bf16/fp16 operands
multiplies in float32 (the CUDA kernel's wider output).  Rows or columns past ``offs[-1]`` are zero here
(torch leaves them unwritten).

:func:`scaled_grouped_mm` runs each group of a 2d x 3d or 2d x 2d product through
:func:`fp8sim.gemm.scaled_mm` (so with any fp8sim accumulator): FP8 rowwise operands with float32
dequantization scales (``scale_a`` ``(M,)``, ``scale_b`` ``(G, N)`` for 2d x 3d; ``(G, M)`` and ``(G, N)`` for
2d x 2d), or MXFP8 operands with E8M0 block scales along K (``scale_a`` ``(M, K/32)``, ``scale_b``
``(G, K/32, N)`` for 2d x 3d; ``(M, K/32)`` and ``(K/32, N)`` for 2d x 2d, whose group boundaries must be
multiples of 32).  Needs torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["grouped_mm", "scaled_grouped_mm"]

_MX_BLOCK = 32


def _torch() -> Any:
    import torch

    return torch


def _bounds(offs: Any, total: int, what: str) -> list[tuple[int, int]]:
    torch = _torch()
    if not isinstance(offs, torch.Tensor) or offs.dtype != torch.int32 or offs.dim() != 1:
        raise ValueError(f"offs must be a 1-D int32 tensor of group end offsets along {what}; got {offs!r}")
    ends = [int(v) for v in offs.tolist()]
    starts = [0, *ends][: len(ends)]  # no groups: no starts (torch takes an empty offs)
    if any(e < s for s, e in zip(starts, ends, strict=True)) or (ends and not 0 <= ends[-1] <= total):
        raise ValueError(f"offs must be non-decreasing and at most {total} (the size of {what}); got {ends}")
    return list(zip(starts, ends, strict=True))


def _check_out_dtype(a: Any, out_dtype: Any) -> Any:
    torch = _torch()
    if out_dtype is None or out_dtype == a.dtype:
        return a.dtype
    if out_dtype == torch.float32 and a.dtype in (torch.bfloat16, torch.float16):
        return out_dtype
    raise ValueError(f"out_dtype must be None, {a.dtype} or torch.float32 (for bf16/fp16 operands); got {out_dtype}")


def _mm(x: Any, y: Any, dtype: Any) -> Any:
    if dtype != x.dtype:
        return x.to(dtype) @ y.to(dtype)
    return x @ y


def grouped_mm(a: Any, b: Any, offs: Any = None, bias: Any = None, out_dtype: Any = None) -> Any:
    """``torch._grouped_mm(a, b, offs=offs, bias=bias, out_dtype=out_dtype)`` (module docstring)."""
    torch = _torch()
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        raise TypeError("a and b must be torch tensors")
    if a.dtype != b.dtype:
        raise ValueError(f"a and b must have the same dtype; got {a.dtype} and {b.dtype}")
    if bias is not None:
        raise NotImplementedError("bias is not supported by torch._grouped_mm yet")
    dt = _check_out_dtype(a, out_dtype)
    if a.dim() == 3 and b.dim() == 3:
        if offs is not None:
            raise ValueError("offs must be None for a 3d x 3d grouped mm (a batched mm)")
        if a.shape[0] != b.shape[0]:
            raise ValueError(f"a and b must have the same number of groups; got {a.shape[0]} and {b.shape[0]}")
        return (
            torch.stack([_mm(a[g], b[g], dt) for g in range(a.shape[0])])
            if a.shape[0]
            else a.new_empty((0, a.shape[1], b.shape[2]), dtype=dt)
        )
    if offs is None:
        raise ValueError(f"offs is required unless both a and b are 3d; got a {a.dim()}d and b {b.dim()}d")
    if a.dim() == 2 and b.dim() == 3:
        if a.shape[1] != b.shape[1]:
            raise ValueError(f"contraction dims differ: a {tuple(a.shape)} and b {tuple(b.shape)}")
        bounds = _bounds(offs, a.shape[0], "a's dim 0")
        if len(bounds) != b.shape[0]:
            raise ValueError(f"offs has {len(bounds)} groups, b has {b.shape[0]}")
        out = a.new_zeros((a.shape[0], b.shape[2]), dtype=dt)
        for g, (s, e) in enumerate(bounds):
            if e > s:
                out[s:e] = _mm(a[s:e], b[g], dt)
        return out
    if a.dim() == 2 and b.dim() == 2:
        if a.shape[1] != b.shape[0]:
            raise ValueError(f"contraction dims differ: a {tuple(a.shape)} and b {tuple(b.shape)}")
        bounds = _bounds(offs, a.shape[1], "the contraction dim")
        out = a.new_zeros((len(bounds), a.shape[0], b.shape[1]), dtype=dt)
        for g, (s, e) in enumerate(bounds):
            if e > s:
                out[g] = _mm(a[:, s:e], b[s:e], dt)
        return out
    if a.dim() == 3 and b.dim() == 2:
        if a.shape[2] != b.shape[0]:
            raise ValueError(f"contraction dims differ: a {tuple(a.shape)} and b {tuple(b.shape)}")
        bounds = _bounds(offs, b.shape[1], "b's dim 1")
        if len(bounds) != a.shape[0]:
            raise ValueError(f"offs has {len(bounds)} groups, a has {a.shape[0]}")
        out = a.new_zeros((a.shape[1], b.shape[1]), dtype=dt)
        for g, (s, e) in enumerate(bounds):
            if e > s:
                out[:, s:e] = _mm(a[g], b[:, s:e], dt)
        return out
    raise ValueError(f"a and b must be 2d or 3d; got {a.dim()}d and {b.dim()}d")


def scaled_grouped_mm(
    a: Any,
    b: Any,
    scale_a: Any,
    scale_b: Any,
    offs: Any,
    *,
    out_dtype: Any = None,
    use_fast_accum: bool = False,
    accumulator: Any = None,
    device: str = "hopper",
) -> Any:
    """Grouped ``scaled_mm`` of float8 torch tensors (module docstring); ``out_dtype`` defaults to bfloat16.
    ``accumulator``, ``use_fast_accum`` and ``device`` are :func:`fp8sim.gemm.scaled_mm`'s."""
    torch = _torch()
    from .scaled_mm import scaled_mm

    out_dtype = torch.bfloat16 if out_dtype is None else out_dtype
    sa, sb = torch.as_tensor(scale_a), torch.as_tensor(scale_b)
    mx = sa.dtype in (torch.uint8, getattr(torch, "float8_e8m0fnu", torch.uint8))

    def run(x: Any, y: Any, s_x: Any, s_y: Any) -> Any:
        if x.shape[0] == 0 or y.shape[1] == 0:
            return torch.zeros((x.shape[0], y.shape[1]), dtype=out_dtype)
        return scaled_mm(
            x.contiguous(),
            y.t().contiguous().t(),
            s_x,
            s_y,
            out_dtype=out_dtype,
            use_fast_accum=use_fast_accum,
            accumulator=accumulator,
            device=device,
            strict=False,
        )

    if a.dim() == 2 and b.dim() == 3:
        bounds = _bounds(offs, a.shape[0], "a's dim 0")
        if len(bounds) != b.shape[0]:
            raise ValueError(f"offs has {len(bounds)} groups, b has {b.shape[0]}")
        out = torch.zeros((a.shape[0], b.shape[2]), dtype=out_dtype)
        for g, (s, e) in enumerate(bounds):
            if e > s:
                if mx:
                    out[s:e] = run(a[s:e], b[g], sa[s:e], sb[g])
                else:
                    out[s:e] = run(a[s:e], b[g], sa[s:e].reshape(-1, 1), sb[g].reshape(1, -1))
        return out
    if a.dim() == 2 and b.dim() == 2 and not mx:
        bounds = _bounds(offs, a.shape[1], "the contraction dim")
        out = torch.zeros((len(bounds), a.shape[0], b.shape[1]), dtype=out_dtype)
        for g, (s, e) in enumerate(bounds):
            if e > s:
                out[g] = run(a[:, s:e], b[s:e], sa[g].reshape(-1, 1), sb[g].reshape(1, -1))
        return out
    if a.dim() == 2 and b.dim() == 2:
        # MXFP8 2d x 2d (the wgrad of torchao's AUTO path): one 32-block never spans two groups, so every
        # group boundary must sit on a block boundary (torchao rearranges the scales by ``offs // 32``).
        bounds = _bounds(offs, a.shape[1], "the contraction dim")
        if any(s % _MX_BLOCK or e % _MX_BLOCK for s, e in bounds):
            raise ValueError(
                f"offs must be multiples of {_MX_BLOCK} for an MXFP8 2d x 2d grouped mm (each 32-block of scales "
                f"belongs to one group; pad the token groups); got {[e for _, e in bounds]}"
            )
        out = torch.zeros((len(bounds), a.shape[0], b.shape[1]), dtype=out_dtype)
        for g, (s, e) in enumerate(bounds):
            if e > s:
                bs, be = s // _MX_BLOCK, e // _MX_BLOCK
                out[g] = run(a[:, s:e], b[s:e], sa[:, bs:be], sb[bs:be])
        return out
    raise ValueError(
        f"scaled_grouped_mm supports 2d x 3d and 2d x 2d (rowwise or MXFP8 scales); "
        f"got a {a.dim()}d, b {b.dim()}d, scales {sa.dtype}"
    )
