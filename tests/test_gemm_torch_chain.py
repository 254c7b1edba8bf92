"""The torch-ops tensor-core chains (``scaled_mm(backend="torch")``, :mod:`fp8sim.gemm._torch_chain`):
bit for bit against the MMA-Sim golden vectors (tests/data/golden/mma, independent of fp8sim) and
equal to the numpy reference path (``FP8SIM_NUMBA=0``) on any codes, specials included.  Run here on
CPU torch; the same ops run on CUDA (``scripts/gpu_session.sh`` checks and times them there)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fp8sim.formats import get_format
from fp8sim.gemm import INSTRUCTION_MODELS, scaled_mm
from fp8sim.testing.oracles import require

torch = require("torch")
from fp8sim.gemm._torch_chain import chain_dots  # noqa: E402

GOLDEN = Path(__file__).parent / "data" / "golden" / "mma"
SETS = {
    "hopper_wgmma_f32_e4m3_e4m3": ("hopper_wgmma", "e4m3", "e4m3"),
    "hopper_wgmma_f32_e5m2_e4m3": ("hopper_wgmma", "e5m2", "e4m3"),
    "hopper_wgmma_f32_e5m2_e5m2": ("hopper_wgmma", "e5m2", "e5m2"),
    "ada_mma_f32_e4m3_e4m3": ("ada_mma", "e4m3", "e4m3"),
    "blackwell_tcgen05_f32_e4m3_e4m3": ("blackwell_tcgen05", "e4m3", "e4m3"),
}
ACCS = ("hopper_fast", "hopper_split", "ada_fast", "ada_split", "blackwell", "blackwell_split")


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # bit-exact: reductions split by thread


@pytest.mark.parametrize("stem", list(SETS))
def test_torch_chain_golden_set_bit_exact(stem: str) -> None:
    model, fa, fb = SETS[stem]
    z = dict(np.load(GOLDEN / f"{stem}.npz"))
    d = chain_dots(
        torch.from_numpy(z["a"]), torch.from_numpy(z["b"]), torch.from_numpy(z["c"]),
        get_format(fa), get_format(fb), INSTRUCTION_MODELS[model],
    )  # fmt: skip
    got = d.view(torch.int32).numpy().view(np.uint32)
    assert np.array_equal(got, z["d"]), f"{int((got != z['d']).sum())} of {got.size} differ"


def test_torch_chain_golden_chain_of_16_wgmma() -> None:
    z = dict(np.load(GOLDEN / "hopper_wgmma_chain_e4m3.npz"))
    f = get_format("e4m3")
    d = chain_dots(torch.from_numpy(z["a"]), torch.from_numpy(z["b"]), torch.from_numpy(z["c"]), f, f,
                   INSTRUCTION_MODELS["hopper_wgmma"])  # fmt: skip
    assert np.array_equal(d.view(torch.int32).numpy().view(np.uint32), z["d"])


def _reference(a, b, **kw):  # noqa: ANN001, ANN003, ANN202 - the numpy path, compiled chains off
    old = os.environ.get("FP8SIM_NUMBA")
    os.environ["FP8SIM_NUMBA"] = "0"
    try:
        return scaled_mm(a, b, np.float32(1), np.float32(1), **kw)
    finally:
        os.environ.pop("FP8SIM_NUMBA") if old is None else os.environ.__setitem__("FP8SIM_NUMBA", old)


@settings(max_examples=40, deadline=None)
@given(
    data=st.data(),
    m=st.integers(1, 3),
    n=st.integers(1, 3),
    k=st.integers(1, 300),
    fmts=st.sampled_from([("e4m3", "e4m3"), ("e5m2", "e4m3"), ("e5m2", "e5m2")]),
    acc=st.sampled_from(ACCS),
    split=st.sampled_from([None, (2, "contiguous"), (3, "serial"), (4, "pairwise")]),
    specials=st.booleans(),
)
def test_torch_backend_equals_numpy_path(data, m, n, k, fmts, acc, split, specials) -> None:  # noqa: ANN001
    """Law: both backends give the same bits, for any codes (NaN/Inf codes when ``specials``)."""
    fa, fb = (get_format(f) for f in fmts)
    codes = st.integers(0, 255)
    if not specials:
        codes = codes.filter(lambda c: bool(np.isfinite(fa.code_value(c)) and np.isfinite(fb.code_value(c))))
    a = np.array(data.draw(st.lists(codes, min_size=m * k, max_size=m * k)), np.uint8).reshape(m, k)
    b = np.array(data.draw(st.lists(codes, min_size=k * n, max_size=k * n)), np.uint8).reshape(k, n)
    kw = {"out_dtype": "float32", "accumulator": acc, "a_format": fa, "b_format": fb, "strict": False, "split_k": split}
    ref = _reference(a, b, **kw)
    got = scaled_mm(a, b, np.float32(1), np.float32(1), backend="torch", **kw)
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))


def test_torch_backend_on_torch_tensors_matches_numpy() -> None:
    """Torch FP8 operands (column-major b, rowwise scales, bias, bfloat16 out) through the full epilogue."""
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(8, 256, generator=g) * 30).to(torch.float8_e4m3fn)
    w = (torch.randn(16, 256, generator=g) * 0.1).to(torch.float8_e4m3fn)
    sa, sb = torch.rand(8, 1, generator=g) + 0.5, torch.rand(1, 16, generator=g) + 0.5
    bias = torch.randn(16, generator=g).to(torch.bfloat16)
    kw = {"bias": bias, "out_dtype": torch.bfloat16, "use_fast_accum": True, "accumulator": "hopper_fast"}
    ref = scaled_mm(x, w.t(), sa, sb, backend="numpy", **kw)
    got = scaled_mm(x, w.t(), sa, sb, backend="torch", **kw)
    assert got.dtype == torch.bfloat16 and got.device == x.device
    assert torch.equal(got.view(torch.int16), ref.view(torch.int16))


@pytest.mark.parametrize("acc", ["dequantized_fp32", "cpu_reference"])
def test_torch_backend_refuses_what_it_does_not_run(acc: str) -> None:
    a = np.full((2, 128), 0x38, np.uint8)
    kw = {"out_dtype": "float32", "a_format": "e4m3", "b_format": "e4m3", "strict": False, "accumulator": acc}
    with pytest.raises(ValueError, match="backend='torch' runs the tensor-core accumulators"):
        scaled_mm(a, a.T.copy(), np.float32(1), np.float32(1), backend="torch", **kw)


def test_backend_name_is_checked() -> None:
    a = np.zeros((1, 32), np.uint8)
    with pytest.raises(ValueError, match="backend must be None, 'numpy' or 'torch'; got 'cuda'"):
        scaled_mm(a, a.T.copy(), np.float32(1), np.float32(1), out_dtype="float32", a_format="e4m3",
                  b_format="e4m3", backend="cuda")  # fmt: skip


def test_torch_backend_default_stays_numpy_for_cpu_tensors(monkeypatch) -> None:  # noqa: ANN001
    """CPU torch operands without ``backend`` take the numpy path (the torch path is for devices)."""
    from fp8sim.gemm import _torch_chain

    def boom(*args, **kw):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("torch path used")

    monkeypatch.setattr(_torch_chain, "chain_gemm", boom)
    x = torch.ones(16, 32).to(torch.float8_e4m3fn)
    out = scaled_mm(x, x.t(), torch.tensor(1.0), torch.tensor(1.0), out_dtype=torch.float32, accumulator="hopper_fast")
    assert torch.equal(out, torch.full((16, 16), 32.0))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (scripts/gpu_session.sh)")
@pytest.mark.parametrize("acc", ACCS)
def test_torch_chain_on_cuda_equals_numpy_path(acc: str) -> None:
    """On a CUDA device the default path is the torch-ops chains; same bits as the numpy path."""
    rng = np.random.default_rng(7)
    a = rng.integers(0, 256, (16, 320), dtype=np.uint8)
    b = rng.integers(0, 256, (320, 16), dtype=np.uint8)
    a[(a & 0x7F) == 0x7F] = 0  # finite E4M3 codes only: NaN payloads are compared separately above
    b[(b & 0x7F) == 0x7F] = 0
    ref = _reference(a, b, out_dtype="float32", accumulator=acc, a_format="e4m3", b_format="e4m3")
    at = torch.from_numpy(a).view(torch.float8_e4m3fn).cuda()
    bt = torch.from_numpy(np.ascontiguousarray(b.T)).view(torch.float8_e4m3fn).cuda().t()
    one = torch.tensor(1.0, device="cuda")
    got = scaled_mm(at, bt, one, one, out_dtype=torch.float32, accumulator=acc)
    assert got.device.type == "cuda"
    assert np.array_equal(got.cpu().numpy().view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize(
    ("acc", "split"), [("hopper_fast", None), ("ada_split", (3, "serial")), ("exact", None), ("blackwell_mma", None)]
)
def test_device_code_path_on_cpu_tensors(monkeypatch, acc: str, split) -> None:  # noqa: ANN001
    """The path CUDA operands take (codes kept as device tensors; the numpy path after all for what the
    torch chains do not run), exercised here by treating CPU tensors as device tensors."""
    import importlib

    sm_module = importlib.import_module("fp8sim.gemm.scaled_mm")  # the module (the package exports the function)

    g = torch.Generator().manual_seed(2)
    x = (torch.randn(16, 256, generator=g) * 30).to(torch.float8_e4m3fn)
    w = (torch.randn(32, 256, generator=g) * 0.1).to(torch.float8_e5m2)
    one = torch.tensor(1.0)
    kw = {"out_dtype": torch.float32, "accumulator": acc, "split_k": split}
    ref = scaled_mm(x, w.t(), one, one, backend="numpy", **kw)
    monkeypatch.setattr(sm_module, "_keep_on_device", lambda a, b, backend: backend != "numpy")
    got = scaled_mm(x, w.t(), one, one, **kw)
    assert torch.equal(got.view(torch.int32), ref.view(torch.int32))
