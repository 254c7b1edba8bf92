"""Point unchanged ``torch._scaled_mm`` code at an emulated accumulator.

``with emulate_scaled_mm(accumulator="hopper_fast"):`` (or ``@emulate_scaled_mm(profile=...)``)
routes every ``torch._scaled_mm`` call, and ``torch.nn.functional.scaled_mm`` where the installed
torch has it, to :func:`fp8sim.gemm.scaled_mm`, on any device (the result comes back on the
operands' device, in the dtype torch would return).  Nothing else is patched: autograd Functions
whose forward calls ``_scaled_mm`` keep their backward, and parameters keep their gradients.
``fp8sim run --scaled-mm NAME script.py`` does the same for a whole script.

Calls compiled by ``torch.compile`` reach ``aten._scaled_mm`` without the Python attribute and are
not intercepted.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from .profiles import PROFILES, DeviceProfile
from .scaled_mm import scaled_mm

__all__ = ["emulate_scaled_mm", "split_scaled_mm_option"]

_lock = threading.RLock()


def _f_scaled_mm(settings: dict[str, Any]) -> Any:
    """A stand-in for ``torch.nn.functional.scaled_mm`` (torch >= 2.9) for unswizzled single-level scales."""

    def f_scaled_mm(
        mat_a: Any,
        mat_b: Any,
        scale_a: Any,
        scale_recipe_a: Any,
        scale_b: Any,
        scale_recipe_b: Any,
        swizzle_a: Any = None,
        swizzle_b: Any = None,
        bias: Any = None,
        output_dtype: Any = "bfloat16",
        contraction_dim: Any = (),
        use_fast_accum: bool = False,
    ) -> Any:
        import torch

        def single(x: Any, what: str) -> Any:
            if isinstance(x, list | tuple):
                if len(x) != 1:
                    raise NotImplementedError(
                        f"emulate_scaled_mm: multi-level {what} ({len(x)} entries) is not emulated"
                    )
                return x[0]
            return x

        for sw in (swizzle_a, swizzle_b):
            sw = single(sw, "swizzle")
            if sw is not None and getattr(sw, "name", str(sw)) != "NO_SWIZZLE":
                raise NotImplementedError(
                    f"emulate_scaled_mm: swizzled scales ({sw}) are not emulated; pass them unswizzled"
                )
        if tuple(contraction_dim):
            raise NotImplementedError("emulate_scaled_mm: contraction_dim is not emulated")
        single(scale_recipe_a, "scale_recipe_a")
        single(scale_recipe_b, "scale_recipe_b")
        out = torch.bfloat16 if output_dtype == "bfloat16" else output_dtype
        return scaled_mm(
            mat_a, mat_b, single(scale_a, "scale_a"), single(scale_b, "scale_b"), bias, None, out, use_fast_accum,
            **settings,
        )  # fmt: skip

    return f_scaled_mm


class emulate_scaled_mm(contextlib.ContextDecorator):  # noqa: N801 - reads like torch's context managers
    """Context manager and decorator: ``torch._scaled_mm`` (and ``torch.nn.functional.scaled_mm``)
    run as fp8sim's :func:`~fp8sim.gemm.scaled_mm` with ``accumulator`` and/or ``profile`` (a
    :mod:`fp8sim.gemm.profiles` name or record); neither given: the accumulator follows
    ``use_fast_accum`` on ``device`` ("hopper", as :func:`scaled_mm`).  Nests; restores on exit."""

    def __init__(
        self, accumulator: Any = None, profile: str | DeviceProfile | None = None, device: str = "hopper"
    ) -> None:
        if profile is not None:
            from .profiles import get_profile

            get_profile(profile)  # fail here, not at the first call
        if accumulator is not None:
            from .accumulators import get_accumulator

            get_accumulator(accumulator)
        self.settings: dict[str, Any] = {"accumulator": accumulator, "profile": profile, "device": device}
        self._saved: list[tuple[Any, Any]] = []

    def _scaled_mm(self) -> Any:
        settings = self.settings

        def _scaled_mm(
            self_: Any,
            mat2: Any,
            scale_a: Any,
            scale_b: Any,
            bias: Any = None,
            scale_result: Any = None,
            out_dtype: Any = None,
            use_fast_accum: bool = False,
            *,
            out: Any = None,
        ) -> Any:
            y = scaled_mm(self_, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum, **settings)
            if out is None:
                return y
            return out.copy_(y)

        _scaled_mm.__fp8sim_emulation__ = dict(settings)  # type: ignore[attr-defined]
        return _scaled_mm

    def start(self) -> emulate_scaled_mm:
        """Patch until :meth:`stop` (what ``with`` does on entry)."""
        import torch

        with _lock:
            saved = [(torch, torch._scaled_mm)]
            torch._scaled_mm = self._scaled_mm()
            if hasattr(torch.nn.functional, "scaled_mm"):
                saved.append((torch.nn.functional, torch.nn.functional.scaled_mm))
                torch.nn.functional.scaled_mm = _f_scaled_mm(self.settings)
            self._saved.append(saved)
        return self

    def stop(self) -> None:
        with _lock:
            for mod, fn in self._saved.pop():
                setattr(mod, "_scaled_mm" if mod.__name__ == "torch" else "scaled_mm", fn)

    def __enter__(self) -> emulate_scaled_mm:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def split_scaled_mm_option(argv: list[str]) -> tuple[list[str], str | None]:
    """``fp8sim run``'s leading ``--scaled-mm NAME`` (NAME: an accumulator or a profile): the
    remaining argv and the start-up line that turns the emulation on (None without the option)."""
    name = None
    if argv[:1] == ["--scaled-mm"]:
        if len(argv) < 2:
            raise ValueError("--scaled-mm needs an accumulator or profile name (e.g. hopper_fast)")
        name, argv = argv[1], argv[2:]
    elif argv[:1] and argv[0].startswith("--scaled-mm="):
        name, argv = argv[0].split("=", 1)[1], argv[1:]
    if name is None:
        return argv, None
    kind = "profile" if name in PROFILES else "accumulator"
    emulate_scaled_mm(**{kind: name})  # validates the name now, with the known names in the message
    return argv, f"import fp8sim.gemm.emulate as _e\n_e.emulate_scaled_mm({kind}={name!r}).start()\n"
