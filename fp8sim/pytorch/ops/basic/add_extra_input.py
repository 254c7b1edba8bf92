"""``AddExtraInput``: add an extra input tensor (TE 2.20.0.dev0 ``ops/basic/add_extra_input.py``);
``in_place=True`` adds the main input into the extra input and returns it (TE's advanced option)."""

from __future__ import annotations

from typing import Any

import torch

from ..op import BasicOperation

__all__ = ["AddExtraInput"]


class AddExtraInput(BasicOperation):
    """``y = x + extra``; the gradient reaches both."""

    num_extra_inputs = 1

    def __init__(self, *, in_place: bool = False) -> None:
        super().__init__()
        self._in_place = in_place

    def op_forward(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(_overrides(self, "forward"))

    def op_backward(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(_overrides(self, "backward"))

    def fuser_forward(
        self, basic_op_ctxs: list, input_: torch.Tensor, *, basic_op_extra_inputs: list, **unused: Any
    ) -> tuple[torch.Tensor, list]:
        extra = basic_op_extra_inputs[0][0]
        if self._in_place:
            extra = extra.detach()
            extra += input_
            return extra, [()]
        return extra + input_, [()]

    def fuser_backward(
        self, basic_op_ctxs: list, grad_output: torch.Tensor, *, basic_op_grad_extra_outputs: list
    ) -> tuple[torch.Tensor, list, list]:
        return grad_output, [()], [(grad_output,)]


def _overrides(op: BasicOperation, which: str) -> str:
    return (
        "{self.__class__.__name__} operation has "
        f"{op.num_extra_inputs} extra tensor inputs and {op.num_extra_outputs} extra tensor outputs. "
        f"It overrides `fuser_{which}` instead of `op_{which}`."
    )
