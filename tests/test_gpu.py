"""CUDA path == CPU reference, bit for bit (skipped without a CUDA device)."""

from __future__ import annotations

import numpy as np
import pytest

import fp8sim
from fp8sim.formats import FORMATS
from fp8sim.testing.oracles import require

torch = require("torch")
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


def test_te_philox_words_equal_torch_cuda_philox() -> None:
    """fp8sim's Philox stream (the one TE's NVFP4 kernels draw) against torch's own CUDA Philox4x32-10:
    ATen ``distribution_elementwise_grid_stride_kernel`` (``ATen/native/cuda/DistributionTemplates.h``) calls
    ``curand_init(seed, idx, offset)`` and ``curand4`` per thread ``idx``, i.e. counter ``(offset / 4, 0, idx, 0)``
    (cuRAND counts the offset in 32-bit outputs, TE's ``philox4x32_native_state`` in 128-bit blocks: TE block
    ``b`` is torch offset ``4 b``).  ``random_(-2**63, None)`` (``random_full_64_bits_range_kernel``) writes
    ``(w0 << 32) | w1`` to element ``idx`` and ``(w2 << 32) | w3`` to ``idx + stride``; the grid is capped at
    ``SMs * (max threads per SM / 256)`` blocks of 256 (``calc_execution_policy``)."""
    from fp8sim.cast.te_nvfp4_sr import te_philox_block_words

    props = torch.cuda.get_device_properties(0)
    per_sm = getattr(props, "max_threads_per_multi_processor", None)
    g = torch.Generator(device="cuda")
    if per_sm is None or not hasattr(g, "set_offset"):
        pytest.skip("this torch reports no max_threads_per_multi_processor or has no Generator.set_offset")
    threads = props.multi_processor_count * (per_sm // 256) * 256
    seed, block = 0x0123456789ABCDEF, 5
    g.manual_seed(seed)
    g.set_offset(4 * block)
    out = torch.empty(2 * threads, dtype=torch.int64, device="cuda").random_(-(2**63), None, generator=g)
    got = out.cpu().numpy().view(np.uint64)
    w = te_philox_block_words(seed, block, threads).astype(np.uint64)  # (threads, 4): subsequence = thread
    want = np.concatenate([(w[:, 0] << np.uint64(32)) | w[:, 1], (w[:, 2] << np.uint64(32)) | w[:, 3]])
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"first difference at element {bad[0]}: torch {got[bad[0]]:#x}, fp8sim {want[bad[0]]:#x}"


@pytest.mark.parametrize("autocast", [torch.bfloat16, torch.float16], ids=["ac_bf16", "ac_fp16"])
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8linear_under_cuda_autocast_equals_torchao(recipe: str, autocast: torch.dtype) -> None:
    """torchao ``float8_linear.py`` ``forward``: under CUDA autocast the input is cast to the autocast dtype
    (``torch.get_autocast_gpu_dtype()``), the emulated GEMM returns the first operand's ``_orig_dtype``, and the
    bias is added in that dtype.  fp8sim on CUDA against torchao ``emulate=True`` on CUDA, output and grads."""
    import copy
    import dataclasses

    ao = require("torchao.float8")
    import fp8sim.torchao as fs
    from fp8sim.testing import assert_bit_exact

    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16)).cuda()
    cfg = dataclasses.replace(ao.Float8LinearConfig.from_recipe_name(recipe), emulate=True)
    theirs = ao.convert_to_float8_training(copy.deepcopy(base), config=cfg)
    ours = fs.convert_to_float8_training(copy.deepcopy(base), config=fs.Float8LinearConfig.from_recipe_name(recipe))
    x0 = torch.randn(48, 64, device="cuda")
    results = []
    for model in (ours, theirs):
        x = x0.clone().requires_grad_(True)
        with torch.autocast("cuda", dtype=autocast):
            y = model(x)
        y.float().square().sum().backward()
        results.append([y.detach(), x.grad, *(p.grad for p in model.parameters())])
    assert results[0][0].dtype == autocast
    for got, want in zip(*results, strict=True):
        assert got.dtype == want.dtype
        assert_bit_exact(got.cpu(), want.cpu())
