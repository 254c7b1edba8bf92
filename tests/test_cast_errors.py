"""Input validation and result kinds of the public cast API (fp8sim.cast docstrings, style.md
"Errors a user can act on").

- unknown format or rounding name -> ValueError that lists the allowed names;
- seed with a non-stochastic mode -> ValueError; a bad seed -> TypeError / ValueError;
- integer, bool, complex or object input -> TypeError;
- decode: codes out of range -> ValueError; non-integer codes -> TypeError;
- result kind: Python float -> int code / float value; numpy scalar -> numpy scalar; numpy array
  (0-d and empty included) -> array of the same shape; torch tensor -> tensor of the same shape on
  the same device, uint8 codes and float32 values.
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
from conftest import ALL_MODES, FORMAT_NAMES

import fp8sim
from fp8sim.testing.oracles import require


def test_rounding_modes_are_the_six_named_in_the_spec():
    assert tuple(fp8sim.ROUNDING_MODES) == ALL_MODES


def test_registry_holds_the_nine_spec_formats():
    want = {"e4m3", "e5m2", "e8m0", "ue5m3", "e4m3fnuz", "e5m2fnuz", "e2m1", "e2m3", "e3m2"}
    assert set(fp8sim.FORMATS) == want


# -- names --------------------------------------------------------------------------------------------

_KNOWN_FORMATS = re.escape(", ".join(FORMAT_NAMES))


@pytest.mark.parametrize("call", ["encode", "quantize", "decode"])
@pytest.mark.parametrize("bad", ["e4m4", "fp8", "", "float8_e4m3"])
def test_unknown_format_name_raises_value_error_listing_known_names(call, bad):
    arg = np.uint8(1) if call == "decode" else np.float32(1.0)
    with pytest.raises(ValueError, match=rf"unknown format '{re.escape(bad)}'.*{_KNOWN_FORMATS}"):
        getattr(fp8sim, call)(arg, bad)


@pytest.mark.parametrize("alias", ["float8_e4m3fn", "E4M3", "e4m3fn"])
def test_format_aliases_resolve(alias):
    assert fp8sim.encode(np.float32(1.0), alias) == fp8sim.encode(np.float32(1.0), "e4m3") == 0x38


@pytest.mark.parametrize("call", ["encode", "quantize"])
@pytest.mark.parametrize("bad", ["nearest", "rne", "stochastic_fast", "", "UP"])
def test_unknown_rounding_raises_value_error_listing_modes(call, bad):
    with pytest.raises(ValueError, match=rf"unknown rounding '{re.escape(bad)}'.*{re.escape(', '.join(ALL_MODES))}"):
        getattr(fp8sim, call)(np.float32(1.0), "e4m3", rounding=bad)


@pytest.mark.parametrize("rounding", [m for m in ALL_MODES if m != "stochastic"])
def test_seed_with_a_deterministic_mode_raises_value_error(rounding):
    with pytest.raises(ValueError, match="stochastic"):
        fp8sim.encode(np.float32(1.0), "e4m3", rounding=rounding, seed=1)


def test_bad_seeds():
    x = np.float32(1.1)
    with pytest.raises(ValueError, match="seed"):
        fp8sim.encode(x, "e4m3", rounding="stochastic", seed=-1)
    with pytest.raises(ValueError, match="seed"):
        fp8sim.encode(x, "e4m3", rounding="stochastic", seed=2**64)
    for bad in (1.5, "1", True):
        with pytest.raises(TypeError, match="seed"):
            fp8sim.encode(x, "e4m3", rounding="stochastic", seed=bad)
    # numpy integers and the largest seed are accepted
    fp8sim.encode(x, "e4m3", rounding="stochastic", seed=np.int64(3))
    fp8sim.encode(x, "e4m3", rounding="stochastic", seed=2**64 - 1)


@pytest.mark.parametrize("bad", [1, None, "yes", np.float32(1)], ids=repr)
def test_non_bool_saturate_raises_type_error(bad):
    with pytest.raises(TypeError, match="saturate"):
        fp8sim.encode(np.float32(1.0), "e4m3", saturate=bad)


def test_stochastic_without_seed_still_picks_a_neighbour():
    x = np.full(1000, 1.05, np.float32)
    q = fp8sim.quantize(x, "e4m3", rounding="stochastic")
    assert set(np.unique(q)) <= {np.float32(1.0), np.float32(1.125)}


# -- input types -----------------------------------------------------------------------------------

_BAD_NUMPY = [
    np.array([1, 2], np.int32),
    np.array([1, 2], np.uint8),
    np.array([True]),
    np.array([1 + 2j]),
    np.array([1.0], object),
    np.int64(3),
    np.bool_(True),
    np.complex64(1),
]


@pytest.mark.parametrize("call", ["encode", "quantize"])
@pytest.mark.parametrize(
    "bad",
    [1, True, 1j, None, "1.0", object(), *_BAD_NUMPY],
    ids=lambda v: f"{type(v).__name__}-{getattr(v, 'dtype', '')}",
)
def test_non_float_input_raises_type_error(call, bad):
    with pytest.raises(TypeError):
        getattr(fp8sim, call)(bad, "e4m3")


@pytest.mark.parametrize("call", ["encode", "quantize"])
@pytest.mark.parametrize("dtype", ["int32", "int64", "uint8", "bool", "complex64"])
def test_non_float_tensor_raises_type_error(call, dtype):
    torch = require("torch")
    x = torch.zeros(3, dtype=getattr(torch, dtype))
    with pytest.raises(TypeError, match="floating"):
        getattr(fp8sim, call)(x, "e4m3")


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_decode_out_of_range_codes_raise_value_error(fmt):
    f = fp8sim.get_format(fmt)
    for bad in (f.num_codes, -1):
        with pytest.raises(ValueError, match="out of range"):
            fp8sim.decode(bad, f)
        with pytest.raises(ValueError, match="out of range"):
            fp8sim.decode(np.array([0, bad], np.int64), f)
    if f.num_codes < 256:  # 4- and 6-bit formats: a full byte is out of range
        with pytest.raises(ValueError, match="out of range"):
            fp8sim.decode(np.array([f.num_codes], np.uint8), f)
    torch = require("torch")
    with pytest.raises(ValueError, match="out of range"):
        fp8sim.decode(torch.tensor([0, f.num_codes]), f)
    with pytest.raises(ValueError, match="out of range"):
        fp8sim.decode(torch.tensor([-1]), f)


@pytest.mark.parametrize(
    "bad",
    [1.0, True, np.array([1.0]), np.array([True]), np.float32(2), None, "3"],
    ids=lambda v: f"{type(v).__name__}-{getattr(v, 'dtype', '')}",
)
def test_decode_non_integer_codes_raise_type_error(bad):
    with pytest.raises(TypeError):
        fp8sim.decode(bad, "e4m3")


@pytest.mark.parametrize("dtype", ["float32", "bool", "float16"])
def test_decode_non_integer_tensor_raises_type_error(dtype):
    torch = require("torch")
    with pytest.raises(TypeError):
        fp8sim.decode(torch.zeros(2, dtype=getattr(torch, dtype)), "e4m3")


# -- result kinds and shapes -----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_python_float_gives_int_code_and_float_value(fmt):
    code = fp8sim.encode(1.0, fmt)
    assert type(code) is int
    value = fp8sim.quantize(1.0, fmt)
    assert type(value) is float and value == 1.0
    assert type(fp8sim.decode(code, fmt)) is float


@pytest.mark.parametrize(
    "scalar",
    [np.float16(1.0), np.float32(1.0), np.float64(1.0), ml_dtypes.bfloat16(1.0)],
    ids=lambda v: type(v).__name__,
)
def test_numpy_scalar_gives_numpy_scalar(scalar):
    """np.float64 is a subclass of Python float, but it is a numpy scalar: it must not be taken for
    a Python float (which gives int / float results)."""
    code = fp8sim.encode(scalar, "e4m3")
    assert isinstance(code, np.uint8) and code == 0x38
    value = fp8sim.quantize(scalar, "e4m3")
    assert isinstance(value, np.float32) and value == 1.0
    decoded = fp8sim.decode(np.uint8(0x38), "e4m3")
    assert isinstance(decoded, np.float32) and decoded == 1.0


_DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64]


@pytest.mark.parametrize("dtype", _DTYPES, ids=lambda d: d.__name__)
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_encode_of_zero_d_array_is_zero_d_uint8_array(fmt, dtype):
    code = fp8sim.encode(np.array(1.0, dtype), fmt)
    assert isinstance(code, np.ndarray) and code.shape == () and code.dtype == np.uint8


@pytest.mark.parametrize("dtype", _DTYPES, ids=lambda d: d.__name__)
def test_quantize_of_zero_d_array_is_zero_d_float32_array(dtype):
    value = fp8sim.quantize(np.array(1.0, dtype), "e4m3")
    assert isinstance(value, np.ndarray), f"quantize of a 0-d array gave {type(value).__name__}, not a 0-d ndarray"
    assert value.shape == () and value.dtype == np.float32 and value == 1.0


def test_decode_of_zero_d_array_is_zero_d_float32_array():
    decoded = fp8sim.decode(np.array(0x38, np.uint8), "e4m3")
    assert isinstance(decoded, np.ndarray), f"decode of a 0-d array gave {type(decoded).__name__}, not a 0-d ndarray"
    assert decoded.shape == () and decoded.dtype == np.float32 and decoded == 1.0


@pytest.mark.parametrize("rounding", ALL_MODES)
@pytest.mark.parametrize("shape", [(0,), (0, 3), (2, 0, 4)])
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64], ids=lambda d: d.__name__)
def test_empty_arrays_keep_their_shape(dtype, shape, rounding):
    x = np.zeros(shape, dtype)
    seed = 1 if rounding == "stochastic" else None
    code = fp8sim.encode(x, "e4m3", rounding=rounding, seed=seed)
    assert isinstance(code, np.ndarray) and code.shape == shape and code.dtype == np.uint8
    value = fp8sim.quantize(x, "e4m3", rounding=rounding, seed=seed)
    assert isinstance(value, np.ndarray) and value.shape == shape and value.dtype == np.float32
    decoded = fp8sim.decode(np.zeros(shape, np.uint8), "e4m3")
    assert decoded.shape == shape and decoded.dtype == np.float32


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_non_contiguous_arrays_are_cast_in_c_order(fmt):
    x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(4, 6)
    for view in (x.T, x[:, ::2], np.asfortranarray(x)):
        got = fp8sim.encode(view, fmt, rounding="stochastic", seed=3)
        want = fp8sim.encode(np.ascontiguousarray(view), fmt, rounding="stochastic", seed=3)
        assert got.shape == view.shape and np.array_equal(got, want)


@pytest.mark.parametrize("dtype", [">f2", ">f4", ">f8"])
def test_non_native_byte_order_float_arrays_are_float_arrays(dtype):
    """A big-endian float32 array is a float32 array: same codes as the native-order array."""
    native = np.array([1.0, 1.0625, -2.5, 300.0, np.nan, -0.0], dtype[1:])
    x = native.astype(dtype)
    for rounding in ("nearest_even", "up", "stochastic"):
        seed = 9 if rounding == "stochastic" else None
        got = fp8sim.encode(x, "e4m3", rounding=rounding, seed=seed)
        assert np.array_equal(got, fp8sim.encode(native, "e4m3", rounding=rounding, seed=seed))


@pytest.mark.parametrize("rounding", ALL_MODES)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("shape", [(), (0,), (3, 0), (2, 3)])
def test_torch_results_are_uint8_and_float32_tensors_on_the_input_device(shape, dtype, rounding):
    torch = require("torch")
    x = torch.full(shape, 1.3, dtype=getattr(torch, dtype))
    seed = 1 if rounding == "stochastic" else None
    code = fp8sim.encode(x, "e4m3", rounding=rounding, seed=seed)
    assert isinstance(code, torch.Tensor) and code.dtype == torch.uint8
    assert code.shape == x.shape and code.device == x.device
    value = fp8sim.quantize(x, "e4m3", rounding=rounding, seed=seed)
    assert isinstance(value, torch.Tensor) and value.dtype == torch.float32
    assert value.shape == x.shape and value.device == x.device
    decoded = fp8sim.decode(code, "e4m3")
    assert decoded.dtype == torch.float32 and decoded.shape == x.shape


def test_torch_input_requiring_grad_is_accepted_and_left_alone():
    torch = require("torch")
    x = torch.linspace(-2, 2, 9, requires_grad=True)
    q = fp8sim.quantize(x, "e4m3")
    assert not q.requires_grad and x.grad is None
    assert torch.equal(q, torch.from_numpy(fp8sim.quantize(x.detach().numpy(), "e4m3")))


# -- issue 29.6: every complex dtype is refused, ml_dtypes' included -------------------------------------
def _complex_inputs() -> list:
    import ml_dtypes

    z = np.array([1 + 2j, 3 - 1j])
    out = [z, z.astype(np.complex64), 1 + 2j]
    # ml_dtypes' complex types came after 0.5.0 (the oldest release pyproject.toml allows)
    out += [z.astype(getattr(ml_dtypes, n)) for n in ("complex32", "bcomplex32") if hasattr(ml_dtypes, n)]
    try:
        import warnings

        import torch

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "ComplexHalf support is experimental"
            out += [torch.tensor([1 + 2j]), torch.tensor([1 + 2j]).to(torch.complex32)]
    except ImportError:
        pass
    return out


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("z", _complex_inputs(), ids=lambda z: str(getattr(z, "dtype", type(z).__name__)))
def test_every_complex_dtype_is_refused_never_silently_made_real(z) -> None:  # noqa: ANN001
    import warnings

    from fp8sim import scaling as S

    calls = [
        lambda z: fp8sim.encode(z, "e4m3"),
        lambda z: fp8sim.quantize(z, "e5m2"),
        lambda z: fp8sim.get_convention("ml_dtypes").encode(z, "e4m3"),
        lambda z: S.quantize_current_scaling(z, "e4m3"),
        lambda z: S.quantize_block_scaling(z),
        lambda z: S.compute_scale_from_amax(z, 448.0),
        lambda z: S.torchao_amax_to_scale(z, "e4m3"),
    ]
    for call in calls:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # numpy's ComplexWarning would mean the imaginary part was dropped
            with pytest.raises(TypeError, match=r"(x|amax) must .*(real|float).*complex"):
                call(z)
