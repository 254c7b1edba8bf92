"""TE's IdentityQuantizer / IdentityTensor and ``prepare_for_saving`` / ``restore_from_saved``, with
references written from TE's code (NVIDIA/TransformerEngine at d0067d0):

- ``pytorch/tensor/identity_tensor.py``: quantize = ``tensor.detach()`` cast to ``dtype`` when set
  (lines 67-79), ``update_quantized`` copies in place or keeps the old values under ``noop_flag``
  (lines 131-158), view ops alias the held buffer (``_delegate_view_op``);
  ``storage/identity_tensor_storage.py``: ``dequantize`` returns the held buffer itself unless
  another dtype is asked for, usages are both True while data is held;
- ``pytorch/quantized_tensor.py`` lines 285-333 (module-level ``prepare_for_saving`` keeps
  ``torch.Tensor`` objects as they are) and each storage's buffer order
  (``float8_tensor_storage.py``: data, transpose, scale_inv; ``mxfp8_tensor_storage.py``
  lines 158-180: rowwise data, columnwise data, rowwise scale_inv, columnwise scale_inv).
"""

from __future__ import annotations

import io

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

from fp8sim.pytorch.constants import DType  # noqa: E402
from fp8sim.pytorch.tensor import (  # noqa: E402
    Float8Quantizer,
    IdentityQuantizer,
    IdentityTensor,
    MXFP8Quantizer,
    QuantizerRole,
    custom_recipe_quantizers,
    prepare_for_saving,
    restore_from_saved,
)
from fp8sim.recipe import CustomRecipe  # noqa: E402

torch.set_num_threads(1)


def _rand(shape: tuple, seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def test_identity_quantizer_holds_the_tensor() -> None:
    x = _rand((4, 6), 0)
    t = IdentityQuantizer()(x)
    assert isinstance(t, IdentityTensor) and t.dtype == torch.float32 and t.shape == (4, 6)
    assert t._hp_data.data_ptr() == x.data_ptr() and t.dequantize() is t._hp_data  # no copy
    assert t.get_usages() == {"rowwise": True, "columnwise": True}
    b = IdentityQuantizer(dtype=torch.bfloat16)(x)
    assert b.dtype == torch.bfloat16 and torch.equal(b._hp_data, x.to(torch.bfloat16))
    assert torch.equal(b.dequantize(dtype=torch.float32), x.to(torch.bfloat16).float())
    assert torch.equal(t + 1, x + 1) and torch.equal(t @ t.t(), x @ x.t())


def test_identity_views_alias_the_buffer_and_grad_passes_through() -> None:
    x = _rand((4, 6), 1)
    t = IdentityQuantizer()(x)
    part = t[1:3]
    assert isinstance(part, IdentityTensor) and part._hp_data.data_ptr() == x[1:3].data_ptr()
    assert all(isinstance(p, IdentityTensor) for p in t.split(2))
    assert isinstance(t.view(24), IdentityTensor) and torch.equal(t.view(24).dequantize(), x.view(24))
    c = t.clone()
    assert c._hp_data.data_ptr() != x.data_ptr() and torch.equal(c.dequantize(), x)
    xg = x.clone().requires_grad_()
    (IdentityQuantizer()(xg) * 3).sum().backward()  # TE: dequantize() itself is the detached buffer
    assert torch.equal(xg.grad, torch.full((4, 6), 3.0))


def test_identity_update_quantized_and_noop_flag() -> None:
    x, y = _rand((3, 5), 2), _rand((3, 5), 3)
    q = IdentityQuantizer()
    dst = q(x.clone())
    buf = dst._hp_data
    q.update_quantized(y, dst, noop_flag=torch.ones(1))
    assert torch.equal(dst._hp_data, x)
    q.update_quantized(y, dst, noop_flag=torch.zeros(1))
    assert dst._hp_data is buf and torch.equal(buf, y)
    with pytest.raises(ValueError, match="IdentityQuantizer can only update IdentityTensorStorage, got Float8Tensor"):
        q.update_quantized(y, Float8Quantizer(torch.ones(1), torch.zeros(1), DType.kFloat8E4M3)(y))


def test_identity_serialization_and_custom_recipe_slot() -> None:
    t = IdentityQuantizer(dtype=torch.float16)(_rand((2, 3), 4))
    buf = io.BytesIO()
    torch.save(t, buf)
    back = torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
    assert isinstance(back, IdentityTensor) and back.dtype == torch.float16 and torch.equal(back._hp_data, t._hp_data)
    recipe = CustomRecipe(qfactory=lambda role: IdentityQuantizer() if role.tensor_type == "weight" else None)
    out = custom_recipe_quantizers(recipe, [QuantizerRole("linear", "weight")])
    assert isinstance(out.quantizers[0], IdentityQuantizer) and out.scaler is None


def test_prepare_for_saving_orders_and_restores_buffers() -> None:
    x = _rand((32, 64), 5)
    f8 = Float8Quantizer(torch.full([1], 2.0), torch.zeros(1), DType.kFloat8E4M3)(x)
    want = [f8._data, f8._transpose, f8._scale_inv]
    saved, obj = f8.prepare_for_saving()
    assert obj is f8 and all(a is b for a, b in zip(saved, want, strict=True))
    assert f8._data is None and f8._transpose is None and f8._scale_inv is None
    assert f8.restore_from_saved([*saved, "rest"]) == ["rest"] and f8._data is want[0]
    mx = MXFP8Quantizer(DType.kFloat8E4M3)(x)
    order = [mx._rowwise_data, mx._columnwise_data, mx._rowwise_scale_inv, mx._columnwise_scale_inv]
    saved, _ = mx.prepare_for_saving()
    assert all(a is b for a, b in zip(saved, order, strict=True))
    mx.restore_from_saved(saved)
    # module level: torch.Tensor objects (quantized tensors included) and None are saved as they are
    tensors, objects = prepare_for_saving(x, None, f8)
    assert tensors[0] is x and tensors[1] is None and tensors[2] is f8 and objects == [None, None, None]
    assert restore_from_saved(objects, tensors) == tensors
