"""capture -> compare round trip on the CPU, file-format integrity, and the default report."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest

from fp8sim import cli
from fp8sim.gemm import torch_cpu_kernel
from fp8sim.native.compare import compare_capture
from fp8sim.native.fileformat import CaptureFileError, read_bundle, write_bundle
from fp8sim.testing.oracles import require

torch = require("torch")


@pytest.fixture(scope="module")
def cap(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fp8sim.native.capture import capture

    # the fallback kernel on every host: an AMX host's oneDNN kernel sums in an order fp8sim does not
    # reproduce (fp8sim.gemm.torch_cpu); test_capture_records_the_torch_cpu_kernel covers that host's own
    return capture(
        tmp_path_factory.mktemp("cap") / "cpu.fp8cap", suite="quick", progress=False, torch_cpu_kernel="fallback"
    )


def test_fresh_cpu_capture_is_bit_exact_under_the_torch_cpu_convention(cap: Path) -> None:
    res = compare_capture(cap)
    casts = [o for o in res.ops if o.kind == "cast"]
    assert len(casts) == 15 and all(o.emulator == "convention torch_eager" for o in casts)
    assert all(o.bit_exact == o.n > 0 for o in casts), [(o.name, o.rate) for o in casts if o.rate < 1]
    gemms = [o for o in res.ops if o.kind == "scaled_mm"]
    assert gemms and all(o.rate == 1.0 for o in gemms)  # the CPU kernel is dequantize + fp32 BLAS
    assert res.meta["device"] == "cpu" and res.meta["torch"] == torch.__version__
    assert res.meta["torch_cpu_kernel"] == "fallback" and res.meta["mkldnn_enabled"] == "no"
    assert all(o.extra["torch_cpu_kernel"] == "fallback" for o in gemms)


def _with_meta(cap: Path, tmp_path: Path, name: str, **meta: str | None) -> Path:
    header, arrays = read_bundle(cap)
    doc = {k: header[k] for k in ("meta", "ops", "suite", "suite_version")}
    doc["meta"] = {k: v for k, v in {**doc["meta"], **meta}.items() if v is not None}
    return write_bundle(tmp_path / name, arrays, doc)


def test_a_capture_from_an_amx_host_is_compared_with_the_onednn_model_and_explained(
    cap: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The capture's record decides the model: same-dtype tensorwise GEMMs of an AMX-INT8 host took oneDNN
    (accumulator cpu_onednn, not claimed bit-exact), mixed dtypes without AMX-FP16 and rowwise the fallback."""
    amx = _with_meta(
        cap, tmp_path, "amx.fp8cap", cpu_amx_int8="yes", cpu_amx_fp16="no", mkldnn_enabled="yes",
        torch_cpu_kernel="onednn", torch_cpu_kernel_mixed="fallback", onednn="3.12.0",
    )  # fmt: skip
    res = compare_capture(amx)
    gemms = [o for o in res.ops if o.kind == "scaled_mm"]
    for o in gemms:
        onednn = o.extra["layout"] == "tensorwise" and o.extra["formats"] in ("e4m3xe4m3", "e5m2xe5m2")
        assert o.extra["torch_cpu_kernel"] == ("onednn" if onednn else "fallback"), o.name
        assert ("cpu_onednn" in o.emulator and "not reproduced" in o.emulator) == onednn, o.name
    assert any(o.extra["torch_cpu_kernel"] == "onednn" for o in gemms)
    assert any("cpu_onednn" in n and "--torch-cpu-kernel fallback" in n for n in res.notes)
    if torch_cpu_kernel() == "fallback":
        assert any("this host runs fallback" in n for n in res.notes)
    assert cli.main(["compare", str(amx), "--ops", "scaled_mm/*", "--no-progress"]) == 0
    assert "NOTE: captured where torch's CPU _scaled_mm runs onednn (AMX-INT8" in capsys.readouterr().out
    old = compare_capture(_with_meta(cap, tmp_path, "old.fp8cap", torch_cpu_kernel=None))
    assert any("does not record which torch CPU _scaled_mm kernel" in n for n in old.notes)
    assert all(o.emulator == "accumulator dequantized_fp32" for o in old.ops if o.kind == "scaled_mm")


def test_capture_refuses_an_unknown_torch_cpu_kernel(tmp_path: Path) -> None:
    from fp8sim.native.capture import capture

    with pytest.raises(ValueError, match="torch_cpu_kernel must be one of auto, fallback; got 'onednn'"):
        capture(tmp_path / "x.fp8cap", torch_cpu_kernel="onednn")
    assert not list(tmp_path.iterdir())


def test_one_flipped_output_is_reported_exactly(cap: Path, tmp_path: Path) -> None:
    header, arrays = read_bundle(cap)
    key = "cast/e4m3/bf16_all"
    flipped = arrays[key].copy()
    flipped[0x3F80] ^= 0x01  # bfloat16 1.0 -> code 0x38 becomes 0x39
    arrays[key] = flipped
    doc = {k: header[k] for k in ("meta", "ops", "suite", "suite_version")}
    bad = write_bundle(tmp_path / "flipped.fp8cap", arrays, doc)
    res = compare_capture(bad)
    wrong = [o for o in res.ops if o.bit_exact < o.n]
    assert [o.name for o in wrong] == [key]
    assert wrong[0].n - wrong[0].bit_exact == 1
    assert wrong[0].clusters["normal"][1] == 1
    assert cli.main(["compare", str(bad), "--require-bit-exact", "cast/*", "--no-progress"]) == 1
    assert cli.main(["compare", str(bad), "--require-bit-exact", "scaled_mm/*", "--no-progress"]) == 0
    only = compare_capture(bad, ops=["cast/e4m3/*"])
    assert [o.name for o in only.ops] == ["cast/e4m3/f16_all", "cast/e4m3/bf16_all", "cast/e4m3/f32_special"]
    args = ["compare", str(bad), "--ops", "cast/e5m2/*", "--require-bit-exact", "cast/*", "--no-progress"]
    assert cli.main(args) == 0


def test_corrupt_truncated_and_newer_files_are_refused(cap: Path, tmp_path: Path) -> None:
    data = bytearray(cap.read_bytes())
    # one byte changed inside a stored member's data
    with zipfile.ZipFile(cap) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(".npy"))
    data[info.header_offset + 30 + len(info.filename) + 5] ^= 0xFF
    corrupt = tmp_path / "corrupt.fp8cap"
    corrupt.write_bytes(bytes(data))
    with pytest.raises(CaptureFileError, match="corrupt|truncated"):
        read_bundle(corrupt)
    trunc = tmp_path / "trunc.fp8cap"
    trunc.write_bytes(cap.read_bytes()[: len(data) // 2])
    with pytest.raises(CaptureFileError, match="truncated or not a capture file"):
        read_bundle(trunc)
    header, arrays = read_bundle(cap)
    newer = tmp_path / "newer.fp8cap"
    write_bundle(newer, arrays, {k: header[k] for k in ("meta", "ops")})
    with zipfile.ZipFile(newer) as z:
        members = {n: z.read(n) for n in z.namelist()}
    members["__meta__.json"] = members["__meta__.json"].replace(b'"version": 1', b'"version": 99')
    with zipfile.ZipFile(newer, "w") as z:
        for n, b in members.items():
            z.writestr(n, b)
    with pytest.raises(CaptureFileError, match="version 99, newer than this fp8sim reads"):
        read_bundle(newer)
    assert cli.main(["compare", str(trunc), "--no-progress"]) == 2


def test_existing_file_is_not_overwritten_and_no_partial_file_is_left(
    cap: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = cap.read_bytes()
    with pytest.raises(FileExistsError, match="--force"):
        write_bundle(cap, {"x": np.zeros(3)}, {"meta": {}, "ops": []})
    assert cap.read_bytes() == before
    assert cli.main(["capture", "--out", str(cap), "--no-progress"]) == 2

    from fp8sim.native import fileformat

    def boom(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise OSError("disk full")

    monkeypatch.setattr(fileformat.np, "save", boom)
    target = tmp_path / "never.fp8cap"
    with pytest.raises(OSError, match="disk full"):
        write_bundle(target, {"x": np.zeros(3)}, {"meta": {}, "ops": []})
    assert not target.exists() and not list(tmp_path.glob(".never*"))


def test_compare_report_and_default_report_write_what_they_name(cap: Path, tmp_path: Path) -> None:
    require("matplotlib")
    assert cli.main(["compare", str(cap), "--report", str(tmp_path / "cmp"), "--no-progress"]) == 0
    md = (tmp_path / "cmp" / "report.md").read_text()
    for png in ("gemm_error_vs_k.png", "bit_exact_rates.png"):
        assert f"({png})" in md and (tmp_path / "cmp" / png).stat().st_size > 5000
    caps = tmp_path / "caps"
    caps.mkdir()
    (caps / "cpu.fp8cap").write_bytes(cap.read_bytes())
    (caps / "broken.fp8cap").write_bytes(cap.read_bytes()[:1000])  # one truncated file: reported, skipped
    out = tmp_path / "report"
    assert cli.main(["report", "--out", str(out), "--captures", str(caps), "--quick", "--no-progress"]) == 0
    text = (out / "README.md").read_text()
    assert "- `broken.fp8cap`: **not compared**:" in text and "truncated" in text
    assert "None" not in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["caps", "cmp", "report"]  # published whole, no temporaries
    for png in ("format_grids.png", "scaling_snr.png", "error_vs_k.png", "attention_leak.png"):
        assert f"({png})" in text and (out / png).stat().st_size > 5000
    assert "ops bit-exact" in text and (out / "captures" / "cpu" / "report.md").exists()
    assert "torch CPU kernel **fallback** (amx_int8 " in text  # which torch CPU kernel recorded it
    assert "torch CPU `_scaled_mm` kernel: **fallback**" in (out / "captures" / "cpu" / "report.md").read_text()
    assert "ml_dtypes " in text and "follow its rule `ml_dtypes_0_" in text  # the oracle's version and rule


def test_the_main_job_writes_outside_the_tracked_files() -> None:
    """``fp8sim report`` and ``fp8sim study`` default to folders that .gitignore lists, so running
    the README's first command leaves ``git status`` clean."""
    import subprocess

    from fp8sim import report

    root = Path(__file__).resolve().parents[1]
    ignored = (root / ".gitignore").read_text().splitlines()
    for default in (cli.DEFAULT_REPORT, cli.DEFAULT_STUDY):
        assert f"/{default}/" in ignored
    assert report.DEFAULT_OUT == cli.DEFAULT_REPORT
    parser = cli.build_parser()
    assert parser.parse_args(["report"]).out == cli.DEFAULT_REPORT
    assert parser.parse_args(["study"]).out == cli.DEFAULT_STUDY
    try:
        tracked = subprocess.run(
            ["git", "ls-files", cli.DEFAULT_REPORT, cli.DEFAULT_STUDY], cwd=root, capture_output=True, text=True
        )
    except OSError:
        return
    if tracked.returncode == 0:
        assert tracked.stdout == ""
