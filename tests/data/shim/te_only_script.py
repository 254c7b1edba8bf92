"""A script written only against TransformerEngine (run by tests/test_shim.py under `fp8sim run`)."""

import json
import sys

import torch
import transformer_engine.pytorch as te
from transformer_engine.common.recipe import DelayedScaling, Format

torch.manual_seed(0)
layer = te.Linear(32, 16)
recipe = DelayedScaling(fp8_format=Format.HYBRID, amax_history_len=8, amax_compute_algo="max")
outs = []
for step in range(3):
    x = torch.randn(16, 32) * (step + 1)
    with te.fp8_autocast(enabled=True, fp8_recipe=recipe):
        y = layer(x)
    y.sum().backward()
    outs.append(y.detach().flatten().tolist())
st = layer.fp8_gemms["gemm"]
json.dump(
    {
        "outs": outs,
        "fwd_scale": st.fwd.scale.tolist(),
        "bwd_scale": st.bwd.scale.tolist(),
        "grad": layer.weight.grad.flatten().tolist(),
    },
    sys.stdout,
)
