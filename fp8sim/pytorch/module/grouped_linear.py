"""TE ``GroupedLinear`` (``transformer_engine/pytorch/module/grouped_linear.py``): ``num_gemms`` linears over
consecutive row groups of one input, the MoE experts' GEMMs.

``forward(inp, m_splits)`` splits the rows of the 2-D-flattened input into ``m_splits`` (summing to the row
count) and computes ``out_i = inp_i W_i^T + b_i`` for each split; the outputs are concatenated in order.
Parameters are ``weight0 .. weight{n-1}`` (and ``bias0 ..``), TE's names.  Inside ``autocast`` each GEMM is
quantized like a TE ``Linear`` with its own scaling state (TE keeps one FP8 meta slot set per GEMM:
delayed-scaling amax histories, current-scaling amaxes and MX/NVFP4 block scales are all per split), so
every recipe an fp8sim ``Linear`` runs works per split; a split of 0 rows contributes no rows and a zero
weight gradient.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..._util.args import as_int
from ..utils import resolve_grouped_linear_single_param_flags
from ._gemm_state import _GemmState
from ._grouped_function import grouped_linear
from ._params import resolve_params_dtype, size_arg
from .base import TransformerEngineBaseModule, get_default_init_method, init_method_constant, no_torch_dynamo

__all__ = ["GroupedLinear", "is_module_grouped_tensor_path_supported"]

_SINGLE_PARAM_REFUSED = (
    "fp8sim does not emulate GroupedLinear's single grouped parameters (single_grouped_weight / "
    "single_grouped_bias with NVTE_GROUPED_LINEAR_SINGLE_PARAM=1): TE stores them as one GroupedTensor "
    "parameter and runs them only on its native grouped-tensor GEMM path (cuBLASLt grouped GEMM with CUDA "
    "m_splits), which is not emulated; unset NVTE_GROUPED_LINEAR_SINGLE_PARAM for per-expert parameters"
)


def is_module_grouped_tensor_path_supported(recipe: Any, dtype: torch.dtype) -> bool:
    """TE (grouped_linear.py 88-150): whether GroupedLinear's native grouped-tensor path (cuBLASLt grouped
    GEMM over one GroupedTensor, CUDA ``m_splits``) can run.  fp8sim does not emulate that path, so the
    answer is False for every recipe and dtype; TE falls back to its per-split path, which fp8sim runs."""
    del recipe, dtype
    return False


class GroupedLinear(TransformerEngineBaseModule):
    """TE ``GroupedLinear(num_gemms, in_features, out_features, sequence_parallel=False,
    fuse_wgrad_accumulation=False, tp_group=None, tp_size=1, get_rng_state_tracker=None,
    rng_tracker_name=None, init_method=None, bias=True, return_bias=False, params_dtype=None,
    parallel_mode=None, device="cpu", ...)``: TE's positional order and defaults (see the module docstring).
    ``accumulator`` (fp8sim, keyword only) as for :class:`~fp8sim.pytorch.Linear`."""

    def __init__(
        self,
        num_gemms: int,
        in_features: int,
        out_features: int,
        sequence_parallel: bool = False,
        fuse_wgrad_accumulation: bool = False,
        tp_group: Any = None,
        tp_size: int = 1,
        get_rng_state_tracker: Callable | None = None,
        rng_tracker_name: str | None = None,
        init_method: Callable | None = None,
        bias: bool = True,
        return_bias: bool = False,
        params_dtype: torch.dtype | None = None,
        parallel_mode: str | None = None,
        device: torch.device | str = "cpu",
        ub_overlap_rs: bool = False,
        ub_overlap_ag: bool = False,
        ub_name: str | None = None,
        delay_wgrad_compute: bool = False,
        save_original_input: bool = False,
        single_grouped_weight: bool = False,
        single_grouped_bias: bool = False,
        name: str | None = None,
        use_grouped_tensor: bool | None = None,
        *,
        accumulator: str | None = None,
    ) -> None:
        num_gemms = as_int(num_gemms, "num_gemms", lo=1)
        in_features, out_features = size_arg(in_features, "in_features"), size_arg(out_features, "out_features")
        super().__init__(accumulator, name)
        self._init_grouped_flags(single_grouped_weight, single_grouped_bias, use_grouped_tensor)
        if ub_overlap_rs or ub_overlap_ag:
            raise NotImplementedError("GroupedLinear doesn't support Userbuffer overlap (TE's words); nor does fp8sim")
        self._init_common(
            sequence_parallel=sequence_parallel,
            fuse_wgrad_accumulation=fuse_wgrad_accumulation,
            tp_group=tp_group,
            tp_size=tp_size,
            parallel_mode=parallel_mode,
            bias=bias,
            return_bias=return_bias,
            delay_wgrad_compute=delay_wgrad_compute,
            save_original_input=save_original_input,
        )
        self.num_gemms, self.in_features, self.out_features = num_gemms, in_features, out_features
        self._gemm_names = tuple(f"gemm{i}" for i in range(num_gemms))
        self.fp8_gemms = {n: _GemmState() for n in self._gemm_names}
        dtype = resolve_params_dtype(params_dtype)
        init = init_method if init_method is not None else get_default_init_method()
        self.weight_names = [f"weight{i}" for i in range(num_gemms)]
        self.bias_names = [f"bias{i}" for i in range(num_gemms)] if bias else []
        for i in range(num_gemms):
            w = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype, device=device))
            self.register_parameter(f"weight{i}", w, init_fn=init)
            if bias:
                b = nn.Parameter(torch.empty(out_features, dtype=dtype, device=device))
                self.register_parameter(f"bias{i}", b, init_fn=init_method_constant(0.0))
        self.reset_parameters(defer_init=torch.device(device).type == "meta")

    def _init_grouped_flags(self, single_weight: bool, single_bias: bool, use_grouped: bool | None) -> None:
        """TE grouped_linear.py 1646-1689: ``use_grouped_tensor`` (None: the deprecated environment
        variable), the single-parameter flags gated by ``NVTE_GROUPED_LINEAR_SINGLE_PARAM``."""
        if use_grouped is None:
            env = os.getenv("NVTE_GROUPED_LINEAR_USE_FUSED_GROUPED_GEMM")
            if env is not None:
                warnings.warn(
                    "NVTE_GROUPED_LINEAR_USE_FUSED_GROUPED_GEMM is deprecated and will be "
                    "removed in a future release. Pass use_grouped_tensor=True or "
                    "use_grouped_tensor=False to GroupedLinear instead.",
                    FutureWarning,
                    stacklevel=3,
                )
            use_grouped = bool(int(env or "0"))
        if not isinstance(use_grouped, bool):
            raise TypeError(f"use_grouped_tensor must be a bool or None, got {type(use_grouped)}.")
        single_weight, single_bias = resolve_grouped_linear_single_param_flags(single_weight, single_bias)
        if single_weight or single_bias:
            raise NotImplementedError(_SINGLE_PARAM_REFUSED)
        # TE falls back to the per-split path for discrete parameters where the grouped path is unsupported
        self.use_grouped_tensor, self.single_grouped_weight, self.single_grouped_bias = use_grouped, False, False

    def make_grouped_weights(self, defer_init: bool = False) -> None:
        """TE: pack the per-split weights into one GroupedTensor parameter (the single-parameter path); refused
        as that path is (``defer_init=True`` returns at once, as in TE)."""
        if defer_init:
            return
        raise NotImplementedError(_SINGLE_PARAM_REFUSED)

    def _deferred_weight_names(self) -> list[str]:
        return list(self.weight_names)

    def _gemm_of_weight(self, name: str) -> str:
        return f"gemm{name.removeprefix('weight')}"

    @no_torch_dynamo
    def forward(
        self, inp: torch.Tensor, m_splits: list[int], is_first_microbatch: bool | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """``cat_i(inp_i W_i^T + b_i)`` over the row splits ``m_splits`` (``return_bias=True``: the outputs
        without bias and the list of biases in the activation dtype)."""
        splits = [int(m) for m in m_splits]
        if len(splits) != self.num_gemms:
            raise ValueError(f"Number of splits ({len(splits)}) should match number of GEMMs ({self.num_gemms}).")
        self._check_input_dtype(inp)
        x = inp.reshape(-1, inp.shape[-1])
        if any(m < 0 for m in splits) or sum(splits) != x.shape[0]:
            raise ValueError(f"m_splits {splits} must be >= 0 and sum to the {x.shape[0]} input rows")
        out = grouped_linear(self, inp, splits, is_first_microbatch)
        if self.return_bias:
            act = self._activation_dtype(inp)
            return out, [getattr(self, n).to(act) for n in self.bias_names]
        return out

    def extra_repr(self) -> str:
        return (
            f"num_gemms={self.num_gemms}, in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.use_bias}"
        )
