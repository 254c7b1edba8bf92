"""The split-K rule of the recorded profiles (``profiles._mmaemu_rule``) against mmaemu 0.1.0's own
``resolve_splitk(..., splitk="auto", dry=True)``: the same S, scheme and source for every verified decision
(its note kept after "mmaemu "), None where mmaemu raises ``LookupError`` (no decision) or for formats its
tables do not key (FP4 operands, an E8M0 output), and the install line where mmaemu is missing."""

from __future__ import annotations

import sys
import warnings

import pytest

from fp8sim.gemm import SplitKUnknownError
from fp8sim.gemm.profiles import SplitChoice, _mmaemu_rule
from fp8sim.testing.oracles import require

torch = require("torch")
mmaemu = require("mmaemu")

DT = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "bfloat16": torch.bfloat16,
      "float32": torch.float32, "float16": torch.float16}  # fmt: skip
SHAPES = [(16, 128, 8192), (16, 64, 1920), (64, 64, 2048), (16, 48, 3072), (128, 256, 16384), (100, 200, 3000)]
CALLS = [
    ("bfloat16", True, "e4m3", "e4m3"), ("bfloat16", False, "e4m3", "e4m3"), ("float32", False, "e5m2", "e4m3"),
    ("e4m3", True, "e4m3", "e5m2"), ("e5m2", False, "e4m3", "e4m3"), ("float16", True, "e4m3", "e4m3"),
]  # fmt: skip


def _oracle(profile: str, m: int, n: int, k: int, out: str, fast: bool, fa: str, fb: str) -> SplitChoice | None:
    from mmaemu.platform.splitk_table import resolve_splitk

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            d = resolve_splitk(m, n, k, a_dtype=DT[fa], b_dtype=DT[fb], out_dtype=DT[out], use_fast_accum=fast,
                               profile=profile, splitk="auto", dry=True)  # fmt: skip
        except LookupError:
            return None
    return SplitChoice(int(d.S), str(d.scheme), str(d.source), f"mmaemu {d.note}") if d.verified else None


@pytest.mark.parametrize("profile", ["hopper", "ada-te"])
def test_the_rule_is_mmaemus_verified_decision(profile: str) -> None:
    rule = _mmaemu_rule(profile)
    seen = set()
    for shape in SHAPES:
        for out, fast, fa, fb in CALLS:
            want = _oracle(profile, *shape, out, fast, fa, fb)
            got = rule(*shape, out, fast, fa, fb)
            assert got == want, (profile, shape, out, fast, fa, fb)
            seen.add(None if want is None else (want.split_k[0] > 1))
    assert seen == {None, True, False}  # unknown, split and unsplit decisions all compared


@pytest.mark.parametrize(("out", "fa", "fb"), [("e8m0", "e4m3", "e4m3"), ("bfloat16", "e2m1", "e4m3"),
                                               ("bfloat16", "e4m3", "e2m1")])  # fmt: skip
def test_formats_the_tables_do_not_key_have_no_decision(out: str, fa: str, fb: str) -> None:
    assert _mmaemu_rule("hopper")(16, 128, 8192, out, True, fa, fb) is None


def test_without_mmaemu_the_rule_names_the_install_line(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setitem(sys.modules, "mmaemu.platform.splitk_table", None)
    with pytest.raises(SplitKUnknownError) as err:
        _mmaemu_rule("ada")(16, 48, 3072, "float32", False, "e5m2", "e4m3")
    assert str(err.value) == (
        "the recorded split-K table of 'ada' ships with mmaemu: pip install mmaemu==0.1.0 (needed for M=16 N=48 "
        "K=3072 (e5m2 x e4m3 -> float32, use_fast_accum=False)), or pass split_k=(S, scheme)"
    )


def test_split_for_passes_use_fast_accum_to_the_table() -> None:
    """ada-te records (128, 256, 16384) as 6 serial without fast accumulation and 3 pairwise with it."""
    from fp8sim.gemm import get_profile

    prof = get_profile("rtx4060_cublaslt_12_8_te")
    for fast in (False, True):
        want = _oracle("ada-te", 128, 256, 16384, "bfloat16", fast, "e4m3", "e4m3")
        assert prof.split_for(128, 256, 16384, "bfloat16", fast) == want.split_k
    assert prof.split_for(128, 256, 16384, "bfloat16", True) != prof.split_for(128, 256, 16384, "bfloat16", False)
