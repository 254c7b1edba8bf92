"""Activation recompute with TE's FP8 state replay: ``te.checkpoint`` and ``LayerNormMLP(checkpoint=True)``.

References are TE's own: ``tests/pytorch/test_numerics.py:751`` (``test_gpt_full_activation_recompute``)
compares a checkpointed model with the plain one; here the comparison is bit-exact and covers
several delayed-scaling steps.  The replay follows ``transformer_engine/pytorch/module/base.py:1601``
(recompute phase: ``get_old_fp8_meta_tensors_for_recompute``), ``:1635`` (checkpointed
forward: ``copy_forward_fp8_meta_tensors_for_recompute``) and ``:1649`` (``restore_fp8_meta_tensors``),
with the stash/restore of ``quantization.py:785-845``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

import fp8sim.pytorch as te  # noqa: E402
from fp8sim.pytorch import distributed as te_dist  # noqa: E402
from fp8sim.pytorch.quantization import FP8GlobalStateManager, current_state  # noqa: E402
from fp8sim.recipe import DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling, NVFP4BlockScaling  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
_F32 = {"params_dtype": torch.float32}


def _model() -> torch.nn.ModuleList:
    torch.manual_seed(0)
    return torch.nn.ModuleList([te.Linear(32, 32, **_F32), te.LayerNormMLP(32, 64, **_F32), te.Linear(32, 32, **_F32)])


def _fp8_state(model: torch.nn.Module) -> list[np.ndarray]:
    out = []
    for m in model.modules():
        for g in getattr(m, "fp8_gemms", {}).values():
            if g.fwd is not None:
                out += [a.copy() for a in (g.fwd.scale, g.fwd.amax_history, g.bwd.scale, g.bwd.amax_history)]
    return out


def _steps(recipe, mode: str, steps: int = 3) -> list[list]:
    """Train ``steps`` steps; ``mode``: "plain", "reentrant" / "non_reentrant" (``te.checkpoint`` of the
    middle module) or "module" (``LayerNormMLP(checkpoint=True)``).  Returns, per step, the input and
    parameter gradients and every scale and amax history."""
    FP8GlobalStateManager.reset()
    model = _model()
    model[1].checkpoint = mode == "module"
    record = []
    for step in range(steps):
        torch.manual_seed(100 + step)
        x = torch.randn(16, 32, requires_grad=True)
        with te.autocast(enabled=True, recipe=recipe):
            h = model[0](x)
            if mode in ("reentrant", "non_reentrant"):
                h = te.checkpoint(model[1], h, use_reentrant=mode == "reentrant")
            else:
                h = model[1](h)
            y = model[2](h)
        (y * y).sum().backward()
        record.append([x.grad.clone()] + [p.grad.clone() for p in model.parameters()] + _fp8_state(model))
        model.zero_grad(set_to_none=True)
    return record


def _assert_bit_equal(got: list[list], want: list[list]) -> None:
    for step, (g_step, w_step) in enumerate(zip(got, want, strict=True)):
        for i, (g, w) in enumerate(zip(g_step, w_step, strict=True)):
            g, w = torch.as_tensor(g), torch.as_tensor(w)
            assert torch.equal(g, w), f"step {step}, tensor {i}: first difference at {(g != w).nonzero()[:1].tolist()}"


# NVFP4: the gradients' stochastic rounding draws from a per-GEMM counter; the recompute must leave it as the
# forward did (TE sets the RNG state back after the recompute, distributed.py:449)
_RECIPES = [DelayedScaling(amax_history_len=4), Float8CurrentScaling(), MXFP8BlockScaling(), NVFP4BlockScaling()]


@pytest.mark.parametrize("mode", ["reentrant", "non_reentrant", "module"])
@pytest.mark.parametrize("recipe", _RECIPES, ids=lambda r: type(r).__name__)
def test_checkpointed_model_bit_equal_to_plain_over_steps(recipe, mode: str) -> None:
    """test_numerics.py:751 made bit-exact: gradients, scales and amax histories at every step."""
    _assert_bit_equal(_steps(recipe, mode), _steps(recipe, "plain"))


@pytest.mark.parametrize("mode", ["reentrant", "module"])
def test_without_the_replay_delayed_scaling_recompute_differs(monkeypatch, mode: str) -> None:
    """The recompute really casts again: without TE's get_old/restore (quantization.py:813, :836) it uses the
    updated scales and folds its amaxes into the history, so the bit-equality above depends on the replay."""
    noop = staticmethod(lambda fp8_meta: None)
    monkeypatch.setattr(FP8GlobalStateManager, "get_old_fp8_meta_tensors_for_recompute", noop)
    monkeypatch.setattr(FP8GlobalStateManager, "restore_fp8_meta_tensors", noop)
    recipe = DelayedScaling(amax_history_len=4)
    with pytest.raises(AssertionError):
        _assert_bit_equal(_steps(recipe, mode, steps=2), _steps(recipe, "plain", steps=2))


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_forward_is_rerun_and_stash_restore_balance(monkeypatch, use_reentrant: bool) -> None:
    """distributed.py:376/:441 (reentrant) and :588 (non-reentrant): the function runs twice; every GEMM
    stashes once and replays once (as test_numerics.py:814 counts them); the FIFO ends empty."""
    FP8GlobalStateManager.reset()
    model = _model()
    calls = []
    model[1].register_forward_pre_hook(lambda mod, args: calls.append(te_dist.in_fp8_activation_recompute_phase()))
    stash, replay = {}, {}
    copy_fn = FP8GlobalStateManager.copy_forward_fp8_meta_tensors_for_recompute
    old_fn = FP8GlobalStateManager.get_old_fp8_meta_tensors_for_recompute

    def record_stash(meta):
        copy_fn(meta)
        stash[id(meta)] = stash.get(id(meta), 0) + 1

    def record_replay(meta):
        assert id(meta) in stash, "Recompute restored a scale that was never stashed"
        replay[id(meta)] = replay.get(id(meta), 0) + 1
        old_fn(meta)

    manager = FP8GlobalStateManager
    monkeypatch.setattr(manager, "copy_forward_fp8_meta_tensors_for_recompute", staticmethod(record_stash))
    monkeypatch.setattr(manager, "get_old_fp8_meta_tensors_for_recompute", staticmethod(record_replay))
    x = torch.randn(16, 32, requires_grad=True)
    with te.autocast(enabled=True, recipe=DelayedScaling()):
        y = te.checkpoint(model[1], model[0](x), use_reentrant=use_reentrant)
    assert calls == [False]
    y.sum().backward()
    assert calls == [False, True]
    assert len(stash) == 2 and stash == replay  # fc1 and fc2 of the LayerNormMLP
    assert all(len(q) == 0 for q in current_state().fp8_tensors_recompute_buffer)


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_inner_autocast_in_checkpointed_callable_matches_plain(use_reentrant: bool) -> None:
    """test_numerics.py:814: the callable opens its own autocast; the step equals the plain one.  TE quirk:
    reentrant, that autocast exits under the forward's ``no_grad`` (distributed.py:375), so its exit skips
    the forward scale update (quantization.py:780) and the recompute's is nested: the scales stay 1."""
    recipe = DelayedScaling()
    results, scales = [], []
    for ckpt in (False, True):
        FP8GlobalStateManager.reset()
        model = _model()

        def body(t: torch.Tensor, model=model) -> torch.Tensor:
            with te.autocast(enabled=True, recipe=recipe):
                return model[1](model[0](t))

        x = torch.randn(16, 32, generator=torch.Generator().manual_seed(1), requires_grad=True)
        y = te.checkpoint(body, x, use_reentrant=use_reentrant) if ckpt else body(x)
        y.sum().backward()
        results.append([y.detach(), x.grad, *[p.grad for p in model[:2].parameters()]])
        scales.append(model[0].fp8_gemms["gemm"].fwd.scale.copy())
    _assert_bit_equal([results[1]], [results[0]])
    assert not np.array_equal(scales[0], np.ones(3, np.float32))
    assert np.array_equal(scales[1], np.ones(3, np.float32) if use_reentrant else scales[0])


class _Tracker:
    """A ``CudaRNGStatesTracker``-like object: TE calls ``get_states()`` and ``set_states()``."""

    def __init__(self) -> None:
        self.states, self.sets = {"model-parallel-rng": 1}, 0

    def get_states(self) -> dict:
        return dict(self.states)

    def set_states(self, states: dict) -> None:
        self.sets += 1
        self.states = dict(states)


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_rng_replay_dropout_and_te_arguments(use_reentrant: bool) -> None:
    """distributed.py:351 and :484: the forward's CPU RNG state is replayed in the recompute (dropout
    masks equal) and ``get_rng_state_tracker``'s states are saved and restored; ``tp_group=None`` and
    ``distribute_saved_activations`` are accepted (:779: non-reentrant warns it has no effect)."""
    results = []
    tracker = _Tracker()
    for ckpt in (False, True):
        FP8GlobalStateManager.reset()
        torch.manual_seed(0)
        lin, drop = te.Linear(32, 32, **_F32), torch.nn.Dropout(0.5)

        def body(t: torch.Tensor, lin=lin, drop=drop) -> torch.Tensor:
            return lin(drop(t))

        torch.manual_seed(5)
        x = torch.randn(16, 32, requires_grad=True)
        with warnings.catch_warnings(record=True) as rec, te.autocast(enabled=True, recipe=DelayedScaling()):
            warnings.simplefilter("always")
            kw = {"get_rng_state_tracker": lambda: tracker, "tp_group": None, "use_reentrant": use_reentrant}
            if ckpt and not use_reentrant:
                kw["distribute_saved_activations"] = True
            y = te.checkpoint(body, x, **kw) if ckpt else body(x)
        if ckpt and not use_reentrant:
            assert any("has no effect when `use_reentrant=False`" in str(w.message) for w in rec)
        torch.randn(100)  # moves the RNG between forward and backward
        y.sum().backward()
        results.append([y.detach(), x.grad, lin.weight.grad])
    assert tracker.sets == 2  # the forward states before the recompute, the backward ones after
    _assert_bit_equal([results[1]], [results[0]])


def test_unfused_update_rolls_histories_again_in_the_recompute(monkeypatch) -> None:
    """TE quirk (quantization.py:772, distributed.py:441): the recompute runs in a fresh outermost
    ``autocast`` whose exit updates the forward scales again.  The fused kernel leaves a history whose
    staging amax is 0 alone (common/recipe/delayed_scaling.cu:186), the unfused path
    (``NVTE_UNFUSED_FP8_UPDATE=1``, quantization.py:1067) rolls it once more: history rolled by one
    row with row 0 zeroed, scale unchanged, backward state untouched."""
    monkeypatch.setenv("NVTE_UNFUSED_FP8_UPDATE", "1")
    states = []
    for ckpt in (False, True):
        FP8GlobalStateManager.reset()
        torch.manual_seed(0)
        lin = te.Linear(32, 32, **_F32)
        x = torch.randn(16, 32, requires_grad=True)
        with te.autocast(enabled=True, recipe=DelayedScaling(amax_history_len=4)):
            y = te.checkpoint(lin, x) if ckpt else lin(x)
        y.sum().backward()
        states.append(_fp8_state(lin))
    (s0, h0, bs0, bh0), (s1, h1, bs1, bh1) = states
    want = np.roll(h0, -1, axis=0)
    want[0] = 0
    assert np.array_equal(h1, want) and not np.array_equal(h1, h0)
    assert np.array_equal(s1, s0) and np.array_equal(bs1, bs0) and np.array_equal(bh1, bh0)


def test_activation_recompute_names() -> None:
    """distributed.py:241-616: the context and the predicates TE's modules and tests import."""
    assert not te_dist.in_fp8_activation_recompute_phase()
    fwd, rec = te_dist.get_activation_recompute_contexts()
    assert (fwd.activation_recompute, fwd.recompute_phase, rec.recompute_phase) == (True, False, True)
    with te.autocast(enabled=True, recipe=DelayedScaling()):
        with te_dist.activation_recompute_forward(activation_recompute=True, recompute_phase=False):
            assert te_dist.is_fp8_activation_recompute_enabled()
            assert not te_dist.in_fp8_activation_recompute_phase()
    assert not te_dist.is_fp8_activation_recompute_enabled()
    te_dist.activation_recompute_forward._is_first_fp8_module.clear()
    te.checkpoint(te.Linear(16, 16, **_F32), torch.randn(8, 16, requires_grad=True), use_reentrant=False)
    assert te_dist.use_reentrant_activation_recompute() is False


def test_has_te_modules_counts_tes_classes() -> None:
    """distributed.py:620-657: LayerNorm, RMSNorm, the GEMM modules, attention and TransformerLayer are TE
    modules (TE's checkpoint path); a plain torch module is not; any other callable is assumed to be."""
    assert te_dist.has_te_modules(torch.nn.Sequential(torch.nn.Linear(2, 2), te.LayerNorm(2)))
    assert te_dist.has_te_modules(te.RMSNorm(4)) and te_dist.has_te_modules(te.Linear(4, 4))
    assert not te_dist.has_te_modules(torch.nn.Linear(2, 2))
    assert te_dist.has_te_modules(lambda t: t)


def _dpa_state(block: torch.nn.Module) -> list[np.ndarray]:
    """DotProductAttention's own delayed-scaling state (its QKV/S/O and dO/dP/dQKV slots)."""
    out = []
    for m in block.modules():
        if isinstance(m, te.DotProductAttention) and m.fwd is not None:
            out += [a.copy() for a in (m.fwd.scale, m.fwd.amax_history, m.bwd.scale, m.bwd.amax_history)]
    return out


@pytest.mark.parametrize("fp8_dpa", [False, True], ids=["gemms", "fp8_dpa"])
@pytest.mark.parametrize("use_reentrant", [True, False])
def test_transformer_layer_full_recompute_with_dropout_equals_plain(use_reentrant: bool, fp8_dpa: bool) -> None:
    """test_numerics.py:657-812 (``_test_e2e_full_recompute``), small and bit-exact: a TransformerLayer
    with hidden and attention dropout under delayed scaling, two steps; with ``fp8_dpa`` the attention's
    own FP8 state is stashed and replayed too (TE's DotProductAttention is a TE module whose
    ``prepare_forward`` does the recompute stash, dot_product_attention.py ``init_fp8_metadata``)."""
    recipe = DelayedScaling(amax_history_len=4, fp8_dpa=fp8_dpa)
    runs = []
    for ckpt in (False, True):
        FP8GlobalStateManager.reset()
        torch.manual_seed(0)
        block = te.TransformerLayer(32, 64, 2, hidden_dropout=0.1, attention_dropout=0.1, params_dtype=torch.float32)
        record = []
        for step in range(2):
            torch.manual_seed(10 + step)
            x = torch.randn(8, 2, 32, requires_grad=True)
            with te.autocast(enabled=True, recipe=recipe):
                y = te.checkpoint(block, x, use_reentrant=use_reentrant) if ckpt else block(x)
            y.sum().backward()
            grads = [p.grad.clone() for p in block.parameters()]
            record.append([y.detach(), x.grad, *grads, *_fp8_state(block), *_dpa_state(block)])
            block.zero_grad(set_to_none=True)
        runs.append(record)
    _assert_bit_equal(runs[1], runs[0])


def test_layernorm_mlp_checkpoint_opens_no_autocast_so_the_unfused_update_matches_plain(monkeypatch) -> None:
    """layernorm_mlp.py:985-1050: the selective recompute restores the autocast state with
    ``set_autocast_state`` (no new region, no extra forward update) and keeps the backward-update
    role the forward took (:917), so even the unfused update path equals the plain model."""
    monkeypatch.setenv("NVTE_UNFUSED_FP8_UPDATE", "1")
    recipe = DelayedScaling(amax_history_len=4)
    _assert_bit_equal(_steps(recipe, "module"), _steps(recipe, "plain"))
