"""Fuzz of the scaling layouts (every ``quantize_*``, ``e8m0_scale_codes``) and ``DelayedScaler``.

Oracles for valid calls: torchao 0.18 itself (``to_mx``; ``tensor_to_scale`` + ``to_fp8_saturated``),
the block-scaling reference of ``test_scaling_current`` (plain loops over blocks, ml_dtypes casts), TE's
delayed-scaling update written here from ``common/recipe/delayed_scaling.cu`` (``most_recent``:
``scale = fp8_max / amax / 2^margin`` for a finite positive amax, else unchanged).  NVFP4 has no oracle
that runs here: its fuzz checks the contract and the layout (codes, scales and the dequantized error).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from _contract import (
    ARRAY_BAD,
    BOOL_BAD,
    BOOL_OR_NONE_BAD,
    FUZZ,
    INT_BAD,
    REAL_BAD,
    STR_BAD,
    Call,
    check_call,
    one_bad,
)
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fp8sim
from fp8sim import scaling as S
from fp8sim.recipe import DelayedScaling
from fp8sim.scaling.delayed import DelayedScaler
from fp8sim.testing.oracles import require

pytestmark = pytest.mark.fuzz

torch = require("torch")

FINITE = st.floats(-1e4, 1e4, width=32, allow_subnormal=True)
ANY32 = st.floats(width=32, allow_nan=True, allow_infinity=True)


def _matrix(draw: st.DrawFn, rows: int, cols: int, specials: bool) -> np.ndarray:
    return draw(hnp.arrays(np.float32, (rows, cols), elements=ANY32 if specials else FINITE))


# -- FP8 block scaling ----------------------------------------------------------------------------------
@st.composite
def block_calls(draw: st.DrawFn) -> Call:
    block_dim = draw(st.sampled_from([1, 2]))
    bs = draw(st.sampled_from([4, 16, 128]))
    x = _matrix(draw, draw(st.integers(1, 9)), draw(st.integers(1, 40)), draw(st.booleans()))
    valid = {"x": x, "fmt": "e4m3", "block_dim": block_dim, "columnwise": False, "pow2": draw(st.booleans()),
             "block_size": bs, "eps": 0.0}  # fmt: skip
    pools = {"x": ARRAY_BAD, "fmt": STR_BAD, "block_dim": [0, 3, *INT_BAD], "columnwise": BOOL_BAD[:-2],
             "pow2": BOOL_BAD[:-2], "block_size": [0, -1, 2**40, *INT_BAD],
             "eps": [-1.0, float("nan"), *REAL_BAD]}  # fmt: skip
    kwargs, bad = one_bad(draw, valid, pools)
    return Call(S.quantize_block_scaling, kwargs, bad)


@FUZZ
@given(block_calls())
def test_block_scaling_keeps_the_contract_and_matches_the_block_reference(call: Call) -> None:
    from test_scaling_current import _ref_block

    ok, q = check_call(call)
    if not ok:
        return
    kw = call.kwargs
    bm, bn = (kw["block_size"], kw["block_size"]) if kw["block_dim"] == 2 else (1, kw["block_size"])
    with np.errstate(over="ignore"):  # the reference's 448 / tiny amax overflows to Inf, as TE's does
        want_s, want_c = _ref_block(kw["x"], bm, bn, kw["pow2"], float(np.finfo(np.float32).max))
    assert np.array_equal(q.scales.view(np.uint32), want_s.view(np.uint32))
    nan = np.isnan(fp8sim.decode(q.codes, "e4m3")) & np.isnan(fp8sim.decode(want_c, "e4m3"))
    assert ((q.codes == want_c) | nan).all()


# -- MX -----------------------------------------------------------------------------------------------
@st.composite
def mx_calls(draw: st.DrawFn) -> Call:
    x = _matrix(draw, draw(st.integers(1, 4)), 32 * draw(st.integers(1, 3)), draw(st.booleans()))
    valid = {"x": x, "elem_format": draw(st.sampled_from(["e4m3", "e5m2", "e2m3", "e3m2", "e2m1"])), "axis": -1,
             "block_size": 32, "scale_rule": draw(st.sampled_from(["floor", "ceil", "even", "rceil"])),
             "flavor": "torchao", "mxfma": False, "pad": None, "swizzle": False}  # fmt: skip
    pools = {"x": ARRAY_BAD, "elem_format": ["e4m3fnuz", "e8m0", *STR_BAD], "axis": [2, -3, *INT_BAD],
             "block_size": [0, -32, 2**40, *INT_BAD], "scale_rule": STR_BAD, "flavor": STR_BAD,
             "mxfma": BOOL_BAD, "pad": BOOL_OR_NONE_BAD, "swizzle": BOOL_BAD}  # fmt: skip
    kwargs, bad = one_bad(draw, valid, pools)
    return Call(S.quantize_mx, kwargs, bad)


@FUZZ
@given(mx_calls())
def test_mx_keeps_the_contract_and_matches_torchao_to_mx(call: Call) -> None:
    require("torchao.prototype.mx_formats.mx_tensor")
    from test_scaling_mx import torchao_to_mx

    ok, q = check_call(call)
    if not ok:
        return
    kw = call.kwargs
    want_s, want_c = torchao_to_mx(kw["x"], kw["elem_format"], kw["scale_rule"])
    assert np.array_equal(q.scales, want_s.reshape(q.scales.shape))
    assert np.array_equal(q.codes, want_c.reshape(q.codes.shape))


@st.composite
def e8m0_calls(draw: st.DrawFn) -> Call:
    amax = draw(hnp.arrays(np.float32, st.integers(0, 6), elements=st.floats(0, 2.0**126, width=32)))
    valid = {"amax": amax, "elem_format": draw(st.sampled_from(["e4m3", "e5m2", "e2m1"])),
             "rule": draw(st.sampled_from(list(S.SCALE_RULES))), "flavor": "ocp", "mxfma_dtype": None}  # fmt: skip
    pools = {"amax": ARRAY_BAD, "elem_format": STR_BAD, "rule": STR_BAD, "flavor": STR_BAD,
             "mxfma_dtype": ["float32", 3, "bfloat16"]}  # fmt: skip
    kwargs, bad = one_bad(draw, valid, pools)
    return Call(S.e8m0_scale_codes, kwargs, bad)


@FUZZ
@given(e8m0_calls())
def test_e8m0_scale_codes_keep_the_contract_and_floor_is_ocps_rule(call: Call) -> None:
    ok, codes = check_call(call)
    if not ok or call.kwargs["rule"] != "floor":
        return
    a = call.kwargs["amax"].astype(np.float64)
    emax = fp8sim.get_format(call.kwargs["elem_format"]).emax
    with np.errstate(divide="ignore"):  # OCP MX 6.3: E = floor(log2 amax) - emax_elem, clamped; amax 0 -> 0x00
        e = np.where(a > 0, np.floor(np.log2(np.where(a > 0, a, 1))) - emax, -127)
    assert np.array_equal(codes, (np.clip(e, -127, 127) + 127).astype(np.uint8))


# -- current scaling and torchao ----------------------------------------------------------------------------
@st.composite
def torchao_calls(draw: st.DrawFn) -> Call:
    x = _matrix(draw, draw(st.integers(1, 6)), draw(st.integers(1, 20)), draw(st.booleans()))
    valid = {"x": x, "fmt": draw(st.sampled_from(["e4m3", "e5m2"])),
             "granularity": draw(st.sampled_from(["tensorwise", "axiswise"])),
             "axiswise_dim": draw(st.sampled_from([-1, 0])),
             "round_scales_to_power_of_2": draw(st.booleans())}  # fmt: skip
    pools = {"x": ARRAY_BAD, "fmt": STR_BAD, "granularity": STR_BAD, "axiswise_dim": [2, -3, *INT_BAD[:-4]],
             "round_scales_to_power_of_2": BOOL_BAD}  # fmt: skip
    if valid["granularity"] == "tensorwise":
        pools.pop("axiswise_dim")  # not read for one scale
    kwargs, bad = one_bad(draw, valid, pools)
    return Call(S.quantize_torchao, kwargs, bad)


@FUZZ
@given(torchao_calls())
def test_torchao_scaling_keeps_the_contract_and_matches_torchao(call: Call) -> None:
    fu = require("torchao.float8.float8_utils")
    from torchao.float8.config import ScalingGranularity

    ok, q = check_call(call)
    if not ok:
        return
    kw = call.kwargs
    xt, dt = torch.from_numpy(kw["x"]), fp8sim.get_format(kw["fmt"]).torch_dtype
    axis = kw["granularity"] == "axiswise"
    gran = ScalingGranularity.AXISWISE if axis else ScalingGranularity.TENSORWISE
    scale = fu.tensor_to_scale(xt, dt, scaling_granularity=gran, axiswise_dim=kw["axiswise_dim"] if axis else None,
                               round_scales_to_power_of_2=kw["round_scales_to_power_of_2"])  # fmt: skip
    data = fu.to_fp8_saturated(xt.float() * scale, dt).view(torch.uint8).numpy()
    want_s = scale.numpy().reshape(q.scales.shape)
    assert np.array_equal(q.scales, want_s, equal_nan=True)
    nan = np.isnan(fp8sim.decode(q.codes, kw["fmt"])) & np.isnan(fp8sim.decode(data, kw["fmt"]))
    assert ((q.codes == data) | nan).all()


@st.composite
def current_calls(draw: st.DrawFn) -> Call:
    x = _matrix(draw, draw(st.integers(1, 6)), draw(st.integers(1, 20)), draw(st.booleans()))
    valid = {"x": x, "fmt": draw(st.sampled_from(["e4m3", "e5m2"])), "pow2": draw(st.booleans()),
             "eps": draw(st.sampled_from([0.0, 1e-12, 1.0]))}  # fmt: skip
    kwargs, bad = one_bad(draw, valid, {"x": ARRAY_BAD, "fmt": STR_BAD, "pow2": BOOL_BAD, "eps": [-1.0, *REAL_BAD]})
    return Call(S.quantize_current_scaling, kwargs, bad)


@FUZZ
@given(current_calls())
def test_current_scaling_keeps_the_contract_and_matches_tes_formula(call: Call) -> None:
    ok, q = check_call(call)
    if not ok:
        return
    kw = call.kwargs
    f = fp8sim.get_format(kw["fmt"])
    finite = np.abs(kw["x"][~np.isnan(kw["x"])])
    amax = max(float(finite.max()) if finite.size else 0.0, kw["eps"])  # TE: fmaxf amax, raised to eps
    if amax == 0 or np.isinf(amax):
        s = np.float32(1)
    else:
        s = np.float32(f.max) / np.float32(amax)  # one float32 division (recipe_common.cuh)
        s = np.float32(np.finfo(np.float32).max) if np.isinf(s) else s
        if kw["pow2"]:
            s = np.float32(2.0 ** np.floor(np.log2(s)))
    want = np.clip(kw["x"] * s, -f.max, f.max).astype(f.ml_dtype).view(np.uint8)
    assert float(q.scales.reshape(-1)[0]) == float(np.float32(1) / s)
    nan = np.isnan(fp8sim.decode(q.codes, f)) & np.isnan(fp8sim.decode(want, f))
    assert ((q.codes == want) | nan).all()


# -- NVFP4: contract and layout --------------------------------------------------------------------------
@st.composite
def nvfp4_calls(draw: st.DrawFn) -> Call:
    x = _matrix(draw, 16 * draw(st.integers(1, 2)), 16 * draw(st.integers(1, 3)), False)
    valid = {"x": x, "flavor": draw(st.sampled_from(["te", "torchao"])), "rht": False,
             "stochastic": draw(st.booleans()), "seed": draw(st.integers(0, 2**32)), "row_scaled": False,
             "global_amax": None, "reference_zero_handling": False, "single_level": False,
             "swizzle": False}  # fmt: skip
    if valid["flavor"] == "torchao":
        valid["stochastic"] = False
    if not valid["stochastic"]:
        valid["seed"] = None
    pools = {"x": ARRAY_BAD, "flavor": STR_BAD, "rht": BOOL_BAD, "stochastic": BOOL_BAD, "row_scaled": BOOL_BAD,
             "global_amax": [-1.0, float("nan"), "x", OBJ_LIST], "swizzle": BOOL_BAD}  # fmt: skip
    if valid["flavor"] == "torchao":
        pools = {k: v for k, v in pools.items() if k in ("x", "flavor", "swizzle")}
    kwargs, bad = one_bad(draw, valid, pools)
    return Call(S.quantize_nvfp4, kwargs, bad)


OBJ_LIST = [object()]


@FUZZ
@given(nvfp4_calls())
def test_nvfp4_keeps_the_contract_and_matches_torchao_or_tes_layout(call: Call) -> None:
    ok, q = check_call(call)
    if not ok:
        return
    x = call.kwargs["x"]
    assert q.codes.shape == x.shape and q.codes.max(initial=0) < 16 and q.fmt.name == "e2m1"
    assert q.scales.dtype == np.uint8 and q.scales.size == x.size // 16
    if call.kwargs["flavor"] == "torchao":  # torchao's own nvfp4_quantize runs on a CPU: the oracle
        ao = require("torchao.prototype.mx_formats.nvfp4_tensor")
        xt = torch.from_numpy(x)
        pts = ao.per_tensor_amax_to_scale(torch.max(torch.abs(xt)))
        scales, data = ao.nvfp4_quantize(xt, block_size=16, per_tensor_scale=pts)
        data = data.view(torch.uint8)
        codes = torch.stack([data & 0xF, data >> 4], dim=-1).reshape(x.shape).numpy()
        assert np.array_equal(q.scales.reshape(-1), scales.view(torch.uint8).reshape(-1).numpy())
        assert np.array_equal(q.codes, codes)
        return
    deq = q.dequantize()  # TE: every block within half its largest E2M1 step of the input
    amax = np.abs(x).max(initial=0.0)
    assert np.isfinite(deq).all() and (np.abs(deq - x) <= amax / 2 + 1e-30).all()


# -- DelayedScaler -----------------------------------------------------------------------------------
STEPS = st.lists(
    st.tuples(st.integers(0, 2), hnp.arrays(np.float32, st.integers(0, 8), elements=ANY32), st.booleans()), max_size=6
)


@FUZZ
@given(STEPS, st.integers(1, 4), st.integers(-4, 4))
def test_delayed_scaler_most_recent_matches_tes_update(steps: list, hist_len: int, margin: int) -> None:
    recipe = DelayedScaling(
        amax_history_len=hist_len, margin=margin, amax_compute_algo="most_recent", reduce_amax=False
    )
    s = DelayedScaler(recipe, n=3)
    scale = np.ones(3, np.float32)
    staged = np.zeros(3, np.float32)
    fp8_max = np.float32(fp8sim.get_format("e4m3").max)
    for index, x, update in steps:
        ok, _ = check_call(Call(s.record, {"index": index, "x": x}))
        assert ok
        finite = np.abs(x[~np.isnan(x)])
        staged[index] = max(staged[index], finite.max() if finite.size else np.float32(0))
        if update:
            s.update()
            for i, a in enumerate(staged):  # fused kernel: a zero amax leaves the scale (and history) alone
                if np.isfinite(a) and a > 0:
                    with np.errstate(over="ignore"):  # a subnormal amax: Inf, then FLT_MAX below
                        sf = np.float32(fp8_max * np.float32(2.0**-margin)) / a
                    scale[i] = np.float32(np.finfo(np.float32).max) if np.isinf(sf) else sf
            staged[:] = 0
        assert np.array_equal(s.scale, scale), (s.scale, scale)
    state = s.state_dict()
    fresh = DelayedScaler(recipe, n=3)
    fresh.load_state_dict(state)
    assert np.array_equal(fresh.scale, s.scale) and np.array_equal(fresh.amax_history, s.amax_history)


@st.composite
def bad_states(draw: st.DrawFn) -> tuple[dict, str]:
    good = {"scale": np.ones(3, np.float32), "amax_history": np.zeros((4, 3), np.float32)}
    key = draw(st.sampled_from(["scale", "amax_history", "extra", "missing"]))
    if key == "missing":
        gone = draw(st.sampled_from(sorted(good)))
        return {k: v for k, v in good.items() if k != gone}, gone
    if key == "extra":
        return {**good, "scale_inv": np.ones(3)}, "scale_inv"
    return {**good, key: draw(st.sampled_from([*ARRAY_BAD[:5], np.ones(2), np.zeros((3, 3)), -np.ones(3)]))}, key


@FUZZ
@given(bad_states())
def test_delayed_scaler_refuses_bad_states_naming_the_key(case: tuple[dict, str]) -> None:
    state, key = case
    s = DelayedScaler(DelayedScaling(amax_history_len=4), n=3)
    if key == "amax_history" and isinstance(state.get(key), np.ndarray) and state[key].shape == (4, 3):
        return  # a -1 history is a valid state
    call = Call(s.load_state_dict, {"state": state}, "state", {"state": (key,)})
    ok, exc = check_call(call)
    assert not ok and key in str(exc)
    assert np.array_equal(s.scale, np.ones(3, np.float32))


@st.composite
def scaler_calls(draw: st.DrawFn) -> Call:
    valid = {"recipe": DelayedScaling(amax_history_len=draw(st.integers(1, 8))), "n": draw(st.integers(1, 4)),
             "forward": draw(st.booleans()), "fused": draw(st.sampled_from([None, True, False])),
             "eager_division": draw(st.booleans())}  # fmt: skip
    pools = {"recipe": ["delayed", None, 3], "n": [0, 2**40, *INT_BAD], "forward": BOOL_BAD, "fused": BOOL_OR_NONE_BAD,
             "eager_division": BOOL_BAD}  # fmt: skip
    kwargs, bad = one_bad(draw, valid, pools)
    if bad == "recipe" and kwargs["recipe"] is None:
        kwargs["recipe"] = 3  # None means TE's default recipe: valid
    return Call(lambda **kw: DelayedScaler(kw.pop("recipe"), **kw), kwargs, bad)


@FUZZ
@given(scaler_calls())
def test_delayed_scaler_construction_keeps_the_contract(call: Call) -> None:
    ok, s = check_call(call)
    if ok:
        assert s.amax_history.shape == (call.kwargs["recipe"].amax_history_len, call.kwargs["n"])


def test_ml_dtypes_bfloat16_inputs_are_exact() -> None:
    x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(2, 32)
    for fn in (S.quantize_mx, S.quantize_block_scaling, S.quantize_current_scaling):
        a, b = fn(x.astype(ml_dtypes.bfloat16).astype(np.float32)), fn(x.astype(ml_dtypes.bfloat16))
        assert np.array_equal(a.codes, b.codes)


# -- packing and swizzling: the contract, and each pair is a round trip ---------------------------------------
CODES = {"pack_fp4": 16, "pack_fp6": 64}


@st.composite
def pack_calls(draw: st.DrawFn) -> Call:
    name = draw(st.sampled_from(sorted(CODES)))
    per = 2 if name == "pack_fp4" else 4
    shape = (draw(st.integers(1, 3)), per * draw(st.integers(0, 4)))
    codes = draw(
        hnp.arrays(draw(st.sampled_from([np.uint8, np.int32])), shape, elements=st.integers(0, CODES[name] - 1))
    )
    bad_codes = [*ARRAY_BAD, np.array([CODES[name]]), np.array([-1, 0]), np.zeros(per + 1, np.uint8)]
    kwargs, bad = one_bad(draw, {"codes": codes}, {"codes": bad_codes})
    return Call(getattr(S, name), kwargs, bad)


@FUZZ
@given(pack_calls())
def test_packing_keeps_the_contract_and_unpacks_to_its_input(call: Call) -> None:
    ok, packed = check_call(call)
    if not ok:
        return
    unpack = S.unpack_fp4 if call.fn is S.pack_fp4 else S.unpack_fp6
    ok, back = check_call(Call(unpack, {"packed": packed}))
    assert ok and np.array_equal(back, call.kwargs["codes"].astype(np.uint8))


@st.composite
def blocked_calls(draw: st.DrawFn) -> tuple[np.ndarray, Call]:
    from fp8sim.scaling.swizzle import from_blocked, to_blocked

    scales = draw(hnp.arrays(np.uint8, (draw(st.integers(1, 130)), draw(st.integers(1, 6)))))
    valid = {"blocked": to_blocked(scales), "rows": scales.shape[0], "cols": scales.shape[1]}
    pools = {"blocked": ARRAY_BAD[:3], "rows": [-1, 10**6, *INT_BAD[:-4]], "cols": [-1, 10**6, *INT_BAD[:-4]]}
    kwargs, bad = one_bad(draw, valid, pools)
    return scales, Call(from_blocked, kwargs, bad)


@FUZZ
@given(blocked_calls())
def test_blocked_scales_keep_the_contract_and_round_trip(case: tuple[np.ndarray, Call]) -> None:
    scales, call = case
    ok, back = check_call(call)
    if ok:
        assert np.array_equal(back, scales)


@FUZZ
@given(st.data())
def test_mx_rowwise_columnwise_is_the_two_single_axis_casts(data: st.DataObject) -> None:
    x = _matrix(
        data.draw, 32 * data.draw(st.integers(1, 2)), 32 * data.draw(st.integers(1, 2)), data.draw(st.booleans())
    )
    elem = data.draw(st.sampled_from(["e4m3", "e2m1"]))
    ok, (row, col) = check_call(Call(S.quantize_mx_rowwise_columnwise, {"x": x, "elem_format": elem}))
    assert ok
    for q, axis in ((row, -1), (col, 0)):
        want = S.quantize_mx(x, elem, axis=axis)
        assert np.array_equal(q.codes, want.codes) and np.array_equal(q.scales, want.scales)
