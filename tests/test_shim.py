"""`fp8sim run` / fp8sim.shim: unchanged TransformerEngine and accelerate scripts on a CPU (issue 9)."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import fp8sim.shim as shim  # noqa: E402

DATA = Path(__file__).parent / "data" / "shim"


def _te_really_installed() -> bool:
    return not shim.is_installed() and importlib.util.find_spec("transformer_engine") is not None


def _run(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fp8sim", "run", str(DATA / script)], capture_output=True, text=True, timeout=300
    )


@pytest.mark.skipif(_te_really_installed(), reason="a real TransformerEngine is installed")
def test_install_and_uninstall_are_explicit_and_reversible(capsys: pytest.CaptureFixture[str]) -> None:
    import fp8sim  # noqa: F401 - importing fp8sim never activates the shim

    with pytest.raises(ImportError):
        importlib.import_module("transformer_engine")
    shim.install()
    try:
        shim.install()  # idempotent, announced once
        te = importlib.import_module("transformer_engine.pytorch")
        recipe = importlib.import_module("transformer_engine.common.recipe")
        assert (
            te.Linear.__module__ == "fp8sim.pytorch.module.linear"
            and recipe.DelayedScaling.__module__ == "fp8sim.recipe"
        )
        assert importlib.metadata.version("transformer-engine") == shim.EMULATED_TE_VERSION
        from accelerate.utils import is_transformer_engine_available

        assert is_transformer_engine_available()
        pt = importlib.import_module("fp8sim.pytorch")
        assert te.TransformerLayer is pt.TransformerLayer and te.DotProductAttention is pt.DotProductAttention
        with pytest.raises(NotImplementedError, match="fp8_model_init"):
            te.fp8_model_init(enabled=True)
        assert capsys.readouterr().err.count("transformer_engine is emulated by fp8sim") == 1
    finally:
        shim.uninstall()
    with pytest.raises(ImportError):
        importlib.import_module("transformer_engine")
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("transformer-engine")


def test_te_only_script_runs_unchanged_and_equals_fp8sim_pytorch() -> None:
    proc = _run("te_only_script.py")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "transformer_engine is emulated by fp8sim" in proc.stderr
    got = json.loads(proc.stdout)
    import fp8sim.pytorch as te
    from fp8sim.recipe import DelayedScaling, Format

    torch.manual_seed(0)
    layer = te.Linear(32, 16)
    recipe = DelayedScaling(fp8_format=Format.HYBRID, amax_history_len=8, amax_compute_algo="max")
    outs = []
    for step in range(3):
        x = torch.randn(16, 32) * (step + 1)
        with te.autocast(recipe=recipe):
            y = layer(x)
        y.sum().backward()
        outs.append(y.detach().flatten().tolist())
    st = layer.fp8_gemms["gemm"]
    assert got["outs"] == outs and got["grad"] == layer.weight.grad.flatten().tolist()
    assert got["fwd_scale"] == st.fwd.scale.tolist() and got["bwd_scale"] == st.bwd.scale.tolist()


def test_accelerate_te_script_runs_unchanged_with_upstream_quirks() -> None:
    pytest.importorskip("accelerate")
    proc = _run("accelerate_te_script.py")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    assert lines["TE_LINEARS"] == "2 fp8sim.pytorch.module.linear"  # accelerate's convert_model made fp8sim modules
    first, last = map(float, lines["LOSS"].split())
    assert last < first
    # accelerate forwards amax_history_len=4 but never forwards amax_compute_algo="most_recent"
    # (it equals the env-free default), so TE's own default "max" applies: spec 7.3
    assert lines["HIST_LEN"] == "4 ALGO max"
    assert lines["EVAL"] == "torch.Size([64, 16])"


def test_run_needs_a_script(capsys: pytest.CaptureFixture[str]) -> None:
    from fp8sim import cli

    assert cli.main(["run"]) == 2
    assert "usage: fp8sim run" in capsys.readouterr().err
