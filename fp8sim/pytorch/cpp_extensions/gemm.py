"""TE ``cpp_extensions/gemm.py`` ``general_gemm``: one cuBLAS GEMM with TE's layout convention, emulated.

cuBLAS is column-major: ``layout`` names whether ``A`` and ``B`` are transposed there.  In row-major
terms the result is ``op_B(B) @ op_A(A)`` with ``op_A(A) = A.T`` for "T?" and ``A`` for "N?",
``op_B(B) = B`` for "?N" and ``B.T`` for "?T": "TN" is the forward ``x @ W.T``, "NN" dgrad ``dy @ W``,
"NT" wgrad ``dy.T @ x`` (TE ``module/linear.py``).  Leading dimensions are flattened; a "TN"/"NN"
result keeps ``B``'s leading shape.

Operands are both high precision (float32 products summed in float32, one rounding) or both quantized
alike: per-tensor ``Float8Tensor``, ``MXFP8Tensor``, ``Float8BlockwiseQTensor`` (1x128 / 128x128,
split accumulator forced as TE does) or ``NVFP4Tensor`` (E2M1 codes with their UE4M3 1x16 scales in the
instruction, Blackwell's accumulators; ``common/gemm/cublaslt_gemm.cu`` ``cublas_gemm``: the amaxes of the
representations read, ``A``'s rowwise one for "T?" and ``B``'s rowwise one for "?N", fold into
``alpha = fl32(fl32(fl32(alpha * amax_A) * amax_B) * fl32(1 / (36 * E_A * E_B)))`` with each tensor's E4M3
max ``E`` (``recipe/nvfp4.cu`` ``compute_nvfp4_per_tensor_scale_kernel``); FP16 output refused as TE does;
row-scaled NVFP4 operands through TE's Python epilogue: amaxes 1 in the GEMM, a float32 result scaled by
``B``'s per-row and ``A``'s per-column amaxes (their product first when one side is one value), the bias added,
then cast or added to ``out``).
Quantized GEMMs read the representation TE's GEMM reads (``A``
rowwise for "T?", columnwise for "N?"; ``B`` rowwise for "?N", columnwise for "?T") and run the
emulated tensor-core GEMM of ``fp8sim.gemm.scaled_mm`` with the accumulator of the emulated device
that ``use_split_accumulator`` selects (MXFP8: Blackwell's; ``accumulator=`` overrides, e.g. ``"exact"``,
or a device profile such as ``"h100_pcie_cublaslt_12_8_te"``: that GPU's cuBLASLt call, with the split-K
decision for this GEMM's shape, output dtype, fast/split accumulation and formats; inside
``autocast(accumulator=PROFILE)`` the region's profile applies when ``accumulator`` is not given).
The epilogue works in float32 as cuBLAS's: ``alpha * acc (+ bias)``, GELU (tanh form) with the
pre-GELU output returned, or with ``grad=True`` ``acc * dgelu(gelu_in)`` and the bias gradient (sum
of ``B``'s rows); ``accumulate`` adds ``beta * out``; then one rounding to the output dtype, or a
``Float8Quantizer`` output.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ...gemm.plans import current_recorder
from ...gemm.profiles import SplitKUnknownError

__all__ = ["general_gemm", "validate_gemm_scale"]
_LAYOUTS = ("TN", "NN", "NT")


def validate_gemm_scale(scale: float | None, required: bool) -> float:
    """TE: ``alpha`` defaults to 1; ``beta`` must be 0 or None unless accumulating (then default 1)."""
    if required:
        return scale if scale is not None else 1.0
    if scale not in (0.0, None):
        raise ValueError("scale must be zero")
    return 0.0


def _preset(use_split_accumulator: bool, mx: bool = False) -> str:
    """The emulated device's accumulator; MXFP8 GEMMs exist on Blackwell only, so they take its models."""
    from ..utils import get_device_compute_capability

    cc = get_device_compute_capability()
    if cc >= (10, 0) or mx:
        return "blackwell_split" if use_split_accumulator else "blackwell"
    device = "hopper" if cc >= (9, 0) else "ada"
    return f"{device}_{'split' if use_split_accumulator else 'fast'}"


_OUT_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _arithmetic(accumulator: Any, use_split_accumulator: bool, mx: bool) -> tuple[Any, Any]:
    """``(preset, profile)``: ``accumulator`` (None: the ``autocast`` region's, else the emulated device's
    preset), a device name picking fast/split by ``use_split_accumulator``, a preset, or a device profile
    (then ``preset`` is its accumulator for ``use_split_accumulator``)."""
    from ...gemm.profiles import get_profile, is_profile

    if accumulator is None:
        from ..quantization import current_state

        st = current_state()
        accumulator = st.accumulator if st.enabled else None
    if accumulator is None:
        return _preset(use_split_accumulator, mx), None
    if is_profile(accumulator):
        prof = get_profile(accumulator)
        return prof.accumulator_for(not use_split_accumulator), prof
    if accumulator in ("hopper", "ada", "blackwell"):
        if accumulator == "blackwell":
            return ("blackwell_split" if use_split_accumulator else "blackwell"), None
        return f"{accumulator}_{'split' if use_split_accumulator else 'fast'}", None
    return accumulator, None


def _fused_output(q: Any, kind: str) -> bool:
    """TE ``gemm.cpp`` 218-233: cuBLAS writes FP8 itself only for a ``Float8Quantizer`` (that class) and per-tensor
    FP8 operands; TE's other native output quantizers cast the D written in the output dtype (unfused)."""
    from .. import tensor as t

    native = (t.Float8Quantizer, t.Float8CurrentScalingQuantizer, t.MXFP8Quantizer, t.Float8BlockQuantizer)
    if q is not None and not isinstance(q, native + (t.NVFP4Quantizer,)):  # TE _validate_native_gemm_output_quantizer
        raise NotImplementedError(
            f"{type(q).__name__} is not supported as a native GEMM output quantizer. Return a TE-native quantizer "
            "for output/grad_input roles or disable quantized GEMM output for this boundary."
        )
    return type(q) is t.Float8Quantizer and kind == "fp8"


def _fmt_of_quantizer(q: Any) -> str:
    from ..constants import DType

    return "e4m3" if getattr(q, "dtype", None) == DType.kFloat8E4M3 else "e5m2"


def _fmt(t: Any) -> str:
    from ..constants import DType

    return "e4m3" if t._fp8_dtype == DType.kFloat8E4M3 else "e5m2"


def _missing(usage: str) -> RuntimeError:
    return RuntimeError(
        f"GEMM requested the {usage} representation, but it is unavailable. "
        f"Ensure {usage}_usage is enabled and the representation has not "
        "been dropped by update_usage()."
    )


def _quantized_parts(t: Any, usage: str) -> tuple[np.ndarray, Any, str]:
    """The representation TE's GEMM reads, as a matrix in its GEMM orientation (rowwise ``(m, k)``,
    columnwise ``(k, m)``: TE's transposed columnwise data) with its scales in ``scaled_mm``'s
    left-operand layout (one per block along the matrix's rows: ``(rows, cols/block)``, or
    ``(rows/128, cols/128)`` for 128x128 blocks; a scalar for per-tensor FP8), and its format."""
    from ..tensor import Float8Tensor, MXFP8Tensor, NVFP4Tensor

    m, k = math.prod(t.shape[:-1]), t.shape[-1]
    if isinstance(t, NVFP4Tensor):
        return _nvfp4_parts(t, usage, m, k)
    if isinstance(t, Float8Tensor):  # one scale: either representation holds the same values
        codes = (t._data if t._data is not None else t._transpose.movedim(0, -1)).reshape(m, k).numpy()
        return (codes if usage == "rowwise" else codes.T), np.float32(t._scale_inv.reshape(-1)[0].item()), _fmt(t)
    data = t._rowwise_data if usage == "rowwise" else t._columnwise_data
    if data is None:
        raise _missing(usage)
    if isinstance(t, MXFP8Tensor):  # both representations in the logical shape; columnwise blocks run down dim 0
        if usage == "rowwise":
            return data.reshape(m, k).numpy(), t._rowwise_scale_inv[:m, : k // 32].numpy(), _fmt(t)
        return data.reshape(m, k).numpy().T, t._columnwise_scale_inv[: m // 32, :k].numpy().T, _fmt(t)
    rows, cols = (m, k) if usage == "rowwise" else (k, m)  # Float8BlockwiseQTensor: columnwise stored (k, m)
    scale = (t._rowwise_scale_inv if usage == "rowwise" else t._columnwise_scale_inv).numpy()
    if t._is_2D_scaled:
        scale = scale[: -(-rows // 128), : -(-cols // 128)]
    else:  # TE stores 1x128 scales as (blocks along cols, rows)
        scale = scale[: -(-cols // 128), :rows].T
    return data.reshape(rows, cols).numpy(), scale, _fmt(t)


def _nvfp4_parts(t: Any, usage: str, m: int, k: int) -> tuple[np.ndarray, np.ndarray, str]:
    """NVFP4: unpacked E2M1 codes, rowwise ``(m, k)`` or columnwise ``(k, m)``, and their uint8 UE4M3 scales
    ``(rows, cols/16)`` (16x16 tile scales sit on every row of their tile)."""
    from ...scaling.packing import unpack_fp4

    data = t._rowwise_data if usage == "rowwise" else t._columnwise_data
    if data is None:
        raise _missing(usage)
    rows, cols = (m, k) if usage == "rowwise" else (k, m)
    scale = t._rowwise_scale_inv if usage == "rowwise" else t._columnwise_scale_inv
    codes = unpack_fp4(data.reshape(rows, cols // 2).cpu()).numpy()
    return codes, scale[:rows, : -(-cols // 16)].cpu().numpy(), "e2m1"


def _nvfp4_amaxes(A: Any, B: Any, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The amaxes cuBLAS reads: ``A``'s rowwise one for "T?", ``B``'s rowwise one for "?N"."""
    out = []
    for t, rowwise in ((A, layout[0] == "T"), (B, layout[1] == "N")):
        amax = t._amax_rowwise if rowwise else t._amax_columnwise
        if amax is None:
            raise RuntimeError("amax_A_ptr is null" if t is A else "amax_B_ptr is null")
        out.append(amax.reshape(-1).float().cpu())
    return out[0], out[1]


def _nvfp4_alpha(A: Any, B: Any, layout: str, alpha: float, ones: bool = False) -> np.float32:
    """cuBLAS's alpha for an NVFP4 GEMM (``compute_nvfp4_per_tensor_scale_kernel``):
    ``alpha * amax_A * amax_B * fl32(1 / (6 * 6 * E_A * E_B))``, left to right in float32 (amaxes 1:
    ``ones``, TE's row-scaled path)."""
    amaxes, emax = [], []
    for t, amax in zip((A, B), _nvfp4_amaxes(A, B, layout), strict=True):
        amaxes.append(np.float32(1) if ones else np.float32(amax[0].item()))
        emax.append(float(t._nvfp4_e4m3_max) if getattr(t, "_nvfp4_use_4over6", False) else 448.0)
    factor_inv = np.float32(1) / np.float32(6.0 * 6.0 * emax[0] * emax[1])  # the product is exact in float32
    return np.float32(np.float32(np.float32(np.float32(alpha) * amaxes[0]) * amaxes[1]) * factor_inv)


def _kind(t: Any, name: str) -> str:
    from ..tensor import Float8BlockwiseQTensor, Float8Tensor, MXFP8Tensor, NVFP4Tensor, QuantizedTensor

    if isinstance(t, Float8Tensor):
        return "fp8"
    if isinstance(t, MXFP8Tensor):
        return "mxfp8"
    if isinstance(t, Float8BlockwiseQTensor):
        return "block"
    if isinstance(t, NVFP4Tensor):
        return "nvfp4"
    if isinstance(t, QuantizedTensor):
        raise NotImplementedError(
            f"general_gemm: {name} is a {type(t).__name__}; fp8sim emulates general_gemm on Float8Tensor, "
            "MXFP8Tensor, Float8BlockwiseQTensor, NVFP4Tensor and high-precision operands"
        )
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"general_gemm: {name} must be a torch.Tensor or a quantized tensor, got {type(t).__name__}")
    return "hp"


_ROLES = {"TN": "fprop", "NN": "dgrad", "NT": "wgrad"}


def _profile_split(
    prof: Any, kind: str, layout: str, m: int, n: int, k: int, out: str, fast: bool, fa: str, fb: str
) -> tuple[int, str, str]:
    """``(S, scheme, source)`` of the profile for this call: a split given with ``with_splits``, else its table
    for per-tensor FP8 (block-scaled operands need a given split: no block-scaled cuBLASLt call was recorded)."""
    what = f"the general_gemm call (layout {layout}, a {_ROLES[layout]} GEMM in TE's modules)"
    for key in ((m, n, k, out, fast), (m, n, k)):
        if key in prof.splits:
            return (*prof.splits[key], "override")
    if kind == "fp8":
        d = prof.decide(m, n, k, out, fast, fa, fb, what=what)
        return d.S, d.scheme, d.source
    raise SplitKUnknownError(
        f"profile {prof.name!r} records cuBLASLt's split-K for per-tensor scaled FP8 GEMMs only; {what} is "
        f"{kind} (M={m} N={n} K={k}, -> {out}, use_fast_accum={fast}). Ways out: "
        f"accumulator=get_profile({prof.name!r}).with_splits({{({m}, {n}, {k}): (1, 'none')}}) if your GPU does "
        "not split it, or an instruction preset"
    )


def _gemm32(
    A: Any,
    B: Any,
    layout: str,
    kind: str,
    preset: Any,
    profile: Any = None,
    fast: bool = False,
    out_dtype: str = "",
    addend: torch.Tensor | None = None,
) -> torch.Tensor:
    """``op_B(B) @ op_A(A)`` in float32 (before the epilogue).  Quantized operands: the representation
    TE picks (``A`` rowwise for "T?", else columnwise; ``B`` columnwise for "?T", else rowwise); in
    GEMM orientation the left operand is ``B``'s matrix and the right one ``A``'s, transposed.  With a
    ``profile``, ``preset`` is its accumulator for ``fast`` and the split is its decision for ``out_dtype``.
    ``addend`` (per-tensor FP8 only): ``beta * C`` joining the scales in one float32 FMA, cuBLASLt's
    ``alpha * acc + beta * C`` with ``alpha = fl32(scale_inv_a * scale_inv_b)``."""
    if kind != "hp":
        from ...gemm import scaled_mm

        a_codes, a_s, a_fmt = _quantized_parts(A, "rowwise" if layout[0] == "T" else "columnwise")
        left, left_s, b_fmt = _quantized_parts(B, "columnwise" if layout[1] == "T" else "rowwise")
        split_k, epilogue = None, "alpha"
        (m, k), n = left.shape, a_codes.shape[0]
        plan = {"split": 1, "scheme": "none", "source": "preset", "note": ""}
        if profile is not None:
            try:
                *split_k, source = _profile_split(profile, kind, layout, m, n, k, out_dtype, fast, b_fmt, a_fmt)
                plan.update(split=split_k[0], scheme=split_k[1], source=source)
            except SplitKUnknownError as e:  # a dry recorder lists it; otherwise TE's call cannot be emulated
                rec = current_recorder()
                if rec is None or not rec.dry:
                    raise
                split_k = (1, "none")
                plan.update(split=None, scheme="?", source="unknown", note=str(e))
            split_k = None if split_k[0] == 1 else tuple(split_k)
            epilogue = profile.epilogue
        _record(layout, m, n, k, b_fmt, a_fmt, kind, out_dtype, fast, preset, profile, plan)
        fused = addend is not None and kind == "fp8"
        out = scaled_mm(
            np.ascontiguousarray(left),
            np.ascontiguousarray(a_codes.T),
            np.float32(1) if fused else (left_s if np.ndim(left_s) == 0 else np.ascontiguousarray(left_s)),
            np.float32(1) if fused else (a_s if np.ndim(a_s) == 0 else np.ascontiguousarray(a_s.T)),
            out_dtype="float32",
            accumulator=preset,
            a_format=b_fmt,
            b_format=a_fmt,
            strict=False,
            split_k=split_k,
            epilogue=epilogue,
        )
        if fused:  # the "alpha" epilogue's product of the scales, then one FMA with C
            from ...gemm._exact import fma_f32

            alpha = np.float32(np.float32(left_s) * np.float32(a_s))
            with np.errstate(invalid="ignore", over="ignore"):
                out = fma_f32(np.asarray(out, np.float32), alpha, addend.detach().float().cpu().numpy())
        return torch.from_numpy(np.ascontiguousarray(out, np.float32))
    a2, b2 = A.reshape(-1, A.shape[-1]).float(), B.reshape(-1, B.shape[-1]).float()
    right = a2.t() if layout[0] == "T" else a2
    left = b2.t() if layout[1] == "T" else b2
    hp = str(A.dtype).removeprefix("torch.")
    plan = {"split": 1, "scheme": "none", "source": "default", "note": "high-precision operands"}
    _record(layout, left.shape[0], right.shape[1], left.shape[1], hp, hp, "hp", out_dtype, None, None, None, plan)
    return torch.matmul(left, right)


def _record(layout: str, m: int, n: int, k: int, fa: str, fb: str, kind: str, out: str, fast: Any, preset: Any,
            profile: Any, plan: dict) -> None:  # fmt: skip
    """The call's plan for ``fp8sim explain`` (module "general_gemm"; role by TE's layout convention)."""
    if current_recorder() is None:
        return
    from ..module._gemm_plan import DEFAULT, record_plan

    scaling = {"fp8": "tensorwise", "hp": "high precision"}.get(kind, kind)
    acc = DEFAULT if preset is None else str(getattr(preset, "name", preset))
    record_plan(
        "general_gemm", "", _ROLES[layout], m=m, n=n, k=k, a_format=fa, b_format=fb, scaling=scaling, out_dtype=out,
        use_fast_accum=fast, accumulator=acc, profile=None if profile is None else profile.name, **plan,
    )  # fmt: skip


def _row_scaled(
    A: Any,
    B: Any,
    acc: torch.Tensor,
    layout: str,
    alpha: float,
    out_dtype: torch.dtype | None,
    out: torch.Tensor | None,
    bias: torch.Tensor | None,
    accumulate: bool,
    gelu: bool,
    grad: bool,
    quantization_params: Any,
) -> tuple[torch.Tensor, None, None, None]:
    """TE ``general_gemm`` with a row-scaled NVFP4 operand (``cpp_extensions/gemm.py``): the per-tensor GEMM
    with both amaxes 1 into float32, times ``B``'s amaxes per row and ``A``'s per column, plus the bias."""
    assert not gelu, "Row-scaled NVFP4 GEMM currently does not support fused GELU."
    assert quantization_params is None, "Row-scaled NVFP4 GEMM currently does not support output quantization."
    col, row = _nvfp4_amaxes(A, B, layout)
    out2 = acc * torch.tensor(_nvfp4_alpha(A, B, layout, alpha, ones=True))
    row, col = row.view(-1, 1), col.view(1, -1)
    if col.numel() == 1:
        out2 = out2 * (row * col)
    elif row.numel() == 1:
        out2 = out2 * (col * row)
    else:
        out2 = out2 * row * col
    if bias is not None:
        assert not grad, "Row-scaled NVFP4 backward does not support fused bias gradient."
        out2 = out2 + bias.to(dtype=torch.float32)
    lead = tuple(B.shape[:-1]) if layout[1] == "N" else (B.shape[-1],)
    result = out2.reshape(*lead, out2.shape[-1])
    if out is not None:
        if accumulate:  # added in the output's dtype, as TE's requested_out.add_
            out.add_(result.to(dtype=out.dtype))
        else:
            out.copy_(result.to(dtype=out.dtype))
        return out, None, None, None
    if out_dtype is not None and out_dtype != torch.float32:
        result = result.to(dtype=out_dtype)
    return result, None, None, None


def _gelu(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x, approximate="tanh")


def _dgelu(x: torch.Tensor) -> torch.Tensor:
    """d/dx of the tanh GELU, in float32."""
    k = math.sqrt(2.0 / math.pi)
    inner = k * (x + 0.044715 * x**3)
    t = torch.tanh(inner)
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x)


# TE's parameter order, and that of earlier TE 2.x releases (a workspace third, no alpha/beta)
_PARAMS = (
    "out_dtype", "quantization_params", "gelu", "gelu_in", "alpha", "beta", "accumulate", "layout", "out", "bias",
    "use_split_accumulator", "grad", "ub", "ub_type", "extra_output", "bulk_overlap",
)  # fmt: skip
_LEGACY_PARAMS = ("workspace", *(p for p in _PARAMS if p not in ("alpha", "beta")))


def general_gemm(A: Any, B: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any, Any, Any]:
    """TE ``general_gemm(A, B, out_dtype=None, quantization_params=None, gelu=False, gelu_in=None,
    alpha=1.0, beta=None, accumulate=False, layout="TN", out=None, bias=None, use_split_accumulator=False,
    grad=False, ub=None, ub_type=None, extra_output=None, bulk_overlap=False)``, returning
    ``(out, bias_grad, gelu_input, extra_output)``.  A third positional ``torch.Tensor`` (or a
    ``workspace=`` keyword) is the earlier signature's cuBLAS workspace, ignored.  fp8sim's
    keyword ``accumulator`` overrides the accumulator ``use_split_accumulator`` picks."""
    legacy = (bool(args) and isinstance(args[0], torch.Tensor)) or "workspace" in kwargs
    names = _LEGACY_PARAMS if legacy else _PARAMS
    if len(args) > len(names):
        raise TypeError(f"general_gemm() takes at most {len(names) + 2} positional arguments ({len(args) + 2} given)")
    for name, value in zip(names, args, strict=False):
        if name in kwargs:
            raise TypeError(f"general_gemm() got multiple values for argument {name!r}")
        kwargs[name] = value
    kwargs.pop("workspace", None)
    unknown = sorted(set(kwargs) - set(_PARAMS) - {"accumulator"})
    if unknown:
        raise TypeError(f"general_gemm() got unexpected keyword arguments {unknown}; known: {', '.join(_PARAMS)}")
    return _general_gemm(A, B, **kwargs)


def _general_gemm(
    A: Any,
    B: Any,
    out_dtype: torch.dtype | None = None,
    quantization_params: Any = None,
    gelu: bool = False,
    gelu_in: torch.Tensor | None = None,
    alpha: float = 1.0,
    beta: float | None = None,
    accumulate: bool = False,
    layout: str = "TN",
    out: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    use_split_accumulator: bool = False,
    grad: bool = False,
    ub: Any = None,
    ub_type: Any = None,
    extra_output: torch.Tensor | None = None,
    bulk_overlap: bool = False,
    accumulator: str | None = None,
) -> tuple[Any, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    assert layout in _LAYOUTS, f"GEMM layout {layout} not supported."
    alpha = validate_gemm_scale(alpha, True)
    beta = validate_gemm_scale(beta, accumulate)
    if ub is not None or ub_type is not None or bulk_overlap:
        raise NotImplementedError("general_gemm: Userbuffers communication overlap (ub, ub_type) is not emulated")
    if out is not None and not out.is_contiguous():
        raise ValueError("Output tensor is not contiguous.")
    from ..tensor.hybrid_tensor import gemm_operand
    from ..tensor.utils import is_custom

    A = gemm_operand(A, "rowwise" if layout[0] == "T" else "columnwise")  # a hybrid tensor: its direction's copy
    B = gemm_operand(B, "columnwise" if layout[1] == "T" else "rowwise")
    if is_custom(A) or is_custom(B):  # TE: custom tensors go to their quantizer's qgemm
        from ..custom_recipes.gemm import custom_gemm

        return custom_gemm(
            A,
            B,
            None,
            out_dtype,
            quantization_params,
            gelu,
            gelu_in,
            accumulate,
            layout,
            out,
            bias,
            use_split_accumulator,
            grad,
        )
    if accumulate and out is None:
        raise ValueError("general_gemm: accumulate=True needs the `out` tensor to accumulate into")
    kinds = (_kind(A, "A"), _kind(B, "B"))
    if kinds[0] != kinds[1]:
        raise TypeError(
            f"general_gemm: A is {kinds[0]} and B is {kinds[1]}; both must be Float8Tensor, both MXFP8Tensor "
            "or both high precision (cuBLAS takes no mix)"
        )
    fp8 = kinds[0] != "hp"
    fused = _fused_output(quantization_params, kinds[0])
    if kinds[0] == "block":  # TE: "FP8 block-scaling requires split accumulator"
        use_split_accumulator = True
    nvfp4 = kinds[0] == "nvfp4"
    row_scaled = nvfp4 and any(a.numel() > 1 for a in _nvfp4_amaxes(A, B, layout))
    dtype = out_dtype or (out.dtype if out is not None else A.dtype)
    if nvfp4 and not row_scaled and dtype == torch.float16:  # the row-scaled path's GEMM writes float32
        raise RuntimeError("FP4 GEMM does not support FP16 output!")
    preset, profile = _arithmetic(accumulator, use_split_accumulator, kinds[0] in ("mxfp8", "nvfp4"))
    q = quantization_params
    out_name = _fmt_of_quantizer(q) if fused else _OUT_NAMES.get(dtype, "float32")  # FP8: cuBLAS writes it
    # accumulating a per-tensor FP8 GEMM (beta * C) with nothing else in the epilogue: cuBLASLt's one FMA
    fma_c = accumulate and kinds[0] == "fp8" and alpha == 1.0 and bias is None and not gelu and not grad
    addend = np.float32(beta) * out.reshape(-1, out.shape[-1]).float() if fma_c else None
    acc = _gemm32(A, B, layout, kinds[0], preset, profile, not use_split_accumulator, out_name, addend)
    if row_scaled:
        return _row_scaled(A, B, acc, layout, alpha, out_dtype, out, bias, accumulate, gelu, grad, quantization_params)
    if nvfp4:  # cuBLAS multiplies by the alpha the amaxes give, 1 or not
        acc = acc * torch.tensor(_nvfp4_alpha(A, B, layout, alpha))
    elif alpha != 1.0:
        acc = acc * np.float32(alpha)
    bias_grad = gelu_input = None
    if grad:
        if bias is not None:  # the dbias epilogue: sum of B's rows, float32, in the bias dtype
            b2 = B.dequantize(dtype=torch.float32) if fp8 else B.float()
            bias_grad = b2.reshape(-1, b2.shape[-1]).sum(0).to(bias.dtype)
        if gelu:
            acc = acc * _dgelu(gelu_in.reshape(acc.shape).float())
    else:
        if bias is not None:
            acc = acc + bias.float()
        if gelu:  # the pre-GELU output, in the bias dtype for FP8 GEMMs (bf16 default) or the output dtype
            gelu_dtype = (bias.dtype if bias is not None else torch.bfloat16) if fp8 else dtype
            gelu_input = acc.to(gelu_dtype)
            acc = _gelu(acc)
    if accumulate and not fma_c:
        acc = acc + np.float32(beta) * out.reshape(acc.shape).float()
    lead = tuple(B.shape[:-1]) if layout[1] == "N" else (B.shape[-1],)
    shape = (*lead, acc.shape[-1])
    if gelu_input is not None:
        gelu_input = gelu_input.reshape(shape)
    if fused:
        return quantization_params(acc.reshape(shape)), bias_grad, gelu_input, extra_output
    result = acc.reshape(shape).to(dtype)
    if quantization_params is not None:  # TE gemm.cpp: unfused, D written in the output dtype, then quantized
        return quantization_params(result), bias_grad, gelu_input, extra_output
    if out is not None:
        out.copy_(result)
        result = out
    return result, bias_grad, gelu_input, extra_output
