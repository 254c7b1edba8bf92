"""TE's ``CudaRNGStatesTracker`` (``transformer_engine/pytorch/distributed.py``): named RNG states to fork into.

Megatron-style model parallelism keeps one generator state per purpose (``"model-parallel-rng"``: the
weights' initialisation and dropout inside the tensor-parallel region) beside the default one.
``add(name, seed)`` records the state ``manual_seed(seed)`` gives without moving the current one;
``fork(name)`` runs its body from that state, keeps where the body left it and restores the state it
found.  The tracked generator is the one TE's modules draw from: CUDA's default generator where CUDA is
available and initialised, else (a CPU-only run) torch's CPU default generator (``torch.get_rng_state``).
States are ``ByteTensor`` snapshots (TE's path without graph-safe RNG); CUDA-graph-safe generator objects
are not used, so a captured graph does not see the forked state.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

__all__ = [
    "CudaRNGStatesTracker",
    "get_all_rng_states",
    "set_all_rng_states",
    "graph_safe_rng_available",
    "initialize_affine_weight_gpu",
]

_ALL_ACTIVE_RNG_STATES: dict = {}


def get_all_rng_states() -> dict:
    """TE: every state the trackers hold (the dict the last ``add`` / ``set_states`` left)."""
    return _ALL_ACTIVE_RNG_STATES


def set_all_rng_states(states: dict) -> None:
    """TE: replace the states reported by :func:`get_all_rng_states`."""
    global _ALL_ACTIVE_RNG_STATES
    _ALL_ACTIVE_RNG_STATES = states


def graph_safe_rng_available() -> bool:
    """TE: whether torch has CUDA-graph-safe generator state handling (the tracker here never uses it)."""
    graph = getattr(torch.cuda, "CUDAGraph", None)
    return (
        hasattr(graph, "register_generator_state")
        and hasattr(torch.Generator, "graphsafe_set_state")
        and hasattr(torch.Generator, "graphsafe_get_state")
        and hasattr(torch.Generator, "clone_state")
    )


def _on_cuda() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def _get_state() -> torch.Tensor:
    return torch.cuda.get_rng_state() if _on_cuda() else torch.get_rng_state()


def _set_state(state: torch.Tensor) -> None:
    if _on_cuda():
        torch.cuda.set_rng_state(state)
    else:
        torch.set_rng_state(state)


def _manual_seed(seed: int) -> None:
    if _on_cuda():
        torch.cuda.manual_seed(seed)
    else:
        torch.manual_seed(seed)


class CudaRNGStatesTracker:
    """TE: a map from names to generator states; ``add`` a state from a seed, ``fork`` into it."""

    def __init__(self) -> None:
        self.states_: dict[str, torch.Tensor] = {}
        self.seeds_: set[int] = set()  # bookkeeping: no seed is used twice

    def reset(self) -> None:
        """TE: forget every state and seed."""
        self.states_ = {}
        self.seeds_ = set()

    def get_states(self) -> dict[str, torch.Tensor]:
        """TE: a new dict holding the tracked states themselves (not copies)."""
        return dict(self.states_)

    def set_states(self, states: dict[str, torch.Tensor]) -> None:
        """TE: take ``states`` as the tracked map (sizes unchecked) and publish it globally."""
        self.states_ = states
        set_all_rng_states(self.states_)

    def add(self, name: str, seed: int) -> None:
        """TE: track the state ``manual_seed(seed)`` gives as ``name``; the current state is kept.
        TE's errors for a seed or a name already used (the seed is recorded before the name is checked)."""
        if seed in self.seeds_:
            raise RuntimeError(f"seed {seed} already exists")
        self.seeds_.add(seed)
        if name in self.states_:
            raise RuntimeError(f"cuda rng state {name} already exists")
        orig = _get_state()
        _manual_seed(seed)
        self.states_[name] = _get_state()
        _set_state(orig)
        set_all_rng_states(self.states_)

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng") -> Iterator[None]:
        """TE: run the body from state ``name``, store where it left that state, restore the caller's."""
        if name not in self.states_:
            raise KeyError(f"cuda rng state {name} is not added")
        orig = _get_state()
        _set_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = _get_state()
            _set_state(orig)


def initialize_affine_weight_gpu(
    weight: torch.Tensor,
    init_method: Callable,
    get_rng_state_tracker: Callable | None,
    partition_dim: int = 0,
    stride: int = 1,
    set_tp_attributes: bool = True,
) -> None:
    """TE: mark ``weight`` tensor-parallel (``set_tensor_model_parallel_attributes``), then ``init_method(weight)``
    inside ``get_rng_state_tracker().fork()`` (directly without a tracker)."""
    from ._comm import set_tensor_model_parallel_attributes

    if set_tp_attributes:
        set_tensor_model_parallel_attributes(tensor=weight, is_parallel=True, dim=partition_dim, stride=stride)
    if get_rng_state_tracker is None:
        init_method(weight)
        return
    with get_rng_state_tracker().fork():
        init_method(weight)


def attention_tracker(get_rng_state_tracker: Callable | None, sequence_parallel: bool) -> CudaRNGStatesTracker | None:
    """TE ``DotProductAttention.__init__``: the tracker (None under ``sequence_parallel``), its states
    published with :func:`set_all_rng_states`."""
    if sequence_parallel or get_rng_state_tracker is None:
        return None
    tracker = get_rng_state_tracker()
    set_all_rng_states(tracker.get_states())
    return tracker


def dropout_fork(tracker: CudaRNGStatesTracker | None, attention_dropout: float) -> contextlib.AbstractContextManager:
    """TE ``DotProductAttention``'s ``attention_dropout_ctx``: the tracker's default fork when it has a
    tracker (none under ``sequence_parallel``) and ``attention_dropout > 0``, else no context."""
    if tracker is None or not attention_dropout > 0:
        return contextlib.nullcontext()
    return tracker.fork()
