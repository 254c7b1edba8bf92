"""A recorded profile's split-K table ships with mmaemu: without it (the import fails), a shape the profile
would look up raises ``SplitKUnknownError`` naming the profile, the install line, the whole call and the
way out; nothing else of the profile needs mmaemu."""

from __future__ import annotations

import sys

import pytest

from fp8sim.gemm import SplitKUnknownError, get_profile


@pytest.mark.parametrize(
    ("profile", "mmaemu_name", "call", "text"),
    [
        ("h100_pcie_cublaslt_12_8", "hopper", (16, 128, 8192, "bfloat16", True, "e4m3", "e5m2"),
         "M=16 N=128 K=8192 (e4m3 x e5m2 -> bfloat16, use_fast_accum=True)"),
        ("rtx4060_cublaslt_12_8_te", "ada-te", (32, 48, 3072, "float32", False, "e5m2", "e4m3"),
         "M=32 N=48 K=3072 (e5m2 x e4m3 -> float32, use_fast_accum=False)"),
    ],
)  # fmt: skip
def test_without_mmaemu_a_table_lookup_names_what_to_install(monkeypatch, profile, mmaemu_name, call, text) -> None:  # noqa: ANN001
    monkeypatch.setitem(sys.modules, "mmaemu.platform.splitk_table", None)  # import fails
    prof = get_profile(profile)
    with pytest.raises(SplitKUnknownError) as err:
        prof.split_for(*call)
    assert str(err.value) == (
        f"the recorded split-K table of {mmaemu_name!r} ships with mmaemu: pip install mmaemu==0.1.0 (needed for "
        f"{text}), or pass split_k=(S, scheme)"
    )
    assert isinstance(err.value.__cause__, ImportError)
    assert prof.with_splits({call[:3]: (2, "serial")}).split_for(*call) == (2, "serial")  # the way out
