"""``emulate_scaled_mm``: unchanged code that calls ``torch._scaled_mm`` itself (as the fp8 heads of
small GPT training scripts do) runs on fp8sim's accumulator; backward and other ops untouched."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

from fp8sim.gemm import scaled_mm  # noqa: E402
from fp8sim.gemm.emulate import emulate_scaled_mm  # noqa: E402

torch.set_num_threads(1)
E4 = torch.float8_e4m3fn


class _Fp8Matmul(torch.autograd.Function):
    """Forward through torch._scaled_mm with tensorwise scales, backward in float32 (the usual fp8 head)."""

    @staticmethod
    def forward(ctx, x, w):  # noqa: ANN001, ANN205
        ctx.save_for_backward(x, w)
        sx = x.abs().max().clamp(min=1e-12) / 448.0
        sw = w.abs().max().clamp(min=1e-12) / 448.0
        x8 = (x / sx).to(E4)
        w8 = (w / sw).to(E4)
        return torch._scaled_mm(x8, w8.t(), scale_a=sx.float(), scale_b=sw.float(), out_dtype=torch.float32,
                                use_fast_accum=True)  # fmt: skip

    @staticmethod
    def backward(ctx, g):  # noqa: ANN001, ANN205
        x, w = ctx.saved_tensors
        return g @ w, g.t() @ x


class _Head(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.weight = torch.nn.Parameter(torch.randn(32, 256, generator=g))

    def forward(self, x):  # noqa: ANN001, ANN201
        return _Fp8Matmul.apply(x, self.weight)


def _inputs():  # noqa: ANN202
    g = torch.Generator().manual_seed(1)
    return (torch.randn(16, 256, generator=g) * 3).requires_grad_(True)


def _run(model, x):  # noqa: ANN001, ANN202
    y = model(x)
    y.square().sum().backward()
    return y.detach(), x.grad.clone(), model.weight.grad.clone()


def _expected(x, w):  # noqa: ANN001, ANN202
    sx, sw = x.abs().max() / 448.0, w.abs().max() / 448.0
    x8, w8 = (x / sx).to(E4), (w / sw).to(E4)
    return scaled_mm(x8, w8.t(), sx.float(), sw.float(), out_dtype=torch.float32, accumulator="hopper_fast")


def test_model_calling_scaled_mm_runs_on_the_emulated_accumulator_with_gradients_untouched() -> None:
    native_fn = torch._scaled_mm
    x = _inputs()
    y_native, gx_native, gw_native = _run(_Head(), x)
    x = _inputs()
    model = _Head()
    with emulate_scaled_mm(accumulator="hopper_fast"):
        y, gx, gw = _run(model, x)
    assert torch._scaled_mm is native_fn
    want = _expected(x.detach(), model.weight.detach())
    assert np.array_equal(y.view(torch.int32).numpy(), want.view(torch.int32).numpy())
    assert not torch.equal(y, y_native), "hopper_fast must differ from torch's CPU kernel here"
    # backward is the Function's own float32 code: gradients depend only on x, w and dy = 2y
    x2 = x.detach()
    g = 2 * y
    assert torch.allclose(gx, g @ model.weight.detach()) and torch.allclose(gw, g.t() @ x2)
    assert gx_native.shape == gx.shape and gw_native.shape == gw.shape


def test_decorator_form_and_nesting_restore_torch() -> None:
    native_fn = torch._scaled_mm

    @emulate_scaled_mm(accumulator="ada_fast")
    def f(x, w):  # noqa: ANN001, ANN202
        with emulate_scaled_mm(accumulator="hopper_fast"):
            inner = _Head.forward(w, x)
        return inner, _Head.forward(w, x)

    model = _Head()
    x = _inputs().detach()
    with torch.no_grad():
        inner, outer = f(x, model)
    assert torch._scaled_mm is native_fn
    assert torch.equal(inner, _expected(x, model.weight))
    sx, sw = x.abs().max() / 448.0, model.weight.abs().max() / 448.0
    ada = scaled_mm((x / sx).to(E4), (model.weight / sw).to(E4).t(), sx, sw, out_dtype=torch.float32,
                    accumulator="ada_fast")  # fmt: skip
    assert torch.equal(outer, ada)


@pytest.mark.skipif(not hasattr(torch.nn.functional, "scaled_mm"), reason="torch without nn.functional.scaled_mm")
def test_functional_scaled_mm_is_routed_too() -> None:
    F = torch.nn.functional
    g = torch.Generator().manual_seed(2)
    a = (torch.randn(16, 64, generator=g) * 30).to(E4)
    b = (torch.randn(32, 64, generator=g) * 30).to(E4).t()
    one = torch.tensor(1.0)
    with emulate_scaled_mm(accumulator="hopper_fast"):
        y = F.scaled_mm(a, b, one, F.ScalingType.TensorWise, one, F.ScalingType.TensorWise, use_fast_accum=True)
    want = scaled_mm(a, b, one, one, out_dtype=torch.bfloat16, accumulator="hopper_fast")
    assert y.dtype == torch.bfloat16 and torch.equal(y.view(torch.int16), want.view(torch.int16))


def test_unknown_accumulator_or_profile_is_refused_at_once() -> None:
    with pytest.raises(ValueError, match="unknown accumulator 'hopper_fastest'; known: exact"):
        emulate_scaled_mm(accumulator="hopper_fastest")
    with pytest.raises(ValueError, match="unknown profile 'a100'"):
        emulate_scaled_mm(profile="a100")


def test_fp8sim_run_scaled_mm_patches_a_whole_script(tmp_path) -> None:  # noqa: ANN001
    script = tmp_path / "s.py"
    script.write_text(
        textwrap.dedent("""
        import torch
        print(getattr(torch._scaled_mm, "__fp8sim_emulation__", {}).get("accumulator"))
    """)
    )
    env = dict(os.environ, OMP_NUM_THREADS="1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "fp8sim", "run", "--scaled-mm", "hopper_fast", str(script)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "hopper_fast"
    bad = subprocess.run([*cmd[:4], "--scaled-mm", "nope", str(script)], env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown accumulator 'nope'" in bad.stderr
