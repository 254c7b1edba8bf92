"""Fuzz of the TE module constructors (``fp8sim.pytorch``), their forward outside FP8 and their
``load_state_dict`` / ``set_extra_state``, under the contract.

Oracles: outside ``autocast`` a module is plain torch, so ``Linear`` is ``F.linear`` and
``LayerNormLinear`` is ``F.linear(F.layer_norm(...))`` with the module's own parameters; a state dict
loads back into a fresh module unchanged.  Refusals name the argument (a size, the state key).
"""

from __future__ import annotations

import numpy as np
import pytest
from _contract import FUZZ, INT_BAD, REAL_BAD, Call, check_call, one_bad
from hypothesis import given
from hypothesis import strategies as st

from fp8sim.testing.oracles import require

pytestmark = pytest.mark.fuzz

torch = require("torch")
te = require("fp8sim.pytorch")
F = torch.nn.functional
from fp8sim.recipe import DelayedScaling  # noqa: E402

SIZE_BAD = [0, -1, *INT_BAD]
DOCUMENTED = (TypeError, ValueError, RuntimeError, NotImplementedError, AssertionError)  # TE asserts some options


@st.composite
def module_calls(draw: st.DrawFn) -> Call:
    size = st.integers(1, 24)
    kind = draw(st.sampled_from(["Linear", "LayerNormLinear", "LayerNormMLP", "LayerNorm", "RMSNorm", "GroupedLinear",
                                 "DotProductAttention", "MultiheadAttention", "TransformerLayer"]))  # fmt: skip
    heads = draw(st.integers(1, 4))
    valid, pools = {
        "Linear": ({"in_features": draw(size), "out_features": draw(size), "bias": draw(st.booleans())},
                   {"in_features": SIZE_BAD, "out_features": SIZE_BAD}),
        "LayerNormLinear": ({"in_features": draw(size), "out_features": draw(size), "eps": 1e-5},
                            {"in_features": SIZE_BAD, "out_features": SIZE_BAD}),
        "LayerNormMLP": ({"hidden_size": draw(size), "ffn_hidden_size": draw(size)},
                         {"hidden_size": SIZE_BAD, "ffn_hidden_size": SIZE_BAD}),
        "LayerNorm": ({"normalized_shape": draw(size), "eps": 1e-5},
                      {"normalized_shape": SIZE_BAD, "eps": [-1.0, float("nan"), *REAL_BAD]}),
        "RMSNorm": ({"normalized_shape": draw(size), "eps": 1e-5, "zero_centered_gamma": draw(st.booleans())},
                    {"normalized_shape": SIZE_BAD, "eps": [-1.0, float("inf"), *REAL_BAD]}),
        "GroupedLinear": ({"num_gemms": draw(st.integers(1, 3)), "in_features": draw(size), "out_features": draw(size)},
                          {"num_gemms": SIZE_BAD, "in_features": SIZE_BAD, "out_features": SIZE_BAD}),
        "DotProductAttention": ({"num_attention_heads": heads, "kv_channels": 8},
                                {"num_attention_heads": SIZE_BAD, "kv_channels": [*SIZE_BAD, (8,), (8, 0)]}),
        "MultiheadAttention": ({"hidden_size": 8 * heads, "num_attention_heads": heads},
                               {"hidden_size": SIZE_BAD, "num_attention_heads": SIZE_BAD}),
        "TransformerLayer": ({"hidden_size": 8 * heads, "ffn_hidden_size": draw(size), "num_attention_heads": heads},
                             {"hidden_size": SIZE_BAD, "ffn_hidden_size": SIZE_BAD, "num_attention_heads": SIZE_BAD}),
    }[kind]  # fmt: skip
    kwargs, bad = one_bad(draw, valid, pools)
    if kind in ("MultiheadAttention", "TransformerLayer") and bad == "num_attention_heads":
        kwargs["kv_channels"] = 8  # a bad head count, not a head size of 0
    return Call(getattr(te, kind), kwargs, bad, {"normalized_shape": ("hidden_size",)})


@FUZZ
@given(module_calls(), st.integers(0, 2**16))
def test_module_constructors_keep_the_contract_and_run_as_torch_outside_fp8(call: Call, seed: int) -> None:
    torch.manual_seed(seed)
    ok, m = check_call(call, DOCUMENTED)
    if not ok:
        return
    name = type(m).__name__
    if name == "Linear":
        x = torch.randn(3, call.kwargs["in_features"])
        assert torch.equal(m(x), F.linear(x, m.weight, m.bias if m.use_bias else None))  # TE: empty bias otherwise
    elif name == "LayerNormLinear":
        x = torch.randn(3, call.kwargs["in_features"])
        ln = F.layer_norm(x, x.shape[-1:], m.layer_norm_weight, m.layer_norm_bias, call.kwargs["eps"])
        assert torch.allclose(m(x), F.linear(ln, m.weight, m.bias), rtol=0, atol=1e-5)


@st.composite
def extra_states(draw: st.DrawFn) -> tuple[dict, str]:
    good = {"fwd_scale": torch.ones(3), "fwd_amax_history": torch.zeros(4, 3), "bwd_scale": torch.ones(2),
            "bwd_amax_history": torch.zeros(4, 2)}  # fmt: skip
    key = draw(st.sampled_from(sorted(good)))
    how = draw(st.sampled_from(["drop", "text", "shape", "negative", "none"]))
    if how == "drop":
        return {k: v for k, v in good.items() if k != key}, key
    bad = {"text": "x", "shape": torch.ones(5, 5, 5), "negative": -good[key] - 1, "none": None}[how]
    if how == "negative" and "history" in key:
        bad = torch.ones(7, 7)
    return {**good, key: bad}, key


@FUZZ
@given(extra_states(), st.booleans())
def test_set_extra_state_refuses_bad_state_naming_the_key_and_changes_nothing(case: tuple, via_load: bool) -> None:
    state, key = case
    lin = te.Linear(16, 16)
    start = {"fwd_scale": torch.full((3,), 2.0), "fwd_amax_history": torch.zeros(4, 3),
             "bwd_scale": torch.full((2,), 4.0), "bwd_amax_history": torch.zeros(4, 2)}  # fmt: skip
    lin.set_extra_state({"gemm": start})
    if via_load:
        sd = lin.state_dict()
        sd["_extra_state"] = {"gemm": state}
        call = Call(lin.load_state_dict, {"state_dict": sd}, "state_dict", {"state_dict": (key, key.split("_")[-1])})
    else:
        call = Call(lin.set_extra_state, {"state": {"gemm": state}}, "state", {"state": (key, key.split("_")[-1])})
    ok, exc = check_call(call, DOCUMENTED)
    assert not ok
    g = lin.fp8_gemms["gemm"]
    assert g.fwd.scale.tolist() == [2.0] * 3 and g.bwd.scale.tolist() == [4.0] * 2


@FUZZ
@given(st.integers(1, 3), st.integers(1, 6), st.booleans())
def test_state_dict_round_trips_after_fp8_steps(steps: int, hist: int, bias: bool) -> None:
    torch.manual_seed(steps)
    recipe = DelayedScaling(amax_history_len=hist)
    m = te.Linear(16, 16, bias=bias)
    for _ in range(steps):
        with te.autocast(recipe=recipe):
            y = m(torch.randn(16, 16) * 10)
        y.sum().backward()
    fresh = te.Linear(16, 16, bias=bias)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE", "1")  # TE's opt-in for a delayed-scaling pickle
        ok, _ = check_call(Call(fresh.load_state_dict, {"state_dict": m.state_dict()}), DOCUMENTED)
    assert ok
    a, b = m.fp8_gemms["gemm"], fresh.fp8_gemms["gemm"]
    assert np.array_equal(a.fwd.scale, b.fwd.scale) and np.array_equal(a.bwd.amax_history, b.bwd.amax_history)
