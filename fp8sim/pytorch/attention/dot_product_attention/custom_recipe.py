"""FP8 ``DotProductAttention`` under a ``CustomRecipe`` (TE 2.20.0.dev0 at d0067d0).

TE builds DPA's 9 forward and 6 backward slots with ``qfactory`` (``dot_product_attention.py``
``get_quantizer_roles``): forward 0-2 ``dpa|qkv``, 3-5 the O boundary (``output_quantizer_role``, else a
hint-only role named ``<name>.dpa_output``), 6-8 ``dpa|s``; backward 0-1 the dQKV boundary
(``grad_input_quantizer_role``, else ``<name>.dpa_grad_input``), 2-3 ``dpa|do``, 4-5 ``dpa|dp``.
``utils.py`` ``get_attention_quantizers`` reads slots ``META_QKV``, ``META_O``, ``META_S``, ``META_DQKV``,
``META_DO``, ``META_DP`` and requires each to be a ``Float8Quantizer``, ``Float8CurrentScalingQuantizer`` or
``MXFP8Quantizer`` (S and dP are nulled under MXFP8); ``backends.py`` ``_qkv_quantizer_type`` picks the
kernel's flow from the QKV quantizer's class alone: "delayed", "current" (O and dQKV in high precision,
``NVTE_DPA_FP8CS_O_in_F16=1``) or "mxfp8".

fp8sim maps each slot quantizer onto the attention core's :class:`~.backends.Quantizer`, with the slot
quantizer's own FP8 dtype: a ``Float8Quantizer`` from a ``DelayedScalingRequest`` reads and writes its
slot of the shared delayed-scaling state (updated with the module's scales), a
``Float8CurrentScalingQuantizer`` scales from the amax of what it casts, an ``MXFP8Quantizer`` blocks by 32.
fp8sim refuses (NotImplementedError) what it does not model: a ``Float8Quantizer`` of the user's own
buffers, current-scaling options (``force_pow_2_scales``, ``amax_epsilon``, amax reduction), 2D MXFP8, and
an S or dP slot quantizer that is not of the delayed kind outside MXFP8 (the fused kernel needs S's
scale before it computes S).
"""

from __future__ import annotations

from typing import Any

from ....recipe import CustomRecipe
from .backends import Quantizer

__all__ = ["dpa_quantizer_roles", "ensure_custom_dpa", "custom_scalers", "custom_attention_quantizers"]

# TE utils.py: FP8FwdTensorIdx GEMM1_OUTPUT, GEMM2_INPUT, GEMM3_OUTPUT; FP8BwdTensorIdx GRAD_OUTPUT1, GRAD_INPUT2,
# GRAD_INPUT3
_FWD = {"qkv": 2, "o": 3, "s": 8}
_BWD = {"dqkv": 0, "do": 3, "dp": 5}
_TE_NAMES = {"qkv": "QKV", "o": "O", "s": "S", "dqkv": "dQKV", "do": "dO", "dp": "dP"}


def dpa_quantizer_roles(module: Any, fwd: bool) -> list:
    """TE's ``DotProductAttention.get_quantizer_roles(fwd=..., num_quantizers=9 / 6)``."""
    from ...tensor import QuantizerRole

    name = getattr(module, "name", None) or ""

    def hint(what: str) -> Any:
        return QuantizerRole(name=f"{name}.{what}" if name else what)

    def dpa(t: str) -> Any:
        return QuantizerRole(module_type="dpa", tensor_type=t, name=name)

    if fwd:
        o = getattr(module, "_output_quantizer_role", None)
        return [dpa("qkv")] * 3 + [hint("dpa_output") if o is None else o] * 3 + [dpa("s")] * 3
    dqkv = getattr(module, "_grad_input_quantizer_role", None)
    return [hint("dpa_grad_input") if dqkv is None else dqkv] * 2 + [dpa("do")] * 2 + [dpa("dp")] * 2


def ensure_custom_dpa(module: Any, recipe: CustomRecipe) -> dict[str, list]:
    """The module's slot quantizers for ``recipe`` (``scaling_fwd``: 9, ``scaling_bwd``: 6): those of its
    ``CustomRecipeState`` while that state was built for an equal recipe, else built now (``fp8_meta.py``); a
    delayed-scaling state is inherited by the rebuilt state, as TE's."""
    from ..._recipe_state import CustomRecipeState

    state = module._recipe_states().get("scaling_fwd")
    if not (isinstance(state, CustomRecipeState) and state.recipe == recipe):
        module.init_fp8_meta_tensors(recipe)
    return dict(module.__dict__["_dpa_quantizers"])


def custom_scalers(module: Any) -> tuple[Any, Any]:
    """The delayed-scaling states (forward, backward) of the module's ``DelayedScalingRequest`` slots (None
    where none asked for one)."""
    states = module._recipe_states()
    return tuple(s._ds_state.scaler if s._ds_state else None for s in (states["scaling_fwd"], states["scaling_bwd"]))


def custom_attention_quantizers(
    module: Any, recipe: CustomRecipe, mxfp8_softmax: bool
) -> tuple[str, dict[str, Quantizer | None], Quantizer | None]:
    """``(kind, quantizers, o_cast)``: the flow TE picks from the QKV slot ("delayed", "current", "mxfp8"),
    the attention core's quantizers, and the O quantizer that casts the F16 O for ``fp8_output`` under
    current scaling."""
    from ...tensor import Float8CurrentScalingQuantizer, Float8Quantizer, MXFP8Quantizer

    qs = ensure_custom_dpa(module, recipe)
    states = module._recipe_states()
    scalers, ds_slots = custom_scalers(module), (states["scaling_fwd"]._ds_slots, states["scaling_bwd"]._ds_slots)
    slots = {n: (qs["scaling_fwd"][i], scalers[0], ds_slots[0], i) for n, i in _FWD.items()}
    slots.update({n: (qs["scaling_bwd"][i], scalers[1], ds_slots[1], i) for n, i in _BWD.items()})
    qkv = slots["qkv"][0]
    kinds = ((Float8Quantizer, "delayed"), (Float8CurrentScalingQuantizer, "current"), (MXFP8Quantizer, "mxfp8"))
    kind = next((k for cls, k in kinds if isinstance(qkv, cls)), None)
    nulled = {"s", "dp"} if kind == "mxfp8" else set()
    for n, (q, *_) in slots.items():
        if n not in nulled and not isinstance(q, (Float8Quantizer, Float8CurrentScalingQuantizer, MXFP8Quantizer)):
            raise TypeError(  # TE utils.py get_attention_quantizers
                "FP8 attention requires FP8-compatible quantizers for all DPA tensor slots, "
                f"but {_TE_NAMES[n]} quantizer is {type(q).__name__}. "
                "When using CustomRecipe with fp8_dpa=True, ensure the factory returns an "
                "FP8 quantizer (Float8Quantizer, Float8CurrentScalingQuantizer, or "
                "MXFP8Quantizer) for all DPA roles (module_type='dpa') and for None roles "
                "(boundary slots like O output and dQKV grad-input)."
            )
    out = {n: (None if n in nulled else _core_quantizer(n, *slot)) for n, slot in slots.items()}
    for n in ("s", "dp"):
        if kind != "mxfp8" and out[n].kind != "delayed":
            raise NotImplementedError(
                f"fp8sim's FP8 attention takes a delayed-scaling {_TE_NAMES[n]} slot (a DelayedScalingRequest) "
                f"outside MXFP8; the CustomRecipe factory gave {type(slots[n][0]).__name__}"
            )
    o_cast = None
    if kind == "current":  # NVTE_DPA_FP8CS_O_in_F16=1 (TE's default): O and dQKV stay in high precision
        o_cast, out["o"], out["dqkv"] = out["o"], None, None
    elif kind == "mxfp8":  # TE: O and dQKV in high precision; fp8sim's mxfp8_softmax blocks S and dS as the rest
        out["o"] = out["dqkv"] = None
        if mxfp8_softmax:
            out["s"], out["dp"] = Quantizer("mxfp8", out["qkv"].fmt), Quantizer("mxfp8", out["do"].fmt)
    return kind, out, o_cast


def _core_quantizer(name: str, q: Any, scaler: Any, ds_slots: list[int], slot: int) -> Quantizer:
    from ...tensor import Float8CurrentScalingQuantizer, Float8Quantizer, MXFP8Quantizer
    from ...tensor.float8_tensor import _FORMATS

    fmt = _FORMATS.get(q.dtype)
    if fmt is None:
        raise ValueError(f"{_TE_NAMES[name]} quantizer: fp8_dtype must be E4M3 or E5M2, got {q.dtype!r}")
    if isinstance(q, MXFP8Quantizer):
        if q.with_2d_quantization:
            raise NotImplementedError(f"fp8sim's FP8 attention does not emulate a 2D MXFP8 {_TE_NAMES[name]} slot")
        return Quantizer("mxfp8", fmt)
    if isinstance(q, Float8CurrentScalingQuantizer):
        if q.force_pow_2_scales or q.amax_epsilon or q.with_amax_reduction:
            raise NotImplementedError(
                f"fp8sim's FP8 attention emulates a {_TE_NAMES[name]} Float8CurrentScalingQuantizer without "
                "force_pow_2_scales, amax_epsilon or with_amax_reduction"
            )
        return Quantizer("current", fmt)
    if isinstance(q, Float8Quantizer) and slot in ds_slots:
        return Quantizer("delayed", fmt, scaler, ds_slots.index(slot))
    raise NotImplementedError(
        f"fp8sim's FP8 attention takes a {_TE_NAMES[name]} Float8Quantizer only from a DelayedScalingRequest "
        "(its delayed-scaling state is the module's); return DelayedScalingRequest(...) from the factory"
    )
