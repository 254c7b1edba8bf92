"""The command line refuses what it cannot do, before doing any work: gates that would pass without
checking anything, unusable paths, out-of-range numbers, missing optional dependencies; ``fp8sim run``
takes its arguments as ``python`` does; Ctrl-C is one line and exit 130."""

from __future__ import annotations

import argparse
import dataclasses
import io
import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import fp8sim
from fp8sim import cli
from fp8sim._util import progress as _progress
from fp8sim.native.fileformat import read_bundle, write_bundle
from fp8sim.testing.oracles import require

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "reports" / "captures" / "cpu-torch2.13.fp8cap"


@pytest.fixture(scope="module")
def small_cap(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The committed CPU capture cut to its e4m3 casts, with torchao's ops marked skipped (as a
    capture made where torchao is not installed)."""
    header, arrays = read_bundle(COMMITTED)
    ops = [o for o in header["ops"] if o["name"].startswith("cast/e4m3/")]
    ops.append({"name": "torchao", "kind": "torchao_float8", "skipped": "torchao is not installed"})
    doc = {k: header[k] for k in ("meta", "suite", "suite_version")} | {"ops": ops}
    keep = {o["name"]: arrays[o["name"]] for o in ops if "skipped" not in o}
    return write_bundle(tmp_path_factory.mktemp("cap") / "small.fp8cap", keep, doc)


def _compare(cap: Path, *extra: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = cli.main(["compare", str(cap), "--no-progress", *extra])
    out, err = capsys.readouterr()
    return rc, out, err


# -- item 5: gates --------------------------------------------------------------------------------


def test_gate_on_a_glob_that_matches_nothing_fails_and_names_the_glob(small_cap: Path, capsys) -> None:  # noqa: ANN001
    rc, out, err = _compare(small_cap, "--require-bit-exact", "cast/*,scaled_mm/*", capsys=capsys)
    assert rc == 1 and "--require-bit-exact 'scaled_mm/*' matches no op" in err
    rc, out, err = _compare(small_cap, "--ops", "gemm/*", capsys=capsys)
    assert rc == 1 and "--ops 'gemm/*' matches no op" in err


def test_gate_whose_every_op_was_skipped_fails(small_cap: Path, capsys) -> None:  # noqa: ANN001
    rc, out, err = _compare(small_cap, "--require-bit-exact", "torchao*", capsys=capsys)
    assert rc == 1 and "'torchao*': all 1 matching ops were skipped (torchao is not installed)" in err
    rc, out, err = _compare(small_cap, "--ops", "torchao*", capsys=capsys)
    assert rc == 1


def test_compare_passes_a_real_gate_and_ends_with_one_summary_line(small_cap: Path, capsys) -> None:  # noqa: ANN001
    rc, out, err = _compare(small_cap, "--require-bit-exact", "cast/*", capsys=capsys)
    assert rc == 0, err
    assert out.splitlines()[-1] == "4 ops: 3 bit-exact, 0 not bit-exact, 1 skipped"


# -- item 6: paths --------------------------------------------------------------------------------


def _unwritable_dir(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        d = tmp_path / "ro"
        d.mkdir()
        d.chmod(0o500)
        return d
    if os.path.isdir("/proc/self"):
        return Path("/proc/self")  # not writable even for root
    pytest.skip("no unwritable folder available")


@pytest.fixture
def no_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    """Path errors must come before the work: the capture itself must never start."""
    from fp8sim.native import capture

    def fail(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("the capture ran before the path was checked")

    monkeypatch.setattr(capture, "capture", fail)


@pytest.mark.usefixtures("no_capture")
def test_capture_path_errors_are_one_line_before_the_work(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    require("torch")
    cases = {
        str(_unwritable_dir(tmp_path) / "x.fp8cap"): "cannot write in",
        str(tmp_path / ("n" * 300 + ".fp8cap")): "file name too long",
        str(tmp_path): "is a folder, not a file",
    }
    (tmp_path / "file").write_text("x")
    cases[str(tmp_path / "file" / "x.fp8cap")] = "is not a folder"
    for out, reason in cases.items():
        for force in ([], ["--force"]):
            assert cli.main(["capture", "--out", out, "--no-progress", *force]) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and out in err and reason in err, err


def test_report_study_and_compare_outputs_checked_before_the_work(
    small_cap: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: ANN001
    require("matplotlib")
    from fp8sim.report import build as report
    from fp8sim.report import training_study as study

    monkeypatch.setattr(report, "build_default_report", lambda *a, **k: pytest.fail("report ran"))
    monkeypatch.setattr(study, "run_study", lambda *a, **k: pytest.fail("study ran"))
    a_file = tmp_path / "file"
    a_file.write_text("x")
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    bad = {
        str(a_file): "is a file, not a folder",
        str(_unwritable_dir(tmp_path) / "out"): "cannot write in",
        str(foreign): "is a folder fp8sim did not write",
    }
    for out, reason in bad.items():
        for argv in (["report", "--out", out], ["study", "--out", out], ["compare", str(small_cap), "--report", out]):
            assert cli.main([*argv, "--no-progress"]) == 2, argv
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and out in err and reason in err, (argv, err)
    assert (foreign / "notes.txt").read_text() == "keep me"
    none = tmp_path / "none"
    assert cli.main(["report", "--out", str(tmp_path / "r"), "--captures", str(none), "--no-progress"]) == 2
    assert capsys.readouterr().err == f"fp8sim report: --captures {none}: no such folder\n"


def test_compare_report_replaces_its_own_folder_and_a_foreign_one_only_with_force(
    small_cap: Path, tmp_path: Path, capsys
) -> None:  # noqa: ANN001
    require("matplotlib")
    out = tmp_path / "cmp"
    for _ in range(2):  # the second run replaces the first (fp8sim's marker is there)
        assert cli.main(["compare", str(small_cap), "--report", str(out), "--no-progress"]) == 0
    text = (out / "report.md").read_text()
    assert "None" not in text and "compute capability" not in text  # CPU capture: unknown fields left out
    (out / ".fp8sim-output.json").unlink()
    assert cli.main(["compare", str(small_cap), "--report", str(out), "--no-progress"]) == 2
    assert cli.main(["compare", str(small_cap), "--report", str(out), "--no-progress", "--force"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cmp"]  # no temporary folder left


# -- item 7: numbers, run, dependencies, progress, help -------------------------------------------


@pytest.mark.parametrize("steps", ["0", "-3", "1.5", "many"])
def test_study_steps_out_of_range_is_a_usage_error(steps: str, capsys) -> None:  # noqa: ANN001
    with pytest.raises(SystemExit) as info:
        cli.main(["study", "--steps", steps, "--no-progress"])
    assert info.value.code == 2 and "--steps" in capsys.readouterr().err


def test_run_study_refuses_zero_steps() -> None:
    require("torch")
    from fp8sim.report.training_study import run_study

    with pytest.raises(ValueError, match="steps must be an int >= 1, got 0"):
        run_study(("fp32",), steps=0, progress=False)


def _fp8sim_run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "fp8sim", "run", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)


def test_run_takes_help_module_and_missing_script_as_python_does(tmp_path: Path) -> None:
    require("torch")
    res = _fp8sim_run("--help", cwd=tmp_path)
    assert res.returncode == 0 and "usage: fp8sim run" in res.stdout and "-m MODULE" in res.stdout
    (tmp_path / "probe_mod.py").write_text(
        "import sys, transformer_engine\nprint(transformer_engine.__fp8sim_emulation__ is not None, sys.argv[1:])\n"
    )
    res = _fp8sim_run("-m", "probe_mod", "-q", "--help", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "True ['-q', '--help']"  # the module's arguments reach it untouched
    res = _fp8sim_run("probe_mod", "x", cwd=tmp_path)  # a bare module name, as `fp8sim run pytest`
    assert res.stdout.strip() == "True ['x']"
    res = _fp8sim_run("/missing/script.py", cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.strip() == "fp8sim run: can't open file '/missing/script.py': [Errno 2] No such file or directory"


def test_missing_optional_dependency_is_one_line_with_the_pip_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:  # noqa: ANN001
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    out = tmp_path / "report"
    assert cli.main(["report", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err == "fp8sim report: fp8sim report needs matplotlib: pip install 'fp8sim[plot]'\n"
    assert not out.exists()
    monkeypatch.setitem(sys.modules, "torch", None)
    assert cli.main(["study", "--out", str(tmp_path / "s"), "--no-progress"]) == 2
    assert capsys.readouterr().err == "fp8sim study: fp8sim study needs torch: pip install 'fp8sim[torch]'\n"
    script = tmp_path / "x.py"
    script.write_text("pass\n")
    assert cli.main(["run", str(script)]) == 2  # checked without importing torch: the child imports it
    assert capsys.readouterr().err == "fp8sim run: fp8sim run needs torch: pip install 'fp8sim[torch]'\n"


def test_progress_bar_draws_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    require("tqdm")  # fp8sim[progress]; without it nothing is drawn (the next test)
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    for stream, drawn in ((io.StringIO(), False), (Tty(), True)):
        monkeypatch.setattr(sys, "stderr", stream)
        bar = _progress.Progress(2, True, prefix="x ")
        bar.step("a")
        bar.step("b")
        assert ("2/2" in stream.getvalue()) is drawn


def test_progress_bar_is_tqdm_and_optional(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bar is tqdm's (``fp8sim[progress]``); without tqdm nothing is drawn and nothing fails, and
    ``import fp8sim`` (with the CLI and the report modules) never imports it."""
    require("tqdm")

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Tty()
    monkeypatch.setattr(sys, "stderr", stream)
    bar = _progress.Progress(3, True, prefix="report ")
    for label in "abc":
        bar.step(label)
    assert "report: 100%" in stream.getvalue() and "3/3" in stream.getvalue()
    monkeypatch.setitem(sys.modules, "tqdm", None)  # `import tqdm` now raises ImportError
    stream = Tty()
    monkeypatch.setattr(sys, "stderr", stream)
    bar = _progress.Progress(2, True)
    bar.step("a")
    bar.step("b")
    assert stream.getvalue() == "" and not bar.enabled
    code = "import sys, fp8sim, fp8sim.cli, fp8sim.report, fp8sim.native.compare; print('tqdm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_help_documents_every_option_and_lists_the_recipes() -> None:
    ap = cli.build_parser()
    subs = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in subs.choices.items():
        for action in parser._actions:
            if action.option_strings:
                assert action.help, f"fp8sim {name} {action.option_strings[0]} has no help"
    from fp8sim.report.training_study import STUDY_RECIPES

    text = subs.choices["study"].format_help().replace("\n", " ")
    text = " ".join(text.split())
    assert all(r in text for r in STUDY_RECIPES)


def test_ctrl_c_prints_one_line_and_exits_130(monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # noqa: ANN001
    def interrupted(args):  # noqa: ANN001, ANN202
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_dispatch", interrupted)
    assert cli.main(["formats"]) == 130
    assert capsys.readouterr().err == "fp8sim formats: interrupted\n"


# -- items 10 and 11: the pieces owned here -------------------------------------------------------


def test_float_format_with_an_impossible_bias_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match=r"bias=-2000 .* must be in \[-113, 147\]"):
        fp8sim.FloatFormat("x", 4, 3, -2000)
    with pytest.raises(TypeError, match="bias must be an integer"):
        fp8sim.FloatFormat("x", 4, 3, 7.0)
    for f in fp8sim.FORMATS.values():  # every registered format is inside the range
        assert dataclasses.replace(f, bias=f.bias) == f  # rebuilt through __post_init__


def test_decode_takes_torch_uint16_uint32_uint64_codes() -> None:
    torch = require("torch")
    codes = np.arange(256, dtype=np.uint8)
    want = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)  # ml_dtypes is the oracle
    for dt in ("uint16", "uint32", "uint64"):
        if not hasattr(torch, dt):
            continue
        t = torch.from_numpy(codes.astype(np.int64)).to(getattr(torch, dt))
        got = fp8sim.decode(t, "e4m3").numpy()
        np.testing.assert_array_equal(got.view(np.uint32)[~np.isnan(want)], want.view(np.uint32)[~np.isnan(want)])
        assert np.isnan(got[np.isnan(want)]).all()
        with pytest.raises(ValueError, match="code 256 out of range for e4m3"):
            fp8sim.decode(torch.tensor([1, 256]).to(getattr(torch, dt)), "e4m3")
    with pytest.raises(ValueError, match=f"code {2**63 + 5} out of range"):
        fp8sim.decode(torch.tensor([2**63 + 5], dtype=torch.uint64), "e4m3")


def test_ml_dtypes_float8_e5m2_arrays_are_accepted_as_input() -> None:
    x = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e5m2)
    want = x.astype(np.float32).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)  # ml_dtypes' non-saturating cast
    got = fp8sim.encode(x, "e4m3", saturate=False)
    nan = np.isnan(x.astype(np.float32))
    assert (got[~nan] == want[~nan]).all() and (got[nan] & 0x7F == 0x7F).all()


# -- items 12 and 14: study threads, readable plots ----------------------------------------------


def test_run_study_trains_with_one_torch_thread_and_restores_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's default (a thread per core) made the study ten times slower on a loaded CPU."""
    torch = require("torch")
    from fp8sim.report import training_study as study

    seen = []
    monkeypatch.setattr(study, "_train_all", lambda *a: seen.append(torch.get_num_threads()) or "done")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert study.run_study(("fp32",), steps=1, progress=False) == "done"
        assert seen == [1] and torch.get_num_threads() == 2
        study.run_study(("fp32",), steps=1, progress=False, threads=None)
        assert seen == [1, 2]
    finally:
        torch.set_num_threads(before)


def test_plots_have_titles_legends_beside_the_data_and_e8m0_on_its_own_axis() -> None:
    require("torch")
    plt = require("matplotlib.pyplot")
    from fp8sim.report._plots import grid_figure
    from fp8sim.report.training_study import StudyResult, plot_losses

    fig = grid_figure()
    top, bottom = fig.axes
    assert [t.get_text() for t in top.get_yticklabels()] == [n for n in fp8sim.FORMATS if n != "e8m0"]
    assert [t.get_text() for t in bottom.get_yticklabels()] == ["e8m0"]
    assert top.get_xlim()[0] > 2.0**-30 and bottom.get_xlim()[0] < 2.0**-120  # E8M0 does not squash the rest
    assert fig._suptitle.get_text()
    plt.close(fig)
    res = StudyResult(["fp32", "current", "unsound_e4m3_grads_unscaled"])
    res.losses = {r: [2.0 - 0.01 * i + 0.1 * j for i in range(20)] for j, r in enumerate(res.recipes)}
    fig = plot_losses(res)
    ax = fig.axes[0]
    assert ax.get_title()
    legend = ax.get_legend()
    assert legend is not None and legend.get_bbox_to_anchor().x0 > ax.get_window_extent().x1  # beside the axes
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert lines["unsound_e4m3_grads_unscaled"].get_linewidth() > lines["fp32"].get_linewidth()
    colors = [ln.get_color() for ln in ax.get_lines()]
    assert len(set(map(str, colors))) == len(colors)  # every run its own colour
    plt.close(fig)
