"""The whole "Invalid scaling configuration." message of an unknown scale layout: its torch lines and the
description of the scales given equal torch 2.13's own CPU ``_scaled_mm`` message for the same call; the
block-layout lines (fp8sim's addition) name the shapes of torch's block layouts for this M, K, N: 1x128 and
128x128 in ceil(K / 128) blocks, MX in ceil(K / 32), NVFP4 in ceil(K / 16) (written out below for M = 144,
K = 272, N = 400, so that every ceiling differs from the floor)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import fp8sim.gemm as g
from fp8sim.testing.oracles import require

M, K, N = 144, 272, 400
BLOCK_LINES = [
    "- For BlockWise 1x128 / 128x128 scaling, scales should be float, scale_a (144, 3) or (2, 3) and "
    "scale_b (3, 400) or (3, 4), not both 128x128.",
    "- For MX (1x32) scaling, scales should be E8M0 codes, scale_a (144, 9) and scale_b (9, 400); "
    "for NVFP4 (1x16), E2M1 operands and UE4M3 codes (144, 17) and (17, 400).",
]


def _message(fn, *args, **kw) -> str:
    with pytest.raises(ValueError) as info:
        fn(*args, **kw)
    return str(info.value)


@pytest.mark.parametrize(
    "scales",
    [
        ((3, 3), "float32", (1,), "float32"),
        ((M, 1), "float64", (1, N), "float16"),
        ((1,), "bfloat16", (2, 2), "float32"),
    ],
)
def test_the_message_is_torchs_with_the_block_layouts_added(scales: tuple) -> None:
    torch = require("torch")
    shape_a, dt_a, shape_b, dt_b = scales
    a = torch.zeros(M, K).to(torch.float8_e4m3fn)
    b = torch.zeros(N, K).to(torch.float8_e4m3fn).t()
    sa = torch.ones(shape_a, dtype=getattr(torch, dt_a))
    sb = torch.ones(shape_b, dtype=getattr(torch, dt_b))
    theirs = _message(torch._scaled_mm, a, b, scale_a=sa, scale_b=sb, out_dtype=torch.float32)
    ours = _message(g.scaled_mm, a, b, sa, sb, out_dtype=torch.float32)
    t_lines, o_lines = theirs.split("\n"), ours.split("\n")
    assert o_lines[:3] == t_lines[:3]
    assert o_lines[3:5] == BLOCK_LINES
    got = dict(re.findall(r"(scale_[ab]\.(?:dtype|size))\(\)=([A-Za-z0-9]+|\[[0-9, ]*\])", t_lines[3]))
    assert o_lines[5:] == [
        f"Got scale_a dtype {got['scale_a.dtype']}, size {got['scale_a.size']} and "
        f"scale_b dtype {got['scale_b.dtype']}, size {got['scale_b.size']}"
    ]


def test_numpy_scales_are_described_by_their_numpy_dtype_in_torchs_names() -> None:
    a = np.zeros((M, K), np.uint8)
    b = np.zeros((K, N), np.uint8)
    ours = _message(
        g.scaled_mm,
        a,
        b,
        np.ones((3, 3), np.float32),
        np.ones((2, N), np.float32),
        out_dtype="float32",
        a_format="e4m3",
        b_format="e4m3",
    )
    got = "Got scale_a dtype Float, size [3, 3] and scale_b dtype Float, size [2, 400]"
    assert ours.split("\n")[3:6] == [*BLOCK_LINES, got]  # then fp8sim's block_shape hint
