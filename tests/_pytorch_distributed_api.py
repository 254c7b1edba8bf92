"""The 2-rank worker of ``test_pytorch_distributed_api.py``: every multi-rank call of TE's public
``transformer_engine.pytorch.distributed`` API in one spawn.  It returns each rank's inputs and outputs
(raw bits) and the messages of the errors; the test builds the references from the inputs."""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist


def _x(rank: int, shape: tuple[int, ...], dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * seed + rank)
    return (torch.randn(shape, generator=g) * 3).to(dtype)


def _error(fn: Any) -> str:
    try:
        fn()
    except Exception as exc:  # the test checks type and message
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def _caught(fn: Any) -> tuple[Any, list[str]]:
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(x.message) for x in w]


def _fp8(rank: int, group: Any) -> dict:
    """Per-tensor FP8 gathers (TE ``_all_gather_fp8``)."""
    from fp8sim.pytorch.constants import DType
    from fp8sim.pytorch.distributed import gather_along_first_dim
    from fp8sim.pytorch.tensor.float8_tensor import Float8CurrentScalingQuantizer, Float8Quantizer
    from fp8sim.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer

    res: dict = {}
    x = _x(rank, (4, 8), torch.bfloat16, seed=3)
    scale = torch.tensor([2.0 + rank], dtype=torch.float32)  # different per rank: TE keeps this rank's
    amax = torch.zeros(1)
    dq = Float8Quantizer(scale, amax, DType.kFloat8E4M3)
    out, h = gather_along_first_dim(x, group, quantizer=dq)
    res["delayed"] = (out._data.clone(), out._scale_inv.clone(), amax.clone(), h, out.dtype, tuple(out.shape))
    res["delayed_usage"] = (dq.rowwise_usage, dq.columnwise_usage)
    res["delayed_transpose"] = None if out._transpose is None else out._transpose.clone()
    cq = Float8CurrentScalingQuantizer(DType.kFloat8E5M2)
    out, h = gather_along_first_dim(x, group, async_op=True, quantizer=cq)
    if h is not None:
        h.wait()
    res["current"] = (out._data.clone(), out._scale_inv.clone())
    local = Float8CurrentScalingQuantizer(DType.kFloat8E4M3, columnwise=False)(x)
    out, h = gather_along_first_dim(local, group)  # a Float8Tensor without a quantizer: gathered as it is
    res["as_is"] = (local._data.clone(), out._data.clone(), out._scale_inv.clone(), out._transpose, h)
    res["err_non_fp8"] = _error(
        lambda: gather_along_first_dim(local, group, quantizer=MXFP8Quantizer(DType.kFloat8E4M3))
    )
    from fp8sim.pytorch._comm import _all_gather_fp8

    res["err_type"] = _error(lambda: _all_gather_fp8(x, group, False, None, [8, 8]))
    return res


def _blocks(rank: int, group: Any) -> dict:
    """MXFP8, NVFP4 and Float8Block gathers."""
    from fp8sim.pytorch.constants import DType
    from fp8sim.pytorch.distributed import gather_along_first_dim
    from fp8sim.pytorch.tensor.float8_blockwise_tensor import Float8BlockQuantizer
    from fp8sim.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer
    from fp8sim.pytorch.tensor.nvfp4_tensor import NVFP4Quantizer

    res: dict = {}
    x = _x(rank, (32, 64), torch.bfloat16, seed=4)
    mq = MXFP8Quantizer(DType.kFloat8E4M3)
    local = mq(x)
    fields = ("_rowwise_data", "_rowwise_scale_inv", "_columnwise_data", "_columnwise_scale_inv")
    res["mx_local"] = [getattr(local, f).clone() for f in fields]
    out, h = gather_along_first_dim(x, group, quantizer=mq)
    res["mx"] = [getattr(out, f).clone() for f in fields]
    out2, _ = gather_along_first_dim(local, group, quantizer=mq)  # an MXFP8Tensor: its data as it is
    res["mx_as_is"] = [getattr(out2, f).clone() for f in fields]
    small = _x(rank, (16, 64), torch.bfloat16, seed=5)  # 16 rows: not quantizable per shard (32 gathered)
    (out3, _), msgs = _caught(lambda: gather_along_first_dim(small, group, quantizer=mq))
    res["mx_fallback"] = (small, [getattr(out3, f).clone() for f in fields], msgs)
    res["err_mx_type"] = _error(lambda: gather_along_first_dim(local, group))
    nq = NVFP4Quantizer(with_amax_reduction=True, amax_reduction_group=group)
    out, h = gather_along_first_dim(x, group, async_op=True, quantizer=nq)
    h.wait()
    res["nvfp4"] = (x, out._rowwise_data.clone(), out._rowwise_scale_inv.clone(), tuple(out.shape))
    res["err_nv_type"] = _error(lambda: gather_along_first_dim(nq(x), group))
    bx = _x(rank, (128, 128), torch.bfloat16, seed=6)
    bq = Float8BlockQuantizer(DType.kFloat8E4M3, rowwise=True, columnwise=True, block_scaling_dim=1)
    (out, _), msgs = _caught(lambda: gather_along_first_dim(bx, group, quantizer=bq))
    res["block"] = (bx, out._rowwise_data.clone(), out._rowwise_scale_inv.clone(), msgs)
    bsmall = _x(rank, (64, 128), torch.bfloat16, seed=9)  # 64 rows: not quantizable per shard
    (out, _), msgs = _caught(lambda: gather_along_first_dim(bsmall, group, quantizer=bq))
    res["block_fallback"] = (bsmall, out._rowwise_data.clone(), out._rowwise_scale_inv.clone(), msgs)
    return res


def _fallbacks(rank: int, group: Any) -> dict:
    """TE's high-precision fallbacks and the refusals of inputs it cannot gather."""
    from fp8sim.pytorch.constants import DType
    from fp8sim.pytorch.distributed import gather_along_first_dim
    from fp8sim.pytorch.tensor.float8_blockwise_tensor import Float8BlockQuantizer
    from fp8sim.pytorch.tensor.float8_tensor import Float8CurrentScalingQuantizer
    from fp8sim.pytorch.tensor.identity_tensor import IdentityQuantizer
    from fp8sim.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer

    res: dict = {}
    x = _x(rank, (32, 128), torch.bfloat16, seed=10)
    res["x"] = x
    (out, h), msgs = _caught(lambda: gather_along_first_dim(x, group, quantizer=IdentityQuantizer()))
    res["identity"] = (type(out).__name__, out.dequantize().clone(), h, msgs)
    local = IdentityQuantizer()(x)
    (out, h), msgs = _caught(lambda: gather_along_first_dim(local, group))
    res["identity_as_input"] = (type(out).__name__, out.clone(), h, msgs)
    col = Float8CurrentScalingQuantizer(DType.kFloat8E4M3, rowwise=False, columnwise=True)(x)
    res["err_col_only"] = _error(lambda: gather_along_first_dim(col, group))
    blk = Float8BlockQuantizer(DType.kFloat8E4M3, rowwise=True, columnwise=True, block_scaling_dim=1)
    bt = blk(x.repeat(4, 1))
    res["err_block_no_q"] = _error(lambda: gather_along_first_dim(bt, group))
    res["err_block_as_is"] = _error(lambda: gather_along_first_dim(bt, group, quantizer=blk))
    row_only = MXFP8Quantizer(DType.kFloat8E4M3, columnwise=False)(x)
    _, msgs = _caught(lambda: gather_along_first_dim(row_only, group, quantizer=MXFP8Quantizer(DType.kFloat8E4M3)))
    res["mx_mismatch"] = msgs
    return res


def worker(rank: int, world: int) -> dict:
    torch.set_num_threads(1)
    from fp8sim.pytorch import distributed as ted

    group = dist.new_group(list(range(world)))
    res: dict = {
        "world": (ted.get_distributed_world_size(), ted.get_distributed_world_size(group)),
        "rank": (ted.get_distributed_rank(), ted.get_distributed_rank(group)),
    }
    flat = torch.arange(10, dtype=torch.float32)
    chunk = ted.split_tensor_into_1d_equal_chunks(flat, group)
    copy = ted.split_tensor_into_1d_equal_chunks(flat, group, new_buffer=True)
    res["split"] = (chunk.clone(), chunk.data_ptr() == flat[5 * rank :].data_ptr(), copy.data_ptr() != chunk.data_ptr())
    res["gather_1d"] = ted.gather_split_1d_tensor(chunk, group)
    e4 = _x(rank, (6,), seed=1).to(torch.float8_e4m3fn)
    res["gather_1d_fp8"] = (e4.view(torch.uint8), ted.gather_split_1d_tensor(e4, group).view(torch.uint8))

    x = _x(rank, (4, 3), seed=2)
    res["rs_in"] = x.clone()
    res["rs"] = ted.reduce_scatter_along_first_dim(x, group)
    buf = torch.empty(2, 3)
    out, h = ted.reduce_scatter_along_first_dim(x, group, async_op=True, output=buf)
    h.wait()
    res["rs_async"] = (out.clone(), out is buf)
    res["err_rs"] = _error(lambda: ted.reduce_scatter_along_first_dim(torch.zeros(5, 3), group))

    y = _x(rank, (3, 4), torch.bfloat16, seed=7)
    res["ag_in"] = y.clone()
    res["ag"] = ted.gather_along_first_dim(y, group)
    out, h = ted.gather_along_first_dim(y, group, async_op=True)
    h.wait()
    res["ag_async"] = out.clone()
    buf = torch.empty(6, 4, dtype=torch.bfloat16)
    out, h = ted.gather_along_first_dim(y, group, output_tensor=buf, external_coalescing=True)
    res["ag_output"] = (out.clone(), out is buf, h)
    f8 = y.to(torch.float8_e5m2)
    res["ag_fp8"] = (f8.view(torch.uint8), ted.gather_along_first_dim(f8, group)[0].view(torch.uint8))

    z = _x(rank, (5,), seed=8)
    res["ar_in"] = z.clone()
    zz = z.clone()
    out, h = ted.allreduce(zz, group)
    res["ar"] = (out.clone(), out is zz, h)
    zz = z.clone()
    out, h = ted.allreduce(zz, group, async_op=True)
    h.wait()
    res["ar_async"] = out.clone()
    sym = {}
    for kind in ("nccl", "multimem_all_reduce", "two_shot", "one_shot"):
        zz = z.clone()
        out, h = ted.symmetric_all_reduce(zz, group, all_reduce_type=kind)
        sym[kind] = (out.clone(), out is zz, h)
    zz = z.clone()
    sym["default"] = (ted.symmetric_all_reduce(zz, group)[0].clone(), True, None)
    res["sym"] = sym
    res["err_sym_async"] = _error(lambda: ted.symmetric_all_reduce(z.clone(), group, async_op=True))
    res["err_sym_kind"] = _error(lambda: ted.symmetric_all_reduce(z.clone(), group, all_reduce_type="three_shot"))
    res["fp8"] = _fp8(rank, group)
    res["blocks"] = _blocks(rank, group)
    res["fallbacks"] = _fallbacks(rank, group)
    return res
