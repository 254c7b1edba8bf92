"""fp8sim.pytorch: the TE module API real code passes (issue 13 "API to add", issue 18 item 11).

References are TE's code at NVIDIA/TransformerEngine d0067d0 (files and functions cited per test).
"""

from __future__ import annotations

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

import torch.nn.functional as F  # noqa: E402

import fp8sim.pytorch as te  # noqa: E402
from fp8sim.recipe import DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling  # noqa: E402

torch.set_num_threads(1)


def test_return_bias_returns_the_unadded_bias_in_the_activation_dtype() -> None:
    """TE linear.py Linear.forward: ``return out, cast_if_needed(bias_tensor, self.activation_dtype)``
    with ``apply_bias = bias and not return_bias``."""
    torch.manual_seed(1)
    m = te.Linear(16, 8, return_bias=True)
    with torch.no_grad():
        m.bias.normal_()
    x = torch.randn(4, 16)
    out, b = m(x)
    assert torch.equal(out, F.linear(x, m.weight)) and torch.equal(b, m.bias)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, b = m(x)
    assert b.dtype == torch.bfloat16
    mlp = te.LayerNormMLP(16, 32, return_bias=True, return_layernorm_output=True)
    out, b, ln = mlp(x)  # TE layernorm_mlp.py forward: (out, fc2_bias, ln_out)
    assert b is not None and torch.equal(b, mlp.fc2_bias) and ln.shape == x.shape


def test_layernorm_linear_return_layernorm_output_returns_the_norm_output_last() -> None:
    """TE layernorm_linear.py LayerNormLinear.forward: with ``return_layernorm_output`` it returns
    ``(out, ln_out)``, or ``(out, bias, ln_out)`` with ``return_bias``; without it, ``out`` alone.  Outside
    autocast ``ln_out`` is torch's ``layer_norm`` of the input and ``out`` its ``F.linear``."""
    torch.manual_seed(5)
    x = torch.randn(8, 32)
    m = te.LayerNormLinear(32, 16, return_layernorm_output=True)
    ln = F.layer_norm(x, (32,), m.layer_norm_weight, m.layer_norm_bias, 1e-5)
    out, ln_out = m(x)
    assert torch.equal(ln_out, ln) and torch.equal(out, F.linear(ln, m.weight, m.bias))
    mb = te.LayerNormLinear(32, 16, return_bias=True, return_layernorm_output=True)
    ln = F.layer_norm(x, (32,), mb.layer_norm_weight, mb.layer_norm_bias, 1e-5)
    out, b, ln_out = mb(x)
    assert torch.equal(ln_out, ln) and torch.equal(b, mb.bias) and torch.equal(out, F.linear(ln, mb.weight))
    assert isinstance(te.LayerNormLinear(32, 16)(x), torch.Tensor)


def test_parameters_split_names_and_sizes_as_te() -> None:
    """TE linear.py Linear.__init__: dict splits name ``{name}_weight``/``{name}_bias`` with the given
    sizes; a tuple splits evenly; the sizes must add up to out_features."""
    torch.manual_seed(2)
    m = te.Linear(16, 48, parameters_split={"query_": 16, "key": 8, "value": 24})
    assert [n for n, _ in m.named_parameters()] == [
        "query_weight",
        "key_weight",
        "value_weight",
        "query_bias",
        "key_bias",
        "value_bias",
    ]
    assert m.key_weight.shape == (8, 16)
    x = torch.randn(8, 16)
    w = torch.cat([m.query_weight, m.key_weight, m.value_weight])
    b = torch.cat([m.query_bias, m.key_bias, m.value_bias])
    assert torch.equal(m(x), F.linear(x, w, b))
    assert [n for n, _ in te.Linear(16, 32, parameters_split=("a", "b")).named_parameters()][:2] == [
        "a_weight",
        "b_weight",
    ]
    with pytest.raises(ValueError, match="Trying to split weight buffer"):
        te.Linear(16, 32, parameters_split={"a": 8, "b": 8})


def test_init_method_output_layer_init_method_and_reset_parameters() -> None:
    """TE base.py reset_parameters: each parameter's ``init_fn``; biases ``init_method_constant(0.0)``;
    LayerNormMLP's fc2 weight uses ``output_layer_init_method``."""
    m = te.LayerNormMLP(
        16, 32, init_method=lambda t: torch.nn.init.constant_(t, 0.5), output_layer_init_method=torch.nn.init.ones_
    )
    assert bool((m.fc1_weight == 0.5).all()) and bool((m.fc2_weight == 1).all()) and bool((m.fc1_bias == 0).all())
    with torch.no_grad():
        m.fc1_weight.zero_()
        m.layer_norm_weight.zero_()
    m.reset_parameters()
    assert bool((m.fc1_weight == 0.5).all()) and bool((m.layer_norm_weight == 1).all())
    # TE utils.py:252: init_(t) is torch.nn.init.normal_(t, mean=0.0, std=sigma), in place, returning t
    t, ref = torch.empty(64, 64), torch.empty(64, 64)
    torch.manual_seed(11)
    out = te.utils.init_method_normal(0.1)(t)
    torch.manual_seed(11)
    torch.nn.init.normal_(ref, mean=0.0, std=0.1)
    assert out is t and torch.equal(t, ref)


@pytest.mark.parametrize("first_microbatch", [None, True, False])
def test_fuse_wgrad_accumulation_adds_into_main_grad(first_microbatch: bool | None) -> None:
    """TE linear.py backward: wgrad goes into ``weight.main_grad`` (accumulate unless
    ``is_first_microbatch`` is True); no ``weight.grad`` is produced."""
    torch.manual_seed(3)
    m = te.Linear(16, 16, fuse_wgrad_accumulation=True)
    m.weight.main_grad = torch.ones(16, 16)
    x, g = torch.randn(16, 16), torch.randn(16, 16)
    with te.autocast(recipe=Float8CurrentScaling()):
        y = m(x, is_first_microbatch=first_microbatch)
    y.backward(g)
    ref = te.Linear(16, 16)
    with torch.no_grad():
        ref.weight.copy_(m.weight)
    with te.autocast(recipe=Float8CurrentScaling()):
        ref(x).backward(g)
    want = ref.weight.grad if first_microbatch else 1 + ref.weight.grad
    assert m.weight.grad is None and torch.equal(m.weight.main_grad, want)


@pytest.mark.parametrize("fp8", [False, True])
def test_fuse_wgrad_accumulation_with_a_frozen_weight_computes_no_wgrad(fp8: bool) -> None:
    """TE linear.py: ``requires_wgrad`` is the weight's ``requires_grad`` (lines 712, 2008); a frozen weight
    gets no wgrad and its ``main_grad`` is never read (TE's test_sanity_gradient_accumulation_fusion freezes
    the weights and sets no main_grad); the input gradient is the same as without the fusion."""
    torch.manual_seed(3)
    m = te.Linear(16, 16, fuse_wgrad_accumulation=True)
    ref = te.Linear(16, 16)
    with torch.no_grad():
        ref.weight.copy_(m.weight)
        ref.bias.copy_(m.bias)
    m.weight.requires_grad_(False)
    ref.weight.requires_grad_(False)
    x, g = torch.randn(16, 16), torch.randn(16, 16)
    xs = [x.clone().requires_grad_(True) for _ in range(2)]
    with te.autocast(enabled=fp8, recipe=Float8CurrentScaling()):
        ys = [m(xs[0]), ref(xs[1])]
    for y in ys:
        y.backward(g)
    assert m.weight.grad is None and not hasattr(m.weight, "main_grad")
    assert torch.equal(xs[0].grad, xs[1].grad)


def test_delay_wgrad_compute_defers_wgrad_to_backward_dw() -> None:
    """TE base.py backward_dw: the stored wgrad GEMM runs and sets ``weight.grad``."""
    torch.manual_seed(4)
    for recipe in (None, Float8CurrentScaling()):
        m, ref = te.Linear(16, 16, delay_wgrad_compute=True), te.Linear(16, 16)
        with torch.no_grad():
            ref.weight.copy_(m.weight)
        x, g = torch.randn(16, 16), torch.randn(16, 16)
        for mod in (m, ref):
            with te.autocast(enabled=recipe is not None, recipe=recipe):
                y = mod(x)
            y.backward(g)
        assert m.need_backward_dw() and m.weight.grad is None and torch.equal(m.bias.grad, ref.bias.grad)
        m.backward_dw()
        assert torch.equal(m.weight.grad, ref.weight.grad)


def test_parallel_arguments_take_single_process_semantics() -> None:
    m = te.Linear(16, 16, tp_size=1, parallel_mode="column", sequence_parallel=True, name="qkv")
    assert m.name == "qkv" and m.parallel_mode == "column"
    with pytest.raises(RuntimeError, match="Tensor parallel group not initialized"):  # TE: at forward
        te.Linear(16, 16, tp_size=2, parallel_mode="column")(torch.randn(16, 16))
    with pytest.raises(ValueError, match="parallel_mode 'diag'"):
        te.Linear(16, 16, parallel_mode="diag")


def test_outside_autocast_the_input_dtype_must_match_the_parameters() -> None:
    """TE base.py set_activation_dtype: TypeError naming both dtypes."""
    with pytest.raises(TypeError, match="Data types for parameters must match when outside of autocasted region"):
        te.Linear(16, 16)(torch.randn(4, 16, dtype=torch.bfloat16))


def test_norms_under_torch_autocast_return_the_autocast_dtype() -> None:
    """TE ops/basic/layer_norm.py: ``dtype = maybe_autocast_dtype(default_dtype=weight.dtype)``."""
    x = torch.randn(4, 16)
    for cls in (te.LayerNorm, te.RMSNorm):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert cls(16)(x).dtype == torch.bfloat16
        assert cls(16, params_dtype=torch.bfloat16)(x).dtype == torch.bfloat16


def test_capability_probes_answer_for_the_emulated_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """TE quantization.py _compute_*_support and utils.py is_non_tn_fp8_gemm_supported."""
    monkeypatch.setenv("FP8SIM_TE_DEVICE", "hopper")
    assert te.get_device_compute_capability() == (9, 0) and te.is_fp8_available()
    assert te.is_mxfp8_available(return_reason=True) == (
        False,
        "Device compute capability 10.0 or higher required for MXFP8 execution.",
    )
    assert te.is_fp8_block_scaling_available() and not te.is_nvfp4_available()
    assert not te.utils.is_non_tn_fp8_gemm_supported() and te.is_bf16_available(return_reason=True) == (True, "")
    assert isinstance(te.get_default_recipe(), DelayedScaling)
    monkeypatch.setenv("FP8SIM_TE_DEVICE", "blackwell")
    assert te.is_mxfp8_available() and te.is_nvfp4_available() and te.utils.is_non_tn_fp8_gemm_supported()
    assert isinstance(te.get_default_recipe(), MXFP8BlockScaling)  # TE: MXFP8 where supported
    monkeypatch.setenv("FP8SIM_TE_DEVICE", "ada")
    assert te.is_fp8_available() and not te.is_fp8_block_scaling_available()
    monkeypatch.setenv("FP8SIM_TE_DEVICE", "volta")
    with pytest.raises(ValueError, match="known: ada, hopper, blackwell"):
        te.get_device_compute_capability()


def test_fp8_global_state_manager_reports_and_resets_the_state() -> None:
    mgr = te.FP8GlobalStateManager
    r = Float8CurrentScaling()
    assert not mgr.is_fp8_enabled()
    with te.autocast(recipe=r, calibrating=True):
        assert mgr.is_fp8_enabled() and mgr.is_fp8_calibration() and mgr.get_fp8_recipe() is r
        assert mgr.is_first_fp8_module()
    with te.quantized_model_init(recipe=r):
        assert mgr.with_fp8_parameters() and mgr.get_fp8_recipe() is r
    assert not mgr.with_fp8_parameters()
    with te.autocast():
        mgr.reset()
        assert not mgr.is_fp8_enabled()
    mgr.reset()


def test_fp8_meta_views_the_delayed_scaling_state_in_tes_layout() -> None:
    m = te.Linear(16, 16)
    assert "scaling_fwd" not in m.fp8_meta
    with te.autocast(recipe=DelayedScaling(amax_history_len=4)):
        m(torch.randn(16, 16))
    meta = m.fp8_meta
    assert meta["num_gemms"] == 1 and meta["scaling_fwd"].scale.shape == (3,)
    assert meta["scaling_fwd"].amax_history.shape == (4, 3) and meta["scaling_bwd"].scale.shape == (2,)
    assert torch.equal(meta["scaling_fwd"].scale, torch.from_numpy(m.fp8_gemms["gemm"].fwd.scale))
    mlp = te.LayerNormMLP(16, 16)
    with te.autocast(recipe=DelayedScaling()):
        mlp(torch.randn(16, 16))
    assert mlp.fp8_meta["scaling_fwd"].scale.shape == (6,) and mlp.fp8_meta["num_gemms"] == 2


# -- issue 18 item 11 --------------------------------------------------------------------------------
def test_loading_another_module_types_state_dict_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE", "1")
    mlp = te.LayerNormMLP(16, 16)
    with te.autocast(recipe=DelayedScaling()):
        mlp(torch.randn(16, 16))
    with pytest.raises(RuntimeError, match="another module type"):
        te.Linear(16, 16).load_state_dict(mlp.state_dict(), strict=True)
    old_format = {"fc1": {}, "fc2": {}}  # fp8sim's earlier per-GEMM dict
    with pytest.raises(RuntimeError, match="another module type"):
        te.Linear(16, 16).set_extra_state(old_format)
    lin = te.Linear(16, 16)
    sd = lin.state_dict()
    sd["_extra_state"] = {"gemm": {"scale": 1}}
    with pytest.raises(RuntimeError, match="_extra_state of GEMM 'gemm' has keys"):
        lin.load_state_dict(sd)
    sd["_extra_state"] = "garbage"
    with pytest.raises(RuntimeError, match="unreadable _extra_state"):
        lin.load_state_dict(sd)


def test_create_graph_through_an_fp8_gemm_raises_at_once() -> None:
    m = te.Linear(16, 16)
    x = torch.randn(16, 16, requires_grad=True)
    with te.autocast(recipe=Float8CurrentScaling()):
        y = m(x)
    with pytest.raises(RuntimeError, match="create_graph=True"):
        torch.autograd.grad(y.sum(), x, create_graph=True)
    y2 = te.Linear(16, 16)(x)  # outside autocast: plain torch ops, twice differentiable
    (gx,) = torch.autograd.grad(y2.square().sum(), x, create_graph=True)
    assert gx.requires_grad


@pytest.mark.parametrize("recipe", [Float8CurrentScaling(), MXFP8BlockScaling()], ids=["current", "mxfp8"])
def test_torch_compile_runs_modules_eagerly_like_te(recipe) -> None:  # noqa: ANN001
    """TE decorates module forwards with ``jit.no_torch_dynamo``: compiled models graph-break around them."""
    torch.manual_seed(5)
    model = torch.nn.Sequential(te.LayerNormLinear(32, 32), torch.nn.GELU(), te.Linear(32, 32))
    x = torch.randn(32, 32)
    with te.autocast(recipe=recipe):
        want = model(x)
    compiled = torch.compile(model, backend="eager")
    with te.autocast(recipe=recipe):
        got = compiled(x)
    got.sum().backward()
    assert torch.equal(got, want) and model[0].weight.grad is not None


# -- point 10 hooked into the modules -----------------------------------------------------------------
class _TEUnpickler:
    """Reads TE's pickle as TE's ``set_extra_state`` does (``pickle.loads``), resolving TE's recipe
    module path to fp8sim's classes."""

    @staticmethod
    def loads(data: bytes) -> dict:
        import io
        import pickle

        import fp8sim.recipe as rec

        class U(pickle.Unpickler):
            def find_class(self, module: str, name: str):  # noqa: ANN202
                if module == "transformer_engine.common.recipe":
                    return getattr(rec, name)
                return super().find_class(module, name)

        return U(io.BytesIO(data)).load()


def test_extra_state_is_tes_pickled_uint8_tensor_in_one_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """TE base.py get_extra_state: empty uint8 tensor before any FP8 step; then
    ``torch.frombuffer(bytearray(pickle.dumps(state)), dtype=torch.uint8)`` with the recipe, the
    module's fp8_meta tensors (GEMM i: forward slots 3i..3i+2, backward 2i..2i+1) and
    ``extra_fp8_variables``; TE's recipe classes under ``transformer_engine.common.recipe``."""
    m = te.LayerNormMLP(16, 16)
    empty = m.get_extra_state()
    assert empty.dtype == torch.uint8 and empty.numel() == 0
    recipe = DelayedScaling(amax_history_len=2)
    for _ in range(2):
        with te.autocast(recipe=recipe):
            y = m(torch.randn(16, 16))
        y.sum().backward()
    blob = m.get_extra_state()
    assert blob.dtype == torch.uint8 and blob.dim() == 1
    state = _TEUnpickler.loads(blob.numpy().tobytes())
    assert set(state) == {
        "recipe",
        "scale_fwd",
        "amax_history_fwd",
        "scale_bwd",
        "amax_history_bwd",
        "extra_fp8_variables",
    }
    assert b"transformer_engine.common.recipe" in blob.numpy().tobytes()
    fc1, fc2 = m.fp8_gemms["fc1"], m.fp8_gemms["fc2"]
    assert state["scale_fwd"].tolist() == fc1.fwd.scale.tolist() + fc2.fwd.scale.tolist()
    assert (
        state["amax_history_bwd"].shape == (2, 4)
        and state["amax_history_bwd"][:, 2:].tolist() == fc2.bwd.amax_history.tolist()
    )
    # a blob built by hand as TE writes it loads into fp8sim
    import pickle

    hand = {
        "recipe": DelayedScaling(amax_history_len=2),
        "scale_fwd": torch.tensor([2.0, 4.0, 1.0]),
        "amax_history_fwd": torch.tensor([[0.0, 0.0, 0.0], [3.0, 0.5, 0.0]]),
        "scale_bwd": torch.tensor([8.0, 1.0]),
        "amax_history_bwd": torch.tensor([[0.0, 0.0], [7.0, 0.0]]),
        "extra_fp8_variables": {"num_gemms": 1, "fp8_checkpoint": True},
    }
    lin = te.Linear(16, 16)
    with pytest.raises(RuntimeError, match="NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1"):
        lin.set_extra_state(torch.frombuffer(bytearray(pickle.dumps(hand)), dtype=torch.uint8))
    monkeypatch.setenv("NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE", "1")
    lin.set_extra_state(torch.frombuffer(bytearray(pickle.dumps(hand)), dtype=torch.uint8))
    g = lin.fp8_gemms["gemm"]
    assert g.fwd.scale.tolist() == [2.0, 4.0, 1.0] and g.bwd.amax_history[:, 0].tolist() == [0.0, 7.0]
    lin.set_extra_state(torch.empty(0, dtype=torch.uint8))  # TE: nothing to load
    with te.autocast(recipe=Float8CurrentScaling()):
        cs = te.Linear(16, 16)
        cs(torch.randn(16, 16))
    assert cs.get_extra_state().numel() == 0  # stateless recipe: empty, as TE


# -- quantized_model_init: FP8 primary weights ------------------------------------------------------
@pytest.mark.parametrize("recipe", [DelayedScaling(), Float8CurrentScaling()], ids=["delayed", "current"])
def test_quantized_model_init_holds_fp8_weights_and_the_gemm_uses_their_codes(recipe) -> None:  # noqa: ANN001
    """TE quantization.py quantized_model_init + base.py reset_parameters: the weight parameter is the
    quantized tensor (``_data``, ``_scale_inv``); the forward GEMM uses it as it is."""
    from fp8sim.pytorch.tensor import QuantizedTensor

    torch.manual_seed(6)
    with te.quantized_model_init(recipe=recipe, preserve_high_precision_init_val=True):
        m = te.Linear(32, 16, bias=False)
    w = m.weight
    assert isinstance(w, QuantizedTensor) and isinstance(w, torch.nn.Parameter) and w._data.dtype == torch.uint8
    hp = w.get_high_precision_init_val()
    torch.manual_seed(6)
    assert torch.equal(hp, torch.empty(16, 32).normal_(0, 0.023))  # the initial value, kept on the CPU
    w.clear_high_precision_init_val()
    assert w.get_high_precision_init_val() is None
    sw = w._scale_inv.reshape(-1)[0]
    wq = w._data.view(torch.float8_e4m3fn).float()
    want_w = (hp * (1 / sw)).clamp(-448, 448).to(torch.float8_e4m3fn).float()
    assert torch.equal(wq, want_w)  # delayed: scale 1 at init; current: 448 / amax
    x = torch.randn(16, 32)
    with te.autocast(recipe=Float8CurrentScaling(), accumulator="exact"):
        y = m(x)
    sx = torch.tensor(448.0) / x.abs().max()
    xq = (x * sx).clamp(-448, 448).to(torch.float8_e4m3fn).float()
    import _gemm_reference as gref  # the exact accumulator: the exact sum rounded once, not torch.matmul

    assert torch.equal(y, torch.from_numpy(gref.rn_f32(xq, wq.t())) * ((1 / sx) * sw))
    y.sum().backward()
    assert m.weight.grad is not None and m.weight.grad.shape == (16, 32)
    with pytest.raises(RuntimeError, match="Splitting QuantizedTensor"), te.quantized_model_init(recipe=recipe):
        te.Linear(16, 32, parameters_split=("a", "b"))
    # block recipes: tests/test_pytorch_primary_weights.py


def test_module_quantizers_follow_the_recipe_state() -> None:
    """TE quantization.py RecipeState.make_quantizers: 3 forward and 2 backward slots per GEMM;
    delayed scaling's quantizers read and write the module's live state."""
    m = te.LayerNormMLP(16, 16)
    with te.autocast(recipe=DelayedScaling()):
        m(torch.randn(16, 16))
    q = m.quantizers
    assert len(q["scaling_fwd"]) == 6 and len(q["scaling_bwd"]) == 4
    assert isinstance(q["scaling_fwd"][4], te.Float8Quantizer)
    m.fp8_gemms["fc2"].fwd.scale[1] = 4.0
    assert float(q["scaling_fwd"][4].scale) == 4.0  # fc2's WEIGHT slot, a live view
    lin = te.Linear(32, 32)
    with te.autocast(recipe=MXFP8BlockScaling(enable_2d_quantization=True)):
        lin(torch.randn(32, 32))
    fwd = lin.quantizers["scaling_fwd"]
    assert isinstance(fwd[0], te.MXFP8Quantizer) and fwd[1].with_2d_quantization and not fwd[0].with_2d_quantization


def test_accelerate_documented_reverse_conversion_keeps_a_missing_bias_missing() -> None:
    """TE represents ``bias=False`` by an empty tensor, which passes accelerate's ``module.bias is not None``
    (accelerate utils/transformer_engine.py convert_model); documented=True converts back without a bias."""
    import fp8sim.accelerate as fa

    model = torch.nn.Sequential(torch.nn.Linear(32, 32, bias=False))
    with torch.no_grad():
        fa.convert_model(model)
        assert isinstance(model[0], te.Linear) and model[0].bias.numel() == 0
        fa.convert_model(model, to_transformer_engine=False, documented=True)
    assert isinstance(model[0], torch.nn.Linear) and model[0].bias is None


def test_save_original_input_and_checkpoint_are_accepted_with_unchanged_numerics() -> None:
    """TE linear.py: ``save_original_input`` re-quantizes the saved input in backward (the same
    values: the columnwise copy comes from the same high-precision input); LayerNormMLP ``checkpoint``
    recomputes the forward in backward (fp8sim keeps the activations instead: same numerics)."""
    torch.manual_seed(7)
    a, b = te.Linear(16, 16, save_original_input=True), te.Linear(16, 16)
    with torch.no_grad():
        b.weight.copy_(a.weight)
    x, g = torch.randn(16, 16, requires_grad=True), torch.randn(16, 16)
    for mod in (a, b):
        with te.autocast(recipe=MXFP8BlockScaling()):
            mod(x).backward(g)
    assert a.save_original_input and torch.equal(a.weight.grad, b.weight.grad)
    assert te.LayerNormMLP(16, 16, checkpoint=True).checkpoint


_META_MODULES = {
    "Linear": lambda d: te.Linear(64, 32, device=d),
    "LayerNorm": lambda d: te.LayerNorm(64, device=d),
    "RMSNorm": lambda d: te.RMSNorm(64, device=d),
    "LayerNormLinear": lambda d: te.LayerNormLinear(64, 32, device=d),
    "LayerNormMLP": lambda d: te.LayerNormMLP(64, 128, device=d),
    "GroupedLinear": lambda d: te.GroupedLinear(2, 64, 32, device=d),
}


@pytest.mark.parametrize("name", list(_META_MODULES))
def test_reset_parameters_materialises_meta_parameters(name: str) -> None:
    """TE module/base.py reset_parameters (and ops/basic/layer_norm.py for the norms): a parameter on
    meta is replaced by one on the device, then initialised (TE's tests/pytorch/test_deferred_init.py
    test_reset_parameters); fp8sim left them on meta.  Reference: the same module built on the CPU
    with the same seed has the same values (init runs in the same order)."""
    torch.manual_seed(5)
    meta = _META_MODULES[name]("meta")
    assert all(p.device.type == "meta" for p in meta.parameters())
    torch.manual_seed(5)
    with torch.no_grad():
        meta.reset_parameters()
    torch.manual_seed(5)
    cpu = _META_MODULES[name]("cpu")
    cpu_params = dict(cpu.named_parameters())
    for pname, p in meta.named_parameters():
        assert isinstance(p, torch.nn.Parameter) and p.device.type == "cpu" and p.requires_grad
        assert torch.equal(p, cpu_params[pname]), pname
# -- issue 29.2: every set_extra_state path names the missing or malformed key ------------------------
def _te_blob(**over: object) -> torch.Tensor:
    import pickle

    state = {
        "recipe": DelayedScaling(amax_history_len=2),
        "scale_fwd": torch.tensor([2.0, 4.0, 1.0]),
        "amax_history_fwd": torch.zeros(2, 3),
        "scale_bwd": torch.tensor([8.0, 1.0]),
        "amax_history_bwd": torch.zeros(2, 2),
        "extra_fp8_variables": {"num_gemms": 1, "fp8_checkpoint": True},
    }
    state.update(over)
    state = {k: v for k, v in state.items() if v is not ...}
    return torch.frombuffer(bytearray(pickle.dumps(state)), dtype=torch.uint8)


def _loaded_linear() -> te.Linear:
    lin = te.Linear(16, 16)
    lin.set_extra_state(_te_blob())
    return lin


@pytest.mark.parametrize(
    ("state", "names"),
    [
        (lambda: _te_blob(amax_history_fwd=...), "amax_history_fwd"),
        (lambda: _te_blob(scale_bwd=[8.0, 1.0]), "'scale_bwd'"),
        (lambda: _te_blob(amax_history_bwd=torch.zeros(2)), "'amax_history_bwd'"),
        (lambda: _te_blob(amax_history_bwd=torch.zeros(2, 3)), "'amax_history_bwd'"),
        (lambda: _te_blob(amax_history_bwd=torch.zeros(3, 2)), "amax_history_bwd"),
        (lambda: _te_blob(recipe=3), "'recipe'"),
        (lambda: _te_blob(extra_fp8_variables=[1]), "'extra_fp8_variables'"),
        (
            lambda: {
                "gemm": {
                    "fwd_scale": {"input": 1.0},
                    "fwd_amax_history": torch.zeros(2, 3),
                    "bwd_scale": torch.ones(2),
                    "bwd_amax_history": torch.zeros(2, 2),
                }
            },
            "'scale'",
        ),
        (
            lambda: {
                "gemm": {
                    "fwd_scale": torch.ones(3),
                    "fwd_amax_history": "zeros",
                    "bwd_scale": torch.ones(2),
                    "bwd_amax_history": torch.zeros(2, 2),
                }
            },
            "fwd_amax_history",
        ),
        (
            lambda: {
                "gemm": {
                    "fwd_scale": torch.ones(3),
                    "fwd_amax_history": torch.zeros(2, 3),
                    "bwd_scale": torch.ones(4),
                    "bwd_amax_history": torch.zeros(2, 2),
                }
            },
            "'scale'",
        ),
    ],
    ids=[
        "missing fwd history",
        "scale a list",
        "1-d history",
        "history columns",
        "history rows",
        "recipe an int",
        "extra vars a list",
        "fp8sim dict scale a dict",
        "fp8sim dict history a str",
        "fp8sim dict bwd shape",
    ],
)
def test_set_extra_state_names_the_missing_or_malformed_key(state, names, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE", "1")
    lin = _loaded_linear()
    with pytest.raises((RuntimeError, ValueError)) as info:
        lin.set_extra_state(state())
    assert names in str(info.value) and not isinstance(info.value, KeyError)
    g = lin.fp8_gemms["gemm"]
    assert g.fwd.scale.tolist() == [2.0, 4.0, 1.0] and g.bwd.scale.tolist() == [8.0, 1.0]  # nothing half-loaded
    sd = _loaded_linear().state_dict()
    sd["_extra_state"] = state()
    with pytest.raises((RuntimeError, ValueError)) as info:
        te.Linear(16, 16).load_state_dict(sd)
    assert names in str(info.value)


def test_dot_product_attention_set_extra_state_names_a_missing_key() -> None:
    dpa = te.DotProductAttention(2, 8)
    state = {"fwd_scale": torch.ones(9), "fwd_amax_history": torch.zeros(4, 9), "bwd_scale": torch.ones(6)}
    with pytest.raises(RuntimeError, match="expected .*'bwd_amax_history'"):
        dpa.set_extra_state(state)
    with pytest.raises(RuntimeError, match="'bwd_amax_history'"):
        dpa.set_extra_state({**state, "bwd_amax_history": [0.0] * 6})
    with pytest.raises(RuntimeError, match=r"state\['amax_history'\] has shape \(3, 6\)"):
        dpa.set_extra_state({**state, "bwd_amax_history": torch.zeros(3, 6)})


# -- issue 29.8: a deep copy under delayed scaling, as TE (module/base.py, quantization.py) --------------
def _steps(models: list, n: int = 6) -> None:
    recipe = DelayedScaling(amax_history_len=4)
    g = torch.Generator().manual_seed(2)
    for step in range(n):
        x = torch.randn(8, 16, generator=g) * 4.0**step  # growing inputs: the scales must fall
        with te.autocast(recipe=recipe):
            ys = [m(x) for m in models]
        sum(y.sum() for y in ys).backward()


def test_deepcopy_of_a_registered_linear_keeps_its_scales_as_te_and_warns_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """TE: ``copy.deepcopy`` copies ``fp8_meta`` with its ``buffer_index_and_autocast_key`` entry, so the
    copy's ``add_fp8_tensors_to_global_buffer`` returns early (quantization.py 528-530) and
    ``reduce_and_update_fp8_tensors`` never updates it: its scales stay those it was copied with."""
    import copy
    import warnings

    from fp8sim._util.upstream_quirk import UpstreamQuirkWarning

    torch.manual_seed(0)
    orig = te.Linear(16, 16)
    _steps([orig], 1)
    frozen = orig.fp8_gemms["gemm"].fwd.scale.copy(), orig.fp8_gemms["gemm"].bwd.scale.copy()
    twin = copy.deepcopy(orig)  # a second copy, trained alone: what the original does
    dup = copy.deepcopy(orig)
    with pytest.warns(UpstreamQuirkWarning, match="te-deepcopy-stale-scales") as record:
        _steps([orig, dup], 6)
    assert len([w for w in record if issubclass(w.category, UpstreamQuirkWarning)]) == 1  # once per copy
    g, d = orig.fp8_gemms["gemm"], dup.fp8_gemms["gemm"]
    assert d.fwd.scale.tolist() == frozen[0].tolist() and d.bwd.scale.tolist() == frozen[1].tolist()
    assert (g.fwd.scale[0] < frozen[0][0] / 100).all()  # the original's input scale followed the inputs
    assert d.fwd.amax_history[0, 0] > 100 * d.fwd.amax_history[1:, 0].max()  # the copy's amax only accumulates
    monkeypatch.setenv("NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UpstreamQuirkWarning)
        fresh = te.Linear(16, 16)
        fresh.load_state_dict(twin.state_dict())  # the remedy the warning names: a new module and its state
        _steps([fresh], 6)
    assert fresh.fp8_gemms["gemm"].fwd.scale.tolist() == g.fwd.scale.tolist()


def test_deepcopy_before_the_first_fp8_step_registers_the_copy_as_te() -> None:
    import copy
    import warnings

    torch.manual_seed(0)
    orig = te.Linear(16, 16)
    dup = copy.deepcopy(orig)  # no FP8 step yet: no buffer key to copy
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _steps([orig, dup], 3)
    assert orig.fp8_gemms["gemm"].fwd.scale.tolist() == dup.fp8_gemms["gemm"].fwd.scale.tolist() != [1.0] * 3
