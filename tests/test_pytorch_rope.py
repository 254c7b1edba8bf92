"""RotaryPositionEmbedding and apply_rotary_pos_emb against RoPE as complex rotation in float64.

RoPE (Su et al., arXiv:2104.09864) rotates each pair of channels by ``position * base^(-2i/dim)``: pair i is
``(x_i, x_{i + d/2})`` (TE's default) or ``(x_{2i}, x_{2i+1})`` (``interleaved``); here the pair is a complex
number multiplied by ``exp(1j * angle)``.  TE's rules (``transformer_engine/pytorch/attention/rope.py`` at
d0067d0): ``rotary_percent < 1`` shrinks dim to ``int(dim * rotary_percent)`` (line 50); position
interpolation only with both ``pretrained_max_position_embeddings`` and ``seq_len_interpolation_factor``
(85-97: positions / factor, or * pretrained / max_seq_len beyond pretrained * factor); angles in float32 on the
module's device with autocast off (79-99); channels past the angles' width pass through (``_apply_rotary_
pos_emb_base``, 279-318).
"""

from __future__ import annotations

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

from fp8sim.pytorch.attention import RotaryPositionEmbedding, apply_rotary_pos_emb  # noqa: E402


def _angles(positions: list[float], dim: int, base: float = 10000.0) -> torch.Tensor:
    """[s, dim/2] float64: position * base^(-2i/dim)."""
    i = torch.arange(dim // 2, dtype=torch.float64)
    return torch.tensor(positions, dtype=torch.float64).view(-1, 1) * base ** (-2.0 * i / dim)


def _rotate(x: torch.Tensor, angles: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """x [s, ..., d] float64 rotated on its first 2 * angles.shape[-1] channels; angles [s, n]."""
    n = angles.shape[-1]
    head, rest = x[..., : 2 * n], x[..., 2 * n :]
    if interleaved:
        z = torch.complex(head[..., 0::2], head[..., 1::2])
    else:
        z = torch.complex(head[..., :n], head[..., n:])
    shape = (angles.shape[0],) + (1,) * (x.dim() - 2) + (n,)
    z = z * torch.polar(torch.ones_like(angles), angles).view(shape)
    if interleaved:
        out = torch.stack((z.real, z.imag), dim=-1).reshape(head.shape)
    else:
        out = torch.cat((z.real, z.imag), dim=-1)
    return torch.cat((out, rest), dim=-1)


def _emb_angles(emb: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """The distinct angles of a [s, 1, 1, d] embedding (checked to repeat as TE lays them out)."""
    e = emb[:, 0, 0].double()
    if interleaved:
        a = e[:, 0::2]
        assert torch.equal(e[:, 1::2], a)
    else:
        a = e[:, : e.shape[-1] // 2]
        assert torch.equal(e[:, e.shape[-1] // 2 :], a)
    return a


@pytest.mark.parametrize("interleaved", [False, True])
def test_angles_are_positions_times_inverse_frequencies(interleaved: bool) -> None:
    rope = RotaryPositionEmbedding(8, rotary_base=500.0, interleaved=interleaved)
    emb = rope(5, offset=3)
    assert emb.shape == (5, 1, 1, 8) and emb.dtype == torch.float32
    torch.testing.assert_close(_emb_angles(emb, interleaved), _angles([3, 4, 5, 6, 7], 8, 500.0), rtol=1e-6, atol=0)
    assert (rope.rotary_base, rope.interleaved) == (500.0, interleaved)


@pytest.mark.parametrize(("percent", "dim"), [(0.5, 4), (1.0, 8), (1.5, 8)])
def test_rotary_percent_below_one_shrinks_the_rotated_width(percent: float, dim: int) -> None:
    emb = RotaryPositionEmbedding(8, rotary_percent=percent)(3)
    assert emb.shape == (3, 1, 1, dim)
    torch.testing.assert_close(_emb_angles(emb, False), _angles([0, 1, 2], dim), rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    ("pretrained", "factor", "max_seq_len", "scale"),
    [
        (None, 2, 6, 1.0),  # interpolation needs both arguments
        (4, None, 6, 1.0),
        (4, 2, 6, 0.5),  # within pretrained * factor: positions / factor
        (4, 2, 8, 0.5),  # at the bound still fixed
        (4, 2, 10, 0.4),  # beyond: positions * pretrained / max_seq_len
    ],
)
def test_position_interpolation_is_tes(pretrained, factor, max_seq_len: int, scale: float) -> None:
    rope = RotaryPositionEmbedding(
        8, seq_len_interpolation_factor=factor, pretrained_max_position_embeddings=pretrained
    )
    assert (rope.pretrained_max_position_embeddings, rope.seq_len_interpolation_factor) == (pretrained, factor)
    got = _emb_angles(rope(max_seq_len), False)
    torch.testing.assert_close(got, _angles([p * scale for p in range(max_seq_len)], 8), rtol=1e-6, atol=0)


def test_angles_stay_float32_on_the_modules_device_whatever_the_defaults() -> None:
    """Autocast off (TE: "sensitive to the use of mixed precision"), the module's dtype and device, not the
    process defaults."""
    rope = RotaryPositionEmbedding(8)
    want = rope(6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(rope(6), want)
    with torch.device("meta"):
        got = rope(6)
    assert got.device.type == "cpu" and torch.equal(got, want)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        r64 = RotaryPositionEmbedding(8)
        assert r64.inv_freq.dtype == torch.float32 and r64(6).dtype == torch.float32
        assert torch.equal(r64(6), want)
        interp = RotaryPositionEmbedding(8, seq_len_interpolation_factor=2, pretrained_max_position_embeddings=4)
        assert interp(6).dtype == torch.float32  # scaled positions stay in the angles' dtype
    finally:
        torch.set_default_dtype(old)


@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_apply_rotates_each_pair_and_passes_the_rest(fmt: str, interleaved: bool) -> None:
    s, b, h, d = 5, 2, 3, 10
    g = torch.Generator().manual_seed(1)
    t = torch.randn(s, b, h, d, generator=g, dtype=torch.float64)
    emb = RotaryPositionEmbedding(6, interleaved=interleaved)(7)  # more positions than needed, 6 of 10 channels
    x = t if fmt == "sbhd" else t.transpose(0, 1)
    got = apply_rotary_pos_emb(x, emb, tensor_format=fmt, interleaved=interleaved)
    got = got if fmt == "sbhd" else got.transpose(0, 1)
    want = _rotate(t, _emb_angles(emb, interleaved)[:s], interleaved)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert torch.equal(got[..., 6:], t[..., 6:])


def test_apply_with_start_positions_offsets_each_sequence() -> None:
    s, b, h, d = 3, 2, 1, 4
    t = torch.randn(b, s, h, d, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    emb = RotaryPositionEmbedding(d)(7)  # the last sequence ends exactly at the last position
    got = apply_rotary_pos_emb(t, emb, tensor_format="bshd", start_positions=torch.tensor([0, 4]))
    for n, start in enumerate((0, 4)):
        want = _rotate(t[n], _angles(list(range(start, start + s)), d), False)
        torch.testing.assert_close(got[n], want, rtol=1e-6, atol=1e-6)


def test_apply_defaults_to_sbhd() -> None:
    t = torch.randn(4, 2, 1, 4, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    emb = RotaryPositionEmbedding(4)(4)
    torch.testing.assert_close(apply_rotary_pos_emb(t, emb), _rotate(t, _emb_angles(emb, False), False))


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("starts", [None, [2, 0]])
def test_apply_thd_rotates_each_packed_sequence_from_its_start(interleaved: bool, starts) -> None:
    h, d = 2, 4
    cu = torch.tensor([0, 3, 5], dtype=torch.int32)
    t = torch.randn(5, h, d, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    emb = RotaryPositionEmbedding(d, interleaved=interleaved)(8)
    got = apply_rotary_pos_emb(
        t,
        emb,
        tensor_format="thd",
        cu_seqlens=cu,
        interleaved=interleaved,
        start_positions=None if starts is None else torch.tensor(starts),
    )
    for i, (a, b) in enumerate(((0, 3), (3, 5))):
        start = 0 if starts is None else starts[i]
        want = _rotate(t[a:b], _angles(list(range(start, start + b - a)), d), interleaved)
        torch.testing.assert_close(got[a:b], want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("kw", "exc", "message"),
    [
        (dict(tensor_format="sbdh"), ValueError, "Unsupported tensor_format: sbdh."),
        (dict(tensor_format="thd"), AssertionError, "cu_seqlens must not be None when tensor_format is 'thd'."),
        (dict(cp_size=2), NotImplementedError, "fp8sim does not emulate context parallelism (cp_size > 1)"),
        (dict(width=6), ValueError, "freqs has 6 rotary channels, more than the tensor's 4"),
        (dict(start_positions=torch.tensor([0, 6])), AssertionError,
         "Rotary Embeddings only suppported up to 8 sequence length!"),
        (dict(length=3), AssertionError, "Rotary Embeddings only suppported up to 3 sequence length!"),
    ],
)  # fmt: skip
def test_apply_refusals_have_tes_messages(kw: dict, exc: type, message: str) -> None:
    """TE's words where TE has the check (rope.py at d0067d0, line 451: the typo "suppported" included)."""
    import re

    emb = RotaryPositionEmbedding(kw.pop("width", 4))(kw.pop("length", 8))
    t = torch.randn(4, 2, 1, 4)
    with pytest.raises(exc, match="^" + re.escape(message) + "$"):
        apply_rotary_pos_emb(t, emb, **kw)
