"""Packaging promises: `import fp8sim` needs only numpy and ml_dtypes; the public names exist."""

from __future__ import annotations

import subprocess
import sys

import fp8sim

NO_TORCH = """
import sys
sys.modules["torch"] = None  # any `import torch` now raises ImportError
import numpy as np
import fp8sim
assert fp8sim.encode(np.float32(3.3), "e4m3") == 0x45
assert fp8sim.decode(0x45, "e4m3") == 3.25
assert not [m for m in sys.modules if m.startswith(("torch", "matplotlib", "gfloat", "hypothesis"))
            and sys.modules[m] is not None]
from fp8sim import cli
assert cli.main(["verify", "--format", "e2m1", "--no-progress"]) == 0
print("ok")
"""


def test_import_and_numpy_path_work_without_torch() -> None:
    res = subprocess.run([sys.executable, "-c", NO_TORCH], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().endswith("ok")
    assert "torch is not installed" in res.stderr


def test_public_api_names() -> None:
    for name in (
        "encode",
        "decode",
        "quantize",
        "FloatFormat",
        "FORMATS",
        "get_format",
        "ROUNDING_MODES",
        "E4M3",
        "E5M2",
        "E8M0",
        "E4M3FNUZ",
        "E5M2FNUZ",
        "E2M1",
        "E2M3",
        "E3M2",
        "CONVENTIONS",
        "Convention",
        "get_convention",
        "__version__",
    ):
        assert hasattr(fp8sim, name), name
    assert fp8sim.ROUNDING_MODES == ("nearest_even", "toward_zero", "up", "down", "nearest_away", "stochastic")
