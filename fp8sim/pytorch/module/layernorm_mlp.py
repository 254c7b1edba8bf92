"""TE ``LayerNormMLP``: norm, FP8 ``fc1``, activation, FP8 ``fc2`` (``module/layernorm_mlp.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .._recompute import in_fp8_activation_recompute_phase, module_checkpoint
from ._activations import GATED, activation_fn
from ._norm_gemm import fused_producer, norm_for_gemm
from ._normalization import check_normalization
from ._params import make_linear_params, make_norm_params, resolve_params_dtype, size_arg
from ._rng_init import set_init_tracker
from .base import TransformerEngineBaseModule, no_torch_dynamo

__all__ = ["LayerNormMLP"]


class LayerNormMLP(TransformerEngineBaseModule):
    """TE ``LayerNormMLP(hidden_size, ffn_hidden_size, eps=1e-5, sequence_parallel=False,
    return_bias=False, get_rng_state_tracker=None, tp_group=None, tp_size=1, init_method=None,
    bias=True, normalization="LayerNorm", activation="gelu", activation_params=None,
    output_layer_init_method=None, fuse_wgrad_accumulation=False, params_dtype=None,
    return_layernorm_output=False, ..., zero_centered_gamma=False, device="cpu", ...)``.

    Gated activations (``*glu``) double ``fc1``'s output features.  The activation runs in float32
    on the fc1 output (TE's kernels); under delayed scaling its float32 result is quantized straight
    to FP8 for ``fc2`` and the fc1 gradient reaches its GEMMs unrounded (TE's fused dact+quantize).
    """

    _gemm_names = ("fc1", "fc2")

    def __init__(
        self,
        hidden_size: int,
        ffn_hidden_size: int,
        eps: float = 1e-5,
        sequence_parallel: bool = False,
        return_bias: bool = False,
        get_rng_state_tracker: Callable | None = None,
        tp_group: Any = None,
        tp_size: int = 1,
        init_method: Callable | None = None,
        bias: bool = True,
        normalization: str = "LayerNorm",
        activation: str = "gelu",
        activation_params: dict | None = None,
        output_layer_init_method: Callable | None = None,
        fuse_wgrad_accumulation: bool = False,
        params_dtype: torch.dtype | None = None,
        return_layernorm_output: bool = False,
        return_layernorm_output_gathered: bool = False,
        seq_length: int | None = None,
        micro_batch_size: int | None = None,
        set_parallel_mode: bool = False,
        zero_centered_gamma: bool = False,
        device: torch.device | str = "cpu",
        ub_overlap_ag: bool = False,
        name: str | None = None,
        ub_overlap_rs: bool = False,
        ub_overlap_rs_dgrad: bool = False,
        ub_bulk_dgrad: bool = False,
        ub_bulk_wgrad: bool = False,
        delay_wgrad_compute: bool = False,
        symmetric_ar_type: str | None = None,
        checkpoint: bool = False,
        *,
        accumulator: str | None = None,
    ) -> None:
        hidden_size, ffn_hidden_size = (
            size_arg(hidden_size, "hidden_size"),
            size_arg(ffn_hidden_size, "ffn_hidden_size"),
        )
        super().__init__(accumulator, name)
        check_normalization(normalization)
        self._act = activation_fn(activation, activation_params)
        if any((ub_overlap_ag, ub_overlap_rs, ub_overlap_rs_dgrad, ub_bulk_dgrad, ub_bulk_wgrad)):
            raise NotImplementedError(
                "transformer_engine.pytorch.LayerNormMLP: Userbuffers (ub_overlap_* / ub_bulk_*: TE's overlap of "
                "tensor-parallel communication with the GEMMs) needs CUDA: peer-to-peer buffers shared by several "
                "GPUs; it is not emulated by fp8sim"
            )
        self._init_common(
            sequence_parallel=sequence_parallel,
            fuse_wgrad_accumulation=fuse_wgrad_accumulation,
            tp_group=tp_group,
            tp_size=tp_size,
            bias=bias,
            return_bias=return_bias,
            delay_wgrad_compute=delay_wgrad_compute,
        )
        dtype = resolve_params_dtype(params_dtype)
        if self.tp_size > 1:  # TE: fc1 column-, fc2 row-parallel, ffn_hidden_size / tp_size per rank (module/_tp.py)
            from ._tp import divide

            if not set_parallel_mode:
                raise NotImplementedError("fp8sim: LayerNormMLP with tp_size > 1 needs set_parallel_mode=True")
            ffn_hidden_size = divide(ffn_hidden_size, self.tp_size)
        self.hidden_size, self.ffn_hidden_size, self.eps = hidden_size, ffn_hidden_size, eps
        self.normalization, self.activation, self.activation_params = normalization, activation, activation_params
        self.return_layernorm_output, self.zero_centered_gamma = return_layernorm_output, zero_centered_gamma
        self.return_layernorm_output_gathered = return_layernorm_output_gathered if return_layernorm_output else False
        self.set_parallel_mode, self.checkpoint = set_parallel_mode, checkpoint
        make_norm_params(
            self,
            hidden_size,
            normalization=normalization,
            zero_centered_gamma=zero_centered_gamma,
            dtype=dtype,
            device=device,
        )
        fc1_out = 2 * ffn_hidden_size if activation in GATED else ffn_hidden_size
        common = {"bias": bias, "parameters_split": None, "dtype": dtype, "device": device}
        make_linear_params(self, fc1_out, hidden_size, init_method=init_method, prefix="fc1_", **common)
        make_linear_params(
            self, hidden_size, ffn_hidden_size, init_method=output_layer_init_method, prefix="fc2_", **common
        )
        self.get_rng_state_tracker = get_rng_state_tracker
        set_init_tracker(self, ["fc1_weight", "fc2_weight"], get_rng_state_tracker)  # TE: init in its fork
        self.reset_parameters(defer_init=torch.device(device).type == "meta")

    _tp_supported = True

    def _deferred_weight_names(self) -> list[str]:
        return ["fc2_weight", "fc1_weight"]  # backward order: fc2's wgrad is stored first

    @no_torch_dynamo
    def forward(self, inp: torch.Tensor, is_first_microbatch: bool | None = None) -> Any:
        """``fc2(act(fc1(norm(inp))))``; outputs as TE orders them: ``out``, ``(out, fc2_bias)``,
        ``(out, ln_out)`` or ``(out, fc2_bias, ln_out)``.  ``checkpoint=True``: TE's selective
        recompute, the forward re-run in backward with the forward's FP8 state."""
        if self.checkpoint and torch.is_grad_enabled() and not in_fp8_activation_recompute_phase():
            return module_checkpoint(self, self._forward, inp, is_first_microbatch=is_first_microbatch)
        return self._forward(inp, is_first_microbatch)

    def _forward(self, inp: torch.Tensor, is_first_microbatch: bool | None = None) -> Any:
        self._check_input_dtype(inp)
        x, ln, act, fused = norm_for_gemm(self, inp, self.return_layernorm_output)
        fc1_b = self.fc1_bias if self.use_bias else None
        fc2_b = self.fc2_bias if self.use_bias else None
        fuse_act = fused_producer()
        mode1, mode2 = ("column", "row") if self.set_parallel_mode else (None, None)
        h = self._tp_linear(
            mode1,
            "fc1",
            x,
            self.fc1_weight,
            fc1_b,
            is_first_microbatch,
            act if fused else None,
            self.fc1_weight,
            fuse_act,
        )
        with torch.autocast(inp.device.type, enabled=False):
            a32 = self._act(h)  # float32, as TE's activation kernels compute
        a = a32 if fuse_act else a32.to(act)
        out = self._tp_linear(
            mode2,
            "fc2",
            a,
            self.fc2_weight,
            fc2_b if self.apply_bias else None,
            is_first_microbatch,
            act if fuse_act else None,
            self.fc2_weight,
        )
        outs: tuple = (out,)
        if self.return_bias:
            outs += (None if fc2_b is None else fc2_b.to(act),)  # TE: None without a bias
        if self.return_layernorm_output:
            outs += (ln,)
        return outs if len(outs) > 1 else out
