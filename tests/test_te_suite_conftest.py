"""scripts/te_suite_conftest.py, the conftest for running TE's own tests under the shim (issue 27)."""

from __future__ import annotations

import importlib
import importlib.util
import runpy
import sys
from pathlib import Path

import pytest

import fp8sim.run.shim as shim
from fp8sim.testing.oracles import require

require("torch")  # the shim resolves transformer_engine to fp8sim.pytorch (not in the lean session)

CONFTEST = Path(__file__).resolve().parents[1] / "scripts" / "te_suite_conftest.py"


@pytest.fixture
def installed():  # noqa: ANN201
    if shim.is_installed() or importlib.util.find_spec("transformer_engine") is not None:
        pytest.skip("the shim is already installed, or a real TransformerEngine is")
    shim.install(quiet=True)
    try:
        yield
    finally:
        shim.uninstall()  # also drops the modules the conftest put in sys.modules (transformer_engine.*)
        assert not [m for m in sys.modules if m.startswith("transformer_engine.")]


def test_conftest_keeps_names_fp8sim_emulates_and_stubs_the_others(installed) -> None:  # noqa: ANN001
    """TE's tests/pytorch/utils.py builds ModelConfig at import, which calls check_set_window_size: the
    conftest must not hide fp8sim's real one behind a placeholder (the shim resolves it by __getattr__)."""
    runpy.run_path(str(CONFTEST))
    utils = importlib.import_module("transformer_engine.pytorch.attention.dot_product_attention.utils")
    # dot_product_attention/utils.py check_set_window_size: a causal mask defaults to (-1, 0)
    assert utils.check_set_window_size("causal") == (-1, 0)
    assert utils.check_set_window_size("no_mask") == (-1, -1)
    with pytest.raises(NotImplementedError, match="get_attention_backend is not emulated"):
        utils.get_attention_backend()
    fused_attn = importlib.import_module("transformer_engine.pytorch.cpp_extensions.fused_attn")
    with pytest.raises(NotImplementedError, match="FusedAttnBackend"):
        fused_attn.FusedAttnBackend()
