# %% [markdown]
# # FP8 format explorer
#
# What each narrow format can represent, what every rounding mode and overflow policy does with a
# value, and how the casts of real libraries differ.  Every number below is computed by `fp8sim`
# (the semantics, with the upstream source of each rule, are in [`docs/semantics.md`](../docs/semantics.md)).

# %%
import math

import matplotlib.pyplot as plt
import ml_dtypes
import numpy as np
import torch
from IPython.display import Markdown, display

import fp8sim
from fp8sim import CONVENTIONS, FORMATS, FloatFormat

plt.rcParams.update({"figure.dpi": 90, "figure.facecolor": "white", "axes.grid": True, "grid.alpha": 0.3})


def md_table(header, rows):
    """Show a Markdown table (one list of cells per row)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    display(Markdown("\n".join(lines)))


def show(v):
    """A float as a short string (NaN and Inf spelled out)."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return f"{v:.6g}"


def grid(f):
    """The positive finite values of a format, sorted."""
    v = fp8sim.decode(np.arange(f.num_codes), f).astype(np.float64)
    return np.unique(v[np.isfinite(v) & (v > 0)])


# %% [markdown]
# ## The formats
#
# A format is one frozen record, `FloatFormat(name, ebits, mbits, bias, signed, specials, subnormals)`;
# its maximum, smallest values and special codes are derived from those fields.  `fp8sim.FORMATS`
# holds the registered ones.

# %%
rows = []
for f in FORMATS.values():
    rows.append(
        [
            f"`{f.name}`",
            f.ml_dtypes_name or "-",
            f.bits,
            f"{int(f.signed)}/{f.ebits}/{f.mbits}",
            f.bias,
            f"{show(f.max)} (0x{f.max_code:02x})",
            show(f.min_normal),
            show(f.min_subnormal) if f.min_subnormal else "-",
            f"{math.log2(f.max / f.smallest_positive):.1f}",
            grid(f).size,
            "yes" if f.has_inf else "no",
            f"0x{f.nan_code:02x}" if f.has_nan else "none",
            "yes" if f.has_negative_zero else "no",
        ]
    )
md_table(
    [
        "format",
        "ml_dtypes",
        "bits",
        "s/e/m",
        "bias",
        "max (code)",
        "min normal",
        "min subnormal",
        "range (binades)",
        "positive values",
        "Inf",
        "NaN",
        "-0",
    ],
    rows,
)

# %% [markdown]
# Nothing branches on a name, so a format that is not registered works the same way: an 8-bit E3M4,
# for example.

# %%
e3m4 = FloatFormat("e3m4", ebits=3, mbits=4, bias=3)
x = np.array([0.1, 1.0, 3.14159, 20.0], np.float32)
print(f"e3m4: max {e3m4.max}, min subnormal {e3m4.min_subnormal}, eps {e3m4.eps}")
print("quantize", x, "->", fp8sim.quantize(x, e3m4))

# %% [markdown]
# ## Value grids and spacing
#
# Each dot is one positive finite value; subnormals (exponent field 0) are drawn in orange.  Every binade
# of normal values holds `2^mbits` evenly spaced values.  E8M0 is left out of the plot: its 255 values are
# the powers of two `2^-127 ... 2^127`, one per binade.

# %%
fig, ax = plt.subplots(figsize=(9, 4))
plotted = [f for f in FORMATS.values() if f.name != "e8m0"]
for i, f in enumerate(plotted):
    v = grid(f)
    sub = v < f.min_normal
    ax.scatter(v[~sub], np.full((~sub).sum(), i), s=6, color="tab:blue", label="normal" if i == 0 else None)
    ax.scatter(v[sub], np.full(sub.sum(), i), s=6, color="tab:orange", label="subnormal" if i == 0 else None)
ax.set_xscale("log", base=2)
ax.set_yticks(range(len(plotted)), [f.name for f in plotted])
ax.set_xlabel("positive finite value (log2 axis)")
ax.set_title("Value grid of each format")
ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes, off the data
plt.show()

# %% [markdown]
# The relative spacing `(next value - value) / value` is what limits precision: between `2^-(mbits+1)`
# and `2^-mbits` throughout the normal range (6.25-12.5 % for E4M3, 12.5-25 % for E5M2, 25-50 % for
# E2M1), and growing to 100 % through the subnormals, where values lose significant bits.  E8M0 spaces
# every value one binade apart (100 %); it is meant for scales, not data.

# %%
fig, ax = plt.subplots(figsize=(9, 4.5))
for name in ("e4m3", "e5m2", "e4m3fnuz", "e2m1", "e2m3", "e3m2"):
    v = grid(FORMATS[name])
    ax.step(v[:-1], np.diff(v) / v[:-1], where="post", label=name)
ax.set_xscale("log", base=2)
ax.set_yscale("log", base=2)
ax.set_xlabel("value (log2 axis)")
ax.set_ylabel("relative gap to the next value")
ax.set_title("Relative spacing of the grid")
ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
plt.show()

# %% [markdown]
# ## Rounding modes near a midpoint and at overflow (E4M3)
#
# Inputs: exact midpoints between neighbours (1.0625 between 1 and 1.125, whose even neighbour is 1;
# 1.1875 between 1.125 and 1.25, even neighbour 1.25), one float32 ulp above a midpoint, a negative
# midpoint, values around the largest finite value 448 (the next grid step, 480, is E4M3's NaN code, so
# the overflow midpoint is 464), and the specials.

# %%
inputs = np.array(
    [1.0625, 1.1875, np.nextafter(np.float32(1.0625), np.float32(2)), -1.0625, 440, 464, 465, 1000, np.inf, -np.inf],
    np.float32,
)
modes = [m for m in fp8sim.ROUNDING_MODES if m != "stochastic"]
rows = []
for mode in modes:
    for saturate in (True, False):
        q = fp8sim.quantize(inputs, "e4m3", rounding=mode, saturate=saturate)
        rows.append([f"`{mode}`", saturate] + [show(v) for v in q])
md_table(["rounding", "saturate"] + [show(v) if v != inputs[2] else "1.0625 + ulp" for v in inputs], rows)

# %% [markdown]
# - `nearest_even` sends ties to the neighbour with an even code (1.0625 -> 1, 1.1875 -> 1.25, and 464 ->
#   448 because 448's mantissa 110 is even); `nearest_away` sends them away from zero.
# - The directed modes ignore distance: `toward_zero` truncates, `up`/`down` go towards +/-Inf.
# - Overflow: with `saturate=True` (CUDA `satfinite`) every overflow and +/-Inf becomes +/-448.  With
#   `saturate=False` (the OCP rule, ml_dtypes' `astype`), E4M3 has no Inf, so overflow becomes NaN, except
#   where a directed mode rounds *away* from the overflow (`toward_zero`, `down` for positives, `up` for
#   negatives): then the result is +/-448 (IEEE 754 section 7.4).  Inf inputs stay infinite, hence NaN.
#
# ## Saturating vs non-saturating, per format
#
# What `2 * max` and `+Inf` become under nearest-even:

# %%
rows = []
for f in FORMATS.values():
    x = np.array([2 * f.max, np.inf])  # float64: 2 * max of E8M0 is beyond float32
    sat = fp8sim.quantize(x, f, saturate=True)
    non = fp8sim.quantize(x, f, saturate=False)
    rows.append([f"`{f.name}`", show(f.max), show(sat[0]), show(sat[1]), show(non[0]), show(non[1])])
md_table(["format", "max", "2*max, saturate", "+Inf, saturate", "2*max, non-saturating", "+Inf, non-saturating"], rows)

# %% [markdown]
# Non-saturating overflow goes to Inf where the format has one (E5M2), else to NaN (E4M3, fnuz, E8M0),
# else to max (FP4/FP6, which have neither).
#
# ## E8M0: the MX scale format
#
# E8M0 holds only powers of two, `2^-127 ... 2^127`, with no zero and no sign; code 0xFF is NaN.  Nearest
# rounding is in the *linear* domain with ties going up (so 1.5 -> 2 but 1.42 -> 1, although 1.42 is above
# the geometric midpoint sqrt(2)), as ml_dtypes, torch and TE do.  `up`/`down` give the power of two
# above/below.  Zero and negative inputs have no code: NaN, or 2^-127 (code 0x00) when saturating.


# %%
def e8m0_code(c):
    return f"0x{c:02x} (NaN)" if c == 0xFF else f"0x{c:02x} (2^{int(c) - 127})"


e8_inputs = np.array([1.42, 1.5, 1.6, 0.75, 5.0, 2.0**-128, 3e38, 0.0, -2.0, np.inf], np.float32)
labels = [show(v) for v in e8_inputs]
labels[5] = "2^-128"
rows = []
for mode in ("nearest_even", "up", "down"):
    for saturate in (True, False):
        codes = fp8sim.encode(e8_inputs, "e8m0", rounding=mode, saturate=saturate)
        rows.append([f"`{mode}`", saturate] + [e8m0_code(c) for c in codes])
md_table(["rounding", "saturate", *labels], rows)

# %% [markdown]
# ## Stochastic rounding is unbiased
#
# `rounding="stochastic"` rounds away from zero with probability equal to the fraction of the way to the
# next grid point, using 32 counter-based random bits per element derived from `seed`.  The expected
# result is therefore the input itself, while nearest rounding is biased for any value off the grid.
# Left: for 400 seeds, the mean of 1024 stochastically rounded copies of x = 1.03 (between the E4M3 values
# 1 and 1.125, so it rounds up with probability 0.24).  Right: the mean over 64 seeds x 1024 copies for
# inputs across [1, 1.25], against nearest-even.

# %%
x0 = np.float32(1.03)
copies = np.full(1024, x0, np.float32)
means = np.array([fp8sim.quantize(copies, "e4m3", rounding="stochastic", seed=s).mean() for s in range(400)])
rn = fp8sim.quantize(x0, "e4m3")

xs = np.linspace(1.0, 1.25, 81, dtype=np.float32)
wide = np.repeat(xs[:, None], 1024, axis=1)
sr_mean = np.mean([fp8sim.quantize(wide, "e4m3", rounding="stochastic", seed=s).mean(axis=1) for s in range(64)], 0)

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
ax1.hist(means, bins=30, color="tab:blue", alpha=0.8)
ax1.axvline(x0, color="k", label=f"input {x0:g}")
ax1.axvline(means.mean(), color="tab:green", linestyle="--", label=f"mean over seeds {means.mean():.5f}")
ax1.axvline(rn, color="tab:red", label=f"nearest-even {rn:g}")
ax1.set_xlabel("mean of 1024 stochastically rounded copies")
ax1.set_ylabel("seeds")
ax1.set_title("SR of 1.03 to E4M3, 400 seeds")
ax1.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)  # below the axes, off the data
ax2.plot(xs, xs, color="k", linewidth=0.8, label="input")
ax2.plot(xs, sr_mean, ".", color="tab:green", label="stochastic (mean)")
ax2.step(xs, fp8sim.quantize(xs, "e4m3"), where="mid", color="tab:red", label="nearest-even")
ax2.set_xlabel("input")
ax2.set_ylabel("E4M3 result")
ax2.set_title("Expected value of the rounded result")
ax2.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
plt.show()
stderr = means.std() / np.sqrt(means.size)
print(f"mean over all seeds {means.mean():.6f} (input {x0:.6f}); standard error {stderr:.6f}")
print(f"largest |SR mean - input| across [1, 1.25]: {np.abs(sr_mean - xs).max():.2e}")

# %% [markdown]
# The same seed gives the same bits on every backend (numpy and torch here; CUDA too):

# %%
v = np.random.default_rng(0).standard_normal(100_000).astype(np.float32)
a = fp8sim.encode(v, "e4m3", rounding="stochastic", seed=1234)
b = fp8sim.encode(torch.from_numpy(v), "e4m3", rounding="stochastic", seed=1234).numpy()
c = fp8sim.encode(v, "e4m3", rounding="stochastic", seed=1235)
print("numpy == torch, same seed:", np.array_equal(a, b), "| codes that differ with another seed:", (a != c).sum())

# %% [markdown]
# ## Named conventions: what real libraries do
#
# The three conventions compared below all round to nearest-even; they differ in overflow, NaN codes, E8M0 and float64
# handling.  `fp8sim.CONVENTIONS[name].encode(x, fmt)` reproduces each bit for bit; the last columns
# check the conventions against the installed ml_dtypes and torch on these inputs.


# %%
def code_cell(c, f):
    return e8m0_code(c) if f.name == "e8m0" else f"0x{c:02x} ({show(fp8sim.decode(int(c), f))})"


conv_inputs = np.array([300.0, 464.0, 500.0, 6e4, 1e5, np.inf, -np.inf, np.nan, 0.0, -2.0, 5.0], np.float32)
names = ["ml_dtypes", "torch_eager", "satfinite"]
for fmt in ("e4m3", "e5m2", "e8m0"):
    f = FORMATS[fmt]
    lib_ml = conv_inputs.astype(f.ml_dtype).view(np.uint8)
    lib_torch = torch.from_numpy(conv_inputs).to(f.torch_dtype).view(torch.uint8).numpy()
    codes = {n: CONVENTIONS[n].encode(conv_inputs, f) for n in names}
    rows = []
    for i, x in enumerate(conv_inputs):
        cells = [code_cell(codes[n][i], f) for n in names]
        differ = len({int(codes[n][i]) for n in names}) > 1
        same_ml = "yes" if lib_ml[i] == codes["ml_dtypes"][i] else "**no**"
        same_torch = "yes" if lib_torch[i] == codes["torch_eager"][i] else "**no**"
        rows.append([show(x), *cells, "**yes**" if differ else "", same_ml, same_torch])
    display(Markdown(f"**{fmt}**"))
    md_table(["input", *names, "differ", "= ml_dtypes astype", "= torch .to()"], rows)

# %% [markdown]
# - E4M3: ml_dtypes does not saturate (overflow and Inf -> NaN 0x7F); torch 2.13's eager cast saturates
#   E4M3 to 448 (since pytorch#178817; earlier torch gave NaN, the `torch_eager_legacy` convention);
#   CUDA `satfinite` (TransformerEngine) saturates too.
# - E5M2: ml_dtypes and torch keep Inf for overflow (|x| >= 61440) but write NaN as 0x7E and 0x7F
#   respectively; `satfinite` clamps to 57344.
# - E8M0: ml_dtypes gives NaN for 0 and negative inputs; torch maps 0 to 2^-127 and ignores the sign;
#   `satfinite` rounds *up* (300 -> 512 and 5 -> 8, where nearest gives 256 and 4), as TE's MX scale code
#   does, and saturates Inf to 2^127.
#
# float64 input is a fourth difference: ml_dtypes and torch narrow float64 arrays to float32 first, so a
# value just above a midpoint can become the midpoint and then round to even.  fp8sim's core rounds once.

# %%
x64 = np.array([1.0625 + 2.0**-30])  # above the 1 / 1.125 midpoint by less than a float32 ulp
print("fp8sim core (rounds once):      ", fp8sim.quantize(x64, "e4m3"))
print("ml_dtypes convention:           ", CONVENTIONS["ml_dtypes"].quantize(x64, "e4m3"))
print("ml_dtypes astype:               ", x64.astype(ml_dtypes.float8_e4m3fn).astype(np.float32))
print("torch .to(float8_e4m3fn):       ", torch.from_numpy(x64).to(torch.float8_e4m3fn).float().numpy())
