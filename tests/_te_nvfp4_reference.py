"""TE's NVFP4 reference quantization and RHT, written here in torch from NVIDIA/TransformerEngine at d0067d0
(independent of fp8sim):

- ``pytorch/tensor/nvfp4_tensor.py`` ``get_wgrad_sign_vector`` / ``get_hadamard_matrix`` / ``get_rht_matrix``
  (lines 48-108): ``diag(signs) @ H16 / 4`` in bf16 (signs all +1 without the random sign mask);
- ``pytorch/custom_recipes/reference_nvfp4.py`` ``_apply_rht`` (lines 421-447: ``x.view(-1, 16) @ transform``
  in the input dtype), ``_quantize_blockwise_reference`` (lines 651-760, 1x16 tiles, no 4over6) and
  ``cast_to_fp4x2`` (lines 49-71).
"""

from __future__ import annotations

import torch

WGRAD_SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)
_F32_MAX = torch.finfo(torch.float32).max


def hadamard16() -> torch.Tensor:
    """The Sylvester Hadamard matrix of order 16 (TE writes it out entry by entry)."""
    h = torch.ones(1, 1)
    while h.shape[0] < 16:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def rht_matrix(random_sign_mask: bool = True) -> torch.Tensor:
    signs = torch.tensor(WGRAD_SIGNS, dtype=torch.float32) if random_sign_mask else torch.ones(1)
    return ((signs * torch.eye(16)) @ (hadamard16() * (1 / 16**0.5))).to(torch.bfloat16)


def apply_rht(x: torch.Tensor, random_sign_mask: bool = True) -> torch.Tensor:
    return (x.contiguous().view(-1, 16) @ rht_matrix(random_sign_mask).to(x.dtype)).view(x.shape)


def cast_to_fp4x2(x: torch.Tensor) -> torch.Tensor:
    """E2M1 codes by TE's interval table, two per byte (element 2i in the low nibble)."""
    r = torch.zeros_like(x, dtype=torch.uint8)
    bounds = [
        ((x >= 0.0) & (x <= 0.25), 0),
        ((x > 0.25) & (x < 0.75), 1),
        ((x >= 0.75) & (x <= 1.25), 2),
        ((x > 1.25) & (x < 1.75), 3),
        ((x >= 1.75) & (x <= 2.5), 4),
        ((x > 2.5) & (x < 3.5), 5),
        ((x >= 3.5) & (x <= 5.0), 6),
        (x > 5.0, 7),
        ((x >= -0.25) & (x < -0.0), 8),
        ((x < -0.25) & (x > -0.75), 9),
        ((x <= -0.75) & (x >= -1.25), 10),
        ((x < -1.25) & (x > -1.75), 11),
        ((x <= -1.75) & (x >= -2.5), 12),
        ((x < -2.5) & (x > -3.5), 13),
        ((x <= -3.5) & (x >= -5.0), 14),
        (x < -5.0, 15),
    ]
    for mask, code in bounds:
        r[mask] = code
    return r[:, ::2] + r[:, 1::2] * 16


def quantize_1x16(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(packed codes, E4M3 block scales as uint8, global amax)`` of a 2-D tensor, 1x16 tiles."""
    m, n = x.shape
    global_amax = x.abs().float().amax()
    xb = x.view(m, n // 16, 16)
    vec_max = xb.abs().amax(dim=-1, keepdim=True).float()
    fp4_max, e4m3_max = torch.tensor(6.0), torch.tensor(448.0)
    g_enc = torch.min((e4m3_max * fp4_max) / global_amax, torch.tensor(_F32_MAX))
    if g_enc == 0:
        g_enc = torch.tensor(1.0)
    g_dec = 1.0 / g_enc
    decode = torch.min(vec_max * (g_enc * torch.reciprocal(fp4_max)), torch.tensor(_F32_MAX))
    decode = decode.clamp(-448, 448).to(torch.float8_e4m3fn)
    encode = torch.min(1.0 / (decode.float() * g_dec), torch.tensor(_F32_MAX))
    clipped = (xb.float() * encode).clamp(-6, 6).reshape(m, n)
    return cast_to_fp4x2(clipped), decode.squeeze(-1).view(torch.uint8), global_amax
