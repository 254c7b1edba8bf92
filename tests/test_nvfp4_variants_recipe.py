"""The fp8sim extension ``NVFP4BlockScaling(fp8sim_nvfp4_variant=...)``: validation, the modules' GEMMs, refusals.

The module reference quantizes with the rule written in tests/test_scaling_nvfp4_variants.py from TE PR#3325
(head b47e1f88, ``core_nvfp4.cuh`` 54-94) and sums exactly (Fraction), as ``accumulator="exact"`` promises:
``y = fl32(fl32(exact sum) * fl32(g_x * g_w))`` with ``g`` the global decode scales (TE's GEMM alpha).
"""

from __future__ import annotations

import numpy as np
import pytest

from fp8sim.recipe import NVFP4BlockScaling, RecipeError, RecipeValidationError
from fp8sim.testing.oracles import require
from tests.test_scaling_nvfp4_variants import SCALE, _fraction_gemm, ref_quantize

F32 = np.float32


def test_variant_field_validates_and_names_itself_in_repr():
    assert "fp8sim_nvfp4_variant" not in repr(NVFP4BlockScaling())  # TE's repr by default
    assert "fp8sim_nvfp4_variant=ue5m3x16" in repr(NVFP4BlockScaling(fp8sim_nvfp4_variant="ue5m3x16"))
    with pytest.raises(RecipeValidationError, match="one of e4m3x16, ue5m3x16, e4m3x32"):
        NVFP4BlockScaling(fp8sim_nvfp4_variant="ue5m3")
    with pytest.raises(RecipeError, match="incompatible with UE5M3 scales"):
        NVFP4BlockScaling(fp8sim_nvfp4_variant="ue5m3x16", nvfp4_4over6="all")
    with pytest.raises(RecipeError, match="disable_2d_quantization=True"):
        NVFP4BlockScaling(fp8sim_nvfp4_variant="e4m3x32")
    with pytest.raises(RecipeError, match="row-scaled"):
        NVFP4BlockScaling(fp8sim_nvfp4_variant="ue5m3x16", row_scaled_activation=True)


def _recipe(variant):
    return NVFP4BlockScaling(
        disable_rht=True, disable_stochastic_rounding=True, disable_2d_quantization=True, fp8sim_nvfp4_variant=variant
    )


@pytest.mark.parametrize("variant", ["ue5m3x16", "e4m3x32"])
def test_linear_forward_with_variant_is_the_exact_block_scaled_gemm(variant):
    torch = require("torch")
    import fp8sim.pytorch as te

    rng = np.random.default_rng(11)
    x = (rng.standard_normal((32, 64)) * np.exp2(rng.integers(-8, 8, (32, 1)))).astype(np.float32)
    w = rng.standard_normal((32, 64)).astype(np.float32)
    lin = te.Linear(64, 32, bias=False, params_dtype=torch.float32)
    with torch.no_grad():
        lin.weight.copy_(torch.from_numpy(w))
    with te.autocast(recipe=_recipe(variant), accumulator="exact"):
        y = lin(torch.from_numpy(x)).detach().numpy()
    xc, xs, xg, _ = ref_quantize(x, variant)
    wc, ws, wg, _ = ref_quantize(w, variant)
    sdt, _, bs = SCALE[variant]
    acc = _fraction_gemm(xc, np.ascontiguousarray(wc.T), xs, np.ascontiguousarray(ws.T), sdt, bs)
    want = (acc * F32(xg * wg)).astype(np.float32)
    assert np.array_equal(y.view(np.uint32), want.view(np.uint32))
    # negative control: TE's E4M3 per 16 gives another result on the same module and data
    with te.autocast(recipe=_recipe("e4m3x16"), accumulator="exact"):
        y16 = lin(torch.from_numpy(x)).detach().numpy()
    assert not np.array_equal(y16, want)


def test_variant_runs_training_step_and_is_refused_by_te_quantizer_objects():
    torch = require("torch")
    import fp8sim.pytorch as te

    lin = te.Linear(64, 32, params_dtype=torch.float32)
    x = torch.randn(32, 64, requires_grad=True)
    recipe = NVFP4BlockScaling(fp8sim_nvfp4_variant="ue5m3x16")  # RHT, SR and 2D tiles as TE's roles set them
    with te.autocast(recipe=recipe):
        lin(x).sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(lin.weight.grad).all()
    from fp8sim.pytorch.module._quantizers import _nvfp4

    with pytest.raises(NotImplementedError, match="fp8sim_nvfp4_variant='ue5m3x16'.*NVFP4Quantizer"):
        _nvfp4(recipe, True, "input")
