"""``fp8sim run --scaled-mm NAME``'s option parser (``fp8sim.gemm.emulate.split_scaled_mm_option``), in process:
the argv left for the script and the start-up line, which, run, routes ``torch._scaled_mm`` to the named
accumulator or profile.  tests/test_gemm_emulate.py runs the whole command in a subprocess."""

from __future__ import annotations

import pytest

from fp8sim.gemm.emulate import split_scaled_mm_option
from fp8sim.testing.oracles import require

torch = require("torch")

H100 = "h100_pcie_cublaslt_12_8"


def _started(line: str) -> dict:
    """Run the start-up line as ``fp8sim run``'s sitecustomize does; what it patched, then torch restored."""
    saved = torch._scaled_mm, getattr(torch.nn.functional, "scaled_mm", None)
    try:
        exec(line, {})  # noqa: S102 - the line is this module's own output, as sitecustomize runs it
        return dict(torch._scaled_mm.__fp8sim_emulation__)
    finally:
        torch._scaled_mm = saved[0]
        if saved[1] is not None:
            torch.nn.functional.scaled_mm = saved[1]


@pytest.mark.parametrize(
    ("argv", "rest", "settings"),
    [
        (["--scaled-mm", "hopper_fast", "x.py", "--steps", "3"], ["x.py", "--steps", "3"],
         {"accumulator": "hopper_fast", "profile": None, "device": "hopper"}),
        (["--scaled-mm=ada_split", "-m", "mod"], ["-m", "mod"],
         {"accumulator": "ada_split", "profile": None, "device": "hopper"}),
        (["--scaled-mm", H100, "x.py"], ["x.py"], {"accumulator": None, "profile": H100, "device": "hopper"}),
        (["--scaled-mm=" + H100], [], {"accumulator": None, "profile": H100, "device": "hopper"}),
    ],
)  # fmt: skip
def test_the_option_is_taken_off_and_its_line_starts_the_emulation(argv: list, rest: list, settings: dict) -> None:
    before = torch._scaled_mm
    left, line = split_scaled_mm_option(list(argv))
    assert left == rest
    assert torch._scaled_mm is before  # parsing patches nothing; the line does, in the script's process
    assert _started(line) == settings
    assert torch._scaled_mm is before


@pytest.mark.parametrize("argv", [[], ["x.py"], ["x.py", "--scaled-mm", "hopper_fast"], ["--scaled-mmx", "a"]])
def test_without_a_leading_option_argv_is_untouched(argv: list) -> None:
    assert split_scaled_mm_option(list(argv)) == (argv, None)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--scaled-mm"], "--scaled-mm needs an accumulator or profile name (e.g. hopper_fast)"),
        (["--scaled-mm", "nope", "x.py"], "unknown accumulator 'nope'; known: exact"),
        (["--scaled-mm=h100=x"], "unknown accumulator 'h100=x'"),
        (["--scaled-mm="], "unknown accumulator ''"),
    ],
)
def test_a_missing_or_unknown_name_is_refused_naming_the_known_ones(argv: list, message: str) -> None:
    with pytest.raises(ValueError) as err:
        split_scaled_mm_option(argv)
    assert str(err.value).startswith(message)
