"""What fp8sim's models of torch's two CPU ``_scaled_mm`` kernels take and which cast they end with.

``cpu_onednn`` takes what ``aten/src/ATen/native/mkldnn/Linear.cpp`` ``mkldnn_scaled_mm`` takes: one float
scale per operand (``Blas.cpp`` sends every other layout to the fallback), and ``out_dtype`` whenever
``scale_result`` is given.  ``cpu_reference`` (the fallback, ``_scaled_mm_out_cpu_emulated``) ends with torch's
``.to(float8)``, whose E4M3 overflow changed in torch 2.13 (saturates to 448, 0x7E; before: NaN, 0x7F, as
tests/test_conventions.py pins from those releases): the convention follows the installed torch's version,
and torch 2.13's where torch is absent or its version unreadable."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from fp8sim.gemm import scaled_mm
from fp8sim.testing.oracles import require

torch = require("torch")
E4 = torch.float8_e4m3fn
ONE = torch.tensor(1.0)


def _ab() -> tuple:
    return torch.ones(16, 32).to(E4), torch.ones(16, 32).to(E4).t()


@pytest.mark.parametrize(
    ("sa", "sb"),
    [
        (ONE, torch.ones(1, 16)),  # one operand's scale is not single
        (torch.ones(16, 1), ONE),
        (torch.tensor(1), ONE),  # an integer scale beside a float one
        (ONE, torch.tensor(1)),
    ],
)
def test_onednn_model_takes_one_float_scale_per_operand_only(sa, sb) -> None:  # noqa: ANN001
    a, b = _ab()
    with pytest.raises(ValueError) as err:
        scaled_mm(a, b, sa, sb, out_dtype=torch.float32, accumulator="cpu_onednn")
    sa_n, sb_n = np.asarray(sa), np.asarray(sb)
    assert str(err.value) == (
        "accumulator 'cpu_onednn' is torch's oneDNN CPU kernel, which takes one float scale per operand (Blas.cpp "
        "sends other scale layouts to the fallback kernel: accumulator 'cpu_reference'); got scales of shapes "
        f"{list(sa_n.shape)} and {list(sb_n.shape)}, dtypes {sa_n.dtype} and {sb_n.dtype}"
    )


def test_onednn_model_needs_out_dtype_with_scale_result() -> None:
    a, b = _ab()
    with pytest.raises(ValueError) as err:
        scaled_mm(a, b, ONE, ONE, scale_result=torch.tensor(2.0), accumulator="cpu_onednn")
    assert str(err.value) == (
        "torch's oneDNN CPU kernel reads out_dtype without checking it is set when scale_result is given (undefined "
        "behaviour in mkldnn_scaled_mm): pass out_dtype with scale_result"
    )
    got = scaled_mm(a, b, ONE, ONE, scale_result=torch.tensor(2.0), out_dtype=E4, accumulator="cpu_onednn")
    assert (got.float() == 16.0).all()  # 32 / 2


def _overflow_code(**kw: object) -> int:
    a = torch.full((16, 32), 448.0).to(E4)
    b = torch.full((16, 32), 448.0).to(E4).t()
    return int(scaled_mm(a, b, ONE, ONE, out_dtype=E4, accumulator="cpu_reference", **kw).view(torch.uint8)[0, 0])


@pytest.mark.parametrize(
    ("version", "code"),
    [("2.12.1+cpu", 0x7F), ("2.7.0", 0x7F), ("2.13.0+cpu", 0x7E), ("2.14.0a0+git1234", 0x7E), ("3.0.0", 0x7E)],
)
def test_the_fallbacks_fp8_cast_follows_the_installed_torch(monkeypatch, version: str, code: int) -> None:  # noqa: ANN001
    monkeypatch.setattr(torch, "__version__", version)
    assert _overflow_code() == code


def test_without_torch_the_fallbacks_cast_is_torch_2_13s(monkeypatch) -> None:  # noqa: ANN001
    a, b = np.full((16, 32), 0x7E, np.uint8), np.full((32, 16), 0x7E, np.uint8)  # E4M3 448
    monkeypatch.setitem(sys.modules, "torch", None)
    one = np.float32(1)
    kw = {"out_dtype": "e4m3", "a_format": "e4m3", "b_format": "e4m3", "accumulator": "cpu_reference"}
    assert (scaled_mm(a, b, one, one, **kw) == 0x7E).all()
