"""``backend="torch"`` computes on the operands' device whatever torch's default device is (a notebook that set
``torch.set_default_device("cuda")`` and passes CPU tensors): under ``with torch.device("meta")`` the result is
still a CPU tensor with the numpy backend's bits (meta tensors hold no values, so any table or buffer made on
the default device would fail)."""

from __future__ import annotations

import numpy as np
import pytest

import fp8sim.gemm as g
from fp8sim.testing.oracles import require


@pytest.mark.parametrize("accumulator", ["hopper_fast", "hopper_split", "blackwell", "exact"])
def test_the_torch_backend_ignores_the_default_device(accumulator: str) -> None:
    torch = require("torch")
    gen = torch.Generator().manual_seed(0)
    a = (torch.randn(16, 64, generator=gen) * 8).to(torch.float8_e4m3fn)
    b = (torch.randn(32, 64, generator=gen) * 8).to(torch.float8_e4m3fn).t()
    one = torch.tensor(1.0)
    kw = {"out_dtype": torch.float32, "accumulator": accumulator}
    want = g.scaled_mm(a, b, one, one, backend="numpy", **kw).numpy()
    with torch.device("meta"):
        got = g.scaled_mm(a, b, one, one, backend="torch", **kw)
    assert got.device.type == "cpu"
    np.testing.assert_array_equal(got.numpy().view(np.uint32), want.view(np.uint32))
