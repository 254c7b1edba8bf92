"""Edges of ``fp8sim/pytorch/tensor`` that the second mutation sample (seed 31, issue 30,
``reports/mutation_pytorch_tensor.md``) found untested.  Each expectation is written from
NVIDIA/TransformerEngine at d0067d0 (file and line in each test), from torch's own ops, ml_dtypes or an
independent kernel walk, never from fp8sim's formula.
"""

from __future__ import annotations

import types
import warnings

import ml_dtypes
import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

from fp8sim.pytorch.constants import DType  # noqa: E402
from fp8sim.pytorch.tensor import (  # noqa: E402
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    HybridQuantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
    QuantizerRole,
    custom_recipe_quantizers,
)
from fp8sim.pytorch.tensor.identity_tensor import IdentityQuantizer  # noqa: E402
from fp8sim.pytorch.tensor.storage.quantized_tensor_storage import as_storage  # noqa: E402
from fp8sim.pytorch.tensor.utils import quantize_master_weights  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
E4M3 = DType.kFloat8E4M3


def _x(shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _current() -> Float8CurrentScalingQuantizer:
    return Float8CurrentScalingQuantizer(E4M3, "cpu")


def _e4m3_code(v: float) -> int:
    return int(np.array([v], np.float32).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)[0])


# --- quantized_tensor.py ------------------------------------------------------------------------------------------


def test_make_empty_does_not_require_grad_by_default() -> None:
    """TE ``quantized_tensor.py:467-475``: ``Quantizer.make_empty(..., requires_grad: bool = False, ...)``."""
    t = _current().make_empty((16, 32))
    assert t.requires_grad is False
    assert _current().make_empty((16, 32), requires_grad=True).requires_grad is True


def test_the_dequantizing_fallback_passes_keyword_arguments_on() -> None:
    """TE ``quantized_tensor.py:1024-1027``: the fallback unwraps ``args`` and ``kwargs`` and calls the op with
    both; ``torch.add(q, y, alpha=...)`` (``alpha`` is keyword-only in aten's schema) equals torch's own
    ``torch.add`` of the dequantized values."""
    q = _current()(_x((8, 16)))
    y = _x((8, 16), seed=1)
    assert torch.equal(torch.add(q, y, alpha=3.0), torch.add(q.dequantize(), y, alpha=3.0))


def test_a_storage_views_repr_names_its_storage_class() -> None:
    """TE's storage classes' ``__repr__`` start with their class name (``storage/float8_tensor_storage.py:255-258``,
    ``"Float8TensorStorage("``)."""
    s = as_storage(_current()(_x((8, 16))))
    assert repr(s).startswith(f"{type(s).__name__}(") and type(s).__name__ == "Float8TensorStorage"


# --- hybrid_tensor.py, identity_tensor.py, custom recipes -----------------------------------------------------------


def test_hybrid_quantizer_refuses_a_non_quantizer_with_tes_message() -> None:
    """TE ``hybrid_tensor.py:106-111``."""
    with pytest.raises(
        TypeError,
        match=r"^HybridQuantizer requires concrete Quantizer instances for both directions, but the rowwise "
        r"argument is object\.$",
    ):
        HybridQuantizer(rowwise_quantizer=object(), columnwise_quantizer=_current())


def test_hybrid_quantizer_copy_keeps_the_usages() -> None:
    """TE ``hybrid_tensor.py:141-154``: the copy gets ``set_usage(rowwise=self.rowwise_usage,
    columnwise=self.columnwise_usage)``."""
    h = HybridQuantizer(rowwise_quantizer=_current(), columnwise_quantizer=_current())
    h.set_usage(rowwise=True, columnwise=False)
    c = h.copy()
    assert (c.rowwise_usage, c.columnwise_usage) == (True, False)
    h.set_usage(rowwise=False, columnwise=True)
    c = h.copy()
    assert (c.rowwise_usage, c.columnwise_usage) == (False, True)


def test_identity_make_empty_takes_the_quantizers_dtype_over_the_argument() -> None:
    """TE ``identity_tensor.py:115``: ``data_dtype = self.dtype if self.dtype is not None else dtype``."""
    t = IdentityQuantizer(dtype=torch.bfloat16).make_empty((4, 8), dtype=torch.float32, device="cpu")
    assert t.dtype == torch.bfloat16
    assert IdentityQuantizer().make_empty((4, 8), dtype=torch.float16, device="cpu").dtype == torch.float16


def test_a_recipe_without_a_qfactory_attribute_is_tes_value_error() -> None:
    """TE ``quantization.py:1907-1908``: ``getattr(recipe, "qfactory", None) is None`` raises ValueError, also
    for a recipe object that has no ``qfactory`` attribute at all."""
    with pytest.raises(ValueError, match=r"^CustomRecipe requires `qfactory`\.$"):
        custom_recipe_quantizers(types.SimpleNamespace(), [QuantizerRole()])


# --- nvfp4_tensor.py ---------------------------------------------------------------------------------------------


def test_nvfp4_bad_4over6_error_mode_is_tes_error() -> None:
    """TE ``nvfp4_tensor.py:174``."""
    with pytest.raises(ValueError, match=r"^nvfp4_4over6_err_mode must be 'MAE' or 'MSE'\.$"):
        NVFP4Quantizer(nvfp4_use_4over6=True, nvfp4_4over6_err_mode="MAX")


def test_nvfp4_quantize_with_amax_gives_both_copies_the_supplied_amax() -> None:
    """TE ``csrc/quantizer.cpp:2741-2765``: ``NVFP4Quantizer::quantize_with_amax`` copies the input's amax into
    the rowwise AND the columnwise amax before the cast, so both copies carry the supplied value, not
    ``max |x|``."""
    x = _x((32, 64))
    assert float(x.abs().max()) < 8.0
    t = NVFP4Quantizer(rowwise=True, columnwise=True).quantize_with_amax(x, 8.0)
    assert t._amax_rowwise.tolist() == [8.0]
    assert t._amax_columnwise.tolist() == [8.0]


def test_rowwise_only_sr_cast_uses_the_rowwise_only_kernel_walk() -> None:
    """TE's tuned 1D NVFP4 kernel (``specialized/quantize_transpose_nvfp4_tuned_1D.cuh``), walked thread by thread
    in ``tests/test_cast_te_nvfp4_sr.py::_tuned_kernel_words``: without the columnwise copy no colwise words are
    drawn between the rowwise ones, so a rowwise-only quantizer's bfloat16 codes follow the rowwise-only walk
    (``quantizer.cpp``: one ``rng_state`` per cast, offset 0 first)."""
    from test_cast_te_nvfp4_sr import _e2m1_rs, _scales_ref, _tuned_kernel_words

    from fp8sim.scaling.nvfp4_te_sr import TEPhiloxGenerator
    from fp8sim.scaling.packing import unpack_fp4

    rng = np.random.default_rng(11)
    xb = torch.from_numpy(rng.standard_normal((64, 96)).astype(np.float32)).to(torch.bfloat16)
    x32 = xb.float().numpy()
    q = NVFP4Quantizer(rowwise=True, columnwise=False, stochastic_rounding=True)
    q.te_rng_generator = TEPhiloxGenerator(seed=5)
    t = q(xb)
    rw, _ = _tuned_kernel_words(64, 96, 5, 0, False)
    want = _e2m1_rs(x32 * _scales_ref(x32, np.float32(np.abs(x32).max()), False), rw)
    assert np.array_equal(unpack_fp4(t._rowwise_data.reshape(64, 48)).numpy(), want)


# --- _quantized_data.py: 1x128 columnwise record ------------------------------------------------------------------


def test_blockwise_1d_columnwise_record_holds_the_columnwise_copys_values() -> None:
    """TE ``float8_blockwise_tensor.py:202-207`` (1x128 columnwise scales ``(ceil(M/128), K)``, block of 128 rows
    of one column) and ``get_columnwise_shape`` (data ``(K, M)``): element ``(r, c)`` of the columnwise copy is
    ``e4m3(columnwise_data[c, r]) * columnwise_scale_inv[r // 128, c]``, decoded here with ml_dtypes."""
    m, k = 256, 64
    t = Float8BlockQuantizer(E4M3, rowwise=False, columnwise=True, block_scaling_dim=1)(_x((m, k)))
    codes = t._columnwise_data.reshape(k, m).numpy().view(ml_dtypes.float8_e4m3fn).astype(np.float64).T
    scales = t._columnwise_scale_inv[: m // 128, :k].double().numpy()
    want = (codes * np.repeat(scales, 128, axis=0)).astype(np.float32)
    got = t.quantized_data(columnwise=True).dequantize()
    assert got.shape == (m, k) and np.array_equal(got, want)


# --- utils.py: quantize_master_weights ----------------------------------------------------------------------------


def test_master_weight_without_start_offset_is_tes_error() -> None:
    """TE ``utils.py:116`` (also ``:410``, ``:985``)."""
    w = _current()(torch.zeros(16, 16))
    with pytest.raises(ValueError, match=r"^start_offset must not be None when master_weight is provided$"):
        quantize_master_weights([w], [torch.zeros(16)], [None], group=None)


def test_mxfp8_weight_after_one_with_no_shard_still_gets_its_scales() -> None:
    """TE ``_cast_master_weights_to_fp8_mxfp8_scaling`` (``utils.py``, ``common/recipe/mxfp8_scaling.cu:48-50``):
    a weight whose master shard is None on this rank only skips its own amax; the next weight's block of
    amax 2 gets ``float_to_e8m0(2 * fl32(1/448))`` rounded up: 127 + ceil(log2(2/448)) = 120, and 2 casts to
    ``2 * 2^7 = 256`` (its E4M3 code from ml_dtypes)."""
    a = MXFP8Quantizer(E4M3)(torch.zeros(64, 64, dtype=torch.bfloat16))
    b = MXFP8Quantizer(E4M3)(torch.zeros(64, 64, dtype=torch.bfloat16))
    master = torch.zeros(64 * 64)
    master[0] = 2.0
    quantize_master_weights([a, b], [None, master], [None, 0], group=None)
    assert b._rowwise_scale_inv[0, 0].item() == 120 and b._columnwise_scale_inv[0, 0].item() == 120
    assert b._rowwise_data.reshape(-1)[0].item() == _e4m3_code(256.0)
    assert b._columnwise_data.reshape(-1)[0].item() == _e4m3_code(256.0)


def test_nvfp4_2d_master_weight_with_a_zero_tile_casts_without_warnings() -> None:
    """TE's NVFP4 2D partial cast (``utils.py:854-900``, a CUDA kernel) has no floating-point warnings: an all-zero
    16x16 tile (E4M3 scale 0) casts to zero codes; fp8sim computes its ``1 / (0 * s_dec)`` under numpy's
    errstate and must not warn either."""
    w = NVFP4Quantizer(with_2d_quantization=True, columnwise=False)(torch.zeros(32, 32))
    master = torch.zeros(32 * 32)
    master[0] = 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quantize_master_weights([w], [master], [0], group=None)
    assert w._rowwise_data.reshape(32, 16)[16:, :].eq(0).all()


# --- FSDP2: Float8Tensor, Float8BlockwiseQTensor and NVFP4Tensor shards -------------------------------------------


def test_float8_gather_rebuilds_the_parameter_in_param_dtype() -> None:
    """TE ``float8_tensor.py:1015-1034``: the first gather builds ``Float8Tensor(..., dtype=param_dtype)``."""
    xs = _x((64, 32), seed=15).to(torch.bfloat16)
    full = _current()(xs)
    shard = _current()(xs[:32])
    meta = (full._scale_inv, True, False, E4M3)
    out, _ = shard.fsdp_post_all_gather((full._data.clone(),), meta, torch.bfloat16)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out.dequantize(), full.dequantize())


def test_same_shape_as_strided_of_a_transpose_only_float8_tensor_keeps_the_transpose() -> None:
    """TE ``float8_tensor.py:833-869``: a Float8Tensor with no rowwise data but a valid transpose, viewed with
    its own size and stride (offset 0: rows 0..M of the transpose), stays a Float8Tensor with ``data=None`` and
    that transpose; its values are the tensor's."""
    q = Float8CurrentScalingQuantizer(E4M3, "cpu", rowwise=False, columnwise=True)
    t = q(_x((16, 32), seed=3))
    assert t._data is None and t._transpose is not None
    view = torch.as_strided(t, t.shape, t.stride())
    assert type(view) is type(t) and view._data is None
    assert torch.equal(view._transpose, t._transpose)
    assert torch.equal(view.dequantize(), t.dequantize())


def test_blockwise_fsdp_gather_of_a_one_tile_wide_weight() -> None:
    """TE ``float8_blockwise_tensor_storage.py:557-605`` (``fsdp_extract_buffers``: the rowwise scales cut to the
    weight's ``ceil(N/128)`` tile columns, here 1 of the 4 padded ones) and ``:626-640``: two 128-row shards of a
    (256, 128) weight gather into the weight's values."""
    q = Float8BlockQuantizer(E4M3, rowwise=True, columnwise=False, block_scaling_dim=2)
    x = _x((256, 128), seed=8)
    shards = [q(x[:128]), q(x[128:])]
    parts = [s.fsdp_extract_buffers() for s in shards]
    assert all(tuple(p[0][1].shape) == (1, 1) for p in parts)
    gathered = tuple(torch.cat([p[0][i] for p in parts]) for i in range(2))
    full = q(torch.zeros(256, 128))
    full.fsdp_assign_gathered(gathered, parts[0][1])
    assert torch.equal(full.dequantize(), q(x).dequantize())


def test_nvfp4_fsdp2_new_zeros_has_tes_scale_layouts_and_float32_amaxes() -> None:
    """The padded shard FSDP2 copies into: ``get_scale_shape`` of TE ``nvfp4_tensor.py:291-307`` (rowwise
    ``(roundup(M, 128), roundup(K/16, 4))``, columnwise ``(roundup(K, 128), roundup(M/16, 4))``) and float32
    amaxes (``csrc/quantizer.cpp:2026-2027``, ``bit32_tensor_opts``) whatever torch's default dtype."""
    t = NVFP4Quantizer(with_2d_quantization=True)(_x((64, 256), seed=9))
    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        z = t.new_zeros((32, 256))
    finally:
        torch.set_default_dtype(saved)
    assert tuple(z._rowwise_scale_inv.shape) == (128, 16)
    assert tuple(z._columnwise_scale_inv.shape) == (256, 4)
    assert z._amax_rowwise.dtype == torch.float32 and z._amax_columnwise.dtype == torch.float32


def _meta_float8() -> torch.Tensor:
    from fp8sim.pytorch.tensor.float8_tensor import Float8Tensor

    meta = torch.device("meta")
    return Float8Tensor(
        shape=(16, 32),
        dtype=torch.float32,
        data=torch.zeros(16, 32, dtype=torch.uint8, device=meta),
        fp8_scale_inv=torch.ones(1, device=meta),
        fp8_dtype=E4M3,
        quantizer=_current(),
        device=meta,
    )


def test_float8_new_zeros_stays_on_the_tensors_device() -> None:
    """TE ``float8_tensor.py:787-831``: ``new_zeros`` builds the Float8Tensor with ``device=reference.device``,
    the device of the codes' own ``new_zeros`` (a second device: torch's ``meta``)."""
    assert _meta_float8().new_zeros((8, 32)).device == torch.device("meta")


def test_float8_new_zeros_makes_its_buffers_on_the_codes_device() -> None:
    """Divergence fixed (2026-12-02): TE ``float8_tensor.py:796-818`` makes the zero codes with the codes'
    ``new_zeros`` (same device) and moves the copied ``_scale_inv`` there; fp8sim made the codes on the CPU
    whatever the tensor's device (a CUDA tensor's FSDP2 shard buffer would have been a CPU one)."""
    z = _meta_float8().new_zeros((8, 32))
    assert z._data.device == torch.device("meta") and tuple(z._data.shape) == (8, 32)
    assert z._data.dtype == torch.uint8 and z._scale_inv.device == torch.device("meta")


def test_row_scaled_nvfp4_shard_refusal_says_why() -> None:
    """fp8sim's own refusal (no TE counterpart: TE gathers row-scaled weights, ``nvfp4_tensor.py:634-706``; fp8sim
    refuses them, ``_fsdp2_nvfp4.py``): the message names the reason after the class, as documented there."""
    t = NVFP4Quantizer(columnwise=False, row_scaled_nvfp4=True)(_x((64, 64)))
    with pytest.raises(
        NotImplementedError,
        match=r"^NVFP4Tensor under FSDP2: row-scaled NVFP4 weights \(one amax per row\) are not gathered; TE would",
    ):
        t.new_zeros((32, 64))
