"""Recompute an FP8 operation with fp8sim and check a result against it: ``emulate`` and
``assert_matches_emulator``.  The scaling and GEMM layers are imported when an op needs them."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..cast import decode, encode
from ..cast.conventions import get_convention
from ..formats import FloatFormat, get_format
from ..recipe import (
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
    Recipe,
    tensor_format,
)
from . import _bits
from .assertions import assert_bit_exact, assert_within_ulp

__all__ = ["emulate", "assert_matches_emulator", "CAST_OPS"]

CAST_OPS = ("encode", "quantize", "cast")
_ROLES = ("input", "weight", "grad")
_RECIPES = (DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling, Float8BlockScaling, NVFP4BlockScaling)


def _take(options: dict[str, Any], allowed: dict[str, Any], what: str) -> dict[str, Any]:
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise TypeError(f"unknown option(s) {', '.join(unknown)} for {what}; accepted: {', '.join(allowed) or 'none'}")
    return {**allowed, **options}


def _one_input(inputs: tuple[Any, ...], what: str) -> Any:
    if len(inputs) != 1:
        raise TypeError(f"{what} takes one input tensor, got {len(inputs)}")
    return inputs[0]


def _cast(op: str, inputs: tuple[Any, ...], options: dict[str, Any]) -> tuple[Any, FloatFormat]:
    given = set(options)
    o = _take(options, {"fmt": None, "rounding": None, "saturate": None, "seed": None, "convention": None}, repr(op))
    x = _one_input(inputs, repr(op))
    if o["fmt"] is None:
        raise TypeError(f"{op!r} needs fmt= (e.g. fmt='e4m3')")
    f = get_format(o["fmt"])
    if o["convention"] is not None:
        clash = sorted(given & {"rounding", "saturate"})
        if clash:
            raise ValueError(f"convention= fixes rounding and saturate; drop {', '.join(clash)}")
        codes = get_convention(o["convention"]).encode(x, f, seed=o["seed"])
    else:
        rounding = o["rounding"] or "nearest_even"
        if rounding == "stochastic" and o["seed"] is None:
            raise ValueError("rounding='stochastic' needs seed= to be reproducible")
        saturate = True if o["saturate"] is None else o["saturate"]
        codes = encode(x, f, rounding=rounding, saturate=saturate, seed=o["seed"])
    return (decode(codes, f) if op == "quantize" else codes), f


def _role(o: dict[str, Any]) -> str:
    if o["role"] not in _ROLES:
        raise ValueError(f"unknown role {o['role']!r}; known: {', '.join(_ROLES)}")
    return o["role"]


def _quantize_recipe(recipe: Recipe, inputs: tuple[Any, ...], options: dict[str, Any]) -> Any:
    name = type(recipe).__name__
    x = _one_input(inputs, name)
    if isinstance(recipe, DelayedScaling):
        from ..scaling.delayed import DelayedScaler

        o = _take(options, {"role": "input", "scale": 1.0}, name)
        scaler = DelayedScaler(recipe, 1, forward=_role(o) != "grad")
        scale = _bits.to_numpy(o["scale"], "scale").astype(np.float32).reshape(1)
        scaler.load_state_dict({"scale": scale, "amax_history": scaler.amax_history})
        return scaler.quantize(0, x)
    if isinstance(recipe, Float8CurrentScaling):
        from ..scaling.current import quantize_current_scaling

        o = _take(options, {"role": "input"}, name)
        fmt = tensor_format(recipe.fp8_format, _role(o) != "grad")
        return quantize_current_scaling(x, fmt, pow2=recipe.use_power_2_scales, eps=0.0)
    if isinstance(recipe, MXFP8BlockScaling):
        from ..scaling.mx import quantize_mx

        o = _take(options, {"role": "input", "axis": -1, "mxfma": False}, name)
        fmt = tensor_format(recipe.fp8_format, _role(o) != "grad")
        return quantize_mx(x, fmt, axis=o["axis"], scale_rule="rceil", flavor="te", mxfma=o["mxfma"])
    if isinstance(recipe, Float8BlockScaling):
        from ..scaling.block import quantize_block_scaling

        o = _take(options, {"role": "input", "columnwise": False}, name)
        role = _role(o)
        fmt = tensor_format(recipe.fp8_format, role != "grad")
        dim = {"input": recipe.x_block_scaling_dim, "weight": recipe.w_block_scaling_dim}.get(
            role, recipe.grad_block_scaling_dim
        )
        qp = {"input": recipe.fp8_quant_fwd_inp, "weight": recipe.fp8_quant_fwd_weight}.get(
            role, recipe.fp8_quant_bwd_grad
        )
        return quantize_block_scaling(x, fmt, block_dim=dim, columnwise=o["columnwise"], pow2=qp.power_2_scale)
    if isinstance(recipe, NVFP4BlockScaling):
        return _nvfp4(recipe, x, _take(options, {"role": "input", "copy": "rowwise", "seed": None}, name))
    raise TypeError(f"no emulation for recipe {name}; supported: {', '.join(r.__name__ for r in _RECIPES)}")


def _nvfp4(recipe: NVFP4BlockScaling, x: Any, o: dict[str, Any]) -> Any:
    from ..scaling.nvfp4 import nvfp4_role_settings, quantize_nvfp4, quantize_nvfp4_role

    role = _role(o)
    if o["copy"] not in ("rowwise", "columnwise"):
        raise ValueError(f"copy must be 'rowwise' or 'columnwise', got {o['copy']!r}")
    if recipe.nvfp4_4over6 != "none":
        raise ValueError(f"NVFP4 4over6 (nvfp4_4over6={recipe.nvfp4_4over6!r}) is not emulated by fp8sim")
    if recipe.row_scaled_activation and role == "input":
        if o["copy"] != "rowwise":
            raise ValueError("row_scaled_activation: only the rowwise input copy is emulated")
        return quantize_nvfp4(x, flavor="te", row_scaled=True)
    settings = nvfp4_role_settings(
        role,
        disable_rht=recipe.disable_rht,
        disable_stochastic_rounding=recipe.disable_stochastic_rounding,
        disable_2d_quantization=recipe.disable_2d_quantization,
    )
    if settings.stochastic_rounding and o["seed"] is None:
        raise ValueError(
            "this role uses stochastic rounding: pass seed= (fp8sim's seeded SR; its bits are not TE's "
            "Philox bits, so a TE kernel can match it in distribution only), or disable_stochastic_rounding=True"
        )
    seed = o["seed"] if settings.stochastic_rounding else None
    return getattr(quantize_nvfp4_role(x, settings, seed=seed), o["copy"])


def _mm_out_format(inputs: tuple[Any, ...], options: dict[str, Any]) -> FloatFormat | None:
    """The FP8 format of a ``scaled_mm`` output (compared as codes), or None for a float output."""
    out = options.get("out_dtype", inputs[6] if len(inputs) > 6 else None)
    if out is None:
        out = options.get("a_format") or getattr(inputs[0], "dtype", None)
    name = str(out).replace("torch.", "")
    return None if name in ("float32", "bfloat16", "float16") else get_format(name)


def emulate(op: Any, *inputs: Any, **options: Any) -> Any:
    """fp8sim's result of ``op`` on ``inputs`` (the reference :func:`assert_matches_emulator` uses).

    - ``"encode"`` / ``"cast"``: uint8 codes; ``"quantize"``: float32 values (numpy, or torch for a
      torch input).
    - a recipe object: the :class:`~fp8sim.scaling.QuantizedData` of its quantizer.
    - ``"scaled_mm"``: ``fp8sim.gemm.scaled_mm(*inputs, **options)``.
    """
    return _emulate(op, inputs, dict(options))[0]


def _emulate(op: Any, inputs: tuple[Any, ...], options: dict[str, Any]) -> tuple[Any, FloatFormat | None]:
    if isinstance(op, str) and op in CAST_OPS:
        return _cast(op, inputs, options)
    if isinstance(op, str) and op == "scaled_mm":
        from ..gemm import scaled_mm

        out = scaled_mm(*inputs, **options)
        return out, _mm_out_format(inputs, options)
    if isinstance(op, Recipe):
        return _quantize_recipe(op, inputs, options), None
    if isinstance(op, type) and issubclass(op, Recipe):
        raise TypeError(f"op is the class {op.__name__}: pass an instance, e.g. {op.__name__}()")
    raise ValueError(
        f"unknown op {op!r}; known: {', '.join(map(repr, CAST_OPS))}, 'scaled_mm', or a recipe object "
        f"({', '.join(r.__name__ + '()' for r in _RECIPES)})"
    )


def _check(actual: Any, expected: Any, fmt: Any, ulp_budget: int, max_report: int, what: str) -> None:
    try:
        if ulp_budget:
            assert_within_ulp(actual, expected, fmt, ulp_budget=ulp_budget, max_report=max_report)
        else:
            assert_bit_exact(actual, expected, fmt, max_report=max_report)
    except AssertionError as err:
        raise AssertionError(f"{what}: {err}") from None


def _exact_float32(a: np.ndarray) -> np.ndarray:
    """float64 (e.g. a Python float) that float32 holds exactly, as float32; anything else as is."""
    if a.dtype != np.float64:
        return a
    with np.errstate(over="ignore", invalid="ignore"):
        a32 = a.astype(np.float32)
    same = (a32.astype(np.float64) == a) | (np.isnan(a) & np.isnan(a32))
    return a32 if same.all() else a


def _check_quantized(actual: Any, qt: Any, ulp_budget: int, max_report: int, what: str) -> None:
    from ..scaling.quantized import QuantizedData

    glob = None
    if isinstance(actual, QuantizedData):
        data = actual.codes[tuple(slice(0, n) for n in actual.shape)]
        scales, glob = actual.scales, actual.global_scale
    elif isinstance(actual, tuple) and len(actual) in (2, 3):
        data, scales, *rest = actual
        glob = rest[0] if rest else None
    else:
        data, scales = actual, None
    if scales is not None:
        s = _bits.to_numpy(scales, "scales")
        if s.size == qt.scales.size:
            s = s.reshape(qt.scales.shape)
        s = _exact_float32(s) if qt.scale_format is None else s
        _check(s, qt.scales, qt.scale_format, ulp_budget, max_report, f"{what} scales")
    if glob is not None:
        if qt.global_scale is None:
            raise AssertionError(f"{what}: a global scale was given, but this quantizer has none")
        g = _exact_float32(_bits.to_numpy(glob, "global scale"))
        want = np.asarray(qt.global_scale, np.float32)
        g = g.reshape(want.shape) if g.size == want.size else g
        _check(g, want, None, ulp_budget, max_report, f"{what} global scale")
    expected = qt.codes[tuple(slice(0, n) for n in qt.shape)]
    _check(data, expected, qt.fmt, ulp_budget, max_report, f"{what} data")


def assert_matches_emulator(
    actual: Any, op: Any, *inputs: Any, ulp_budget: int = 0, max_report: int = 10, **options: Any
) -> None:
    """Recompute ``op(*inputs, **options)`` with fp8sim and assert ``actual`` matches it bit for bit,
    or within ``ulp_budget`` ULPs per element (a NaN against a number always fails; the message
    leads with the worst element).  Failures raise AssertionError as :func:`assert_bit_exact`.

    ``op`` and its contract:

    - ``"encode"``, ``"quantize"``, ``"cast"`` (synonyms here): one input ``x`` (float array or
      tensor); options ``fmt`` (required), ``rounding`` (default ``"nearest_even"``), ``saturate``
      (default True), ``seed`` (required for ``"stochastic"``), or ``convention=`` a name from
      ``fp8sim.CONVENTIONS`` (then no ``rounding``/``saturate``).  ``actual``: codes (uint8) or
      values (any float dtype, e.g. a torch float8 tensor), compared as codes of ``fmt``.
    - a recipe object from ``fp8sim.recipe``: one input ``x``, option ``role`` = ``"input"``
      (default), ``"weight"`` or ``"grad"``, which picks the element format
      (``recipe.tensor_format``) and the role's settings.  ``DelayedScaling``: a cast with the given
      ``scale=`` (float32 multiplier, default 1.0, TE's first step): ``satfinite(RN(fl32(x)*scale))``.
      ``Float8CurrentScaling``: per-tensor current scaling.  ``MXFP8BlockScaling``: TE MXFP8 (RCEIL
      E8M0 scales, blocks of 32 along ``axis=-1``; ``mxfma=``).  ``Float8BlockScaling``: 1x128 blocks
      (128x128 where the role's ``*_block_scaling_dim`` is 2; ``columnwise=True``: 128x1).
      ``NVFP4BlockScaling``: TE NVFP4, the ``copy="rowwise"`` (default) or ``"columnwise"`` copy;
      ``seed=`` where the role rounds stochastically (fp8sim's SR, not TE's Philox bits).
      ``actual``: a ``QuantizedData``; or ``(data, scales)`` / ``(data, scales, global_scale)``;
      or the data alone (scales unchecked).  ``data``: element codes or values in the original shape;
      ``scales``: the dequantization scales (TE's ``scale_inv``), float32 or codes of the scale
      format (E8M0 for MX, E4M3 for NVFP4), one per block, any shape with the right size.  Scales
      are checked first.
    - ``"scaled_mm"``: inputs and options as ``fp8sim.gemm.scaled_mm`` (``accumulator=``,
      ``out_dtype=``, ``a_format=``...); ``actual`` as ``torch._scaled_mm`` returns it (or codes
      for an FP8 output).
    """
    expected, fmt = _emulate(op, inputs, dict(options))
    from ..scaling.quantized import QuantizedData

    if isinstance(expected, QuantizedData):
        desc = f"{type(op).__name__} (role {options.get('role', 'input')}, {expected.fmt.name})"
        _check_quantized(actual, expected, ulp_budget, max_report, desc)
        return
    what = f"{op} ({fmt.name})" if fmt is not None and isinstance(op, str) else str(op)
    _check(actual, expected, fmt, ulp_budget, max_report, what)
