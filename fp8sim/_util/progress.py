"""Progress bars on stderr: tqdm's, drawn only when stderr is a terminal (a log file or CI output gets
none) and tqdm is installed (``pip install 'fp8sim[progress]'``; ``import fp8sim`` does not need it)."""

from __future__ import annotations

import sys
from typing import Any


def _is_tty(stream: object) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (ValueError, OSError):  # a closed or detached stream
        return False


class Progress:
    """``step(label)`` advances by one of ``total``; silent when ``enabled`` is False, stderr is not a
    terminal or tqdm is missing."""

    def __init__(self, total: int, enabled: bool = True, prefix: str = "") -> None:
        self.total, self.done = total, 0
        self._bar: Any = None
        if enabled and _is_tty(sys.stderr):
            try:
                from tqdm import tqdm
            except ImportError:  # optional: a bar is no reason to fail a run
                return
            self._bar = tqdm(total=total, desc=prefix.strip() or None, file=sys.stderr, dynamic_ncols=True)

    @property
    def enabled(self) -> bool:
        return self._bar is not None

    def step(self, label: str = "") -> None:
        self.done += 1
        if self._bar is None:
            return
        self._bar.set_postfix_str(label[:40], refresh=False)
        self._bar.update(1)
        if self.done >= self.total:
            self._bar.close()
