"""``fp8sim compare`` infers the split-K of a mismatching captured ``_scaled_mm``: synthetic GPU
captures whose outputs mmaemu 0.1.0 computed with a known split (an independent model of cuBLASLt
12.8's split-K, ``mmaemu/model/plan.py``)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fp8sim.native.compare import compare_capture
from fp8sim.native.fileformat import write_bundle
from fp8sim.native.infer_split import infer_split
from fp8sim.native.suite import SUITE_VERSION, GemmCase, gemm_operands
from fp8sim.testing.oracles import require

torch = require("torch")
mmaemu = require("mmaemu")
torch.set_num_threads(1)


def _mmaemu_bits(case: GemmCase, profile: str, split) -> np.ndarray:  # noqa: ANN001
    a, b, sa, sb = gemm_operands(case)
    fa = getattr(torch, {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}[case.a_format])
    fb = getattr(torch, {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}[case.b_format])
    at = torch.from_numpy(a).view(fa)
    bt = torch.from_numpy(np.ascontiguousarray(b.T)).view(fb).t()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = getattr(torch, case.out_dtype)
        sa, sb = torch.from_numpy(sa), torch.from_numpy(sb)
        d = mmaemu.scaled_mm(
            at, bt, sa, sb, out_dtype=out, use_fast_accum=case.fast_accum, profile=profile, splitk=split
        )
    return (d.view(torch.int32) if case.out_dtype == "float32" else d.view(torch.int16)).numpy()


def _capture(tmp_path, cc: tuple[int, int], entries: list) -> str:  # noqa: ANN001
    ops, arrays = [], {}
    for case, bits in entries:
        ops.append({"name": case.name, "kind": "scaled_mm", **case.to_dict()})
        arrays[case.name] = bits
    meta = {"device": "cuda", "device_name": f"synthetic sm_{cc[0]}{cc[1]}", "compute_capability": list(cc),
            "torch": "2.7.1", "cuda": "12.8", "driver": None, "fp8sim": "test", "date": "2026-12-01"}  # fmt: skip
    doc = {"meta": meta, "ops": ops, "suite": "quick", "suite_version": SUITE_VERSION}
    return str(write_bundle(tmp_path / f"sm{cc[0]}{cc[1]}.fp8cap", arrays, doc))


def test_compare_reports_the_split_a_hopper_capture_was_made_with(tmp_path, capsys) -> None:  # noqa: ANN001
    split = GemmCase(16, 16, 1024, "e4m3", "e4m3", "tensorwise", True, "float32", 11)
    unsplit = GemmCase(16, 16, 256, "e4m3", "e4m3", "tensorwise", True, "bfloat16", 12)
    tampered = GemmCase(16, 16, 1024, "e5m2", "e4m3", "tensorwise", True, "float32", 13)
    bad = _mmaemu_bits(tampered, "hopper", (3, "contiguous")).copy()
    bad[0, 0] ^= 1  # one output no candidate gives
    path = _capture(
        tmp_path,
        (9, 0),
        [(split, _mmaemu_bits(split, "hopper", (3, "contiguous"))), (unsplit, _mmaemu_bits(unsplit, "hopper", 1)),
         (tampered, bad)],
    )  # fmt: skip
    result = compare_capture(path)
    res = {o.name: o for o in result.ops}
    inf = res[split.name].extra["split_inference"]
    assert inf["match"] == [3, "contiguous"] and inf["text"] == "matches with split_k=(3, 'contiguous')"
    assert res[unsplit.name].bit_exact == res[unsplit.name].n and "split_inference" not in res[unsplit.name].extra
    t = res[tampered.name].extra["split_inference"]
    assert t["match"] is None and t["closest"] == [3, "contiguous"]
    assert t["agreement"] == pytest.approx(1 - 1 / 256)
    assert t["text"] == "no candidate matches; closest split_k=(3, 'contiguous') agrees on 99.61%"

    from fp8sim.cli import main

    main(["compare", path, "--no-progress"])
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith(split.name))
    assert line.endswith("; matches with split_k=(3, 'contiguous')"), line

    from fp8sim.report import write_compare_report

    md = write_compare_report(result, tmp_path / "report").read_text()
    assert "## GEMMs by inferred split-K" in md
    assert f"| split_k=(3, 'contiguous') | {split.name} |" in md
    assert "| no split matches |" in md


def test_infer_split_finds_an_interleaved_ada_split() -> None:
    case = GemmCase(16, 16, 1024, "e4m3", "e4m3", "tensorwise", False, "float32", 21)
    a, b, sa, sb = gemm_operands(case)
    bits = _mmaemu_bits(case, "ada", (5, "pairwise"))
    got = infer_split(a, b, sa, sb, bits, accumulator="ada_split", out_dtype="float32", a_format="e4m3",
                      b_format="e4m3", schemes=("serial", "pairwise"))  # fmt: skip
    # slow-accumulation partials carry ~14 bits, so serial and pairwise orders often add them to the same
    # float32 sums; the first reproducing candidate is reported, and it has the split count used
    assert got.match in ((5, "serial"), (5, "pairwise"))


def test_infer_split_refuses_bad_arguments() -> None:
    a = np.zeros((16, 32), np.uint8)
    b = np.zeros((32, 16), np.uint8)
    kw = {"accumulator": "hopper_fast", "out_dtype": "float32", "a_format": "e4m3", "b_format": "e4m3"}
    with pytest.raises(ValueError, match="max_splits"):
        infer_split(a, b, np.float32(1), np.float32(1), np.zeros(256, np.int32), max_splits=0, **kw)
    with pytest.raises(ValueError, match="schemes must be among contiguous, serial, pairwise"):
        infer_split(a, b, np.float32(1), np.float32(1), np.zeros(256, np.int32), schemes=("diagonal",), **kw)
