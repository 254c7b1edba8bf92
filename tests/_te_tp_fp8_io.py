"""FP8 boundaries across the TP collectives (issue 16): a row-parallel ``fp8_output``, a column-parallel
``fp8_grad`` and an FP8 input to a column-parallel layer, checked inside test_distributed_te_tp.py's one
2-rank spawn (its ``_worker`` calls :func:`run_fp8_io`).

The reference is TE d0067d0 read step by step:

* ``module/linear.py`` 536-578: the row-parallel GEMM writes its output with ``output_quantizer`` (a
  ``Float8Tensor`` of the activation dtype), then ``allreduce`` (``distributed.py`` 2095-2109) or
  ``reduce_scatter_along_first_dim`` (931-958) runs on it; 1085-1132: the column-parallel dgrad GEMM with
  ``grad_input_quantizer``, then the same two; 2075-2076: a row-parallel bias added after them.
* ``quantized_tensor.py`` 858-1028 ``QuantizedTensor.__torch_dispatch__``: an op whose ``_schema.is_mutable``
  is False runs on ``maybe_unwrap``-ped (dequantized, nominal-dtype) copies.  torch's ``c10d.allreduce_`` and
  ``c10d._reduce_scatter_base_`` carry no alias annotation, so the all-reduce leaves the ``Float8Tensor`` as
  it was (each rank's own FP8 partial sum) while the reduce-scatter writes the sum of the dequantized
  partials into its plain ``torch.empty(dtype=inp.dtype)`` output.  :func:`te_dispatch_worker` checks both
  facts on gloo with a tensor subclass holding just that dispatch branch (a slow test of its own).
* ``distributed.py`` 989-1080 ``_all_gather_fp8``: an FP8 input is gathered as it is, every rank's codes
  read with this rank's ``_scale_inv``.

Each rank's partial is fp8sim's one-process ``Linear`` on the rank's shard (``fp8_output`` / ``fp8_grad`` on
one rank are tested against TE references elsewhere); the test writes out only the TP arithmetic: no sum
(all-reduce of an FP8 tensor), ``p_0 + p_1`` of the dequantized partials then this rank's rows
(reduce-scatter), the bias after.  The row and column cases run under delayed and current scaling (each
rank's partial cast unfused with its own amax), and an FP8 input also from a current-scaling producer.
Every "unquantized partials summed" alternative is checked to differ, so a sum taken before the FP8 cast
would fail.
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import torch
import torch.distributed as dist

S, K, N, K0, STEPS = 16, 32, 32, 16, 2


def _gather(t: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's ``t`` through its bytes (any dtype)."""
    u = t.detach().contiguous().view(torch.uint8)
    out = [torch.empty_like(u) for _ in range(2)]
    dist.all_gather(out, u)
    return [o.view(t.dtype) for o in out]


def _lin(inf: int, outf: int, w: torch.Tensor, b: torch.Tensor | None, dt: torch.dtype, **kw: object) -> object:
    import fp8sim.pytorch as te

    m = te.Linear(inf, outf, bias=b is not None, params_dtype=dt, **kw)
    with torch.no_grad():
        m.weight.copy_(w)
        if b is not None:
            m.bias.copy_(b)
    return m


def _ne(a: torch.Tensor | None, b: torch.Tensor | None) -> int:
    """Elements differing (bitwise on the values), or 1 for a missing tensor."""
    if a is None or b is None or a.shape != b.shape or a.dtype != b.dtype:
        return 1
    return int((a.detach() != b.detach()).sum())


def _state(m: object) -> tuple:
    g = m.fp8_gemms["gemm"]
    if g.fwd is None:  # current scaling: no state
        return ()
    return tuple(a.tobytes() for a in (g.fwd.scale, g.fwd.amax_history, g.bwd.scale, g.bwd.amax_history))


def _quirk(caught: list) -> int:
    from fp8sim._util.upstream_quirk import UpstreamQuirkWarning

    return sum(
        issubclass(w.category, UpstreamQuirkWarning) and "te-fp8-allreduce-noop" in str(w.message) for w in caught
    )


def _recipe(name: str) -> object:
    """The recipe of a case: delayed scaling (2-entry history) or current scaling with power-of-2 scales (the
    OUTPUT / GRAD_INPUT slots then round their scales, the QParams slots do not: TE quantization.py 1487-1495)."""
    from fp8sim.recipe import DelayedScaling, Float8CurrentScaling

    return DelayedScaling(amax_history_len=2) if name == "delayed" else Float8CurrentScaling(use_power_2_scales=True)


def _row(rank: int, tp: object, sp: bool, bias: bool, dt: torch.dtype, recipe_name: str = "delayed") -> list[dict]:
    """Row-parallel ``Linear(fp8_output=True)`` for 2 steps (delayed scaling: the second with the OUTPUT slot's
    scale from the reduced amax; current scaling: each rank's partial D in the activation dtype cast with its own
    amax, TE's output quantizer has no amax reduction) against this rank's one-process shard ``ref``
    (``fp8_output``) and ``ref_u`` (no FP8 output)."""
    import fp8sim.pytorch as te
    from fp8sim.pytorch.module._fp8_handoff import handoff_of

    torch.manual_seed(10)
    w, b = (torch.randn(N, K) * 0.2).to(dt), (torch.randn(N) * 0.1).to(dt)
    wr = w.chunk(2, 1)[rank]
    m = _lin(K, N, wr, b if bias else None, dt, parallel_mode="row", tp_group=tp, sequence_parallel=sp)
    ref, ref_u = _lin(K // 2, N, wr, None, dt), _lin(K // 2, N, wr, None, dt)
    recipe = _recipe(recipe_name)
    rows = (lambda t: t.chunk(2, 0)[rank]) if sp else (lambda t: t)
    add = (lambda t: t + b) if bias else (lambda t: t)
    out = []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(20 + step)
        x, dy = (torch.randn(S, K, generator=g) * (1 + step)).to(dt), (torch.randn(S, N, generator=g) * 1e-2).to(dt)
        xl, xr, xu = (x.chunk(2, 1)[rank].clone().requires_grad_() for _ in range(3))
        with warnings.catch_warnings(record=True) as caught, te.autocast(recipe=recipe):
            warnings.simplefilter("always")
            y = m(xl, fp8_output=True)
        y.backward(rows(dy))
        with te.autocast(recipe=recipe):
            p = ref(xr, fp8_output=True)
        p.backward(dy)  # the row layer's backward sees the whole grad output (gathered under sequence parallel)
        with te.autocast(recipe=recipe):
            u = ref_u(xu)
        u.backward(dy)
        ps, us = _gather(p), _gather(u)
        want = add(rows(ps[0] + ps[1])) if sp else add(p.detach())
        hy, hp = handoff_of(y), handoff_of(p)
        res = {"y": _ne(y, want), "dx": _ne(xl.grad, xr.grad), "dw": _ne(m.weight.grad, ref.weight.grad)}
        res["state"] = int(_state(m) != _state(ref))  # forward and backward scales and amax histories
        if sp or bias:  # TE returns a plain tensor: no FP8 data on it
            res["handoff"] = int(hy is not None)
        else:  # the Float8Tensor itself: this rank's codes and scale_inv
            res["handoff"] = int(hy is None or not torch.equal(hy.codes, hp.codes) or hy.sinv != hp.sinv)
        res["quirk"] = int(_quirk(caught) != (0 if sp else 1))
        # the alternatives TE does not compute must differ: the reduced sum (TP), unquantized partials (SP)
        res["alt"] = int(not _ne(y, add(rows(us[0] + us[1])) if sp else add(ps[0] + ps[1])))
        for t in (m.weight, ref.weight, ref_u.weight):
            t.grad = None
        out.append(res)
    return out


def _column(rank: int, tp: object, sp: bool, recipe_name: str = "delayed") -> list[dict]:
    """Column-parallel ``Linear(fp8_grad=True)`` (delayed or current scaling) for 2 steps against this rank's
    one-process shard with ``fp8_grad`` (``ref``) and without (``ref_u``): the input gradient is this rank's
    FP8 partial dgrad (TP: TE's all-reduce leaves it) or this rank's rows of ``g_0 + g_1`` (SP)."""
    import fp8sim.pytorch as te

    torch.manual_seed(11)
    w, b = torch.randn(N, K) * 0.2, torch.randn(N) * 0.1
    wr, br = w.chunk(2, 0)[rank], b.chunk(2)[rank]
    m = _lin(K, N, wr, br, torch.float32, parallel_mode="column", tp_group=tp, sequence_parallel=sp)
    ref, ref_u = _lin(K, N // 2, wr, br, torch.float32), _lin(K, N // 2, wr, br, torch.float32)
    recipe = _recipe(recipe_name)
    rows = (lambda t: t.chunk(2, 0)[rank]) if sp else (lambda t: t)
    out = []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(30 + step)
        x, dy = torch.randn(S, K, generator=g) * (1 + step), torch.randn(S, N, generator=g) * 1e-2 * (1 + step)
        dyl = dy.chunk(2, 1)[rank]
        xl = rows(x).clone().requires_grad_()
        xr, xu = (x.clone().requires_grad_() for _ in range(2))
        with warnings.catch_warnings(record=True) as caught, te.autocast(recipe=recipe):
            warnings.simplefilter("always")
            y = m(xl, fp8_grad=True)
        y.backward(dyl)
        with te.autocast(recipe=recipe):
            yr = ref(xr, fp8_grad=True)
        yr.backward(dyl)
        with te.autocast(recipe=recipe):
            yu = ref_u(xu)
        yu.backward(dyl)
        gs, us = _gather(xr.grad), _gather(xu.grad)
        want = rows(gs[0] + gs[1]) if sp else xr.grad
        res = {"y": _ne(y, yr), "dx": _ne(xl.grad, want), "dw": _ne(m.weight.grad, ref.weight.grad)}
        res["state"] = int(_state(m) != _state(ref))
        res["quirk"] = int(_quirk(caught) != (0 if sp else 1))
        res["alt"] = int(not _ne(xl.grad, rows(us[0] + us[1]) if sp else gs[0] + gs[1]))
        for t in (m.weight, ref.weight, ref_u.weight):
            t.grad = None
        out.append(res)
    return out


def _manual_handoff(x: torch.Tensor, scale: np.float32) -> torch.Tensor:
    """``x`` as an FP8 (E4M3) tensor with scale ``scale``: TE's cast written with ml_dtypes, the dequantized
    value carrying the codes (fp8sim's form of a ``Float8Tensor`` input)."""
    from fp8sim.formats import get_format
    from fp8sim.pytorch.module._fp8_handoff import FP8Handoff, attach

    s = (x.float() * torch.tensor(scale)).numpy()
    q = np.clip(s, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    vals = torch.from_numpy(q.astype(np.float32))
    sinv = float(np.float32(1) / scale)
    h = FP8Handoff(vals, torch.from_numpy(q.view(np.uint8).copy()), sinv, get_format("e4m3"))
    return attach((vals * torch.tensor(sinv, dtype=torch.float32)).requires_grad_(), h)


def _fp8_input(rank: int, tp: object, recipe_name: str, sp: bool) -> list[dict]:
    """An FP8 input to a column-parallel layer, 2 steps.  "delayed" / "current-fp8": from a producer
    ``Linear(fp8_output=True)`` (delayed: its OUTPUT scale is not the consumer's INPUT scale in step 2;
    current: each rank's own amax), the consumer with ``fp8_grad=True``; "current": a hand-made FP8 tensor
    with a scale of its own on each rank, a high-precision dgrad.  Under sequence parallel the codes are
    gathered and read with this rank's scale_inv (the reference: a one-process shard fed the gathered codes),
    without it used as they are.  The gradient to the producer: ``g_0 + g_1`` (this rank's rows under
    sequence parallel), high precision, except the FP8 dgrad under tensor parallel: this rank's FP8 partial,
    its codes handed to the producer (TE's all-reduce leaves the Float8Tensor)."""
    import fp8sim.pytorch as te
    from fp8sim.formats import get_format
    from fp8sim.pytorch.module._fp8_handoff import FP8Handoff, attach, handoff_of

    torch.manual_seed(12)
    w, b, pw = torch.randn(N, K) * 0.2, torch.randn(N) * 0.1, torch.randn(K, K0) * 0.3
    wr, br = w.chunk(2, 0)[rank], b.chunk(2)[rank]
    m = _lin(K, N, wr, br, torch.float32, parallel_mode="column", tp_group=tp, sequence_parallel=sp)
    ref = _lin(K, N // 2, wr, br, torch.float32)
    prod = _lin(K0, K, pw, None, torch.float32)
    delayed, producer = recipe_name == "delayed", recipe_name != "current"
    recipe = _recipe("delayed" if delayed else "current")
    local = producer and not sp  # the FP8 dgrad stays this rank's
    rows = (lambda t: t.chunk(2, 0)[rank]) if sp else (lambda t: t)
    out = []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(40 + 2 * step + rank)
        z = torch.randn(S // 2 if sp else S, K0, generator=g) * (1 + 3 * rank + step)
        dyl = torch.randn(S, N // 2, generator=g) * 1e-2
        with warnings.catch_warnings(record=True) as caught, te.autocast(recipe=recipe):
            warnings.simplefilter("always")
            if producer:
                h = prod(z, fp8_output=True)
            else:  # a scale of this rank's own: the other rank's codes are read with the wrong one, as in TE
                h = _manual_handoff(z @ pw.t(), np.float32(448) / np.float32((z @ pw.t()).abs().max().item()))
            h.retain_grad()
            y = m(h, fp8_grad=producer)
        y.backward(dyl)
        hh = handoff_of(h)
        codes = torch.cat(_gather(hh.codes)) if sp else hh.codes
        vals = torch.from_numpy(codes.numpy().view(ml_dtypes.float8_e4m3fn).astype(np.float32))
        xr = (vals * torch.tensor(hh.sinv)).requires_grad_()
        hr = FP8Handoff(vals, codes, hh.sinv, get_format("e4m3"))
        attach(xr, hr)
        with te.autocast(recipe=recipe):
            yr = ref(xr, fp8_grad=producer)
        yr.backward(dyl)
        gs = _gather(xr.grad)
        res = {"y": _ne(y, yr), "dx": _ne(h.grad, xr.grad if local else rows(gs[0] + gs[1]))}
        res["dw"] = _ne(m.weight.grad, ref.weight.grad)
        res["state"] = int(delayed and _state(m) != _state(ref))
        res["quirk"] = int(_quirk(caught) != int(local))
        if local:  # the producer's FP8 grad output: this rank's dgrad codes
            res["fp8_grad"] = int(hh.grad is None or not torch.equal(hh.grad.codes, hr.grad.codes))
            res["alt"] = int(not _ne(h.grad, gs[0] + gs[1]))
        else:  # a high-precision gradient: no FP8 data for the producer
            res["fp8_grad"] = int(hh.grad is not None)
        if sp:  # the alternative: each rank's codes read with that rank's own scale (TE assumes one scale)
            sinvs = _gather(torch.tensor([hh.sinv], dtype=torch.float32))
            own = torch.cat([v * s for v, s in zip(vals.chunk(2, 0), sinvs, strict=True)])
            res["alt"] = int(not delayed and (torch.equal(sinvs[0], sinvs[1]) or torch.equal(own, xr.detach())))
        for t in (m.weight, ref.weight, prod.weight):
            t.grad = None
        out.append(res)
    return out


class _TEDispatch(torch.Tensor):
    """Only the branch of TE's ``QuantizedTensor.__torch_dispatch__`` (quantized_tensor.py 1023-1028) that the
    c10d ops reach: not mutable, so the arguments are dequantized copies (here: ``_d`` in bf16)."""

    @staticmethod
    def __new__(cls, data: torch.Tensor) -> _TEDispatch:
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=torch.bfloat16)

    def __init__(self, data: torch.Tensor) -> None:
        self._d = data.clone()

    @classmethod
    def __torch_dispatch__(cls, func: object, types: object, args: tuple = (), kwargs: dict | None = None) -> object:
        from torch.utils._pytree import tree_map

        assert not func._schema.is_mutable, func
        args = tree_map(lambda a: a._d.to(torch.bfloat16) if isinstance(a, _TEDispatch) else a, args)
        return super().__torch_dispatch__(func, types, args, kwargs or {})

    __torch_function__ = torch._C._disabled_torch_function_impl


def te_dispatch_worker(rank: int, world: int) -> dict:
    """``dist.all_reduce`` on such a tensor leaves its data; ``reduce_scatter_tensor`` into a plain output sums
    the dequantized inputs (its own spawn, marked slow: the first c10d op on a tensor subclass imports
    ``torch.distributed.tensor``, about 2 s)."""
    torch.set_num_threads(1)
    t = _TEDispatch(torch.tensor([1.0 + rank, 10.0 + rank]))
    dist.all_reduce(t)
    out = torch.empty(1, dtype=torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        dist.reduce_scatter_tensor(out, t)
    return {
        "allreduce_keeps": torch.equal(t._d, torch.tensor([1.0 + rank, 10.0 + rank])),
        "reduce_scatter_sums": out.item() == (3.0 if rank == 0 else 21.0),
    }


def _schemas() -> dict:
    """Whether torch marks the c10d ops TE's tensors meet mutable (TE's dispatch branches on it)."""
    ops = {"allreduce_": torch.ops.c10d.allreduce_, "reduce_scatter": torch.ops.c10d._reduce_scatter_base_}
    return {name: bool(op.default._schema.is_mutable) for name, op in ops.items()}


def run_fp8_io(rank: int, tp: object) -> dict:
    """Every check of this module on this rank: element counts that differ (0 everywhere is a pass)."""
    import fp8sim.pytorch as te

    te.FP8GlobalStateManager.reset()
    res: dict = {"schemas": _schemas()}
    for sp, bias, dt in ((False, False, torch.float32), (False, True, torch.float32), (True, True, torch.float32)):
        res[f"row-{sp}-{bias}"] = _row(rank, tp, sp, bias, dt)
    res["row-bf16"] = _row(rank, tp, True, True, torch.bfloat16)
    res.update({f"col-{sp}": _column(rank, tp, sp) for sp in (False, True)})
    res.update({f"in-{r}-{sp}": _fp8_input(rank, tp, r, sp) for r in ("delayed", "current") for sp in (False, True)})
    # current scaling (unfused casts, no state): the same TP arithmetic on the FP8 partials
    for sp, bias, dt in ((False, False, torch.float32), (True, True, torch.bfloat16)):
        res[f"row-cs-{sp}-{bias}"] = _row(rank, tp, sp, bias, dt, "current")
    res.update({f"col-cs-{sp}": _column(rank, tp, sp, "current") for sp in (False, True)})
    res.update({f"in-current-fp8-{sp}": _fp8_input(rank, tp, "current-fp8", sp) for sp in (False, True)})
    return res
