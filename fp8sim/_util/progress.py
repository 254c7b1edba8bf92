"""A one-line progress bar on stderr (no dependency), drawn only when stderr is a terminal."""

from __future__ import annotations

import sys
import time


def _is_tty(stream: object) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (ValueError, OSError):  # a closed or detached stream
        return False


class Progress:
    """``step(label)`` advances by one of ``total``; silent when ``enabled`` is False or stderr is
    not a terminal (a log file or CI output gets no carriage-return bars)."""

    def __init__(self, total: int, enabled: bool = True, prefix: str = "") -> None:
        self.total, self.done, self.prefix = total, 0, prefix
        self.enabled = enabled and _is_tty(sys.stderr)
        self.t0 = time.monotonic()

    def step(self, label: str = "") -> None:
        self.done += 1
        if not self.enabled:
            return
        frac = self.done / max(self.total, 1)
        bar = "#" * int(frac * 30)
        eta = (time.monotonic() - self.t0) / frac * (1 - frac) if frac else 0.0
        sys.stderr.write(f"\r{self.prefix}[{bar:<30}] {self.done}/{self.total} {label[:40]:<40} eta {eta:5.0f}s")
        sys.stderr.flush()
        if self.done >= self.total:
            sys.stderr.write("\n")
