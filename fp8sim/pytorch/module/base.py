"""``TransformerEngineBaseModule``: FP8 state, registration with autocast and ``_extra_state`` I/O.

Each GEMM of a module owns TE's delayed-scaling state (forward slots INPUT=0, WEIGHT=1, OUTPUT=2,
backward slots GRAD_OUTPUT=0, GRAD_INPUT=1), its weight cache and its statistics.  Modules
register their parameters with an ``init_fn`` (TE's ``register_parameter``) so that
``reset_parameters()`` re-initialises them as TE does.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from ...recipe import CustomRecipe, DelayedScaling, Recipe
from ...scaling.delayed import load_state_dicts
from .._recompute import _replay_fp8_state
from ..quantization import (
    _register,
    current_state,
    get_recipe,
    reduce_and_update_fp8_tensors,
)
from ..utils import get_default_init_method, init_method_constant
from ._bias import bias_through_bf16
from ._fp8_params import is_fp8_weight, quantize_primary_weights, reset_sharded_parameters
from ._gemm import GemmSite
from ._gemm_state import _GemmState
from ._linear_function import LinearOptions, fp8_linear, hp_linear
from ._meta_states import RecipeStateLifecycle
from ._params import materialize_meta_parameter
from ._rng_init import run_init, set_init_tracker

__all__ = [
    "TransformerEngineBaseModule",
    "assert_dim_for_fp8_exec",
    "get_default_init_method",
    "init_method_constant",
    "get_dummy_wgrad",
]
_dummy_wgrads: dict[tuple, torch.Tensor] = {}


def get_dummy_wgrad(shape: list, dtype: torch.dtype, zero: bool = False) -> torch.Tensor:
    """TE ``module.base.get_dummy_wgrad``: one cached uninitialised buffer per (shape, dtype), on the CPU
    (TE's is on the GPU); ``zero=True`` zeroes it first.  Returned detached: every call shares the storage."""
    key = (*shape, dtype)
    if key not in _dummy_wgrads:
        _dummy_wgrads[key] = torch.empty(shape, dtype=dtype, requires_grad=False)
    if zero:
        _dummy_wgrads[key].fill_(0)
    return _dummy_wgrads[key].detach()


def assert_dim_for_fp8_exec(*tensors: torch.Tensor) -> None:
    """TE ``utils.assert_dim_for_fp8_exec``: FP8 TN GEMMs need every tensor's leading dimensions to
    multiply to a multiple of 8 and its last dimension to be a multiple of 16 (the weight too)."""
    for t in tensors:
        lead = math.prod(t.shape[:-1])
        if lead % 8 != 0 or t.shape[-1] % 16 != 0:
            raise ValueError(
                "FP8 execution requires the product of all dimensions except the last to be"
                " divisible by 8 and the last dimension to be divisible by 16, but got tensor"
                f" with dims={list(t.size())} (product of leading dims = {lead}, last dim = {t.shape[-1]})"
            )


def no_torch_dynamo(fn: Callable) -> Callable:
    """TE ``jit.no_torch_dynamo``: the module's forward runs eagerly under ``torch.compile`` (a graph
    break around it), as TE decorates its module forwards.  ``torch._dynamo`` is looked up only
    while compiling, so importing fp8sim does not import it."""
    import functools
    import sys

    cache: dict[str, Callable] = {}

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            disabled = cache.get("fn")
            if disabled is None:
                disabled = cache["fn"] = sys.modules["torch._dynamo"].disable(fn, recursive=True)
            return disabled(*args, **kwargs)
        return fn(*args, **kwargs)

    return wrapper


def _requires_grad(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


class TransformerEngineBaseModule(RecipeStateLifecycle, nn.Module):
    """Shared FP8 plumbing: named GEMM states, registration with autocast, ``_extra_state``, parameter
    registration with TE's ``init_fn`` and ``reset_parameters``."""

    _gemm_names: tuple[str, ...] = ("gemm",)
    _tp_supported = False  # tp_size > 1 across processes (module/_tp.py)

    def __init__(self, accumulator: str | None = None, name: str | None = None) -> None:
        super().__init__()
        self.accumulator = accumulator
        self.name = name
        self.fp8_gemms = {n: _GemmState() for n in self._gemm_names}
        self._init_fns: dict[str, Callable[[torch.Tensor], Any]] = {}
        self._last_recipe: Recipe | None = None  # the recipe of the last FP8 or calibration step

    def _init_common(
        self,
        *,
        sequence_parallel: bool = False,
        fuse_wgrad_accumulation: bool = False,
        tp_group: Any = None,
        tp_size: int = 1,
        parallel_mode: str | None = None,
        bias: bool = True,
        return_bias: bool = False,
        delay_wgrad_compute: bool = False,
        save_original_input: bool = False,
    ) -> None:
        """The options every TE GEMM module shares (single-process semantics for the parallel ones)."""
        st = current_state()
        self.primary_weights_in_fp8 = st.fp8_parameters  # inside quantized_model_init
        self._param_recipe = st.parameters_recipe
        self._preserve_high_precision_init_val = st.high_precision_init_val
        if parallel_mode not in (None, "column", "row"):
            raise ValueError(f"parallel_mode {parallel_mode!r} not supported; known: None, 'column', 'row'")
        if tp_group is not None:  # TE: the group's size wins over tp_size
            from ._tp import get_distributed_world_size

            tp_size = get_distributed_world_size(tp_group)
        if tp_size != 1 and not self._tp_supported:
            raise NotImplementedError(
                f"fp8sim.pytorch: {type(self).__name__} with tp_size={tp_size} is not emulated across processes"
                " (Linear, LayerNormLinear and LayerNormMLP are: module/_tp.py)"
            )
        # TE: sequence parallelism only with more than one tensor-parallel rank
        self.sequence_parallel, self.tp_group, self.tp_size = tp_size > 1 and sequence_parallel, tp_group, tp_size
        self.parallel_mode = parallel_mode
        self.fuse_wgrad_accumulation = fuse_wgrad_accumulation
        self.use_bias, self.return_bias = bool(bias), bool(return_bias)
        self.apply_bias = self.use_bias and not self.return_bias
        self.save_original_input = save_original_input
        self.wgrad_store: list | None = [] if delay_wgrad_compute else None

    def set_tensor_parallel_group(self, tp_group: Any) -> None:
        """TE ``set_tensor_parallel_group``: the ``torch.distributed`` group of the tensor-parallel ranks."""
        self.tp_group = tp_group

    def need_backward_dw(self) -> bool:
        """True when wgrad is deferred to :meth:`backward_dw` (``delay_wgrad_compute=True``)."""
        return self.wgrad_store is not None

    def backward_dw(self) -> None:
        """Run the deferred wgrad GEMMs and set the weight gradients (TE ``base.py``: ``weight.grad = wgrad``;
        with ``fuse_wgrad_accumulation`` wgrad is added into ``main_grad``)."""
        if not self.need_backward_dw():
            return
        entries, self.wgrad_store[:] = list(self.wgrad_store), []
        for (fn, _dtype), wname in zip(entries, self._deferred_weight_names(), strict=False):
            w = getattr(self, wname)
            if self.fuse_wgrad_accumulation:  # accumulated in the GEMM's epilogue (beta = 1)
                w.main_grad.copy_(fn(addend=w.main_grad.float()).to(w.main_grad.dtype))
            else:
                w.grad = fn().to(w.dtype)

    def _deferred_weight_names(self) -> list[str]:
        return ["weight"]

    # -- parameters ------------------------------------------------------------------------------
    def register_parameter(self, name: str, param: nn.Parameter | None, **kwargs: Any) -> None:
        """``nn.Module.register_parameter`` plus TE's ``init_fn`` (used by :meth:`reset_parameters`)."""
        init_fn = kwargs.pop("init_fn", None)
        set_init_tracker(self, [name], kwargs.pop("get_rng_state_tracker", None))  # TE: init in its fork
        kwargs.pop("fp8_meta_index", None)
        if kwargs:
            raise TypeError(f"register_parameter got unexpected keyword arguments {sorted(kwargs)}")
        super().register_parameter(name, param)
        if init_fn is not None:
            self._init_fns[name] = init_fn

    def reset_parameters(self, defer_init: bool | None = False) -> None:
        """Re-initialise every registered parameter with its ``init_fn`` (TE ``base.py``); inside
        ``quantized_model_init`` the weights are then quantized (FP8 primary weights)."""
        if defer_init:
            return
        if reset_sharded_parameters(self):  # FSDP2 after to_empty: TE's meta-device flow (_fp8_params.py)
            return
        fp8_names = []
        with torch.no_grad():
            for name, fn in self._init_fns.items():
                p = getattr(self, name, None)
                if p is None:
                    continue
                if p.device.type == "meta":  # TE materialises it on its device: the CPU here
                    p = materialize_meta_parameter(self, name, p)
                if getattr(self, "primary_weights_in_fp8", False) and name in self._weights():
                    fp8_names.append(name)
                    if is_fp8_weight(p):  # re-initialise in high precision, then quantize again
                        p = torch.empty(p.shape, dtype=p.dtype, device=p.device)
                        super().register_parameter(name, nn.Parameter(p))
                run_init(self, name, fn, p)
        if fp8_names:
            quantize_primary_weights(self, fp8_names, self._param_recipe, self._preserve_high_precision_init_val)

    def _weights(self) -> list[str]:
        """The GEMM weight parameters (FP8 primary weights apply to these)."""
        return list(getattr(self, "weight_names", [])) + [n for n in ("fc1_weight", "fc2_weight") if hasattr(self, n)]

    def _get_weight_tensors(self) -> list:
        """TE's: the GEMM weights (quantized tensors for FP8 primary weights)."""
        return [getattr(self, n) for n in self._weights()]

    def _get_weight_quantizers(self) -> list:
        from ._fp8_params import weight_quantizers

        return weight_quantizers(self)

    def _update_weight_quantizers(self) -> None:
        """TE's: each FP8 primary weight takes its slot's current quantizer (``update_quantizer``)."""
        from ._fp8_params import update_weight_quantizers

        update_weight_quantizers(self)

    def _gemm_of_weight(self, name: str) -> str:
        return name.split("_")[0] if name.startswith("fc") else "gemm"

    # -- statistics ------------------------------------------------------------------------------
    def collect_stats(self, enabled: bool = True) -> None:
        """Count overflowing and underflowing elements of every quantized operand (see ``fp8_stats``)."""
        for g in self.fp8_gemms.values():
            g.stats = {} if enabled else None

    @property
    def fp8_stats(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in self.fp8_gemms.values():
            for k, v in (g.stats or {}).items():
                out[k] = out.get(k, 0) + v
        return out

    # -- scale updates ---------------------------------------------------------------------------
    # TE updates delayed-scaling state through its global buffers (``quantization.py``
    # ``reduce_and_update_fp8_tensors``): autocast's exit does the forward, the first trainable FP8
    # module's backward the backward update.  These hooks serve other region members that call them.
    _te_global_buffer = True
    _region_token: Any = None

    def _update_forward_scales(self) -> None:
        reduce_and_update_fp8_tensors(forward=True)

    def _update_backward_scales(self) -> None:
        reduce_and_update_fp8_tensors(forward=False, token=self._region_token)

    # -- the GEMM --------------------------------------------------------------------------------
    def _check_input_dtype(self, inp: torch.Tensor) -> None:
        """TE ``set_activation_dtype``: outside ``torch.autocast`` the input dtype must match the parameters'."""
        if torch.is_autocast_enabled(inp.device.type):
            return
        for pname, p in self.named_parameters():
            if p.dtype != inp.dtype:
                raise TypeError(
                    "Data types for parameters must match when outside of autocasted "
                    f"region. Found input dtype: {inp.dtype} and {pname!r} dtype: {p.dtype}"
                )

    @staticmethod
    def _activation_dtype(inp: torch.Tensor) -> torch.dtype:
        dev = inp.device.type
        return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else inp.dtype

    @staticmethod
    def _fp8_compute() -> bool:
        return current_state().enabled

    def _linear(
        self,
        name: str,
        x: torch.Tensor,
        w: torch.Tensor,
        b: torch.Tensor | None,
        is_first_microbatch: bool | None,
        act_dtype: torch.dtype | None = None,
        weight_param: Any = None,
        output_fp32: bool = False,
        fp8_io: dict | None = None,
        split_ctx: Any = None,
    ) -> torch.Tensor:
        """``x w^T + b`` for GEMM ``name``; FP8 inside autocast.  ``split_ctx``: see ``_grouped_function``.
        ``act_dtype``: the activation dtype
        when ``x`` is a float32 producer output quantized straight to FP8 (TE's fused kernels);
        ``output_fp32``: the FP8 output rounded to the activation dtype, held in float32."""
        st = current_state()
        g = self.fp8_gemms[name]
        act = act_dtype or self._activation_dtype(x)
        if st.enabled:  # TE computes in FP8 whenever enabled, calibrating or not
            recipe = get_recipe()
            self._last_recipe = recipe
            if split_ctx is None:  # TE's GroupedLinear quantizes its splits without the shape check
                assert_dim_for_fp8_exec(x, w)
            hist = None if g.fwd is None else g.fwd.amax_history
            g.ensure(recipe, st.group, f"{type(self).__name__} GEMM {name!r}")
            self._init_fp8_metadata(recipe, st.group)  # TE prepare_forward: recipe states, CustomRecipe slots
            if hist is not None and g.fwd.amax_history is not hist and is_fp8_weight(w):
                self._update_weight_quantizers()  # TE base.py: a new amax_history_len rebuilds the quantizers
            if (
                is_fp8_weight(w)
                and _requires_grad(x, w, b)
                and not w.get_usages()["columnwise"]
                and not g.dgrad_weight_in_backward(w)  # FSDP2 gathers it for the backward
            ):
                w.update_usage(columnwise_usage=True)  # TE linear.py:1051 (backward): made from rowwise or TE's error
            g.group = st.group
            norm = (fp8_io or {}).get("norm")  # TE: a LayerNormLinear trains through its norm's parameters too
            first = _register(self, _requires_grad(x, w, b, *(norm.params if norm else ())))
            self._region_token = st.modules
            acc = st.accumulator if st.accumulator is not None else self.accumulator
            if act_dtype is None:
                x = x.to(act)
            if not is_fp8_weight(w):
                w = w.to(act)
            if b is not None:  # TE: cuBLAS takes no FP32 bias in an FP8 GEMM, so an FP32 bias goes through BF16
                b = bias_through_bf16(b) if act == torch.float32 else b.to(act)
            opts = LinearOptions(
                weight_param=weight_param,
                fuse_wgrad_accumulation=getattr(self, "fuse_wgrad_accumulation", False),
                wgrad_store=getattr(self, "wgrad_store", None),
                output_fp32=output_fp32,
                site=GemmSite(self, name),
                split_ctx=split_ctx,
                **(fp8_io or {}),
            )
            if fp8_io:  # fp8_output: the caller reads ``opts.out_handoff``
                self._last_opts = opts
            # TE prepare_forward/end_forward: a checkpointed forward stashes, its recompute replays, the FP8 state
            with _replay_fp8_state(self, g), torch.autocast(x.device.type, enabled=False):  # float32 GEMMs, not bf16
                return fp8_linear(x, w, b, g, recipe, acc, is_first_microbatch, first, act, opts)
        if st.calibrating:  # only where FP8 compute is off (TE linear.py: ``if not fp8 and fp8_calibration``)
            recipe = get_recipe()
            self._last_recipe = recipe
            if isinstance(recipe, DelayedScaling):
                g.ensure(recipe, st.group)
                g.group = st.group
                self._init_fp8_metadata(recipe, st.group)
                _register(self, False)
                for idx, t in ((0, x), (1, w)):  # TE overwrites the staging amax (a NaN passes)
                    g.fwd.amax_history[0, idx] = np.float32(_calibration_amax(t))
        else:
            self._fp8_forward_off()
        x, w, b = x.to(act), w.to(act), None if b is None else b.to(act)
        fuse, store = getattr(self, "fuse_wgrad_accumulation", False), getattr(self, "wgrad_store", None)
        opts = LinearOptions(weight_param, fuse, store, split_ctx=split_ctx)
        return hp_linear(x, w, b, opts, is_first_microbatch)

    def _tp_linear(
        self, mode: str | None, name: str, x: torch.Tensor, w: torch.Tensor, b: Any, *args: Any, **kw: Any
    ) -> torch.Tensor:
        """:meth:`_linear` on this rank's shard inside TE's tensor-parallel collectives for ``mode``
        ("column", "row"; None: none), see ``module/_tp.py``."""
        if self.tp_size == 1 or mode is None:
            return self._linear(name, x, w, b, *args, **kw)
        from ._tp import module_tp_linear

        return module_tp_linear(self, mode, name, x, w, b, *args, **kw)

    def _custom_quantizers(self, recipe: CustomRecipe) -> dict[str, list]:
        from ._custom import ensure_custom

        return ensure_custom(self, recipe)

    @property
    def quantizers(self) -> dict[str, list]:
        """TE's ``quantizers``: ``scaling_fwd`` (3 per GEMM) and ``scaling_bwd`` (2 per GEMM) for the
        recipe of the last FP8 step (else the active or default recipe); live for delayed scaling."""
        from ._quantizers import module_quantizers

        return module_quantizers(self, self._last_recipe or get_recipe())

    # -- TE's fp8_meta --------------------------------------------------------------------------------
    @property
    def fp8_meta(self) -> dict[str, Any]:
        """TE's ``fp8_meta``: ``recipe``, ``num_gemms`` and, once initialized, ``scaling_fwd`` / ``scaling_bwd``
        (TE's recipe-state objects; delayed scaling in TE's layout, GEMM ``i`` at slots ``3i..3i+2`` forward,
        ``2i..2i+1`` backward: one GEMM's state is live and kept, several GEMMs give a snapshot)."""
        from ._module_states import module_fp8_meta

        return module_fp8_meta(self)

    def _new_recipe_state(self, fwd: bool, recipe: Recipe) -> Any:
        from ._module_states import module_recipe_state

        return module_recipe_state(self, fwd, recipe)

    def _install_quantizers(self, key: str, state: Any) -> None:
        from ._module_states import install_module_quantizers

        install_module_quantizers(self, key, state)

    # -- checkpoints -----------------------------------------------------------------------------
    def get_extra_state(self) -> torch.Tensor:
        """TE's ``_extra_state``: an empty uint8 tensor before any FP8 step or for a stateless recipe;
        for delayed scaling TE's pickled dict (``recipe``, ``scale_fwd``, ``amax_history_fwd``,
        ``scale_bwd``, ``amax_history_bwd``, ``extra_fp8_variables``), all GEMMs in one layout."""
        from .._extra_state_te import encode_te_extra_state

        recipe = self._last_recipe
        gemms = list(self.fp8_gemms.values())
        if recipe is None or not isinstance(recipe, DelayedScaling) or any(g.fwd is None for g in gemms):
            return torch.empty(0, dtype=torch.uint8)  # nothing to checkpoint, or a stateless recipe
        meta = self.fp8_meta
        return encode_te_extra_state(
            recipe,
            scale_fwd=meta["scaling_fwd"].scale,
            amax_history_fwd=meta["scaling_fwd"].amax_history,
            scale_bwd=meta["scaling_bwd"].scale,
            amax_history_bwd=meta["scaling_bwd"].amax_history,
            extra_fp8_variables={"fp8_checkpoint": True, "num_gemms": len(gemms)},
        )

    def set_extra_state(self, state: Any) -> None:
        """Load TE's format (as TE: a delayed-scaling pickle needs ``NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1``)
        or fp8sim's earlier per-GEMM dict."""
        from .._extra_state_te import decode_te_extra_state, is_te_extra_state

        if state is None or (isinstance(state, dict) and not state):
            return
        name = type(self).__name__
        if is_te_extra_state(state) or isinstance(state, io.BytesIO):
            te_state = decode_te_extra_state(state, name)
            if te_state is None:
                return
            self._last_recipe = te_state.recipe
            if te_state.scale_fwd is None:
                return
            self._load_te_tensors(te_state)
            return
        if not isinstance(state, dict) or not all(isinstance(v, dict) for v in state.values()):
            raise RuntimeError(
                f"{name}: unreadable _extra_state ({type(state).__name__}); expected TransformerEngine's "
                "pickled uint8 tensor or fp8sim's per-GEMM dict"
            )
        unknown = sorted(set(state) - set(self.fp8_gemms))
        if unknown:
            raise RuntimeError(
                f"{name}: _extra_state holds FP8 state of GEMMs {unknown}, but this module has "
                f"{sorted(self.fp8_gemms)}: the checkpoint comes from another module type"
            )
        keys = {"fwd_scale", "fwd_amax_history", "bwd_scale", "bwd_amax_history"}
        pairs = []
        for n, st in state.items():
            if st and set(st) != keys:
                raise RuntimeError(f"{name}: _extra_state of GEMM {n!r} has keys {sorted(st)}; expected {sorted(keys)}")
            try:
                gemm_pairs = self.fp8_gemms[n].load(st)
                for scaler, st_ in gemm_pairs:
                    scaler._checked_state(st_)  # every GEMM's state checked before any scaler changes
            except (TypeError, ValueError) as exc:
                raise RuntimeError(f"{name}: _extra_state of GEMM {n!r}: {exc}") from None
            pairs += gemm_pairs
        load_state_dicts(pairs)

    def _load_te_tensors(self, st: Any) -> None:
        n = len(self.fp8_gemms)
        shapes = (tuple(st.scale_fwd.shape), tuple(st.scale_bwd.shape), st.amax_history_fwd.dim())
        if shapes[:2] != ((3 * n,), (2 * n,)) or shapes[2] != 2 or st.amax_history_fwd.shape[1] != 3 * n:
            raise RuntimeError(
                f"{type(self).__name__}: _extra_state holds delayed-scaling state for {st.scale_fwd.numel() // 3} "
                f"GEMM(s) (scale_fwd {list(st.scale_fwd.shape)}), this module has {n}: the checkpoint comes "
                "from another module type"
            )
        recipe = st.recipe if isinstance(st.recipe, DelayedScaling) else DelayedScaling()
        pairs = []
        for i, g in enumerate(self.fp8_gemms.values()):
            g.ensure(recipe)
            fwd = {"scale": st.scale_fwd[3 * i : 3 * i + 3], "amax_history": st.amax_history_fwd[:, 3 * i : 3 * i + 3]}
            bwd = {"scale": st.scale_bwd[2 * i : 2 * i + 2], "amax_history": st.amax_history_bwd[:, 2 * i : 2 * i + 2]}
            pairs += [(g.fwd, fwd), (g.bwd, bwd)]
        try:
            load_state_dicts(pairs)
        except ValueError as exc:
            raise RuntimeError(f"{type(self).__name__}: _extra_state: {exc}") from None


def _calibration_amax(t: torch.Tensor) -> float:
    """TE's calibration amax: ``max(-amin, amax)`` of the tensor, NaN propagating (``torch.aminmax``)."""
    if t.numel() == 0:
        return 0.0
    lo, hi = torch.aminmax(t.detach().float())
    return float(torch.maximum(-lo, hi))


# the name the pre-restructure module used
_FP8Base = TransformerEngineBaseModule
_check_dims = assert_dim_for_fp8_exec
