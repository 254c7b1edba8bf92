"""`fp8sim run` / fp8sim.run.shim: unchanged TransformerEngine and accelerate scripts on a CPU (issue 9)."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

import fp8sim.run.shim as shim  # noqa: E402

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
        with pytest.warns(DeprecationWarning, match="fp8_model_init is deprecated"):
            with te.fp8_model_init(enabled=True):  # TE's deprecated name: FP8 primary weights
                assert isinstance(te.Linear(16, 16).weight, te.Float8Tensor)
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
    require("accelerate")
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


@pytest.mark.skipif(_te_really_installed(), reason="a real TransformerEngine is installed")
def test_every_emulated_name_resolves_and_missing_ones_name_their_dotted_path() -> None:
    import fp8sim.pytorch as fp8_te

    shim.install(quiet=True)
    try:
        te = importlib.import_module("transformer_engine.pytorch")
        for name in fp8_te.__all__:
            assert getattr(te, name) is getattr(fp8_te, name)
        assert te.RMSNorm is fp8_te.RMSNorm
        linear = importlib.import_module("transformer_engine.pytorch.module.linear")
        assert linear.Linear is fp8_te.Linear and te.module.LayerNormMLP is fp8_te.LayerNormMLP
        from transformer_engine.pytorch.fp8 import check_fp8_support
        from transformer_engine.pytorch.quantization import FP8GlobalStateManager
        from transformer_engine.pytorch.utils import is_non_tn_fp8_gemm_supported

        assert check_fp8_support() == (True, "") and FP8GlobalStateManager is fp8_te.FP8GlobalStateManager
        assert is_non_tn_fp8_gemm_supported() is False
        with pytest.raises(NotImplementedError, match=r"^transformer_engine\.pytorch\.moe_permute is not emulated"):
            te.moe_permute  # noqa: B018
        assert not hasattr(te, "moe_permute")  # an AttributeError too: probes keep working
        with pytest.raises(NotImplementedError, match=r"transformer_engine\.pytorch\.optimizers is not emulated"):
            importlib.import_module("transformer_engine.pytorch.optimizers")
        with pytest.raises(ImportError):
            from transformer_engine.pytorch import cross_entropy  # noqa: F401
    finally:
        shim.uninstall()


def test_device_map_runs_a_cuda_script_on_the_cpu_and_the_banner_is_printed_once() -> None:
    cmd = [sys.executable, "-m", "fp8sim", "run", "--device-map", "cuda=cpu", str(DATA / "cuda_script.py")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert lines["DEVICE"] == "cpu torch.bfloat16 (9, 0)"
    assert lines["CHILD_STDERR"] == "''"  # child interpreters stay silent (accelerate reads their stderr)
    assert proc.stderr.count("transformer_engine is emulated by fp8sim") == 1
    # the banner comes from the parent before the child starts, so a trivial child shows --quiet's effect
    quiet = subprocess.run([*cmd[:4], "--quiet", "-c", "pass"], capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0 and "emulated by fp8sim" not in quiet.stderr
    loud = subprocess.run([*cmd[:4], "-c", "pass"], capture_output=True, text=True, timeout=300)
    assert loud.returncode == 0 and loud.stderr.count("emulated by fp8sim") == 1
    bad = subprocess.run([*cmd[:5], "cuda=xpu", cmd[-1]], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "expected 'cuda=cpu'" in bad.stderr


@pytest.mark.skipif(_te_really_installed(), reason="a real TransformerEngine is installed")
def test_te_tensor_submodules_resolve_where_tes_tests_import_them() -> None:
    import fp8sim.pytorch as fp8_te

    shim.install(quiet=True)
    try:
        from transformer_engine.pytorch import DType, Float8Quantizer
        from transformer_engine.pytorch.constants import TE_DType
        from transformer_engine.pytorch.tensor.float8_tensor import Float8Tensor
        from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer

        assert Float8Tensor is fp8_te.Float8Tensor and MXFP8Quantizer is fp8_te.MXFP8Quantizer
        assert Float8Quantizer is fp8_te.Float8Quantizer and DType is fp8_te.DType and TE_DType is not None
    finally:
        shim.uninstall()


def test_cli_run_hands_its_emulation_options_to_the_shim_before_the_script(monkeypatch, tmp_path) -> None:  # noqa: ANN001
    """`fp8sim run --device-map cuda=cpu --scaled-mm hopper_fast --quiet x.py --steps 3`: the three
    options reach the shim first, the script and its own arguments untouched after them."""
    import fp8sim.run.shim
    from fp8sim.cli import main

    script = tmp_path / "x.py"
    script.write_text("pass\n")
    seen = []
    monkeypatch.setattr(fp8sim.run.shim, "run", lambda argv: seen.append(argv) or 0)
    argv = ["run", "--device-map", "cuda=cpu", "--scaled-mm", "hopper_fast", "--quiet", str(script), "--steps", "3"]
    assert main(argv) == 0
    assert seen == [["--device-map", "cuda=cpu", "--scaled-mm", "hopper_fast", "--quiet", str(script), "--steps", "3"]]
    seen.clear()
    assert main(["run", "-m", "pytest", "--quiet"]) == 0  # after -m everything is the module's
    assert seen == [["-m", "pytest", "--quiet"]]
