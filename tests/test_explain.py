"""``fp8sim explain`` and ``fp8sim.pytorch.explain`` (issue 26.3): every GEMM of a step listed with its module,
role, shape, formats, output dtype, accumulator and split-K decision, and where the decision came from.

The shapes expected below are TE's (``module/linear.py``: fprop ``x W^T`` (T, O, I), dgrad ``dy W`` (T, I, O),
wgrad ``dy^T x`` (O, I, T)); the decisions' oracle is mmaemu 0.1.0's ``resolve_splitk`` under ``ada-te``
(only decisions it marks verified count as known).  Each model is first explained (the cheap default path,
unknown splits listed), then run under the profile with those splits given (``with_splits``), every GEMM
computed by the profile."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")
torch.set_num_threads(1)

import fp8sim.pytorch as te  # noqa: E402
from fp8sim.gemm import SplitKUnknownError, get_profile  # noqa: E402
from fp8sim.recipe import DelayedScaling  # noqa: E402

RTX_TE = "rtx4060_cublaslt_12_8_te"
_FMT = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
_OUT = {"bfloat16": torch.bfloat16, "float32": torch.float32, "e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def _mmaemu_decision(p, profile: str = "ada-te") -> tuple | None:  # noqa: ANN001
    """mmaemu's verified (S, scheme) for the plan's GEMM under ``profile``, else None."""
    from mmaemu.errors import SplitKUnknownError as MmaemuUnknown
    from mmaemu.platform.splitk_table import resolve_splitk

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            d = resolve_splitk(
                p.m, p.n, p.k, a_dtype=_FMT[p.a_format], b_dtype=_FMT[p.b_format], out_dtype=_OUT[p.out_dtype],
                use_fast_accum=p.use_fast_accum, profile=profile, dry=True,
            )  # fmt: skip
        except MmaemuUnknown:
            return None
    return (d.S, d.scheme) if d.verified else None


def _check_against_mmaemu(rec) -> None:  # noqa: ANN001
    for p in rec.plans:
        want = _mmaemu_decision(p)
        got = None if p.source == "unknown" else (p.split, p.scheme)
        assert got == want, f"{p.module} {p.role} {p.m}x{p.n}x{p.k}: plan {got}, mmaemu {want}"
        assert p.profile == RTX_TE and p.accumulator == ("ada_fast" if p.use_fast_accum else "ada_split")


def _explain_then_run(model, inputs, recipe=None) -> tuple:  # noqa: ANN001, ANN202
    """The dry table, then the step computed under the profile with the unknown splits given as unsplit."""
    dry = te.explain(model, inputs, recipe=recipe or DelayedScaling(), accumulator=RTX_TE)
    given = get_profile(RTX_TE).with_splits({(p.m, p.n, p.k): (1, "none") for p in dry.unknown})
    run = te.explain(model, inputs, recipe=recipe or DelayedScaling(), accumulator=given, compute=True)
    shapes = lambda rec: [(p.module, p.gemm, p.role, p.m, p.n, p.k) for p in rec.plans]  # noqa: E731
    assert shapes(run) == shapes(dry)
    assert all(p.source in ("table", "envelope", "override", "cudnn") for p in run.plans)
    assert {p.source for p in run.plans if (p.m, p.n, p.k) in {(q.m, q.n, q.k) for q in dry.unknown}} <= {"override"}
    return dry, run


def test_layernorm_mlp_lists_six_gemms_with_their_own_decisions() -> None:
    require("mmaemu")
    torch.manual_seed(0)
    mlp = te.LayerNormMLP(128, 256, params_dtype=torch.bfloat16)
    x = torch.randn(32, 128, dtype=torch.bfloat16, requires_grad=True)
    dry, run = _explain_then_run(mlp, x)
    rows = {(p.gemm, p.role): (p.m, p.n, p.k, p.a_format, p.b_format) for p in dry.plans}
    assert rows == {
        ("fc1", "fprop"): (32, 256, 128, "e4m3", "e4m3"),
        ("fc1", "dgrad"): (32, 128, 256, "e5m2", "e4m3"),
        ("fc1", "wgrad"): (256, 128, 32, "e5m2", "e4m3"),
        ("fc2", "fprop"): (32, 128, 256, "e4m3", "e4m3"),
        ("fc2", "dgrad"): (32, 256, 128, "e5m2", "e4m3"),
        ("fc2", "wgrad"): (128, 256, 32, "e5m2", "e4m3"),
    }
    _check_against_mmaemu(dry)
    assert "fc1" in dry.table() and "LayerNormMLP" in dry.table()
    assert x.grad is not None


def test_grouped_linear_lists_each_groups_gemms() -> None:
    """TE's grouped GEMM is one cuBLASLt call per group (``multi_stream_cublas_gemm``): each group's M decides."""
    require("mmaemu")
    torch.manual_seed(1)
    model = torch.nn.ModuleDict({"experts": te.GroupedLinear(2, 128, 64, params_dtype=torch.bfloat16)})
    x = torch.randn(64, 128, dtype=torch.bfloat16, requires_grad=True)

    class Wrap(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.experts = model["experts"]

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.experts(x, [16, 48])

    dry, _ = _explain_then_run(Wrap(), x)
    fprop = {p.gemm: (p.m, p.n, p.k) for p in dry.plans if p.role == "fprop"}
    wgrad = {p.gemm: (p.m, p.n, p.k) for p in dry.plans if p.role == "wgrad"}
    assert fprop == {"gemm0": (16, 64, 128), "gemm1": (48, 64, 128)}
    assert wgrad == {"gemm0": (64, 128, 16), "gemm1": (64, 128, 48)}
    assert {p.module for p in dry.plans} == {"experts"}
    _check_against_mmaemu(dry)


def test_transformer_layer_step_lists_every_gemm_attention_included() -> None:
    """QKV, proj, fc1, fc2 x (fprop, dgrad, wgrad), and with ``fp8_dpa`` the six FP8 attention GEMMs (cuDNN's:
    the profile's fast preset, no split-K)."""
    require("mmaemu")
    torch.manual_seed(2)
    layer = te.TransformerLayer(128, 256, 4, params_dtype=torch.bfloat16, hidden_dropout=0.0, attention_dropout=0.0)
    x = torch.randn(16, 2, 128, dtype=torch.bfloat16, requires_grad=True)
    dry, run = _explain_then_run(layer, x, DelayedScaling(fp8_dpa=True))
    linear = {(p.module, p.gemm, p.role) for p in dry.plans if p.role in ("fprop", "dgrad", "wgrad")}
    modules = {
        ("self_attention.layernorm_qkv", ""),
        ("self_attention.proj", ""),
        ("layernorm_mlp", "fc1"),
        ("layernorm_mlp", "fc2"),
    }
    assert linear == {(m, g, r) for m, g in modules for r in ("fprop", "dgrad", "wgrad")}
    attention = [p for p in dry.plans if p.module == "self_attention.core_attention"]
    assert sorted(p.role for p in attention) == sorted(["QK^T", "PV", "dV", "dP", "dQ", "dK"])
    assert all(p.source == "cudnn" and p.split == 1 and p.accumulator == "ada_fast" for p in attention)
    assert all(p.batch == 8 for p in attention)  # batch 2 x 4 heads
    _check_against_mmaemu(type(dry)(plans=[p for p in dry.plans if p.source != "cudnn"]))


def test_tensor_parallel_shards_are_listed_with_their_shard_shapes() -> None:
    """Column- then row-parallel ``Linear`` with sequence parallelism on 2 ranks: the column GEMMs run on the
    gathered sequence and half the output features, the row GEMMs on half the input features."""
    dist = require("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is needed")
    require("mmaemu")
    from _dist import ranks
    from _explain_tp import F, H, T, explain_tp_worker

    for res in ranks(explain_tp_worker, world_size=2):
        shapes = {(m, r): (mm, nn, kk) for m, r, mm, nn, kk, _, _ in res["dry"]}
        assert shapes == {
            ("0", "fprop"): (T, F // 2, H),
            ("0", "dgrad"): (T, H, F // 2),
            ("0", "wgrad"): (F // 2, H, T),
            ("1", "fprop"): (T, H, F // 2),
            ("1", "dgrad"): (T, F // 2, H),
            ("1", "wgrad"): (H, F // 2, T),
        }
        assert [r[:5] for r in res["run"]] == [r[:5] for r in res["dry"]]
        assert all(r[6] in ("table", "envelope", "override") for r in res["run"]) and res["grad"]


def test_compute_raises_where_the_dry_run_lists_an_unknown_split() -> None:
    require("mmaemu")
    m = te.Linear(2048, 64, params_dtype=torch.bfloat16, name="proj")
    x = torch.randn(16, 2048, dtype=torch.bfloat16, requires_grad=True)
    dry = te.explain(m, x, accumulator=RTX_TE)
    assert [(p.role, p.split, p.source) for p in dry.plans] == [
        ("fprop", 3, "table"),
        ("dgrad", None, "unknown"),
        ("wgrad", None, "unknown"),
    ]
    table = dry.table()
    assert "with_splits({(16, 2048, 64): (S, scheme), (64, 2048, 16): (S, scheme)})" in table
    with pytest.raises(SplitKUnknownError, match="dgrad GEMM of 'proj'"):
        te.explain(m, x, accumulator=RTX_TE, compute=True)
    fwd = te.explain(m, x, accumulator=RTX_TE, compute=True, backward=False)
    assert [p.role for p in fwd.plans] == ["fprop"]


def test_without_a_profile_the_plan_names_the_preset_or_the_default_path() -> None:
    m = te.Linear(64, 32)
    x = torch.randn(16, 64, requires_grad=True)
    default = te.explain(m, x)
    assert {(p.accumulator, p.source, p.split) for p in default.plans} == {("torch.matmul fp32", "default", 1)}
    hopper = te.explain(m, x, accumulator="hopper")
    assert [(p.role, p.accumulator) for p in hopper.plans] == [
        ("fprop", "hopper_fast"),
        ("dgrad", "hopper_split"),
        ("wgrad", "hopper_split"),
    ]
    assert {p.source for p in hopper.plans} == {"preset"}


def test_record_gemm_plans_takes_general_gemm_and_torchao() -> None:
    require("mmaemu")
    from fp8sim.pytorch import DType, Float8Quantizer
    from fp8sim.pytorch.cpp_extensions import general_gemm
    from fp8sim.torchao import Float8Linear, Float8LinearConfig

    q = Float8Quantizer(torch.ones(1), torch.zeros(1), DType.kFloat8E4M3)
    lin = Float8Linear.from_float(
        torch.nn.Linear(2048, 64, bias=False), config=Float8LinearConfig(), accumulator="rtx4060_cublaslt_12_8"
    )
    with te.record_gemm_plans(model=lin, dry=True) as rec:
        general_gemm(q(torch.randn(64, 2048)), q(torch.randn(16, 2048)), out_dtype=torch.bfloat16, accumulator=RTX_TE)
        lin(torch.randn(16, 2048))
    gg, ao = rec.plans
    assert (gg.module, gg.role, gg.m, gg.n, gg.k, gg.split, gg.scheme) == (
        "general_gemm",
        "fprop",
        16,
        64,
        2048,
        3,
        "pairwise",
    )
    assert (ao.module, ao.role, ao.m, ao.n, ao.k, ao.profile) == (
        "Float8Linear",
        "fprop",
        16,
        64,
        2048,
        "rtx4060_cublaslt_12_8",
    )
    assert (ao.split, ao.scheme) == _mmaemu_decision(ao, "ada") and ao.source == "table"  # torch's caller's table


def test_plans_serialise_with_a_format_version() -> None:
    m = te.Linear(64, 32)
    rec = te.explain(m, torch.randn(16, 64, requires_grad=True), accumulator="ada")
    d = json.loads(rec.to_json())
    assert d["format"] == "fp8sim-gemm-plans/1" and [p["role"] for p in d["plans"]] == ["fprop", "dgrad", "wgrad"]
    assert all(p["calls"] == 1 for p in d["plans"])


def test_explain_refuses_a_backward_without_grad() -> None:
    with pytest.raises(ValueError, match="backward=False"):
        te.explain(te.Linear(64, 32), torch.randn(16, 64), backward=True, loss=lambda out: out.detach())


# -- the command line ----------------------------------------------------------------------------------


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``fp8sim explain ARGS`` in a fresh interpreter (what a user runs)."""
    return subprocess.run(
        [sys.executable, "-m", "fp8sim", "explain", *args], capture_output=True, text=True, cwd=cwd, timeout=600
    )


def _main(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, folder: Path, *args: str) -> tuple:
    """``fp8sim explain ARGS`` in this process, run from ``folder``: (exit status, stdout, stderr)."""
    from fp8sim import cli

    monkeypatch.chdir(folder)
    monkeypatch.syspath_prepend(str(folder))
    sys.modules.pop("build_model", None)
    status = cli.main(["explain", *args])
    out = capsys.readouterr()
    return status, out.out, out.err


def _write(folder: Path) -> None:
    (folder / "build_model.py").write_text(
        textwrap.dedent(
            """
            import torch
            import transformer_engine.pytorch as te

            def build():
                torch.manual_seed(0)
                return te.LayerNormMLP(64, 128, name="mlp"), torch.randn(16, 64, requires_grad=True)

            def wrong():
                return 3

            def projection():  # its dgrad and wgrad are not in the RTX 4060 TE table
                torch.manual_seed(0)
                layer = te.Linear(2048, 64, params_dtype=torch.bfloat16)
                return layer, torch.randn(16, 2048, dtype=torch.bfloat16, requires_grad=True)
            """
        )
    )
    (folder / "train.py").write_text(
        textwrap.dedent(
            """
            import sys
            import torch
            import transformer_engine.pytorch as te
            from transformer_engine.common.recipe import Float8CurrentScaling

            layer = te.Linear(64, 32)
            for _ in range(int(sys.argv[1])):
                with te.autocast(recipe=Float8CurrentScaling()):
                    layer(torch.randn(16, 64)).sum().backward()
            """
        )
    )


def test_cli_explains_a_callable_and_a_script(tmp_path: Path, capsys, monkeypatch) -> None:  # noqa: ANN001
    require("mmaemu")
    _write(tmp_path)
    r = _cli("--accumulator", RTX_TE, "--json", "plans.json", "build_model:build", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "mlp (fc1)" in r.stdout and "wgrad" in r.stdout and RTX_TE in r.stdout
    d = json.loads((tmp_path / "plans.json").read_text())
    assert d["format"] == "fp8sim-gemm-plans/1" and len(d["plans"]) == 6
    status, _, err = _main(capsys, monkeypatch, tmp_path, "--json", "plans.json", "build_model:build")
    assert status == 2 and "--force" in err  # an existing file is not overwritten
    status, _, err = _main(capsys, monkeypatch, tmp_path, "--json", "plans.json", "--force", "build_model:build")
    assert status == 0 and json.loads((tmp_path / "plans.json").read_text())["plans"][0]["profile"] is None
    status, out, err = _main(
        capsys, monkeypatch, tmp_path, "--forward-only", "--recipe", "Float8CurrentScaling", "build_model.py:build"
    )
    assert status == 0, err
    assert out.count("fprop") == 2 and "dgrad" not in out
    status, out, err = _main(capsys, monkeypatch, tmp_path, "--accumulator", "hopper", "train.py", "3")
    assert status == 0, err
    lines = [ln.split() for ln in out.splitlines() if ln.startswith("Linear")]
    assert [(ln[1], ln[-1]) for ln in lines] == [("fprop", "3"), ("dgrad", "3"), ("wgrad", "3")]  # calls


def test_cli_compute_runs_the_gemms_with_the_accumulator(tmp_path: Path, capsys, monkeypatch) -> None:  # noqa: ANN001
    """``--compute``: an unknown split-K stops the run (the dry run lists it)."""
    require("mmaemu")
    _write(tmp_path)
    status, out, _ = _main(capsys, monkeypatch, tmp_path, "--accumulator", RTX_TE, "build_model:projection")
    assert status == 0 and "unknown" in out
    status, out, err = _main(
        capsys, monkeypatch, tmp_path, "--compute", "--accumulator", RTX_TE, "build_model:projection"
    )
    assert status == 1 and "dgrad GEMM of 'Linear'" in err and "Traceback" not in err
    status, out, err = _main(capsys, monkeypatch, tmp_path, "--compute", "--accumulator", RTX_TE, "build_model:build")
    assert status == 0 and "unknown" not in out, err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nothing"], "expected MODULE:CALLABLE, FILE.py:CALLABLE or SCRIPT.py"),
        (["build_model:missing"], "has no callable 'missing'"),
        (["build_model:wrong"], "must return (model, inputs)"),
        (["no_such_module:build"], "cannot import module 'no_such_module'"),
        (["--recipe", "DelayedScaling", "train.py", "1"], "--recipe applies to MODULE:CALLABLE"),
        (["--forward-only", "train.py", "1"], "--forward-only applies to MODULE:CALLABLE"),
        (["build_model:build", "extra"], "only a SCRIPT.py takes arguments"),
        (["--accumulator", "hopper-te", "build_model:build"], "mmaemu's 'hopper-te' is fp8sim's"),
        (["missing.py"], "no such file"),
    ],
)
def test_cli_refuses_bad_targets_naming_them(tmp_path: Path, capsys, monkeypatch, args: list, message: str) -> None:  # noqa: ANN001
    _write(tmp_path)
    status, _, err = _main(capsys, monkeypatch, tmp_path, *args)
    assert status == 2 and message in err, err
