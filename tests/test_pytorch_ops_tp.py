"""``te.ops`` tensor parallelism on 2 gloo ranks (TE 2.20.0.dev0 ``ops/linear.py``, ``ops/basic/basic_linear.py``
``_functional_forward`` / ``_functional_backward``, ``all_reduce.py``, ``all_gather.py``, ``reduce_scatter.py``).

The reference is TE's data flow written out with one-process ops on each rank's shard: column parallel
computes ``x W_r^T + b_r`` (its input all-gathered first with ``sequence_parallel``, quantized with the amax
all-reduced over the group) and sums the ranks' dgrads (all-reduce, or reduce-scatter with
``sequence_parallel``); row parallel adds each rank's own bias to its partial GEMM, then sums the partials
(all-reduce, or reduce-scatter).  Data are small multiples of 1/8, so high-precision sums are exact.
"""

from __future__ import annotations

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")
dist = require("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

from _dist import ranks  # noqa: E402

BF16 = torch.bfloat16
M, K, N = 16, 32, 32


def _dy(*shape: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(-16, 17, shape, generator=g).double() / 8).to(BF16)


def _sum2(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.float() + b.float()).to(a.dtype)


def _one(w: torch.Tensor, b: torch.Tensor, x: torch.Tensor, dy: torch.Tensor, recipe) -> tuple:  # noqa: ANN001
    """One-process ``Linear`` on a shard: ``(y, dx, dw, db)``."""
    import fp8sim.pytorch as te
    import fp8sim.pytorch.ops as te_ops

    op = te_ops.Linear(w.shape[1], w.shape[0], dtype=BF16)
    with torch.no_grad():
        op.weight.copy_(w)
        op.bias.copy_(b)
    xi = x.clone().requires_grad_(True)
    with te.autocast(enabled=recipe is not None, recipe=recipe):
        y = op(xi)
    y.backward(dy)
    return y, xi.grad, op.weight.grad, op.bias.grad


def _case(rank: int, group, recipe, mode: str, sp: bool) -> dict:  # noqa: ANN001
    import fp8sim.pytorch as te
    import fp8sim.pytorch.ops as te_ops

    w_full, b_full = _dy(N, K, seed=1), _dy(N, seed=2)
    x_full, dy_full = _dy(M, K, seed=3), _dy(M, N, seed=4)
    op = te_ops.Linear(K, N, dtype=BF16, tensor_parallel_mode=mode, tensor_parallel_group=group, sequence_parallel=sp)
    rows, half = slice(rank * M // 2, (rank + 1) * M // 2), (lambda n, r: slice(r * n // 2, (r + 1) * n // 2))
    if mode == "column":
        w_r, b_r = w_full[half(N, rank)], b_full[half(N, rank)]
        x_in, dy_in = (x_full[rows] if sp else x_full), dy_full[:, half(N, rank)]
    else:
        w_r, b_r = w_full[:, half(K, rank)], b_full
        x_in, dy_in = x_full[:, half(K, rank)], (dy_full[rows] if sp else dy_full)
    with torch.no_grad():
        op.weight.copy_(w_r)
        op.bias.copy_(b_r)
    x = x_in.clone().requires_grad_(True)
    with te.autocast(enabled=recipe is not None, recipe=recipe):
        y = op(x)
    y.backward(dy_in)
    if mode == "column":  # each rank: x W_r^T + b_r on the whole input; the dgrads summed
        parts = [_one(w_full[half(N, r)], b_full[half(N, r)], x_full, dy_full[:, half(N, r)], recipe) for r in range(2)]
        y_ref, dw_ref, db_ref = parts[rank][0], parts[rank][2], parts[rank][3]
        dx_ref = _sum2(parts[0][1], parts[1][1])
        dx_ref = dx_ref[rows] if sp else dx_ref
    else:  # each rank: its partial plus its own bias; the partials summed
        parts = [_one(w_full[:, half(K, r)], b_full, x_full[:, half(K, r)], dy_full, recipe) for r in range(2)]
        y_ref = _sum2(parts[0][0], parts[1][0])
        y_ref = y_ref[rows] if sp else y_ref
        dx_ref, dw_ref, db_ref = parts[rank][1], parts[rank][2], parts[rank][3]
    return {
        "y": torch.equal(y, y_ref),
        "dx": torch.equal(x.grad, dx_ref),
        "dw": torch.equal(op.weight.grad, dw_ref),
        "db": torch.equal(op.bias.grad, db_ref),
        "ops": [type(o).__name__ for o in op.basic_ops],
    }


def _collectives(rank: int, group) -> dict:  # noqa: ANN001
    import fp8sim.pytorch.ops as te_ops

    x = (_dy(4, 8, seed=10 + rank)).requires_grad_(True)
    others = [_dy(4, 8, seed=10 + r) for r in range(2)]
    dy_g = _dy(8, 8, seed=20 + rank)
    y = te_ops.AllGather(group)(x)
    y.backward(dy_g)
    dys = [_dy(8, 8, seed=20 + r) for r in range(2)]
    out = {
        "gather": torch.equal(y, torch.cat(others)),
        "gather_bwd": torch.equal(x.grad, _sum2(*dys)[rank * 4 : rank * 4 + 4]),
    }
    x2 = _dy(8, 8, seed=30 + rank).requires_grad_(True)
    y2 = te_ops.ReduceScatter(group)(x2)
    y2.backward(_dy(4, 8, seed=40 + rank))
    full = _sum2(*[_dy(8, 8, seed=30 + r) for r in range(2)])
    out["scatter"] = torch.equal(y2, full[rank * 4 : rank * 4 + 4])
    out["scatter_bwd"] = torch.equal(x2.grad, torch.cat([_dy(4, 8, seed=40 + r) for r in range(2)]))
    x3 = _dy(4, 8, seed=50 + rank).requires_grad_(True)
    y3 = te_ops.AllReduce(group)(x3)
    y3.backward(torch.ones(4, 8, dtype=BF16))
    out["reduce"] = torch.equal(y3, _sum2(*[_dy(4, 8, seed=50 + r) for r in range(2)]))
    out["reduce_bwd"] = torch.equal(x3.grad, torch.ones(4, 8, dtype=BF16))  # TE: no reduction in backward
    return out


CASES = [(r, m, sp) for r in ("hp", "current") for m in ("column", "row") for sp in (False, True)]


def _worker(rank: int, world: int) -> dict:
    from fp8sim.recipe import Float8CurrentScaling

    torch.set_num_threads(1)
    group = dist.new_group([0, 1])
    res = {"collectives": _collectives(rank, group)}
    for r, mode, sp in CASES:
        res[f"{r}-{mode}-{sp}"] = _case(rank, group, None if r == "hp" else Float8CurrentScaling(), mode, sp)
    return res


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return ranks(_worker, world_size=2)


def test_collective_ops_move_and_sum_as_te(results: list) -> None:
    for res in results:
        assert all(res["collectives"].values()), res["collectives"]


@pytest.mark.parametrize(("recipe", "mode", "sp"), CASES)
def test_tensor_parallel_linear_equals_the_per_shard_reference(results: list, recipe: str, mode: str, sp: bool) -> None:
    for res in results:
        got = res[f"{recipe}-{mode}-{sp}"]
        want_ops = ["BasicLinear", "Bias"] + ([] if mode == "column" else ["ReduceScatter" if sp else "AllReduce"])
        assert got.pop("ops") == want_ops
        assert all(got.values()), got
