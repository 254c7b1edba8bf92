"""The torch backend's compiled stochastic-rounding pass: both of its code paths (codes computed in the
SIMD loop, or looked up in the code table) give the numpy backend's bits for any float32 bit pattern,
and it runs numba on torch's thread count without changing that count."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import fp8sim
from fp8sim.testing.oracles import require

torch = require("torch")
require("numba")
hypothesis = require("hypothesis")
st = hypothesis.strategies

_TABLE_FORMATS = ["e4m3", "e5m2", "e2m1", "e2m3", "e3m2", "e4m3fnuz", "e5m2fnuz", "e8m0"]


def _kernel_or_skip():  # noqa: ANN202
    from fp8sim.cast import torch_backend

    if torch_backend._sr_kernel() is None:
        pytest.skip("FP8SIM_NUMBA=0")
    return torch_backend


def test_codes_are_computed_in_the_loop_for_the_ocp_formats_and_looked_up_for_e8m0() -> None:
    """The computed path covers E4M3, E5M2 and the MX FP4/FP6 formats (both overflow policies) and
    E4M3FNUZ/E5M2FNUZ when saturating; E8M0 (no sign, no subnormals) and the fnuz formats without
    saturation (overflow is the sign-less NaN 0x80) take the table: the equality tests below then
    cover both paths."""
    from fp8sim.cast import torch_backend
    from fp8sim.formats import get_format

    computed = {(f, s) for f in _TABLE_FORMATS for s in (True, False) if torch_backend._sr_arith(get_format(f), s)}
    want = {(f, s) for f in ["e4m3", "e5m2", "e2m1", "e2m3", "e3m2"] for s in (True, False)}
    want |= {("e4m3fnuz", True), ("e5m2fnuz", True)}
    assert computed == want


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(
    n=st.integers(1, (1 << 16) + 200),
    data_seed=st.integers(0, 2**32 - 1),
    rounding_seed=st.integers(0, 2**64 - 1),
    fmt=st.sampled_from(_TABLE_FORMATS),
    saturate=st.booleans(),
    table=st.booleans(),
)
def test_compiled_pass_equals_numpy_backend_on_any_bits(
    monkeypatch_session: pytest.MonkeyPatch,
    n: int,
    data_seed: int,
    rounding_seed: int,
    fmt: str,
    saturate: bool,
    table: bool,
) -> None:
    """Uniform float32 bit patterns (every class: zeros, float32 subnormals, the format's subnormal
    range, overflow, Inf, NaN payloads of both signs) and values near the format's range, through
    the computed path or (``table``) the forced table lookup: the numpy backend's bits."""
    torch_backend = _kernel_or_skip()
    rng = np.random.default_rng(data_seed)
    bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    near = (rng.standard_normal(n) * np.exp2(rng.integers(-12, 10, n))).astype(np.float32).view(np.uint32)
    x = np.where(rng.random(n) < 0.5, bits, near).view(np.float32)
    with monkeypatch_session.context() as mp:
        if table:
            mp.setattr(torch_backend, "_sr_arith", lambda f, s: None)
        got = fp8sim.encode(torch.from_numpy(x), fmt, rounding="stochastic", saturate=saturate, seed=rounding_seed)
    ref = fp8sim.encode(x, fmt, rounding="stochastic", saturate=saturate, seed=rounding_seed)
    bad = np.flatnonzero(got.numpy() != ref)
    assert bad.size == 0, (
        f"{fmt} sat={saturate} table={table}: first diff at {bad[0]}: bits={x.view(np.uint32)[bad[0]]:#010x} "
        f"got {got.numpy()[bad[0]]:#04x} want {ref[bad[0]]:#04x}"
    )


@pytest.mark.parametrize("fmt", _TABLE_FORMATS)
@pytest.mark.parametrize("saturate", [True, False])
def test_every_exponent_field_and_mantissa_edge_equals_numpy_backend(fmt: str, saturate: bool) -> None:
    """Every float32 exponent field (the format's subnormal range, whose codes the SIMD loop computes
    from the fixed grid, its edges, overflow, Inf/NaN) with edge and random mantissas, both signs,
    under 4 seeds: the numpy backend's bits (its subnormal range runs the float64 algorithm)."""
    _kernel_or_skip()
    rng = np.random.default_rng(17)
    mant = np.concatenate([[0, 1, 2, 0x400000, 0x3FFFFF, 0x7FFFFE, 0x7FFFFF], rng.integers(0, 1 << 23, 57)])
    ef = np.arange(256, dtype=np.uint32)
    bits = (ef[:, None] << 23 | mant[None, :].astype(np.uint32)).reshape(-1)
    x = np.concatenate([bits, bits | np.uint32(0x80000000)]).view(np.float32)
    for seed in (0, 1, 2**40 + 3, 2**64 - 1):
        got = fp8sim.encode(torch.from_numpy(x), fmt, rounding="stochastic", saturate=saturate, seed=seed)
        ref = fp8sim.encode(x, fmt, rounding="stochastic", saturate=saturate, seed=seed)
        bad = np.flatnonzero(got.numpy() != ref)
        assert bad.size == 0, (
            f"{fmt} sat={saturate} seed={seed}: first diff at bits={x.view(np.uint32)[bad[0]]:#010x} "
            f"got {got.numpy()[bad[0]]:#04x} want {ref[bad[0]]:#04x}"
        )


@pytest.fixture(scope="module")
def monkeypatch_session():  # noqa: ANN201 - a monkeypatch hypothesis may reuse across examples
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_compiled_pass_runs_numba_on_torch_threads_and_gives_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """With torch at 1 thread the kernel runs on 1 numba thread (like torch's own cast), at 2 on
    min(2, NUMBA_NUM_THREADS); numba's count is restored after the call and the bits do not depend
    on the thread count (counter-based random bits)."""
    import numba

    torch_backend = _kernel_or_skip()
    sr, gather = torch_backend._sr_kernel()
    seen: list[int] = []

    def recording_sr(*args):  # noqa: ANN002, ANN202
        seen.append(numba.get_num_threads())
        return sr(*args)

    monkeypatch.setattr(torch_backend, "_sr_kernel", lambda: (recording_sr, gather))
    x = (np.random.default_rng(3).standard_normal(3 * (1 << 16) + 5) * 40).astype(np.float32)
    ref = fp8sim.encode(x, "e4m3", rounding="stochastic", seed=11)
    saved, before = torch.get_num_threads(), numba.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            got = fp8sim.encode(torch.from_numpy(x), "e4m3", rounding="stochastic", seed=11)
            assert np.array_equal(got.numpy(), ref), threads
            assert torch.get_num_threads() == threads
            assert numba.get_num_threads() == before
    finally:
        torch.set_num_threads(saved)
    assert seen == [1, min(2, numba.config.NUMBA_NUM_THREADS)]


def test_first_compiled_call_keeps_torch_at_one_thread() -> None:
    """numba's OpenMP layer, started by the first parallel call in a process, resets the OpenMP
    thread count torch reads: after ``torch.set_num_threads(1)`` (torch's pool already used with 2)
    torch reported 2 threads after the first stochastic cast.  A fresh process, no kernel compiled:
    the thread guard the pass runs under, with a probe in place of the kernel."""
    script = textwrap.dedent(
        """
        import torch
        torch.set_num_threads(2)
        (torch.ones(1 << 20) * 3).sum()  # torch's OpenMP pool runs with 2 threads
        torch.set_num_threads(1)
        import numba
        from fp8sim.cast import torch_backend
        inside = torch_backend._on_torch_threads(lambda: (torch.get_num_threads(), numba.get_num_threads()))
        print(*inside, torch.get_num_threads())
        """
    )
    env = {**os.environ, "NUMBA_NUM_THREADS": "2", "OMP_NUM_THREADS": "2"}
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["1", "1", "1"], res.stdout
