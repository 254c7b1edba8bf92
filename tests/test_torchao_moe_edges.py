"""FP8 rowwise grouped GEMM edges (``torchao/prototype/moe_training/fp8_grouped_mm.py``, Triton-only in torchao,
re-derived): an Inf in a token row gives that row torchao's scale of 0 (``max / Inf``), so the row's products
are NaN (``Inf * 0``) and the other rows are untouched, without numpy warnings; argument errors name both
shapes."""

from __future__ import annotations

import warnings

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

from fp8sim.torchao.moe import fp8_rowwise_grouped_mm  # noqa: E402


def test_an_inf_token_row_is_nan_and_leaves_the_others_without_numpy_warnings() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 32, generator=g)
    w_t = torch.randn(2, 32, 16, generator=g)
    offs = torch.tensor([16, 32], dtype=torch.int32)
    clean = fp8_rowwise_grouped_mm(x, w_t, offs)
    x[3, 5] = float("inf")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "invalid value" RuntimeWarning would be an error
        out = fp8_rowwise_grouped_mm(x, w_t, offs)
    assert torch.isnan(out[3]).all()
    keep = torch.arange(32) != 3
    assert torch.equal(out[keep], clean[keep])


def test_operand_rank_errors_name_both_ranks() -> None:
    with pytest.raises(ValueError, match=r"^x must be 2D and w_t 3D; got 3D and 3D$"):
        fp8_rowwise_grouped_mm(torch.ones(2, 16, 16), torch.ones(2, 16, 16), torch.tensor([2], dtype=torch.int32))
