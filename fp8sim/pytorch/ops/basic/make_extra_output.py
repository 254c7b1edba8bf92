"""``MakeExtraOutput``: return the intermediate tensor as an extra output (TE 2.20.0.dev0
``ops/basic/make_extra_output.py``); ``in_place=True`` accumulates the gradient into the extra output's
gradient (the ``BackwardLinearAdd`` fusion needs it)."""

from __future__ import annotations

from typing import Any

import torch

from ..op import BasicOperation
from .add_extra_input import _overrides

__all__ = ["MakeExtraOutput"]


class MakeExtraOutput(BasicOperation):
    """Pass ``x`` on and out; the backward adds the extra output's gradient (None: zero)."""

    num_extra_outputs = 1

    def __init__(self, *, in_place: bool = False) -> None:
        super().__init__()
        self._in_place = in_place

    def op_forward(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(_overrides(self, "forward"))

    def op_backward(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(_overrides(self, "backward"))

    def fuser_forward(self, basic_op_ctxs: list, input_: torch.Tensor, **unused: Any) -> tuple[torch.Tensor, list]:
        return input_, [(input_,)]

    def fuser_backward(
        self, basic_op_ctxs: list, grad_output: torch.Tensor, *, basic_op_grad_extra_outputs: list
    ) -> tuple[torch.Tensor, list, list]:
        g = basic_op_grad_extra_outputs[0][0]
        if g is None:
            return grad_output, [()], [()]
        if self._in_place:
            g += grad_output
            return g, [()], [()]
        return g + grad_output, [()], [()]
