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

from fp8sim.testing.oracles import require

torch = require("torch")
mmaemu = require("mmaemu")

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
        ("ada", "pairwise", 4, False, _E4, _E5),  # slow: chains restart every 2 of a split's own tiles
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


def _doc_split_index(k: int, s: int, scheme: str) -> list[list[int]]:
    """Each split's K indices in chain order, written from mmaemu 0.1.0's description, not from fp8sim:
    ``mmaemu/model/plan.py`` lines 12-13 (Ada: 64-wide k-tiles, tile t to split t mod S, increasing t)
    and lines 22-23 (H100 "contiguous": 128-wide k-tiles, split s owns [s*q, (s+1)*q), q = ceil(T/S)).
    Zero padding of the ragged tail adds +0 and is left out."""
    tile = 128 if scheme == "contiguous" else 64
    tiles = -(-k // tile)
    if scheme == "contiguous":
        q = -(-tiles // s)
        owned = [[t for t in range(tiles) if i * q <= t < (i + 1) * q] for i in range(s)]
    else:
        owned = [[t for t in range(tiles) if t % s == i] for i in range(s)]
    return [[t * tile + j for t in ts for j in range(tile) if t * tile + j < k] for ts in owned]


def _doc_combine(parts: list[np.ndarray], scheme: str) -> np.ndarray:
    """float32 combination of the partials as ``mmaemu/model/plan.py`` lines 16-18 state it (each
    addition rounded to nearest float32; float64 of two float32 values is exact, then one rounding)."""
    f32 = np.float32
    if scheme != "pairwise":
        acc = parts[0]
        for p in parts[1:]:
            acc = (acc.astype(np.float64) + p).astype(f32)
        return acc
    s = len(parts)
    h = -(-s // 2)
    slots = [(parts[i].astype(np.float64) + parts[i + h]).astype(f32) if i + h < s - 1 else parts[i] for i in range(h)]
    acc = parts[s - 1]
    for slot in slots:
        acc = (acc.astype(np.float64) + slot).astype(f32)
    return acc


@pytest.mark.parametrize(("k", "split"), [(320, (3, "pairwise")), (1008, (5, "pairwise")), (720, (4, "serial"))])
def test_exact_accumulator_split_is_exact_partials_added_in_order(k: int, split: tuple[int, str]) -> None:
    """``exact`` with a split: each split's exact sum rounded once, then cuBLAS's order.  Oracle
    independent of ``split_indices`` and ``combine_partials``: Fractions over the index sets and the
    combination written above from mmaemu's description (a wrong index set or order fails here; the
    ragged K=1008 and K=720 leave a partial last k-tile; S=5 gives splits of 4 and 3 tiles)."""
    x, w, _, _ = _operands(2, 16, k, seed=k)
    x = x.float()
    x[:, ::3] = (x[:, ::3] * 2.0**-9).to(_E4).float()  # mixed magnitudes: the partial sums round
    x = x.to(_E4)
    got = scaled_mm(
        x, w, torch.tensor(1.0), torch.tensor(1.0), out_dtype=torch.float32, accumulator="exact", split_k=split
    )
    xa, wa = x.float().double().numpy(), w.float().double().numpy()
    parts = []
    for idx in _doc_split_index(k, *split):
        p = np.empty((2, 16), np.float32)
        for i in range(2):
            for j in range(16):
                p[i, j] = float(sum(Fraction(xa[i, t]) * Fraction(wa[t, j]) for t in idx))  # float(): nearest
        parts.append(p)
    _assert_same(got, torch.from_numpy(_doc_combine(parts, split[1])), f"exact {split} K={k}")
    unsplit = scaled_mm(x, w, torch.tensor(1.0), torch.tensor(1.0), out_dtype=torch.float32, accumulator="exact")
    assert not np.array_equal(_bits(unsplit), _bits(got)), "the split must matter on this case"


@pytest.mark.parametrize(
    ("k", "s", "scheme"), [(1040, 3, "pairwise"), (4096, 10, "pairwise"), (1040, 5, "serial"), (1152, 7, "contiguous")]
)
def test_split_indices_equal_mmaemus_documented_order(k: int, s: int, scheme: str) -> None:
    """fp8sim's index sets (zero padding dropped) against the reference written from mmaemu's docstring."""
    ours = [a[a >= 0].tolist() for a in split_indices(k, s, scheme)]
    assert ours == _doc_split_index(k, s, scheme)


def test_split_k_none_and_one_are_unsplit() -> None:
    args = _operands(16, 16, 512)
    base = scaled_mm(*args, out_dtype=torch.float32, accumulator="hopper_fast")
    for split in (None, (1, "serial")):
        assert np.array_equal(
            _bits(scaled_mm(*args, out_dtype=torch.float32, accumulator="hopper_fast", split_k=split)), _bits(base)
        )


@pytest.mark.parametrize("bad", [(0, "serial"), (2, "tiled"), 3, (2.0, "serial"), (True, "serial")])
def test_bad_split_k_is_refused_naming_the_allowed_values(bad) -> None:  # noqa: ANN001
    with pytest.raises((TypeError, ValueError), match="split_k"):  # a float or bool S: TypeError (issue 29.4)
        check_split_k(bad)
