"""TE's ``_GroupedLinear`` autograd function: one node for all the splits of a ``GroupedLinear``.

Each split runs the forward of the module linear (:mod:`._linear_function`) as a TE ``Linear`` would, on a
stand-in context (:class:`SplitCtx`), at the point of the module's forward where it always ran, so every
quantization, scale update and rounding is that of a separate linear per split; the grouped node then
carries the backward: the gradient's rows are split as ``torch.cat``'s backward splits them and each split's
backward runs, last split first (the order in which autograd ran the separate nodes).

What the node shows is TE's (``module/grouped_linear.py`` ``_GroupedLinear.forward``, d0067d0 lines 893-1000):
``backward_override``, ``fp8`` and ``reduce_and_update_bwd_fp8_tensors`` on the ``grad_fn`` and, under a
``backward_override``, the saved tensors ``[*inputmats, *weights_fp8, *saved_weights, *biases]`` through
``prepare_for_saving`` (``grad_fn.tensor_objects``): "dequantized" keeps each split's rowwise FP8 input and
weight (an empty split's as empty storages), "high_precision" the original input in slot 0 (TE forces
``save_original_input``), the other input slots None, and the weights in ``saved_weights``.
"""

from __future__ import annotations

from typing import Any

import torch

from ...recipe import CustomRecipe, DelayedScaling
from ..tensor.quantized_tensor import prepare_for_saving, restore_from_saved

__all__ = ["SplitCtx", "grouped_linear"]


class SplitCtx:
    """The autograd context of one split: what ``Function.forward`` / ``backward`` read and write on theirs
    (``save_for_backward``, ``saved_tensors``, ``needs_input_grad`` as autograd would set it)."""

    def __init__(self) -> None:
        self.fn: Any = None
        self.args: tuple = ()
        self._saved: tuple = ()
        self.needs_input_grad: tuple = ()

    def run(self, fn: Any, args: tuple) -> torch.Tensor:
        """``fn.forward(self, *args)`` without recording a graph (the grouped node records it)."""
        grad = torch.is_grad_enabled()
        self.fn, self.args = fn, args
        self.needs_input_grad = tuple(grad and isinstance(a, torch.Tensor) and a.requires_grad for a in args)
        with torch.no_grad():
            return fn.forward(self, *args)

    def save_for_backward(self, *tensors: Any) -> None:
        self._saved = tensors

    @property
    def saved_tensors(self) -> tuple:
        return self._saved


class _Empty:
    """A split of no rows: its output has no rows, its gradients are zeros (as ``F.linear``'s)."""

    def __init__(self, args: tuple) -> None:
        self.args = args


class _GroupedLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, state: dict, *tensors: Any) -> torch.Tensor:
        subs = state["subs"]
        out = torch.cat(state.pop("outs"))
        inp = state["inp"]
        override = state["override"]
        ctx.state, ctx.num_gemms, ctx.m_splits = state, len(subs), state["splits"]
        ctx.backward_override, ctx.activation_dtype = override, state["act"]
        ctx.fp8 = state["fp8"] and override is None
        ctx.reduce_and_update_bwd_fp8_tensors = ctx.fp8 and any(getattr(s, "first", False) for s in subs)
        ctx.use_bias = state["use_bias"]
        if override is not None:
            _save_layout(ctx, state)
        for key in ("inp", "module", "recipe"):  # the backward needs none of them: hold no memory
            state.pop(key)
        return out.view(*inp.shape[:-1], out.shape[-1])  # TE: the view inside the function

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple:
        state = ctx.state
        subs = state["subs"]
        n = len(subs)
        if ctx.backward_override is not None:
            _hand_out_saved(ctx, state)
        parts = torch.split(grad_out.reshape(-1, grad_out.shape[-1]), state["splits"])
        grads: list = [None] * (3 * n)
        for i in reversed(range(n)):  # autograd ran the separate nodes last-created first
            sub = subs[i]
            if isinstance(sub, _Empty):
                g = tuple(None if a is None else torch.zeros_like(a) for a in sub.args)
            else:
                g = sub.fn.backward(sub, parts[i])
            grads[i], grads[n + i], grads[2 * n + i] = g[0], g[1], g[2]
        return (None, *grads)


def _empty_storages(state: dict, i: int, x: torch.Tensor, w: torch.Tensor) -> tuple[Any, Any]:
    """An empty split's input (no rows) and weight as TE's split quantization leaves them: rowwise
    storages from the GEMM's quantizers (a stateful or custom recipe: the plain tensors)."""
    from ..tensor.quantized_tensor import QuantizedTensor
    from ..tensor.storage.quantized_tensor_storage import as_storage

    recipe = state["recipe"]
    if recipe is None or isinstance(recipe, (DelayedScaling, CustomRecipe)):
        return x.detach(), w.detach()
    if isinstance(w, QuantizedTensor):  # an FP8 weight parameter: its own storage
        return x.detach(), as_storage(w)
    fwd = state["module"].quantizers["scaling_fwd"]
    qx, qw = fwd[3 * i].copy(), fwd[3 * i + 1].copy()
    qx.set_usage(rowwise=True, columnwise=False)
    qw.set_usage(rowwise=True, columnwise=False)
    x_st = as_storage(qx.make_empty(tuple(x.shape), dtype=x.dtype, device=x.device))
    return x_st, as_storage(qw.quantize_impl(w.detach()))


def _save_layout(ctx: Any, state: dict) -> None:
    """TE's saved tensors under a ``backward_override`` (grouped_linear.py 893-937)."""
    subs, override = state["subs"], state["override"]
    inputs, weights, origin, biases = [], [], [], []
    for i, sub in enumerate(subs):
        if isinstance(sub, _Empty):
            x, w, b = sub.args
            x_st, w_st = _empty_storages(state, i, x, w)
            w_orig = w
        else:
            x_st, w_st, w_orig, b = restore_from_saved(sub.tensor_objects, list(sub.saved_tensors))
            sub.tensor_objects = None
            sub.save_for_backward()
        inputs.append(x_st)
        weights.append(w_st)
        origin.append(w_orig.detach() if override == "high_precision" and state["inp"].requires_grad else None)
        biases.append(b)
    if override == "high_precision":  # TE: save_original_input, the whole input in the first slot
        inputs = [state["inp"].detach()] + [None] * (len(subs) - 1)
    tensors, ctx.tensor_objects = prepare_for_saving(*inputs, *weights, *origin, *biases)
    ctx.save_for_backward(*tensors)


def _hand_out_saved(ctx: Any, state: dict) -> None:
    """Each split's ``(input, weight, original weight, bias)`` from the saved tensors, for its backward."""
    subs = state["subs"]
    n = len(subs)
    saved = restore_from_saved(ctx.tensor_objects, list(ctx.saved_tensors))
    if ctx.backward_override == "high_precision":
        x = saved[0]
        xs = torch.split(x.reshape(-1, x.shape[-1]), state["splits"])
    else:
        xs = saved[:n]
    for i, sub in enumerate(subs):
        if not isinstance(sub, _Empty):
            w_orig = saved[2 * n + i] if saved[2 * n + i] is not None else sub.weight
            sub.saved_operands = (xs[i], saved[n + i], w_orig, saved[3 * n + i])


def grouped_linear(module: Any, inp: torch.Tensor, splits: list[int], is_first_microbatch: Any) -> torch.Tensor:
    """``cat_i(inp_i W_i^T + b_i)`` of ``module`` (a ``GroupedLinear``) over the row ``splits`` as one node."""
    from ..quantization import current_state, get_recipe

    st = current_state()
    recipe = get_recipe() if st.enabled else None
    x = inp.reshape(-1, inp.shape[-1])
    act = module._activation_dtype(inp)
    subs, outs, args = [], [], []
    for i, part in enumerate(torch.split(x, splits)):
        w = getattr(module, f"weight{i}")
        b = getattr(module, f"bias{i}") if module.use_bias and module.apply_bias else None
        if part.shape[0] == 0:  # nothing to quantize: no rows out, zero gradients
            sub = _Empty((part.to(act), w.to(act), None if b is None else b.to(act)))
            outs.append(torch.empty(0, module.out_features, dtype=act, device=x.device))
        else:
            sub = SplitCtx()
            outs.append(module._linear(f"gemm{i}", part, w, b, is_first_microbatch, None, w, split_ctx=sub))
        subs.append(sub)
        args.append(sub.args[:3])
        if isinstance(sub, SplitCtx):
            # the node's inputs; the split's context keeps what its forward saved, as autograd's, and the weight
            # (TE saves it for "high_precision" only when the input needs a gradient; the backward reads it)
            sub.weight, sub.args = sub.args[1], ()
    state = {
        "subs": subs, "outs": outs, "splits": list(splits), "inp": inp, "act": act, "module": module,
        "recipe": recipe, "fp8": st.enabled, "use_bias": module.use_bias,
        "override": getattr(recipe, "backward_override", None),
    }  # fmt: skip
    xs, ws, bs = zip(*args, strict=True)
    return _GroupedLinear.apply(state, *xs, *ws, *bs)
