"""FP8 DotProductAttention, bit for bit against a reference written here from TE's quantization points.

Points and slots (TE ``attention/dot_product_attention/backends.py`` ``FusedAttnFunc`` and
``utils.py`` ``get_attention_quantizers``/``combine_and_quantize``; slot numbers from
``cpp_extensions/fused_attn.py`` META_QKV = GEMM1_OUTPUT = 2, META_O = GEMM2_INPUT = 3,
META_S = GEMM3_OUTPUT = 8, META_DQKV = GRAD_OUTPUT1 = 0, META_DO = GRAD_INPUT2 = 3,
META_DP = GRAD_INPUT3 = 5): Q, K, V share one scale; P (after softmax) uses S; O uses O (delayed
scaling only); dO; dS (gradient of the scaled scores) uses dP; dQ, dK, dV share dQKV (delayed only).
Current scaling: S/dP keep a delayed state with history 1 and ``most_recent``
(``dot_product_attention.py`` ``init_fp8_metadata``, ``NVTE_DPA_FP8DS_*`` defaults).
Casts are ``ml_dtypes`` of the clamped, scaled float32 values; MX scales are TE's RCEIL rule written
here with numpy bit operations (spec section 3).

GEMMs of FP8 operands (independent of ``backends._mm``, which runs ``torch.matmul`` or ``scaled_mm``): the
bit-exact tests run under ``accumulator="exact"`` and the reference sums the exact products in Python integers,
rounded once to float32 (``tests/_gemm_reference.py``), then ``fl32(. * fl32(sa * sb))``; under ``"hopper"``
the reference chains ``fp8sim.gemm.dot_add`` instructions (fast: TE's fused attention is cuDNN's, one chain).
GEMMs with a high-precision operand (MXFP8's float32 P, the dequantized MX values, ``NVTE_FP8_DPA_BWD=0``) are
float32 matmuls of values the test computes itself: there torch's float32 matmul is the contract (the
emulation's ``accumulator=None`` is "sum in float32 in BLAS order"), not a restatement.  The default
accumulator on FP8 operands has its own test (:func:`test_default_accumulator_sums_fp8_products_in_float32`).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

import _gemm_reference as gref  # noqa: E402

import fp8sim.pytorch as te  # noqa: E402
from fp8sim.pytorch.attention import DotProductAttention  # noqa: E402
from fp8sim.recipe import DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling  # noqa: E402

torch.set_num_threads(1)
E4, E5 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2
MAX = {E4: 448.0, E5: 57344.0}


def q8(x: torch.Tensor, scale: float, dt) -> tuple[torch.Tensor, np.float32]:
    """satfinite(RN(fl32(x) * scale)) decoded, and scale_inv = fl32(1 / scale)."""
    y = (x.detach().float() * torch.tensor(scale, dtype=torch.float32)).numpy()
    y = np.clip(y, -MAX[dt], MAX[dt]).astype(dt).astype(np.float32)
    return torch.from_numpy(y), np.float32(1) / np.float32(scale)


def mx(x: torch.Tensor, dt, axis: int) -> torch.Tensor:
    """MXFP8 (TE flavour) dequantized: blocks of 32 along ``axis``, E8M0 by RCEIL of amax/max."""
    a = np.moveaxis(x.detach().float().numpy(), axis, -1)
    blocks = a.reshape(*a.shape[:-1], -1, 32)
    amax = np.abs(blocks).max(axis=-1, keepdims=True).astype(np.float32)
    d = (amax * np.float32(np.float32(1) / np.float32(MAX[dt]))).astype(np.float32)
    bits = d.view(np.uint32)
    exp, man = (bits >> 23) & 0xFF, bits & 0x7FFFFF
    e = np.where(exp == 0, (man > 0x400000).astype(np.uint32), exp + (man != 0)).astype(np.int64)
    e = np.minimum(e, 254)
    inv = np.ldexp(np.float32(1), 127 - e).astype(np.float32)
    elem = np.clip(blocks * inv, -MAX[dt], MAX[dt]).astype(dt).astype(np.float32)
    out = (elem * np.ldexp(np.float32(1), e - 127).astype(np.float32)).reshape(a.shape)
    return torch.from_numpy(np.ascontiguousarray(np.moveaxis(out, -1, axis)))


def _batched(fn, a, b):
    """``fn`` on every (M, K) x (K, N) matrix pair of two broadcast batches."""
    lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = a.expand(*lead, *a.shape[-2:]).reshape(-1, *a.shape[-2:])
    b = b.expand(*lead, *b.shape[-2:]).reshape(-1, *b.shape[-2:])
    outs = [torch.from_numpy(np.asarray(fn(a[i], b[i]), np.float32)) for i in range(a.shape[0])]
    return torch.stack(outs).reshape(*lead, a.shape[-2], b.shape[-1])


def _fmt(x):
    """The FP8 format of a tensor of code values: E4M3 unless a value is only E5M2 (dO, dP)."""
    return "e4m3" if np.array_equal(x.numpy().astype(E4).astype(np.float32), x.numpy()) else "e5m2"


# the FP8 GEMM's sum: "exact" (exact sum rounded once) or an instruction chain; set by the tests
FP8_SUM = {"kind": "exact"}


def mm(a, b, sa=None, sb=None):
    """``a @ b``: FP8 operands (``sa``, ``sb`` their scale_inv) by the accumulator in ``FP8_SUM`` and the
    epilogue; high-precision operands (``sa`` None) by torch's float32 matmul."""
    if sa is None:
        return torch.matmul(a, b)
    if FP8_SUM["kind"] == "exact":
        d = _batched(gref.rn_f32, a, b)
    else:
        fa, fb = _fmt(a), _fmt(b)
        d = _batched(
            lambda x, y: gref.chain(gref.codes_of(x, fa), gref.codes_of(y, fb), fa, fb, FP8_SUM["kind"], None), a, b
        )
    return d * torch.tensor(np.float32(sa) * np.float32(sb), dtype=torch.float32)


def _amax(*ts):
    return max(float(t.abs().max()) for t in ts)


def _grouped(k, g):
    return k.repeat_interleave(g, dim=1)


def _group_sum(dk, g):
    return dk.reshape(dk.shape[0], -1, g, *dk.shape[2:]).sum(2)


def reference(q, k, v, do, scale, causal, kind, scales=None, amax=None):
    """Forward and backward at the documented quantization points; bhsd float32; GQA: K, V quantized
    per group, expanded to the query heads for the GEMMs, dK, dV summed over each group's heads.
    ``amax`` (a dict) receives the amax of every tensor a per-tensor quantizer casts."""
    amax = {} if amax is None else amax
    s = q.shape[-2]
    if isinstance(causal, torch.Tensor):  # an explicit mask, True = masked; fully masked rows give 0
        mask = causal
    else:
        mask = torch.ones(s, s, dtype=torch.bool).triu(1) if causal else None
    if kind == "mxfp8":
        qv, kv, vv = mx(q, E4, -1), mx(k, E4, -1), mx(v, E4, -2)
        sc = mm(qv, kv.transpose(-1, -2)) * scale
    else:
        amax_qkv = amax["qkv"] = _amax(q, k, v)
        s_qkv = scales["qkv"] if kind == "delayed" else np.float32(448) / np.float32(amax_qkv)
        (qv, si), (kv, _), (vv, _) = (q8(t, s_qkv, E4) for t in (q, k, v))
        g = q.shape[1] // k.shape[1]
        kv, vv = _grouped(kv, g), _grouped(vv, g)
        sc = mm(qv, kv.transpose(-1, -2), si, si) * scale
    if mask is not None:
        sc = sc.masked_fill(mask, float("-inf"))
    p = torch.softmax(sc, dim=-1)
    if mask is not None:
        p = torch.nan_to_num(p, nan=0.0)  # rows with every key masked: zero, as cuDNN writes them
    if kind == "mxfp8":
        pv, sp = p, None
        o = mm(pv, vv)
        out = o
    else:
        amax["s"] = _amax(p)
        pv, sp = q8(p, scales["s"], E4)
        o = mm(pv, vv, sp, si)
        if kind == "delayed":
            amax["o"] = _amax(o)
            ov, so = q8(o, scales["o"], E4)
            out = ov * torch.tensor(so)
        else:
            out = o
    # backward
    if kind == "mxfp8":
        do_r, do_c = mx(do, E4, -1), mx(do, E4, -2)  # MXFP8BlockScaling defaults to E4M3 for gradients too
        dv = mm(pv.transpose(-1, -2), do_c)
        dp = mm(do_r, mx(v, E4, -1).transpose(-1, -2))
        ds = p * (dp - (do_r * out).sum(-1, keepdim=True))
        dq = mm(ds, mx(k, E4, -2)) * scale
        dk = mm(ds.transpose(-1, -2), mx(q, E4, -2)) * scale
        return out, (dq, dk, dv)
    amax["do"] = _amax(do)
    s_do = scales["do"] if kind == "delayed" else np.float32(57344) / np.float32(float(do.abs().max()))
    dov, sdo = q8(do, s_do, E5)
    dv = mm(pv.transpose(-1, -2), dov, sp, sdo)
    dp = mm(dov, vv.transpose(-1, -2), sdo, si)
    ds = p * (dp - (dov * torch.tensor(sdo) * out).sum(-1, keepdim=True))
    amax["dp"] = _amax(ds)
    dsv, sds = q8(ds, scales["dp"], E5)
    dq = mm(dsv, kv, sds, si) * scale
    dk = _group_sum(mm(dsv.transpose(-1, -2), qv, sds, si) * scale, g)
    dv = _group_sum(dv, g)
    if kind == "delayed":
        amax["dqkv"] = _amax(dq, dk, dv)
        dq, dk, dv = (q8(t, scales["dqkv"], E5) for t in (dq, dk, dv))
        dq, dk, dv = (t * torch.tensor(sinv) for t, sinv in (dq, dk, dv))
    return out, (dq, dk, dv)


def _data(b, s, h, d, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, s, h, d, generator=g) * c for c in (1.5, 0.7, 2.0, 1e-3)]


def _bhsd(x):
    return x.permute(0, 2, 1, 3)


def _assert_bits(got, want, what):
    got, want = got.detach().contiguous(), want.detach().contiguous()
    eq = got.view(torch.int32) == want.view(torch.int32)
    if not bool(eq.all()):
        i = int((~eq).flatten().nonzero()[0])
        g, w = got.flatten()[i], want.flatten()[i]
        raise AssertionError(
            f"{what}: first difference at flat index {i}: got {float(g)!r} "
            f"(0x{int(g.view(torch.int32)) & 0xFFFFFFFF:08x}), want {float(w)!r} "
            f"(0x{int(w.view(torch.int32)) & 0xFFFFFFFF:08x})"
        )


def _run(dpa, recipe, q, k, v, do, accumulator="exact"):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    with te.autocast(recipe=recipe, accumulator=accumulator):
        out = dpa(q, k, v)
    out.backward(do.reshape(out.shape))
    return out, (q.grad, k.grad, v.grad)


SCALES = {"qkv": 64.0, "s": 256.0, "o": 32.0, "do": 2.0**20, "dp": 2.0**14, "dqkv": 1024.0}


@pytest.mark.parametrize("hg", [4, 1])
@pytest.mark.parametrize("causal", [False, True])
def test_delayed_scaling_forward_backward_bit_exact(causal, hg):
    b, s, h, d = 2, 16, 4, 16
    q, k, v, do = _data(b, s, h, d, seed=1)
    k, v = k[:, :, :hg].contiguous(), v[:, :, :hg].contiguous()
    dpa = DotProductAttention(
        h, d, num_gqa_groups=hg, qkv_format="bshd", attn_mask_type="causal" if causal else "no_mask"
    )
    recipe = DelayedScaling(fp8_dpa=True, amax_history_len=4)
    # hand-chosen scales in TE's slots (fwd QKV=2, O=3, S=8; bwd dQKV=0, dO=3, dP=5)
    fwd, bwd = torch.ones(9), torch.ones(6)
    fwd[2], fwd[3], fwd[8] = SCALES["qkv"], SCALES["o"], SCALES["s"]
    bwd[0], bwd[3], bwd[5] = SCALES["dqkv"], SCALES["do"], SCALES["dp"]
    dpa.set_extra_state(
        {
            "fwd_scale": fwd,
            "fwd_amax_history": torch.zeros(4, 9),
            "bwd_scale": bwd,
            "bwd_amax_history": torch.zeros(4, 6),
        }
    )
    out, grads = _run(dpa, recipe, q, k, v, do)
    ref_out, ref_grads = reference(*(_bhsd(t) for t in (q, k, v, do)), d**-0.5, causal, "delayed", SCALES)
    _assert_bits(_bhsd(out.reshape(b, s, h, d)), ref_out, "O")
    for name, g, r in zip("QKV", grads, ref_grads, strict=True):
        _assert_bits(_bhsd(g), r, f"d{name}")


def test_delayed_scaling_padding_causal_bit_exact():
    """Padded sequences (lengths 16 and 9): padded keys masked, padded query rows zero."""
    b, s, h, d = 2, 16, 2, 16
    q, k, v, do = _data(b, s, h, d, seed=7)
    lens = torch.tensor([16, 9])
    pad = torch.arange(s).view(1, s) >= lens.view(b, 1)
    do = do.masked_fill(pad.view(b, s, 1, 1), 0.0)  # no gradient flows into padded rows
    dpa = DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="padding_causal")
    q_, k_, v_ = (t.clone().requires_grad_() for t in (q, k, v))
    with te.autocast(recipe=DelayedScaling(fp8_dpa=True), accumulator="exact"):
        out = dpa(q_, k_, v_, attention_mask=pad.view(b, 1, 1, s))
    out.backward(do.reshape(out.shape))
    mask = torch.ones(s, s, dtype=torch.bool).triu(1) | pad.view(b, 1, 1, s) | pad.view(b, 1, s, 1)
    ones = dict.fromkeys(SCALES, 1.0)  # step 1
    ref_out, ref_grads = reference(*(_bhsd(t) for t in (q, k, v, do)), d**-0.5, mask, "delayed", ones)
    _assert_bits(_bhsd(out.reshape(b, s, h, d)), ref_out, "O")
    for name, g, r in zip("QKV", (q_.grad, k_.grad, v_.grad), ref_grads, strict=True):
        _assert_bits(_bhsd(g), r, f"d{name}")


def test_current_scaling_forward_backward_bit_exact():
    b, s, h, d = 1, 16, 2, 16
    q, k, v, do = _data(b, s, h, d, seed=2)
    dpa = DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="causal")
    out, grads = _run(dpa, Float8CurrentScaling(fp8_dpa=True), q, k, v, do)
    # S and dP: TE's delayed-scaling state for current scaling starts at scale 1
    ref_out, ref_grads = reference(*(_bhsd(t) for t in (q, k, v, do)), d**-0.5, True, "current", {"s": 1.0, "dp": 1.0})
    _assert_bits(_bhsd(out.reshape(b, s, h, d)), ref_out, "O")
    for name, g, r in zip("QKV", grads, ref_grads, strict=True):
        _assert_bits(_bhsd(g), r, f"d{name}")
    # after the step: S/dP history 1, most_recent -> scale = max / amax of this step
    assert dpa.fwd.amax_history.shape == (1, 9)


def test_mxfp8_forward_backward_bit_exact():
    b, s, h, d = 1, 128, 1, 32
    q, k, v, do = _data(b, s, h, d, seed=3)
    dpa = DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="causal")
    out, grads = _run(dpa, MXFP8BlockScaling(fp8_dpa=True), q, k, v, do, accumulator=None)
    ref_out, ref_grads = reference(*(_bhsd(t) for t in (q, k, v, do)), d**-0.5, True, "mxfp8")
    _assert_bits(_bhsd(out.reshape(b, s, h, d)), ref_out, "O")
    for name, g, r in zip("QKV", grads, ref_grads, strict=True):
        _assert_bits(_bhsd(g), r, f"d{name}")


FWD_SLOTS = {"qkv": 2, "o": 3, "s": 8}
BWD_SLOTS = {"dqkv": 0, "do": 3, "dp": 5}


def test_delayed_scaling_slots_follow_hand_computed_trajectory():
    """Two steps, every attention slot: the reference's amaxes land in TE's slots; forward scales update
    at autocast exit and backward scales at the end of the backward, to fp8_max / max(history) (IEEE
    float32 division, spec 4.5); step 2 quantizes with the step-1 scales."""
    b, s, h, d = 1, 8, 2, 16
    dpa = DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="causal")
    recipe = DelayedScaling(fp8_dpa=True, amax_history_len=2)
    scales = dict.fromkeys(list(FWD_SLOTS) + list(BWD_SLOTS), 1.0)  # step 1: every scale is 1
    history: dict[str, list[float]] = {}
    for step in range(2):
        q, k, v, do = _data(b, s, h, d, seed=10 + step)
        amax: dict[str, float] = {}
        ref_out, ref_grads = reference(*(_bhsd(t) for t in (q, k, v, do)), d**-0.5, True, "delayed", scales, amax)
        out, grads = _run(dpa, recipe, q, k, v, do)
        _assert_bits(_bhsd(out.reshape(b, s, h, d)), ref_out, f"O step {step}")
        for name, g, r in zip("QKV", grads, ref_grads, strict=True):
            _assert_bits(_bhsd(g), r, f"d{name} step {step}")
        for slots, state, fmax in ((FWD_SLOTS, dpa.fwd, 448), (BWD_SLOTS, dpa.bwd, 57344)):
            for name, j in slots.items():
                history.setdefault(name, []).append(amax[name])
                assert state.amax_history[0, j] == 0 and state.amax_history[1, j] == np.float32(amax[name]), name
                want = np.float32(fmax) / np.float32(max(history[name]))
                assert state.scale[j] == want, (step, name, state.scale[j], want)
                scales[name] = float(want)


def test_nvte_fp8_dpa_bwd_0_runs_backward_in_high_precision(monkeypatch):
    b, s, h, d = 1, 8, 2, 16
    q, k, v, do = _data(b, s, h, d, seed=4)
    monkeypatch.setenv("NVTE_FP8_DPA_BWD", "0")
    dpa = DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="causal")
    # under an accumulator (exact): the F16 backward's GEMMs sum in float32 (fp8sim refused them as MXFP8's)
    out, grads = _run(dpa, DelayedScaling(fp8_dpa=True), q, k, v, do)
    # high-precision backward from the unquantized inputs, the returned O and the FP8 forward's
    # softmax statistics (TE passes the FP8 forward's aux_ctx_tensors to the F16 fused_attn_bwd)
    qb, kb, vb, dob = (_bhsd(t) for t in (q, k, v, do))
    causal = torch.ones(s, s, dtype=torch.bool).triu(1)
    (q8v, si), (k8v, _) = q8(qb, 1.0, E4), q8(kb, 1.0, E4)  # step 1: delayed scale 1
    lse = torch.logsumexp(
        (mm(q8v, k8v.transpose(-1, -2), si, si) * d**-0.5).masked_fill(causal, float("-inf")), -1, keepdim=True
    )
    sc = mm(qb, kb.transpose(-1, -2)) * d**-0.5
    p = torch.exp(sc.masked_fill(causal, float("-inf")) - lse)
    o = _bhsd(out.reshape(b, s, h, d))
    dv = mm(p.transpose(-1, -2), dob)
    ds = p * (mm(dob, vb.transpose(-1, -2)) - (dob * o).sum(-1, keepdim=True))
    dq, dk = mm(ds, kb) * d**-0.5, mm(ds.transpose(-1, -2), qb) * d**-0.5
    for name, g, r in zip("QKV", grads, (dq, dk, dv), strict=True):
        _assert_bits(_bhsd(g), r, f"d{name}")


def test_fp8_dpa_off_is_high_precision():
    b, s, h, d = 1, 8, 2, 16
    q, k, v, _ = _data(b, s, h, d, seed=5)
    dpa = DotProductAttention(h, d, qkv_format="bshd")
    with te.autocast(recipe=DelayedScaling()):
        a = dpa(q, k, v)
    _assert_bits(a, dpa(q, k, v), "O")
    assert dpa.fwd is None


def test_mxfp8_shape_requirement_has_te_message():
    dpa = DotProductAttention(2, 16, qkv_format="bshd")
    x = torch.randn(1, 8, 2, 16)
    with pytest.raises(AssertionError, match="MXFP8 quantization requires s_q % 128 == 0"):
        with te.autocast(recipe=MXFP8BlockScaling(fp8_dpa=True)):
            dpa(x, x, x)


@pytest.mark.parametrize("where", ["module", "autocast"])
@pytest.mark.parametrize("device", ["hopper", "ada"])
def test_device_accumulator_chains_every_attention_gemm(device, where):
    """``DotProductAttention(accumulator=device)`` or ``autocast(accumulator=device)`` (which overrides the
    module's): every FP8 GEMM (QK^T, PV, dV, dP, dQ, dK) is one fast chain of the device's instruction
    (``dot_add``) per (batch, head), then the epilogue; the exact sum gives other bits on this data, so
    dropping the option fails."""
    b, s, h, d = 1, 32, 2, 32
    q, k, v, do = _data(b, s, h, d, seed=6)
    own = device if where == "module" else "exact"
    dpa = DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="causal", accumulator=own)
    out, grads = _run(dpa, DelayedScaling(fp8_dpa=True), q, k, v, do, accumulator=None if own == device else device)
    ones = dict.fromkeys(SCALES, 1.0)
    FP8_SUM["kind"] = {"hopper": "hopper_wgmma", "ada": "ada_mma"}[device]
    try:
        ref_out, ref_grads = reference(*(_bhsd(t) for t in (q, k, v, do)), d**-0.5, True, "delayed", ones)
    finally:
        FP8_SUM["kind"] = "exact"
    _assert_bits(_bhsd(out.reshape(b, s, h, d)), ref_out, "O")
    for name, g, r in zip("QKV", grads, ref_grads, strict=True):
        _assert_bits(_bhsd(g), r, f"d{name}")
    exact_out, exact_grads = reference(*(_bhsd(t) for t in (q, k, v, do)), d**-0.5, True, "delayed", ones)
    assert not torch.equal(exact_out, ref_out) or not all(
        torch.equal(a, c) for a, c in zip(exact_grads, ref_grads, strict=True)
    )


def test_default_accumulator_sums_fp8_products_in_float32():
    """``accumulator=None`` (the default): each FP8 GEMM is the exact products summed in float32 in BLAS order,
    then the epilogue.  The order is the BLAS kernel's, so bits are not the contract here: output and gradients
    stay within a few float32 ulps (relative 1e-5 of the largest magnitude) of the exact-sum reference, far
    closer than a wrong scale, format or GEMM operand would put them."""
    b, s, h, d = 1, 16, 2, 16
    q, k, v, do = _data(b, s, h, d, seed=6)
    dpa = DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="causal")
    out, grads = _run(dpa, DelayedScaling(fp8_dpa=True), q, k, v, do, accumulator=None)
    ones = dict.fromkeys(SCALES, 1.0)
    ref_out, ref_grads = reference(*(_bhsd(t) for t in (q, k, v, do)), d**-0.5, True, "delayed", ones)
    pairs = [("O", _bhsd(out.reshape(b, s, h, d)), ref_out)]
    pairs += [(name, _bhsd(g), r) for name, g, r in zip("QKV", grads, ref_grads, strict=True)]
    for name, g, r in pairs:
        tol = 1e-5 * float(r.abs().max())
        assert float((g.detach() - r).abs().max()) <= tol, name


# ---- causality: a law of the mask, and what each scaling recipe does to it ----------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def _causal_outputs(recipe, q, k, v, t, factor):
    """Outputs at positions <= t before and after the tokens after t are scaled by ``factor``."""
    q2, k2, v2 = (x.clone() for x in (q, k, v))
    for x in (q2, k2, v2):
        x[:, t + 1 :] *= factor
    dpa = DotProductAttention(q.shape[2], q.shape[3], qkv_format="bshd", attn_mask_type="causal")
    with torch.no_grad(), te.autocast(enabled=recipe is not None, recipe=recipe, _graph=True):  # no scale update
        return dpa(q, k, v)[:, : t + 1], dpa(q2, k2, v2)[:, : t + 1]


@settings(max_examples=15, deadline=None)
@given(t=st.integers(0, 126), factor=st.sampled_from([0.01, 3.0, 100.0]), seed=st.integers(0, 2**16))
def test_causal_outputs_ignore_future_tokens_in_high_precision_and_delayed_scaling(t, factor, seed):
    """Law: with a causal mask, O[:t+1] is a function of tokens <= t only, bit for bit, in float32 and
    under delayed scaling (its scales come from earlier steps); MXFP8 breaks it only inside the 32-token
    V block holding t (block ends t = 31, 63, ... are unaffected)."""
    q, k, v, _ = _data(1, 128, 1, 32, seed)
    for recipe in (None, DelayedScaling(fp8_dpa=True)):
        a, b = _causal_outputs(recipe, q, k, v, t, factor)
        _assert_bits(a, b, f"causal outputs, recipe {type(recipe).__name__}")
    if t % 32 == 31:
        a, b = _causal_outputs(MXFP8BlockScaling(fp8_dpa=True), q, k, v, t, factor)
        _assert_bits(a, b, "MXFP8 at a block end")


def test_mxfp8_block_scales_leak_future_tokens_inside_a_block():
    """The upstream report's effect: a spike after t inside t's 32-token V block changes O at t."""
    q, k, v, _ = _data(1, 128, 1, 32, 0)
    a, b = _causal_outputs(MXFP8BlockScaling(fp8_dpa=True), q, k, v, 47, 100.0)
    assert not torch.equal(a, b)
    a, b = _causal_outputs(Float8CurrentScaling(fp8_dpa=True), q, k, v, 47, 100.0)
    assert not torch.equal(a, b)  # current scaling: the global amax moves every scale


# -- CustomRecipe: TE maps the qfactory's slot quantizers onto the same points --------------------------------
# TE dot_product_attention.py get_quantizer_roles (roles of the 9 + 6 slots), utils.py get_attention_quantizers
# (slots META_QKV/O/S, META_DQKV/DO/DP; FP8 quantizer classes only), backends.py _qkv_quantizer_type (the flow
# follows the QKV slot's class: "delayed", "current" with O and dQKV in F16, "mxfp8" with S and dP nulled).


def _custom(factory):
    from fp8sim.recipe import CustomRecipe

    return CustomRecipe(qfactory=factory, fp8_dpa=True)


def _dpa_factory(qkv, o, s, do, dp, dqkv, record=None):
    """A qfactory giving DPA's roles the quantizers built by the callables (TE's boundary hint roles for
    O and dQKV have no module type and ``dpa_output`` / ``dpa_grad_input`` in their name)."""

    def factory(role):
        if record is not None:
            record.append(role)
        if role.module_type == "dpa":
            return {"qkv": qkv, "s": s, "do": do, "dp": dp}[role.tensor_type]()
        return (o if "dpa_output" in role.name else dqkv)()

    return factory


def _cs(dt):
    return lambda: te.Float8CurrentScalingQuantizer(dt)


def _ds(**kw):
    from fp8sim.pytorch.quantization import DelayedScalingRequest

    return lambda: DelayedScalingRequest(**kw)


def test_custom_recipe_te_zoo_factory_is_current_scaling_with_delayed_s_dp():
    """TE's ``nvfp4_linear_fp8_dpa_factory``: QKV/O/dO/dQKV current scaling (E4M3 / E5M2), S/dP delayed
    (history 1, most_recent): the current-scaling flow, bit for bit against the reference's casts, two steps
    (step 2's S/dP scales: fp8_max / step 1's amax); the factory sees TE's 9 + 6 roles."""
    from fp8sim.pytorch.custom_recipes.quantizer_factory_zoo import nvfp4_linear_fp8_dpa_factory

    roles = []

    def factory(role):
        roles.append(role)
        return nvfp4_linear_fp8_dpa_factory(role)

    b, s, h, d = 1, 16, 2, 16
    dpa = DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="causal", name="core_attention")
    recipe = _custom(factory)
    scales = {"s": 1.0, "dp": 1.0}
    for step in range(2):
        q, k, v, do = _data(b, s, h, d, seed=20 + step)
        amax: dict[str, float] = {}
        ref_out, ref_grads = reference(*(_bhsd(t) for t in (q, k, v, do)), d**-0.5, True, "current", scales, amax)
        out, grads = _run(dpa, recipe, q, k, v, do)
        _assert_bits(_bhsd(out.reshape(b, s, h, d)), ref_out, f"O step {step}")
        for name, g, r in zip("QKV", grads, ref_grads, strict=True):
            _assert_bits(_bhsd(g), r, f"d{name} step {step}")
        scales = {n: float(np.float32(fmax) / np.float32(amax[n])) for n, fmax in (("s", 448), ("dp", 57344))}
    names = [(r.module_type, r.tensor_type, r.name) for r in roles]
    dpa_role = [("dpa", t, "core_attention") for t in ("qkv", "s", "do", "dp")]
    assert (
        names
        == [dpa_role[0]] * 3
        + [("", "", "core_attention.dpa_output")] * 3
        + [dpa_role[1]] * 3
        + [("", "", "core_attention.dpa_grad_input")] * 2
        + [dpa_role[2]] * 2
        + [dpa_role[3]] * 2
    )  # built once per recipe object (TE's CustomRecipeState)


def test_custom_recipe_delayed_requests_run_the_delayed_flow():
    """Every DPA slot a ``DelayedScalingRequest`` (HYBRID): the QKV slot is a Float8Quantizer, so TE runs the
    delayed flow (O and dQKV quantized too); step 1: every scale 1."""
    b, s, h, d = 2, 16, 2, 16
    q, k, v, do = _data(b, s, h, d, seed=5)
    ds = _ds(amax_history_len=4)
    dpa = DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="no_mask")
    out, grads = _run(dpa, _custom(_dpa_factory(ds, ds, ds, ds, ds, ds)), q, k, v, do)
    ones = dict.fromkeys(SCALES, 1.0)
    ref_out, ref_grads = reference(*(_bhsd(t) for t in (q, k, v, do)), d**-0.5, False, "delayed", ones)
    _assert_bits(_bhsd(out.reshape(b, s, h, d)), ref_out, "O")
    for name, g, r in zip("QKV", grads, ref_grads, strict=True):
        _assert_bits(_bhsd(g), r, f"d{name}")


def test_custom_recipe_mxfp8_quantizers_run_the_mxfp8_flow():
    """MXFP8Quantizer(E4M3) in every DPA slot: the MXFP8 flow, S and dP nulled (TE get_attention_quantizers)."""
    b, s, h, d = 1, 128, 1, 32
    q, k, v, do = _data(b, s, h, d, seed=3)
    mxq = lambda: te.MXFP8Quantizer(te.DType.kFloat8E4M3)  # noqa: E731
    dpa = DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="causal")
    out, grads = _run(dpa, _custom(_dpa_factory(*[mxq] * 6)), q, k, v, do, accumulator=None)
    ref_out, ref_grads = reference(*(_bhsd(t) for t in (q, k, v, do)), d**-0.5, True, "mxfp8")
    _assert_bits(_bhsd(out.reshape(b, s, h, d)), ref_out, "O")
    for name, g, r in zip("QKV", grads, ref_grads, strict=True):
        _assert_bits(_bhsd(g), r, f"d{name}")


def test_custom_recipe_slot_dtype_is_used():
    """Negative control: an E5M2 QKV slot changes O (the slot's own dtype is honoured, not the recipe's)."""
    b, s, h, d = 1, 16, 2, 16
    q, k, v, do = _data(b, s, h, d, seed=2)
    E4q, E5q = te.DType.kFloat8E4M3, te.DType.kFloat8E5M2
    outs = []
    for qkv_dt in (E4q, E5q):
        f = _dpa_factory(_cs(qkv_dt), _cs(E4q), _ds(amax_history_len=1), _cs(E5q), _ds(amax_history_len=1), _cs(E5q))
        dpa = DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="causal")
        outs.append(_run(dpa, _custom(f), q, k, v, do)[0])
    ref_out, _ = reference(*(_bhsd(t) for t in (q, k, v, do)), d**-0.5, True, "current", {"s": 1.0, "dp": 1.0})
    _assert_bits(_bhsd(outs[0].reshape(b, s, h, d)), ref_out, "O")
    assert not torch.equal(outs[0], outs[1])


@pytest.mark.parametrize(
    "slot, make, err, match",
    [
        ("qkv", lambda: te.NVFP4Quantizer(), TypeError, "but QKV quantizer is NVFP4Quantizer"),
        ("s", _cs(te.DType.kFloat8E4M3), NotImplementedError, "delayed-scaling S slot"),
        ("qkv", lambda: te.Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3, force_pow_2_scales=True),
         NotImplementedError, "force_pow_2_scales"),
    ],
)  # fmt: skip
def test_custom_recipe_unsupported_slot_quantizers_are_refused(slot, make, err, match):
    """TE's TypeError for a non-FP8 DPA quantizer; fp8sim's NotImplementedError for what it does not model."""
    parts = {"qkv": _cs(te.DType.kFloat8E4M3), "o": _cs(te.DType.kFloat8E4M3), "s": _ds(amax_history_len=1)}
    parts.update({"do": _cs(te.DType.kFloat8E5M2), "dp": _ds(amax_history_len=1), "dqkv": _cs(te.DType.kFloat8E5M2)})
    parts[slot] = make
    q, k, v, do = _data(1, 16, 2, 16, seed=2)
    dpa = DotProductAttention(2, 16, qkv_format="bshd")
    with pytest.raises(err, match=match):
        _run(dpa, _custom(_dpa_factory(**parts)), q, k, v, do)
