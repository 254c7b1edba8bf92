"""Edges of the rule, accumulator and split inferences: a stochastic-only verdict, the report's Markdown
(literal), NaN detection of 16-bit outputs against ml_dtypes, numpy bfloat16 outputs against torch's CPU
``_scaled_mm``, GEMMs torch refuses (studies), and the refusals' whole messages."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

from fp8sim.gemm import PROFILES  # noqa: E402
from fp8sim.native import Candidate, Inference, infer_accumulator, infer_rule  # noqa: E402
from fp8sim.native._inference import inference_section  # noqa: E402
from fp8sim.native.compare import OpResult  # noqa: E402
from fp8sim.native.infer_gemm import _is_nan  # noqa: E402
from fp8sim.native.infer_split import SplitInference, infer_split, split_groups_section  # noqa: E402

X = np.array([0.3, 1.1, -2.7, 5.0, 100.0, 0.01, -0.02, 7.5], np.float32)


def test_a_stochastic_only_search_says_so_without_a_deterministic_candidate() -> None:
    y = X.astype(ml_dtypes.float8_e4m3fn)  # RN-even by ml_dtypes: one of the two neighbours of each x
    inf = infer_rule(X, y, rules=["stochastic"])
    assert not any(c.deterministic for c in inf.candidates)
    assert inf.describe() == (
        "stochastic-rounding compatible (e4m3 SR-compatible (RD or RU), satfinite: every output is one of its "
        "two neighbours)"
    )


def test_the_candidate_table_is_markdown() -> None:
    inf = infer_rule(X, X.astype(ml_dtypes.float8_e4m3fn), rules=["nearest_even", "toward_zero"])
    lines = inf.table().splitlines()
    assert lines[:2] == ["| candidate | explains |", "|---|---:|"]
    assert lines[2] == "| e4m3 RN-even (nearest_even), satfinite | 100.0000% |"
    assert len(lines) == 2 + len(inf.candidates) and inf.table(top=1).splitlines() == lines[:3]


def test_the_report_section_lists_every_note_on_its_own_line() -> None:
    inf = Inference("rule", 4, (Candidate("e4m3 RZ", 0.5), Candidate("e4m3 RU", 0.25)), ("first note", "second"))
    op = OpResult("cast/e4m3/f16_all", "cast", extra={"rule_inference": inf.to_dict()})
    lines = inference_section([OpResult("no inference", "cast"), op])
    assert lines[0:2] == ["", "## Rules inferred from the outputs"]
    assert lines[-2:] == [
        "|---|---|---|",
        "| cast/e4m3/f16_all | no rule candidate explains every output; closest: e4m3 RZ (50.00%)"
        "<br>first note<br>second | e4m3 RZ 50.00%, e4m3 RU 25.00% |",
    ]
    assert inference_section([OpResult("no inference", "cast")]) == []


def test_the_split_section_groups_gemms_by_split_in_order() -> None:
    def op(name: str, inf: SplitInference) -> OpResult:
        return OpResult(name, "scaled_mm", extra={"split_inference": inf.to_dict()})

    ops = [
        op("g3", SplitInference((4, "serial"), (4, "serial"), 1.0, 9)),
        op("g1", SplitInference((2, "serial"), (2, "serial"), 1.0, 3)),
        op("g2", SplitInference(None, (3, "serial"), 0.5, 31)),
        op("g0", SplitInference((2, "serial"), (2, "serial"), 1.0, 3)),
    ]
    assert split_groups_section(ops) == [
        "",
        "## GEMMs by inferred split-K",
        "",
        "| inferred split | GEMMs |",
        "|---|---|",
        "| no split matches | g2 (no candidate matches; closest split_k=(3, 'serial') agrees on 50.00%) |",
        "| split_k=(2, 'serial') | g1<br>g0 |",
        "| split_k=(4, 'serial') | g3 |",
    ]


@pytest.mark.parametrize(("out", "dt"), [("bfloat16", ml_dtypes.bfloat16), ("float16", np.float16)])
def test_nan_outputs_of_16_bit_gemms_are_ml_dtypes_nans(out: str, dt: type) -> None:
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.int16)
    with np.errstate(invalid="ignore"):
        want = np.isnan(bits.view(dt).astype(np.float32))
    assert np.array_equal(_is_nan(bits, out), want)


def _cpu_gemm() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, object]:
    rng = np.random.default_rng(5)
    a = rng.standard_normal((16, 32)).astype(ml_dtypes.float8_e4m3fn)
    b = rng.standard_normal((32, 16)).astype(ml_dtypes.float8_e4m3fn)
    sa, sb = np.array(0.75, np.float32), np.array(1.5, np.float32)
    at = torch.from_numpy(a.view(np.uint8)).view(torch.float8_e4m3fn)
    bt = torch.from_numpy(np.ascontiguousarray(b.view(np.uint8).T)).view(torch.float8_e4m3fn).t()
    from fp8sim.gemm.torch_cpu import fallback_kernel

    with fallback_kernel():
        d = torch._scaled_mm(at, bt, torch.from_numpy(sa), torch.from_numpy(sb), out_dtype=torch.bfloat16)
    return a.view(np.uint8), b.view(np.uint8), sa, sb, d


def test_a_numpy_bfloat16_output_is_read_as_bfloat16() -> None:
    a, b, sa, sb, d = _cpu_gemm()
    as_numpy = d.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    kw = {"a_format": "e4m3", "b_format": "e4m3", "profiles": []}
    inf = infer_accumulator(a, b, sa, sb, as_numpy, accumulators=["dequantized_fp32", "exact"], **kw)
    assert inf.n == 256 and inf.best.name == "accumulator dequantized_fp32" and inf.best.fraction == 1.0
    assert inf == infer_accumulator(a, b, sa, sb, d, accumulators=["dequantized_fp32", "exact"], **kw)


def test_unknown_candidates_are_refused_naming_the_list_and_the_known_ones() -> None:
    a, b, sa, sb, d = _cpu_gemm()
    with pytest.raises(ValueError) as err:
        infer_accumulator(a, b, sa, sb, d, a_format="e4m3", b_format="e4m3", profiles=[*PROFILES][:1] + ["nope"])
    assert str(err.value) == f"unknown profiles ['nope']; known: {', '.join(PROFILES)}"


def test_an_empty_format_list_is_refused() -> None:
    with pytest.raises(ValueError) as err:
        infer_rule(X, X.astype(ml_dtypes.float8_e4m3fn), format=[])
    assert str(err.value) == "format is an empty list; pass a format name or a list of them"


def test_the_split_search_takes_a_study_gemm_torch_would_refuse() -> None:
    """K = 24 (torch._scaled_mm takes multiples of 16 only): small integers, so every sum is exact in
    float32 and the unsplit candidate is the match."""
    rng = np.random.default_rng(3)
    a = rng.integers(-4, 5, (4, 24)).astype(np.float32)
    b = rng.integers(-4, 5, (24, 8)).astype(np.float32)
    want = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)
    codes = [v.astype(ml_dtypes.float8_e4m3fn).view(np.uint8) for v in (a, b)]
    one = np.array(1.0, np.float32)
    res = infer_split(
        *codes, one, one, want.view(np.int32), accumulator="exact", out_dtype="float32", a_format="e4m3",
        b_format="e4m3", max_splits=2,
    )  # fmt: skip
    assert res.match == (1, "none") and res.tried == 1
