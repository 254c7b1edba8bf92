"""One-process checks of fp8sim.pytorch's TE-style tensor-parallel API (issue 16, item 3): TE's argument
rules, the FP32 bias gradient, the NVFP4 columnwise de-interleave, and the FP8 all-reduce quirk's guard.
The 2-rank spawn and what it checks are in ``test_distributed_te_tp.py``."""

from __future__ import annotations

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")
dist = require("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

from _dist import ranks  # noqa: E402


def test_tp_arguments_follow_te() -> None:
    """TE linear.py 1608-1627 (group, sizes, ``sequence_parallel`` only with ``tp_size > 1``), 1746-1753
    (splits) and utils.divide (295-305)."""
    import fp8sim.pytorch as te

    m = te.Linear(32, 64, tp_size=1, parallel_mode="column", sequence_parallel=True)
    assert m.sequence_parallel is False  # TE: (tp_size > 1) and sequence_parallel
    for sp in (False, True):  # with two ranks the flag is kept as given (the 2-rank spawn checks what it does)
        assert te.Linear(32, 64, tp_size=2, parallel_mode="column", sequence_parallel=sp).sequence_parallel is sp
    with pytest.raises(ValueError, match="64 is not divisible by 3"):
        te.Linear(32, 64, tp_size=3, parallel_mode="column")
    qkv = te.Linear(32, 96, tp_size=2, parallel_mode="column", parameters_split=("query", "key", "value"))
    assert [tuple(getattr(qkv, f"{n}_weight").shape) for n in ("query", "key", "value")] == [(16, 32)] * 3
    with pytest.raises(RuntimeError, match="out_features=30 between 4 tensor-parallel processes"):
        te.Linear(32, 64, tp_size=4, parallel_mode="column", parameters_split={"a": 30, "b": 34})
    with pytest.raises(NotImplementedError, match="needs set_parallel_mode=True"):
        te.LayerNormMLP(32, 64, tp_size=2)
    with pytest.raises(NotImplementedError, match="MultiheadAttention with tp_size > 1 needs set_parallel_mode=True"):
        te.MultiheadAttention(32, 2, tp_size=2)


def test_fp32_bias_gradient_is_not_rounded_to_bf16() -> None:
    """TE linear.py: an FP32 bias goes into the FP8 GEMM as BF16 (``bias_dtype = torch.bfloat16``, cast inside
    ``_Linear``), and its gradient is the bgrad in the grad dtype, float32 here: fp8sim rounded it to BF16."""
    import fp8sim.pytorch as te
    from fp8sim.recipe import Float8CurrentScaling

    torch.manual_seed(0)
    m = te.Linear(32, 32)
    x, g = torch.randn(16, 32), torch.randn(16, 32) * 1e-3
    with te.autocast(recipe=Float8CurrentScaling()):
        y = m(x)
    y.backward(g)
    want = g.sum(0)
    assert m.bias.grad.dtype == torch.float32 and torch.equal(m.bias.grad, want)
    assert not torch.equal(want, want.bfloat16().float())  # the test can tell the two apart


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_nvfp4_columnwise_gather_is_deinterleaved_as_te_swap_first_dims(world: int) -> None:
    """TE ``distributed.py`` ``_swap_first_dims`` (1258-1283): the transposed shards gathered along dim 0,
    ``(world * d0, d1)``, become the shards side by side along dim 1, ``(d0, world * d1)``."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from fp8sim.collectives.quantized import swap_first_dims as _swap_first_dims

    @settings(max_examples=20, deadline=None)
    @given(st.integers(1, 5), st.integers(1, 5), st.integers(0, 2**31 - 1))
    def check(d0: int, d1: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        shards = [torch.randint(0, 256, (d0, d1), generator=g, dtype=torch.uint8) for _ in range(world)]
        assert torch.equal(_swap_first_dims(torch.cat(shards, 0), world), torch.cat(shards, 1))

    check()


@pytest.mark.slow
def test_all_reduce_of_a_tensor_with_te_dispatch_leaves_it_and_reduce_scatter_sums() -> None:
    """TE's non-mutable dispatch branch on 2 gloo ranks: ``dist.all_reduce`` leaves the tensor's data (each rank's
    own), ``reduce_scatter_tensor`` into a plain output writes the sum of the dequantized inputs."""
    from _te_tp_fp8_io import te_dispatch_worker

    for res in ranks(te_dispatch_worker, world_size=2):
        assert res == {"allreduce_keeps": True, "reduce_scatter_sums": True}


def test_the_fp8_all_reduce_quirk_warns_and_a_mutable_all_reduce_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """fp8sim reproduces TE's unreduced FP8 tensor only where torch's ``c10d.allreduce_`` is not mutable (TE's
    dispatch branch); a torch that marked it mutable would make TE re-quantize the sum, which is refused."""
    from fp8sim._util.upstream_quirk import UpstreamQuirkWarning
    from fp8sim.pytorch.module import _tp_fp8_io as fio

    with pytest.warns(UpstreamQuirkWarning, match="te-fp8-allreduce-noop"):
        fio.check_allreduce_keeps_fp8("output")
    monkeypatch.setattr(fio, "_allreduce_is_mutable", lambda: True)
    with pytest.raises(NotImplementedError, match="marks c10d.allreduce_ mutable"):
        fio.check_allreduce_keeps_fp8("dgrad")
