"""TE 2.20's storage surface from issue 27, written from NVIDIA/TransformerEngine at d0067d0:
``MXFP8TensorStorage(...)`` (``tensor/storage/mxfp8_tensor_storage.py:88-114``) and its FSDP2 buffers
(``:328-400``); ``Float8BlockwiseQTensor.fsdp_assign_gathered`` (``float8_blockwise_tensor_storage.py:606-667``);
``NVFP4Tensor._row_scaled_nvfp4`` (``nvfp4_tensor_storage.py:140``).  Expectations are TE's own tests:
``tests/pytorch/test_quantized_tensor.py:754-776``, ``test_float8blockwisetensor.py:99-140``,
``test_recipe.py:680-692``."""

from __future__ import annotations

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

from fp8sim.pytorch.constants import DType  # noqa: E402
from fp8sim.pytorch.tensor import Float8BlockQuantizer, MXFP8Quantizer, NVFP4Quantizer  # noqa: E402
from fp8sim.pytorch.tensor.storage import MXFP8TensorStorage  # noqa: E402


def test_mxfp8_storage_built_directly_keeps_a_partial_scale_block() -> None:
    cs = torch.arange(4 * 128, dtype=torch.float32).reshape(4, 128)
    s = MXFP8TensorStorage(
        rowwise_data=None, rowwise_scale_inv=None, columnwise_data=torch.zeros((48, 64), dtype=torch.uint8),
        columnwise_scale_inv=cs, fp8_dtype=DType.kFloat8E4M3, quantizer=None, with_gemm_swizzled_scales=False,
        fake_dtype=torch.bfloat16,
    )  # fmt: skip
    buffers, meta = s.fsdp_extract_buffers()
    assert meta == {"field_names": ("_columnwise_data", "_columnwise_scale_inv")}
    assert buffers[0] is s._columnwise_data
    assert torch.equal(buffers[1], cs[:2])  # ceil(48 / 32) = 2 rows kept, the partial block included
    assert s._dtype == torch.bfloat16 and s._fp8_dtype == DType.kFloat8E4M3
    with pytest.raises(TypeError):
        MXFP8TensorStorage(None, None, None)  # TE's positional arguments are required


def test_mxfp8_gathered_shards_dequantize_as_the_shards() -> None:
    q = MXFP8Quantizer(DType.kFloat8E4M3)
    torch.manual_seed(0)
    shards = [q(torch.randn(64, 64)) for _ in range(2)]
    parts = [s.fsdp_extract_buffers() for s in shards]
    gathered = tuple(torch.cat([p[0][i] for p in parts]) for i in range(4))
    full = q(torch.randn(128, 64))
    full.fsdp_assign_gathered(gathered, parts[0][1])
    assert full._rowwise_scale_inv.shape[0] % 128 == 0 and full._columnwise_scale_inv.shape[0] % 4 == 0
    assert torch.equal(full.dequantize(), torch.cat([s.dequantize() for s in shards]))
    with pytest.raises(RuntimeError, match="got 3 buffers for 4 fields"):
        full.fsdp_assign_gathered(gathered[:3], parts[0][1])


@pytest.mark.parametrize("direction", ["rowwise", "columnwise"])
def test_blockwise_gathered_shards_dequantize_as_the_shards(direction: str) -> None:
    q = Float8BlockQuantizer(DType.kFloat8E4M3, rowwise=True, columnwise=True, block_scaling_dim=2)
    torch.manual_seed(1)
    xs = [torch.randn(128, 256) for _ in range(2)]
    shards = [q(x) for x in xs]
    if direction == "columnwise":
        for s in shards:
            s.update_usage(rowwise_usage=False)
    parts = [s.fsdp_extract_buffers() for s in shards]
    assert parts[0][1]["direction"] == direction
    gathered = tuple(torch.cat([p[0][i] for p in parts]) for i in range(2))
    full = q(torch.zeros(256, 256))
    full.fsdp_assign_gathered(gathered, parts[0][1])
    want = torch.cat([s.dequantize() for s in shards])
    if direction == "columnwise":
        full.update_usage(rowwise_usage=False)
        assert full._columnwise_scale_inv.shape == q.get_scale_shape((256, 256), columnwise=True)
    assert torch.equal(full.dequantize(), want)


def test_blockwise_assign_rejects_invalid_scale_geometry() -> None:
    q = Float8BlockQuantizer(DType.kFloat8E4M3, rowwise=True, columnwise=True, block_scaling_dim=2)
    t = q(torch.randn(128, 256))
    original = t._rowwise_data
    bad = (torch.zeros((256, 256), dtype=torch.uint8), torch.ones((3, 2)))
    with pytest.raises(RuntimeError, match="gathered scale geometry"):
        t.fsdp_assign_gathered(bad, {"direction": "rowwise"})
    assert t._rowwise_data is original
    one_d = Float8BlockQuantizer(DType.kFloat8E4M3, rowwise=True, columnwise=True, block_scaling_dim=1)
    with pytest.raises(NotImplementedError, match="requires 2D block scaling"):
        one_d(torch.randn(128, 256)).fsdp_extract_buffers()


@pytest.mark.parametrize("row_scaled", [False, True])
def test_nvfp4_tensor_says_whether_it_is_row_scaled(row_scaled: bool) -> None:
    q = NVFP4Quantizer(columnwise=not row_scaled, row_scaled_nvfp4=row_scaled)
    t = q(torch.rand(128, 128))
    assert t._row_scaled_nvfp4 is row_scaled
    assert t._amax_rowwise.numel() == (128 if row_scaled else 1)
    assert q(t.dequantize())._row_scaled_nvfp4 is row_scaled
