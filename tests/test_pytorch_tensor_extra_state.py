"""TE's ``_extra_state`` format (issue 13 point 10), against blobs built in the test as TE builds them.

TE's writer is ``NVIDIA/TransformerEngine:transformer_engine/pytorch/module/base.py`` at d0067d0,
``get_extra_state`` (lines 1354-1417): an empty uint8 tensor without FP8 state, else
``torch.frombuffer(bytearray(pickle.dumps(state)), dtype=torch.uint8)`` of ``{"recipe",
"scale_fwd", "amax_history_fwd", "scale_bwd", "amax_history_bwd", "extra_fp8_variables"}``.  Its
reader, ``set_extra_state`` (1419-1480), refuses a stateful pickle unless
``NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1`` (``pytorch/_extra_state.py`` lines 83-109).  TE's recipe
classes are pydantic dataclasses in ``transformer_engine.common.recipe``; the test defines stand-ins
there (TE's field declarations, ``common/recipe/__init__.py`` lines 20-50 and 253-261) so the
pickles name TE's classes exactly as a TE checkpoint does.
"""

from __future__ import annotations

import pickle
import sys
import types
from collections.abc import Iterator
from enum import Enum
from typing import Any, NamedTuple

import pytest

from fp8sim.testing.oracles import require

pydantic = require("pydantic")

torch = require("torch")

from fp8sim import recipe as fr  # noqa: E402
from fp8sim.pytorch import _extra_state_te as es  # noqa: E402

ADVISORY = (  # TE pytorch/_extra_state.py lines 88-95, context "Linear"
    "Refusing to load pickled Transformer Engine extra state for Linear. "
    "Delayed-scaling FP8 metadata can be stored as a Python pickle, and loading it "
    "can execute arbitrary code. Only enable unsafe loading if this checkpoint is from "
    "a trusted source. To load it anyway, set NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1."
)


def _fake_te_recipe_module() -> types.ModuleType:
    from pydantic.dataclasses import dataclass, rebuild_dataclass

    mod = types.ModuleType("transformer_engine.common.recipe")

    class _FormatHelper(NamedTuple):
        max_fwd: float
        max_bwd: float

    class Format(Enum):
        E2M1 = _FormatHelper(max_fwd=6, max_bwd=6)
        E4M3 = _FormatHelper(max_fwd=448, max_bwd=448)
        E5M2 = _FormatHelper(max_fwd=57344, max_bwd=57344)
        HYBRID = _FormatHelper(max_fwd=448, max_bwd=57344)

    class Recipe:
        _cached_repr = None

    @dataclass(repr=False)
    class DelayedScaling(Recipe):
        margin: int = 0
        fp8_format: Format = Format.HYBRID
        amax_history_len: int = 1024
        amax_compute_algo: str = "max"
        scaling_factor_compute_algo: Any = None
        reduce_amax: bool = True
        fp8_dpa: bool = False
        fp8_mha: bool = False
        backward_override: Any = None

    @dataclass(repr=False)
    class Float8CurrentScaling(Recipe):
        fp8_format: Format = Format.HYBRID

    for cls in (DelayedScaling, Float8CurrentScaling):  # string annotations: resolve them here
        rebuild_dataclass(cls, _types_namespace={"Format": Format, "Any": Any})
    for cls in (_FormatHelper, Format, Recipe, DelayedScaling, Float8CurrentScaling):
        cls.__module__ = mod.__name__
        cls.__qualname__ = cls.__name__
        setattr(mod, cls.__name__, cls)
    return mod


@pytest.fixture
def te_recipe(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """TE's recipe module importable while the test builds (or TE reads) a blob."""
    mod = _fake_te_recipe_module()
    pkg, common = types.ModuleType("transformer_engine"), types.ModuleType("transformer_engine.common")
    pkg.common, common.recipe = common, mod
    for m in (pkg, common, mod):
        monkeypatch.setitem(sys.modules, m.__name__, m)
    yield mod


def _te_blob(state: dict) -> torch.Tensor:
    """TE's serialisation, base.py lines 1413-1416."""
    return torch.frombuffer(bytearray(pickle.dumps(state)), dtype=torch.uint8)


def _te_state(te: types.ModuleType) -> dict:
    recipe = te.DelayedScaling(margin=1, fp8_format=te.Format.E4M3, amax_history_len=4)
    return {
        "recipe": recipe,
        "scale_fwd": torch.tensor([2.0, 4.0, 1.0, 8.0, 0.5, 1.0]),  # two GEMMs: 3 * gemm + role
        "amax_history_fwd": torch.arange(24, dtype=torch.float32).reshape(4, 6),
        "scale_bwd": torch.tensor([1.0, 3.0, 5.0, 7.0]),
        "amax_history_bwd": torch.ones(4, 4),
        "extra_fp8_variables": {"fp8_checkpoint": True, "num_gemms": 2},
    }


def test_decodes_a_te_delayed_scaling_blob(te_recipe: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    want = _te_state(te_recipe)
    blob = _te_blob(want)
    monkeypatch.delitem(sys.modules, te_recipe.__name__)  # fp8sim reads it without TE
    got = es.decode_te_extra_state(blob, "Linear", allow_unsafe=True)
    assert isinstance(got.recipe, fr.DelayedScaling)
    assert (got.recipe.margin, got.recipe.fp8_format, got.recipe.amax_history_len) == (1, fr.Format.E4M3, 4)
    for key in ("scale_fwd", "amax_history_fwd", "scale_bwd", "amax_history_bwd"):
        assert torch.equal(getattr(got, key), want[key]), key
    assert got.extra_fp8_variables == {"fp8_checkpoint": True, "num_gemms": 2}


def test_stateful_blob_needs_tes_opt_in(te_recipe: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    blob = _te_blob(_te_state(te_recipe))
    monkeypatch.delenv(es.UNSAFE_PICKLE_EXTRA_STATE_ENV, raising=False)
    with pytest.raises(RuntimeError) as info:
        es.decode_te_extra_state(blob, "Linear")
    assert str(info.value) == ADVISORY
    monkeypatch.setenv(es.UNSAFE_PICKLE_EXTRA_STATE_ENV, "1")
    assert es.decode_te_extra_state(blob, "Linear").scale_bwd.tolist() == [1.0, 3.0, 5.0, 7.0]


def test_empty_stateless_and_globalless_payloads_are_ignored(te_recipe: types.ModuleType) -> None:
    """TE ignores these without the opt-in (``_classify_extra_state_pickle_impl``)."""
    assert es.decode_te_extra_state(torch.empty(0, dtype=torch.uint8)) is None
    assert es.decode_te_extra_state(None) is None
    stateless = _te_blob({"recipe": te_recipe.Float8CurrentScaling(), "extra_fp8_variables": {}})
    assert es.decode_te_extra_state(stateless) is None
    assert es.decode_te_extra_state(_te_blob({})) is None


def test_te_1x_blob_without_recipe_gets_default_delayed_scaling() -> None:
    blob = _te_blob(
        {
            "scale_fwd": torch.ones(3),
            "scale_inv_fwd": torch.ones(3),
            "amax_history_fwd": torch.zeros(2, 3),
            "scale_bwd": torch.ones(2),
            "scale_inv_bwd": torch.ones(2),
            "amax_history_bwd": torch.zeros(2, 2),
            "extra_fp8_variables": {},
        }
    )
    got = es.decode_te_extra_state(blob, allow_unsafe=True)
    assert repr(got.recipe) == repr(fr.DelayedScaling()) and got.scale_fwd.tolist() == [1.0, 1.0, 1.0]


def test_fp8sim_blob_is_what_te_unpickles(te_recipe: types.ModuleType) -> None:
    """TE's reader is ``pickle.loads`` of the bytes (base.py line 1436): the recipe must come back as
    TE's own class with the same fields, the tensors as CPU float32 tensors."""
    fwd_s, fwd_h = torch.tensor([2.0, 4.0, 1.0]), torch.arange(6, dtype=torch.float32).reshape(2, 3)
    bwd_s, bwd_h = torch.tensor([1.0, 3.0]), torch.ones(2, 2)
    recipe = fr.DelayedScaling(margin=2, fp8_format=fr.Format.E4M3, amax_history_len=2)
    blob = es.encode_te_extra_state(
        recipe,
        scale_fwd=fwd_s,
        amax_history_fwd=fwd_h,
        scale_bwd=bwd_s,
        amax_history_bwd=bwd_h,
        extra_fp8_variables={"num_gemms": 1, "fp8_group": None, "buffer_index_and_autocast_key": (0,)},
    )
    assert blob.dtype == torch.uint8 and blob.dim() == 1
    state = pickle.loads(blob.numpy().tobytes())
    assert type(state["recipe"]) is te_recipe.DelayedScaling
    assert state["recipe"].fp8_format is te_recipe.Format.E4M3 and state["recipe"].margin == 2
    assert state["recipe"].amax_history_len == 2
    assert torch.equal(state["scale_fwd"], fwd_s) and torch.equal(state["amax_history_bwd"], bwd_h)
    assert state["extra_fp8_variables"] == {"num_gemms": 1}  # None and the buffer key are not kept
    back = es.decode_te_extra_state(blob, allow_unsafe=True)
    assert repr(back.recipe) == repr(recipe) and torch.equal(back.amax_history_fwd, fwd_h)


def test_no_state_gives_tes_empty_tensor() -> None:
    for blob in (
        es.encode_te_extra_state(fr.DelayedScaling(), fp8_checkpoint=False),
        es.encode_te_extra_state(fr.Float8CurrentScaling()),
        es.encode_te_extra_state(fr.MXFP8BlockScaling()),
        es.encode_te_extra_state(None),
    ):
        assert blob.dtype == torch.uint8 and blob.shape == (0,)


def test_only_recipes_and_tensors_are_resolved() -> None:
    """A pickle naming any other global is refused before anything runs."""

    class Evil:
        def __reduce__(self) -> tuple:
            return (print, ("ran",))

    blob = _te_blob({"recipe": Evil(), "scale_fwd": torch.ones(1), "extra_fp8_variables": {}})
    with pytest.raises(ValueError, match=r"refers to builtins\.print"):
        es.decode_te_extra_state(blob, allow_unsafe=True)


def test_garbled_and_foreign_states_are_clear_errors() -> None:
    garbled = torch.tensor([0x80, 4, 0x95, 1, 2], dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="Refusing to load pickled"):
        es.decode_te_extra_state(garbled)
    with pytest.raises(ValueError, match="not a readable TE extra state"):
        es.decode_te_extra_state(garbled, allow_unsafe=True)
    with pytest.raises(ValueError, match="not TE's state dict"):
        es.decode_te_extra_state(_te_blob({"scale_fwd": torch.ones(1)}), allow_unsafe=True)
    with pytest.raises(RuntimeError, match="Unsupported checkpoint format"):
        es.decode_te_extra_state({"gemm": {}})
    assert not es.is_te_extra_state({"gemm": {}}) and es.is_te_extra_state(torch.empty(0, dtype=torch.uint8))


def test_partial_delayed_scaling_tensors_are_refused() -> None:
    with pytest.raises(ValueError, match="give all of scale_fwd"):
        es.encode_te_extra_state(fr.DelayedScaling(), scale_fwd=torch.ones(3))
    with pytest.raises(ValueError, match="must be float32"):
        es.encode_te_extra_state(
            fr.DelayedScaling(),
            scale_fwd=torch.ones(3, dtype=torch.float64),
            amax_history_fwd=torch.ones(1, 3),
            scale_bwd=torch.ones(2),
            amax_history_bwd=torch.ones(1, 2),
        )


def test_per_gemm_scalers_map_to_tes_one_layout() -> None:
    """TE's slot order (``pytorch/csrc/common.h`` lines 76-97): forward ``3 * gemm + role``,
    backward ``2 * gemm + role``; a two-GEMM module round-trips through the TE blob."""
    from fp8sim.scaling import DelayedScaler

    recipe = fr.DelayedScaling(amax_history_len=3, reduce_amax=False)
    fwd = [DelayedScaler(recipe, n=3) for _ in range(2)]
    bwd = [DelayedScaler(recipe, n=2, forward=False) for _ in range(2)]
    for g, (f, b) in enumerate(zip(fwd, bwd, strict=True)):
        f.scale[:] = [10 * g + 1, 10 * g + 2, 10 * g + 3]
        b.scale[:] = [10 * g + 4, 10 * g + 5]
        f.amax_history[1] = f.scale
    tensors = es.scalers_to_te(fwd, bwd)
    assert tensors["scale_fwd"].tolist() == [1, 2, 3, 11, 12, 13]
    assert tensors["scale_bwd"].tolist() == [4, 5, 14, 15] and tensors["amax_history_fwd"].shape == (3, 6)
    blob = es.encode_te_extra_state(recipe, **tensors, extra_fp8_variables={"num_gemms": 2})
    state = es.decode_te_extra_state(blob, allow_unsafe=True)
    fwd2 = [DelayedScaler(state.recipe, n=3) for _ in range(2)]
    bwd2 = [DelayedScaler(state.recipe, n=2, forward=False) for _ in range(2)]
    es.te_to_scalers(state, fwd2, bwd2)
    assert fwd2[1].scale.tolist() == [11, 12, 13] and bwd2[1].scale.tolist() == [14, 15]
    assert fwd2[1].amax_history[1].tolist() == [11, 12, 13]
    with pytest.raises(ValueError, match="the state has 6 quantizers, the module 3"):
        es.te_to_scalers(state, fwd2[:1], bwd2)
