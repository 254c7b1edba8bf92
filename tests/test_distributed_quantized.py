"""fp8sim.collectives.quantized on two gloo ranks: the amax MAX-reduction, codes gathered as bytes, and
the NVFP4 record gathered as TE gathers it (``transformer_engine/pytorch/distributed.py``
``_all_gather_nvfp4``: packed data and E4M3 scales along dim 0, the columnwise copy de-interleaved by
``_swap_first_dims``).

Oracles: each rank's payload is known to the test; a gather is the plain concatenation of the ranks'
payloads in rank order; TE's NVFP4 gather of per-rank shards quantized with the MAX-reduced global amax
is the quantization of the whole tensor (rowwise: rows of the whole; columnwise: the whole's transpose).
Every rank also calls each function over a group of itself alone, at the same time as its peer: a
function that ignores ``group`` reduces or gathers over both ranks instead.
"""

from __future__ import annotations

import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")
dist = require("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

from _dist import ranks  # noqa: E402

from fp8sim.scaling.nvfp4 import quantize_nvfp4  # noqa: E402

WORLD = 2
_VALUES = (1.5, -3.0)
_WIDE = (np.float64(1.0 + 2.0**-30), np.float64(1.0))  # the first is not a float32: it rounds to 1.0
_WIRES = ("float8_e4m3fn", None, "no_such_dtype")  # a byte dtype, none, one this torch lacks: the same bytes
_FIELDS = ("codes", "scales", "fmt", "block", "shape", "dtype", "scale_format", "global_scale", "global_amax")


def _codes(rank: int) -> torch.Tensor:
    """Three rows of two bytes, NaN codes of E4M3 (0x7f, 0xff) included."""
    rows = [[0x7F, rank], [0xFF, 0x10 + rank], [0x80, 0x38 + rank]]
    return torch.tensor(rows, dtype=torch.uint8)


def _whole() -> torch.Tensor:
    return torch.randn(32, 32, generator=torch.Generator().manual_seed(7)) * 3.0


def _fields(q: object) -> dict:
    return {f: getattr(q, f) for f in _FIELDS}


def _worker(rank: int, world: int) -> dict:
    from fp8sim.collectives.quantized import gather_codes, gather_nvfp4, max_over, world_rank

    own = [dist.new_group([r]) for r in range(world)][rank]  # every rank makes every group, in order
    out: dict = {
        "world_rank": (world_rank(None), world_rank(own)),
        "max": (max_over(_VALUES[rank], None), max_over(_VALUES[rank], own), max_over(_WIDE[rank], None)),
        "codes": [(gather_codes(_codes(rank), None, w), gather_codes(_codes(rank), own, w)) for w in _WIRES],
    }
    local = _whole().chunk(world)[rank]
    amax = max_over(float(local.abs().max()), None)
    for columnwise in (False, True):
        q = quantize_nvfp4(local.t().contiguous() if columnwise else local, global_amax=amax)
        out[columnwise] = (_fields(gather_nvfp4(q, None, columnwise)), _fields(gather_nvfp4(q, own, columnwise)))
    return out


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return ranks(_worker, world_size=WORLD)


def _assert_same(got: dict, want: dict, what: str) -> None:
    for f in _FIELDS:
        a, b = got[f], want[f]
        same = (
            np.array_equal(a, b) and np.asarray(a).dtype == np.asarray(b).dtype if f in ("codes", "scales") else a == b
        )
        assert same, f"{what}: {f} differs: {a!r} vs {b!r}"


def test_world_rank_and_the_amax_max_reduction_follow_the_group(results: list[dict]) -> None:
    for rank, res in enumerate(results):
        assert res["world_rank"] == ((WORLD, rank), (1, 0))
        assert res["max"] == (max(_VALUES), _VALUES[rank], 1.0)
        assert all(type(v) is float for v in res["max"])


def test_codes_gather_in_rank_order_as_bytes_whatever_the_wire_dtype(results: list[dict]) -> None:
    both = torch.cat([_codes(r) for r in range(WORLD)])
    for rank, res in enumerate(results):
        for wire, (world, alone) in zip(_WIRES, res["codes"], strict=True):
            assert world.dtype == torch.uint8 and torch.equal(world, both), (rank, wire)
            assert alone.dtype == torch.uint8 and torch.equal(alone, _codes(rank)), (rank, wire)


@pytest.mark.parametrize("columnwise", [False, True])
def test_nvfp4_shards_gathered_are_the_whole_tensors_quantization(results: list[dict], columnwise: bool) -> None:
    """Rowwise: the shards' rows stacked; columnwise (the transposed copy): their columns side by side."""
    x = _whole()
    amax = float(x.abs().max())
    want = _fields(quantize_nvfp4(x.t().contiguous() if columnwise else x, global_amax=amax))
    for rank, res in enumerate(results):
        world, alone = res[columnwise]
        _assert_same(world, want, f"rank {rank}, columnwise={columnwise}")
        local = x.chunk(WORLD)[rank]
        mine = quantize_nvfp4(local.t().contiguous() if columnwise else local, global_amax=amax)
        _assert_same(alone, _fields(mine), f"rank {rank} alone, columnwise={columnwise}")
