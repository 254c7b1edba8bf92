"""TE 2.20's activation-recompute metadata rule (NVIDIA/TransformerEngine PR#3394, head 71cb312,
2.20.0.dev0).

- ``transformer_engine/pytorch/module/base.py:1635``: a delayed-scaling module in a checkpointed forward
  stashes its forward ``scale``/``amax_history`` for the recompute whether or not it is training (before:
  ``if self.training and is_fp8_activation_recompute_enabled()``), so an eval module, or one switched
  between train and eval before the backward, finds its stash in the recompute.
- ``distributed.py:750``: ``checkpoint`` under ``torch.no_grad()`` runs the function directly in the
  forward half of ``context_fn`` (no recompute will ever consume a stash).
- ``distributed.py:376``: the reentrant checkpoint enters the recompute region only if an input needs grad;
  otherwise it inherits an enclosing checkpoint's phase.

Each test is one of ``tests/pytorch/test_numerics.py`` at that head (named in its docstring), on fp8sim's
modules; "drained" is TE's ``_assert_fp8_recompute_state_drained``: one FIFO per stashing GEMM, each empty,
the live scale put back after the recompute.
"""

from __future__ import annotations

import contextlib

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

import fp8sim.pytorch as te  # noqa: E402
from fp8sim.pytorch._recompute_state import RECOMPUTE_KEY  # noqa: E402
from fp8sim.pytorch.distributed import in_fp8_activation_recompute_phase, is_fp8_activation_recompute_enabled  # noqa: E402
from fp8sim.pytorch.quantization import FP8GlobalStateManager, current_state  # noqa: E402
from fp8sim.recipe import DelayedScaling, Format  # noqa: E402

RECIPE = DelayedScaling(fp8_format=Format.HYBRID)


def _linear() -> te.Linear:
    return te.Linear(16, 16, bias=False, params_dtype=torch.float32)


def _metas(*layers: torch.nn.Module) -> list[dict]:
    return [g.__dict__.get("_recompute_fp8_meta", {}) for m in layers for g in m.fp8_gemms.values()]


def _assert_drained(*layers: torch.nn.Module) -> None:
    buffer = current_state().fp8_tensors_recompute_buffer
    metas = _metas(*layers)
    assert len(buffer) == len(metas)
    for meta in metas:
        assert RECOMPUTE_KEY in meta, "the module never stashed its forward state"
        assert len(buffer[meta[RECOMPUTE_KEY]]) == 0, "a stash was left unconsumed"
        assert torch.equal(meta["scaling_fwd"].scale, meta["updated_scale_fwd"])


def _nothing_stashed(*layers: torch.nn.Module) -> None:
    assert all(RECOMPUTE_KEY not in meta for meta in _metas(*layers))
    assert all(len(q) == 0 for q in current_state().fp8_tensors_recompute_buffer)


def _observe(log: list) -> None:
    log.append((is_fp8_activation_recompute_enabled(), in_fp8_activation_recompute_phase()))


@pytest.mark.parametrize("use_reentrant", [True, False])
@pytest.mark.parametrize("recompute_training", [True, False])
def test_checkpoint_eval_module_balances_fp8_recompute_state(recompute_training: bool, use_reentrant: bool) -> None:
    """An eval module stashes for the recompute (base.py:1635); the backward may run in either mode."""
    FP8GlobalStateManager.reset()
    layer = _linear().eval()

    def body(value: torch.Tensor) -> torch.Tensor:
        with te.autocast(enabled=True, recipe=RECIPE):
            return layer(value * 2)

    inp = torch.randn(16, 16, requires_grad=True)
    loss = te.checkpoint(body, inp, use_reentrant=use_reentrant).float().sum()
    layer.train(recompute_training)
    loss.backward()
    assert inp.grad is not None and torch.isfinite(inp.grad).all()
    assert layer.weight.grad is not None and torch.isfinite(layer.weight.grad).all()
    _assert_drained(layer)


def test_checkpoint_eval_module_recomputes_with_the_forwards_scales() -> None:
    """What the stash is for: after a step that moved the scale, an eval module's recompute casts with the
    forward's scale, so the checkpointed gradients equal the plain ones bit for bit."""
    grads = []
    for checkpointed in (False, True):
        FP8GlobalStateManager.reset()
        torch.manual_seed(0)
        layer = _linear().eval()
        x = torch.randn(16, 16)
        with te.autocast(enabled=True, recipe=RECIPE):  # step 1: a history, so step 2's scale differs from 1
            layer(x * 100)
        inp = x.clone().requires_grad_()
        with te.autocast(enabled=True, recipe=RECIPE):
            out = te.checkpoint(layer, inp) if checkpointed else layer(inp)
        out.sum().backward()
        grads.append((inp.grad, layer.weight.grad))
    for got, want in zip(grads[1], grads[0], strict=True):
        assert torch.equal(got, want)


def test_checkpoint_without_autograd_does_not_accumulate_recompute_stashes() -> None:
    """Under no_grad, checkpoint is a plain call: no recompute region, nothing stashed (distributed.py:750)."""
    FP8GlobalStateManager.reset()
    layer = _linear()
    inp = torch.randn(16, 16)
    observed: list = []

    def body(value: torch.Tensor) -> torch.Tensor:
        with te.autocast(enabled=True, recipe=RECIPE):
            _observe(observed)
            return layer(value)

    with torch.no_grad():
        for _ in range(3):
            assert torch.isfinite(te.checkpoint(body, inp)).all()
    _nothing_stashed(layer)
    assert observed == [(False, False)] * 3


def test_reentrant_checkpoint_without_grad_input_does_not_stash_fp8_metadata() -> None:
    """No input needs grad: no backward can reach the checkpoint, so no region and no stash
    (distributed.py:376); with a grad input the usual forward/recompute pair follows and drains."""
    FP8GlobalStateManager.reset()
    layer = _linear()
    observed: list = []

    def body(value: torch.Tensor) -> torch.Tensor:
        with te.autocast(enabled=True, recipe=RECIPE):
            _observe(observed)
            return layer(value)

    layer.weight.requires_grad_(False)  # nothing at all needs grad: the output must not either
    inp = torch.randn(16, 16)
    with torch.enable_grad():
        for _ in range(3):
            out = te.checkpoint(body, inp, use_reentrant=True)
            assert torch.isfinite(out).all() and not out.requires_grad
    layer.weight.requires_grad_(True)
    _nothing_stashed(layer)
    assert observed == [(False, False)] * 3
    valid = torch.randn(16, 16, requires_grad=True)
    te.checkpoint(body, valid, use_reentrant=True).float().sum().backward()
    assert valid.grad is not None and torch.isfinite(valid.grad).all()
    assert layer.weight.grad is not None and torch.isfinite(layer.weight.grad).all()
    assert observed[-2:] == [(True, False), (True, True)]
    _assert_drained(layer)


def test_ineligible_reentrant_checkpoint_preserves_outer_recompute_context() -> None:
    """An inner reentrant checkpoint of a detached input inherits the outer checkpoint's phase: it stashes in
    the outer forward and replays in the outer recompute."""
    FP8GlobalStateManager.reset()
    inner, tail = _linear(), _linear()
    observed: list = []

    def inner_body(value: torch.Tensor) -> torch.Tensor:
        _observe(observed)
        return inner(value)

    def outer_body(value: torch.Tensor) -> torch.Tensor:
        with te.autocast(enabled=True, recipe=RECIPE):
            inner_out = te.checkpoint(inner_body, value.detach(), use_reentrant=True)
            return tail(value + inner_out)

    inp = torch.randn(16, 16, requires_grad=True)
    te.checkpoint(outer_body, inp, use_reentrant=False).float().sum().backward()
    assert observed == [(True, False), (True, True)]
    assert inp.grad is not None and torch.isfinite(inp.grad).all()
    assert inner.weight.grad is None
    assert tail.weight.grad is not None and torch.isfinite(tail.weight.grad).all()
    _assert_drained(inner, tail)


def test_checkpoint_without_autograd_preserves_forward_context() -> None:
    """The direct path under no_grad still enters ``context_fn``'s forward context (here: enable_grad)."""
    FP8GlobalStateManager.reset()
    layer = _linear().eval()
    inp = torch.randn(16, 16, requires_grad=True)

    def body(value: torch.Tensor) -> torch.Tensor:
        with te.autocast(enabled=True, recipe=RECIPE):
            return layer(value)

    with torch.no_grad():
        out = te.checkpoint(body, inp, context_fn=lambda: (torch.enable_grad(), contextlib.nullcontext()))
    assert out.requires_grad
    out.float().sum().backward()
    assert inp.grad is not None and torch.isfinite(inp.grad).all()
    assert layer.weight.grad is not None and torch.isfinite(layer.weight.grad).all()
    _nothing_stashed(layer)
