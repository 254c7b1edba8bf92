"""TE-style tensor parallelism of ``fp8sim.pytorch`` ``Linear``, ``LayerNormLinear`` and ``LayerNormMLP`` on
2 gloo ranks (issue 16, item 3).

A Megatron MLP, ``fc2(relu(fc1(x)))`` with ``fc1 = Linear(32, 64, parallel_mode="column")`` and
``fc2 = Linear(64, 32, parallel_mode="row")``, trains for 3 steps (new ``x`` and output gradient each
step, weights fixed) under DelayedScaling(amax_history_len=2) and Float8CurrentScaling, with
``sequence_parallel`` off and on, in ONE spawn.  Oracle: a one-process reference written here from the
full weights, applying the arithmetic of TE's TP (``transformer_engine/pytorch/module/linear.py`` at
d0067d0).  What in it is independent of fp8sim: the casts (ml_dtypes), the scales and amax reductions (TE's
rules written below), the collectives' sums (written as ``p_0 + p_1``) and the GEMMs: the FP8 runs use
``accumulator="exact"`` and the reference sums the exact products in Python integers, rounded once
(``tests/_gemm_reference.py``), not with ``torch.matmul`` as ``module/_gemm.py`` does (its default accumulator
is checked in ``test_pytorch_fp8_boundaries_current.py``).  What is not: the LayerNorm rows of
:func:`_run_mlp` (fp8sim's ``normalize``, checked on its own in test_pytorch_modules.py) and autograd's relu.

* every rank runs its own GEMM on its shard (fc1: rows ``r`` of W1 and b1; fc2: columns ``r`` of W2),
  the exact sum of the FP8 products rounded to float32, ``scale_inv_a * scale_inv_b`` applied after, the
  fused bias (fc1) rounded to bf16 first (linear.py 499-503: cuBLAS takes no FP32 bias in an FP8 GEMM);
* fc2's partial outputs are summed (``allreduce``, or ``reduce_scatter_along_first_dim`` with
  sequence parallel, linear.py 568-577) as ``p_0 + p_1`` in float32 (two ranks: one rounded add,
  the same in either order), then b2 is added (the unfused add after the collective, linear.py
  1807 and 2076); fc1's dgrad is summed the same way (linear.py 1122-1132);
* with sequence parallel, fc1's input and fc2's grad output are quantized on each rank with one scale
  and all-gathered as FP8 codes (linear.py 378-420, base.py ``grad_output_preprocess`` 1721-1751),
  which is the cast of the whole tensor; b2's gradient is the sum over this rank's rows only;
* amaxes: delayed scaling MAX-reduces every slot over autocast's group, so each scale is
  ``448 or 57344 / max(amax_t, amax_{t-1})`` of the *whole* logical tensor (``quantization.py``
  ``reduce_and_update_fp8_tensors`` 656-684, here over autocast's ``amax_reduction_group``: the world,
  or the TP group itself); current scaling reduces only the sequence-parallel input of fc1 and grad
  output of fc2 (linear.py 352-355 and 810-824); a weight shard, fc2's input shard and fc1's
  grad-output shard are scaled by their own amax.

The same spawn runs the MLP in bf16, behind a LayerNorm (``LayerNormMLP(set_parallel_mode=True)`` and
``LayerNormLinear`` column + ``Linear`` row), and with FP8 off; and the same run with a wrong amax group
(each rank alone) gives different scales on the two ranks and an output that is not the reference's.

Also in the spawn: ``MultiheadAttention`` (self and cross attention, 4 heads in 2 GQA groups) and
``TransformerLayer`` (also with rotary embeddings) with ``set_parallel_mode=True`` against each rank's shard
run as one process between the test's own sums over the ranks (:func:`_run_attention`), FP8 off, delayed and
current scaling, sequence parallel off and on, also with ``fp8_dpa`` / ``fp8_mha`` (FP8 attention on each
rank's heads, its hand-offs and DPA's reduced delayed-scaling state against the reference's); and MXFP8,
Float8Block and NVFP4 block scaling under sequence parallel (:func:`_run_block`), with TE's per-shard
quantize-then-gather written out (:func:`_per_shard_then_gather`); and NVFP4 stochastic rounding of the
gathered grad output / input, per rank shard (:mod:`_te_tp_nvfp4_sr`); and FP8 outputs and grads across the
collectives (:mod:`_te_tp_fp8_io`).  One-process checks of the same API: ``test_distributed_te_tp_local.py``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")
nn_f = torch.nn.functional
dist = require("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

import _gemm_reference as gref  # noqa: E402
from _dist import ranks  # noqa: E402
from _te_tp_attention import ATT_CASES, BLOCK_RECIPES, _per_shard_then_gather, _run_attention, _run_block  # noqa: E402
from _te_tp_fp8_io import run_fp8_io  # noqa: E402
from _te_tp_nvfp4_sr import run_nvfp4_sr  # noqa: E402

S, H, F, STEPS, HIST = 16, 32, 64, 3, 2
E4M3, E5M2 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2
FMAX = {E4M3: np.float32(448.0), E5M2: np.float32(57344.0)}
# slot -> (format, which module, forward?)
SLOTS = {"fc1.in": E4M3, "fc1.w": E4M3, "fc1.grad": E5M2, "fc2.in": E4M3, "fc2.w": E4M3, "fc2.grad": E5M2}
CASES = [("delayed", False), ("delayed", True), ("current", False), ("current", True)]
BF16_CASES = [("delayed", True), ("current", False)]


# -- the reference ------------------------------------------------------------------------------
def _q(t: torch.Tensor, scale: np.float32, dt: type) -> torch.Tensor:
    """TE's per-tensor cast: fl32(t * scale), saturated, RNE to ``dt`` (ml_dtypes); the code values."""
    scaled = (t.detach().float() * torch.tensor(scale, dtype=torch.float32)).numpy()
    return torch.from_numpy(np.clip(scaled, -FMAX[dt], FMAX[dt]).astype(dt).astype(np.float32))


def _mm(
    a: torch.Tensor, b: torch.Tensor, sa: np.float32, sb: np.float32, dt: torch.dtype, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The FP8 GEMM under ``accumulator="exact"``: exact sum of the code values' products rounded once to
    float32, times ``fl32(scale_inv_a * scale_inv_b)`` (the reciprocals of the scales, rounded), + bias, to ``dt``."""
    return gref.epilogue(gref.rn_f32(a, b), np.float32(1) / np.float32(sa), np.float32(1) / np.float32(sb), bias, dt)


def _amax(t: torch.Tensor) -> np.float32:
    return np.float32(t.detach().abs().max().item())


class _Reference:
    """The TP arithmetic of the module docstring, on full tensors in one process."""

    def __init__(self, recipe: str, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor) -> None:
        self.recipe, self.w1, self.b1, self.w2, self.b2 = recipe, w1, b1, w2, b2
        self.scale = dict.fromkeys(SLOTS, np.float32(1))  # delayed scaling starts at scale 1
        self.prev = dict.fromkeys(SLOTS, np.float32(0))  # amax_{t-1} (history length 2)

    def _scale(self, slot: str, own: torch.Tensor) -> np.float32:
        if self.recipe == "delayed":
            return self.scale[slot]
        a = _amax(own)  # TE compute_scale_from_amax: fl32(fmax / amax), amax > 0 here
        return np.float32(FMAX[SLOTS[slot]] / a)

    def _update(self, amaxes: dict) -> None:
        """TE's delayed update: amax = max over the history (this and the last step), scale = fmax / amax."""
        for slot, a in amaxes.items():
            m = max(a, self.prev[slot])
            self.scale[slot] = np.float32(FMAX[SLOTS[slot]] / m)
            self.prev[slot] = a

    def step(self, x: torch.Tensor, dy: torch.Tensor, sp: bool, rank: int) -> dict:
        """Output, gradients (this rank's) and the scales used, for the full ``x`` and grad ``dy``."""
        w1s, b1s, w2s = self.w1.chunk(2, 0), self.b1.chunk(2), self.w2.chunk(2, 1)
        dt = self.w1.dtype  # the activation dtype: every GEMM output is rounded to it
        s_x = self._scale("fc1.in", x)  # current: the sequence-parallel amax is reduced, x is replicated otherwise
        xq = _q(x, s_x, E4M3)
        s_w1 = [self._scale("fc1.w", w) for w in w1s]
        w1q = [_q(w, s, E4M3) for w, s in zip(w1s, s_w1, strict=True)]
        h = [_mm(xq, w1q[r].t(), s_x, s_w1[r], dt, b1s[r].to(torch.bfloat16)).requires_grad_() for r in range(2)]
        a = [torch.relu(hr) for hr in h]
        s_a = [self._scale("fc2.in", ar) for ar in a]
        aq = [_q(ar, s, E4M3) for ar, s in zip(a, s_a, strict=True)]
        s_w2 = [self._scale("fc2.w", w) for w in w2s]
        w2q = [_q(w, s, E4M3) for w, s in zip(w2s, s_w2, strict=True)]
        p = [_mm(aq[r], w2q[r].t(), s_a[r], s_w2[r], dt) for r in range(2)]
        ysum = p[0] + p[1]
        rows = (lambda t: t.chunk(2, 0)[rank]) if sp else (lambda t: t)
        y = rows(ysum) + self.b2
        # backward
        bias = self.b2.clone().requires_grad_()
        (torch.zeros_like(rows(ysum)) + bias).backward(rows(dy))
        s_g2 = self._scale("fc2.grad", dy)  # current: reduced under sequence parallel, replicated otherwise
        dyq = _q(dy, s_g2, E5M2)
        da = [_mm(dyq, w2q[r], s_g2, s_w2[r], dt) for r in range(2)]
        dw2 = _mm(dyq.t(), aq[rank], s_g2, s_a[rank], dt)
        for r in range(2):
            a[r].backward(da[r])
        dh = [hr.grad for hr in h]
        s_g1 = [self._scale("fc1.grad", d) for d in dh]
        dhq = [_q(d, s, E5M2) for d, s in zip(dh, s_g1, strict=True)]
        dxp = [_mm(dhq[r], w1q[r], s_g1[r], s_w1[r], dt) for r in range(2)]
        dx_full = dxp[0] + dxp[1]
        dx = rows(dx_full)
        dw1 = _mm(dhq[rank].t(), xq, s_g1[rank], s_x, dt)
        out = {
            "y": y.detach(),
            "dx": dx,
            "dx_full": dx_full,
            "dw1": dw1,
            "db1": dh[rank].float().sum(0).to(dt),
            "dw2": dw2,
            "db2": bias.grad,
            "scales": {"fc1.in": s_x, "fc2.grad": s_g2, "fc1.w": s_w1[rank], "fc2.w": s_w2[rank]},
        }
        if self.recipe == "delayed":
            full_a, full_dh = torch.cat(a, 1), torch.cat(dh, 1)
            self._update(
                {"fc1.in": _amax(x), "fc1.w": _amax(self.w1), "fc2.in": _amax(full_a), "fc2.w": _amax(self.w2)}
            )
            self._update({"fc1.grad": _amax(full_dh), "fc2.grad": _amax(dy)})
        return out


# -- the TP run -----------------------------------------------------------------------------------
def _data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(S, H, generator=g) * (1 + step), torch.randn(S, H, generator=g) * 1e-3 * (1 + step)


def _state(m: object) -> dict:
    g = m.fp8_gemms["gemm"]
    if g.fwd is None:
        return {}
    return {
        k: v.copy()
        for k, v in (("fs", g.fwd.scale), ("fh", g.fwd.amax_history), ("bs", g.bwd.scale), ("bh", g.bwd.amax_history))
    }


def _run(
    rank: int, recipe_name: str, sp: bool, tp_group: object, amax_group: object, dt: torch.dtype = torch.float32
) -> list[dict]:
    """Linear(column) -> relu -> Linear(row) in ``dt`` (bf16: every GEMM output, the two-rank sums and the
    row bias add are bf16, as TE's activation dtype)."""
    import fp8sim.pytorch as te
    from fp8sim.recipe import DelayedScaling, Float8CurrentScaling

    te.FP8GlobalStateManager.reset()
    torch.manual_seed(0)
    w1, b1 = (torch.randn(F, H) * 0.1).to(dt), (torch.randn(F) * 0.1).to(dt)
    w2, b2 = (torch.randn(H, F) * 0.1).to(dt), (torch.randn(H) * 0.1).to(dt)
    kw = {"tp_group": tp_group, "sequence_parallel": sp, "params_dtype": dt}
    fc1 = te.Linear(H, F, parallel_mode="column", **kw)
    fc2 = te.Linear(F, H, parallel_mode="row", **kw)
    with torch.no_grad():
        fc1.weight.copy_(w1.chunk(2, 0)[rank])
        fc1.bias.copy_(b1.chunk(2)[rank])
        fc2.weight.copy_(w2.chunk(2, 1)[rank])
        fc2.bias.copy_(b2)
    recipe = DelayedScaling(amax_history_len=HIST) if recipe_name == "delayed" else Float8CurrentScaling()
    ref = _Reference(recipe_name, w1, b1, w2, b2)
    out = []
    for step in range(STEPS):
        x, dy = (t.to(dt) for t in _data(step))
        xl = (x.chunk(2, 0)[rank] if sp else x).clone().requires_grad_()
        for p in (*fc1.parameters(), *fc2.parameters()):
            p.grad = None
        with te.autocast(recipe=recipe, amax_reduction_group=amax_group, accumulator="exact"):
            y = fc2(torch.relu(fc1(xl)))
        y.backward(dy.chunk(2, 0)[rank] if sp else dy)
        want = ref.step(x, dy, sp, rank)
        got = {
            "y": y.detach(),
            "dx": xl.grad,
            "dw1": fc1.weight.grad,
            "db1": fc1.bias.grad,
            "dw2": fc2.weight.grad,
            "db2": fc2.bias.grad,
        }
        diffs = {k: int((got[k] != want[k]).sum()) for k in got}
        diffs["dtype"] = int(y.dtype != dt or fc1.weight.grad.dtype != dt)
        out.append({"diffs": diffs, "fc1": _state(fc1), "fc2": _state(fc2), "want_scales": want["scales"]})
    return out


def _run_mlp(rank: int, recipe_name: str, sp: bool, tp_group: object, lnl: bool = False) -> list[dict]:
    """``LayerNormMLP(set_parallel_mode=True, activation="relu")`` (``lnl``: ``LayerNormLinear`` column,
    relu, ``Linear`` row): the same MLP behind a LayerNorm.  The
    norm rows are fp8sim's ``normalize`` (checked on its own in test_pytorch_modules.py); with sequence
    parallel each rank normalises its rows and its norm-parameter gradients cover those rows only."""
    import fp8sim.pytorch as te
    from fp8sim.pytorch.module._normalization import normalize
    from fp8sim.recipe import DelayedScaling, Float8CurrentScaling

    te.FP8GlobalStateManager.reset()
    torch.manual_seed(1)
    w1, b1 = torch.randn(F, H) * 0.1, torch.randn(F) * 0.1
    w2, b2 = torch.randn(H, F) * 0.1, torch.randn(H) * 0.1
    lnw, lnb = 1 + torch.randn(H) * 0.1, torch.randn(H) * 0.1
    if lnl:  # LayerNormLinear(column) -> relu -> Linear(row)
        fc1 = te.LayerNormLinear(H, F, eps=1e-5, tp_group=tp_group, parallel_mode="column", sequence_parallel=sp)
        fc2 = te.Linear(F, H, tp_group=tp_group, parallel_mode="row", sequence_parallel=sp)
        mlp = torch.nn.Sequential(fc1, torch.nn.ReLU(), fc2)
        names = {"fc1_weight": fc1.weight, "fc1_bias": fc1.bias, "fc2_weight": fc2.weight, "fc2_bias": fc2.bias}
        names.update(layer_norm_weight=fc1.layer_norm_weight, layer_norm_bias=fc1.layer_norm_bias)
    else:
        mlp = te.LayerNormMLP(
            H, F, tp_group=tp_group, sequence_parallel=sp, set_parallel_mode=True, activation="relu", eps=1e-5
        )
        names = dict(mlp.named_parameters())
    with torch.no_grad():
        for name, v in (("fc1_weight", w1.chunk(2, 0)[rank]), ("fc1_bias", b1.chunk(2)[rank])):
            names[name].copy_(v)
        for name, v in (("fc2_weight", w2.chunk(2, 1)[rank]), ("fc2_bias", b2)):
            names[name].copy_(v)
        names["layer_norm_weight"].copy_(lnw)
        names["layer_norm_bias"].copy_(lnb)
    recipe = DelayedScaling(amax_history_len=HIST) if recipe_name == "delayed" else Float8CurrentScaling()
    ref = _Reference(recipe_name, w1, b1, w2, b2)
    out = []
    for step in range(STEPS):
        x, dy = _data(step)
        xl = (x.chunk(2, 0)[rank] if sp else x).clone().requires_grad_()
        for p in mlp.parameters():
            p.grad = None
        with te.autocast(recipe=recipe, accumulator="exact"):
            y = mlp(xl)
        y.backward(dy.chunk(2, 0)[rank] if sp else dy)
        parts = [p.clone().requires_grad_() for p in (x.chunk(2, 0) if sp else (x,))]
        norms = [(lnw.clone().requires_grad_(), lnb.clone().requires_grad_()) for _ in parts]
        lns = [normalize(p, w, b, 1e-5, "LayerNorm", False) for p, (w, b) in zip(parts, norms, strict=True)]
        want = ref.step(torch.cat(lns).detach(), dy, sp, rank)
        for ln, d in zip(lns, want["dx_full"].chunk(len(lns), 0), strict=True):
            ln.backward(d)
        mine = rank if sp else 0
        want.update(dx=parts[mine].grad, dlnw=norms[mine][0].grad, dlnb=norms[mine][1].grad)
        got = {
            "y": y.detach(),
            "dx": xl.grad,
            "dw1": names["fc1_weight"].grad,
            "db1": names["fc1_bias"].grad,
            "dw2": names["fc2_weight"].grad,
            "db2": names["fc2_bias"].grad,
            "dlnw": names["layer_norm_weight"].grad,
            "dlnb": names["layer_norm_bias"].grad,
        }
        out.append({"diffs": {k: int((got[k] != want[k]).sum()) for k in got}})
    return out


def _run_hp(rank: int, sp: bool, tp_group: object) -> dict:
    """FP8 off: the same collectives around torch's own linear; the reference is autograd over the per-shard
    ``F.linear`` graph of the full tensors (each two-branch gradient sum is one float32 add)."""
    import fp8sim.pytorch as te

    torch.manual_seed(2)
    w1, b1, w2, b2 = torch.randn(F, H) * 0.1, torch.randn(F) * 0.1, torch.randn(H, F) * 0.1, torch.randn(H) * 0.1
    fc1 = te.Linear(H, F, tp_group=tp_group, parallel_mode="column", sequence_parallel=sp)
    fc2 = te.Linear(F, H, tp_group=tp_group, parallel_mode="row", sequence_parallel=sp)
    with torch.no_grad():
        for p, v in (
            (fc1.weight, w1.chunk(2, 0)[rank]),
            (fc1.bias, b1.chunk(2)[rank]),
            (fc2.weight, w2.chunk(2, 1)[rank]),
            (fc2.bias, b2),
        ):
            p.copy_(v)
    x, dy = _data(0)
    xl = (x.chunk(2, 0)[rank] if sp else x).clone().requires_grad_()
    y = fc2(torch.relu(fc1(xl)))
    y.backward(dy.chunk(2, 0)[rank] if sp else dy)
    leaves = [t.clone().requires_grad_() for t in (x, *w1.chunk(2, 0), *b1.chunk(2), *w2.chunk(2, 1), b2)]
    xr, w10, w11, b10, b11, w20, w21, b2r = leaves
    hs = [torch.relu(nn_f.linear(xr, w, b)) for w, b in ((w10, b10), (w11, b11))]
    ysum = nn_f.linear(hs[0], w20) + nn_f.linear(hs[1], w21)
    rows = (lambda t: t.chunk(2, 0)[rank]) if sp else (lambda t: t)
    ysum.backward(dy)  # the row layer's backward gathers every rank's grad output
    (torch.zeros_like(rows(ysum)) + b2r).backward(rows(dy))  # its bias: this rank's rows
    want = {"y": rows(ysum) + b2, "dx": rows(xr.grad), "dw1": (w10, w11)[rank].grad, "db1": (b10, b11)[rank].grad}
    want.update(dw2=(w20, w21)[rank].grad, db2=b2r.grad)
    got = {"y": y, "dx": xl.grad, "dw1": fc1.weight.grad, "db1": fc1.bias.grad, "dw2": fc2.weight.grad}
    got["db2"] = fc2.bias.grad
    return {k: int((got[k].detach() != want[k].detach()).sum()) for k in got}


def _worker(rank: int, world: int) -> dict:
    torch.set_num_threads(1)
    tp = dist.new_group([0, 1])
    alone = [dist.new_group([r]) for r in range(world)][rank]  # a wrong amax group: no reduction
    res = {f"{r}-{sp}": _run(rank, r, sp, tp, tp if sp else None) for r, sp in CASES}  # both amax groups
    res["wrong"] = _run(rank, "delayed", True, tp, alone)
    res.update({f"bf16-{r}-{sp}": _run(rank, r, sp, tp, None, torch.bfloat16) for r, sp in BF16_CASES})
    res.update({f"mlp-{r}-{sp}": _run_mlp(rank, r, sp, tp) for r, sp in CASES})
    res.update({f"lnl-{r}-{sp}": _run_mlp(rank, r, sp, tp, lnl=True) for r, sp in CASES})
    res.update({f"hp-{sp}": _run_hp(rank, sp, tp) for sp in (False, True)})
    res.update({f"{k}-{r}-{sp}": _run_attention(rank, k, r, sp, tp) for k, r, sp in ATT_CASES})
    res.update({f"block-{r}": _run_block(rank, r, tp) for r in BLOCK_RECIPES})
    res["per-shard"] = _per_shard_then_gather(rank, tp)
    res["nvfp4-sr"] = run_nvfp4_sr(rank, tp)
    res["fp8-io"] = run_fp8_io(rank, tp)
    import fp8sim.pytorch as te

    errors = {}
    try:
        te.Linear(31, 64, tp_group=tp, parallel_mode="row")
    except ValueError as exc:
        errors["divide"] = str(exc)
    lin = te.Linear(32, 64, tp_size=2, parallel_mode="column")
    try:
        lin(torch.randn(16, 32))
    except RuntimeError as exc:
        errors["group"] = str(exc)
    from fp8sim.recipe import DelayedScaling

    sp = te.Linear(32, 64, tp_group=tp, parallel_mode="column", sequence_parallel=True)
    try:
        with te.autocast(recipe=DelayedScaling(reduce_amax=False)):
            sp(torch.randn(16, 32))
    except ValueError as exc:
        errors["reduce_amax"] = str(exc)
    from fp8sim.recipe import NVFP4BlockScaling

    row_sp = te.Linear(32, 32, tp_group=tp, parallel_mode="row", sequence_parallel=True)
    try:
        with te.autocast(recipe=NVFP4BlockScaling()):
            row_sp(torch.randn(16, 16))
    except NotImplementedError as exc:
        errors["block"] = str(exc)
    try:
        with te.autocast(recipe=NVFP4BlockScaling(row_scaled_activation=True, disable_rht=True)):
            sp(torch.randn(16, 32))
    except RuntimeError as exc:
        errors["row_scaled"] = str(exc)
    sym = te.Linear(32, 32, tp_group=tp, parallel_mode="row", symmetric_ar_type="two_shot")
    try:
        with te.autocast(recipe=DelayedScaling()):
            sym(torch.randn(16, 16), fp8_output=True)
    except NotImplementedError as exc:
        errors["symmetric"] = str(exc)
    res["errors"] = errors
    res["sizes"] = (tuple(lin.weight.shape), tuple(te.Linear(32, 64, tp_group=tp, parallel_mode="row").weight.shape))
    return res


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return ranks(_worker, world_size=2)


@pytest.mark.parametrize(("recipe", "sp"), CASES)
def test_megatron_mlp_forward_and_gradients_equal_the_per_shard_reference(results: list, recipe: str, sp: bool) -> None:
    for rank, res in enumerate(results):
        for step, st in enumerate(res[f"{recipe}-{sp}"]):
            bad = {k: n for k, n in st["diffs"].items() if n}
            assert not bad, f"{recipe} sequence_parallel={sp} rank {rank} step {step}: elements differing {bad}"


@pytest.mark.parametrize("sp", [False, True])
def test_without_fp8_the_collectives_wrap_torch_linear(results: list, sp: bool) -> None:
    for rank, res in enumerate(results):
        bad = {k: n for k, n in res[f"hp-{sp}"].items() if n}
        assert not bad, f"FP8 off, sequence_parallel={sp}, rank {rank}: differing {bad}"


@pytest.mark.parametrize(("recipe", "sp"), BF16_CASES)
def test_bf16_activations_sum_and_round_in_bf16_as_te(results: list, recipe: str, sp: bool) -> None:
    """params and input in bf16: GEMM outputs rounded to bf16, the two-rank all-reduce / reduce-scatter a
    bf16 sum (one rounding of p_0 + p_1 on gloo as on NCCL), the row bias added in bf16."""
    for rank, res in enumerate(results):
        for step, st in enumerate(res[f"bf16-{recipe}-{sp}"]):
            bad = {k: n for k, n in st["diffs"].items() if n}
            assert not bad, f"bf16 {recipe} sequence_parallel={sp} rank {rank} step {step}: differing {bad}"


@pytest.mark.parametrize("module", ["mlp", "lnl"])
@pytest.mark.parametrize(("recipe", "sp"), CASES)
def test_layernorm_mlp_and_layernorm_linear_equal_the_per_shard_reference(
    results: list, module: str, recipe: str, sp: bool
) -> None:
    """LayerNormMLP(set_parallel_mode=True), and LayerNormLinear(column) -> relu -> Linear(row)."""
    for rank, res in enumerate(results):
        for step, st in enumerate(res[f"{module}-{recipe}-{sp}"]):
            bad = {k: n for k, n in st["diffs"].items() if n}
            assert not bad, f"{module} {recipe} sequence_parallel={sp} rank {rank} step {step}: differing {bad}"


@pytest.mark.parametrize(("kind", "recipe", "sp"), ATT_CASES)
def test_multihead_attention_and_transformer_layer_equal_the_per_shard_reference(
    results: list, kind: str, recipe: str, sp: bool
) -> None:
    """Heads split across the ranks (QKV column-, proj row-parallel), the TransformerLayer's norms and residuals
    on this rank's rows under sequence parallel: output and every gradient equal :func:`_run_attention`'s
    reference, FP8 off, delayed and current scaling; under delayed scaling every GEMM's scales and amax
    history are identical on both ranks after the steps."""
    for rank, res in enumerate(results):
        for step, diffs in enumerate(res[f"{kind}-{recipe}-{sp}"]):
            if "states" in diffs:  # delayed: every GEMM's scales and amax history identical on both ranks
                other = results[1 - rank][f"{kind}-{recipe}-{sp}"][-1]["states"]
                assert diffs["states"] and diffs["states"] == other, f"{kind} {recipe} {sp}: rank states differ"
                continue
            bad = {k: n for k, n in diffs.items() if n}
            assert not bad, f"{kind} {recipe} sequence_parallel={sp} rank {rank} step {step}: differing {bad}"


@pytest.mark.parametrize("recipe", BLOCK_RECIPES)
def test_block_recipes_under_sequence_parallel_equal_the_per_shard_reference(results: list, recipe: str) -> None:
    """MXFP8BlockScaling, Float8BlockScaling, NVFP4BlockScaling (RHT on, stochastic rounding off): the
    sequence-parallel MLP's output and gradients (:func:`_run_block`)."""
    for rank, res in enumerate(results):
        bad = {k: n for k, n in res[f"block-{recipe}"].items() if n}
        assert not bad, f"{recipe} sequence_parallel rank {rank}: differing {bad}"


@pytest.mark.parametrize("recipe", BLOCK_RECIPES)
def test_per_shard_block_quantization_gathered_is_the_whole_tensors(results: list, recipe: str) -> None:
    """The premise of fp8sim's high-precision gather (:func:`_per_shard_then_gather`): TE's per-shard
    quantization, NVFP4 with its amaxes MAX-reduced over the TP group, gathers into the whole tensor's codes,
    scales and amaxes."""
    for rank, res in enumerate(results):
        assert res["per-shard"][recipe] == [], f"{recipe} rank {rank}: fields differing {res['per-shard'][recipe]}"


@pytest.mark.parametrize(("recipe", "sp"), [c for c in CASES if c[0] == "delayed"])
def test_delayed_scales_and_amax_history_are_identical_on_every_rank_and_the_reference(
    results: list, recipe: str, sp: bool
) -> None:
    r0, r1 = results[0][f"{recipe}-{sp}"], results[1][f"{recipe}-{sp}"]
    for step, (a, b) in enumerate(zip(r0, r1, strict=True)):
        for mod in ("fc1", "fc2"):
            for k in ("fs", "fh", "bs", "bh"):
                assert np.array_equal(a[mod][k].view(np.uint32), b[mod][k].view(np.uint32)), (mod, k, step)
        if step + 1 < len(r0):  # the scales this step's update wrote are the ones the next step used
            nxt = r0[step + 1]["want_scales"]
            assert a["fc1"]["fs"][0] == nxt["fc1.in"] and a["fc2"]["bs"][0] == nxt["fc2.grad"], step


def test_a_wrong_amax_group_gives_the_ranks_different_scales_and_wrong_outputs(results: list) -> None:
    """Each rank reducing alone: fc1's sequence-parallel input shards have different amaxes, so the ranks'
    scales part after the first update, and the FP8 all-gather reads the other rank's codes with the wrong
    scale_inv (TE ``_all_gather_fp8`` assumes identical scales): the output leaves the reference."""
    w0, w1 = results[0]["wrong"], results[1]["wrong"]
    assert w0[0]["diffs"]["y"] == 0  # step 0: every scale is still 1
    assert w0[1]["fc1"]["fs"][0] != w1[1]["fc1"]["fs"][0]
    assert w0[2]["diffs"]["y"] > 0 and w1[2]["diffs"]["y"] > 0


def test_tp_errors_on_the_ranks(results: list) -> None:
    """TE base.py prepare_forward (1610-1630) and utils.divide messages; what fp8sim refuses."""
    errors = results[0]["errors"]
    assert errors["divide"] == "31 is not divisible by 2"
    assert "Tensor parallel group not initialized" in errors["group"]
    assert "Amax reduction across tensor parallel group is necessary" in errors["reduce_amax"]
    assert "block" not in errors  # NVFP4 stochastic rounding under sequence parallelism runs (_te_tp_nvfp4_sr.py)
    assert "symmetric_ar_type='two_shot'" in errors["symmetric"]  # TE re-quantizes that sum (distributed.py 2090)
    assert errors["row_scaled"] == "Row-scaled NVFP4 quantization does not support amax reduction."  # TE quantizer.cpp
    assert results[0]["sizes"] == ((32, 32), (64, 16))


@pytest.mark.parametrize("module", ["linear", "lnmlp"])
def test_nvfp4_stochastic_rounding_of_a_sequence_parallel_grad_output_is_per_shard(results: list, module: str) -> None:
    """TE's default NVFP4BlockScaling (SR on the grad output): the row-parallel ``Linear``'s dgrad and wgrad, and
    ``LayerNormMLP``'s fc2 wgrad, equal a reference that quantizes each rank's shard with the GEMM's seeds and
    the whole tensor's amaxes (:mod:`_te_tp_nvfp4_sr`); the whole tensor quantized at once (other SR bits) and
    each shard with its own amax both give other gradients."""
    for rank, res in enumerate(results):
        r = res["nvfp4-sr"]
        for k in ("dw", "dx") if module == "linear" else ("dw",):
            key = f"{module}.{k}"
            assert r[key] == 0, f"rank {rank} {key}: {r[key]} elements differ from the per-shard reference"
            assert r[f"{key}.whole_differs"] > 0 and r[f"{key}.own_amax_differs"] > 0, (rank, key, r)


def test_nvfp4_quantizer_all_gather_with_te_philox_bits_per_rank(results: list) -> None:
    """``all_gather_nvfp4`` with ``te_rng_generator`` seeded per rank: codes are each shard's TE Philox cast
    laid out as TE (rowwise along dim 0, columnwise along dim 1), identical on both ranks; scales and amaxes
    are the whole tensor's quantization's, its codes (one stream over the whole tensor) are not; the scales and
    amaxes also with RHT (the post-RHT columnwise amax reduced) and for an ``NVFP4Tensor`` input."""
    for rank, res in enumerate(results):
        bad = [k for k, ok in res["nvfp4-sr"]["quantizer"].items() if not ok]
        assert not bad, f"rank {rank}: {bad}"


def test_nvfp4_stochastic_rounding_of_a_sequence_parallel_column_input_is_per_shard(results: list) -> None:
    """A custom NVFP4 recipe with SR on the input: the column-parallel layer's output (gathered rowwise copy) and
    wgrad (gathered columnwise copy) equal the per-shard reference; the whole tensor's SR bits, or each shard's
    own amax, give other outputs.  SR on a 4over6 input keeps TE's refusal."""
    for rank, res in enumerate(results):
        r = res["nvfp4-sr"]["column"]
        assert r["y"] == 0 and r["dw"] == 0, f"rank {rank}: {r}"
        assert res["nvfp4-sr"]["4over6"] == "NVFP4 4over6 quantization does not support stochastic rounding."
        assert r["y.whole_differs"] > 0 and r["y.own_amax_differs"] > 0 and r["dw.whole_differs"] > 0, (rank, r)


def test_nvfp4_sequence_parallel_shard_te_cannot_quantize_is_gathered_in_high_precision(results: list) -> None:
    """8 rows a rank (not a multiple of 16, TE ``NVFP4Quantizer.is_quantizable``): TE warns and gathers in high
    precision, then quantizes the whole grad output; dgrad and wgrad equal that reference."""
    for rank, res in enumerate(results):
        r = res["nvfp4-sr"]["fallback"]
        assert r == {"warned": True, "dx": 0, "dw": 0}, f"rank {rank}: {r}"


# -- FP8 boundaries across the collectives (tests/_te_tp_fp8_io.py) --------------------------------------
def _fp8_io_bad(results: list, key: str) -> list:
    steps = [results[r]["fp8-io"][key] for r in range(2)]
    steps = [s if isinstance(s, list) else [s] for s in steps]
    return [(r, i, k, n) for r, per in enumerate(steps) for i, st in enumerate(per) for k, n in st.items() if n]


def test_torch_marks_the_c10d_ops_te_tensors_meet_not_mutable(results: list) -> None:
    """The premise of the emulation (quantized_tensor.py 1010: the branch on ``func._schema.is_mutable``):
    ``c10d.allreduce_`` and ``c10d._reduce_scatter_base_`` are not marked mutable on this torch."""
    for res in results:
        assert res["fp8-io"]["schemas"] == {"allreduce_": False, "reduce_scatter": False}


@pytest.mark.parametrize(
    "case", ["row-False-False", "row-False-True", "row-True-True", "row-bf16", "row-cs-False-False", "row-cs-True-True"]
)
def test_row_parallel_fp8_output_is_the_per_rank_fp8_partial_as_te_computes_it(results: list, case: str) -> None:
    """Row-parallel ``Linear(fp8_output=True)``, delayed (and, ``-cs-``, current) scaling, 2 steps: tensor parallel
    gives this rank's FP8
    partial (TE's all-reduce leaves the Float8Tensor; an UpstreamQuirkWarning), its codes attached without a
    bias; sequence parallel (fp32 and bf16) this rank's rows of the sum of the dequantized FP8 partials, high
    precision; the bias after; gradients and the FP8 state equal the one-process shard's; the sum TE does not
    take differs."""
    bad = _fp8_io_bad(results, case)
    assert not bad, f"(rank, step, check, elements differing): {bad}"


@pytest.mark.parametrize("recipe", ["delayed", "current"])
@pytest.mark.parametrize("sp", [False, True])
def test_column_parallel_fp8_grad_is_the_per_rank_fp8_dgrad_as_te_computes_it(
    results: list, sp: bool, recipe: str
) -> None:
    """Column-parallel ``Linear(fp8_grad=True)``, delayed or current scaling, 2 steps: the input gradient is this
    rank's FP8 dgrad (tensor parallel, an UpstreamQuirkWarning) or this rank's rows of ``g_0 + g_1`` of the
    dequantized FP8 dgrads (sequence parallel); the sum of unquantized dgrads differs."""
    bad = _fp8_io_bad(results, f"col-{sp}" if recipe == "delayed" else f"col-cs-{sp}")
    assert not bad, f"(rank, step, check, elements differing): {bad}"


@pytest.mark.parametrize("recipe", ["delayed", "current", "current-fp8"])
@pytest.mark.parametrize("sp", [False, True])
def test_fp8_input_to_a_column_parallel_layer_is_gathered_as_it_is(results: list, recipe: str, sp: bool) -> None:
    """An FP8 input (delayed, current-fp8: a producer's ``fp8_output``, the layer with ``fp8_grad``; current:
    a hand-made FP8 tensor with a scale of its own on each rank): under sequence parallel every rank's codes
    read with this rank's scale_inv (TE ``_all_gather_fp8``), else used as they are; the producer's gradient
    is the high-precision reduction, or under tensor parallel with ``fp8_grad`` this rank's FP8 dgrad, its
    codes handed over."""
    bad = _fp8_io_bad(results, f"in-{recipe}-{sp}")
    assert not bad, f"(rank, step, check, elements differing): {bad}"
