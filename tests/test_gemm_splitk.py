"""Split-K (``scaled_mm(split_k=...)``) bit for bit against mmaemu 0.1.0, an independent model of
``torch._scaled_mm`` on an H100 PCIe and an RTX 4060 (cuBLASLt 12.8.3.14) built from recordings.

The shapes are rows of mmaemu's recorded split-K tables (``mmaemu/platform/data/heur_*.npz``): the
split each test uses is the one the GPU chose (``mmaemu.explain`` reports ``source='table'``), and
mmaemu's replay of those recordings is its validation (``docs/validation.md``).
"""

from __future__ import annotations

import warnings
from fractions import Fraction

import numpy as np
import pytest

torch = pytest.importorskip("torch")
mmaemu = pytest.importorskip("mmaemu")

from fp8sim.gemm import scaled_mm  # noqa: E402
from fp8sim.gemm.splitk import check_split_k, combine_partials, split_indices  # noqa: E402

torch.set_num_threads(1)
_E4, _E5 = torch.float8_e4m3fn, torch.float8_e5m2
_OUT = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "e4m3": _E4}


def _operands(m: int, n: int, k: int, fa=_E4, fb=_E4, seed: int = 0):  # noqa: ANN001, ANN202
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, k, generator=g) * 40).clamp(-448, 448).to(fa)
    w = (torch.randn(n, k, generator=g) * 40).clamp(-448, 448).to(fb)
    return x, w.t(), torch.tensor(1 / 64), torch.tensor(1 / 32)


def _bits(t):  # noqa: ANN001, ANN202
    return t.view({4: torch.int32, 2: torch.int16, 1: torch.uint8}[t.element_size()]).numpy()


def _assert_same(got, ref, what: str) -> None:  # noqa: ANN001
    g, r = _bits(got), _bits(ref)
    if not np.array_equal(g, r):
        i = np.argwhere(g != r)[0]
        raise AssertionError(
            f"{what}: {(g != r).mean():.2%} differ; first at {tuple(i)}: {g[tuple(i)]:#x} vs {r[tuple(i)]:#x}"
        )


def _table_split(args, profile: str, out, fast: bool) -> tuple[int, str]:  # noqa: ANN001
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = mmaemu.explain(*args, out_dtype=out, use_fast_accum=fast, profile=profile)
    assert plan.split is not None and plan.split.source == "table", plan.validation
    return plan.split.S, plan.split.scheme


def _mmaemu(args, profile: str, out, fast: bool, split: tuple[int, str]):  # noqa: ANN001, ANN202
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return mmaemu.scaled_mm(*args, out_dtype=out, use_fast_accum=fast, profile=profile, splitk=split)


# (profile, M, N, K, out, fast, S the table records): split and unsplit rows, every output type
TABLE_ROWS = [
    ("hopper", 16, 64, 5760, "bfloat16", True, 2),
    ("hopper", 16, 64, 5760, "float16", False, 2),
    ("hopper", 16, 64, 5760, "float32", True, 2),
    ("hopper", 16, 64, 5760, "e4m3", False, 2),
    ("hopper", 16, 64, 1920, "bfloat16", False, 1),
    ("hopper", 16, 64, 1920, "float32", True, 1),
    ("ada", 16, 16, 1024, "float16", False, 3),
    ("ada", 16, 16, 1024, "bfloat16", True, 1),
    ("ada", 16, 48, 3072, "bfloat16", True, 3),
    ("ada", 16, 48, 3072, "float32", False, 3),
    ("ada", 16, 64, 5760, "bfloat16", True, 10),
    ("ada", 16, 64, 5760, "float16", False, 10),
]


@pytest.mark.parametrize(("profile", "m", "n", "k", "out", "fast", "s"), TABLE_ROWS)
def test_split_k_matches_mmaemu_on_recorded_splits(
    profile: str, m: int, n: int, k: int, out: str, fast: bool, s: int
) -> None:
    args = _operands(m, n, k, seed=k + m)
    split = _table_split(args, profile, _OUT[out], fast)
    assert split[0] == s
    ref = _mmaemu(args, profile, _OUT[out], fast, split if s > 1 else 1)
    acc = f"{profile}_{'fast' if fast else 'split'}"
    got = scaled_mm(*args, out_dtype=_OUT[out], use_fast_accum=fast, accumulator=acc, split_k=split)
    _assert_same(got, ref, f"{profile} {m}x{n}x{k} {out} fast={fast} split={split}")


@pytest.mark.parametrize(
    ("profile", "scheme", "s", "fast", "fa", "fb"),
    [
        ("ada", "serial", 3, False, _E4, _E5),
        ("ada", "serial", 4, True, _E5, _E4),
        ("ada", "pairwise", 5, True, _E4, _E4),
        ("hopper", "contiguous", 3, False, _E5, _E4),
        ("hopper", "contiguous", 7, True, _E4, _E4),  # 9 k-tiles over 7 splits: empty last splits
    ],
)
def test_explicit_split_schemes_match_mmaemu(profile: str, scheme: str, s: int, fast: bool, fa, fb) -> None:  # noqa: ANN001
    """Every scheme and both accumulations on a ragged K (1040: a partial last k-tile)."""
    args = _operands(16, 32, 1040, fa, fb, seed=s)
    ref = _mmaemu(args, profile, torch.float32, fast, (s, scheme))
    acc = f"{profile}_{'fast' if fast else 'split'}"
    got = scaled_mm(*args, out_dtype=torch.float32, use_fast_accum=fast, accumulator=acc, split_k=(s, scheme))
    _assert_same(got, ref, f"{profile} {scheme} S={s} fast={fast}")
    if scheme == "contiguous" and not fast:
        return  # each 128-wide tile is its own chain either way; partials of 14 bits add exactly in float32
    unsplit = scaled_mm(*args, out_dtype=torch.float32, use_fast_accum=fast, accumulator=acc)
    assert not np.array_equal(_bits(unsplit), _bits(ref)), "the split must matter on this case"


@pytest.mark.parametrize(("k", "s", "scheme"), [(1040, 3, "contiguous"), (1152, 7, "contiguous"), (1040, 5, "serial")])
def test_split_indices_follow_mmaemus_plan(k: int, s: int, scheme: str) -> None:
    """Index order against mmaemu's own plan (``mmaemu/model/plan.py`` split_index / contiguous_index)."""
    from mmaemu.model import plan

    ours = split_indices(k, s, scheme)
    if scheme == "contiguous":
        ref = [t.numpy() for t in plan.contiguous_index(k, s)]
    else:
        ref = list(plan.split_index(k, s).numpy())
    assert len(ours) == len(ref)
    for i, (a, b) in enumerate(zip(ours, ref, strict=True)):
        # mmaemu pads every interleaved split to the same length; zero padding only ever trails
        assert np.array_equal(a[a >= 0], b[b >= 0]), f"split {i}"
        assert (a[np.argmax(a < 0) :] < 0).all() if (a < 0).any() else True


@pytest.mark.parametrize("s", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("scheme", ["serial", "pairwise", "contiguous"])
def test_combination_order_matches_mmaemus_reduce(s: int, scheme: str) -> None:
    from mmaemu.model.plan import reduce_partials

    rng = np.random.default_rng(s)
    parts = [(rng.standard_normal((8, 8)) * 10.0 ** rng.integers(-4, 5)).astype(np.float32) for _ in range(s)]
    ref = reduce_partials([torch.from_numpy(p) for p in parts], scheme).numpy()
    assert np.array_equal(combine_partials(parts, scheme).view(np.uint32), ref.view(np.uint32))


def test_exact_accumulator_split_is_exact_partials_added_in_order() -> None:
    """``exact`` with a split: each split's exact sum rounded once, then cuBLAS's pairwise order
    (oracle: Fractions, and mmaemu's reduce_partials for the order)."""
    from mmaemu.model.plan import reduce_partials

    x, w, _, _ = _operands(2, 16, 320, seed=3)
    got = scaled_mm(
        x,
        w,
        torch.tensor(1.0),
        torch.tensor(1.0),
        out_dtype=torch.float32,
        accumulator="exact",
        split_k=(3, "pairwise"),
    )
    xa, wa = x.float().double().numpy(), w.float().double().numpy()
    parts = []
    for idx in split_indices(320, 3, "pairwise"):
        idx = idx[idx >= 0]
        p = np.empty((2, 16), np.float32)
        for i in range(2):
            for j in range(16):
                p[i, j] = float(sum(Fraction(xa[i, t]) * Fraction(wa[t, j]) for t in idx))  # float(): nearest
        parts.append(torch.from_numpy(p))
    ref = reduce_partials(parts, "pairwise")
    _assert_same(got, ref, "exact pairwise")


def test_split_k_none_and_one_are_unsplit() -> None:
    args = _operands(16, 16, 512)
    base = scaled_mm(*args, out_dtype=torch.float32, accumulator="hopper_fast")
    for split in (None, (1, "serial")):
        assert np.array_equal(
            _bits(scaled_mm(*args, out_dtype=torch.float32, accumulator="hopper_fast", split_k=split)), _bits(base)
        )


@pytest.mark.parametrize("bad", [(0, "serial"), (2, "tiled"), 3, (2.0, "serial"), (True, "serial")])
def test_bad_split_k_is_refused_naming_the_allowed_values(bad) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="split_k"):
        check_split_k(bad)
