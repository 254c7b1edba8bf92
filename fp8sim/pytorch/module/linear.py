"""TE ``Linear``: ``y = x W^T + b``, FP8 inside ``autocast`` (``transformer_engine/pytorch/module/linear.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ._fp8_handoff import attach_output, fp8_boundaries
from ._params import cat_params, make_linear_params, resolve_params_dtype, size_arg
from ._rng_init import set_init_tracker
from .base import TransformerEngineBaseModule, no_torch_dynamo

__all__ = ["Linear"]


class Linear(TransformerEngineBaseModule):
    """TE ``Linear(in_features, out_features, sequence_parallel=False, fuse_wgrad_accumulation=False,
    tp_group=None, tp_size=1, get_rng_state_tracker=None, rng_tracker_name=None, init_method=None,
    bias=True, return_bias=False, params_dtype=None, parallel_mode=None, parameters_split=None,
    device="cpu", ...)``, TE's positional order and defaults (weights ``N(0, 0.023)``, biases zero; without
    bias ``self.bias`` is an empty tensor).  ``device`` defaults to "cpu" (TE: "cuda"; see
    ``fp8sim run --device-map``).  ``accumulator`` (fp8sim, keyword only): the GEMM model when autocast
    names none (None: exact products summed in float32; "hopper", "ada", "blackwell" or a preset).
    """

    def __init__(
        self,
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
        parameters_split: tuple[str, ...] | dict[str, int] | None = None,
        device: torch.device | str = "cpu",
        ub_overlap_ag: bool = False,
        ub_overlap_rs: bool = False,
        ub_overlap_rs_dgrad: bool = False,
        ub_bulk_dgrad: bool = False,
        ub_bulk_wgrad: bool = False,
        ub_name: str | None = None,
        delay_wgrad_compute: bool = False,
        symmetric_ar_type: str | None = None,
        save_original_input: bool = False,
        name: str | None = None,
        *,
        accumulator: str | None = None,
    ) -> None:
        in_features, out_features = size_arg(in_features, "in_features"), size_arg(out_features, "out_features")
        super().__init__(accumulator, name)
        if any((ub_overlap_ag, ub_overlap_rs, ub_overlap_rs_dgrad, ub_bulk_dgrad, ub_bulk_wgrad)):
            raise NotImplementedError(
                "transformer_engine.pytorch.Linear: Userbuffers (ub_overlap_* / ub_bulk_*: TE's overlap of "
                "tensor-parallel communication with the GEMMs) needs CUDA: peer-to-peer buffers shared by several "
                "GPUs; it is not emulated by fp8sim"
            )
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
        self.symmetric_ar_type = symmetric_ar_type  # TE's row-parallel all-reduce kind (module/_tp.py)
        dtype = resolve_params_dtype(params_dtype)
        if self.tp_size > 1:  # TE: this rank's shard (module/_tp.py)
            from ._tp import shard_features

            in_features, out_features, parameters_split = shard_features(
                self.tp_size, parallel_mode, in_features, out_features, parameters_split
            )
        self.in_features, self.out_features = in_features, out_features
        self.weight_names, self.bias_names = make_linear_params(
            self,
            out_features,
            in_features,
            bias=bias,
            init_method=init_method,
            parameters_split=parameters_split,
            dtype=dtype,
            device=device,
        )
        self.get_rng_state_tracker, self.rng_tracker_name = get_rng_state_tracker, rng_tracker_name
        set_init_tracker(self, self.weight_names, get_rng_state_tracker)  # TE: weights initialised in its fork
        self.reset_parameters(defer_init=torch.device(device).type == "meta")

    _tp_supported = True

    def _deferred_weight_names(self) -> list[str]:
        return self.weight_names[:1]

    @no_torch_dynamo
    def forward(
        self,
        inp: torch.Tensor,
        is_first_microbatch: bool | None = None,
        fp8_output: bool | None = False,
        fp8_grad: bool | None = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``inp W^T + b`` (``return_bias=True``: ``(inp W^T, b)``, the bias in the activation dtype).
        Inside FP8 autocast (delayed or current scaling) ``fp8_output=True`` writes the output in FP8 with
        the OUTPUT slot and ``fp8_grad=True`` the input gradient with the GRAD_INPUT slot (the tensors come
        back dequantized, the FP8 data attached for an FP8 consumer; current scaling casts the result after
        rounding it to the activation dtype, TE's unfused cast); outside autocast both are ignored, as in TE.
        An input that carries FP8 data (DPA's O) is used with its codes and scale_inv, the INPUT quantizer
        skipped (TE: a Float8Tensor input)."""
        fp8_io = fp8_boundaries(inp, bool(fp8_output), bool(fp8_grad))
        self._check_input_dtype(inp)
        weight = cat_params(self, self.weight_names)
        bias = cat_params(self, self.bias_names) if self.use_bias else None
        wparam = weight if len(self.weight_names) == 1 else None
        b = bias if self.apply_bias else None
        out = self._tp_linear(
            self.parallel_mode, "gemm", inp, weight, b, is_first_microbatch, None, wparam, fp8_io=fp8_io
        )
        out = attach_output(self, out, fp8_io)
        if self.return_bias:
            return out, None if bias is None else bias.to(self._activation_dtype(inp))  # TE: None without a bias
        return out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.use_bias}"
