"""NVFP4: E2M1 elements in 16-element blocks with E4M3 block scales and a float32 global scale.

Two flavours (``docs/semantics.md`` 5.4 and 6.3):

- ``"te"``: TransformerEngine's ``NVFP4BlockScaling`` (kernel ``common/cast/nvfp4/core_nvfp4.cuh``
  and ``pytorch/custom_recipes/reference_nvfp4.py``).  Every intermediate is one float32 rounding::

      S_enc = fmin(fl32(2688 / global_amax), FLT_MAX)   # 1.0 when global_amax == 0 or S_enc == 0
      s_blk = e4m3_satfinite(fmin(fl32(vec_max * fl32(S_enc * fl32(1/6))), FLT_MAX))
      enc   = fmin(fl32(1 / fl32(s_blk * fl32(1 / S_enc))), FLT_MAX)   # s_blk == 0: FLT_MAX
      code  = E2M1_RN(clamp(fl32(x * enc), -6, 6))

  Amaxes skip NaN (CUDA ``fmaxf``).  ``reference_zero_handling=True`` takes the Python
  reference's rule instead: only ``S_enc == 0`` gives 1.0, so an all-zero tensor gets
  ``S_enc = FLT_MAX``.  As in the reference, a scaled value that is exactly ±0 or NaN gets code
  0x0 (``cast_to_fp4x2``); values in [-0.25, -0) get -0 (0x8).  The stored global scale is the
  kernel's ``S_dec = fl32(1 / S_enc)``.
- ``"torchao"``: ``torchao.prototype.mx_formats.nvfp4_tensor.nvfp4_quantize`` with a per-tensor
  scale, as it runs on CPU::

      pts   = fl32(global_amax / 2688)                  # per_tensor_amax_to_scale; NaN-propagating amax
      s_blk = e4m3(clamp(fl32(fl32(vec_max / 6) / pts), 2^-6, 448))
      code  = E2M1_RN(clamp(fl32(x * fl32(fl32(1 / pts) / s_blk)), -6, 6))

  NaN elements get the codes torchao's bit-twiddling cast gives them.  The stored global scale
  is ``pts``.  On CUDA, torch turns a division by a Python scalar into a multiplication by its
  float32 reciprocal (ATen ``div_true_kernel_cuda``), so torchao on GPU computes
  ``fl32(vec_max * fl32(1/6))`` and ``fl32(amax * fl32(1/2688))``; that variant is not emulated.

``QuantizedData.dequantize()`` forms ``code * s_blk * global_scale`` exactly and rounds once.
Neither library dequantizes that way; :func:`dequantize_nvfp4` reproduces each one.

Not emulated here: TE's fast-math path (bf16 scaling coefficient).  4over6 is
:mod:`fp8sim.scaling.nvfp4_4over6`; the hardware SR instruction and TE's Philox words are
:mod:`fp8sim.cast.ptx_sr` and :mod:`fp8sim.cast.philox` (which kernel thread draws which word is not
emulated, spec section 10).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from .._util.args import as_array
from .._util.tensors import is_torch_tensor, numpy_view
from ..cast import decode, encode
from ..formats import E2M1, E4M3
from ._nvfp4_torchao import _block_amax, _quantize_torchao, _quantize_torchao_single, _torch_global_amax
from .amax import dtype_name
from .quantized import QuantizedData, expand_blocks

__all__ = [
    "NVFP4_BLOCK_SIZE",
    "RHT_SIGNS",
    "NVFP4QParams",
    "NVFP4Copies",
    "rht_matrix",
    "apply_rht",
    "quantize_nvfp4",
    "quantize_nvfp4_role",
    "dequantize_nvfp4",
    "nvfp4_role_settings",
]

NVFP4_BLOCK_SIZE = 16
RHT_SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)
"""TE's fixed random-sign vector for the 16x16 Hadamard transform (``get_wgrad_sign_vector``)."""

FLAVORS = ("te", "torchao")
ROLES = ("input", "weight", "grad")
_OUT_DTYPES = ("float32", "bfloat16", "float16")

_F32 = np.float32
_FLT_MAX = _F32(np.finfo(np.float32).max)
_ONE = _F32(1.0)
_FP4_MAX = _F32(6.0)
_E4M3_MAX = _F32(448.0)
_E4M3_TINY = _F32(2.0**-6)  # torch.finfo(float8_e4m3fn).tiny, torchao's lower clamp
_GLOBAL_NUM = _F32(2688.0)  # 448 * 6, exact
_INV6 = _ONE / _FP4_MAX  # the kernel's constexpr 1.0f / 6.0f
_INV2688 = _F32(1.0 / 2688.0)  # TE dequantize: constexpr float factor_inv = 1.0 / (6.0 * 448.0)


# -- role presets ---------------------------------------------------------------------------


@dataclass(frozen=True)
class NVFP4QParams:
    """Per-role quantization settings, with TE's ``QParams`` field names.

    RHT applies only to the columnwise (wgrad) copy; stochastic rounding and 2-D tiles apply to
    both copies.
    """

    random_hadamard_transform: bool = False
    stochastic_rounding: bool = False
    fp4_2d_quantization: bool = False

    def __post_init__(self) -> None:
        for name in ("random_hadamard_transform", "stochastic_rounding", "fp4_2d_quantization"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")


def nvfp4_role_settings(
    role: str,
    *,
    disable_rht: bool = False,
    disable_stochastic_rounding: bool = False,
    disable_2d_quantization: bool = False,
) -> NVFP4QParams:
    """TE ``NVFP4BlockScaling.__post_init__`` presets (spec 5.4): ``input`` = RHT,
    ``weight`` = 16x16 tiles, ``grad`` = RHT + stochastic rounding.  The ``disable_*`` flags are
    the recipe fields of the same names (env ``NVTE_NVFP4_DISABLE_*``)."""
    if not isinstance(role, str) or role not in ROLES:
        raise ValueError(f"unknown NVFP4 role {role!r}; known: {', '.join(ROLES)}")
    for name, v in (
        ("disable_rht", disable_rht),
        ("disable_stochastic_rounding", disable_stochastic_rounding),
        ("disable_2d_quantization", disable_2d_quantization),
    ):
        if not isinstance(v, bool):
            raise TypeError(f"{name} must be True or False, got {v!r}")
    if role == "input":
        return NVFP4QParams(random_hadamard_transform=not disable_rht)
    if role == "weight":
        return NVFP4QParams(fp4_2d_quantization=not disable_2d_quantization)
    return NVFP4QParams(random_hadamard_transform=not disable_rht, stochastic_rounding=not disable_stochastic_rounding)


# -- inputs ---------------------------------------------------------------------------------


def _check_input(x: Any, allowed: tuple[str, ...], why: str) -> str:
    """The dtype name of ``x`` (a numpy array or torch tensor) if it is one of ``allowed``."""
    if is_torch_tensor(x):
        name = dtype_name(x)
    elif isinstance(x, (np.ndarray, np.generic)):
        name = np.asarray(x).dtype.name
    else:
        raise TypeError(f"x must be a numpy array or a torch tensor ({', '.join(allowed)}); got {type(x).__name__}")
    if name not in allowed:
        raise TypeError(f"x must have dtype {', '.join(allowed)} ({why}); got {name}")
    return name


def _to_float32(x: Any) -> np.ndarray:
    """Exact float32 copy of a float32/bfloat16/float16 array or tensor."""
    if is_torch_tensor(x):
        return numpy_view(x.float())  # .numpy() would pin a parameter's storage (FSDP2 frees it)
    return np.asarray(x).astype(np.float32)


def _as_amax(global_amax: Any) -> np.ndarray:
    """A user-supplied amax as float32 (TE and torchao keep amaxes in float32)."""
    if is_torch_tensor(global_amax):
        a = global_amax.detach().to("cpu").double().numpy()
    elif isinstance(global_amax, bool) or not isinstance(global_amax, (int, float, np.number, np.ndarray, list, tuple)):
        raise TypeError(f"global_amax must be a number, array or tensor; got {type(global_amax).__name__}")
    else:
        a = as_array(global_amax, "global_amax")
        if a.dtype.kind not in "iuf":
            raise TypeError(f"global_amax must be real numbers; got dtype {a.dtype}")
        a = a.astype(np.float64)
    if a.size and (np.isnan(a).any() or (a < 0).any()):
        raise ValueError(f"global_amax must be >= 0 (Inf allowed, NaN not); got {global_amax!r}")
    return a.astype(np.float32)


# -- random Hadamard transform --------------------------------------------------------------


def rht_matrix(random_sign_mask: bool = True) -> np.ndarray:
    """TE's RHT matrix ``D·H/4`` as float32 (16x16): the Sylvester Hadamard matrix with row ``i``
    multiplied by ``RHT_SIGNS[i]``, scaled by ``1/sqrt(16)``.  Every entry is ±0.25.
    ``random_sign_mask=False``: ``H/4`` without the signs (the reference's ``with_random_sign_mask``)."""
    _check_bool(random_sign_mask=random_sign_mask)
    h = np.ones((1, 1), dtype=np.float32)
    while h.shape[0] < NVFP4_BLOCK_SIZE:
        h = np.block([[h, h], [h, -h]])
    signs = np.asarray(RHT_SIGNS if random_sign_mask else (1,) * NVFP4_BLOCK_SIZE, dtype=np.float32)
    return (signs[:, None] * h * _F32(0.25)).astype(np.float32)


def apply_rht(x: Any, random_sign_mask: bool = True) -> Any:
    """``x.reshape(-1, 16) @ rht_matrix(random_sign_mask)`` in the input dtype, as TE's reference
    ``_apply_rht``.

    Runs torch's CPU matmul in ``x``'s dtype (bf16 in, bf16 out; numpy inputs go through torch and
    come back as numpy).  For bf16/fp16 the 16 products (exact: entries are ±1/4) are accumulated
    in float32 in the CPU GEMM's order and rounded once to the input dtype.  That equals the exact
    sum rounded once whenever the float32 accumulation is exact (e.g. when a 16-vector's
    magnitudes span less than about 2^12); heavy-tailed vectors can differ by one ulp, and a GPU
    run may sum in another order (spec section 10, "RHT intermediate precision").  float32 input
    uses the float32 CPU GEMM.  The last dim must be a multiple of 16.
    """
    import torch

    name = _check_input(x, ("float32", "bfloat16", "float16"), "TE's high-precision dtypes")
    shape = tuple(x.shape)
    if len(shape) == 0 or shape[-1] % NVFP4_BLOCK_SIZE:
        n = shape[-1] if shape else 0
        raise ValueError(
            f"Inner dimension {n} must be divisible by hadamard dimension {NVFP4_BLOCK_SIZE} (x shape {shape})"
        )
    if is_torch_tensor(x):
        t = x.detach().to("cpu")
    elif name == "bfloat16":
        t = torch.from_numpy(np.ascontiguousarray(x).view(np.int16).copy()).view(torch.bfloat16)
    else:
        t = torch.from_numpy(np.ascontiguousarray(x).copy())
    m = torch.from_numpy(rht_matrix(random_sign_mask)).to(t.dtype)
    out = (t.contiguous().reshape(-1, NVFP4_BLOCK_SIZE) @ m).reshape(shape)
    if is_torch_tensor(x):
        return out.to(x.device)
    if name == "bfloat16":
        import ml_dtypes

        return out.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return out.numpy()


# -- quantization ---------------------------------------------------------------------------


def _check_bool(**kw: Any) -> None:
    for k, v in kw.items():
        if not isinstance(v, (bool, np.bool_)):
            raise TypeError(f"{k} must be True or False, got {v!r}")


def _check_shape(shape: tuple[int, ...], flavor: str, block_2d: bool) -> None:
    bs = NVFP4_BLOCK_SIZE
    if flavor == "torchao" and len(shape) < 2:
        raise ValueError(f"x must have at least 2 dims for flavor='torchao' (nvfp4_quantize); got shape {shape}")
    if not shape or shape[-1] % bs:
        said = (
            "torchao: 'K dim must be divisible by block_size'"
            if flavor == "torchao"
            else (f"TE: 'Incorrect shape {shape} for NVFP4. Tensor dims must be divisible by {bs}'")
        )
        raise ValueError(
            f"x: last dim {shape[-1] if shape else None} must be divisible by the NVFP4 block size {bs} "
            f"(shape {shape}); {said}"
        )
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    if flavor == "te" and rows % bs:
        raise ValueError(
            f"x: flattened first dim {rows} (product of dims {shape[:-1]}) must be divisible by the NVFP4 block "
            f"size {bs}; TE: 'Incorrect shape {shape} for NVFP4. Tensor dims must be divisible by {bs}'"
        )
    if block_2d and (len(shape) < 2 or shape[-2] % bs):
        raise ValueError(
            f"x: dim -2 ({shape[-2] if len(shape) > 1 else None}) must be divisible by {bs} for 16x16 tiles"
        )


def _te_encode_scale(amax: np.ndarray, reference_zero_handling: bool) -> np.ndarray:
    """``compute_global_encode_scaling_factor_FP4`` (or the reference's variant), elementwise."""
    with np.errstate(divide="ignore", over="ignore"):
        s = np.fmin(_GLOBAL_NUM / amax, _FLT_MAX)
    one = (s == 0) if reference_zero_handling else (amax == 0) | (s == 0)
    return np.where(one, _ONE, s).astype(np.float32)


def _e2m1(v: np.ndarray, stochastic: bool, seed: int | None) -> np.ndarray:
    if stochastic:
        return encode(v, E2M1, rounding="stochastic", seed=seed)
    return encode(v, E2M1, rounding="nearest_even", seed=seed)


def quantize_nvfp4(
    x: Any,
    *,
    flavor: str = "te",
    block_2d: bool = False,
    rht: bool = False,
    stochastic: bool = False,
    seed: int | None = None,
    row_scaled: bool = False,
    global_amax: Any = None,
    reference_zero_handling: bool = False,
    single_level: bool = False,
    swizzle: bool = False,
) -> QuantizedData:
    """Quantize ``x`` to NVFP4 along its last dim (one rowwise copy; see the module docstring).

    ``x``: numpy float32/bfloat16 (ml_dtypes) or torch float32/bfloat16 (float16 too for ``"te"``).
    The last dim must be a multiple of 16 and, for ``"te"``, so must the product of the other dims
    (TE refuses other shapes; it does not pad).  ``block_2d``: 16x16 tiles over the last two dims
    (dim -2 a multiple of 16).  ``rht``: apply :func:`apply_rht` first; the global amax is then
    taken after the transform.  ``stochastic``: the E2M1 cast uses fp8sim's seeded stochastic
    rounding (``rounding="stochastic"``, ``seed``; element ``i`` of the flattened tensor draws
    counter ``i``).  It has the distribution of TE's hardware SR but not its Philox-4x32 bits (spec
    section 10).  ``row_scaled``: one global amax per row (``prod(shape[:-1])`` rows, 1x16 blocks
    only); ``global_scale`` is then a float32 array of shape ``shape[:-1] + (1,)``.
    ``global_amax``: use this amax (e.g. all-reduced) instead of ``max|x|``.
    ``reference_zero_handling``: TE's Python reference rule for the global scale (``"te"`` only).
    ``single_level``: torchao's ``nvfp4_quantize(per_tensor_scale=None)`` (``"torchao"`` only): no
    global scale, ``s_blk = e4m3(clamp(fl32(vec_max / 6), 2^-6, 448))``, ``code = E2M1_RN(clamp(fl32(x *
    fl32(1 / s_blk)), -6, 6))``; the result's ``global_scale`` is None.  With a torch input the global
    amax is ``torch.max(torch.abs(x))`` run by torch (a NaN amax has torch's bits, spec 0 "6.2").
    ``swizzle``: also give the E4M3 scales in the 128x4 blocked layout (``blocked_scales``; 2-D ``x``).

    Returns a :class:`QuantizedData` with E2M1 codes, uint8 E4M3 block scales, ``block`` =
    ``(..., 1, 16)`` or ``(..., 16, 16)`` and ``global_scale`` = the float32 dequantization factor
    (``fl32(1/S_enc)`` for TE, ``per_tensor_scale`` for torchao).
    """
    if not isinstance(flavor, str) or flavor not in FLAVORS:
        raise ValueError(f"unknown NVFP4 flavor {flavor!r}; known: {', '.join(FLAVORS)}")
    _check_bool(
        block_2d=block_2d,
        rht=rht,
        stochastic=stochastic,
        row_scaled=row_scaled,
        reference_zero_handling=reference_zero_handling,
        single_level=single_level,
        swizzle=swizzle,
    )
    if swizzle:
        from .swizzle import with_blocked_scales

        kw = dict(flavor=flavor, block_2d=block_2d, rht=rht, stochastic=stochastic, seed=seed, row_scaled=row_scaled)
        kw.update(global_amax=global_amax, reference_zero_handling=reference_zero_handling, single_level=single_level)
        return with_blocked_scales(quantize_nvfp4(x, **kw))
    if single_level and (flavor != "torchao" or global_amax is not None):
        raise ValueError(
            "single_level=True is torchao's per_tensor_scale=None: use flavor='torchao' and no global_amax"
        )
    if flavor == "torchao":
        flags = {"block_2d": block_2d, "rht": rht, "stochastic": stochastic, "row_scaled": row_scaled}
        used = [k for k, v in {**flags, "reference_zero_handling": reference_zero_handling}.items() if v]
        if used:
            raise ValueError(f"flavor='torchao' (nvfp4_quantize) supports none of {', '.join(used)}; use flavor='te'")
        dtype = _check_input(x, ("float32", "bfloat16"), "torchao nvfp4_quantize supports bfloat16 and float32")
    else:
        dtype = _check_input(x, ("float32", "bfloat16", "float16"), "TE's high-precision dtypes")
    if block_2d and row_scaled:
        raise ValueError(
            "row_scaled supports only 1x16 blocks (TE: 'Row-scaled NVFP4 only supports NVFP4 1x16 tile shape')"
        )
    if seed is not None and not stochastic:
        raise ValueError("seed is used only with stochastic=True")
    shape = tuple(int(n) for n in x.shape)
    _check_shape(shape, flavor, block_2d)
    if rht:
        x = apply_rht(x)
    x32 = _to_float32(x)
    block = (1,) * (len(shape) - 2 + (not block_2d)) + ((NVFP4_BLOCK_SIZE,) * (1 + block_2d))
    mag = np.abs(x32)
    if flavor == "te":
        if global_amax is None:
            amax = (
                np.fmax.reduce(mag, axis=-1, initial=_F32(0), keepdims=True)
                if row_scaled
                else np.fmax.reduce(mag.reshape(-1), initial=_F32(0))
            )
        else:
            amax = _amax_arg(global_amax, shape, row_scaled)
        codes, scales, gscale = _quantize_te(x32, mag, amax, block, block_2d, stochastic, seed, reference_zero_handling)
    else:
        if single_level:
            codes, scales = _quantize_torchao_single(x32, mag, block)
            return QuantizedData(codes, scales, E2M1, block, shape, dtype, scale_format=E4M3)
        amax = _torch_global_amax(x) if global_amax is None else _amax_arg(global_amax, shape, False)
        codes, scales, gscale = _quantize_torchao(x32, mag, np.float32(amax), block)
    glob = gscale.astype(np.float32) if row_scaled else float(gscale)
    amax_kept = np.asarray(amax, np.float32) if row_scaled else float(np.float32(amax))
    return QuantizedData(
        codes, scales, E2M1, block, shape, dtype, scale_format=E4M3, global_scale=glob, global_amax=amax_kept
    )


def _amax_arg(global_amax: Any, shape: tuple[int, ...], row_scaled: bool) -> np.ndarray:
    a = _as_amax(global_amax)
    if not row_scaled:
        if a.size != 1:
            raise ValueError(f"global_amax must be a single value (row_scaled=False); got shape {a.shape}")
        return a.reshape(())
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    if a.size != rows:
        raise ValueError(f"row_scaled global_amax must have one value per row ({rows}); got {a.size}")
    return a.reshape(*shape[:-1], 1)


def _quantize_te(
    x32: np.ndarray,
    mag: np.ndarray,
    amax: np.ndarray,
    block: tuple[int, ...],
    block_2d: bool,
    stochastic: bool,
    seed: int | None,
    reference_zero_handling: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    s_enc = _te_encode_scale(np.asarray(amax, np.float32), reference_zero_handling)
    vec_max = _block_amax(mag, block_2d, skip_nan=True)
    with np.errstate(over="ignore"):
        s_dec_b = np.fmin(vec_max * (s_enc * _INV6), _FLT_MAX)
    scales = encode(s_dec_b, E4M3, saturate=True)
    s_dec = _ONE / s_enc
    with np.errstate(divide="ignore", over="ignore"):
        enc = np.fmin(_ONE / (decode(scales, E4M3) * s_dec), _FLT_MAX)
    with np.errstate(over="ignore", invalid="ignore"):
        v = np.clip(x32 * expand_blocks(enc, block), -_FP4_MAX, _FP4_MAX)
    codes = _e2m1(v, stochastic, seed)
    codes[(v == 0) | np.isnan(v)] = 0  # the reference's cast_to_fp4x2: ±0 and NaN -> +0
    return codes, scales, s_dec


# -- rowwise + columnwise copies ------------------------------------------------------------


class NVFP4Copies(NamedTuple):
    """The two copies TE keeps: ``rowwise`` (blocks along the last dim of ``x``) and
    ``columnwise`` (the 2-D flattened ``x`` transposed, shape ``(K, M)``, blocks along ``M``)."""

    rowwise: QuantizedData
    columnwise: QuantizedData


def quantize_nvfp4_role(
    x: Any,
    role: str | NVFP4QParams,
    *,
    seed: int | None = None,
    reference_zero_handling: bool = False,
) -> NVFP4Copies:
    """Both TE copies of ``x`` for a role (``"input"``, ``"weight"``, ``"grad"`` or an
    :class:`NVFP4QParams`), each quantized from the high-precision input (never from the other
    copy).  RHT, when on, applies to the columnwise copy only, whose global amax is then taken
    after the transform.  With stochastic rounding the rowwise copy uses ``seed`` and the
    columnwise copy ``seed + 1`` (mod 2^64)."""
    q = nvfp4_role_settings(role) if isinstance(role, str) else role
    if not isinstance(q, NVFP4QParams):
        raise TypeError(f"role must be one of {', '.join(ROLES)} or an NVFP4QParams; got {type(role).__name__}")
    if not q.stochastic_rounding and seed is not None:
        raise ValueError("seed is used only when the role has stochastic rounding")
    common = dict(flavor="te", block_2d=q.fp4_2d_quantization, stochastic=q.stochastic_rounding)
    rowwise = quantize_nvfp4(x, **common, seed=seed, reference_zero_handling=reference_zero_handling)
    seed_t = None if seed is None else (int(seed) + 1) % 2**64
    x2 = x.reshape(-1, x.shape[-1])
    xt = x2.t().contiguous() if is_torch_tensor(x2) else np.ascontiguousarray(x2.T)
    columnwise = quantize_nvfp4(
        xt, **common, rht=q.random_hadamard_transform, seed=seed_t, reference_zero_handling=reference_zero_handling
    )
    return NVFP4Copies(rowwise, columnwise)


# -- dequantization -------------------------------------------------------------------------


def dequantize_nvfp4(
    qt: QuantizedData, flavor: str = "te", *, global_amax: Any = None, out_dtype: str = "float32"
) -> np.ndarray:
    """Dequantize as the library does (``QuantizedData.dequantize()`` rounds once instead).

    - ``"te"`` (``common/cast/nvfp4/dequantize_nvfp4.cuh``): ``final = fl32(fl32(s_blk * amax) *
      fl32(1/2688))``, ``out = cast(fl32(code * final))``.  TE keeps the amax, not ``1/S_enc``:
      ``quantize_nvfp4`` records it as ``qt.global_amax`` (pass ``global_amax`` to override; one per
      row for row-scaled tensors, where the per-tensor formula is applied per row: TE's per-token
      dequantize path was not checked).
    - ``"torchao"`` (``NVFP4Tensor.dequantize``): ``out = cast(fl32(code * fl32(pts * s_blk)))``
      with ``pts = qt.global_scale``.

    ``out_dtype``: ``"float32"``, ``"bfloat16"`` or ``"float16"`` (one RN cast from float32).
    Returns a numpy array of the original shape.
    """
    if not isinstance(qt, QuantizedData) or qt.fmt != E2M1 or qt.scale_format != E4M3 or qt.global_scale is None:
        raise TypeError("qt must be an NVFP4 QuantizedData (E2M1 codes, E4M3 scales, a global scale)")
    if not isinstance(flavor, str) or flavor not in FLAVORS:
        raise ValueError(f"unknown NVFP4 flavor {flavor!r}; known: {', '.join(FLAVORS)}")
    if not isinstance(out_dtype, str) or out_dtype not in _OUT_DTYPES:
        raise ValueError(f"unknown out_dtype {out_dtype!r}; known: {', '.join(_OUT_DTYPES)}")
    vals = decode(qt.codes, E2M1)
    s_blk = decode(qt.scales, E4M3)
    with np.errstate(over="ignore", invalid="ignore"):
        if flavor == "te":
            if global_amax is None:
                global_amax = qt.global_amax  # recorded by quantize_nvfp4
            if global_amax is None:
                raise ValueError(
                    "flavor='te' dequantizes from the tensor amax (TE: e4m3 * amax * fl32(1/2688)); pass global_amax="
                )
            amax = _as_amax(global_amax)
            if amax.size != 1:
                rows = int(np.prod(qt.shape[:-1], dtype=np.int64))
                if amax.size != rows:
                    raise ValueError(f"global_amax must be one value, or one per row ({rows}); got {amax.size}")
                amax = amax.reshape(*qt.shape[:-1], 1)
                s_blk = expand_blocks(s_blk, qt.block)
            else:
                amax = amax.reshape(())
            final = (s_blk * amax) * _INV2688
        else:
            final = np.float32(qt.global_scale) * s_blk
        out = vals * (final if final.shape == vals.shape else expand_blocks(final, qt.block))
    if out_dtype == "bfloat16":
        import ml_dtypes

        out = out.astype(ml_dtypes.bfloat16)
    elif out_dtype == "float16":
        with np.errstate(over="ignore"):
            out = out.astype(np.float16)
    return out[tuple(slice(0, n) for n in qt.shape)]
