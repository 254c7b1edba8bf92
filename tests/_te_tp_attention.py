"""The MultiheadAttention / TransformerLayer and block-recipe checks of test_distributed_te_tp.py, run inside
that file's one 2-rank spawn (its ``_worker`` calls :func:`_run_attention`, :func:`_run_block` and
:func:`_per_shard_then_gather`); the oracles are described in their docstrings.

What in these references is independent of fp8sim: the tensor-parallel arithmetic (which shard each rank holds,
the sums over ranks, where the bias and the amax reductions go), written here from TE's code.  What is not: each
shard's own forward and backward, which the reference computes with fp8sim's one-process modules (their GEMMs
and casts are checked against TE references and exact sums in the single-process tests, e.g.
``test_pytorch_fp8_boundaries_current.py``, ``test_pytorch_module_accumulators.py``,
``test_pytorch_attention_fp8.py``).  So these tests catch a wrong TP data flow, not a wrong GEMM."""

from __future__ import annotations

import torch
import torch.distributed as dist

H, F = 32, 64  # hidden and FFN sizes


# -- MultiheadAttention and TransformerLayer --------------------------------------------------------
AS, AB, HEADS, GROUPS, KV = 16, 2, 4, 2, 8  # sbhd [16, 2, 32]; 4 heads in 2 GQA groups, 2 heads / 1 group a rank
ATT_CASES = [(m, r, sp) for m in ("mha", "layer") for r in ("hp", "delayed", "current") for sp in (False, True)]
ATT_CASES += [("cross", r, sp) for r in ("hp", "current") for sp in (False, True)]
ATT_CASES += [("rope", "current", sp) for sp in (False, True)]  # the TransformerLayer with rotary embeddings
# FP8 attention (fp8_dpa: FP8 O into proj, FP8 dO from proj under delayed; fp8_mha: FP8 Q, K, V from the QKV GEMM too)
ATT_CASES += [("mha", "dpa-delayed", sp) for sp in (False, True)]
ATT_CASES += [("layer", "dpa-current", sp) for sp in (False, True)]
ATT_CASES += [("mha", "mha-delayed", False), ("layer", "mha-delayed", True), ("cross", "mha-delayed", True)]
ATT_CASES += [("rope", "mha-delayed", False)]  # fp8_mha with RoPE: the QKV output stays high precision (TE)
QKV = ("query_weight", "key_weight", "value_weight", "query_bias", "key_bias", "value_bias")


def _qkv_param(kind: str, name: str) -> str:
    """Where TE keeps a QKV parameter: ``qkv.{query,key,value}_*`` (self attention; ``layernorm_qkv`` in the
    TransformerLayer), ``query_layer.{weight,bias}`` and ``key_value.{key,value}_*`` (cross attention)."""
    if kind == "cross":
        return "query_layer." + name.split("_")[1] if name.startswith("query") else "key_value." + name
    return ("self_attention.layernorm_qkv." if kind in ("layer", "rope") else "qkv.") + name


def _attn_weights(layer: bool) -> dict:
    torch.manual_seed(3)
    w = {n: torch.randn(*shape) * 0.2 for n, shape in (("query_weight", (H, H)), ("key_weight", (16, H)))}
    w.update(value_weight=torch.randn(16, H) * 0.2, proj_weight=torch.randn(H, H) * 0.2)
    w.update({n: torch.randn(k) * 0.1 for n, k in (("query_bias", H), ("key_bias", 16), ("value_bias", 16))})
    w["proj_bias"] = torch.randn(H) * 0.1
    if layer:
        w.update(fc1_weight=torch.randn(F, H) * 0.1, fc1_bias=torch.randn(F) * 0.1, fc2_weight=torch.randn(H, F) * 0.1)
        w.update(fc2_bias=torch.randn(H) * 0.1)
        w.update({n: (1 if n.endswith("w") else 0) + torch.randn(H) * 0.1 for n in ("ln1w", "ln1b", "ln2w", "ln2b")})
    return w


def _shard(w: dict, name: str, r: int) -> torch.Tensor:
    """TE's shard of rank ``r``: rows of the column-parallel QKV and fc1 weights and biases (each of query, key,
    value divided on its own: heads ``2r, 2r+1`` and GQA group ``r``), columns of proj and fc2."""
    return w[name].chunk(2, 1 if name in ("proj_weight", "fc2_weight") else 0)[r]


def _ref_attention(w: dict, s: int, kind: str) -> object:
    """Shard ``s`` as one process computes it: a 2-head, 1-group MultiheadAttention (tp_size=1) holding the
    shard, its proj bias zero (TE adds the row-parallel bias after the reduction)."""
    import fp8sim.pytorch as te

    cross = kind == "cross"
    m = te.MultiheadAttention(
        H, 2, kv_channels=KV, num_gqa_groups=1, attention_dropout=0.0, attention_type="cross" if cross else "self"
    )
    params = dict(m.named_parameters())
    with torch.no_grad():
        for n in QKV:
            params[_qkv_param("cross" if cross else "mha", n)].copy_(_shard(w, n, s))
        m.proj.weight.copy_(_shard(w, "proj_weight", s))
        m.proj.bias.zero_()
    return m


def _ref_mlp(w: dict, s: int) -> tuple:
    import fp8sim.pytorch as te

    fc1, fc2 = te.Linear(H, F // 2), te.Linear(F // 2, H)
    with torch.no_grad():
        fc1.weight.copy_(_shard(w, "fc1_weight", s))
        fc1.bias.copy_(_shard(w, "fc1_bias", s))
        fc2.weight.copy_(_shard(w, "fc2_weight", s))
        fc2.bias.zero_()
    return fc1, fc2


def _by_rows(t: torch.Tensor, leaves: dict, name: str, fn: object) -> torch.Tensor:
    """``fn(part, *leaves)`` on each row part of ``t`` (each part with its own leaves), concatenated."""
    parts = t.chunk(len(leaves[name if name in leaves else name + "w"]), 0)
    if name in leaves:
        return torch.cat([fn(p, leaves[name][i]) for i, p in enumerate(parts)])
    return torch.cat([fn(p, leaves[name + "w"][i], leaves[name + "b"][i]) for i, p in enumerate(parts)])


class _SumOverShards(torch.autograd.Function):
    """The test's own row-parallel reduction: every rank's partial output gathered, ``p_0 + p_1`` (one float32
    add, rank order); backward: the replicated gradient, as TE's all-reduce (linear.py 568-577)."""

    @staticmethod
    def forward(ctx: object, p: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        parts = _gather_bytes(p, None)
        return parts[0] + parts[1]

    @staticmethod
    def backward(ctx: object, g: torch.Tensor) -> torch.Tensor:
        return g


class _SumGradsOverShards(torch.autograd.Function):
    """Identity forward; backward: every rank's column-parallel dgrad gathered and summed ``g_0 + g_1``
    (TE's dgrad all-reduce, linear.py 1122-1132), before the norm's backward."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x.view_as(x)

    @staticmethod
    def backward(ctx: object, g: torch.Tensor) -> torch.Tensor:
        parts = _gather_bytes(g, None)
        return parts[0] + parts[1]


def _ref_forward(
    xr: torch.Tensor, leaves: dict, att: object, mlp: tuple | None, enc: torch.Tensor | None, rope: object = None
) -> torch.Tensor:
    """The reference forward of :func:`_run_attention` on the full input ``xr``: this rank's shard modules
    (one-process, tp_size=1) between the test's own sums over the two ranks."""
    from fp8sim.pytorch.module._normalization import normalize

    def norm(p: torch.Tensor, g: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return normalize(p, g, b, 1e-5, "LayerNorm", False)

    def add(p: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return p + b

    a_in = _by_rows(xr, leaves, "ln1", norm) if mlp else xr
    kw = {} if enc is None else {"encoder_output": _SumGradsOverShards.apply(enc)}
    if rope is not None:
        kw["rotary_pos_emb"] = rope
    attn = _by_rows(_SumOverShards.apply(att(_SumGradsOverShards.apply(a_in), **kw)), leaves, "proj_bias", add)
    if not mlp:
        return attn
    h = xr + attn
    ln2 = _SumGradsOverShards.apply(_by_rows(h, leaves, "ln2", norm))
    f = _SumOverShards.apply(mlp[1](torch.relu(mlp[0](ln2))))
    return h + _by_rows(f, leaves, "fc2_bias", add)


def _run_attention(rank: int, kind: str, recipe_name: str, sp: bool, tp_group: object) -> list[dict]:
    """``MultiheadAttention(32, 4, num_gqa_groups=2, set_parallel_mode=True)`` (``kind="mha"``; ``"cross"``: its
    cross attention, the encoder output sharded like the input under sequence parallel) or
    ``TransformerLayer(32, 64, 4, num_gqa_groups=2, activation="relu", set_parallel_mode=True)`` on 2 ranks,
    against the reference of TE's TP arithmetic (TE multi_head_attention.py 327-339 and 362-475, transformer.py
    496-530, linear.py 568-577 and 1122-1132): each rank runs its own shard as one process computes it
    (:func:`_ref_attention`, :func:`_ref_mlp`: tp_size=1 modules) on the whole tensors, between the test's own
    sums over the ranks (:class:`_SumOverShards`: the row-parallel partial outputs ``p_0 + p_1`` in float32,
    the bias added after; :class:`_SumGradsOverShards`: the column-parallel dgrads ``g_0 + g_1`` before the
    norm's backward); norms and residuals row-wise, on this rank's rows under sequence parallel (each
    norm-parameter and row-bias gradient over those rows).  Current scaling: a sequence-parallel gathered
    input or grad output is quantized with the amax reduced over the TP group, which is the amax of the whole
    tensor the reference shard sees; every other amax is the shard's own.  Delayed scaling (3 steps): the
    reference's autocast MAX-reduces each slot's amax over the two ranks' shards as TE's
    ``reduce_and_update_fp8_tensors`` does (checked by hand for Linear in test_distributed_te_tp.py).  With
    ``fp8_dpa`` / ``fp8_mha`` TE sets the FP8 boundaries with no TP condition (multi_head_attention.py 900-921),
    so the reference's one-process shard runs them too; DPA is a TE module (dot_product_attention.py 415, 917-936)
    whose fp8_meta joins the region's global buffer with the autocast's group (base.py 1561, 1632;
    quantization.py 656), so its amaxes are MAX-reduced like the GEMMs' and its state must equal the
    reference's."""
    import fp8sim.pytorch as te
    from fp8sim.recipe import DelayedScaling, Float8CurrentScaling

    te.FP8GlobalStateManager.reset()
    layer = kind in ("layer", "rope")
    rope = te.RotaryPositionEmbedding(KV)(AS) if kind == "rope" else None  # the whole sequence's angles
    w = _attn_weights(layer)
    kw = {"tp_group": tp_group, "sequence_parallel": sp, "set_parallel_mode": True, "attention_dropout": 0.0}
    mlp, cross = "layernorm_mlp.", kind == "cross"
    if layer:
        tp = te.TransformerLayer(H, F, HEADS, num_gqa_groups=GROUPS, hidden_dropout=0.0, activation="relu", **kw)
        pre = "self_attention.layernorm_qkv."
    else:
        tp = te.MultiheadAttention(H, HEADS, num_gqa_groups=GROUPS, attention_type="cross" if cross else "self", **kw)
    params = dict(tp.named_parameters())
    proj = "self_attention.proj." if layer else "proj."
    with torch.no_grad():
        for n in QKV:
            params[_qkv_param(kind, n)].copy_(_shard(w, n, rank))
        params[proj + "weight"].copy_(_shard(w, "proj_weight", rank))
        params[proj + "bias"].copy_(w["proj_bias"])
        if layer:
            for n in ("fc1_weight", "fc1_bias", "fc2_weight"):
                params[mlp + n].copy_(_shard(w, n, rank))
            params[mlp + "fc2_bias"].copy_(w["fc2_bias"])
            for p, n in ((pre, "ln1"), (mlp, "ln2")):
                params[p + "layer_norm_weight"].copy_(w[n + "w"])
                params[p + "layer_norm_bias"].copy_(w[n + "b"])
    recipe = {
        "hp": None,
        "delayed": DelayedScaling(),
        "current": Float8CurrentScaling(),
        "dpa-delayed": DelayedScaling(fp8_dpa=True),
        "dpa-current": Float8CurrentScaling(fp8_dpa=True),
        "mha-delayed": DelayedScaling(fp8_dpa=True, fp8_mha=True),
    }[recipe_name]
    delayed = recipe_name.endswith("delayed")
    ref_att = _ref_attention(w, rank, kind)
    ref_params = dict(ref_att.named_parameters())
    ref_mlp = _ref_mlp(w, rank) if layer else None
    mine = rank if sp else 0
    out = []
    for step in range(3 if delayed else 2):
        g = torch.Generator().manual_seed(200 + step)
        x, dy = torch.randn(AS, AB, H, generator=g), torch.randn(AS, AB, H, generator=g) * 1e-2
        xl = (x.chunk(2, 0)[rank] if sp else x).clone().requires_grad_()
        e = torch.randn(AS, AB, H, generator=g)  # cross attention's encoder output (sharded like x)
        el = (e.chunk(2, 0)[rank] if sp else e).clone().requires_grad_()
        for p in (*tp.parameters(), *ref_att.parameters(), *(q for m in ref_mlp or () for q in m.parameters())):
            p.grad = None
        with te.autocast(enabled=recipe is not None, recipe=recipe):
            y = tp(xl, encoder_output=el) if cross else tp(xl, rotary_pos_emb=rope)
        y.backward(dy.chunk(2, 0)[rank] if sp else dy)
        # the reference on the full tensors, every row part (one without sequence parallel) its own bias leaves
        n_parts = 2 if sp else 1
        names = ("proj_bias", "fc2_bias", "ln1w", "ln1b", "ln2w", "ln2b") if layer else ("proj_bias",)
        leaves = {n: [w[n].clone().requires_grad_() for _ in range(n_parts)] for n in names}
        xr, er = x.clone().requires_grad_(), e.clone().requires_grad_()
        with te.autocast(enabled=recipe is not None, recipe=recipe):  # delayed: amaxes MAX-reduced over the ranks
            yr = _ref_forward(xr, leaves, ref_att, ref_mlp, er if cross else None, rope)
        yr.backward(dy)
        rows = (lambda t: t.chunk(2, 0)[rank]) if sp else (lambda t: t)
        pairs = {"y": (y, rows(yr)), "dx": (xl.grad, rows(xr.grad))}
        if cross:
            pairs["denc"] = (el.grad, rows(er.grad))
        for n in QKV:
            pairs["d" + n] = (
                params[_qkv_param(kind, n)].grad,
                ref_params[_qkv_param("cross" if cross else "mha", n)].grad,
            )
        pairs["dproj_w"] = (params[proj + "weight"].grad, ref_att.proj.weight.grad)
        pairs["dproj_b"] = (params[proj + "bias"].grad, leaves["proj_bias"][mine].grad)
        if layer:
            fc1, fc2 = ref_mlp
            pairs.update(dfc1_w=(params[mlp + "fc1_weight"].grad, fc1.weight.grad))
            pairs.update(dfc1_b=(params[mlp + "fc1_bias"].grad, fc1.bias.grad))
            pairs.update(dfc2_w=(params[mlp + "fc2_weight"].grad, fc2.weight.grad))
            pairs.update(dfc2_b=(params[mlp + "fc2_bias"].grad, leaves["fc2_bias"][mine].grad))
            for p, n in ((pre, "ln1"), (mlp, "ln2")):
                pairs[f"d{n}_w"] = (params[p + "layer_norm_weight"].grad, leaves[n + "w"][mine].grad)
                pairs[f"d{n}_b"] = (params[p + "layer_norm_bias"].grad, leaves[n + "b"][mine].grad)
        if delayed and recipe.fp8_dpa:  # DPA's own delayed-scaling state, amaxes reduced as the reference's
            dpa, ref_dpa = tp.self_attention.core_attention if layer else tp.core_attention, ref_att.core_attention
            for d in ("fwd", "bwd"):
                for a in ("scale", "amax_history"):
                    mine_s, ref_s = getattr(getattr(dpa, d), a), getattr(getattr(ref_dpa, d), a)
                    pairs[f"dpa.{d}.{a}"] = (torch.from_numpy(mine_s.copy()), torch.from_numpy(ref_s.copy()))
        diffs = {k: int((a.detach() != b.detach()).sum()) if a.shape == b.shape else -1 for k, (a, b) in pairs.items()}
        out.append(diffs)
    states = {  # every GEMM's delayed-scaling scales and amax history after the steps, as bytes
        f"{n}.{g}.{k}": getattr(getattr(st, d), a).tobytes()
        for n, m in tp.named_modules()
        for g, st in getattr(m, "fp8_gemms", {}).items()
        if st.fwd is not None
        for d in ("fwd", "bwd")
        for k, a in ((d + ".scale", "scale"), (d + ".hist", "amax_history"))
    }
    states.update(  # and DPA's (fp8_dpa), its own module as in TE
        {
            f"{n}.{d}.{a}": getattr(getattr(m, d), a).tobytes()
            for n, m in tp.named_modules()
            if type(m).__name__ == "DotProductAttention" and m.fwd is not None
            for d in ("fwd", "bwd")
            for a in ("scale", "amax_history")
        }
    )
    return out + [{"states": states}] if delayed else out


# -- block recipes under sequence parallelism ---------------------------------------------------------------
BS, BH, BF = 256, 128, 256  # 128 rows a rank: every block (1x32/32x1, 1x128/128x1, 1x16/16x1) inside a shard
BLOCK_RECIPES = ("mxfp8", "blockwise", "nvfp4")


def _block_recipe(name: str) -> object:
    from fp8sim.recipe import Float8BlockScaling, MXFP8BlockScaling, NVFP4BlockScaling

    # NVFP4: RHT on (its post-RHT amax is reduced too), stochastic rounding off (each rank draws its own bits)
    return {
        "mxfp8": MXFP8BlockScaling,
        "blockwise": Float8BlockScaling,
        "nvfp4": lambda: NVFP4BlockScaling(disable_stochastic_rounding=True),
    }[name]()


def _run_block(rank: int, recipe_name: str, tp_group: object) -> dict:
    """bf16 ``Linear(column) -> relu -> Linear(row)`` with ``sequence_parallel`` under a block recipe, against
    the per-shard reference of :func:`_run_attention` (each shard's GEMMs as one process computes them on the
    whole gathered input and grad output, TE's two-rank sums in bf16, the row bias after): TE quantizes each
    shard and gathers codes and scales (``distributed.py`` ``_all_gather_mxfp8`` 1527-1690,
    ``_start_all_gather_fp8_blockwise`` 1083-1230, ``_all_gather_nvfp4`` 1332-1525), which
    :func:`_per_shard_then_gather` shows is the whole tensor's quantization."""
    import fp8sim.pytorch as te

    te.FP8GlobalStateManager.reset()
    torch.manual_seed(4)
    dt = torch.bfloat16
    w1, b1 = (torch.randn(BF, BH) * 0.1).to(dt), (torch.randn(BF) * 0.1).to(dt)
    w2, b2 = (torch.randn(BH, BF) * 0.1).to(dt), (torch.randn(BH) * 0.1).to(dt)
    kw = {"tp_group": tp_group, "sequence_parallel": True, "params_dtype": dt}
    fc1, fc2 = te.Linear(BH, BF, parallel_mode="column", **kw), te.Linear(BF, BH, parallel_mode="row", **kw)
    r1, r2 = [], []
    for s in range(2):
        a, b = te.Linear(BH, BF // 2, params_dtype=dt), te.Linear(BF // 2, BH, params_dtype=dt)
        with torch.no_grad():
            a.weight.copy_(w1.chunk(2, 0)[s])
            a.bias.copy_(b1.chunk(2)[s])
            b.weight.copy_(w2.chunk(2, 1)[s])
            b.bias.zero_()
        r1.append(a)
        r2.append(b)
    with torch.no_grad():
        fc1.weight.copy_(w1.chunk(2, 0)[rank])
        fc1.bias.copy_(b1.chunk(2)[rank])
        fc2.weight.copy_(w2.chunk(2, 1)[rank])
        fc2.bias.copy_(b2)
    recipe = _block_recipe(recipe_name)
    g = torch.Generator().manual_seed(300)
    x, dy = torch.randn(BS, BH, generator=g).to(dt), (torch.randn(BS, BH, generator=g) * 1e-2).to(dt)
    xl = x.chunk(2, 0)[rank].clone().requires_grad_()
    with te.autocast(recipe=recipe):
        y = fc2(torch.relu(fc1(xl)))
    y.backward(dy.chunk(2, 0)[rank])
    xr = x.clone().requires_grad_()
    leaves = [b2.clone().requires_grad_() for _ in range(2)]
    with te.autocast(recipe=recipe):
        p = [r2[s](torch.relu(r1[s](xr))) for s in range(2)]
    yr = torch.cat([part + leaves[i] for i, part in enumerate((p[0] + p[1]).chunk(2, 0))])
    yr.backward(dy)
    pairs = {
        "y": (y, yr.chunk(2, 0)[rank]),
        "dx": (xl.grad, xr.grad.chunk(2, 0)[rank]),
        "dw1": (fc1.weight.grad, r1[rank].weight.grad),
        "db1": (fc1.bias.grad, r1[rank].bias.grad),
        "dw2": (fc2.weight.grad, r2[rank].weight.grad),
        "db2": (fc2.bias.grad, leaves[rank].grad),
    }
    return {k: int((a.detach() != b.detach()).sum()) if a.shape == b.shape else -1 for k, (a, b) in pairs.items()}


def _gather_bytes(t: torch.Tensor, group: object) -> list[torch.Tensor]:
    """Every rank's ``t`` (any dtype, through its bytes: gloo has no float8)."""
    u = t.contiguous().view(torch.uint8)
    out = [torch.empty_like(u) for _ in range(2)]
    dist.all_gather(out, u, group=group)
    return [o.view(t.dtype) for o in out]


def _per_shard_then_gather(rank: int, tp_group: object) -> dict:
    """TE's sequence-parallel gather of a block-scaled tensor, written out: this rank's 128 rows quantized
    (NVFP4 with ``with_amax_reduction`` over the TP group), data and scales all-gathered and laid side by side
    as TE lays them (rowwise along dim 0; the transposed columnwise data of Float8Blockwise and NVFP4 and their
    scales along dim 1, TE ``_swap_first_dims``), against the quantization of the whole gathered bf16 tensor.
    Equal because rowwise blocks run along a row and every columnwise block lies inside one shard."""
    from fp8sim.pytorch.constants import DType
    from fp8sim.pytorch.tensor.float8_blockwise_tensor import Float8BlockQuantizer
    from fp8sim.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer
    from fp8sim.pytorch.tensor.nvfp4_tensor import NVFP4Quantizer

    x = (torch.randn(BS, BH, generator=torch.Generator().manual_seed(301)) * 3).bfloat16()
    e4 = DType.kFloat8E4M3
    rht = {"with_rht": True, "with_post_rht_amax": True}
    cases = {  # name: (per-shard quantizer, whole-tensor quantizer, concatenation dim of each field)
        "mxfp8": (MXFP8Quantizer(e4), MXFP8Quantizer(e4), (0, 0, 0, 0)),
        "blockwise": (
            Float8BlockQuantizer(e4, rowwise=True, columnwise=True, block_scaling_dim=1),
            Float8BlockQuantizer(e4, rowwise=True, columnwise=True, block_scaling_dim=1),
            (0, 1, 1, 0),
        ),
        "nvfp4": (
            NVFP4Quantizer(with_amax_reduction=True, amax_reduction_group=tp_group, **rht),
            NVFP4Quantizer(**rht),
            (0, 0, 1, 1),
        ),
    }
    fields = ("_rowwise_data", "_rowwise_scale_inv", "_columnwise_data", "_columnwise_scale_inv")
    out = {}
    for name, (shard_q, whole_q, dims) in cases.items():
        local, whole = shard_q(x.chunk(2, 0)[rank]), whole_q(x)
        bad = []
        for f, d in zip(fields, dims, strict=True):
            got = torch.cat(_gather_bytes(getattr(local, f), tp_group), d)
            want = getattr(whole, f)
            if got.shape != want.shape or not torch.equal(got.view(torch.uint8), want.view(torch.uint8)):
                bad.append(f)
        for f in ("_amax_rowwise", "_amax_columnwise"):
            if hasattr(whole, f) and not torch.equal(getattr(local, f), getattr(whole, f)):
                bad.append(f)
        out[name] = bad
    return out
