# %% [markdown]
# # Validating GPU outputs against the emulator
#
# fp8sim checks a device in two halves that need not run on the same machine:
#
# 1. **capture** runs torch's float8 casts, `torch._scaled_mm` and torchao's float8 quantizers on the
#    device and stores their raw output bits, with the device's metadata, in one checksummed file;
# 2. **compare** regenerates every input from the suite's names and seeds, recomputes every op with the
#    emulator (the convention and accumulator model that describe the captured device) and reports the
#    bit-exact rate, ULP distances and where mismatches cluster.
#
# This notebook walks through the second half with the capture committed in the repository,
# `reports/captures/cpu-torch2.13.fp8cap` (torch 2.13.0 on a CPU); a GPU capture is read the same way.
# Then it plants one wrong output in a copy, to show how a mismatch is reported and traced to one input.

# %%
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from IPython.display import Image, Markdown, display

import fp8sim
from fp8sim import CONVENTIONS
from fp8sim.native import compare_capture, read_bundle, write_bundle
from fp8sim.native.compare import cast_convention_for
from fp8sim.native.suite import input_set
from fp8sim.report import write_compare_report


def md_table(header, rows):
    """Show a Markdown table (one list of cells per row)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    display(Markdown("\n".join(lines)))


def find_captures():
    """The repository's reports/captures: ../reports/captures from notebooks/, else the first one found
    in the working directory or above it."""
    relative = Path("..") / "reports" / "captures"
    if relative.is_dir():
        return relative
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / "reports" / "captures").is_dir():
            return folder / "reports" / "captures"
    raise FileNotFoundError("no reports/captures folder in or above the working directory: run from the repository")


CAPTURE = find_captures() / "cpu-torch2.13.fp8cap"
workdir = tempfile.TemporaryDirectory(prefix="fp8sim-notebook-")  # scratch files, removed at the end
WORK = Path(workdir.name)
print(CAPTURE)

# %% [markdown]
# ## What the capture holds
#
# `read_bundle` checks the container, the format version and the SHA-256 of every array, and returns the
# header (metadata and op list) and the arrays.

# %%
header, arrays = read_bundle(CAPTURE)
meta = header["meta"]
md_table(["metadata", "value"], [[k, f"`{v}`"] for k, v in meta.items()])
kinds = {}
for op in header["ops"]:
    kinds[op["kind"]] = kinds.get(op["kind"], 0) + 1
print(f"capture format version {header['version']}, suite {header['suite']!r} (version {header['suite_version']})")
print(f"{len(header['ops'])} ops: " + ", ".join(f"{n} {k}" for k, n in kinds.items()) + f"; {len(arrays)} arrays")
print("first ops:", [op["name"] for op in header["ops"][:3]])

# %% [markdown]
# ## Compare with the emulator
#
# For a CPU capture, casts are recomputed with the convention of the captured torch (`torch_eager` for
# torch >= 2.13) and `_scaled_mm` with the `dequantized_fp32` accumulator (the CPU kernel's arithmetic).
# For a GPU capture, casts are compared with every convention and the best is used, and GEMMs use the
# accumulator model of the compute capability (`ada_*` for sm_89, `hopper_*` for sm_90, `blackwell*` for
# sm_100/sm_120), fast or split as captured.

# %%
result = compare_capture(CAPTURE)
per_kind = {}
for o in result.ops:
    if o.skipped is None:
        k = per_kind.setdefault(o.kind, [0, 0, 0, 0])
        k[0] += 1
        k[1] += o.bit_exact == o.n
        k[2] += o.n
        k[3] += o.bit_exact
md_table(
    ["op kind", "ops", "bit-exact ops", "outputs compared", "bit-exact outputs", "rate"],
    [[k, a, b, f"{c:,}", f"{d:,}", f"{d / c:.4%}"] for k, (a, b, c, d) in per_kind.items()],
)
skipped = [o.name for o in result.ops if o.skipped is not None]
print("skipped ops:", skipped or "none")

# %% [markdown]
# `write_compare_report` writes the same comparison as Markdown with plots (what `fp8sim compare
# --report DIR` writes).  Its summary groups the ops: one row per cast format, and one per GEMM
# configuration (formats, scale layout, accumulation, output dtype) over all K.

# %%
report = write_compare_report(result, WORK / "report", title="cpu-torch2.13 vs emulator")
text = report.read_text()
summary = text[text.index("## Summary") : text.index("## Every op")]
display(Markdown(summary))
display(Image(filename=str(report.parent / "bit_exact_rates.png")))

# %% [markdown]
# Each cast is also checked against every named convention, which tells which implementation the device
# behaves like.  torch 2.13 matches `torch_eager` everywhere; the others differ in the inputs where their
# rules differ (E4M3 overflow, E5M2 NaN codes, E8M0 zero and sign):

# %%
casts = [o for o in result.ops if o.kind == "cast"]
names = list(CONVENTIONS)
md_table(
    ["cast", *names],
    [
        [o.name] + [f"{o.extra['convention_rates'][n]:.2%}" if n in o.extra["convention_rates"] else "-" for n in names]
        for o in casts
    ],
)

# %% [markdown]
# For GEMMs the report also plots the mean ULP distance of the native result, and of the emulator's,
# from the exactly summed product against K.  Here native and emulated curves coincide (every output is
# bit-exact).  The CPU kernel has one float32 accumulation path, so "fast" and "split" differ only because
# each captured case draws its own operands; on a GPU with fast accumulation the native distance grows
# with K, and the emulator's accumulator model has to follow it.

# %%
display(Image(filename=str(report.parent / "gemm_error_vs_k.png")))

# %% [markdown]
# ## A deliberate mismatch
#
# A copy of the capture in which one output is wrong: element 1.0625 of `cast/e4m3/f32_special`, a tie
# between the E4M3 values 1 and 1.125, replaced by what a device that rounds ties away from zero would
# write.  `write_bundle` recomputes the checksums, so the copy is a valid capture.  To keep this quick the
# copy holds only the 15 cast ops (recomputing the GEMMs takes most of a comparison's time).

# %%
OP = "cast/e4m3/f32_special"
op = next(o for o in header["ops"] if o["name"] == OP)
x = input_set(op["inputs"], op["seed"])  # the inputs, regenerated from the suite
i = int(np.flatnonzero(x == np.float32(1.0625))[0])
codes = arrays[OP].copy()
before = int(codes[i])
codes[i] = fp8sim.encode(x[i], "e4m3", rounding="nearest_away")
print(f"{OP}[{i}]: input {float(x[i])}, code 0x{before:02x} -> 0x{int(codes[i]):02x}")

cast_ops = [o for o in header["ops"] if o["kind"] == "cast"]
doc = {k: v for k, v in header.items() if k not in ("format", "version", "sha256")} | {"ops": cast_ops}
copy = {o["name"]: arrays[o["name"]] for o in cast_ops} | {OP: codes}
tampered = write_bundle(WORK / "tampered.fp8cap", copy, doc)
tampered_result = compare_capture(tampered)
md_table(
    ["op", "compared", "differ", "max ULP", "mismatches by input class (mismatches / inputs)"],
    [
        [
            o.name,
            f"{o.n:,}",
            o.n - o.bit_exact,
            f"{o.max_ulp:g}",
            ", ".join(f"{k} {m}/{n:,}" for k, (n, m) in o.clusters.items() if m),
        ]
        for o in tampered_result.ops
        if o.skipped is None and o.bit_exact < o.n
    ],
)

# %% [markdown]
# The comparison names the op, the count, the distance (1 ULP) and the input class (a tie).  To find the
# element, recompute the op with the emulator and diff the codes; then ask which rounding mode reproduces
# the device's output:

# %%
convention = CONVENTIONS[cast_convention_for(meta)]
emulated = convention.encode(x, "e4m3")
_, tampered_arrays = read_bundle(tampered)
captured = tampered_arrays[OP]
for j in np.flatnonzero(emulated != captured):
    got, want = int(captured[j]), int(emulated[j])
    modes = [m for m in fp8sim.ROUNDING_MODES if m != "stochastic" and fp8sim.encode(x[j], "e4m3", rounding=m) == got]
    print(f"element {j}: input {float(x[j])} (float32 bits 0x{x[j : j + 1].view(np.uint32)[0]:08x})")
    print(f"  device   0x{got:02x} = {fp8sim.decode(got, 'e4m3')}")
    print(f"  emulator 0x{want:02x} = {fp8sim.decode(want, 'e4m3')} ({convention.name}, nearest-even)")
    print(f"  rounding modes that give the device's code: {modes}")

# %% [markdown]
# ## The three commands
#
# The same workflow from the command line:
#
# ```bash
# fp8sim capture --device cuda --suite full --out reports/captures/my-gpu.fp8cap   # 1. on the GPU machine
# fp8sim compare reports/captures/my-gpu.fp8cap --report reports/my-gpu              # 2. anywhere
# fp8sim compare reports/captures/my-gpu.fp8cap --require-bit-exact 'cast/*'         # 3. in CI
# ```
#
# 1. `fp8sim capture` needs torch with CUDA (torchao is optional; its ops are marked skipped without it).
#    `--suite full` runs GEMMs up to K = 8192, `quick` up to 1024.  The file is written atomically and an
#    existing one is kept unless `--force`.  Ops the device refuses (e.g. a float8 GEMM on a GPU without
#    float8 tensor cores) are recorded as skipped, with torch's message.
# 2. `fp8sim compare FILE` needs neither the GPU nor torch's CUDA build; it prints one line per op, and
#    `--report DIR` writes the `report.md` and plots shown above.
# 3. `--require-bit-exact` takes comma-separated globs of op names (`'cast/*'`, `'cast/*,torchao/*'`) and
#    exits with status 1 when a matching op is not 100 % bit-exact (2 when the file cannot be read), so a
#    CI job can gate on it.  GEMMs are usually left out of the gate: their bits depend on the library's
#    kernel choice, which the accumulator models describe but do not pin down.
#
# Here is command 3 on the tampered copy:

# %%
cmd = [sys.executable, "-m", "fp8sim", "compare", tampered.name, "--require-bit-exact", "cast/*", "--no-progress"]
run = subprocess.run(cmd, cwd=WORK, capture_output=True, text=True, check=False)
print("$", shlex.join(["fp8sim", *cmd[3:]]))
print("\n".join(line for line in run.stdout.splitlines() if line.startswith(OP)))
print(run.stderr.strip())
print("exit status", run.returncode)
print("the original capture would pass this gate:", not result.failing(["cast/*"]))

# %%
workdir.cleanup()
