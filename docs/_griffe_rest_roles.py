"""A griffe extension for the docs site: fp8sim's docstrings use a few reST roles (``:func:`x```), which
Markdown would print literally; they become code spans (``~a.b.c`` shows ``c``, as Sphinx does)."""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:func|class|meth|mod|data|attr|exc|obj|const|any):`(~?)([^`]+)`")


def _plain(match: re.Match[str]) -> str:
    target = match.group(2)
    return f"`{target.rsplit('.', 1)[-1] if match.group(1) else target}`"


class ReSTRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(_plain, obj.docstring.value)
