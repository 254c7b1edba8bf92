"""Hashes of fp8sim's outputs, for a before/after check of a change meant to keep behaviour (issue 25).

Run it on the old commit and on the new one, on the same machine and library versions, and compare:

    python scripts/output_hashes.py --out before.json        # on the old commit
    python scripts/output_hashes.py --out after.json         # on the new commit
    python scripts/output_hashes.py --compare before.json after.json

It hashes (sha256) the bits of: the golden-vector GEMM results (MMA-Sim sets through the numpy
instruction models and the torch chain; the measured B200/H100/L40S sets), every file of
``fp8sim report --quick`` (the report's "generated <time> on <host>" line left out), the training
study (``fp8sim study``, a few steps; the per-recipe seconds left out) and the distributed study
(``fp8sim study --distributed``).  It calls only entry points that stay put across the change (the CLI
and ``fp8sim.gemm``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"


def _h(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def golden() -> dict[str, str]:
    import torch

    from fp8sim.formats import get_format
    from fp8sim.gemm import INSTRUCTION_MODELS, dot_add
    from fp8sim.gemm._torch_chain import chain_dots

    out: dict[str, str] = {}
    sets = {
        "hopper_wgmma_f32_e4m3_e4m3": ("hopper_wgmma", "e4m3", "e4m3", "float32"),
        "hopper_wgmma_f32_e5m2_e4m3": ("hopper_wgmma", "e5m2", "e4m3", "float32"),
        "hopper_wgmma_f32_e5m2_e5m2": ("hopper_wgmma", "e5m2", "e5m2", "float32"),
        "hopper_wgmma_f16_e4m3_e4m3": ("hopper_wgmma", "e4m3", "e4m3", "float16"),
        "ada_mma_f32_e4m3_e4m3": ("ada_mma", "e4m3", "e4m3", "float32"),
        "blackwell_tcgen05_f32_e4m3_e4m3": ("blackwell_tcgen05", "e4m3", "e4m3", "float32"),
        "blackwell_mxf8f6f4_e4m3": ("blackwell_mxf8f6f4", "e4m3", "e4m3", "float32"),
        "blackwell_mxf4nvf4_nvfp4": ("blackwell_mxf4nvf4", "e2m1", "e2m1", "float32"),
    }
    torch.set_num_threads(1)
    for stem, (model, fa, fb, dt) in sets.items():
        z = dict(np.load(DATA / "golden" / "mma" / f"{stem}.npz"))
        kw = {"scale_a": z["scale_a"], "scale_b": z["scale_b"]} if "scale_a" in z else {}
        d = dot_add(z["a"], z["b"], z["c"], model=model, a_format=fa, b_format=fb, out_dtype=dt, **kw)
        out[f"golden/numpy/{stem}"] = _h(np.ascontiguousarray(d).tobytes())
        if dt == "float32":
            tkw = {k: torch.from_numpy(v) for k, v in kw.items()}
            t = chain_dots(
                *(torch.from_numpy(z[x]) for x in "abc"),
                get_format(fa),
                get_format(fb),
                INSTRUCTION_MODELS[model],
                **tkw,
            )
            out[f"golden/torch/{stem}"] = _h(t.contiguous().numpy().tobytes())
    z = dict(np.load(DATA / "golden" / "mma" / "hopper_wgmma_chain_e4m3.npz"))
    acc = z["c"]
    for j in range(16):
        acc = dot_add(z["a"][:, 32 * j : 32 * j + 32], z["b"][:, 32 * j : 32 * j + 32], acc, model="hopper_wgmma")
    out["golden/numpy/hopper_wgmma_chain_e4m3"] = _h(acc.tobytes())
    e4 = __import__("ml_dtypes").float8_e4m3fn
    for gpu, model in (("B200", "blackwell_mma"), ("H100", "hopper_wgmma"), ("L40S", "ada_mma")):
        z = dict(np.load(DATA / "hardware" / f"{gpu}_E4M3.npz"))
        a = np.asarray(z["a"], np.float32).astype(e4).view(np.uint8)
        b = np.asarray(z["b"], np.float32).astype(e4).view(np.uint8)
        out[f"hardware/{gpu}/{model}"] = _h(dot_add(a, b, z["c"], model=model).tobytes())
    return out


def _cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "fp8sim", *args], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)


def _folder(prefix: str, folder: Path, drop: list[str]) -> dict[str, str]:
    out = {}
    for p in sorted(folder.rglob("*")):
        if not p.is_file():
            continue
        data = p.read_bytes()
        if p.suffix in (".md", ".csv", ".txt", ".json"):
            text = data.decode()
            for pattern in drop:
                text = re.sub(pattern, "<dropped>", text, flags=re.M)
            data = text.encode()
        out[f"{prefix}/{p.relative_to(folder)}"] = _h(data)
    return out


def outputs(steps: int) -> dict[str, str]:
    out: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        _cli("report", "--quick", "--no-progress", "--out", str(t / "report"))
        out.update(_folder("report", t / "report", [r"^- generated .*$"]))
        _cli("study", "--steps", str(steps), "--no-progress", "--out", str(t / "study"))
        # the seconds column and any timing are wall time: not an output of the numerics
        out.update(_folder("study", t / "study", [r"\| *[0-9.]+ *\|$", r"^seconds.*$", r'"seconds".*$']))
        _cli("study", "--distributed", "--steps", "3", "--out", str(t / "dstudy"))
        out.update(_folder("dstudy", t / "dstudy", []))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = ap.parse_args()
    if args.compare:
        a, b = (json.loads(Path(p).read_text()) for p in args.compare)
        bad = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        for k in bad:
            print(f"DIFFERS: {k}: {a.get(k)} vs {b.get(k)}")
        print(f"{len(a.keys() & b.keys()) - len([k for k in bad if k in a and k in b])} equal, {len(bad)} differ")
        return 1 if bad else 0
    res = {**golden(), **outputs(args.steps)}
    text = json.dumps(res, indent=1, sort_keys=True)
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
