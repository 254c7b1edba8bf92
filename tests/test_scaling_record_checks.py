"""``check_padding`` (a block larger than its dimension may zero-pad up to ``MAX_PADDED_ELEMENTS``), the old
record name's warning, and the swizzle helpers' argument messages: exact messages and boundaries by hand."""

from __future__ import annotations

import numpy as np
import pytest

import fp8sim.scaling.quantized as quantized
from fp8sim.scaling.quantized import MAX_PADDED_ELEMENTS, QuantizedData, check_padding
from fp8sim.scaling.swizzle import from_blocked, to_blocked


def test_check_padding_allows_up_to_the_limit_and_names_the_first_oversized_block() -> None:
    assert MAX_PADDED_ELEMENTS == 1 << 24
    check_padding((3, 10), (1, 1 << 20))  # 3 * 2^20 padded elements
    check_padding((16, 10), (1, 1 << 20))  # exactly 2^24
    check_padding((4, 1 << 23), (4, 1 << 23))  # blocks equal to their dims pad nothing
    msg = (
        "block_size 8388608 is larger than dimension 1 of the input (shape (4, 10)): zero-padding to whole blocks "
        "would make 33554432 elements; a block larger than its dimension may pad up to 16777216 elements "
        "(use a block_size of at most 10)"
    )
    with pytest.raises(ValueError) as err:
        check_padding((4, 10), (4, 1 << 23))
    assert str(err.value) == msg
    with pytest.raises(ValueError, match=r"^tile 1125899906842624 is larger than dimension 1 .*would make "
                       + str(2**90)):  # fmt: skip
        check_padding((2**40, 3), (1, 2**50), arg="tile")
    with pytest.raises(ValueError, match=r"^block_size 33554432 is larger than dimension 0 .*would make 33554432 "):
        check_padding((10,), (1 << 25,))  # one dim: an odd number of factors
    with pytest.raises(ValueError, match="zip"):
        check_padding((2, 3), (1,))


def test_old_record_name_in_quantized_warns_with_the_whole_message() -> None:
    with pytest.warns(DeprecationWarning) as rec:
        assert quantized.QuantizedTensor is QuantizedData
    assert str(rec[0].message) == (
        "fp8sim.scaling.quantized.QuantizedTensor is now fp8sim.scaling.quantized.QuantizedData (TE's "
        "QuantizedTensor is the torch class fp8sim.pytorch.tensor.QuantizedTensor); the old name will be removed"
    )
    with pytest.raises(AttributeError, match="module 'fp8sim.scaling.quantized' has no attribute 'nope'"):
        quantized.nope  # noqa: B018


def test_swizzle_helpers_name_their_arguments() -> None:
    with pytest.raises(ValueError, match=r"^scales is not a rectangular array of numbers"):
        to_blocked([[1], [1, 2]])
    with pytest.raises(ValueError, match=r"^blocked is not a rectangular array of numbers"):
        from_blocked([[1], [1, 2]], 1, 1)
    with pytest.raises(ValueError, match=r"^cols must be an int >= 0, got -1$"):
        from_blocked(np.zeros(512, np.uint8), 1, -1)
    with pytest.raises(TypeError, match=r"^cols must be an int, got str 'a'$"):
        from_blocked(np.zeros(512, np.uint8), 1, "a")


def test_old_record_name_warning_points_at_the_caller() -> None:
    if hasattr(quantized, "_mutmut_mutated"):  # mutmut's trampoline adds a frame: judged on plain source
        pytest.skip("stacklevel under mutmut")
    with pytest.warns(DeprecationWarning) as rec:
        quantized.QuantizedTensor  # noqa: B018
    assert rec[0].filename == __file__
