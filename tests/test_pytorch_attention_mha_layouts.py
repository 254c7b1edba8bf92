"""MultiheadAttention with FP8 boundaries (``DelayedScaling(fp8_mha=True)``: FP8 Q, K, V in, FP8 dQ, dK, dV back)
gives the same bits in ``bshd`` as in ``sbhd``: the layout only permutes the tokens (TE's ``qkv_format``), and the
sbhd results are checked bit for bit against TE's data flow in ``test_pytorch_attention_mha_fp8.py``."""

from __future__ import annotations

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

from test_pytorch_attention_mha_fp8 import HID, H, _run, _set_scales  # noqa: E402

from fp8sim.pytorch.attention import MultiheadAttention  # noqa: E402
from fp8sim.recipe import DelayedScaling  # noqa: E402


def _mha(fmt: str, ng: int):
    torch.manual_seed(0)
    return MultiheadAttention(
        HID, H, attention_dropout=0.0, attn_mask_type="no_mask", fuse_qkv_params=True, num_gqa_groups=ng,
        window_size=(-1, -1), qkv_format=fmt,
    )  # fmt: skip


@pytest.mark.parametrize("ng", [H, 1])
def test_bshd_fp8_boundaries_give_the_sbhd_bits(ng: int) -> None:
    recipe = DelayedScaling(fp8_dpa=True, fp8_mha=True, amax_history_len=1)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 2, HID, generator=g)
    dy = torch.randn(4, 2, HID, generator=g) * 1e-2
    results = {}
    for fmt in ("sbhd", "bshd"):
        mha = _mha(fmt, ng)
        xi, dyi = (x, dy) if fmt == "sbhd" else (x.transpose(0, 1).contiguous(), dy.transpose(0, 1).contiguous())
        _run(mha, xi, dyi, recipe)  # creates the FP8 state
        _set_scales(mha)
        y, dx, dwqkv, dwproj, _ = _run(mha, xi, dyi, recipe)
        if fmt == "bshd":
            y, dx = y.transpose(0, 1), dx.transpose(0, 1)
        results[fmt] = (y, dx, dwqkv, dwproj)
    for name, a, b in zip(("y", "dx", "dW_qkv", "dW_proj"), results["sbhd"], results["bshd"], strict=True):
        assert torch.equal(a, b), name
