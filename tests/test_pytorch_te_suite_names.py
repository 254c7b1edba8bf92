"""TE names that TE's own tests/pytorch suite imports at module level (the acceptance run of issue 13).

References are written here from TE's source at commit d0067d0 (transformer_engine/pytorch/...).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import warnings

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

import fp8sim.pytorch as te  # noqa: E402
from fp8sim.pytorch import quantization, utils  # noqa: E402
from fp8sim.pytorch.module import base  # noqa: E402
from fp8sim.recipe import DelayedScaling  # noqa: E402


def test_scaled_init_method_normal_matches_te_std() -> None:
    """utils.py:261: N(0, sigma / sqrt(2 * num_layers)) drawn by torch.nn.init.normal_."""
    torch.manual_seed(3)
    got = utils.scaled_init_method_normal(0.02, 6)(torch.empty(64, 32))
    torch.manual_seed(3)
    want = torch.nn.init.normal_(torch.empty(64, 32), mean=0.0, std=0.02 / math.sqrt(12.0))
    assert torch.equal(got, want)


def test_attention_mask_func_fills_in_place() -> None:
    """utils.py:219: masked_fill_(mask, -10000.0) on the scores, returned."""
    scores = torch.arange(6.0).reshape(2, 3)
    mask = torch.tensor([[True, False, False], [False, False, True]])
    out = utils.attention_mask_func(scores, mask)
    assert out is scores
    assert scores.tolist() == [[-10000.0, 1.0, 2.0], [3.0, 4.0, -10000.0]]


def test_get_dummy_wgrad_is_cached_per_shape_and_dtype() -> None:
    """module/base.py:134: one buffer per (shape, dtype), detached, zeroed on request."""
    a = base.get_dummy_wgrad([3, 4], torch.float32, zero=True)
    b = base.get_dummy_wgrad([3, 4], torch.float32)
    assert a.data_ptr() == b.data_ptr() and not b.requires_grad
    assert torch.equal(a, torch.zeros(3, 4))
    assert base.get_dummy_wgrad([3, 4], torch.bfloat16).dtype == torch.bfloat16


def test_quantization_reexports_te_names() -> None:
    """quantization.py:44-46 and :281; __init__.py:54 and :99 (QuantizerRole, IdentityQuantizer)."""
    from fp8sim.pytorch.constants import get_fp8_torch_dtype
    from fp8sim.pytorch.tensor import DelayedScalingRequest, IdentityQuantizer, QuantizerRole

    assert quantization.get_fp8_torch_dtype is get_fp8_torch_dtype
    assert quantization.QuantizerRole is QuantizerRole is te.QuantizerRole
    assert quantization.DelayedScalingRequest is DelayedScalingRequest
    assert te.IdentityQuantizer is IdentityQuantizer
    with pytest.raises(AttributeError):
        quantization.NoSuchName  # noqa: B018


def _linear_and_input() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return te.Linear(32, 16, params_dtype=torch.float32), torch.randn(16, 32, requires_grad=True)


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_checkpoint_equals_plain_forward_and_backward(use_reentrant: bool) -> None:
    """distributed.py:660: TE replays the forward with its FP8 state, so results equal the plain call."""
    results = []
    for ckpt in (False, True):
        layer, x = _linear_and_input()
        with te.autocast(enabled=True, recipe=DelayedScaling()):
            y = te.checkpoint(layer, x, use_reentrant=use_reentrant) if ckpt else layer(x)
        y.sum().backward()
        results.append((y.detach(), x.grad, layer.weight.grad))
    for got, want in zip(results[1], results[0], strict=True):
        assert torch.equal(got, want)


def test_checkpoint_plain_module_uses_torch_checkpoint_and_legacy_args() -> None:
    """distributed.py:709 (positional legacy form warns) and :732 (no TE module: torch's checkpoint)."""
    lin = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        y = te.checkpoint(lin, False, lambda: None, None, x)
    assert any(issubclass(w.category, DeprecationWarning) for w in rec)
    assert y.grad_fn is not None and "Checkpoint" in type(y.grad_fn).__name__
    assert torch.equal(y, lin(x))
    # TE's legacy test needs a callable second argument: (False, None, None, x) are tensors to the function
    with pytest.raises(TypeError):
        te.checkpoint(lin, False, None, None, x)


def test_checkpoint_distribute_saved_activations_needs_process_group() -> None:
    """distributed.py:761: reentrant distribute_saved_activations without torch.distributed raises."""
    layer, x = _linear_and_input()
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
        te.checkpoint(layer, x, distribute_saved_activations=True)


@pytest.mark.parametrize("name", ["Linear", "LayerNormLinear", "LayerNormMLP"])
def test_return_bias_without_bias_returns_none(name: str) -> None:
    """module/linear.py:2150 (no bias: bias_tensor None) and :2079 (return it through cast_if_needed: None),
    as TE's test_numerics.py test_linear_accuracy(bias=False, return_bias=True) runs it."""
    torch.manual_seed(0)
    mod = getattr(te, name)(16, 32, bias=False, return_bias=True, params_dtype=torch.float32)
    out, bias = mod(torch.randn(4, 16))
    assert bias is None and out.shape == (4, 32 if name != "LayerNormMLP" else 16)


def test_rmsnorm_strided_input_equals_contiguous() -> None:
    """TE's norm kernels read a contiguous input (tests/pytorch/test_numerics.py:2381 test_noncontiguous
    asserts the transposed view's output and gradients equal the contiguous copy's)."""
    torch.manual_seed(0)
    base_t = torch.randn(128, 256, requires_grad=True)
    contig = base_t.detach().T.contiguous().requires_grad_()
    results = []
    for x in (base_t.T, contig):
        norm = te.RMSNorm(128)
        y = norm(x)
        y.sum().backward()
        results.append((y.detach(), norm.weight.grad))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
    assert torch.equal(base_t.grad.T, contig.grad)


@pytest.mark.parametrize("recipe_name", ["DelayedScaling", "Float8CurrentScaling"])
def test_fp8_primary_weights_built_without_grad_have_no_transpose(recipe_name: str) -> None:
    """module/base.py:1848: the weight quantizer's column-wise usage is torch.is_grad_enabled() at init, so
    a model built under no_grad for inference keeps no FP8 transpose, also after an inference forward."""
    import fp8sim.recipe as rec

    recipe = getattr(rec, recipe_name)()
    with torch.no_grad(), te.quantized_model_init(enabled=True, recipe=recipe):
        lin = te.Linear(32, 32)
    assert lin.weight._data is not None and lin.weight._transpose is None and lin.weight._transpose_invalid
    with torch.inference_mode(), te.autocast(enabled=True, recipe=recipe):
        lin(torch.zeros(32, 32))
    assert lin.weight._transpose is None and lin.weight._transpose_invalid


def test_tensor_storage_and_utils_names_resolve_under_transformer_engine() -> None:
    """TE paths (d0067d0): ``pytorch/__init__.py`` lines 80 and 91-94 (``QuantizedTensorStorage`` and the four
    ``*TensorStorage`` classes at top level), ``tensor/storage/*_tensor_storage.py``, ``tensor/utils.py``
    (``replace_raw_data``, ``quantize_master_weights``, ``cast_master_weights_to_fp8``), ``quantized_tensor.py``."""
    import importlib

    from fp8sim.pytorch import tensor as fp8_tensor
    from fp8sim.run import shim

    if not shim.is_installed() and importlib.util.find_spec("transformer_engine") is not None:
        pytest.skip("a real TransformerEngine is installed")
    shim.install(quiet=True)
    try:
        tep = importlib.import_module("transformer_engine.pytorch")
        utils_mod = importlib.import_module("transformer_engine.pytorch.tensor.utils")
        qt = importlib.import_module("transformer_engine.pytorch.quantized_tensor")
        assert qt.QuantizedTensorStorage is fp8_tensor.QuantizedTensorStorage is tep.QuantizedTensorStorage
        for f, cls in (
            ("float8_tensor_storage", "Float8TensorStorage"),
            ("mxfp8_tensor_storage", "MXFP8TensorStorage"),
            ("float8_blockwise_tensor_storage", "Float8BlockwiseQTensorStorage"),
            ("nvfp4_tensor_storage", "NVFP4TensorStorage"),
            ("identity_tensor_storage", "IdentityTensorStorage"),
        ):
            mod = importlib.import_module(f"transformer_engine.pytorch.tensor.storage.{f}")
            assert getattr(mod, cls) is getattr(fp8_tensor, cls) is getattr(tep, cls)
        storage = importlib.import_module("transformer_engine.pytorch.tensor.storage")
        assert storage.Float8TensorStorage is fp8_tensor.Float8TensorStorage
        for name in ("replace_raw_data", "quantize_master_weights", "cast_master_weights_to_fp8"):
            assert getattr(utils_mod, name) is getattr(fp8_tensor.utils, name)
    finally:
        shim.uninstall()


def test_update_weight_quantizers_hands_each_fp8_weight_its_slot_quantizer() -> None:
    """module/base.py:1252-1263: ``_update_weight_quantizers`` calls ``weight.update_quantizer(q)`` with
    ``_get_weight_quantizers()`` for every quantized weight (TE calls it after the delayed-scaling state
    is rebuilt for a new ``amax_history_len``, base.py:1080-1083)."""
    from fp8sim.recipe import MXFP8BlockScaling

    with te.quantized_model_init(recipe=MXFP8BlockScaling()):
        mlp = te.LayerNormMLP(32, 32)
    qs = mlp._get_weight_quantizers()
    assert len(qs) == 2 and all(isinstance(q, te.MXFP8Quantizer) for q in qs)
    with pytest.warns(UserWarning, match="Quantizer is being updated"):
        mlp._update_weight_quantizers()
    assert mlp._get_weight_tensors()[0] is mlp.fc1_weight
    assert isinstance(mlp.fc1_weight._get_quantizer(), te.MXFP8Quantizer) and mlp.fc1_weight._quantizer is not None
    plain = te.Linear(32, 32)
    assert plain._get_weight_quantizers() == [None]
    plain._update_weight_quantizers()  # high-precision weights: nothing to update


def test_fp8_global_state_manager_keys_and_recompute_stash() -> None:
    """quantization.py:462-499 (keys), :423-434 (skip tensor), :785-845 (recompute stash FIFO) and the
    fp8_meta access of tests/pytorch/test_recipe.py:100."""
    m = quantization.FP8GlobalStateManager
    assert (m.get_meta_tensor_key(), m.get_meta_tensor_key(forward=False)) == ("scaling_fwd", "scaling_bwd")
    assert (m.get_fwd_bwd_key(True), m.get_fwd_bwd_key(False)) == ("forward", "backward")
    assert m.get_buffer_info() == "buffer_index_and_autocast_key"
    recipe = DelayedScaling()
    key = m.get_key_in_buffer(False, recipe, None)
    assert key == f"backward_recipe={recipe!s},group=None"
    assert m.split_key_in_buffer(key) == (False, f"recipe={recipe!s},group=None")
    m.reset()
    m.set_skip_fp8_weight_update_tensor(True)
    assert m.get_skip_fp8_weight_update_tensor().tolist() == [1.0]
    lin = te.Linear(16, 16, params_dtype=torch.float32)
    with te.autocast(recipe=recipe):
        lin(torch.randn(16, 16)).sum().backward()
    meta = lin.fp8_meta
    hist, scale = meta[m.get_meta_tensor_key()].amax_history, meta[m.get_meta_tensor_key()].scale
    stashed = (hist.clone(), scale.clone())
    m.copy_forward_fp8_meta_tensors_for_recompute(meta)
    assert meta["global_fp8_buffer_pos_fwd_recompute"] == 0
    hist.fill_(7.0)
    scale.fill_(3.0)
    updated = (hist.clone(), scale.clone())
    m.get_old_fp8_meta_tensors_for_recompute(meta)  # the stash is loaded in place
    assert torch.equal(hist, stashed[0]) and torch.equal(scale, stashed[1])
    m.restore_fp8_meta_tensors(meta)
    assert torch.equal(hist, updated[0]) and torch.equal(scale, updated[1])
    with pytest.raises(NotImplementedError, match="add_fp8_tensors_to_global_buffer"):
        m.add_fp8_tensors_to_global_buffer(meta)
    m.reset()


def test_extra_state_policy_helpers() -> None:
    """_extra_state.py:33-110: the recipe policy map, the opt-in variable and the pickle gate."""
    import pickle

    from fp8sim.pytorch import _extra_state_te as xs
    from fp8sim.recipe import Float8CurrentScaling

    assert xs.recipe_extra_state_policy(DelayedScaling()) is xs.CheckpointExtraStatePolicy.STATEFUL_FP8_DELAYED_SCALING
    assert xs.is_stateless_recipe(Float8CurrentScaling()) and not xs.is_stateless_recipe(DelayedScaling())
    assert xs.recipe_extra_state_policy(object()) is None
    assert xs.should_load_extra_state_pickle(b"", "Linear") is False
    blob = pickle.dumps({"scale_fwd": 1})
    with pytest.raises(RuntimeError, match="Refusing to load pickled Transformer Engine extra state for Linear"):
        xs.should_load_extra_state_pickle(blob, "Linear")


def _qfactory(role: object) -> None:  # a module-level factory, so a CustomRecipe pickles
    del role


_STATELESS_NAMES = ["Float8CurrentScaling", "MXFP8BlockScaling", "Float8BlockScaling", "NVFP4BlockScaling"]


@pytest.mark.parametrize("name", _STATELESS_NAMES)
def test_stateless_recipe_pickled_by_plain_pickle_is_ignored(name: str) -> None:
    """_extra_state.py:54-61 and 121-183: a stateless recipe's payload is IGNORE whatever pickled it; under
    fp8sim the recipe's class path is fp8sim.recipe (TE's classes there), which was refused as unknown."""
    import pickle

    from fp8sim import recipe
    from fp8sim.pytorch import _extra_state_te as xs

    payload = pickle.dumps({"recipe": getattr(recipe, name)(), "extra_fp8_variables": {}})
    assert xs.should_load_extra_state_pickle(payload, "test") is False
    custom = pickle.dumps({"recipe": recipe.CustomRecipe(qfactory=_qfactory), "extra_fp8_variables": {}})
    assert xs.should_load_extra_state_pickle(custom, "test") is False  # DYNAMIC without delayed-scaling keys
    stateful = pickle.dumps({"recipe": DelayedScaling(), "scale_fwd": torch.ones(1), "extra_fp8_variables": {}})
    with pytest.raises(RuntimeError, match=xs.UNSAFE_PICKLE_EXTRA_STATE_ENV):
        xs.should_load_extra_state_pickle(stateful, "test")
    # TE's map covers every recipe class, keyed by TE's module path
    assert ("transformer_engine.common.recipe", name) in xs._RECIPE_POLICIES


@pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is not None, reason="a real TE is installed")
def test_fp8sim_run_resolves_issue_13_names() -> None:
    """`fp8sim run`: TE's recompute, GEMM, state-manager and extra-state names resolve; te.ops is named
    in a NotImplementedError (fp8sim does not emulate the fusible-operations API)."""
    import fp8sim.pytorch as fp8_te
    from fp8sim.pytorch import _extra_state_te, distributed
    from fp8sim.pytorch.cpp_extensions import general_gemm
    from fp8sim.run import shim

    shim.install(quiet=True)
    try:
        from transformer_engine.pytorch import checkpoint
        from transformer_engine.pytorch._extra_state import should_load_extra_state_pickle
        from transformer_engine.pytorch.cpp_extensions import general_gemm as te_gemm
        from transformer_engine.pytorch.distributed import (
            activation_recompute_forward,
            in_fp8_activation_recompute_phase,
            is_fp8_activation_recompute_enabled,
        )
        from transformer_engine.pytorch.quantization import FP8GlobalStateManager

        assert checkpoint is fp8_te.checkpoint and te_gemm is general_gemm
        assert should_load_extra_state_pickle is _extra_state_te.should_load_extra_state_pickle
        assert activation_recompute_forward is distributed.activation_recompute_forward
        assert in_fp8_activation_recompute_phase is distributed.in_fp8_activation_recompute_phase
        assert is_fp8_activation_recompute_enabled is distributed.is_fp8_activation_recompute_enabled
        assert FP8GlobalStateManager.get_meta_tensor_key() == "scaling_fwd"
        te_mod = importlib.import_module("transformer_engine.pytorch")
        import fp8sim.pytorch.ops as fp8sim_ops  # issue 27: te.ops is emulated (it raised NotImplementedError before)

        assert te_mod.ops is fp8sim_ops
        assert importlib.import_module("transformer_engine.pytorch.ops").Sequential is fp8sim_ops.Sequential
    finally:
        shim.uninstall()
