"""FP8 primary weights (``quantized_model_init``) under FSDP2 on 2 gloo ranks (issue 16, item 4).

TE gathers a ``Float8Tensor`` parameter as its uint8 codes (TE ``tensor/float8_tensor.py``
``fsdp_pre_all_gather`` / ``fsdp_post_all_gather``, lines 938-1047 at d0067d0) and, for current
scaling, MAX-reduces the amax of the optimizer's in-place re-quantization over the mesh (line 963,
``update_quantized`` line 300), so every shard of a weight has one ``_scale_inv``.  One spawn runs
every check; the oracle is a single-process model built the same way (same seed, same quantized
weights), trained on the ranks' micro-batches with gradient accumulation ``(g_0 + g_1) / 2``
(FSDP2's averaging for 2 ranks: one exact addition, a division by a power of two).

- Float8CurrentScaling: the ranks see different micro-batches.  Losses, the reduce-scattered
  gradient shards, the weight codes and ``_scale_inv`` of every shard after every step are
  bit-identical to the reference's rows.
- The same Float8CurrentScaling run with ``fully_shard`` on the root alone (not resharded after
  forward: TE gathers rowwise plus the quantizer's columnwise usage once, line 985).
- DelayedScaling: both ranks see the same micro-batch and the reference takes one pass per step.
  The reference cannot take two passes over different micro-batches: each pass rolls the amax
  history, so its scales follow another trajectory than one pass per rank with a MAX-reduced amax.
- The all-gather payload: every ``all_gather_single`` FSDP2 issues carries uint8, as many bytes as
  the shard's FP8 codes plus 4 per float32 bias element (a high-precision gather would send 4 per
  weight element); the unsharded weight is a ``Float8Tensor`` whose codes and scale are the
  reference's.
- MXFP8BlockScaling and Float8BlockScaling (128x128 weight blocks), per layer and (MXFP8) root-only:
  the same bit-identity of losses, gradient shards and every buffer of every weight shard (TE's shard
  layouts written out in ``_rows``); each all-gather carries uint8, exactly the shard's codes plus its
  scales with the row padding removed (TE ``mxfp8_tensor.py`` pre/post all-gather lines 606-757,
  ``float8_blockwise_tensor.py`` lines 603-662: 128x128 rowwise only); the unsharded weight is an
  ``MXFP8Tensor`` / ``Float8BlockwiseQTensor`` with the reference's codes and scales.  Shards not
  aligned to the scale blocks and 1x128 weights raise NotImplementedError at ``fully_shard`` (TE falls
  back to a high-precision gather, or refuses 1x128 in ``fsdp_pre_all_gather``).  MXFP8 per phase
  (``_te_mx_payload``): resharded after forward, the forward gathers rowwise codes and scales only and
  the backward columnwise ones only (the modules take the dgrad operand in the backward, as TE does);
  the root alone gathers both once.  A checkpointed (recomputed) MXFP8 layer resharded after forward
  raises TE's missing-rowwise error; with ``reshard_after_forward=False`` it trains as one process.
- NVFP4BlockScaling (16x16 weight tiles, TE ``nvfp4_tensor.py`` pre/post all-gather lines 579-717 at
  d0067d0): both ranks see the same micro-batch (as DelayedScaling: the gradients' stochastic rounding
  draws per quantizer call, so two passes per step would draw other bits); losses, gradient shards,
  every shard buffer (packed codes, E4M3 scales, amaxes) bit-identical; each all-gather carries uint8,
  exactly the shard's packed FP4 bytes plus its rowwise E4M3 scales (row padding removed; the amax is
  metadata, the columnwise copy is made after the gather); shards of rows not a multiple of 16 and
  1x16 weights (no 2D quantization) raise NotImplementedError at ``fully_shard``.
- TE's meta-device flow, every recipe (``<recipe>/meta``; TE ``tests/pytorch/distributed/fsdp2_tests/
  run_fsdp2_model.py`` lines 285-306, ``module/base.py`` ``reset_parameters`` lines 1813-1880): the model
  is built on ``device="meta"`` inside ``quantized_model_init``, ``fully_shard``-ed, ``to_empty(device=
  "cpu")``, then ``reset_parameters()`` initialises each rank's shard (``_local_init``: different values
  and amaxes per rank) and quantizes it (current scaling, NVFP4: amax MAX-reduced over the mesh).  The
  reference is the one-process model whose ``init_method`` writes the ranks' shards stacked
  (``_whole_init``); the same checks as above, and the high-precision init value is the rank's shard.
- ``preserve_high_precision_init_val``: FSDP2 replaces the parameters; TE's own FSDP2 test carries
  the parameter attributes across (``tests/pytorch/distributed/fsdp2_tests/fsdp2_utils.py``
  ``save_custom_attrs``/``restore_custom_attrs``) and so does this one: the value is the
  initialisation of the same modules built without ``quantized_model_init``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")
dist = require("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

from _dist import ranks  # noqa: E402
from torch import nn  # noqa: E402

STEPS, LOCAL_BATCH, LR = 3, 8, 0.5
RECIPES = ("Float8CurrentScaling", "DelayedScaling", "MXFP8BlockScaling", "Float8BlockScaling", "NVFP4BlockScaling")
SAME_BATCH = ("DelayedScaling", "NVFP4BlockScaling")  # see the module docstring
ROOT_ONLY = "Float8CurrentScaling/root-only"  # fully_shard on the root alone
MX_ROOT_ONLY = "MXFP8BlockScaling/root-only"
META = tuple(f"{name}/meta" for name in RECIPES)  # TE's meta-device flow (module docstring)
RUNS = (*RECIPES, ROOT_ONLY, MX_ROOT_ONLY, *META)
# in, hidden, out: every weight's dim-0 shard on 2 ranks is a multiple of the scale blocks
# (32 rows for MXFP8, 128 for 128x128 blocks); a per-tensor recipe takes any size
DIMS = {"MXFP8BlockScaling": (32, 64, 64), "Float8BlockScaling": (128, 256, 256), "NVFP4BlockScaling": (48, 64, 32)}
BLOCK_CLASS = {
    "MXFP8BlockScaling": "MXFP8Tensor",
    "Float8BlockScaling": "Float8BlockwiseQTensor",
    "NVFP4BlockScaling": "NVFP4Tensor",
}


def _dims(recipe_name: str | None) -> tuple[int, int, int]:
    return DIMS.get((recipe_name or "").split("/")[0], (32, 64, 32))


def _recipe(name: str):
    from fp8sim import recipe as R

    return getattr(R, name.split("/")[0])()


def _shard_values(shape: tuple[int, ...], rank: int) -> torch.Tensor:
    """The weight shard rank ``rank`` initialises in the meta-device runs (its own values and amax)."""
    g = torch.Generator().manual_seed(1000 * rank + shape[0] + 7 * shape[1])
    return torch.randn(shape, generator=g) * (0.02 * (1 + 3 * rank))


def _local_init(w: torch.Tensor) -> None:
    """TE's meta-device flow: ``reset_parameters`` initialises each rank's local shard."""
    w.copy_(_shard_values(tuple(w.shape), dist.get_rank()))


def _whole_init(world: int):
    """The one-process reference of :func:`_local_init`: the ranks' shards stacked by rows."""

    def init(w: torch.Tensor) -> None:
        w.copy_(torch.cat([_shard_values((w.shape[0] // world, *w.shape[1:]), r) for r in range(world)]))

    return init


def _model(
    recipe_name: str | None, dims: tuple[int, int, int] = (32, 64, 32), init=None, device: str | None = None
) -> nn.Module:
    import fp8sim.pytorch as te

    torch.manual_seed(0)
    d_in, hidden, d_out = dims
    kw = {} if init is None else {"init_method": init}
    if device is not None:
        kw["device"] = device
    if recipe_name is None:
        return nn.Sequential(te.Linear(d_in, hidden, bias=True), nn.ReLU(), te.Linear(hidden, d_out, bias=False))
    with te.quantized_model_init(recipe=_recipe(recipe_name), preserve_high_precision_init_val=True):
        return nn.Sequential(
            te.Linear(d_in, hidden, bias=True, **kw), nn.ReLU(), te.Linear(hidden, d_out, bias=False, **kw)
        )


def _data(step: int, rank: int, dims: tuple[int, int, int] = (32, 64, 32)) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    batch = LOCAL_BATCH if dims[0] != 16 * 3 else 16  # NVFP4 (dims 48, ...): wgrad needs 16-row batches
    x = torch.randn(batch, dims[0], generator=g) * (1 + 3 * rank)  # the micro-batches have different amaxes
    return x, torch.randn(batch, dims[2], generator=g)


def _step(model: nn.Module, recipe, x: torch.Tensor, y: torch.Tensor, group=None) -> torch.Tensor:
    import fp8sim.pytorch as te

    with te.autocast(recipe=recipe, amax_reduction_group=group):
        out = model(x)
    loss = nn.functional.mse_loss(out, y)
    loss.backward()
    return loss


def _state(p: torch.Tensor) -> dict:
    """Codes and scales of a Float8Tensor / block-scaled tensor (or the values of a plain tensor), as
    numpy (``.numpy()`` on a clone: on the parameter's own buffer it would pin the storage)."""
    if hasattr(p, "_data") and p._data is not None:
        return {"codes": p._data.clone().numpy(), "scale_inv": p._scale_inv.clone().numpy()}
    if hasattr(p, "_rowwise_scale_inv"):
        out = {}
        for usage in ("rowwise", "columnwise"):
            if getattr(p, f"_{usage}_data") is not None:
                out[f"{usage}_codes"] = getattr(p, f"_{usage}_data").clone().numpy()
                out[f"{usage}_scale_inv"] = getattr(p, f"_{usage}_scale_inv").clone().numpy()
                if hasattr(p, f"_amax_{usage}"):  # NVFP4: the float32 global amax
                    out[f"{usage}_amax"] = getattr(p, f"_amax_{usage}").clone().numpy()
        return out
    return {"values": p.detach().clone().numpy()}


def _pad(a: np.ndarray, axis: int, multiple: int) -> np.ndarray:
    widths = [(0, 0)] * a.ndim
    widths[axis] = (0, -a.shape[axis] % multiple)
    return np.pad(a, widths)


def _rows(full: dict, rank: int, world: int) -> dict:
    """The shard ``rank`` holds of a parameter state (dim-0 rows), in TE's layouts written out here:
    MXFP8 (TE ``mxfp8_tensor.py`` ``split`` lines 422-510 at d0067d0) scale rows per 32 rows, re-padded
    to 128 (rowwise) / 4 (columnwise); 128x128 blocks: one rowwise scale row per 128 rows, the
    transposed columnwise codes and scale grid split along their dim 1 (scale columns re-padded to 4)."""
    if "rowwise_codes" not in full:
        return {k: v if k == "scale_inv" else np.array_split(v, world, axis=0)[rank] for k, v in full.items()}
    rows = full["rowwise_codes"].shape[0]
    ms = rows // world
    sl = slice(rank * ms, (rank + 1) * ms)
    mx = full["rowwise_scale_inv"].dtype == np.uint8
    if "rowwise_amax" in full:  # NVFP4 (TE nvfp4_tensor.py pre/post all-gather lines 579-717 at d0067d0)
        return _nvfp4_rows(full, sl, rank, ms)
    out = {"rowwise_codes": full["rowwise_codes"][sl]}
    if mx:
        out["rowwise_scale_inv"] = _pad(full["rowwise_scale_inv"][sl], 0, 128)
        if "columnwise_codes" in full:
            out["columnwise_codes"] = full["columnwise_codes"][sl]
            b = slice(rank * ms // 32, (rank + 1) * ms // 32)
            out["columnwise_scale_inv"] = _pad(full["columnwise_scale_inv"][b], 0, 4)
        return out
    b = slice(rank * ms // 128, (rank + 1) * ms // 128)
    out["rowwise_scale_inv"] = full["rowwise_scale_inv"][b]
    if "columnwise_codes" in full:
        out["columnwise_codes"] = full["columnwise_codes"][:, sl]
        out["columnwise_scale_inv"] = _pad(full["columnwise_scale_inv"][:, b], 1, 4)
    return out


def _nvfp4_rows(full: dict, sl: slice, rank: int, ms: int) -> dict:
    """NVFP4 shard: packed codes (2 per byte) and E4M3 scales split by rows (scale rows re-padded to 128),
    the columnwise (K, M/2) codes and (K, M/16) scales split along dim 1 (scale columns re-padded to 4),
    the amaxes (one per tensor) kept whole."""
    out = {"rowwise_codes": full["rowwise_codes"][sl], "rowwise_amax": full["rowwise_amax"]}
    out["rowwise_scale_inv"] = _pad(full["rowwise_scale_inv"][sl], 0, 128)
    if "columnwise_codes" in full:
        out["columnwise_codes"] = full["columnwise_codes"][:, rank * ms // 2 : (rank + 1) * ms // 2]
        tiles = slice(rank * ms // 16, (rank + 1) * ms // 16)
        out["columnwise_scale_inv"] = _pad(full["columnwise_scale_inv"][:, tiles], 1, 4)
        out["columnwise_amax"] = full["columnwise_amax"]
    return out


def _payloads(recipe_name: str, model: nn.Module, world: int, per_layer: bool) -> list[int]:
    """The bytes one all-gather may carry (TE's ``fsdp_pre_all_gather``): a weight's shard codes (1 byte
    each) and scales with their row padding removed, plus 4 per float32 bias element; per-tensor
    recipes send their codes only (the scale travels as metadata).  A high-precision gather would
    send 4 bytes per weight element."""
    per_layer_bytes = []
    for layer in (model[0], model[2]):
        n, k = layer.weight.shape
        ms = n // world
        bias = 4 * ms if "bias" in dict(layer.named_parameters()) else 0
        base = recipe_name.split("/")[0]
        if base == "MXFP8BlockScaling":
            row = ms * k + ms * (-(-(k // 32) // 4) * 4)
            col = ms * k + (ms // 32) * (-(-k // 128) * 128)
            per_layer_bytes.append((row + bias, col + bias, row + col + bias))
        elif base == "NVFP4BlockScaling":  # packed FP4 bytes + rowwise E4M3 scales; amax is metadata
            per_layer_bytes.append((ms * k // 2 + ms * (-(-(k // 16) // 4) * 4) + bias,))
        elif base == "Float8BlockScaling":
            row = ms * k + 4 * (ms // 128) * (-(-((k + 127) // 128) // 4) * 4)
            per_layer_bytes.append((row + bias,))
        else:
            per_layer_bytes.append((ms * k + bias,))
    if per_layer:
        return [b for options in per_layer_bytes for b in options]
    return [sum(options[-1] for options in per_layer_bytes)]  # one all-gather for the root's group


def _buffer_of(t: torch.Tensor, sent: torch.Tensor) -> tuple[str, tuple[int, ...]]:
    """The name of the buffer of ``t`` that ``sent`` views (same storage and start), and its shape."""
    for key in ("rowwise_data", "rowwise_scale_inv", "columnwise_data", "columnwise_scale_inv"):
        buf = getattr(t, "_" + key)
        if buf is not None and buf.data_ptr() == sent.data_ptr() and buf.dtype == sent.dtype:
            return key, tuple(sent.shape)
    return "?", tuple(sent.shape)


def _fsdp_run(recipe_name: str, rank: int, world: int, per_layer: bool = True) -> dict:
    from torch.distributed.fsdp import fully_shard

    same_batch = recipe_name.split("/")[0] in SAME_BATCH
    recipe = _recipe(recipe_name)
    dims = _dims(recipe_name)
    meta = recipe_name.endswith("/meta")
    model = _model(recipe_name, dims, _local_init, "meta") if meta else _model(recipe_name, dims)
    attrs = {n: {k: v for k, v in vars(p).items() if not k.startswith("_")} for n, p in model.named_parameters()}
    for layer in model if per_layer else ():  # per layer: resharded after forward, gathered again in backward
        if list(layer.parameters()):
            fully_shard(layer)
    fully_shard(model)  # the root alone: not resharded after forward (rowwise + columnwise gathered once)
    for n, p in model.named_parameters():  # TE fsdp2_utils.restore_custom_attrs
        for k, v in attrs[n].items():
            setattr(p, k, v)
    if meta:  # TE run_fsdp2_model.py: materialise and initialise the shards after fully_shard
        model.to_empty(device="cpu")
        for module in model.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
    hp_init = {n: p.get_high_precision_init_val().numpy().copy() for n, p in model.named_parameters() if "weight" in n}

    gathers: list[tuple[str, int]] = []
    name = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
    original = getattr(dist, name)

    def counting(output, inp, *args, **kwargs):  # the phase from autograd: inside a backward or not
        gathers.append((str(inp.dtype), inp.numel(), torch._C._current_graph_task_id() != -1))
        return original(output, inp, *args, **kwargs)

    from fp8sim.pytorch.tensor import MXFP8Tensor

    sent: list[tuple[bool, tuple, list]] = []
    pre_all_gather = MXFP8Tensor.fsdp_pre_all_gather

    def recording(self, mesh, outer_size, outer_stride, module, mp_policy):  # FSDP2 checks the signature
        inputs, metadata = pre_all_gather(self, mesh, outer_size, outer_stride, module, mp_policy)
        sent.append((torch._C._current_graph_task_id() != -1, tuple(self.shape), [_buffer_of(self, t) for t in inputs]))
        return inputs, metadata

    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses, grads, params = [], [], []
    setattr(dist, name, counting)
    MXFP8Tensor.fsdp_pre_all_gather = recording
    try:
        for step in range(STEPS):
            x, y = _data(step, 0 if same_batch else rank, dims)
            losses.append(_step(model, recipe, x, y, dist.group.WORLD).item())
            grads.append([p.grad._local_tensor.numpy().copy() for p in model.parameters()])
            opt.step()
            opt.zero_grad()
            params.append([_state(p._local_tensor) for p in model.parameters()])
    finally:
        setattr(dist, name, original)
        MXFP8Tensor.fsdp_pre_all_gather = pre_all_gather
    shard_bytes = _payloads(recipe_name, model, world, per_layer)
    shard_shapes = [tuple(m.weight._local_tensor.shape) for m in (model[0], model[2])]
    weights = [p._local_tensor for n, p in model.named_parameters() if "weight" in n]
    resizable = all(
        getattr(w, "_data", getattr(w, "_rowwise_data", None)).untyped_storage().resizable() for w in weights
    )
    for unit in (model[0], model[2]) if per_layer else (model,):
        unit.unshard()
    unsharded = [(type(m.weight).__name__, _state(m.weight)) for m in (model[0], model[2])]
    return {
        "losses": losses,
        "grads": grads,
        "params": params,
        "gathers": gathers,
        "sent": sent,
        "shard_bytes": shard_bytes,
        "shard_shapes": shard_shapes,
        "unsharded": unsharded,
        "hp_init": hp_init,
        "storage_resizable": resizable,
    }


def _reference_run(recipe_name: str, world: int) -> dict:
    same_batch = recipe_name.split("/")[0] in SAME_BATCH
    recipe = _recipe(recipe_name)
    dims = _dims(recipe_name)
    model = (
        _model(recipe_name, dims, _whole_init(world)) if recipe_name.endswith("/meta") else _model(recipe_name, dims)
    )
    hp_init = {n: p.get_high_precision_init_val().numpy().copy() for n, p in model.named_parameters() if "weight" in n}
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses, grads, params = [], [], []
    for step in range(STEPS):
        if same_batch:
            losses.append([_step(model, recipe, *_data(step, 0, dims)).item()] * world)
            grads.append([p.grad.numpy().copy() for p in model.parameters()])
        else:
            micro, step_losses = [], []
            for r in range(world):
                step_losses.append(_step(model, recipe, *_data(step, r, dims)).item())
                micro.append([p.grad.clone() for p in model.parameters()])
                opt.zero_grad()
            for p, g0, g1 in zip(model.parameters(), *micro, strict=True):
                p.grad = (g0 + g1) / 2
            losses.append(step_losses)
            grads.append([p.grad.numpy().copy() for p in model.parameters()])
        opt.step()
        opt.zero_grad()
        params.append([_state(p) for p in model.parameters()])
    plain = {n: p.detach().numpy().copy() for n, p in _model(None, dims).named_parameters() if "weight" in n}
    return {"losses": losses, "grads": grads, "params": params, "hp_init": hp_init, "plain_init": plain}


def _worker(rank: int, world: int) -> dict:
    out = {}
    for recipe_name in RECIPES:
        out[recipe_name, "fsdp"] = _fsdp_run(recipe_name, rank, world)
        out[recipe_name, "reference"] = _reference_run(recipe_name, world)  # same process, same threads
    out[ROOT_ONLY, "fsdp"] = _fsdp_run("Float8CurrentScaling", rank, world, per_layer=False)
    out[ROOT_ONLY, "reference"] = out["Float8CurrentScaling", "reference"]
    out[MX_ROOT_ONLY, "fsdp"] = _fsdp_run("MXFP8BlockScaling", rank, world, per_layer=False)
    out[MX_ROOT_ONLY, "reference"] = out["MXFP8BlockScaling", "reference"]
    for recipe_name in META:
        out[recipe_name, "fsdp"] = _fsdp_run(recipe_name, rank, world)
        out[recipe_name, "reference"] = _reference_run(recipe_name, world)
    out["refusals"] = _refusals()
    out["recompute"] = _recompute(rank)
    return out


class _Checkpointed(nn.Sequential):
    """Linear, ReLU, Linear with the first Linear under ``te.checkpoint`` (its forward recomputed in the backward)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import fp8sim.pytorch as te

        return self[2](self[1](te.checkpoint(self[0], x)))


def _recompute(rank: int) -> dict:
    """MXFP8 primary weights, the first layer checkpointed, one step on the same micro-batch on both ranks:
    resharded after forward (the default), the recompute finds only the backward's columnwise gather and
    raises TE's error; with ``reshard_after_forward=False`` it trains, the loss, input gradient and weight
    gradient shards equal to the one-process checkpointed run's."""
    from torch.distributed.fsdp import fully_shard

    dims = _dims("MXFP8BlockScaling")
    recipe = _recipe("MXFP8BlockScaling")
    out: dict = {}
    for name, reshard in (("resharded", True), ("kept", False)):
        models = [_Checkpointed(*_model("MXFP8BlockScaling", dims)) for _ in range(2)]
        for layer in (models[0][0], models[0][2]):
            fully_shard(layer, reshard_after_forward=reshard)
        fully_shard(models[0])
        runs = []
        try:
            for model in models:
                x, y = _data(0, 0, dims)
                x.requires_grad_()
                loss = _step(model, recipe, x, y)
                grads = [getattr(p.grad, "_local_tensor", p.grad).numpy().copy() for p in model.parameters()]
                runs.append((loss.item(), x.grad.numpy().copy(), grads))
            out[name] = runs
        except RuntimeError as e:
            out[name] = f"RuntimeError: {e}"
    return out


REFUSED = {  # recipe, dims (in, hidden, out), what the NotImplementedError names
    "MXFP8, 16-row shards": ("MXFP8BlockScaling", (32, 64, 32), "MXFP8Tensor under FSDP2"),
    "128x128 blocks, 64-row shards": ("Float8BlockScaling", (128, 128, 128), "Float8BlockwiseQTensor under FSDP2"),
    "1x128 blocks": ("Float8BlockScaling/1d", (128, 256, 256), "FSDP2 is only supported for Float8BlockwiseQTensors"),
    "NVFP4, 8-row shards": ("NVFP4BlockScaling", (32, 32, 16), "NVFP4Tensor under FSDP2: FSDP2 requires shard_M (8)"),
    "NVFP4 1x16 weights": ("NVFP4BlockScaling/1d", (32, 32, 32), "columnwise usage requires 2D quantization"),
}


def _refusals() -> dict:
    """``fully_shard`` of weights whose shards do not align to the scale blocks (or 1x128 weights):
    the NotImplementedError's message, or what happened instead."""
    from torch.distributed.fsdp import fully_shard

    import fp8sim.pytorch as te
    from fp8sim import recipe as R

    out = {}
    for case, (recipe_name, dims, _) in REFUSED.items():
        torch.manual_seed(0)
        if recipe_name == "NVFP4BlockScaling/1d":
            rec = R.NVFP4BlockScaling(disable_2d_quantization=True)
        elif recipe_name.endswith("/1d"):
            rec = R.Float8BlockScaling(w_block_scaling_dim=1)
        else:
            rec = _recipe(recipe_name)
        with te.quantized_model_init(recipe=rec):
            model = nn.Sequential(te.Linear(dims[0], dims[1]), nn.ReLU(), te.Linear(dims[1], dims[2]))
        try:
            for layer in (model[0], model[2]):
                fully_shard(layer)
            fully_shard(model)
            model(torch.randn(LOCAL_BATCH, dims[0]))
            out[case] = "no error; weight classes " + ", ".join(
                type(p._local_tensor).__name__ for p in model.parameters()
            )
        except NotImplementedError as e:
            out[case] = f"NotImplementedError: {e}"
    return out


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return ranks(_worker, world_size=2)


def _same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    bad = np.flatnonzero(got.ravel() != want.ravel()) if got.shape == want.shape else [0]
    assert got.shape == want.shape and len(bad) == 0, (
        f"{what}: shape {got.shape} vs {want.shape}, first difference at {bad[0]}: "
        f"{got.ravel()[bad[0]]!r} vs {want.ravel()[bad[0]]!r}"
    )


@pytest.mark.parametrize("recipe_name", RUNS)
def test_fsdp2_fp8_weights_train_bit_identically_to_one_process(results: list[dict], recipe_name: str) -> None:
    world = len(results)
    for rank, res in enumerate(results):
        run, ref = res[recipe_name, "fsdp"], res[recipe_name, "reference"]
        for step in range(STEPS):
            assert run["losses"][step] == ref["losses"][step][rank], f"rank {rank} step {step}: loss"
            for i, (got, want) in enumerate(zip(run["grads"][step], ref["grads"][step], strict=True)):
                _same(got, np.array_split(want, world, axis=0)[rank], f"rank {rank} step {step} grad {i}")
            for i, (got, want) in enumerate(zip(run["params"][step], ref["params"][step], strict=True)):
                want = _rows(want, rank, world)
                assert got.keys() == want.keys(), f"param {i}: {sorted(got)} vs {sorted(want)}"
                for k in got:
                    _same(got[k], want[k], f"{recipe_name} rank {rank} step {step} param {i} {k}")
        assert run["storage_resizable"], "a sharded FP8 parameter lost its resizable storage"


@pytest.mark.parametrize("recipe_name", RUNS)
def test_fsdp2_gathers_fp8_bytes_and_rebuilds_the_reference_weight(results: list[dict], recipe_name: str) -> None:
    for rank, res in enumerate(results):
        run, ref = res[recipe_name, "fsdp"], res[recipe_name, "reference"]
        assert run["gathers"], "no all-gather was recorded"
        for dtype, numel, _ in run["gathers"]:
            assert dtype == "torch.uint8" and numel in run["shard_bytes"], (dtype, numel, run["shard_bytes"])
        expected_cls = BLOCK_CLASS.get(recipe_name.split("/")[0], "Float8Tensor")
        for (cls, got), i in zip(run["unsharded"], (0, 2), strict=True):
            assert cls == expected_cls, f"layer {i}: the gathered weight is a {cls}"
            want = ref["params"][-1][0 if i == 0 else 2]
            assert got and set(got) <= set(want), f"layer {i}: gathered {sorted(got)}, reference {sorted(want)}"
            assert "codes" in got or "rowwise_codes" in got, f"layer {i}: no rowwise codes after unshard"
            for k in got:
                _same(got[k], want[k], f"rank {rank} layer {i} gathered {k}")


@pytest.mark.parametrize("recipe_name", RUNS)
def test_fsdp2_shards_of_a_weight_share_one_scale_on_every_rank(results: list[dict], recipe_name: str) -> None:
    r0, r1 = (res[recipe_name, "fsdp"] for res in results)
    for step in range(STEPS):
        for i, (a, b) in enumerate(zip(r0["params"][step], r1["params"][step], strict=True)):
            for key in a:  # the per-tensor scale; NVFP4's global amaxes (MAX-reduced over the mesh)
                if key == "scale_inv" or key.endswith("_amax"):
                    _same(a[key], b[key], f"step {step} param {i} {key}: rank 0 vs rank 1")


@pytest.mark.parametrize("recipe_name", RECIPES)
def test_fsdp2_keeps_the_high_precision_init_val(results: list[dict], recipe_name: str) -> None:
    for res in results:
        run, ref = res[recipe_name, "fsdp"], res[recipe_name, "reference"]
        assert run["hp_init"].keys() == ref["plain_init"].keys()
        for n, want in ref["plain_init"].items():
            _same(run["hp_init"][n], want, f"{n} (FSDP2)")
            _same(ref["hp_init"][n], want, f"{n} (one process)")


@pytest.mark.parametrize("case", list(REFUSED))
def test_fsdp2_refuses_block_scaled_weights_it_would_gather_in_high_precision(results: list[dict], case: str) -> None:
    """TE gathers a block-scaled weight whose shard is not aligned to the scale blocks in high precision
    (``mxfp8_tensor.py`` ``split``/``new_zeros`` fall back, lines 434-441 and 550-554 at d0067d0) and
    refuses 1x128 blocks in ``fsdp_pre_all_gather`` (``float8_blockwise_tensor.py`` line 622);
    fp8sim raises NotImplementedError at ``fully_shard`` naming the class and FSDP2 in every case."""
    expected = REFUSED[case][2]
    for rank, res in enumerate(results):
        got = res["refusals"][case]
        assert got.startswith("NotImplementedError") and expected in got, f"rank {rank}: {got}"


@pytest.mark.parametrize("recipe_name", ["MXFP8BlockScaling", "Float8BlockScaling", "NVFP4BlockScaling"])
def test_block_scaled_row_split_keeps_codes_scales_and_values(recipe_name: str) -> None:
    """One process, no process group: ``torch.chunk`` (aten split, FSDP2's sharding) of a block-scaled
    weight into aligned row shards gives tensors of the same class whose buffers are the shards of the
    whole tensor's in TE's layouts (``_rows``) and whose dequantized values are its rows; a padded
    ``new_zeros`` shard takes a ``copy_`` of a shard bit for bit."""
    import fp8sim.pytorch as te

    torch.manual_seed(1)
    with te.quantized_model_init(recipe=_recipe(recipe_name)):
        w = te.Linear(128, 256).weight
    whole = _state(w)
    pieces = torch.chunk(w, 2, dim=0)
    for rank, piece in enumerate(pieces):
        assert type(piece) is type(w), type(piece).__name__
        got, want = _state(piece), _rows(whole, rank, 2)
        assert got.keys() == want.keys(), (sorted(got), sorted(want))
        for k in got:
            _same(got[k], want[k], f"{recipe_name} shard {rank} {k}")
        rows = slice(rank * 128, (rank + 1) * 128)
        got_values, want_values = piece.dequantize().detach().numpy(), w.dequantize()[rows].detach().numpy()
        _same(got_values, want_values, f"{recipe_name} shard {rank} values")
        padded = w.new_zeros(piece.shape)
        assert type(padded) is type(w)
        padded.narrow(0, 0, piece.shape[0]).copy_(piece)
        for k, v in _state(padded).items():
            _same(v, got[k], f"{recipe_name} shard {rank} {k} after new_zeros + copy_")


@pytest.mark.parametrize("recipe_name", META)
def test_meta_device_init_then_fully_shard_then_reset_parameters(results: list[dict], recipe_name: str) -> None:
    """TE's FSDP2 flow (``tests/pytorch/distributed/fsdp2_tests/run_fsdp2_model.py`` lines 285-306, and
    ``module/base.py`` ``reset_parameters`` lines 1813-1880 at d0067d0): each rank initialises its own
    shard, quantizes it with the amax MAX-reduced over the mesh and registers a DTensor over it; the
    high-precision init value is that rank's shard (the training itself is checked by the tests above)."""
    for rank, res in enumerate(results):
        run = res[recipe_name, "fsdp"]
        assert run["hp_init"], "no high-precision init value was kept"
        for n, got in run["hp_init"].items():
            _same(got, _shard_values(got.shape, rank).numpy(), f"rank {rank} {n}")


MX_RUNS = ("MXFP8BlockScaling", "MXFP8BlockScaling/meta", MX_ROOT_ONLY)


def _te_mx_payload(shard: tuple[int, int], backward: bool, resharded: bool) -> list[tuple[str, tuple[int, int]]]:
    """TE ``MXFP8Tensor.fsdp_pre_all_gather`` (``mxfp8_tensor.py`` lines 640-685 at d0067d0), written out:
    the scales lose their row padding (rowwise ``[:M]``, columnwise ``[:M/32]``, the column padding of
    ``get_scale_shape`` kept); resharded after forward, the forward gathers the rowwise codes and scales,
    the backward the columnwise ones; not resharded, rowwise plus columnwise (the quantizer wants the
    columnwise copy when grad is on) in the forward only."""
    m, k = shard
    row = [("rowwise_data", (m, k)), ("rowwise_scale_inv", (m, -(-(k // 32) // 4) * 4))]
    col = [("columnwise_data", (m, k)), ("columnwise_scale_inv", (m // 32, -(-k // 128) * 128))]
    if not resharded:
        return row + col
    return col if backward else row


@pytest.mark.parametrize("recipe_name", MX_RUNS)
def test_fsdp2_mxfp8_gathers_rowwise_in_forward_and_columnwise_in_backward(
    results: list[dict], recipe_name: str
) -> None:
    """TE's MXFP8 FSDP2 payload per phase (``_te_mx_payload``): every ``fsdp_pre_all_gather`` sends exactly
    TE's buffers, and every all-gather carries exactly their bytes (plus 4 per float32 bias element of the
    first layer); resharded after forward, each layer gathers once in the forward and once in the backward
    per step, and the modules take the dgrad operand from the backward's gather (TE ``linear.py`` line
    1051: ``weight_fp8.update_usage(columnwise_usage=True)`` in backward), the training bit-identical
    (``test_fsdp2_fp8_weights_train_bit_identically_to_one_process``)."""
    resharded = recipe_name != MX_ROOT_ONLY
    for rank, res in enumerate(results):
        run = res[recipe_name, "fsdp"]
        shapes = run["shard_shapes"]
        bias = 4 * shapes[0][0]  # layer 0's bias shard (float32 bytes); layer 2 has no bias
        phases = (False, True) if resharded else (False,)
        for bwd, shard, buffers in run["sent"]:  # each layer's shard sends its own TE payload
            assert tuple(shard) in [tuple(s) for s in shapes], (rank, shard, shapes)
            want = _te_mx_payload(tuple(shard), bwd, resharded)
            assert buffers == want, f"rank {rank}: {'backward' if bwd else 'forward'} gather of {shard} sent {buffers}"
        for bwd in phases:  # one gather per layer and phase and step (resharded), one per step for the root
            count = sum(1 for b, _, _ in run["sent"] if b == bwd)
            assert count == len(shapes) * STEPS, f"rank {rank}: {count} {'backward' if bwd else 'forward'} sends"
        want_bytes = {
            bwd: [
                sum(math.prod(s) for _, s in _te_mx_payload(shape, bwd, resharded)) + (bias if i == 0 else 0)
                for i, shape in enumerate(shapes)
            ]
            for bwd in phases
        }
        if not resharded:  # the root's one all-gather carries both layers
            want_bytes = {False: [sum(want_bytes[False])]}
        for dtype, numel, bwd in run["gathers"]:
            assert dtype == "torch.uint8" and numel in want_bytes.get(bwd, []), (rank, dtype, numel, bwd, want_bytes)


def test_fsdp2_mxfp8_recompute_needs_the_forward_gather(results: list[dict]) -> None:
    """Activation recompute (``te.checkpoint``) under FSDP2 with MXFP8 primary weights: resharded after
    forward, the backward gather carries the columnwise copy only (TE ``mxfp8_tensor.py`` lines 663-675),
    so the recomputed forward has no rowwise codes and raises TE's ``update_usage`` error
    (``storage/mxfp8_tensor_storage.py`` line 296 at d0067d0) with the way out; with
    ``reshard_after_forward=False`` the forward gather carries both copies and the step equals one process's."""
    world = len(results)
    for rank, res in enumerate(results):
        rec = res["recompute"]
        got = rec["resharded"]
        assert isinstance(got, str) and "Requested row-wise usage, but MXFP8Tensor is missing row-scaled" in got, got
        assert "reshard_after_forward=False" in got, got
        assert not isinstance(rec["kept"], str), rec["kept"]
        (loss, dx, grads), (ref_loss, ref_dx, ref_grads) = rec["kept"]
        assert loss == ref_loss, f"rank {rank}: loss {loss!r} vs {ref_loss!r}"
        _same(dx, ref_dx, f"rank {rank} input gradient")
        for i, (g, want) in enumerate(zip(grads, ref_grads, strict=True)):
            _same(g, np.array_split(want, world, axis=0)[rank], f"rank {rank} grad {i}")
