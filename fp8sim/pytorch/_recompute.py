"""TE's FP8 state around activation recompute (``distributed.py``), below the modules that call it.

:class:`activation_recompute_forward` marks a checkpointed forward and its recompute;
:func:`_replay_fp8_state` wraps one FP8 GEMM: in a checkpointed training forward it stashes the GEMM's
delayed-scaling ``scale`` and ``amax_history`` (and fp8sim's stochastic-rounding counter), in the
recompute it loads the stash and restores the updated state afterwards (the stash itself:
:mod:`._recompute_state`, via ``FP8GlobalStateManager``).  :func:`module_checkpoint` is
``LayerNormMLP(checkpoint=True)``'s selective recompute.  ``checkpoint`` itself is in
:mod:`.distributed`, which re-exports these names as TE does.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .quantization import _RECOMPUTE, FP8GlobalStateManager, _RecomputeRegion, current_state

__all__ = [
    "activation_recompute_forward",
    "is_fp8_activation_recompute_enabled",
    "in_fp8_activation_recompute_phase",
    "module_checkpoint",
]


class activation_recompute_forward(contextlib.AbstractContextManager, contextlib.ContextDecorator):
    """TE: marks a checkpointed forward (``recompute_phase=False``) or its recompute (``True``); the
    first keeps autocast's ``is_first_fp8_module`` in a FIFO, the second takes it back."""

    _is_first_fp8_module: list = []

    def __init__(self, activation_recompute: bool = False, recompute_phase: bool = False) -> None:
        super().__init__()
        self.activation_recompute, self.recompute_phase = activation_recompute, recompute_phase

    def __enter__(self) -> activation_recompute_forward:
        _RECOMPUTE["region"], _RECOMPUTE["phase"] = self.activation_recompute, self.recompute_phase
        st = current_state()
        if self.activation_recompute and not self.recompute_phase:
            activation_recompute_forward._is_first_fp8_module.append(st.depth > 0 and st.first_module is None)
        if self.activation_recompute and self.recompute_phase:
            st.recompute_first = activation_recompute_forward._is_first_fp8_module.pop(0)
        return self

    def __exit__(self, *exc: Any) -> None:
        _RECOMPUTE["region"] = _RECOMPUTE["phase"] = False


def is_fp8_activation_recompute_enabled() -> bool:
    """TE: inside a checkpointed forward with FP8 enabled."""
    return _RECOMPUTE["region"] and current_state().enabled


def in_fp8_activation_recompute_phase() -> bool:
    """TE: inside the recompute of a checkpointed forward."""
    return _RECOMPUTE["phase"]


class _FwdView:
    """``fp8_meta["scaling_fwd"]`` of one GEMM: live torch views of its DelayedScaler."""

    def __init__(self, scaler: Any) -> None:
        self.scale, self.amax_history = torch.from_numpy(scaler.scale), torch.from_numpy(scaler.amax_history)


def _gemm_meta(g: Any) -> dict[str, Any]:
    """A TE-style ``fp8_meta`` of one GEMM, kept on its state (TE keeps the recompute position there)."""
    meta = g.__dict__.setdefault("_recompute_fp8_meta", {"_calls": deque()})
    if g.fwd is not None:
        meta["recipe"], meta["scaling_fwd"] = g.fwd.recipe, _FwdView(g.fwd)
    return meta


_NO_REPLAY = contextlib.nullcontext()


def _replay_fp8_state(module: Any, g: Any) -> contextlib.AbstractContextManager:
    """TE ``prepare_forward``/``end_forward`` around one FP8 GEMM (``g``: an object with a ``fwd``
    DelayedScaler, or None, and optionally a ``calls`` counter): stash in a checkpointed forward, in
    training or eval mode alike (TE 2.20, ``module/base.py:1635``), replay the stash in the recompute,
    then restore (outside a checkpoint: nothing)."""
    if not _RECOMPUTE["region"]:
        return _NO_REPLAY
    return _replay(module, g)


@contextlib.contextmanager
def _replay(module: Any, g: Any) -> Iterator[None]:
    if in_fp8_activation_recompute_phase():
        meta = _gemm_meta(g)
        FP8GlobalStateManager.get_old_fp8_meta_tensors_for_recompute(meta)
        calls = getattr(g, "calls", None)  # the stochastic-rounding counter, where the state has one
        if calls is not None and meta["_calls"]:
            g.calls = meta["_calls"].popleft()
        try:
            yield
        finally:
            if calls is not None:
                g.calls = calls
            FP8GlobalStateManager.restore_fp8_meta_tensors(meta)
        return
    if is_fp8_activation_recompute_enabled():
        meta = _gemm_meta(g)
        FP8GlobalStateManager.copy_forward_fp8_meta_tensors_for_recompute(meta)
        if hasattr(g, "calls"):
            meta["_calls"].append(g.calls)
    yield


def _rng_states(tracker: Callable | None) -> tuple:
    cuda = torch.cuda.get_rng_state() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda, (tracker().get_states() if tracker is not None else None)


def _set_rng_states(states: tuple, tracker: Callable | None) -> None:
    torch.set_rng_state(states[0])
    if states[1] is not None:
        torch.cuda.set_rng_state(states[1])
    if tracker is not None:
        tracker().set_states(states[2])


def _amp_contexts() -> list[Any]:
    """TE ``_get_active_autocast_contexts``: torch.autocast as it is now, to re-enter in the recompute."""
    cached = torch.is_autocast_cache_enabled()
    out = []
    for dev in ("cuda", "cpu"):
        enabled = torch.is_autocast_enabled(dev)
        if enabled or dev == "cpu":
            out.append(
                torch.amp.autocast(dev, enabled=enabled, dtype=torch.get_autocast_dtype(dev), cache_enabled=cached)
            )
    return out


def _detach(x: Any) -> Any:
    if not isinstance(x, torch.Tensor):
        return x
    y = x.detach()
    y.requires_grad_(x.requires_grad)
    return y


class _ModuleRecompute(torch.autograd.Function):
    """TE ``_LayerNormMLP`` with ``checkpoint=True``: keep the inputs, recompute the forward in backward
    under the forward's autocast state (no new autocast region: no extra forward scale update) and
    stashed FP8 state; the backward-update role is the one the forward took."""

    @staticmethod
    def forward(ctx: Any, fn: Callable, module: Any, kwargs: dict, n_inputs: int, *tensors: torch.Tensor) -> Any:
        from .quantization import _register

        st = current_state()
        trainable = any(t.requires_grad for t in tensors if isinstance(t, torch.Tensor))
        ctx.first = _register(module, trainable) if st.enabled else False
        ctx.fn, ctx.kwargs, ctx.n_inputs = fn, kwargs, n_inputs
        ctx.state = (FP8GlobalStateManager.get_autocast_state(), st.accumulator)
        ctx.rng, ctx.amp = _rng_states(None), _amp_contexts()
        saved = dict(_RECOMPUTE)
        _RECOMPUTE["region"], _RECOMPUTE["phase"] = True, False
        try:
            with torch.no_grad():
                out = fn(*tensors[:n_inputs], **kwargs)
        finally:
            _RECOMPUTE.update(saved)
        ctx.save_for_backward(*tensors[:n_inputs])
        return out

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> tuple:
        st = current_state()
        inputs = tuple(_detach(x) for x in ctx.saved_tensors)
        saved = (FP8GlobalStateManager.get_autocast_state(), st.accumulator, st.modules, st.recompute_first)
        saved_flags, bwd_rng = dict(_RECOMPUTE), _rng_states(None)
        FP8GlobalStateManager.set_autocast_state(ctx.state[0])
        st.accumulator, st.modules, st.recompute_first = ctx.state[1], _RecomputeRegion(), ctx.first
        _RECOMPUTE["region"] = _RECOMPUTE["phase"] = True
        _set_rng_states(ctx.rng, None)
        try:
            with contextlib.ExitStack() as stack:
                for c in (torch.enable_grad(), *ctx.amp):
                    stack.enter_context(c)
                outputs = ctx.fn(*inputs, **ctx.kwargs)
        finally:
            FP8GlobalStateManager.set_autocast_state(saved[0])
            st.accumulator, st.modules, st.recompute_first = saved[1:]
            _RECOMPUTE.update(saved_flags)
            _set_rng_states(bwd_rng, None)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        pairs = [(o, g) for o, g in zip(outputs, grads, strict=False) if torch.is_tensor(o) and o.requires_grad]
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        n_params = len(ctx.needs_input_grad) - 4 - ctx.n_inputs
        return (None, None, None, None) + tuple(x.grad for x in inputs) + (None,) * n_params


def module_checkpoint(module: torch.nn.Module, fn: Callable, *inputs: torch.Tensor, **kwargs: Any) -> Any:
    """``fn(*inputs, **kwargs)`` (a forward of ``module``) with TE's selective activation recompute; the
    parameters' gradients accumulate during the recompute's backward, as in TE's checkpoint."""
    params = tuple(p for p in module.parameters() if p.requires_grad)
    return _ModuleRecompute.apply(fn, module, kwargs, len(inputs), *inputs, *params)
