"""A profile's split rule is asked about the call itself: ``scaled_mm(..., profile=P)`` with tensorwise scales
hands ``P.split_rule`` the call's M, N, K, output dtype, ``use_fast_accum`` and both operands' formats (the rule
of a recorded GPU keys on all of them: ``fp8sim/gemm/profiles.py`` ``DeviceProfile.decide``), and the result is
the GEMM with the split the rule answered, given explicitly."""

from __future__ import annotations

import pytest

from fp8sim.gemm import scaled_mm
from fp8sim.gemm.profiles import DeviceProfile
from fp8sim.testing.oracles import require

torch = require("torch")  # noqa: E402


def _operands(m: int, n: int, k: int, fb: object):  # noqa: ANN202
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(m, k, generator=g) * 40).clamp(-448, 448).to(torch.float8_e4m3fn)
    w = (torch.randn(n, k, generator=g) * 40).clamp(-448, 448).to(fb)
    return x, w.t(), torch.tensor(0.125), torch.tensor(0.5)


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize(("fb", "fb_name"), [(torch.float8_e5m2, "e5m2"), (torch.float8_e4m3fn, "e4m3")])
def test_the_split_rule_sees_the_calls_shape_output_fast_flag_and_formats(fast: bool, fb: object, fb_name: str) -> None:
    seen: list[tuple] = []

    def rule(m: int, n: int, k: int, out: str, use_fast: bool, fa: str, fbn: str) -> tuple[int, str]:
        seen.append((m, n, k, out, use_fast, fa, fbn))
        # a split that depends on every argument, so a call asked with the wrong ones gets other bits
        return (4, "serial") if (use_fast, fbn) == (fast, fb_name) and fa == "e4m3" else (1, "none")

    prof = DeviceProfile("spy", "hopper_fast", "hopper_split", schemes=("serial",), split_rule=rule)
    args = _operands(16, 32, 2048, fb)
    got = scaled_mm(*args, out_dtype=torch.float32, use_fast_accum=fast, profile=prof)
    assert seen == [(16, 32, 2048, "float32", fast, "e4m3", fb_name)]
    acc = prof.fast if fast else prof.split
    want = scaled_mm(*args, out_dtype=torch.float32, use_fast_accum=fast, accumulator=acc, split_k=(4, "serial"))
    unsplit = scaled_mm(*args, out_dtype=torch.float32, use_fast_accum=fast, accumulator=acc, split_k=(1, "none"))
    assert not torch.equal(want, unsplit)  # the split shows in the bits for these operands
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def _rowwise(m: int, n: int, k: int):  # noqa: ANN202
    x, w, _, _ = _operands(m, n, k, torch.float8_e4m3fn)
    g = torch.Generator().manual_seed(4)
    sa = torch.rand(m, 1, generator=g) + 0.5
    sb = torch.rand(1, n, generator=g) + 0.5
    return x, w, sa, sb


@pytest.mark.parametrize("fast", [True, False])
def test_a_rowwise_call_takes_the_split_given_for_its_shape_and_fast_flag(fast: bool) -> None:
    """Rowwise scales run other kernels than the recorded cuBLASLt ones: only a split the user gave counts, keyed
    by ``(M, N, K, out, use_fast_accum)`` before ``(M, N, K)`` (``DeviceProfile.with_splits``)."""
    args = _rowwise(16, 32, 2048)
    base = DeviceProfile("spy", "hopper_fast", "hopper_split", schemes=("serial",))
    acc = base.fast if fast else base.split
    prof = base.with_splits({(16, 32, 2048, "bfloat16", fast): (4, "serial"), (16, 32, 2048): (1, "none")})
    got = scaled_mm(*args, out_dtype=torch.bfloat16, use_fast_accum=fast, profile=prof)
    want = scaled_mm(*args, out_dtype=torch.bfloat16, use_fast_accum=fast, accumulator=acc, split_k=(4, "serial"))
    unsplit = scaled_mm(*args, out_dtype=torch.bfloat16, use_fast_accum=fast, accumulator=acc, split_k=(1, "none"))
    assert not torch.equal(want, unsplit)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    only_shape = base.with_splits({(16, 32, 2048): (4, "serial")})
    got = scaled_mm(*args, out_dtype=torch.bfloat16, use_fast_accum=fast, profile=only_shape)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_a_rowwise_call_without_a_given_split_names_the_ways_out() -> None:
    from fp8sim.gemm.profiles import SplitKUnknownError

    args = _rowwise(16, 32, 2048)
    prof = DeviceProfile("spy", "hopper_fast", "hopper_split", split_rule=lambda *a: (4, "serial"))
    msg = (
        "profile 'spy' records the split-K of tensorwise-scaled calls only; this call has rowwise scales "
        "(M=16 N=32 K=2048, e4m3 x e4m3 -> bfloat16, use_fast_accum=True); pass split_k=(S, scheme) or "
        "profile.with_splits({(16, 32, 2048): (S, scheme)}) with the split your GPU used ((1, 'none'): unsplit)"
    )
    with pytest.raises(SplitKUnknownError) as info:
        scaled_mm(*args, out_dtype=torch.bfloat16, use_fast_accum=True, profile=prof)
    assert str(info.value) == msg
