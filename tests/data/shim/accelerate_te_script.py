"""A training script written for accelerate + TransformerEngine only (run by tests/test_shim.py)."""

import torch
import transformer_engine.pytorch as te
from accelerate import Accelerator
from accelerate.utils import TERecipeKwargs

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
acc = Accelerator(
    mixed_precision="fp8", kwargs_handlers=[TERecipeKwargs(amax_history_len=4, amax_compute_algo="most_recent")]
)
model, opt = acc.prepare(model, opt)
x = torch.randn(64, 32)
y = torch.randn(64, 16)
losses = []
for _ in range(20):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    acc.backward(loss)
    opt.step()
    losses.append(loss.item())
lin = [m for m in model.modules() if isinstance(m, te.Linear)]
print("TE_LINEARS", len(lin), type(lin[0]).__module__)
print("LOSS", losses[0], losses[-1])
st = lin[0].fp8_gemms["gemm"]
print("HIST_LEN", st.fwd.amax_history.shape[0], "ALGO", st.fwd.recipe.amax_compute_algo)
model.eval()
with torch.no_grad():
    print("EVAL", model(x).shape)
