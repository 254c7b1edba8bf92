"""The FP8 training study: sound recipes end near fp32, an unsound set-up is measurably worse."""

from __future__ import annotations

from fp8sim.testing.oracles import require

require("torch")

from fp8sim import cli  # noqa: E402
from fp8sim.report.training_study import run_study, write_study  # noqa: E402

# Tolerances on the final loss relative to fp32 (mean of the last 10 steps, 60 steps of training):
# FP8 recipes with scaling stay within 3% (NVFP4, 4-bit elements: 15%); E4M3 gradients without
# scaling flush about a fifth of the gradient elements to zero and end at least 5% worse.
SOUND = {"bf16": 1.01, "delayed_hybrid": 1.03, "current": 1.03, "mxfp8": 1.03, "block": 1.03, "nvfp4": 1.15}


def test_sound_recipes_track_fp32_and_the_unsound_one_does_not(tmp_path) -> None:  # noqa: ANN001
    recipes = ("fp32", *SOUND, "unsound_e4m3_grads_unscaled")
    res = run_study(recipes, steps=60, progress=False)
    ref = res.final("fp32")
    for name, tol in SOUND.items():
        assert res.final(name) <= tol * ref, f"{name}: {res.final(name):.4f} vs fp32 {ref:.4f}"
    unsound = res.final("unsound_e4m3_grads_unscaled")
    assert unsound >= 1.05 * ref, f"unsound {unsound:.4f} vs fp32 {ref:.4f}"
    assert res.stats["unsound_e4m3_grads_unscaled"]["underflow"] > 10 * res.stats["delayed_hybrid"]["underflow"]
    require("matplotlib")
    md = write_study(res, tmp_path)
    assert "| delayed_hybrid |" in md.read_text()
    assert (tmp_path / "losses.png").stat().st_size > 10_000 and (tmp_path / "losses.csv").exists()


def test_study_cli_and_bad_recipe(tmp_path, capsys) -> None:  # noqa: ANN001
    require("matplotlib")
    assert (
        cli.main(["study", "--out", str(tmp_path), "--steps", "5", "--recipes", "fp32,current", "--no-progress"]) == 0
    )
    assert "| current |" in capsys.readouterr().out
    assert cli.main(["study", "--recipes", "fp64", "--no-progress"]) == 2
