"""TE's public ``transformer_engine.pytorch.distributed`` API in ``fp8sim.pytorch.distributed`` (issue 16).

References are written here from TE's ``transformer_engine/pytorch/distributed.py`` (mirror HEAD): the
collectives (``reduce_scatter_along_first_dim`` 931-961, ``_all_gather_fp8`` 989-1080,
``_start_all_gather_fp8_blockwise`` 1083-1135, ``_all_gather_mxfp8`` 1527-1665, ``gather_along_first_dim``
1668-1830, ``symmetric_all_reduce`` 1994-2092, ``allreduce`` 2095-2109), the helpers (150-245) and
``CudaRNGStatesTracker`` (818-928); the modules' use of the tracker from ``module/base.py`` 1815-1833
(``reset_parameters``), ``module/linear.py`` 1774-1780 and ``attention/dot_product_attention/
dot_product_attention.py`` 745-754.  Every multi-rank check runs in ONE 2-rank gloo spawn
(``_pytorch_distributed_api.worker``); FP8 codes are checked against ml_dtypes casts.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")
dist = require("torch.distributed")

import fp8sim.pytorch as te  # noqa: E402
from fp8sim.pytorch import distributed as ted  # noqa: E402
from fp8sim.pytorch.constants import DType  # noqa: E402

_FALLBACK = "Cannot quantize input tensor. Performing all-gather in high precision."


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8) if t.element_size() == 1 else t


def _same(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    a, b = _bits(a), _bits(b)
    if not torch.equal(a, b):
        i = (a != b).nonzero()[0].tolist()
        raise AssertionError(f"{what}: first difference at {i}: {a[tuple(i)]} != {b[tuple(i)]}")


# -- one process: torch.distributed not initialised ------------------------------------------------------
def test_single_process_collectives_return_the_input_and_no_handle() -> None:
    """TE: world size 1 without ``init_process_group``; every collective returns ``(inp, None)``."""
    assert not dist.is_initialized()
    x = torch.randn(4, 3)
    assert ted.get_distributed_world_size() == 1
    for out, h in (
        ted.reduce_scatter_along_first_dim(x, None),
        ted.gather_along_first_dim(x, None),
        ted.allreduce(x),
        ted.symmetric_all_reduce(x, all_reduce_type="nccl"),
    ):
        assert out is x and h is None
    from fp8sim.pytorch.tensor.float8_tensor import Float8CurrentScalingQuantizer

    q = Float8CurrentScalingQuantizer(DType.kFloat8E4M3)
    out, h = ted.gather_along_first_dim(x, None, quantizer=q)  # TE: quantized locally
    _same(out._data, q(x)._data, "world-1 gather with a quantizer")
    assert h is None
    with pytest.raises(NotImplementedError) as e:
        ted.gather_along_first_dim(x, None, quantizer=q, output_tensor=torch.empty(4, 3))
    assert str(e.value) == "fp8sim: gather_along_first_dim with output_tensor= and a quantized gather"


def test_rank_and_split_need_an_initialised_process_group() -> None:
    msg = (
        "torch.distributed is not initialized. Call torch.distributed.init_process_group() "
        "before calling get_distributed_rank()."
    )
    with pytest.raises(RuntimeError) as e:
        ted.get_distributed_rank()
    assert str(e.value) == msg
    with pytest.raises(RuntimeError) as e:  # TE's split asks for the rank
        ted.split_tensor_into_1d_equal_chunks(torch.zeros(4), None)
    assert str(e.value) == msg


def test_symmetric_all_reduce_refuses_async_with_te_message() -> None:
    with pytest.raises(RuntimeError) as e:
        ted.symmetric_all_reduce(torch.zeros(2), async_op=True)
    assert str(e.value) == "Async symmetric ops are not supported yet, but async_op=True was passed."


def test_tensor_model_parallel_attributes_set_once() -> None:
    t = torch.zeros(2)
    ted.set_tensor_model_parallel_attributes(t, True, 1, 2)
    assert (t.tensor_model_parallel, t.partition_dim, t.partition_stride) == (True, 1, 2)
    with pytest.raises(RuntimeError) as e:
        ted.set_tensor_model_parallel_attributes(t, False, 0, 1)
    assert str(e.value) == (
        "Tensor already has attribute 'tensor_model_parallel' set. Cannot set "
        "tensor model parallel attributes on a tensor that already has them."
    )


def test_names_resolve_under_the_shim() -> None:
    import importlib

    import fp8sim.run.shim as shim

    was = shim.is_installed()
    shim.install(quiet=True)
    try:
        mod = importlib.import_module("transformer_engine.pytorch.distributed")
        for name in (
            "get_distributed_world_size",
            "get_distributed_rank",
            "set_tensor_model_parallel_attributes",
            "initialize_affine_weight_gpu",
            "split_tensor_into_1d_equal_chunks",
            "gather_split_1d_tensor",
            "reduce_scatter_along_first_dim",
            "gather_along_first_dim",
            "allreduce",
            "symmetric_all_reduce",
            "CudaRNGStatesTracker",
            "get_all_rng_states",
            "set_all_rng_states",
            "graph_safe_rng_available",
        ):
            assert getattr(mod, name) is getattr(ted, name), name
    finally:
        if not was:
            shim.uninstall()


# -- RNG tracker ------------------------------------------------------------------------------------
def test_tracker_fork_draws_from_the_seeded_state_and_restores_the_default() -> None:
    """TE 818-928: ``add`` keeps the current state, ``fork`` continues the named state and restores the
    caller's (CPU run: torch's CPU default generator)."""
    tr = ted.CudaRNGStatesTracker()
    torch.manual_seed(5)
    before = torch.get_rng_state()
    tr.add("model-parallel-rng", 1234)
    assert torch.equal(torch.get_rng_state(), before)
    ref = torch.Generator().manual_seed(1234)
    with tr.fork():
        a = torch.randn(6)
    assert torch.equal(torch.get_rng_state(), before)
    with tr.fork("model-parallel-rng"):
        b = torch.randn(6)
    _same(a, torch.randn(6, generator=ref), "first fork")
    _same(b, torch.randn(6, generator=ref), "second fork continues the state")
    assert torch.equal(torch.get_rng_state(), before)
    states = tr.get_states()
    assert states is not tr.states_ and states["model-parallel-rng"] is tr.states_["model-parallel-rng"]
    assert ted.get_all_rng_states() is tr.states_
    new = {"x": torch.get_rng_state()}
    tr.set_states(new)
    assert tr.states_ is new and ted.get_all_rng_states() is new
    tr.reset()
    assert tr.states_ == {} and tr.seeds_ == set()


def test_tracker_errors_are_te_messages() -> None:
    tr = ted.CudaRNGStatesTracker()
    tr.add("a", 1)
    with pytest.raises(RuntimeError, match=r"^seed 1 already exists$"):
        tr.add("b", 1)
    with pytest.raises(RuntimeError, match=r"^cuda rng state a already exists$"):
        tr.add("a", 2)
    assert tr.seeds_ == {1, 2}  # TE records the seed before it checks the name
    with pytest.raises(KeyError) as e:
        with tr.fork("b"):
            pass
    assert e.value.args[0] == "cuda rng state b is not added"


def test_graph_safe_rng_available_is_te_expression() -> None:
    want = (
        hasattr(torch.cuda.CUDAGraph, "register_generator_state")
        and hasattr(torch.Generator, "graphsafe_set_state")
        and hasattr(torch.Generator, "graphsafe_get_state")
        and hasattr(torch.Generator, "clone_state")
    )
    assert ted.graph_safe_rng_available() is want


def _tracker(seed: int, name: str = "model-parallel-rng") -> ted.CudaRNGStatesTracker:
    tr = ted.CudaRNGStatesTracker()
    tr.add(name, seed)
    return tr


def _init(t: torch.Tensor) -> torch.Tensor:
    return torch.nn.init.normal_(t, 0.0, 0.02)


def _seeded(seed: int, *shapes: tuple[int, ...]) -> list[torch.Tensor]:
    """``init`` of each shape in turn from ``manual_seed(seed)`` (TE: the weights init in the fork)."""
    saved = torch.get_rng_state()
    torch.manual_seed(seed)
    out = [_init(torch.empty(s)) for s in shapes]
    torch.set_rng_state(saved)
    return out


def test_initialize_affine_weight_gpu_inits_in_the_fork() -> None:
    tr = _tracker(77)
    w = torch.empty(4, 6)
    before = torch.get_rng_state()
    ted.initialize_affine_weight_gpu(w, _init, lambda: tr, partition_dim=1, stride=1)
    assert torch.equal(torch.get_rng_state(), before)
    _same(w, _seeded(77, (4, 6))[0], "initialize_affine_weight_gpu")
    assert (w.tensor_model_parallel, w.partition_dim, w.partition_stride) == (True, 1, 1)


def test_modules_initialise_weights_in_the_tracker_fork() -> None:
    """TE base.py 1823-1833: a weight registered with the tracker is initialised in
    ``fork(rng_tracker_name)`` (default name without one); the default generator is not touched."""
    torch.manual_seed(3)
    before = torch.get_rng_state()
    tr1 = _tracker(11)
    lin = te.Linear(6, 4, init_method=_init, get_rng_state_tracker=lambda: tr1)
    tr2 = _tracker(12, "other")
    named = te.Linear(6, 4, init_method=_init, get_rng_state_tracker=lambda: tr2, rng_tracker_name="other")
    tr3 = _tracker(13)
    lnl = te.LayerNormLinear(6, 4, init_method=_init, get_rng_state_tracker=lambda: tr3)
    tr4 = _tracker(14)
    mlp = te.LayerNormMLP(6, 8, init_method=_init, output_layer_init_method=_init, get_rng_state_tracker=lambda: tr4)
    assert torch.equal(torch.get_rng_state(), before)
    _same(lin.weight.detach(), _seeded(11, (4, 6))[0], "Linear")
    _same(named.weight.detach(), _seeded(12, (4, 6))[0], "Linear rng_tracker_name")
    _same(lnl.weight.detach(), _seeded(13, (4, 6))[0], "LayerNormLinear")
    fc1, fc2 = _seeded(14, (8, 6), (6, 8))
    _same(mlp.fc1_weight.detach(), fc1, "LayerNormMLP fc1")
    _same(mlp.fc2_weight.detach(), fc2, "LayerNormMLP fc2")
    assert torch.equal(lin.bias.detach(), torch.zeros(4))
    plain = te.Linear(6, 4, init_method=_init)  # no tracker: the default generator
    torch.set_rng_state(before)
    _same(plain.weight.detach(), _init(torch.empty(4, 6)), "Linear without a tracker")


def test_transformer_layer_hands_the_tracker_to_attention_and_mlp() -> None:
    """TE transformer.py 444 and 508: ``get_rng_state_tracker`` goes to both attention blocks and the MLP, so
    every weight is initialised in the fork and the default generator is not touched; the same layer built
    without a tracker draws from the default generator."""
    torch.manual_seed(5)
    before = torch.get_rng_state()
    tr = _tracker(31)
    layer = te.TransformerLayer(16, 32, 2, layer_type="decoder", get_rng_state_tracker=lambda: tr)
    assert torch.equal(torch.get_rng_state(), before)  # no weight drew from the default generator
    assert layer.get_rng_state_tracker is not None and layer.layernorm_mlp.get_rng_state_tracker is not None
    te.TransformerLayer(16, 32, 2)
    assert not torch.equal(torch.get_rng_state(), before)  # the test can tell the two apart


def test_attention_dropout_runs_in_the_tracker_fork() -> None:
    """TE dot_product_attention.py 745-754: dropout inside ``fork()`` when a tracker is given (not under
    sequence parallelism) and ``attention_dropout > 0``; the reference draws from the tracked state."""
    q, k, v = (torch.randn(4, 1, 2, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    tr = _tracker(21)
    state = tr.states_["model-parallel-rng"].clone()
    dpa = te.DotProductAttention(2, 8, attention_dropout=0.5, get_rng_state_tracker=lambda: tr)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    out = dpa(q, k, v)
    assert torch.equal(torch.get_rng_state(), before)
    ref_dpa = te.DotProductAttention(2, 8, attention_dropout=0.5)
    torch.set_rng_state(state)
    _same(out, ref_dpa(q, k, v), "dropout from the tracked state")
    sp = te.DotProductAttention(2, 8, attention_dropout=0.5, get_rng_state_tracker=lambda: tr, sequence_parallel=True)
    torch.set_rng_state(before)
    sp(q, k, v)
    assert not torch.equal(torch.get_rng_state(), before)  # TE: no fork under sequence parallelism


# -- 2 ranks, one spawn -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def res() -> list[dict]:
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is needed")
    from _dist import ranks
    from _pytorch_distributed_api import worker

    return ranks(worker, world_size=2)


def test_world_size_rank_and_1d_chunks(res: list[dict]) -> None:
    flat = torch.arange(10, dtype=torch.float32)
    for r, x in enumerate(res):
        assert x["world"] == (2, 2) and x["rank"] == (r, r)
        chunk, is_view, copied = x["split"]
        _same(chunk, flat[5 * r : 5 * r + 5], f"rank {r} split")
        assert is_view and copied
        _same(x["gather_1d"], flat, f"rank {r} gather_split_1d_tensor")
        _same(x["gather_1d_fp8"][1], torch.cat([y["gather_1d_fp8"][0] for y in res]), "float8 1d gather")


def test_reduce_scatter_is_the_rank_sum_of_this_ranks_rows(res: list[dict]) -> None:
    total = res[0]["rs_in"] + res[1]["rs_in"]  # two ranks: one rounded float32 add
    for r, x in enumerate(res):
        out, h = x["rs"]
        _same(out, total[2 * r : 2 * r + 2], f"rank {r} reduce-scatter")
        assert h is None
        out, is_buf = x["rs_async"]
        _same(out, total[2 * r : 2 * r + 2], f"rank {r} async reduce-scatter into output=")
        assert is_buf
        assert x["err_rs"] == (
            "ValueError: First dimension of the tensor should be divisible by tensor parallel size, "
            "but got dim_size[0]=5 and world_size=2 (remainder=1)."
        )


def test_gather_along_first_dim_plain_and_float8(res: list[dict]) -> None:
    want = torch.cat([x["ag_in"] for x in res])
    want8 = torch.cat([x["ag_fp8"][0] for x in res])
    for r, x in enumerate(res):
        out, h = x["ag"]
        _same(out, want, f"rank {r} gather")
        assert h is None
        _same(x["ag_async"], want, f"rank {r} async gather")
        out, is_buf, h = x["ag_output"]
        _same(out, want, f"rank {r} gather into output_tensor=")
        assert is_buf and h is None
        _same(x["ag_fp8"][1], want8, f"rank {r} float8_e5m2 gather (byte view)")


def test_allreduce_and_symmetric_all_reduce_sum_in_place(res: list[dict]) -> None:
    total = res[0]["ar_in"] + res[1]["ar_in"]
    for r, x in enumerate(res):
        out, same, h = x["ar"]
        _same(out, total, f"rank {r} allreduce")
        assert same and h is None
        _same(x["ar_async"], total, f"rank {r} async allreduce")
        for kind, (out, same, h) in x["sym"].items():
            _same(out, total, f"rank {r} symmetric_all_reduce {kind}")
            assert same and h is None
        assert x["err_sym_async"] == (
            "RuntimeError: Async symmetric ops are not supported yet, but async_op=True was passed."
        )
        assert x["err_sym_kind"] == "TypeError: All reduce type three_shot is not supported."


def _cast(x: torch.Tensor, scale: np.float32, dtype: type, fmax: float) -> torch.Tensor:
    """TE's per-tensor cast: ``x * scale`` in float32, saturated, rounded to nearest even (ml_dtypes)."""
    y = np.clip(x.float().numpy() * np.float32(scale), -fmax, fmax).astype(dtype)
    return torch.from_numpy(y.view(np.uint8))


def test_fp8_gather_codes_of_every_rank_with_this_ranks_scale_inv(res: list[dict]) -> None:
    """TE ``_all_gather_fp8``: each rank quantizes its shard with its own scale, the codes are gathered and
    read with this rank's ``scale_inv`` ("Assume scaling factors are identical across ranks")."""
    from _pytorch_distributed_api import _x

    from fp8sim.pytorch.utils import is_non_tn_fp8_gemm_supported

    xs = [_x(r, (4, 8), torch.bfloat16, seed=3) for r in range(2)]
    delayed = torch.cat([_cast(xs[r], np.float32(2.0 + r), ml_dtypes.float8_e4m3fn, 448.0) for r in range(2)])
    amaxes = [np.float32(xs[r].float().abs().max().item()) for r in range(2)]
    scales = [np.float32(57344.0) / a for a in amaxes]
    current = torch.cat([_cast(xs[r], scales[r], ml_dtypes.float8_e5m2, 57344.0) for r in range(2)])
    for r, x in enumerate(res):
        f = x["fp8"]
        data, sinv, amax, h, dtype, shape = f["delayed"]
        _same(data, delayed, f"rank {r} delayed codes")
        _same(sinv, torch.tensor([1.0 / (2.0 + r)], dtype=torch.float32), f"rank {r} delayed scale_inv")
        _same(amax, torch.tensor([amaxes[r]]), f"rank {r} amax: the local shard's")
        assert h is None and dtype == torch.bfloat16 and shape == (8, 8)
        assert f["delayed_usage"] == (True, True)  # TE restores the quantizer's usages
        if is_non_tn_fp8_gemm_supported():
            assert f["delayed_transpose"] is None
        else:
            _same(f["delayed_transpose"], delayed.t().contiguous(), f"rank {r} transpose after the gather")
        data, sinv = f["current"]
        _same(data, current, f"rank {r} current-scaling codes")
        _same(sinv, torch.from_numpy(np.array([np.float32(1) / scales[r]])), f"rank {r} current scale_inv")
        local = [y["fp8"]["as_is"][0] for y in res]
        _, data, sinv, transpose, h = f["as_is"]
        _same(data, torch.cat(local), f"rank {r} Float8Tensor gathered as it is")
        assert transpose is None and h is None
        assert f["err_non_fp8"] == "ValueError: Got non-FP8 quantizer (MXFP8Quantizer)"
        assert f["err_type"] == (
            "TypeError: Expected quantizer to be Float8Quantizer or Float8CurrentScalingQuantizer "
            "when input is not Float8TensorStorage, but got NoneType."
        )


def _padded(rows: list[torch.Tensor], shape: tuple[int, int]) -> torch.Tensor:
    cat = torch.cat(rows)
    out = torch.zeros(shape, dtype=cat.dtype)
    out[: cat.shape[0], : cat.shape[1]] = cat
    return out


def test_mxfp8_gather_lays_out_every_ranks_data_and_unpadded_scales(res: list[dict]) -> None:
    """TE ``_all_gather_mxfp8`` 1593-1662: data gathered along dim 0, scales without their padding rows
    (``M`` rowwise, ``M / 32`` columnwise) gathered and padded to ``(round_up(2M,128), round_up(K/32,4))`` /
    ``(round_up(2M/32,4), round_up(K,128))``; a shard that cannot be quantized: TE's warning, the whole."""
    from fp8sim.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer

    loc = [x["blocks"]["mx_local"] for x in res]
    want = [
        torch.cat([loc[0][0], loc[1][0]]),
        _padded([loc[0][1][:32], loc[1][1][:32]], (128, 4)),
        torch.cat([loc[0][2], loc[1][2]]),
        _padded([loc[0][3][:1], loc[1][3][:1]], (4, 128)),
    ]
    small = torch.cat([x["blocks"]["mx_fallback"][0] for x in res])
    whole = MXFP8Quantizer(DType.kFloat8E4M3)(small)
    fields = ("_rowwise_data", "_rowwise_scale_inv", "_columnwise_data", "_columnwise_scale_inv")
    for r, x in enumerate(res):
        b = x["blocks"]
        for i, f in enumerate(fields):
            _same(b["mx"][i], want[i], f"rank {r} MXFP8 {f}")
            _same(b["mx_as_is"][i], want[i], f"rank {r} MXFP8Tensor gathered as it is: {f}")
            _same(b["mx_fallback"][1][i], getattr(whole, f), f"rank {r} MXFP8 fallback {f}")
        assert _FALLBACK in b["mx_fallback"][2]
        assert b["err_mx_type"] == "TypeError: Expected MXFP8Quantizer for MXFP8 all-gather, but got NoneType."


def test_nvfp4_and_float8_block_gathers(res: list[dict]) -> None:
    """NVFP4 (TE ``_all_gather_nvfp4``, amax MAX-reduced over the group: the whole tensor's quantization)
    and Float8Block 1x128 (TE ``_start_all_gather_fp8_blockwise``: per-shard data along dim 0, the
    transposed rowwise scales along dim 1); shards TE cannot quantize: TE's warning, the whole."""
    from fp8sim.pytorch.tensor.float8_blockwise_tensor import Float8BlockQuantizer
    from fp8sim.pytorch.tensor.nvfp4_tensor import NVFP4Quantizer

    whole = NVFP4Quantizer()(torch.cat([x["blocks"]["nvfp4"][0] for x in res]))

    def bq() -> Float8BlockQuantizer:
        return Float8BlockQuantizer(DType.kFloat8E4M3, rowwise=True, columnwise=True, block_scaling_dim=1)

    shards = [bq()(x["blocks"]["block"][0]) for x in res]
    small = bq()(torch.cat([x["blocks"]["block_fallback"][0] for x in res]))
    for r, x in enumerate(res):
        b = x["blocks"]
        _, data, sinv, shape = b["nvfp4"]
        assert shape == (64, 64)
        _same(data, whole._rowwise_data, f"rank {r} NVFP4 rowwise data")
        _same(sinv, whole._rowwise_scale_inv, f"rank {r} NVFP4 rowwise scales")
        _, data, sinv, msgs = b["block"]
        _same(data, torch.cat([s._rowwise_data for s in shards]), f"rank {r} Float8Block data")
        _same(sinv, torch.cat([s._rowwise_scale_inv for s in shards], 1), f"rank {r} Float8Block scales")
        assert _FALLBACK not in msgs
        _, data, sinv, msgs = b["block_fallback"]
        _same(data, small._rowwise_data, f"rank {r} Float8Block fallback data")
        _same(sinv, small._rowwise_scale_inv, f"rank {r} Float8Block fallback scales")
        assert _FALLBACK in msgs
        assert b["err_nv_type"] == "TypeError: Expected NVFP4Quantizer for NVFP4 all-gather, but got NoneType."


def test_multihead_attention_hands_the_tracker_to_its_gemms_and_attention() -> None:
    """TE multi_head_attention.py 348-352 (``common_gemm_kwargs``) and 459: QKV and proj weights are
    initialised in the fork in construction order (query, key, value, proj), DPA forks for dropout."""
    tr = _tracker(31)
    before = torch.get_rng_state()
    mha = te.MultiheadAttention(
        8, 2, init_method=_init, output_layer_init_method=_init, attention_dropout=0.5, get_rng_state_tracker=lambda: tr
    )
    assert torch.equal(torch.get_rng_state(), before)
    want = _seeded(31, (8, 8), (8, 8), (8, 8), (8, 8))
    for name, w in zip(("query_weight", "key_weight", "value_weight"), want[:3], strict=True):
        _same(getattr(mha.qkv, name).detach(), w, f"MultiheadAttention qkv.{name}")
    _same(mha.proj.weight.detach(), want[3], "MultiheadAttention proj.weight")
    assert mha.core_attention.rng_states_tracker is tr


def test_checkpoint_replays_dropout_drawn_in_the_tracker_fork() -> None:
    """TE ``checkpoint(..., get_rng_state_tracker=...)``: the recompute restores the tracker's states, so the
    dropout mask drawn in the fork is the forward's: gradients equal those of the run without checkpoint."""
    grads = []
    for ckpt in (False, True):
        q, k, v = (
            torch.randn(4, 1, 2, 8, generator=torch.Generator().manual_seed(i)).requires_grad_() for i in range(3)
        )
        tr = _tracker(41)
        dpa = te.DotProductAttention(2, 8, attention_dropout=0.5, get_rng_state_tracker=lambda tr=tr: tr)
        if ckpt:
            out = ted.checkpoint(dpa, q, k, v, get_rng_state_tracker=lambda tr=tr: tr)
        else:
            out = dpa(q, k, v)
        out.square().sum().backward()
        grads.append([out.detach(), q.grad, k.grad, v.grad])
    for a, b, what in zip(grads[0], grads[1], ("out", "dq", "dk", "dv"), strict=True):
        _same(b, a, f"checkpointed {what}")


def test_high_precision_fallbacks_and_refusals(res: list[dict]) -> None:
    """TE ``gather_along_first_dim`` 1789-1830: another quantizer, or a quantized input of another kind,
    is gathered in high precision with TE's warning; MXFP8 input lacking a usage the quantizer wants is
    re-quantized with TE's warning (1574-1583); Float8Block input needs a quantizer (1127-1128)."""
    want = torch.cat([x["fallbacks"]["x"] for x in res])
    unsupported = "Attempting to all-gather an unsupported quantized tensor. Falling back to high-precision all-gather."
    for r, x in enumerate(res):
        f = x["fallbacks"]
        kind, vals, h, msgs = f["identity"]
        assert kind == "IdentityTensor" and h is None and unsupported in msgs
        _same(vals, want, f"rank {r} IdentityQuantizer: gathered then quantized")
        kind, vals, h, msgs = f["identity_as_input"]
        assert kind == "Tensor" and h is None and unsupported in msgs
        _same(vals, want, f"rank {r} IdentityTensor input: dequantized and gathered")
        assert f["err_col_only"] == "RuntimeError: Float8TensorStorage is not supported yet without Quantizer"
        assert f["err_block_no_q"] == "ValueError: Quantizer is missing"
        assert f["err_block_as_is"] == (
            "NotImplementedError: fp8sim: gather_along_first_dim of a Float8BlockwiseQTensor is not emulated"
        )
        assert (
            "Input and quantizer do not have matching usages. Dequantizing and requantizing to MXFP8."
            in (f["mx_mismatch"])
        )
