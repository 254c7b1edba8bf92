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

from fp8sim.testing.oracles import require

torch = require("torch")

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


def test_update_quantized_refuses_another_tensor_class_with_tes_errors() -> None:
    """float8_tensor.py lines 105-106 (ValueError), mxfp8_tensor.py line 105 (assert)."""
    mx = MXFP8Quantizer(DType.kFloat8E4M3)
    f8 = _q(2.0)(_rand((32, 32), 10))
    with pytest.raises(ValueError, match="^Float8Quantizer can only update Float8Tensor$"):
        _q(2.0).update_quantized(_rand((32, 32), 11), mx(_rand((32, 32), 12)))
    with pytest.raises(AssertionError, match="^Cannot store quantized MXFP8 in <class '.*Float8Tensor'> type.$"):
        mx.update_quantized(_rand((32, 32), 11), f8)


def test_view_and_reshape_keep_the_transpose_only_for_its_own_shape() -> None:
    """float8_tensor.py _ViewFunc / _ReshapeFunc (lines 1225-1315): the codes are a view of the
    original's; a transpose whose shape is not the new shape's columnwise one is dropped."""
    x = _rand((4, 6, 8), 13)
    t = _q(4.0)(x)
    v = t.view(24, 8)
    assert v._data.data_ptr() == t._data.data_ptr() and torch.equal(v._data, _codes(x, 4.0).view(24, 8))
    assert v._transpose is None and v.get_usages() == {"rowwise": True, "columnwise": False}
    r = t.reshape(4, 48)
    assert r._transpose is None and torch.equal(r._data, _codes(x, 4.0).reshape(4, 48))
    same = t.view(4, 6, 8)
    assert same._transpose.data_ptr() == t._transpose.data_ptr()
    col = _q(4.0, rowwise=False)(x)
    assert torch.equal(col.reshape(4, 6, 8)._transpose, _colwise(_codes(x, 4.0)))
    with pytest.raises(NotImplementedError, match="columnwise-only data is only supported"):
        col.reshape(24, 8)


def test_new_zeros_new_empty_and_empty_like_stay_quantized() -> None:
    """float8_tensor.py new_zeros (lines 798-843); quantized_tensor.py new_empty and empty_like
    (lines 935-974): the tensor's quantizer, with the tensor's usages for empty_like, makes them."""
    t = _q(4.0)(_rand((4, 6), 14))
    z = t.new_zeros((3, 5))
    assert isinstance(z, Float8Tensor) and z.shape == (3, 5) and z.dtype == torch.float32
    assert torch.equal(z._data, torch.zeros(3, 5, dtype=torch.uint8))
    assert torch.equal(z._transpose, torch.zeros(5, 3, dtype=torch.uint8))
    assert z._scale_inv is not t._scale_inv and z._scale_inv.item() == 0.25
    assert torch.equal(z.dequantize(), torch.zeros(3, 5))
    e = t.new_empty((2, 7))
    assert isinstance(e, Float8Tensor) and e.shape == (2, 7)
    col = _q(4.0, rowwise=False)(_rand((4, 6), 15))
    like = torch.empty_like(col)
    assert isinstance(like, Float8Tensor) and like.shape == (4, 6)
    assert like.get_usages() == {"rowwise": False, "columnwise": True}
    row = _q(4.0)(_rand((4, 6), 16))
    row.update_usage(columnwise_usage=False)  # usages now differ from its quantizer's
    assert torch.empty_like(row).get_usages() == {"rowwise": True, "columnwise": False}
    assert row._quantizer.columnwise_usage is True  # the tensor's quantizer is left as it was


@pytest.mark.parametrize("kind", ["mxfp8", "block1d", "nvfp4"])
def test_block_scaled_views_keep_the_data_layout(kind: str) -> None:
    """A view that keeps the inner dim is the tensor of the flattened input: TE's _ViewFunc views
    the rowwise data as the new shape, the columnwise data as TE's columnwise shape for it
    (``float8_blockwise_tensor.py`` lines 810-815, ``nvfp4_tensor.py`` lines 1095-1111), and shares
    the scales, which are laid out by the flattened rows already."""
    from fp8sim.pytorch.tensor import Float8BlockQuantizer, NVFP4Quantizer

    q = {
        "mxfp8": lambda: MXFP8Quantizer(DType.kFloat8E4M3),
        "block1d": lambda: Float8BlockQuantizer(DType.kFloat8E4M3, rowwise=True, columnwise=True, block_scaling_dim=1),
        "nvfp4": lambda: NVFP4Quantizer(),
    }[kind]()
    x = _rand((2, 32, 128), 17)
    v, flat = q(x).view(64, 128), q(x.reshape(64, 128))
    assert type(v) is type(flat) and v.shape == (64, 128)
    for name in ("_rowwise_data", "_columnwise_data", "_rowwise_scale_inv", "_columnwise_scale_inv"):
        got, want = getattr(v, name), getattr(flat, name)
        assert got.shape == want.shape and torch.equal(got, want), name


def test_contiguous_copies_sliced_codes() -> None:
    """float8_tensor.py contiguous (lines 549-579): self when already contiguous, else a copy."""
    t = _q(4.0)(_rand((4, 6), 18))
    assert t.contiguous() is t
    part = t[:, 1:4]
    assert not part._data.is_contiguous()
    c = part.contiguous()
    assert c is not part and c._data.is_contiguous() and c._transpose.is_contiguous()
    assert torch.equal(c._data, part._data) and torch.equal(c._transpose, part._transpose)


def test_the_amax_reduction_group_does_not_persist_on_the_tensor() -> None:
    """quantized_tensor.py Quantizer.quantize (lines 441-447): the result's quantizer drops it."""
    group = object()
    q = Float8CurrentScalingQuantizer(DType.kFloat8E4M3, "cpu", with_amax_reduction=True, amax_reduction_group=group)
    t = q(_rand((4, 8), 19))  # no process group initialised: nothing to reduce
    assert t._quantizer.with_amax_reduction is False and t._quantizer.amax_reduction_group is None
    assert q.with_amax_reduction is True and q.amax_reduction_group is group


def test_attention_and_layer_constants_are_tes() -> None:
    """pytorch/constants.py lines 127-173 at d0067d0, as listed there."""
    from fp8sim.pytorch import constants as C

    assert C.AttnMaskTypes == (
        "no_mask",
        "padding",
        "causal",
        "padding_causal",
        "causal_bottom_right",
        "padding_causal_bottom_right",
        "arbitrary",
    )
    assert C.AttnTypes == ("self", "cross") and C.LayerTypes == ("encoder", "decoder")
    assert C.AttnBiasTypes == ("pre_scale_bias", "post_scale_bias", "no_bias", "alibi")
    assert C.GemmParallelModes == ("row", "column", None)
    assert len(C.QKVLayouts) == 25 and C.QKVLayouts[:3] == ("sb3hd", "sbh3d", "sbhd_sb2hd")
    assert C.QKVLayouts[15] == "sbhd_bshd_bshd" and C.QKVLayouts[-1] == "paged_kv_thd_sbhd_sbhd"
    assert C.dist_group_type is torch.distributed.ProcessGroup


def test_in_place_ops_requantize_keyword_and_list_outputs() -> None:
    """quantized_tensor.py __torch_dispatch__ (lines 995-1022): every written argument, keyword
    (``out=``) or in a list (``_foreach_*_``), is quantized back with the tensor's quantizer."""
    x, y = _rand((4, 6), 20), _rand((4, 6), 21)
    q = _q(2.0)
    dst = q(torch.zeros(4, 6))
    torch.add(x, y, out=dst)
    assert isinstance(dst, Float8Tensor) and torch.equal(dst._data, _codes(x + y, 2.0))
    a, b = q(x), q(y)
    torch._foreach_mul_([a, b], 0.5)
    assert torch.equal(a._data, _codes(q(x).dequantize() * 0.5, 2.0))
    assert torch.equal(b._data, _codes(q(y).dequantize() * 0.5, 2.0))


def test_mxfp8_split_along_rows_stays_mxfp8() -> None:
    """mxfp8_tensor.py split (lines 422-505): dim 0, multiples of 32 rows: data and scales split,
    scales padded back to 128 (rowwise) / 4 (columnwise) rows, which is the quantization of each
    block-aligned piece; any other split falls back to the dequantized values."""
    from fp8sim.pytorch.tensor import MXFP8Tensor

    q = MXFP8Quantizer(DType.kFloat8E4M3)
    x = _rand((128, 64), 22)
    parts = q(x).split(64)
    assert len(parts) == 2
    for i, p in enumerate(parts):
        want = q(x[64 * i : 64 * (i + 1)])
        assert isinstance(p, MXFP8Tensor) and p.shape == (64, 64)
        for name in ("_rowwise_data", "_columnwise_data", "_rowwise_scale_inv", "_columnwise_scale_inv"):
            got, ref = getattr(p, name), getattr(want, name)
            assert got.shape == ref.shape and torch.equal(got, ref), name
    odd = q(x).split(48)
    assert not isinstance(odd[0], MXFP8Tensor) and torch.equal(odd[0], q(x).dequantize()[:48])
