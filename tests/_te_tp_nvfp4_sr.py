"""NVFP4 stochastic rounding under sequence parallelism, run inside test_distributed_te_tp.py's spawned worker.

TE quantizes each rank's shard of the tensor a sequence-parallel layer gathers, with that rank's random bits
and the amax MAX-reduced over ``tp_group``, then gathers data and scales (TE at d0067d0:
``transformer_engine/pytorch/distributed.py`` ``_all_gather_nvfp4`` 1332-1525, the data and scales gathered
1434-1512 and de-interleaved by ``_swap_first_dims`` 1258-1283 / ``_post_process_nvfp4_gather`` 1286-1303;
``module/base.py`` ``grad_output_preprocess`` 1721-1751 gathers a row-parallel grad output with its
quantizer; ``module/linear.py`` 810-824 sets its amax reduction group).  The references here quantize each
shard on its own with fp8sim's single-process NVFP4 quantizer (``fp8sim.scaling.quantize_nvfp4`` with the
shard's seed from the GEMM's counter, ``fp8sim.scaling.nvfp4_te_sr.quantize_nvfp4_te_sr`` with the rank's
Philox ``rng_state``) and the whole tensor's amax, then concatenate.  Which seeds a module's shard takes is
fp8sim's convention, not TE's (TE: each rank's CUDA generator state): the GEMM counter, alike on every rank;
what the checks pin is the per-shard quantization with reduced amaxes and TE's gathered layout.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist

S, K, N = 64, 64, 32  # rows (32 a rank), fc2 in_features (32 a rank), out_features: every block inside a shard


def _dq(q: object) -> torch.Tensor:
    return torch.from_numpy(q.dequantize())


def _amax(t: torch.Tensor) -> float:
    return float(t.float().abs().max())


def _grad_refs(dy: torch.Tensor, seed_row: int, seed_col: int) -> dict:
    """The gathered grad output as TE builds it (per shard, whole-tensor amaxes) and two wrong builds: the whole
    tensor quantized at once, and each shard with its own amax."""
    from fp8sim.scaling.nvfp4 import apply_rht, quantize_nvfp4

    shards = dy.chunk(2, 0)
    cols = [s.t().contiguous() for s in shards]  # (N, rows): the columnwise copy, RHT'd in bf16

    def row(x: torch.Tensor, amax: float | None) -> torch.Tensor:
        return _dq(quantize_nvfp4(x.float(), stochastic=True, seed=seed_row, global_amax=amax))

    def col(x: torch.Tensor, amax: float | None) -> torch.Tensor:
        return _dq(quantize_nvfp4(x, rht=True, stochastic=True, seed=seed_col, global_amax=amax))

    whole = {"row_whole": row(dy, None), "col_whole": col(dy.t().contiguous(), None)}
    if shards[0].shape[0] % 16:  # a shard TE cannot quantize: only the whole tensor's quantization
        return whole
    a_row, a_col = _amax(dy), max(_amax(apply_rht(c)) for c in cols)
    return {
        **whole,
        "row": torch.cat([row(s, a_row) for s in shards]),
        "col": torch.cat([col(c, a_col) for c in cols], 1),
        "row_own_amax": torch.cat([row(s, None) for s in shards]),
        "col_own_amax": torch.cat([col(c, None) for c in cols], 1),
    }


def _row_linear_grads(rank: int, tp: object, lnmlp: bool, rows: int = S) -> dict:
    """A row-parallel sequence-parallel ``Linear`` (or ``LayerNormMLP``'s fc2) under TE's default
    ``NVFP4BlockScaling()`` (SR on for the grad output): its dgrad and wgrad against the per-shard reference.
    Reference GEMMs: torch's float32 matmul of the dequantized operands, as one process computes them.
    ``rows`` 16 (8 a rank): a shard TE cannot quantize, gathered in high precision (TE's warning)."""
    import fp8sim.pytorch as te
    from fp8sim.recipe import NVFP4BlockScaling
    from fp8sim.scaling.nvfp4 import quantize_nvfp4

    te.FP8GlobalStateManager.reset()
    dt = torch.bfloat16
    g = torch.Generator().manual_seed(500 + lnmlp)
    w = (torch.randn(N, K, generator=g) * 0.1).to(dt)
    dy = (torch.randn(rows, N, generator=g) * 1e-2).to(dt)
    dy[rows // 2 :] *= 3  # the two shards' amaxes differ: an unreduced amax changes the scales
    seen = {}
    if lnmlp:
        m = te.LayerNormMLP(N, K, tp_group=tp, sequence_parallel=True, set_parallel_mode=True, params_dtype=dt)
        with torch.no_grad():
            m.fc2_weight.copy_(w.chunk(2, 1)[rank])
        inner, weight, state = m._tp_linear, m.fc2_weight, m.fp8_gemms["fc2"]

        def spy(mode: str, name: str, x: torch.Tensor, *a: object, **kw: object) -> torch.Tensor:
            if name == "fc2":
                seen["x"] = x.detach().clone()  # the GEMM's own input (this rank's K columns)
            return inner(mode, name, x, *a, **kw)

        m._tp_linear = spy
        xl = (torch.randn(S, N, generator=g) * 1 + 0.5).to(dt).chunk(2, 0)[rank].clone().requires_grad_()
    else:
        m = te.Linear(K, N, tp_group=tp, parallel_mode="row", sequence_parallel=True, params_dtype=dt)
        with torch.no_grad():
            m.weight.copy_(w.chunk(2, 1)[rank])
        weight, state = m.weight, m.fp8_gemms["gemm"]
        xl = (torch.randn(rows, K, generator=g)).to(dt).chunk(2, 1)[rank].clone().requires_grad_()
        seen["x"] = xl.detach()
    with te.autocast(recipe=NVFP4BlockScaling()):
        y = m(xl)
    c = state.calls  # the GEMM's SR counter: the grad output's rowwise copy draws c + 1, its columnwise c + 2
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y.backward(dy.chunk(2, 0)[rank])
    fallback = "Cannot quantize input tensor. Performing all-gather in high precision."  # TE distributed.py 1391
    ref = _grad_refs(dy, c + 1, c + 2)
    w_col = _dq(quantize_nvfp4(weight.detach().float().t().contiguous(), block_2d=True)).t()  # 16x16 weight tiles
    x_col = _dq(quantize_nvfp4(seen["x"].bfloat16().t().contiguous(), rht=True)).t()  # input, RHT'd columnwise
    out = {"dw": weight.grad, "warned": any(str(w.message) == fallback for w in caught)}
    for k in [k for k in ("", "_whole", "_own_amax") if f"col{k}" in ref]:
        out[f"dw_want{k}"] = torch.matmul(ref[f"col{k}"], x_col).to(dt)
    if not lnmlp:
        out["dx"] = xl.grad
        for k in [k for k in ("", "_whole", "_own_amax") if f"row{k}" in ref]:
            out[f"dx_want{k}"] = torch.matmul(ref[f"row{k}"], w_col).to(dt)
    return out


def _column_input(rank: int, tp: object) -> dict:
    """A column-parallel sequence-parallel ``Linear`` under a custom NVFP4 recipe with SR on the input
    (``fp4_quant_fwd_inp = QParams(random_hadamard_transform=True, stochastic_rounding=True)``; TE's quantizer
    refuses SR only with 4over6 or row scaling, csrc/quantizer.cpp 2563-2577): the forward output (rowwise copy,
    seed ``c + 1``) and wgrad (the gathered columnwise copy, seed ``c + 4`` after the weight's two) against
    the per-shard reference; the grad output is this rank's and quantized whole (seeds ``b + 1``, ``b + 2``)."""
    import fp8sim.pytorch as te
    from fp8sim.recipe import NVFP4BlockScaling, QParams
    from fp8sim.scaling.nvfp4 import apply_rht, quantize_nvfp4

    te.FP8GlobalStateManager.reset()
    dt = torch.bfloat16
    g = torch.Generator().manual_seed(700)
    w = (torch.randn(N, K, generator=g) * 0.1).to(dt)
    x = torch.randn(S, K, generator=g).to(dt)
    x[S // 2 :] *= 2
    dy = (torch.randn(S, N // 2, generator=g) * 1e-2).to(dt)
    recipe = NVFP4BlockScaling()
    recipe.fp4_quant_fwd_inp = QParams(random_hadamard_transform=True, stochastic_rounding=True)
    m = te.Linear(K, N, bias=False, tp_group=tp, parallel_mode="column", sequence_parallel=True, params_dtype=dt)
    with torch.no_grad():
        m.weight.copy_(w.chunk(2, 0)[rank])
    xl = x.chunk(2, 0)[rank].clone().requires_grad_()
    c = m.fp8_gemms["gemm"].calls
    with te.autocast(recipe=recipe):
        y = m(xl)
    b = m.fp8_gemms["gemm"].calls
    y.backward(dy)
    shards = x.chunk(2, 0)
    cols = [s.t().contiguous() for s in shards]
    a_col = max(_amax(apply_rht(t)) for t in cols)

    def rows(amax: float | None) -> torch.Tensor:
        return torch.cat(
            [_dq(quantize_nvfp4(s.float(), stochastic=True, seed=c + 1, global_amax=amax)) for s in shards]
        )

    x_col = torch.cat(
        [_dq(quantize_nvfp4(t, rht=True, stochastic=True, seed=c + 4, global_amax=a_col)) for t in cols], 1
    )
    x_whole = _dq(quantize_nvfp4(x.t().contiguous(), rht=True, stochastic=True, seed=c + 4))
    wl = m.weight.detach()
    w_row = _dq(quantize_nvfp4(wl.float(), block_2d=True))
    dy_col = _dq(quantize_nvfp4(dy.t().contiguous(), rht=True, stochastic=True, seed=b + 2))
    want_y = torch.matmul(rows(_amax(x)), w_row.t()).to(dt)
    whole_y = torch.matmul(_dq(quantize_nvfp4(x.float(), stochastic=True, seed=c + 1)), w_row.t()).to(dt)
    return {
        "y": int((y != want_y).sum()),
        "y.whole_differs": int((y != whole_y).sum()),
        "y.own_amax_differs": int((y != torch.matmul(rows(None), w_row.t()).to(dt)).sum()),
        "dw": int((m.weight.grad != torch.matmul(dy_col, x_col.t()).to(dt)).sum()),
        "dw.whole_differs": int((m.weight.grad != torch.matmul(dy_col, x_whole.t()).to(dt)).sum()),
    }


def _4over6_sr_refusal(tp: object) -> str:
    """SR on a 4over6 input under sequence parallelism: TE's refusal (csrc/quantizer.cpp 2563-2564), not a
    per-shard gather."""
    import fp8sim.pytorch as te
    from fp8sim.recipe import NVFP4BlockScaling, QParams

    recipe = NVFP4BlockScaling(nvfp4_4over6="activations")
    recipe.fp4_quant_fwd_inp = QParams(stochastic_rounding=True)
    m = te.Linear(K, N, tp_group=tp, parallel_mode="column", sequence_parallel=True)
    try:
        with te.autocast(recipe=recipe):
            m(torch.randn(S // 2, K))
    except ValueError as exc:
        return str(exc)
    return ""


def _quantizer_gather(rank: int, tp: object) -> dict:
    """``all_gather_nvfp4`` with ``NVFP4Quantizer.te_rng_generator`` seeded per rank: the gathered codes are each
    shard's TE Philox cast (``quantize_nvfp4_te_sr`` with the rank's ``rng_state`` and the whole tensor's
    amax), concatenated as TE lays them; the scales and amaxes are the whole tensor's quantization's."""
    from fp8sim.pytorch._comm import _all_gather_nvfp4 as all_gather_nvfp4
    from fp8sim.pytorch.tensor.nvfp4_tensor import NVFP4Quantizer
    from fp8sim.scaling.nvfp4_te_sr import TEPhiloxGenerator, quantize_nvfp4_te_sr
    from fp8sim.scaling.packing import unpack_fp4

    x = (torch.randn(S, N, generator=torch.Generator().manual_seed(600)) * 2).bfloat16()
    q = NVFP4Quantizer(with_amax_reduction=True, amax_reduction_group=tp, stochastic_rounding=True)
    q.te_rng_generator = TEPhiloxGenerator(seed=1000 + rank)
    got = all_gather_nvfp4(x.chunk(2, 0)[rank], tp, q)
    refs = [quantize_nvfp4_te_sr(s, 1000 + r, 0, global_amax=_amax(x)) for r, s in enumerate(x.chunk(2, 0))]
    whole_q = NVFP4Quantizer(stochastic_rounding=True)
    whole_q.te_rng_generator = TEPhiloxGenerator(seed=1000)
    whole = whole_q(x)
    rht = {"with_rht": True, "with_post_rht_amax": True, "stochastic_rounding": True}
    q_rht = NVFP4Quantizer(with_amax_reduction=True, amax_reduction_group=tp, **rht)
    q_rht.te_rng_generator = TEPhiloxGenerator(seed=2000 + rank)
    got_rht, whole_rht = all_gather_nvfp4(x.chunk(2, 0)[rank], tp, q_rht), NVFP4Quantizer(**rht)(x)
    pre = all_gather_nvfp4(q(x.chunk(2, 0)[rank]), tp, q)  # an NVFP4Tensor input: its own data gathered
    rn = {"with_rht": True, "with_post_rht_amax": True}  # round to nearest: every field is the whole tensor's
    q_rn = NVFP4Quantizer(with_amax_reduction=True, amax_reduction_group=tp, **rn)
    got_rn, whole_rn = all_gather_nvfp4(x.chunk(2, 0)[rank], tp, q_rn), NVFP4Quantizer(**rn)(x)
    codes_r = unpack_fp4(got._rowwise_data.reshape(S, N // 2))
    codes_c = unpack_fp4(got._columnwise_data)
    fields = ("_rowwise_scale_inv", "_columnwise_scale_inv", "_amax_rowwise", "_amax_columnwise")
    want_r = torch.cat([torch.from_numpy(r.rowwise.codes) for r in refs])
    want_c = torch.cat([torch.from_numpy(r.columnwise.codes) for r in refs], 1)
    return {
        "shape": tuple(got.shape) == (S, N) and tuple(got._columnwise_data.shape) == (N, S // 2),
        "codes_rowwise": torch.equal(codes_r, want_r),
        "codes_columnwise": torch.equal(codes_c, want_c),
        "whole_codes_differ": not torch.equal(got._rowwise_data, whole._rowwise_data),
        "scales": all(torch.equal(getattr(got, f), getattr(whole, f)) for f in fields),
        "scales_rht": all(torch.equal(getattr(got_rht, f), getattr(whole_rht, f)) for f in fields),
        "rn_all_fields": all(
            torch.equal(getattr(got_rn, f), getattr(whole_rn, f))
            for f in (*fields, "_rowwise_data", "_columnwise_data")
        ),
        "nvfp4_input_scales": all(torch.equal(getattr(pre, f), getattr(whole, f)) for f in fields),
        "dequantized_near": bool((got.dequantize().float() - x.float()).abs().max() < 2 * _amax(x) / 6),
        "same_on_ranks": _same_on_ranks(got._rowwise_data, tp) and _same_on_ranks(got._columnwise_data, tp),
    }


def _same_on_ranks(t: torch.Tensor, tp: object) -> bool:
    other = [torch.empty_like(t) for _ in range(2)]
    dist.all_gather(other, t.contiguous(), group=tp)
    return torch.equal(other[0], other[1])


def run_nvfp4_sr(rank: int, tp: object) -> dict:
    """Every check's outcome (element counts of differences, or booleans), picklable."""
    res = {}
    for name, lnmlp in (("linear", False), ("lnmlp", True)):
        o = _row_linear_grads(rank, tp, lnmlp)
        for k in ("dw", "dx"):
            if k not in o:
                continue
            res[f"{name}.{k}"] = int((o[k] != o[f"{k}_want"]).sum())
            res[f"{name}.{k}.whole_differs"] = int((o[k] != o[f"{k}_want_whole"]).sum())
            res[f"{name}.{k}.own_amax_differs"] = int((o[k] != o[f"{k}_want_own_amax"]).sum())
    small = _row_linear_grads(rank, tp, False, rows=16)  # 8 rows a rank: TE's high-precision gather
    res["fallback"] = {"warned": small["warned"], "dx": int((small["dx"] != small["dx_want_whole"]).sum())}
    res["fallback"]["dw"] = int((small["dw"] != small["dw_want_whole"]).sum())
    res["column"] = _column_input(rank, tp)
    res["quantizer"] = _quantizer_gather(rank, tp)
    res["4over6"] = _4over6_sr_refusal(tp)
    return res
