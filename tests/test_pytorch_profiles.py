"""TE modules under ``autocast(accumulator=PROFILE)`` (issue 26.1): every GEMM as the profile's GPU computes
it through TE's ``general_gemm``, the split-K decided for that GEMM's own shape, output dtype, fast/split
accumulation and formats.  Oracle: mmaemu 0.1.0's ``scaled_mm`` under its TE-caller profiles ``hopper-te``
(H100 PCIe, TE 2.3's 32 MiB workspace) and ``ada-te`` (RTX 4060, 4 MiB), fed the FP8 operands TE's
quantizers give, written here from TE's rules (DelayedScaling's first step casts with scale 1; current
scaling ``scale = fl32(448 / amax)``, ``scale_inv = fl32(1 / scale)``: ``recipe_common.cuh``
``compute_scale_from_amax``).  Shapes below are tokens x in_features x out_features; the GEMMs are fprop
(M, N, K) = (T, O, I), dgrad (T, I, O), wgrad (O, I, T)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")
torch.set_num_threads(1)

import fp8sim.pytorch as te  # noqa: E402
from fp8sim.gemm import PROFILES, SplitKUnknownError, get_profile  # noqa: E402
from fp8sim.recipe import DelayedScaling, Float8CurrentScaling  # noqa: E402

H100_TE, RTX_TE = "h100_pcie_cublaslt_12_8_te", "rtx4060_cublaslt_12_8_te"
ONE = torch.tensor(1.0)


def _mmaemu():  # noqa: ANN202
    return require("mmaemu")


def _colmajor(t: torch.Tensor) -> torch.Tensor:
    """``t`` (R, C) stored column-major, as torch._scaled_mm (and mmaemu) want ``mat2``."""
    return t.t().contiguous().t()


def _ref_mm(a8: torch.Tensor, b8: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor, out: torch.dtype, fast: bool, **kw):  # noqa: ANN003, ANN202
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # mmaemu warns that TE-caller split decisions are experimental
        return _mmaemu().scaled_mm(a8, _colmajor(b8), sa, sb, out_dtype=out, use_fast_accum=fast, **kw)


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32).numpy()


def _assert_same_bits(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    g, w = _bits(got), _bits(want)
    bad = np.argwhere(g != w)
    assert bad.size == 0, (
        f"{what}: {len(bad)} of {g.size} outputs differ; first at {tuple(bad[0])}: "
        f"got {got[tuple(bad[0])].item()!r} (0x{int(g[tuple(bad[0])]) & 0xFFFFFFFF:X}), "
        f"want {want[tuple(bad[0])].item()!r} (0x{int(w[tuple(bad[0])]) & 0xFFFFFFFF:X})"
    )


def _e4m3(x: torch.Tensor) -> torch.Tensor:
    """DelayedScaling's first cast (scale 1): satfinite RN (these inputs stay far below 448)."""
    return x.detach().float().to(torch.float8_e4m3fn)


_FORWARD_CASES = [
    (H100_TE, "hopper-te", (16, 8192, 64), (3, "contiguous")),  # split in the H100 table
    (H100_TE, "hopper-te", (16, 1920, 64), (1, "none")),
    (RTX_TE, "ada-te", (16, 4096, 32), (3, "pairwise")),
    (RTX_TE, "ada-te", (16, 2048, 64), (3, "pairwise")),  # TE's 4 MiB splits; torch's 1 MiB does not
]
# the issue's shapes (mmaemu needs about 10 s for each of them on one core)
_ISSUE_CASES = [
    (H100_TE, "hopper-te", (64, 8192, 128), (3, "contiguous")),
    (H100_TE, "hopper-te", (256, 1024, 256), (1, "none")),
    (RTX_TE, "ada-te", (32, 4096, 256), (3, "pairwise")),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize(("profile", "mmaemu_profile", "shape", "split"), _FORWARD_CASES)
def test_linear_forward_under_a_te_profile_equals_mmaemu(
    profile: str, mmaemu_profile: str, shape: tuple, split: tuple, dtype: torch.dtype
) -> None:
    _check_forward(profile, mmaemu_profile, shape, split, dtype)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize(("profile", "mmaemu_profile", "shape", "split"), _ISSUE_CASES)
def test_linear_forward_on_the_issues_shapes_equals_mmaemu(
    profile: str, mmaemu_profile: str, shape: tuple, split: tuple, dtype: torch.dtype
) -> None:
    _check_forward(profile, mmaemu_profile, shape, split, dtype)


def _check_forward(profile: str, mmaemu_profile: str, shape: tuple, split: tuple, dtype: torch.dtype) -> None:
    _mmaemu()
    t, i, o = shape
    out = "bfloat16" if dtype == torch.bfloat16 else "float32"
    assert get_profile(profile).split_for(t, o, i, out, True) == split  # the case is what its id says
    torch.manual_seed(t + i + o)
    m = te.Linear(i, o, bias=False, params_dtype=dtype)
    x = torch.randn(t, i, dtype=dtype)
    with torch.no_grad(), te.autocast(recipe=DelayedScaling(), accumulator=profile):
        y = m(x)
    want = _ref_mm(_e4m3(x), _e4m3(m.weight).t(), ONE, ONE, dtype, True, profile=mmaemu_profile)
    _assert_same_bits(y, want, f"{profile} fprop {shape} {dtype}")


def test_the_te_caller_decides_its_own_splits() -> None:
    """16 x 2048 x 64: torch's 1 MiB workspace leaves it unsplit on the RTX 4060 (profile rtx4060_cublaslt_12_8),
    TE's 4 MiB splits it in 3; a module run under the torch-caller profile misses TE's bits."""
    _mmaemu()
    assert PROFILES["rtx4060_cublaslt_12_8"].split_for(16, 64, 2048, "bfloat16", True) == (1, "none")
    torch.manual_seed(3)
    m = te.Linear(2048, 64, bias=False, params_dtype=torch.bfloat16)
    x = torch.randn(16, 2048, dtype=torch.bfloat16)
    want = _ref_mm(_e4m3(x), _e4m3(m.weight).t(), ONE, ONE, torch.bfloat16, True, profile="ada-te")
    with torch.no_grad(), te.autocast(recipe=DelayedScaling(), accumulator="rtx4060_cublaslt_12_8"):
        torch_caller = m(x)
    assert (_bits(torch_caller) != _bits(want)).any()


def test_current_scaling_scales_reach_the_profile_epilogue() -> None:
    """Float8CurrentScaling: the GEMM's alpha is the product of the two scale_inv (mmaemu: RN32(sa * sb))."""
    _mmaemu()
    torch.manual_seed(7)
    m = te.Linear(4096, 256, bias=False, params_dtype=torch.bfloat16)
    x = torch.randn(32, 4096, dtype=torch.bfloat16) * 3
    with torch.no_grad(), te.autocast(recipe=Float8CurrentScaling(), accumulator=RTX_TE):
        y = m(x)

    def cast(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        v = v.detach().float()
        scale = torch.tensor(448.0) / v.abs().max()  # float32 division, correctly rounded
        return (v * scale).clamp(-448, 448).to(torch.float8_e4m3fn), torch.tensor(1.0) / scale

    (x8, sx), (w8, sw) = cast(x), cast(m.weight)
    assert sx.item() != 1.0 and sw.item() != 1.0
    want = _ref_mm(x8, w8.t(), sx, sw, torch.bfloat16, True, profile="ada-te")
    _assert_same_bits(y, want, "current scaling fprop")


@pytest.mark.parametrize(
    "dtype", [torch.bfloat16, pytest.param(torch.float32, marks=pytest.mark.slow)], ids=["bf16", "fp32"]
)
@pytest.mark.parametrize(
    ("shape", "decisions"),
    [
        ((2048, 128, 48), {"fprop": (1, "none"), "dgrad": (1, "none"), "wgrad": (3, "pairwise")}),
        ((32, 6144, 32), {"fprop": (10, "pairwise"), "dgrad": (1, "none"), "wgrad": (1, "none")}),
    ],
)
def test_backward_gemms_take_their_own_shapes_decisions(shape: tuple, decisions: dict, dtype: torch.dtype) -> None:
    """HYBRID DelayedScaling on the RTX 4060 TE profile: dgrad (T, I, O) and wgrad (O, I, T) are E5M2 x E4M3
    with split accumulation, each split as the RTX 4060 table says for its own shape."""
    _mmaemu()
    t, i, o = shape
    prof = get_profile(RTX_TE)
    out = "bfloat16" if dtype == torch.bfloat16 else "float32"
    got = {
        "fprop": prof.split_for(t, o, i, out, True),
        "dgrad": prof.split_for(t, i, o, out, False, "e5m2", "e4m3"),
        "wgrad": prof.split_for(o, i, t, out, False, "e5m2", "e4m3"),
    }
    assert got == decisions
    torch.manual_seed(i)
    m = te.Linear(i, o, bias=False, params_dtype=dtype)
    x = torch.randn(t, i, dtype=dtype, requires_grad=True)
    dy = torch.randn(t, o, dtype=dtype)
    with te.autocast(recipe=DelayedScaling(), accumulator=RTX_TE):
        y = m(x)
    y.backward(dy)
    x8, w8, dy8 = _e4m3(x), _e4m3(m.weight), dy.float().to(torch.float8_e5m2)
    _assert_same_bits(y.detach(), _ref_mm(x8, w8.t(), ONE, ONE, dtype, True, profile="ada-te"), "fprop")
    _assert_same_bits(x.grad, _ref_mm(dy8, w8, ONE, ONE, dtype, False, profile="ada-te"), "dgrad")
    wgrad = _ref_mm(dy8.t().contiguous(), x8, ONE, ONE, dtype, False, profile="ada-te")
    _assert_same_bits(m.weight.grad, wgrad, "wgrad")


def test_an_unknown_backward_split_names_the_gemm_and_the_ways_out() -> None:
    """The H100 TE table has no verified decision for 16 x 8192 x 64's dgrad (M=16 N=8192 K=64): the error
    names the module, the GEMM and the shape; a split given with ``with_splits`` is then used, as mmaemu's
    explicit ``splitk`` computes it."""
    _mmaemu()
    torch.manual_seed(11)
    m = te.Linear(8192, 64, bias=False, params_dtype=torch.bfloat16, name="proj")
    x = torch.randn(16, 8192, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(16, 64, dtype=torch.bfloat16)
    with te.autocast(recipe=DelayedScaling(), accumulator=H100_TE):
        y = m(x)
    with pytest.raises(SplitKUnknownError, match=r"dgrad GEMM of 'proj': M=16 N=8192 K=64 \(e5m2 x e4m3") as e:
        y.backward(dy)
    assert "with_splits({(16, 8192, 64): (S, scheme)})" in str(e.value)
    mine = get_profile(H100_TE).with_splits({(16, 8192, 64): (2, "contiguous"), (64, 8192, 16): (1, "none")})
    x.grad = None
    fresh = te.Linear(8192, 64, bias=False, params_dtype=torch.bfloat16, name="proj")  # scales 1 again
    with torch.no_grad():
        fresh.weight.copy_(m.weight)
    m = fresh
    with te.autocast(recipe=DelayedScaling(), accumulator=mine):
        y = m(x)
    y.backward(dy)
    x8, w8, dy8 = _e4m3(x), _e4m3(m.weight), dy.float().to(torch.float8_e5m2)
    dgrad = _ref_mm(dy8, w8, ONE, ONE, torch.bfloat16, False, profile="hopper-te", splitk=(2, "contiguous"))
    _assert_same_bits(x.grad, dgrad, "dgrad with the user's split")
    wgrad = _ref_mm(dy8.t().contiguous(), x8, ONE, ONE, torch.bfloat16, False, profile="hopper-te", splitk=1)
    _assert_same_bits(m.weight.grad, wgrad, "wgrad with the user's split")


def test_general_gemm_takes_a_profile_and_the_regions_profile() -> None:
    """TE's ``general_gemm(A=weight, B=input)`` "TN": cuBLAS's m = out_features, n = tokens, the torch-style
    (M, N, K) = (T, O, I) the tables are keyed by."""
    _mmaemu()
    from fp8sim.pytorch import DType, Float8Quantizer
    from fp8sim.pytorch.cpp_extensions import general_gemm

    torch.manual_seed(5)
    x, w = torch.randn(16, 8192), torch.randn(64, 8192)
    q = Float8Quantizer(torch.ones(1), torch.zeros(1), DType.kFloat8E4M3)
    xq, wq = q(x), q(w)
    want = _ref_mm(_e4m3(x), _e4m3(w).t(), ONE, ONE, torch.bfloat16, True, profile="hopper-te")
    got = general_gemm(wq, xq, out_dtype=torch.bfloat16, accumulator=H100_TE)[0]
    _assert_same_bits(got, want, "general_gemm accumulator=profile")
    with te.autocast(recipe=DelayedScaling(), accumulator=H100_TE):
        got = general_gemm(wq, xq, out_dtype=torch.bfloat16)[0]
    _assert_same_bits(got, want, "general_gemm in the region")


def test_torchao_float8_linear_takes_the_torch_caller_profile() -> None:
    """torchao's Float8Linear runs ``torch._scaled_mm``: the torch-caller profile, mmaemu's ``hopper``."""
    _mmaemu()
    from fp8sim.torchao import Float8Linear, Float8LinearConfig

    torch.manual_seed(9)
    lin = torch.nn.Linear(8192, 64, bias=False, dtype=torch.bfloat16)
    f = Float8Linear.from_float(lin, config=Float8LinearConfig(), accumulator="h100_pcie_cublaslt_12_8")
    x = torch.randn(16, 8192, dtype=torch.bfloat16)  # 16 x 64 x 8192: split 3 on the H100
    with torch.no_grad():
        y = f(x)

    def cast(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # torchao: fl32(448 / fp64 amax), 1/scale
        v = v.detach()
        scale = (448.0 / v.abs().max().to(torch.float64).clamp(min=1e-12)).to(torch.float32)
        return (v.float() * scale).clamp(-448, 448).to(torch.float8_e4m3fn), scale.reciprocal()

    (x8, sx), (w8, sw) = cast(x), cast(lin.weight)
    want = _ref_mm(x8, w8.t(), sx, sw, torch.bfloat16, True, profile="hopper")
    _assert_same_bits(y, want, "torchao Float8Linear under h100_pcie_cublaslt_12_8")


def test_block_scaled_gemms_under_a_profile_need_a_given_split() -> None:
    from fp8sim.recipe import Float8BlockScaling

    m = te.Linear(128, 128, bias=False)
    x = torch.randn(16, 128)
    with pytest.raises(SplitKUnknownError, match="per-tensor scaled FP8 GEMMs only; the fprop GEMM of 'Linear'"):
        with torch.no_grad(), te.autocast(recipe=Float8BlockScaling(), accumulator=H100_TE):
            m(x)
    mine = PROFILES["h200"].with_splits({(16, 128, 128): (1, "none")})
    with torch.no_grad(), te.autocast(recipe=Float8BlockScaling(), accumulator=mine):
        got = m(x)
    with torch.no_grad(), te.autocast(recipe=Float8BlockScaling(), accumulator="hopper_split"):
        want = m(x)
    assert torch.equal(got, want)  # Float8BlockScaling forces split accumulation, unsplit K


def test_autocast_refuses_an_unknown_accumulator_naming_the_profiles() -> None:
    with pytest.raises(ValueError, match=r"mmaemu's 'hopper-te' is fp8sim's 'h100_pcie_cublaslt_12_8_te'"):
        with te.autocast(accumulator="hopper-te"):
            pass
    with pytest.raises(ValueError, match="rtx4060_cublaslt_12_8_te"):
        with te.autocast(accumulator="rtx4060"):
            pass


def test_an_sm_count_target_is_refused_under_a_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    """TE's gemm.cpp turns ``NVTE_EXT_MARGIN_SM`` into cuBLASLt's SM-count target, which no table recorded."""
    m = te.Linear(64, 64, bias=False)
    monkeypatch.setenv("NVTE_EXT_MARGIN_SM", "8")
    with pytest.raises(SplitKUnknownError, match="NVTE_EXT_MARGIN_SM is set"):
        with torch.no_grad(), te.autocast(recipe=DelayedScaling(), accumulator=H100_TE):
            m(torch.randn(16, 64))
