"""``torch._scaled_mm`` and ``torch.nn.functional.scaled_mm`` (torch >= 2.9) under ``emulate_scaled_mm``: every
argument reaches fp8sim's ``scaled_mm``, and exit restores both.  Oracle: torch's own functions on this CPU
(``F.scaled_mm`` runs ``torch._scaled_mm_v2``; ``torch._scaled_mm`` under ``fallback_kernel()``), on operands whose
every sum is exact (small integers, power-of-two scales), so any accumulator must agree bit for bit; the
multi-level, swizzled and contraction_dim calls that are not emulated are refused naming the argument."""

from __future__ import annotations

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

from fp8sim.gemm import get_profile  # noqa: E402
from fp8sim.gemm.emulate import emulate_scaled_mm  # noqa: E402
from fp8sim.gemm.torch_cpu import fallback_kernel  # noqa: E402

F = torch.nn.functional
functional = pytest.mark.skipif(not hasattr(F, "scaled_mm"), reason="torch without nn.functional.scaled_mm")
E4 = torch.float8_e4m3fn
# the H100 profile with the splits of the shapes below given (its recorded table has neither)
H100 = get_profile("h100_pcie_cublaslt_12_8").with_splits({(16, 32, 32): (1, "none"), (16, 16, 512): (1, "none")})


def _exact() -> tuple:
    g = torch.Generator().manual_seed(7)
    a = torch.randint(-4, 5, (16, 32), generator=g).float().to(E4)
    b = torch.randint(-4, 5, (32, 32), generator=g).float().to(E4).t()
    return a, b, torch.tensor(0.5), torch.tensor(2.0)


def _calls() -> list[tuple[dict, list]]:
    n = F.SwizzleType.NO_SWIZZLE
    bias = torch.arange(32, dtype=torch.bfloat16)
    return [
        ({}, []),
        ({"output_dtype": torch.float32}, []),
        ({"output_dtype": None}, []),  # torch: mat_a's dtype
        ({"bias": bias}, []),
        ({"swizzle_a": n, "swizzle_b": [n]}, []),
        ({}, ["lists"]),  # one-level scales and recipes passed as lists of one
        ({"use_fast_accum": True, "contraction_dim": ()}, []),
    ]


@functional
@pytest.mark.parametrize(("kw", "how"), _calls())
def test_emulated_functional_scaled_mm_equals_torchs_on_exact_sums(kw: dict, how: list) -> None:
    a, b, sa, sb = _exact()
    t = F.ScalingType.TensorWise
    args = (a, b, [sa], [t], [sb], [t]) if how else (a, b, sa, t, sb, t)
    want = F.scaled_mm(*args, **kw)
    for setting in ({"accumulator": "hopper_fast"}, {"profile": H100}, {}):
        with emulate_scaled_mm(**setting):
            got = F.scaled_mm(*args, **kw)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got.float(), want.float()), setting


@functional
def test_use_fast_accum_picks_the_profiles_preset_as_torch_scaled_mm_does() -> None:
    """Inexact sums: the profile's fast and split presets differ, and F.scaled_mm must take the one
    ``use_fast_accum`` names, the same as the ``torch._scaled_mm`` call with the same arguments."""
    g = torch.Generator().manual_seed(8)
    a = (torch.randn(16, 512, generator=g) * 60).to(E4)
    b = (torch.randn(16, 512, generator=g) * 60).to(E4).t()
    one, t = torch.tensor(1.0), F.ScalingType.TensorWise
    with emulate_scaled_mm(profile=H100):
        runs = {
            False: (F.scaled_mm(a, b, one, t, one, t, output_dtype=torch.float32),  # the defaults: False
                    torch._scaled_mm(a, b, one, one, out_dtype=torch.float32)),
            True: (F.scaled_mm(a, b, one, t, one, t, output_dtype=torch.float32, use_fast_accum=True),
                   torch._scaled_mm(a, b, one, one, out_dtype=torch.float32, use_fast_accum=True)),
        }  # fmt: skip
    for f, s in runs.values():
        assert torch.equal(f, s)
    assert not torch.equal(runs[False][0], runs[True][0])  # the two presets differ on these sums


@functional
@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"swizzle_a": "SWIZZLE_32_4_4"}, "emulate_scaled_mm: swizzled scales (_SwizzleType.SWIZZLE_32_4_4) are not "
                                          "emulated; pass them unswizzled"),
        ({"swizzle_b": ["SWIZZLE_32_4_4"]}, "emulate_scaled_mm: swizzled scales"),
        ({"swizzle_a": ["NO_SWIZZLE", "NO_SWIZZLE"]},
         "emulate_scaled_mm: multi-level swizzle (2 entries) is not emulated"),
        ({"scale_a": 2}, "emulate_scaled_mm: multi-level scale_a (2 entries) is not emulated"),
        ({"scale_b": 3}, "emulate_scaled_mm: multi-level scale_b (3 entries) is not emulated"),
        ({"scale_recipe_a": 2}, "emulate_scaled_mm: multi-level scale_recipe_a (2 entries) is not emulated"),
        ({"scale_recipe_b": 2}, "emulate_scaled_mm: multi-level scale_recipe_b (2 entries) is not emulated"),
        ({"contraction_dim": (1, 0)}, "emulate_scaled_mm: contraction_dim is not emulated"),
    ],
)  # fmt: skip
def test_what_is_not_emulated_is_refused_naming_it(kw: dict, message: str) -> None:
    a, b, sa, sb = _exact()
    t = F.ScalingType.TensorWise
    sw = {k: getattr(F.SwizzleType, v) if isinstance(v, str) else [getattr(F.SwizzleType, x) for x in v]
          for k, v in kw.items() if k.startswith("swizzle")}  # fmt: skip
    args = {"scale_a": sa, "scale_recipe_a": t, "scale_b": sb, "scale_recipe_b": t}
    for k in ("scale_a", "scale_b", "scale_recipe_a", "scale_recipe_b"):
        if k in kw:
            args[k] = [args[k]] * kw[k]
    extra = {k: v for k, v in kw.items() if k == "contraction_dim"}
    scales = (args["scale_a"], args["scale_recipe_a"], args["scale_b"], args["scale_recipe_b"])
    with emulate_scaled_mm(accumulator="hopper_fast"), pytest.raises(NotImplementedError) as err:
        F.scaled_mm(a, b, *scales, **sw, **extra)
    assert str(err.value) == message or (str(err.value).startswith(message) and "swizzled" in message)


@pytest.mark.parametrize(
    "kw",
    [
        {"out_dtype": torch.bfloat16},
        {"out_dtype": torch.bfloat16, "bias": torch.arange(32, dtype=torch.bfloat16)},
        {"out_dtype": E4, "scale_result": torch.tensor(4.0)},
        {"out_dtype": torch.float32, "use_fast_accum": True},
    ],
)
def test_emulated_torch_scaled_mm_passes_every_argument(kw: dict) -> None:
    a, b, sa, sb = _exact()
    with fallback_kernel():
        want = torch._scaled_mm(a, b, sa, sb, **kw)
    with emulate_scaled_mm(accumulator="cpu_reference"):  # the fallback's epilogue: scale_result divides
        got = torch._scaled_mm(a, b, sa, sb, **kw)
        into = torch.full(want.shape, 7.0).to(want.dtype)
        same = torch._scaled_mm(a, b, sa, sb, **kw, out=into)
    assert got.dtype == want.dtype and torch.equal(got.float(), want.float())
    assert same is into and torch.equal(into.float(), want.float())


def test_exit_restores_torch_and_functional() -> None:
    native = torch._scaled_mm, getattr(F, "scaled_mm", None)
    with emulate_scaled_mm(accumulator="hopper_fast"):
        assert torch._scaled_mm is not native[0]
        if native[1] is not None:
            assert F.scaled_mm is not native[1]
    assert torch._scaled_mm is native[0] and getattr(F, "scaled_mm", None) is native[1]
    assert not hasattr(F, "_scaled_mm") and not hasattr(torch, "scaled_mm")


@functional
def test_functional_scaled_mm_runs_the_chosen_accumulator() -> None:
    """Inexact sums, where Ada's and Hopper's fast presets differ: F.scaled_mm under ``ada_fast`` is ada_fast."""
    from fp8sim.gemm import scaled_mm

    g = torch.Generator().manual_seed(9)
    a = (torch.randn(16, 512, generator=g) * 60).to(E4)
    b = (torch.randn(16, 512, generator=g) * 60).to(E4).t()
    one, t = torch.tensor(1.0), F.ScalingType.TensorWise
    with emulate_scaled_mm(accumulator="ada_fast"):
        got = F.scaled_mm(a, b, one, t, one, t, output_dtype=torch.float32, use_fast_accum=True)
    want = scaled_mm(a, b, one, one, out_dtype=torch.float32, use_fast_accum=True, accumulator="ada_fast")
    hopper = scaled_mm(a, b, one, one, out_dtype=torch.float32, use_fast_accum=True, accumulator="hopper_fast")
    assert torch.equal(got, want) and not torch.equal(got, hopper)
