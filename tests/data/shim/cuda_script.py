"""A script that hard-codes CUDA, as TE's mnist example and FP8 primer do (run with --device-map cuda=cpu)."""

import subprocess
import sys

import torch
import transformer_engine.pytorch as te
from transformer_engine.common.recipe import DelayedScaling

assert torch.cuda.is_available(), "needs a GPU"
torch.cuda.manual_seed(0)
device = torch.device("cuda")
model = torch.nn.Sequential(te.Linear(32, 32, device="cuda"), torch.nn.ReLU()).cuda().to("cuda")
x = torch.randn(16, 32, device=device).to("cuda:0")
y_idx = torch.zeros(16, dtype=torch.long).cuda()
with torch.autocast(device_type="cuda", dtype=torch.bfloat16), te.fp8_autocast(fp8_recipe=DelayedScaling()):
    out = model(x)
loss = torch.nn.functional.cross_entropy(out.float(), y_idx)
loss.backward()
torch.cuda.synchronize()
print("DEVICE", out.device.type, out.dtype, torch.cuda.get_device_capability())
child = subprocess.run([sys.executable, "-c", "import transformer_engine.pytorch"], capture_output=True, text=True)
print("CHILD_STDERR", repr(child.stderr))
