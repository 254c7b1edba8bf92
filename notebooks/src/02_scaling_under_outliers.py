# %% [markdown]
# # Scaling under outliers
#
# FP8 has 3 (E4M3) or 2 (E5M2) mantissa bits and about 18 binades of range, so a tensor is multiplied by
# a scale before the cast and the scale is kept for dequantization.  Where that scale comes from, and
# how many elements share it, decides what survives when activations are heavy-tailed.  This notebook
# quantizes and dequantizes the same synthetic activations with five recipes (and, at the end, four FP4
# scale choices), all emulated bit for bit
# as TransformerEngine computes them:
#
# | recipe | element format | one scale per | scale format |
# |---|---|---|---|
# | delayed scaling (`DelayedScaler`) | E4M3 | tensor, from the amax history of earlier steps | float32 |
# | current scaling (`quantize_current_scaling`) | E4M3 | tensor, from this tensor's amax | float32 |
# | MXFP8 (`quantize_mx`, TE flavor, RCEIL rule) | E4M3 | 1x32 block | E8M0 (a power of two) |
# | FP8 block scaling (`quantize_block_scaling`) | E4M3 | 1x128 block | float32 power of two |
# | NVFP4 (`quantize_nvfp4`, TE flavor) | E2M1 | 1x16 block, times a per-tensor float32 scale | E4M3 |

# %%
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Markdown, display

from fp8sim import E4M3
from fp8sim.recipe import DelayedScaling
from fp8sim.scaling import (
    DelayedScaler,
    expand_blocks,
    quantize_block_scaling,
    quantize_current_scaling,
    quantize_mx,
    quantize_nvfp4,
)

plt.rcParams.update({"figure.dpi": 90, "figure.facecolor": "white", "axes.grid": True, "grid.alpha": 0.3})


def md_table(header, rows):
    """Show a Markdown table (one list of cells per row)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    display(Markdown("\n".join(lines)))


# %% [markdown]
# ## The activations
#
# A (256 tokens x 1024 channels) float32 tensor: Student t with 3 degrees of freedom (heavy tails), each
# token (row) scaled by a random factor over 6 binades, and 8 fixed "outlier channels" 30x larger, as
# found in the activations of large language models.  `activations(gain, spike)` draws a new batch; a
# spike is one element set to a large value.

# %%
ROWS, COLS = 256, 1024
rng = np.random.default_rng(0)
OUTLIER_CHANNELS = rng.choice(COLS, 8, replace=False)


def activations(rng, gain=1.0, spike=None):
    x = rng.standard_t(3, size=(ROWS, COLS))
    x *= np.exp2(rng.uniform(-3, 3, size=(ROWS, 1)))
    x[:, OUTLIER_CHANNELS] *= 30
    if spike is not None:
        x[rng.integers(ROWS), rng.integers(COLS)] = spike
    return (gain * x).astype(np.float32)


x = activations(rng)
ax_ = np.abs(x)
amax = float(ax_.max())
print(
    f"amax {amax:.1f}, median |x| {np.median(ax_):.3f}: the amax is 2^{np.log2(amax / np.median(ax_)):.1f} x the median"
)

fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4), gridspec_kw={"width_ratios": [1.3, 1, 1]})
ax1.hist(np.log2(ax_[ax_ > 0] / amax), bins=120, color="tab:blue")
ax1.set_yscale("log")
lo_normal, lo_sub = np.log2(E4M3.min_normal / E4M3.max), np.log2(E4M3.min_subnormal / E4M3.max)
ax1.axvspan(lo_sub, lo_normal, color="tab:orange", alpha=0.2, label="E4M3 subnormals (per-tensor scale)")
ax1.axvspan(-40, lo_sub - 1, color="tab:red", alpha=0.15, label="flushed to zero (per-tensor scale)")
ax1.set_xlim(-26, 0.5)
ax1.set_xlabel("log2(|x| / amax)")
ax1.set_ylabel("elements")
ax1.set_title("Magnitudes relative to the tensor amax")
ax1.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)  # below the axes, off the data
ax2.semilogy(ax_.max(axis=0), color="tab:blue", linewidth=0.8)
ax2.semilogy(OUTLIER_CHANNELS, ax_.max(axis=0)[OUTLIER_CHANNELS], "o", color="tab:red", label="outlier channels")
ax2.set_xlabel("channel")
ax2.set_ylabel("max |x| over tokens")
ax2.set_title("Per-channel amax")
ax2.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
ax3.semilogy(ax_.max(axis=1), color="tab:green", linewidth=0.8, label="all channels")
mask = np.ones(COLS, bool)
mask[OUTLIER_CHANNELS] = False
ax3.semilogy(ax_[:, mask].max(axis=1), color="tab:gray", linewidth=0.8, label="without outlier channels")
ax3.set_xlabel("token")
ax3.set_ylabel("max |x| over channels")
ax3.set_title("Per-token amax")
ax3.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
plt.tight_layout()
plt.show()

# %% [markdown]
# With one scale for the whole tensor (amax mapped to 448), everything below 2^-14.8 x amax lands in
# E4M3's subnormals, with fewer significant bits, and everything below 2^-18.8 x amax becomes 0.
# Outlier channels and token magnitudes make local ranges that differ by two to three orders of
# magnitude (middle, right); a per-block scale can follow them, a per-tensor scale cannot.
#
# ## Delayed scaling over training steps
#
# `DelayedScaler` keeps TransformerEngine's state: a scale (starting at 1) and an amax history of
# `amax_history_len` rows.  Quantizing casts with the current scale and records the tensor's amax;
# `update()` (after each step) sets `scale = 448 / max(history)`.  So step t is cast with a scale derived
# from steps before t.  Below, 24 steps of activations whose magnitude doubles over the run, with one
# spike of 20,000 at step 8, and a history of 8 steps.

# %%
HISTORY, STEPS, SPIKE_STEP = 8, 24, 8
scaler = DelayedScaler(DelayedScaling(amax_history_len=HISTORY, reduce_amax=False), n=1)
print(scaler)


def counts(x, qt):
    """(elements flushed to zero, elements clipped beyond the largest finite value) of one quantization."""
    deq = qt.dequantize()
    scale = expand_blocks(qt.scale_values().astype(np.float64), qt.block)[tuple(slice(0, n) for n in qt.shape)]
    if qt.global_scale is not None:
        scale = scale * np.float64(qt.global_scale)
    f = qt.fmt
    half_ulp_above_max = 2.0 ** (f.emax - f.mbits - 1)  # values beyond max + this cannot round to max
    flushed = int(((x != 0) & (deq == 0)).sum())
    clipped = int((np.abs(x) > (f.max + half_ulp_above_max) * scale).sum())
    return flushed, clipped


step_rng = np.random.default_rng(1)
trace = {"scale": [], "ideal": [], "flushed": [], "clipped": [], "history": []}
for step in range(STEPS):
    xs = activations(step_rng, gain=2 ** (step / STEPS), spike=2e4 if step == SPIKE_STEP else None)
    trace["scale"].append(float(scaler.scale[0]))  # the scale this step is cast with
    trace["ideal"].append(E4M3.max / float(np.abs(xs).max()))  # what current scaling would use
    flushed, clipped = counts(xs, scaler.quantize(0, xs))
    trace["flushed"].append(flushed)
    trace["clipped"].append(clipped)
    scaler.update()
    trace["history"].append(scaler.amax_history[:, 0].copy())

steps = np.arange(STEPS)
fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4))
ax1.step(steps, np.log2(trace["scale"]), where="mid", marker="o", label="delayed: scale used")
ax1.plot(steps, np.log2(trace["ideal"]), "k.--", linewidth=0.8, label="448 / amax of the step (current)")
ax1.axvline(SPIKE_STEP, color="tab:red", alpha=0.4, label="spike")
ax1.set_xlabel("step")
ax1.set_ylabel("log2(scale)")
ax1.set_title("Scale trajectory")
ax1.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
hist = np.array(trace["history"]).T
im = ax2.imshow(np.log10(np.where(hist > 0, hist, np.nan)), aspect="auto", origin="lower", cmap="magma")
ax2.set_xlabel("step (after update)")
ax2.set_ylabel("history row (1 = oldest, 7 = newest; 0 = staging)")
ax2.set_title(f"log10 amax history (length {HISTORY})")
ax2.grid(False)
fig.colorbar(im, ax=ax2, label="log10 amax")
ax3.bar(steps - 0.2, trace["flushed"], width=0.4, label="flushed to zero")
ax3.bar(steps + 0.2, trace["clipped"], width=0.4, label="clipped (saturated)", color="tab:red")
ax3.set_yscale("symlog")
ax3.set_xlabel("step")
ax3.set_ylabel("elements (of 262,144)")
ax3.set_title("Underflow and overflow per step")
ax3.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
plt.tight_layout()
plt.show()

# %% [markdown]
# - Step 0 is cast with the initial scale 1: everything above 464 saturates.
# - Afterwards the scale trails the data: when a step's amax exceeds the history's, a few elements clip
#   (the spike itself at step 8, which is clipped from 20,000 to 448 / scale).
# - The spike's amax then stays in the history for 8 updates (the bright diagonal on the heatmap, moving
#   from the newest row to the oldest).  During steps 9-16 the scale is about 2^3 too small and six to
#   eight times as many elements underflow to zero.  A large ordinary amax (step 13) holds the scale down
#   the same way, less far, until it too leaves the window after step 21: the history's max is a
#   pessimistic estimate, paid for in underflow.
#
# ## Five recipes on the same tensor
#
# The tensor `x` from above, quantized and dequantized by each recipe (delayed scaling with the state
# reached after the 24 steps).

# %%
recipes = {
    "delayed (E4M3, per tensor)": lambda t: scaler.quantize(0, t),
    "current (E4M3, per tensor)": lambda t: quantize_current_scaling(t, "e4m3"),
    "MXFP8 (E4M3, 1x32, E8M0)": lambda t: quantize_mx(t, "e4m3", scale_rule="rceil", flavor="te"),
    "block (E4M3, 1x128, pow2)": lambda t: quantize_block_scaling(t, "e4m3"),
    "NVFP4 (E2M1, 1x16, E4M3)": lambda t: quantize_nvfp4(t),
}
x64 = x.astype(np.float64)


def snr_db(ref, err):
    return 10 * np.log10(np.sum(ref**2) / max(np.sum(err**2), 1e-300))


results = {}
rows = []
for name, quantize in recipes.items():
    qt = quantize(x)
    deq = qt.dequantize().astype(np.float64)
    flushed, clipped = counts(x, qt)
    results[name] = deq
    rows.append(
        [name, f"{snr_db(x64, deq - x64):.1f}", f"{flushed:,} ({flushed / x.size:.2%})", clipped, qt.scales.size]
    )
md_table(["recipe", "SNR (dB)", "flushed to zero", "clipped", "scales"], rows)

# %% [markdown]
# The overall SNR hardly separates the FP8 recipes: it is dominated by the few largest elements, which
# every recipe keeps with 3 mantissa bits (30-32 dB; the 2 dB spread depends on where those few values
# land on the grid: current scaling's float32 scale maps the amax exactly onto 448, the power-of-two
# block scales do not).  NVFP4 (1 mantissa bit) loses about 8 dB.  What separates the recipes is how many
# values become zero, and the SNR of the small values.
#
# ## SNR per magnitude bucket
#
# Elements grouped by `floor(log2(|x| / amax))`; buckets with fewer than 100 elements are left out.

# %%
rel = np.log2(np.abs(x64) / amax, where=x64 != 0, out=np.full(x.shape, -np.inf))
bucket = np.floor(rel)
edges = np.arange(-24, 1)
populated = [b for b in edges if np.sum(bucket == b) >= 100]
fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(10, 10), sharex=True, gridspec_kw={"height_ratios": [3, 2, 1.2]})
for name, deq in results.items():
    b_snr, b_flush, b_at = [], [], []
    for b in populated:
        m = bucket == b
        b_at.append(b + 0.5)  # bucket centre
        b_snr.append(snr_db(x64[m], deq[m] - x64[m]))
        b_flush.append(np.mean(deq[m] == 0))
    ax1.plot(b_at, b_snr, marker="o", label=name)
    ax2.plot(b_at, b_flush, marker="o", label=name)
ax1.set_ylabel("SNR in the bucket (dB)")
ax1.set_title("Signal-to-noise ratio by magnitude (higher is better)")
ax1.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes, off the data
ax2.set_ylabel("fraction flushed to zero")
ax2.set_title("Underflow by magnitude")
ax3.bar(edges + 0.5, [np.sum(bucket == b) for b in edges], width=0.9, color="gray")
ax3.set_yscale("log")
ax3.set_ylabel("elements")
ax3.set_xlabel("log2(|x| / amax) bucket")
plt.tight_layout()
plt.show()

# %% [markdown]
# - **Per-tensor scaling** (current, delayed) keeps about 31 dB only for values within ~15 binades of the
#   amax.  Below that they are E4M3 subnormals: the SNR falls by about 6 dB per binade, and below
#   ~2^-19 x amax everything is zero.  Delayed scaling is the same curve shifted right by how far its
#   scale lags the current amax.
# - **Block scaling** (MXFP8 1x32, FP8 1x128) follows the local range of each token, so small values keep
#   full precision down to the smallest buckets.  Only elements far below their own block's max lose
#   bits: with 128-wide blocks, most blocks contain an outlier channel, which is why the 1x128 curve
#   drops first at the far left and the 1x32 one does not.
# - **NVFP4** matches FP8 only for the largest values, which are their block's max.  E2M1 holds
#   {0, 0.5, 1, 1.5, 2, 3, 4, 6} times the block scale, about 3.6 binades, so an element a few binades
#   below the max of its 16-element block is rounded coarsely or to zero: the SNR falls steadily with
#   magnitude and 17 % of all elements underflow, although each block has its own scale.

# %% [markdown]
# ## NVFP4's scale choices
#
# The E2M1 elements stay; what changes is the block scale.  TE's NVFP4 stores an E4M3 scale per 16
# elements under a float32 per-tensor scale.  TE PR#3325 prototypes UE5M3 scales (5 exponent bits: a range
# of 2^-17 .. 114688 instead of E4M3's 2^-9 .. 448, one mantissa bit fewer), Triton's VEC_SIZE=32 shares
# one E4M3 scale between 32 elements, and OCP's MXFP4 uses a power of two (E8M0) per 32
# (`fp8sim.scaling.nvfp4_variants`; each variant is a recipe switch in the modules:
# `NVFP4BlockScaling(fp8sim_nvfp4_variant=...)`).

# %%
from fp8sim.scaling.nvfp4_variants import quantize_nvfp4_variant  # noqa: E402

fp4 = {
    "NVFP4-E4M3x16 (TE)": lambda t: quantize_nvfp4(t),
    "NVFP4-UE5M3x16 (TE PR#3325)": lambda t: quantize_nvfp4_variant(t, "ue5m3x16"),
    "NVFP4-UE5M3x16, no per-tensor scale": lambda t: quantize_nvfp4_variant(t, "ue5m3x16", second_level_scale=False),
    "NVFP4-E4M3x32 (Triton VEC_SIZE=32)": lambda t: quantize_nvfp4_variant(t, "e4m3x32"),
    "MXFP4 (E8M0x32, floor)": lambda t: quantize_mx(t, "e2m1"),
}
rows = []
for name, quantize in fp4.items():
    deq = quantize(x).dequantize().astype(np.float64)
    small = np.abs(x64) < amax * 2.0**-8
    rows.append(
        [
            name,
            f"{snr_db(x64, deq - x64):.1f}",
            f"{snr_db(x64[small], deq[small] - x64[small]):.1f}",
            f"{np.mean(deq[x64 != 0] == 0):.2%}",
        ]
    )
md_table(["FP4 recipe", "SNR (dB)", "SNR below amax/256 (dB)", "flushed to zero"], rows)

# %% [markdown]
# The two 16-element NVFP4 variants give nearly the same SNR on this tensor: with the per-tensor scale,
# every block scale lands well inside E4M3's range, so UE5M3's wider range buys nothing and its lost
# mantissa bit costs little (block scales are rounded, the elements carry the precision).  Without the
# per-tensor scale UE5M3 loses almost nothing: its range alone covers these blocks.  Blocks of 32 share one
# scale between more elements, so more of them sit far below their block's max; MXFP4's power-of-two
# scale with OCP's floor rule costs the most.
