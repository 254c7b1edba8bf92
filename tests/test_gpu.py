"""CUDA path == CPU reference, bit for bit (skipped without a CUDA device)."""

from __future__ import annotations

import numpy as np
import pytest

import fp8sim
from fp8sim.formats import FORMATS

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

BITS16 = np.arange(1 << 16, dtype=np.uint16)


def _inputs() -> list[tuple[str, object]]:
    rng = np.random.default_rng(11)
    f32 = np.concatenate(
        [
            rng.integers(0, 2**32, 1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32),
            (rng.standard_normal(1 << 18) * 100).astype(np.float32),
        ]
    )
    return [
        ("float16", torch.from_numpy(BITS16.view(np.int16)).view(torch.float16)),
        ("bfloat16", torch.from_numpy(BITS16.view(np.int16)).view(torch.bfloat16)),
        ("float32", torch.from_numpy(f32)),
        ("float64", torch.from_numpy(f32.astype(np.float64) * (1 + 2.0**-33))),
    ]


@pytest.mark.parametrize("name", list(FORMATS))
@pytest.mark.parametrize("rounding", fp8sim.ROUNDING_MODES)
@pytest.mark.parametrize("saturate", [False, True])
def test_cuda_codes_equal_cpu_codes(name: str, rounding: str, saturate: bool) -> None:
    seed = 1234 if rounding == "stochastic" else None
    for label, x in _inputs():
        cpu = fp8sim.encode(x, name, rounding=rounding, saturate=saturate, seed=seed)
        gpu = fp8sim.encode(x.cuda(), name, rounding=rounding, saturate=saturate, seed=seed)
        assert gpu.device.type == "cuda" and gpu.dtype == torch.uint8
        bad = (gpu.cpu() != cpu).nonzero()
        assert bad.numel() == 0, (
            f"{name} {rounding} sat={saturate} {label}: {bad.numel()} differ; first x="
            f"{x.reshape(-1)[bad[0]].item()!r} cuda 0x{int(gpu.cpu()[bad[0]]):02x} cpu 0x{int(cpu[bad[0]]):02x}"
        )


@pytest.mark.parametrize("name", list(FORMATS))
def test_cuda_decode_equals_cpu_decode(name: str) -> None:
    codes = torch.arange(FORMATS[name].num_codes, dtype=torch.uint8)
    cpu = fp8sim.decode(codes, name)
    gpu = fp8sim.decode(codes.cuda(), name)
    assert torch.equal(gpu.cpu().view(torch.int32), cpu.view(torch.int32))
