# %% [markdown]
# # FP8 attention study
#
# What FP8 does to attention, on a CPU, with `fp8sim.pytorch.DotProductAttention` (TransformerEngine's
# module and quantization points: Q, K, V in E4M3; the softmax output P cast with the S scale;
# gradients in E5M2 under HYBRID).  Four questions:
#
# 1. How large is the FP8 attention error, per recipe, as the sequence grows and as the softmax
#    gets sharper (higher temperature = larger logits)?
# 2. How much softmax probability mass is lost when P is cast to E4M3, and what does it do to O?
# 3. Do block scales that span sequence positions leak future tokens into a causal output?
# 4. Does running the sequence-reduction GEMMs in BF16 (cuDNN-frontend's `pv_bf16`) stop the leak, and at
#    what cost in accuracy?
#
# Everything is float32 on the CPU; the reference is the same attention in float64.

# %%
import matplotlib.pyplot as plt
import numpy as np
import torch
from IPython.display import Markdown, display

import fp8sim.pytorch as te
from fp8sim import decode, encode
from fp8sim.recipe import DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling

torch.set_num_threads(2)
plt.rcParams.update({"figure.dpi": 90, "figure.facecolor": "white", "axes.grid": True, "grid.alpha": 0.3})
H, D = 2, 64
RECIPES = {
    "delayed": lambda: DelayedScaling(fp8_dpa=True, amax_history_len=4),
    "current": lambda: Float8CurrentScaling(fp8_dpa=True),
    "mxfp8": lambda: MXFP8BlockScaling(fp8_dpa=True),
}


def qkv(s, temperature, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, s, H, D, generator=g) * temperature
    return q, torch.randn(1, s, H, D, generator=g), torch.randn(1, s, H, D, generator=g)


def fp8_attention(name, q, k, v, warmup=True):
    dpa = te.DotProductAttention(H, D, qkv_format="bshd", attn_mask_type="causal")
    recipe = RECIPES[name]()
    if warmup:  # delayed scaling quantizes with the previous steps' amaxes: run one step first
        with te.autocast(recipe=recipe):
            dpa(q, k, v)
    with torch.no_grad(), te.autocast(recipe=recipe):
        return dpa(q, k, v)


def reference(q, k, v):
    dpa = te.DotProductAttention(H, D, qkv_format="bshd", attn_mask_type="causal")
    return dpa(q.double(), k.double(), v.double())


def rel_err(out, ref):
    return float((out.double() - ref).norm() / ref.norm())


# %% [markdown]
# ## 1. Error vs sequence length and softmax temperature
#
# Relative Frobenius error of O against float64.  Delayed scaling runs one warm-up step so its scales
# come from a real amax history (its first step uses scale 1, as TE's does).

# %%
lengths = [128, 256, 512]
temps = [0.5, 1.0, 2.0, 4.0]
err_len = {n: [rel_err(fp8_attention(n, *qkv(s, 1.0)), reference(*qkv(s, 1.0))) for s in lengths] for n in RECIPES}
err_temp = {n: [rel_err(fp8_attention(n, *qkv(128, t)), reference(*qkv(128, t))) for t in temps] for n in RECIPES}
fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
for n in RECIPES:
    axes[0].plot(lengths, err_len[n], marker="o", label=n)
    axes[1].plot(temps, err_temp[n], marker="o", label=n)
axes[0].set(xlabel="sequence length", ylabel="relative error of O", xscale="log", title="temperature 1")
axes[1].set(xlabel="softmax temperature (logit scale)", xscale="log", title="sequence 128")
axes[0].legend()
plt.show()
rows = ["| recipe | " + " | ".join(f"s={s}" for s in lengths) + " | " + " | ".join(f"T={t}" for t in temps) + " |"]
rows.append("|---" * (1 + len(lengths) + len(temps)) + "|")
for n in RECIPES:
    rows.append(f"| {n} | " + " | ".join(f"{e:.2e}" for e in err_len[n] + err_temp[n]) + " |")
display(Markdown("\n".join(rows)))

# %% [markdown]
# ## 2. Softmax mass lost when P is cast to E4M3
#
# P is cast with a per-tensor scale `448 / max P` (the S slot after a step).  Every probability below
# E4M3's smallest subnormal, `2^-9 / scale`, becomes 0: long rows of small probabilities lose mass.
# We measure the mass that survives, `sum(P_e4m3) / sum(P)`, per row, and the error it causes in O
# (everything else in high precision).

# %%


def p_cast_effect(s, temperature):
    q, k, v = (x.permute(0, 2, 1, 3) for x in qkv(s, temperature))
    scores = (q @ k.transpose(-1, -2)) / D**0.5
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    p = torch.softmax(scores, -1)
    scale = np.float32(448) / np.float32(float(p.max()))
    pq = torch.from_numpy(decode(encode((p * float(scale)).numpy(), "e4m3", saturate=True), "e4m3")) / float(scale)
    kept = (pq.sum(-1) / p.sum(-1)).flatten()
    out_err = float(((pq @ v) - (p @ v)).norm() / (p @ v).norm())
    zeros = float(((p > 0) & (pq == 0)).sum() / (p > 0).sum())
    return kept, out_err, zeros


rows = [
    "| sequence | temperature | mean mass kept | worst row | P entries flushed to 0 | rel. error of O |",
    "|---:|---:|---:|---:|---:|---:|",
]
fig, ax = plt.subplots(figsize=(7, 3.6))
for s in (128, 512, 1024):
    kept, err, zeros = p_cast_effect(s, 0.5)
    ax.plot(np.arange(s * H) / H, np.sort(kept.numpy()), label=f"s={s}")
    rows.append(f"| {s} | 0.5 | {float(kept.mean()):.4f} | {float(kept.min()):.4f} | {zeros:.1%} | {err:.2e} |")
for t in (1.0, 4.0):
    kept, err, zeros = p_cast_effect(512, t)
    rows.append(f"| 512 | {t} | {float(kept.mean()):.4f} | {float(kept.min()):.4f} | {zeros:.1%} | {err:.2e} |")
ax.set(xlabel="rows, sorted", ylabel="softmax mass kept after E4M3", title="temperature 0.5 (flat softmax)")
ax.legend()
plt.show()
display(Markdown("\n".join(rows)))

# %% [markdown]
# With the scale set by the largest probability (the first causal row has P = 1, so the scale is 448),
# flat softmaxes keep their small probabilities in E4M3's normal range: nothing flushes, and the row
# sums move only by rounding (E4M3 keeps 3 mantissa bits: up to 6% per entry, mostly cancelling in the
# sum, a few percent in the worst rows).  Sharp softmaxes (high temperature) flush many tiny entries to
# 0, but those carry little mass.  Either way O is not renormalized after the cast, so the mass error
# goes straight into O's magnitude: a few percent relative error from P alone.

# %% [markdown]
# ## 3. Causal leakage through block scales
#
# Causal attention must not let position t see tokens after t.  We change only the tokens after t
# (multiply them by 100: an outlier spike) and measure how much the outputs at positions `<= t` move.
# In exact arithmetic they do not move at all.  FP8 can leak through the scales:
#
# - MXFP8 blocks V along the sequence in 32s (the `PV` GEMM reduces over it), and in the backward Q and
#   K as well: a future token in the same block as earlier ones changes their shared E8M0 scale (a
#   power of two, so only elements pushed into E4M3's subnormal range or to 0 change);
# - current scaling takes one amax over the whole tensor, so a large future token changes every
#   position's scale;
# - delayed scaling uses the previous steps' amaxes, so within a step nothing leaks.

# %%


def leakage(name, t, s=128):
    q, k, v = qkv(s, 1.0, seed=3)
    q2, k2, v2 = (x.clone() for x in (q, k, v))
    for x in (q2, k2, v2):
        x[:, t + 1 :] *= 100.0
    base = fp8_attention(name, q, k, v, warmup=False)
    moved = fp8_attention(name, q2, k2, v2, warmup=False)
    if name == "delayed":  # one shared history: quantize both with the scales from the same warm-up
        dpa = te.DotProductAttention(H, D, qkv_format="bshd", attn_mask_type="causal")
        recipe = RECIPES[name]()
        with te.autocast(recipe=recipe):
            dpa(q, k, v)
        with torch.no_grad(), te.autocast(recipe=recipe, _graph=True):  # _graph: no scale update between
            base, moved = dpa(q, k, v), dpa(q2, k2, v2)
    return float((moved[:, : t + 1] - base[:, : t + 1]).abs().max())


positions = [31, 47, 63, 100, 127]
leaks = {n: [leakage(n, t) for t in positions] for n in RECIPES}
hp = te.DotProductAttention(H, D, qkv_format="bshd", attn_mask_type="causal")
rows = ["| recipe | " + " | ".join(f"t={t}" for t in positions) + " |", "|---" * (1 + len(positions)) + "|"]
for n in RECIPES:
    rows.append(f"| {n} | " + " | ".join(f"{x:.1e}" for x in leaks[n]) + " |")
display(Markdown("max change of O[:, :t+1] when only tokens after t change\n\n" + "\n".join(rows)))
fig, ax = plt.subplots(figsize=(7, 3.4))
for n in RECIPES:
    ax.plot(positions, np.maximum(leaks[n], 1e-12), marker="o", label=n)
ax.set(yscale="log", xlabel="t (last unchanged position)", ylabel="max |change| at positions <= t (1e-12 = 0)")
ax.legend()
plt.show()

# %% [markdown]
# Delayed scaling does not leak within a step.  Current scaling leaks everywhere: the spike moves the
# global amax, so every position is quantized with a different scale (t = 127, the last position, has
# no future tokens to change).  MXFP8 leaks exactly when t is
# not the last position of a 32-token block (t = 31, 63, 127 are block ends: the V blocks of positions
# `<= t` hold no changed token, so O is unchanged); elsewhere the block holding t also holds changed
# tokens, its shared scale moves up by the spike, and the small V entries of earlier positions lose
# precision.  Per-tensor and
# block scales alike make "future tokens cannot influence the past" a property of the scaling recipe,
# not only of the mask.

# %% [markdown]
# ## 4. The cure: P·V in BF16 (cuDNN-frontend's `pv_bf16`)
#
# cuDNN-frontend PR#983 adds a `pv_bf16` specialization of its MXFP8 attention kernels: Q and K stay in
# MXFP8 for `QK^T` (their blocks run along the head dimension, within one token), while the `P V` GEMM,
# which reduces over the sequence, takes BF16 operands: P rounded to BF16 instead of quantized, V the
# caller's BF16 tensor (no E8M0 scale shared by 32 tokens), float32 accumulation, O written in BF16.  The
# draft PR#1123 does the same for the backward GEMMs that reduce over the sequence (`dV = P^T dO`,
# `dQ = dS K`, `dK = dS^T Q`), keeping `dP = dO V^T` in MXFP8.  fp8sim emulates both as
# `DotProductAttention(..., pv_bf16=True, dqkv_bf16=True)` (fp8sim extensions, MXFP8 only).
#
# First TE#3248's own reproduction: Q = K = 1, V = 0 except V[0, 0] = 2^-20; a future V[16, 0] = 1 in
# the same 32-token block raises the block's scale until V[0, 0] flushes to 0 in E4M3.

# %%
S4, D4 = 128, 128
q1 = torch.ones(S4, 1, 1, D4)
v_small = torch.zeros_like(q1)
v_small[0, 0, 0, 0] = 2.0**-20
v_spike = v_small.clone()
v_spike[16, 0, 0, 0] = 1.0
rows = ["| attention | V | O[0, 0] | O[1, 0] | O[15, 0] |", "|---|---|---:|---:|---:|"]
for label, opts in (("MXFP8", {}), ("MXFP8, pv_bf16", {"pv_bf16": True})):
    dpa = te.DotProductAttention(1, D4, qkv_format="sbhd", attn_mask_type="causal", **opts)
    for vname, vv in (("V", v_small), ("V with a spike at 16", v_spike)):
        with torch.no_grad(), te.autocast(recipe=RECIPES["mxfp8"]()):
            o = dpa(q1, q1, vv)[:, 0, 0]
        rows.append(f"| {label} | {vname} | {float(o[0]):.4g} | {float(o[1]):.4g} | {float(o[15]):.4g} |")
display(Markdown("\n".join(rows)))

# %% [markdown]
# The same leak study as in section 3, on the same inputs, now with the query gradients too: one training
# step, then the tokens after t multiplied by 100 and the step repeated; the largest change of O and of
# dQ at positions `<= t` (0 = causal).


# %%
def step(opts, q, k, v, do):
    dpa = te.DotProductAttention(H, D, qkv_format="bshd", attn_mask_type="causal", **opts)
    q = q.clone().requires_grad_()
    with te.autocast(recipe=RECIPES["mxfp8"]()):
        out = dpa(q, k, v)
    out.backward(do)
    return out.detach(), q.grad


VARIANTS = {
    "MXFP8": {},
    "MXFP8, pv_bf16": {"pv_bf16": True},
    "MXFP8, pv_bf16 + dqkv_bf16": {"pv_bf16": True, "dqkv_bf16": True},
}
q, k, v = qkv(128, 1.0, seed=3)
do = torch.randn(1, 128, H * D, generator=torch.Generator().manual_seed(4))
rows = ["| attention | " + " | ".join(f"O, t={t}" for t in positions) + " | "
        + " | ".join(f"dQ, t={t}" for t in positions) + " |", "|---" * (1 + 2 * len(positions)) + "|"]  # fmt: skip
leak_o, leak_dq = {}, {}
for name, opts in VARIANTS.items():
    o0, dq0 = step(opts, q, k, v, do)
    leak_o[name], leak_dq[name] = [], []
    for t in positions:
        q2, k2, v2 = (x.clone() for x in (q, k, v))
        for x in (q2, k2, v2):
            x[:, t + 1 :] *= 100.0
        o, dq = step(opts, q2, k2, v2, do)
        leak_o[name].append(float((o[:, : t + 1] - o0[:, : t + 1]).abs().max()))
        leak_dq[name].append(float((dq[:, : t + 1] - dq0[:, : t + 1]).abs().max()))
    rows.append(f"| {name} | " + " | ".join(f"{x:.1e}" for x in leak_o[name] + leak_dq[name]) + " |")
display(Markdown("\n".join(rows)))
fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), sharey=True)
for name in VARIANTS:
    axes[0].plot(positions, np.maximum(leak_o[name], 1e-12), marker="o", label=name)
    axes[1].plot(positions, np.maximum(leak_dq[name], 1e-12), marker="o", label=name)
axes[0].set(yscale="log", xlabel="t", ylabel="max |change| at positions <= t (1e-12 = 0)", title="O")
axes[1].set(xlabel="t", title="dQ")
axes[0].legend()
plt.show()

# %% [markdown]
# With `pv_bf16` no output at or before t moves, bit for bit, whatever comes after t; the query gradients
# still move under plain MXFP8 backward (K blocked along the sequence for `dQ = dS K`) until `dqkv_bf16`
# moves those GEMMs to BF16 as well.  What does the cure cost in accuracy?  The relative error of O and
# of dQ against the float64 reference:

# %%
ref_q = q.double().requires_grad_()
ref_out = te.DotProductAttention(H, D, qkv_format="bshd", attn_mask_type="causal")(ref_q, k.double(), v.double())
ref_out.backward(do.double())
rows = ["| attention | rel. error of O | rel. error of dQ |", "|---|---:|---:|"]
for name, opts in VARIANTS.items():
    o, dq = step(opts, q, k, v, do)
    rows.append(f"| {name} | {rel_err(o, ref_out.detach()):.2e} | {rel_err(dq, ref_q.grad):.2e} |")
display(Markdown("\n".join(rows)))

# %% [markdown]
# The cure costs no accuracy: BF16 keeps 8 significant bits where E4M3 keeps 4, so O's error drops, and
# dQ's stays where the MXFP8 `QK^T` and `dO V^T` put it.  The price, on hardware, is speed: those GEMMs run
# at the BF16 tensor-core rate.  The default report (`fp8sim report`) repeats this study with current scaling
# beside it: per-tensor scales leak through the global amax, and the BF16 options, which are MXFP8 options,
# do not apply there.
