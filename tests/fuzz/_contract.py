"""The contract every fuzzed call keeps, and the argument pools the fuzzers draw from.

A call gets valid arguments except at most one, drawn from that argument's pool of invalid values
(each value in a pool is invalid for that argument).  The contract (:func:`check_call`):

- valid arguments: no exception (the caller then compares the result with its oracle);
- one invalid argument: a TypeError or ValueError (or an exception type the API documents) whose
  message names the argument (or one of its aliases), never silently a result;
- never another exception type, never MemoryError, never longer than :data:`CALL_SECONDS`;
- the inputs are never mutated.

Sizes: the default profile draws ``FP8SIM_FUZZ_EXAMPLES`` (default 20) examples per fuzzer, small
enough for every test run; ``FP8SIM_FUZZ=large`` draws 2000 (README: "Fuzzing").
"""

from __future__ import annotations

import copy
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

LARGE = os.environ.get("FP8SIM_FUZZ", "").lower() == "large"
EXAMPLES = int(os.environ.get("FP8SIM_FUZZ_EXAMPLES", "0")) or (2000 if LARGE else 20)
CALL_SECONDS = 60  # a call on these bounded inputs that runs longer hangs

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)

LISTS_ALLOWED = ("; known: ", "allowed: ")  # a message listing the allowed values also tells the user what to pass
OBJ = object()
# pools of invalid values, by the kind of argument they are invalid for
BOOL_BAD = ["yes", "", 1, 0, 1.5, None, [], np.ones(2), OBJ]
BOOL_OR_NONE_BAD = ["yes", 1, 0, 1.5, [], np.ones(2), OBJ]
INT_BAD = [True, False, 1.5, 2.0, "3", None, [], np.ones(2), np.float32(2.0), OBJ, 1 + 2j]
STR_BAD = ["nope", "", 3, None, [], {}, np.ones(2), OBJ]
REAL_BAD = ["x", None, [], np.ones(3), OBJ, 1 + 2j, True]
ARRAY_BAD = [None, "x", [[1.0], [1.0, 2.0]], np.array(["a", "b"]), np.ones(3, np.complex64), OBJ, {}, True]
CODES_BAD = [None, "x", [[1], [1, 2]], np.array([0.5, 1.5]), np.array([-1, 3]), np.array([1000]), OBJ, True]


@dataclass
class Call:
    """One fuzzed call: the function, its keyword arguments, and which one (if any) is invalid."""

    fn: Callable[..., Any]
    kwargs: dict[str, Any]
    bad: str | None = None
    aliases: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def names(self) -> tuple[str, ...]:
        """What a refusal's message may name: the bad argument, its aliases and, for a refusal of a
        combination, any argument of the call."""
        if self.bad is None:
            return ()
        return (self.bad, *self.aliases.get(self.bad, ()))


def one_bad(
    draw: Any, valid: dict[str, Any], pools: dict[str, list[Any]], p_bad: float = 0.7
) -> tuple[dict, str | None]:
    """``valid`` keyword arguments with, most of the time, one of them replaced by a value from its pool."""
    kwargs = dict(valid)
    if not pools or not draw(st.floats(0, 1)) < p_bad:
        return kwargs, None
    arg = draw(st.sampled_from(sorted(pools)))
    kwargs[arg] = draw(st.sampled_from(pools[arg]))
    return kwargs, arg


def _snapshot(v: Any) -> Any:
    if type(v).__module__.startswith("torch"):
        return v.detach().clone() if hasattr(v, "detach") else v
    if isinstance(v, np.ndarray):
        return v.copy()
    try:
        return copy.deepcopy(v)
    except Exception:  # noqa: BLE001 - not copyable: not compared
        return v


def _same(a: Any, b: Any) -> bool:
    if type(a).__module__.startswith("torch") and hasattr(a, "dtype"):
        import torch

        def raw(t: Any) -> Any:  # bit patterns: NaN equals itself
            return t.detach().cpu().clone().reshape(-1).view(torch.uint8)

        same_kind = a.dtype == b.dtype and a.shape == b.shape
        return same_kind and (a.numel() == 0 or torch.equal(raw(a), raw(b)))
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if not isinstance(a, (int, float, complex, str, bytes, type(None))):
        return True  # an opaque object: nothing fp8sim could have changed in it
    return a == b or (a != a and b != b)


@contextmanager
def deadline(seconds: int = CALL_SECONDS) -> Iterator[None]:
    """Fail a call that runs longer than ``seconds`` (SIGALRM; main thread only, else no limit)."""
    import threading

    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGALRM"):
        yield
        return

    def hang(signum: int, frame: Any) -> None:
        raise AssertionError(f"call ran longer than {seconds} s on bounded inputs (a hang)")

    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def check_call(call: Call, documented: tuple[type[BaseException], ...] = (TypeError, ValueError)) -> tuple[bool, Any]:
    """Run ``call`` under the contract; ``(True, result)`` or ``(False, exception)``."""
    before = {k: _snapshot(v) for k, v in call.kwargs.items()}
    try:
        with deadline():
            result = call.fn(**call.kwargs)
    except MemoryError as exc:
        raise AssertionError(f"MemoryError for {_describe(call)}") from exc
    except documented as exc:
        msg = str(exc)
        assert call.bad is not None, f"valid arguments refused: {_describe(call)}: {type(exc).__name__}: {msg}"
        assert "Traceback" not in msg, msg
        named = call.names() + tuple(call.kwargs) + LISTS_ALLOWED
        assert any(n in msg for n in named), (
            f"message names no argument (wanted {call.bad!r}): {_describe(call)}: {type(exc).__name__}: {msg}"
        )
        outcome: tuple[bool, Any] = (False, exc)
    except AssertionError:
        raise
    except Exception as exc:
        raise AssertionError(f"undocumented {type(exc).__name__} for {_describe(call)}: {exc}") from exc
    else:
        assert call.bad is None, (
            f"invalid {call.bad}={call.kwargs[call.bad]!r:.80} silently accepted: {_describe(call)}"
        )
        outcome = (True, result)
    for k, v in call.kwargs.items():
        assert _same(v, before[k]), f"argument {k} was mutated by {_describe(call)}"
    return outcome


def _describe(call: Call) -> str:
    parts = []
    for k, v in call.kwargs.items():
        r = (
            f"array{getattr(v, 'shape', '')}:{getattr(v, 'dtype', '')}"
            if hasattr(v, "shape") and np.size(v) > 4
            else repr(v)
        )
        parts.append(f"{k}={r[:60]}")
    return f"{getattr(call.fn, '__name__', call.fn)}({', '.join(parts)})"
