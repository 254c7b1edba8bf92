"""TE's in-place, copy and slicing rules of quantized tensors, with references written from TE's code
(NVIDIA/TransformerEngine at d0067d0):

- ``update_quantized`` / ``quantize_`` write into the destination's buffers and never assign its
  ``_quantizer`` (``pytorch/csrc/quantizer.cpp`` ``Float8Quantizer::convert_and_update_tensor``,
  lines 541-625: it coerces ``_data``/``_transpose``/``_fp8_dtype`` only);
- ``copy_`` between Float8Tensors copies ``_data``, ``_scale_inv`` and a valid ``_transpose`` into the
  destination (``pytorch/tensor/float8_tensor.py`` lines 906-921), between other quantized tensors of
  one quantizer type and usages it copies every buffer (``pytorch/quantized_tensor.py`` lines 864-887);
- slice/select/split give Float8Tensors (``float8_tensor.py`` lines 675-796);
- ``update_usage(rowwise_usage=True)`` cannot rebuild ``_data`` from ``_transpose``
  (``tensor/storage/float8_tensor_storage.py`` ``update_usage``).

FP8 codes are computed here with torch's own casts (``(x * scale).to(torch.float8_e4m3fn)``, inputs
inside the finite range so TE's saturation does not apply) and TE's columnwise layout with
``ref_per_tensor_cs.py``'s ``_multi_dim_transpose`` (lines 21-37).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fp8sim.pytorch.constants import DType  # noqa: E402
from fp8sim.pytorch.tensor import (  # noqa: E402
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    Float8Tensor,
    MXFP8Quantizer,
)

torch.set_num_threads(1)


def _rand(shape: tuple, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g) * 40 - 20  # |x| <= 20: x * 4 stays below 448


def _codes(x: torch.Tensor, scale: float) -> torch.Tensor:
    return (x.float() * scale).to(torch.float8_e4m3fn).view(torch.uint8)


def _colwise(t: torch.Tensor) -> torch.Tensor:  # ref_per_tensor_cs.py _multi_dim_transpose
    if t.dim() <= 1:
        return t
    return t.permute([t.dim() - 1, *range(t.dim() - 1)]).contiguous()


def _q(scale: float, **usage: bool) -> Float8Quantizer:
    return Float8Quantizer(torch.full([1], scale), torch.zeros(1), DType.kFloat8E4M3, **usage)


def test_update_quantized_writes_in_place_and_keeps_the_destination_quantizer() -> None:
    x, y = _rand((4, 6), 0), _rand((4, 6), 1)
    dst = _q(2.0)(x)
    data, transpose, view = dst._data, dst._transpose, dst.view(24)
    _q(4.0).update_quantized(y, dst)
    assert dst._data is data and dst._transpose is transpose  # TE's kernel writes the existing buffers
    assert torch.equal(dst._data, _codes(y, 4.0)) and torch.equal(dst._transpose, _colwise(_codes(y, 4.0)))
    assert dst._scale_inv.item() == 0.25
    assert torch.equal(view._data, _codes(y, 4.0).view(24))  # a view shares the codes, as in TE
    assert dst._quantizer.scale.item() == 2.0  # still the tensor's own quantizer
    dst.quantize_(x)
    assert torch.equal(dst._data, _codes(x, 2.0)) and dst._scale_inv.item() == 0.5


def test_copy_between_float8_tensors_is_tes_raw_copy() -> None:
    x, y, z = _rand((4, 6), 2), _rand((4, 6), 3), _rand((4, 6), 4)
    dst = _q(2.0)(x)
    src = _q(4.0, columnwise=False)(y)  # other usages: TE still copies the codes
    data = dst._data
    dst.copy_(src)
    assert dst._data is data and torch.equal(dst._data, _codes(y, 4.0)) and dst._scale_inv.item() == 0.25
    # src has no transpose: TE rebuilds the destination's from its new codes (_create_transpose)
    assert torch.equal(dst._transpose, _colwise(_codes(y, 4.0)))
    assert dst.get_usages() == {"rowwise": True, "columnwise": True}
    dst.quantize_(z)  # with dst's quantizer (scale 2), not src's
    assert torch.equal(dst._data, _codes(z, 2.0))


def test_copy_between_other_quantized_tensors_copies_every_buffer_in_place() -> None:
    q = MXFP8Quantizer(DType.kFloat8E4M3)
    dst, src = q(_rand((32, 64), 5)), q(_rand((32, 64), 6))
    bufs = {k: v for k, v in dst.get_metadata().items() if isinstance(v, torch.Tensor)}
    want = {k: src.get_metadata()[k].clone() for k in bufs}
    dst.copy_(src)
    for k, buf in bufs.items():
        assert getattr(dst, "_" + k) is buf and torch.equal(buf, want[k]), k


def test_rowwise_data_cannot_be_made_from_the_transpose() -> None:
    q = Float8CurrentScalingQuantizer(DType.kFloat8E4M3, "cpu", rowwise=False, columnwise=True)
    col = q(_rand((4, 8), 7))
    with pytest.raises(RuntimeError, match="Cannot generate FP8 data, even from FP8 data transpose"):
        col.update_usage(rowwise_usage=True)


INDEXES = [
    (slice(1, 3),),
    (2,),
    (slice(None), 1),
    (slice(None), slice(None), slice(2, 7)),
    (slice(None), slice(None), 3),
    (Ellipsis, slice(0, 8, 2)),
]


@pytest.mark.parametrize("index", INDEXES, ids=str)
def test_slicing_and_indexing_give_float8_tensors(index: tuple) -> None:
    x = _rand((4, 5, 8), 8)
    t = _q(4.0)(x)
    codes = _codes(x, 4.0)[index]
    part = t[index]
    assert isinstance(part, Float8Tensor) and part.shape == codes.shape
    assert torch.equal(part._data, codes) and torch.equal(part._transpose.contiguous(), _colwise(codes))
    assert part._scale_inv.item() == 0.25
    assert torch.equal(part.dequantize(), (codes.view(torch.float8_e4m3fn).float() * 0.25))
    col = _q(4.0, rowwise=False)(x)[index]
    assert isinstance(col, Float8Tensor) and col._data is None and col.shape == codes.shape
    assert torch.equal(col._transpose.contiguous(), _colwise(codes))


def test_split_gives_float8_tensors() -> None:
    x = _rand((6, 8), 9)
    parts = _q(4.0)(x).split(2, dim=0)
    assert len(parts) == 3
    for i, p in enumerate(parts):
        codes = _codes(x, 4.0)[2 * i : 2 * i + 2]
        assert isinstance(p, Float8Tensor) and torch.equal(p._data, codes)
        assert torch.equal(p._transpose.contiguous(), _colwise(codes))
