"""``transformer_engine.pytorch.cpp_extensions.general_gemm`` emulated (TE ``cpp_extensions/gemm.py:222``).

Layout rules from TE's callers (``module/linear.py``): forward ``general_gemm(weight, inputmat)``
("TN", ``x @ W.T``), dgrad ``layout="NN"`` (``dy @ W``), wgrad ``layout="NT"`` (``dy.T @ x``).
"""

from __future__ import annotations

import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

import fp8sim.pytorch as te  # noqa: E402
from fp8sim.gemm import scaled_mm  # noqa: E402
from fp8sim.pytorch.cpp_extensions import general_gemm  # noqa: E402

_E4M3, _E5M2 = te.DType.kFloat8E4M3, te.DType.kFloat8E5M2


def _hp(*shape: int, seed: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _fp8(t: torch.Tensor, scale: float = 4.0, fp8_dtype=_E4M3):
    q = te.Float8Quantizer(torch.tensor([scale]), torch.zeros(1), fp8_dtype)
    return q(t)


def _row_major(a: torch.Tensor, b: torch.Tensor, layout: str) -> torch.Tensor:
    """The reference: ``op_B(B) @ op_A(A)`` in float64 (TE's column-major ``layout``, read row-major)."""
    a, b = a.double(), b.double()
    return (b.t() if layout[1] == "T" else b) @ (a.t() if layout[0] == "T" else a)


@pytest.mark.parametrize(
    ("layout", "a_shape", "b_shape"), [("TN", (24, 32), (16, 32)), ("NN", (16, 32), (8, 16)), ("NT", (8, 32), (8, 16))]
)
def test_high_precision_layouts_match_the_linear_module_gemms(layout: str, a_shape: tuple, b_shape: tuple) -> None:
    """float32 products summed in float32, one rounding: bit-equal to torch's float32 matmul of the
    operands, with TE's layout rule (forward / dgrad / wgrad shapes)."""
    a, b = _hp(*a_shape, seed=1), _hp(*b_shape, seed=2)
    out, bias_grad, gelu_in, extra = general_gemm(a, b, out_dtype=torch.float32, layout=layout)
    left = b.float().t() if layout[1] == "T" else b.float()
    right = a.float().t() if layout[0] == "T" else a.float()
    assert torch.equal(out, torch.matmul(left, right)) and (bias_grad, gelu_in, extra) == (None, None, None)
    assert torch.allclose(out.double(), _row_major(a, b, layout), rtol=1e-5, atol=1e-5)
    assert general_gemm(a, b, layout=layout)[0].dtype == torch.bfloat16  # default: A's dtype


def test_fp8_exact_accumulator_equals_dequantized_matmul_and_keeps_the_leading_shape() -> None:
    """FP8 operands with power-of-two scales and the exact accumulator: the float64 matmul of the
    dequantized operands rounded once to float32; a 3-D ``B`` keeps its leading shape ("TN")."""
    w, x = _fp8(_hp(24, 32, seed=3)), _fp8(_hp(2, 8, 32, seed=4), scale=0.5, fp8_dtype=_E5M2)
    out = general_gemm(w, x, out_dtype=torch.float32, accumulator="exact")[0]
    ref = _row_major(w.dequantize(dtype=torch.float32), x.dequantize(dtype=torch.float32).reshape(16, 32), "TN")
    assert out.shape == (2, 8, 24) and torch.equal(out.reshape(16, 24), ref.float())


def _mx_values(t, usage: str) -> torch.Tensor:
    """An MXFP8Tensor's values from its raw codes and E8M0 scales (TE mxfp8_tensor.py layout: rowwise
    blocks of 32 along the last dim, columnwise along the first), in float64."""
    m, k = t.shape
    if usage == "rowwise":
        codes, s = t._rowwise_data, t._rowwise_scale_inv[:m, : k // 32].repeat_interleave(32, dim=1)
    else:
        codes, s = t._columnwise_data, t._columnwise_scale_inv[: m // 32, :k].repeat_interleave(32, dim=0)
    return codes.view(torch.float8_e4m3fn).double() * torch.exp2(s.double() - 127)


@pytest.mark.parametrize(
    ("layout", "a_shape", "b_shape", "a_usage", "b_usage"),
    [
        ("TN", (64, 96), (32, 96), "rowwise", "rowwise"),  # fprop: x @ W.T
        ("NN", (64, 96), (32, 64), "columnwise", "rowwise"),  # dgrad: dy @ W
        ("NT", (32, 96), (32, 64), "columnwise", "columnwise"),  # wgrad: dy.T @ x
    ],
)
def test_mxfp8_layouts_read_tes_representations(layout, a_shape, b_shape, a_usage, b_usage) -> None:
    """gemm.py:262-263: ``A`` rowwise when transposed else columnwise, ``B`` columnwise when transposed
    else rowwise; with the exact accumulator the result is the float64 product of those values, rounded once."""
    q = te.MXFP8Quantizer(_E4M3)
    a, b = q(_hp(*a_shape, seed=21)), q(_hp(*b_shape, seed=22))
    got = general_gemm(a, b, out_dtype=torch.float32, layout=layout, accumulator="exact")[0]
    want = _row_major(_mx_values(a, a_usage), _mx_values(b, b_usage), layout).float()
    assert torch.equal(got, want)
    assert torch.equal(
        general_gemm(a, b, out_dtype=torch.float32, layout=layout, use_split_accumulator=True)[0],
        general_gemm(a, b, out_dtype=torch.float32, layout=layout, accumulator="blackwell_split")[0],
    )


def _block(dim: int):
    return te.Float8BlockQuantizer(_E4M3, rowwise=True, columnwise=True, block_scaling_dim=dim)


def _f32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32).double()


@pytest.mark.parametrize("layout", ["TN", "NT"])
def test_blockwise_one_k_tile_follows_tes_cublas_reference(layout: str) -> None:
    """TE tests/pytorch/references/blockwise_fp8_gemm_reference.py:207-232 with one 128-wide K tile:
    ``y = fl32(fl32(P * s_x) * s_w)`` (1D activations x 1D or 2D weights).  "TN": a 1x128 input times a
    128x128 weight (rowwise data, 1D scales stored (K/128, M)); "NT" (wgrad): both columnwise, TE's
    transposed data ``(k, m)`` with 1D scales stored (m/128, k)."""
    if layout == "TN":
        w, x = _block(2)(_hp(64, 128, seed=23)), _block(1)(_hp(32, 128, seed=24))
        left, s_left = x._rowwise_data, x._rowwise_scale_inv[0, :32].reshape(32, 1)
        right, s_right = w._rowwise_data, w._rowwise_scale_inv[0, 0]
        got = general_gemm(w, x, out_dtype=torch.float32, accumulator="exact")[0]
    else:
        x, dy = _block(1)(_hp(128, 32, seed=25)), _block(1)(_hp(128, 64, seed=26))
        left, s_left = dy._columnwise_data, dy._columnwise_scale_inv[0, :64].reshape(64, 1)
        right, s_right = x._columnwise_data, x._columnwise_scale_inv[0, :32].reshape(1, 32)
        got = general_gemm(x, dy, out_dtype=torch.float32, layout="NT", accumulator="exact")[0]
    p = _f32(left.view(torch.float8_e4m3fn).double() @ right.view(torch.float8_e4m3fn).double().t())
    want = (_f32(p * s_left.double()) * s_right.double()).float()
    assert torch.equal(got, want)


@pytest.mark.parametrize("split", [False, True])
def test_use_split_accumulator_selects_the_device_accumulator(split: bool) -> None:
    """TE passes ``use_split_accumulator`` to cuBLAS (``gemm.py:297`` of csrc): the emulated hopper's
    fast or split accumulator, as ``fp8sim.gemm.scaled_mm`` runs it on the same codes."""
    w, x = _fp8(_hp(16, 512, seed=5)), _fp8(_hp(16, 512, seed=6))
    out = general_gemm(w, x, out_dtype=torch.float32, use_split_accumulator=split)[0]
    ref = scaled_mm(
        x._data.numpy(),
        w._data.numpy().T.copy(),
        np.float32(0.25),
        np.float32(0.25),
        out_dtype="float32",
        accumulator="hopper_split" if split else "hopper_fast",
        a_format="e4m3",
        b_format="e4m3",
    )
    assert torch.equal(out, torch.from_numpy(np.asarray(ref)))
    other = general_gemm(w, x, out_dtype=torch.float32, use_split_accumulator=not split)[0]
    assert not torch.equal(out, other)  # K=512: the fast accumulator's truncation shows


def test_bias_gelu_and_accumulate_epilogues() -> None:
    """cuBLAS epilogues in float32, one rounding: ``gelu(acc + bias)`` with the pre-GELU output returned;
    ``accumulate``: ``out + acc`` written into ``out`` (beta defaults to 1)."""
    a, b = _hp(24, 32, seed=7), _hp(16, 32, seed=8)
    bias = _hp(24, seed=9)
    acc = torch.matmul(b.float(), a.float().t())
    out, _, pre, _ = general_gemm(a, b, bias=bias, gelu=True)
    assert torch.equal(pre, (acc + bias.float()).to(torch.bfloat16))
    assert torch.equal(out, torch.nn.functional.gelu(acc + bias.float(), approximate="tanh").to(torch.bfloat16))
    target = _hp(16, 24, seed=10, dtype=torch.float32)
    before = target.clone()
    res = general_gemm(a, b, out=target, accumulate=True)[0]
    assert res is target and torch.equal(target, before + acc)


def test_grad_epilogue_returns_the_bias_gradient_and_applies_dgelu() -> None:
    """``grad=True`` (TE's wgrad with a fused dbias): ``bias_grad`` is the float32 sum of ``B``'s rows in the
    bias dtype; with ``gelu`` the result is multiplied by the tanh GELU's derivative at ``gelu_in``."""
    x, dy = _hp(8, 32, seed=11), _hp(8, 16, seed=12)
    bias = torch.zeros(16, dtype=torch.bfloat16)
    wgrad, dbias, _, _ = general_gemm(x, dy, layout="NT", grad=True, bias=bias, out_dtype=torch.float32)
    assert torch.equal(dbias, dy.float().sum(0).to(torch.bfloat16))
    assert torch.equal(wgrad, torch.matmul(dy.float().t(), x.float()))
    gin = _hp(8, 32, seed=13, dtype=torch.float32).requires_grad_()
    torch.nn.functional.gelu(gin, approximate="tanh").sum().backward()
    w = _hp(16, 32, seed=14)
    dgrad = general_gemm(w, dy, layout="NN", grad=True, gelu=True, gelu_in=gin.detach(), out_dtype=torch.float32)[0]
    # cuBLAS's dGELU formula is not published: checked against torch's tanh-GELU derivative to float32 noise
    assert torch.allclose(dgrad, torch.matmul(dy.float(), w.float()) * gin.grad, rtol=1e-5, atol=1e-6)


def test_refusals_in_te_words() -> None:
    """gemm.py:260 (layout), :75 (beta without accumulate), :292 (non-contiguous out)."""
    a, b = _hp(8, 16, seed=15), _hp(8, 16, seed=16)
    with pytest.raises(AssertionError, match="GEMM layout TT not supported"):
        general_gemm(a, b, layout="TT")
    with pytest.raises(ValueError, match="scale must be zero"):
        general_gemm(a, b, beta=0.5)
    with pytest.raises(ValueError, match="Output tensor is not contiguous"):
        general_gemm(a, b, out=torch.empty(8, 8).t(), accumulate=True)
    with pytest.raises(TypeError, match="A is fp8 and B is hp; both must be"):
        general_gemm(_fp8(a), b)
    nvfp4 = te.NVFP4Quantizer()
    with pytest.raises(RuntimeError, match="FP4 GEMM does not support FP16 output!"):  # cublaslt_gemm.cu:430
        general_gemm(nvfp4(_hp(32, 32, seed=17)), nvfp4(_hp(32, 32, seed=18)), out_dtype=torch.float16)
    row_scaled = te.NVFP4Quantizer(row_scaled_nvfp4=True, columnwise=False)(_hp(32, 32, seed=17))
    with pytest.raises(AssertionError, match="Row-scaled NVFP4 GEMM currently does not support fused GELU."):
        general_gemm(nvfp4(_hp(32, 32, seed=18)), row_scaled, gelu=True)  # gemm.py:302
    rowwise_only = te.MXFP8Quantizer(_E4M3, columnwise=False)(_hp(32, 32, seed=17))
    with pytest.raises(RuntimeError, match="GEMM requested the columnwise representation, but it is unavailable"):
        general_gemm(rowwise_only, te.MXFP8Quantizer(_E4M3)(_hp(32, 32, seed=18)), layout="NN")


def test_earlier_signature_with_a_workspace_argument() -> None:
    """TE 2.x before alpha/beta: ``general_gemm(A, B, workspace, out_dtype=...)``; the workspace is ignored."""
    a, b = _hp(8, 16, seed=19), _hp(4, 16, seed=20)
    got = general_gemm(a, b, torch.empty(1024, dtype=torch.uint8), out_dtype=torch.float32)[0]
    assert torch.equal(got, general_gemm(a, b, out_dtype=torch.float32)[0])


_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _nvfp4_scaled_ints(t, usage: str) -> np.ndarray:
    """An NVFP4Tensor's representation from its raw bytes (TE nvfp4_tensor.py layout: element 2i in the low
    nibble; rowwise ``(m, k)``, columnwise ``(k, m)``; uint8 UE4M3 scales per 16 along the rows) as
    ``code * scale * 2**10`` integers (E2M1 values are multiples of 1/2, E4M3 ones of 2**-9: exact)."""
    m, k = int(np.prod(t.shape[:-1])), t.shape[-1]
    rows, cols = (m, k) if usage == "rowwise" else (k, m)
    data = (t._rowwise_data if usage == "rowwise" else t._columnwise_data).reshape(rows, cols // 2).numpy()
    nib = np.stack([data & 0xF, data >> 4], axis=-1).reshape(rows, cols).astype(np.int64)
    vals = np.array([v * 2 for v in _E2M1_VALUES] + [-v * 2 for v in _E2M1_VALUES], np.int64)[nib]
    s = (t._rowwise_scale_inv if usage == "rowwise" else t._columnwise_scale_inv)[:rows, : cols // 16]
    e4m3 = s.contiguous().view(torch.float8_e4m3fn).double().numpy() * 2**9
    return vals * np.repeat(e4m3.astype(np.int64), 16, axis=1)  # times 2**10


@pytest.mark.parametrize(
    ("layout", "a_shape", "b_shape", "a_usage", "b_usage"),
    [
        ("TN", (32, 64), (16, 64), "rowwise", "rowwise"),  # fprop: x @ W.T
        ("NN", (32, 64), (16, 32), "columnwise", "rowwise"),  # dgrad: dy @ W
        ("NT", (32, 64), (32, 48), "columnwise", "columnwise"),  # wgrad: dy.T @ x
    ],
)
@pytest.mark.parametrize("emax", [448, 256])
def test_nvfp4_layouts_and_global_scales_follow_te_cublas(layout, a_shape, b_shape, a_usage, b_usage, emax) -> None:
    """cublaslt_gemm.cu ``CanonicalizeGemmInput`` lines 164-178 / 255-266 (``A`` rowwise for "T?", else
    columnwise; ``B`` columnwise for "?T", else rowwise) and lines 364-385 + ``recipe/nvfp4.cu`` lines 72-78
    (``alpha * amax_A * amax_B * fl32(1 / (36 * E_A * E_B))``, rowwise amax of ``A`` when transposed, of ``B``
    when not; ``E`` the tensor's E4M3 max, 256 for such 4over6 tensors).  With the exact accumulator:
    ``fl32(fl32(exact integer sum) * alpha)``, here from the raw codes and scales."""
    q = te.NVFP4Quantizer(nvfp4_use_4over6=emax == 256, nvfp4_e4m3_max=emax)
    a, b = q(_hp(*a_shape, seed=31)), q(_hp(*b_shape, seed=32))
    got = general_gemm(a, b, out_dtype=torch.float32, layout=layout, alpha=0.75, accumulator="exact")[0]
    ia, ib = _nvfp4_scaled_ints(a, a_usage), _nvfp4_scaled_ints(b, b_usage)
    acc = [[sum(int(x) * int(y) for x, y in zip(row, col, strict=True)) for col in ia] for row in ib]  # B-side rows
    assert max(abs(v) for r in acc for v in r) < 2**53  # exact in float64, so one rounding to float32
    acc32 = (np.array(acc, np.float64) * 2.0**-20).astype(np.float32)
    amax_a = np.float32((a._amax_rowwise if layout[0] == "T" else a._amax_columnwise).item())
    amax_b = np.float32((b._amax_rowwise if layout[1] == "N" else b._amax_columnwise).item())
    alpha = np.float32(np.float32(np.float32(0.75) * amax_a) * amax_b) * (np.float32(1) / np.float32(36 * emax * emax))
    want = torch.from_numpy((acc32 * np.float32(alpha)).astype(np.float32))
    assert torch.equal(got, want)
    dflt = general_gemm(a, b, out_dtype=torch.bfloat16, layout=layout)[0]  # NVFP4 runs on Blackwell only
    blackwell = general_gemm(a, b, out_dtype=torch.bfloat16, layout=layout, accumulator="blackwell")[0]
    assert torch.equal(dflt, blackwell)


def test_nvfp4_row_scaled_operand_takes_tes_python_epilogue() -> None:
    """TE ``cpp_extensions/gemm.py`` lines 299-371 (``_nvfp4_row_scaled_gemm_inputs`` 84-116): the GEMM with both
    amaxes replaced by 1 into float32 (``alpha * fl32(1 / (36 * 448 * 448))``), then ``out *= row_amax(B) *
    amax(A)`` (one per-row product, the weight's amax being one value), ``+ bias``, then the output dtype;
    ``accumulate`` adds the converted result to ``out``."""
    x = _hp(32, 64, seed=41)
    xq = te.NVFP4Quantizer(row_scaled_nvfp4=True, columnwise=False)(x)  # fprop input, one amax per row
    wq = te.NVFP4Quantizer()(_hp(16, 64, seed=42))
    bias = _hp(16, seed=43)
    got = general_gemm(wq, xq, out_dtype=torch.bfloat16, layout="TN", alpha=0.5, bias=bias, accumulator="exact")[0]
    ia, ib = _nvfp4_scaled_ints(wq, "rowwise"), _nvfp4_scaled_ints(xq, "rowwise")
    acc = (np.array([[int(np.dot(r, c)) for c in ia] for r in ib], np.float64) * 2.0**-20).astype(np.float32)
    alpha = np.float32(0.5) * (np.float32(1) / np.float32(36 * 448 * 448))
    scales = (xq._amax_rowwise.numpy() * np.float32(wq._amax_rowwise.item())).astype(np.float32)
    want = (acc * alpha).astype(np.float32) * scales[:, None] + bias.float().numpy()[None, :]
    assert torch.equal(got, torch.from_numpy(want.astype(np.float32)).to(torch.bfloat16))
    out = _hp(32, 16, seed=44)
    res = general_gemm(wq, xq, layout="TN", alpha=0.5, bias=bias, out=out.clone(), accumulate=True, accumulator="exact")
    assert torch.equal(res[0], out + torch.from_numpy(want.astype(np.float32)).to(torch.bfloat16))


@pytest.mark.parametrize("out_q", ["current", "mxfp8", "delayed_hp_operands"])
def test_unfused_output_quantization_casts_the_d_written_in_the_output_dtype(out_q: str) -> None:
    """TE gemm.cpp 218-233, 394-397: only a Float8Quantizer with per-tensor FP8 operands is fused (cuBLAS writes
    FP8); every other output quantizer casts D as the GEMM wrote it, in the output dtype (here bf16, so twice
    rounded: bf16, then FP8)."""
    a, b = _hp(64, 64, seed=31).to(torch.bfloat16), _hp(64, 64, seed=32).to(torch.bfloat16)
    q = {
        "current": te.Float8CurrentScalingQuantizer(_E4M3),
        "mxfp8": te.MXFP8Quantizer(_E4M3),
        "delayed_hp_operands": te.Float8Quantizer(torch.ones(1), torch.zeros(1), _E4M3),
    }[out_q]
    if out_q != "delayed_hp_operands":
        fp8 = te.Float8CurrentScalingQuantizer(_E4M3)
        a, b = fp8(a), fp8(b)
    got = general_gemm(a, b, torch.bfloat16, quantization_params=q)[0]
    d_bf16 = general_gemm(a, b, torch.bfloat16)[0]
    want = q(d_bf16).dequantize(dtype=torch.float32)
    assert torch.equal(got.dequantize(dtype=torch.float32), want)
    once = q(general_gemm(a, b, torch.float32)[0]).dequantize(dtype=torch.float32)
    assert not torch.equal(once, want)  # the bf16 step is there
    with pytest.raises(NotImplementedError, match="not supported as a native GEMM output quantizer"):
        general_gemm(a, b, torch.bfloat16, quantization_params=te.IdentityQuantizer())
