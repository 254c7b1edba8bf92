"""TE ``LayerNormLinear``: LayerNorm or RMSNorm, then an FP8 linear (``module/layernorm_linear.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..quantization import current_state
from ._fp8_handoff import attach_output, fp8_boundaries
from ._norm_gemm import fused_producer, norm_for_gemm
from ._norm_prologue import NormPrologue
from ._normalization import check_normalization
from ._params import cat_params, make_linear_params, make_norm_params, resolve_params_dtype, size_arg
from ._rng_init import set_init_tracker
from .base import TransformerEngineBaseModule, no_torch_dynamo

__all__ = ["LayerNormLinear"]


class LayerNormLinear(TransformerEngineBaseModule):
    """TE ``LayerNormLinear(in_features, out_features, eps=1e-5, sequence_parallel=False,
    fuse_wgrad_accumulation=False, tp_group=None, tp_size=1, get_rng_state_tracker=None,
    init_method=None, bias=True, normalization="LayerNorm", return_bias=False, params_dtype=None,
    parallel_mode=None, return_layernorm_output=False, return_layernorm_output_gathered=False,
    parameters_split=None, zero_centered_gamma=False, device="cpu", ...)``.

    The normalization runs in float32 (TE's kernels); under delayed scaling its float32 output is
    quantized straight to FP8 unless it is returned.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        eps: float = 1e-5,
        sequence_parallel: bool = False,
        fuse_wgrad_accumulation: bool = False,
        tp_group: Any = None,
        tp_size: int = 1,
        get_rng_state_tracker: Callable | None = None,
        init_method: Callable | None = None,
        bias: bool = True,
        normalization: str = "LayerNorm",
        return_bias: bool = False,
        params_dtype: torch.dtype | None = None,
        parallel_mode: str | None = None,
        return_layernorm_output: bool = False,
        return_layernorm_output_gathered: bool = False,
        parameters_split: tuple[str, ...] | dict[str, int] | None = None,
        zero_centered_gamma: bool = False,
        device: torch.device | str = "cpu",
        ub_overlap_ag: bool = False,
        ub_overlap_rs: bool = False,
        ub_overlap_rs_dgrad: bool = False,
        ub_bulk_wgrad: bool = False,
        ub_bulk_dgrad: bool = False,
        ub_name: str | None = None,
        delay_wgrad_compute: bool = False,
        symmetric_ar_type: str | None = None,
        name: str | None = None,
        *,
        accumulator: str | None = None,
    ) -> None:
        in_features, out_features = size_arg(in_features, "in_features"), size_arg(out_features, "out_features")
        super().__init__(accumulator, name)
        check_normalization(normalization)
        if any((ub_overlap_ag, ub_overlap_rs, ub_overlap_rs_dgrad, ub_bulk_wgrad, ub_bulk_dgrad)):
            raise NotImplementedError(
                "transformer_engine.pytorch.LayerNormLinear: Userbuffers (ub_overlap_* / ub_bulk_*: TE's overlap of "
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
        )
        dtype = resolve_params_dtype(params_dtype)
        if self.tp_size > 1:  # TE: this rank's shard (module/_tp.py)
            from ._tp import shard_features

            in_features, out_features, parameters_split = shard_features(
                self.tp_size, parallel_mode, in_features, out_features, parameters_split
            )
            if self.sequence_parallel and return_layernorm_output and return_layernorm_output_gathered:
                raise NotImplementedError("fp8sim: return_layernorm_output_gathered with sequence_parallel")
        self.in_features, self.out_features, self.eps = in_features, out_features, eps
        self.normalization, self.zero_centered_gamma = normalization, zero_centered_gamma
        self.return_layernorm_output = return_layernorm_output
        self.return_layernorm_output_gathered = return_layernorm_output_gathered if return_layernorm_output else False
        make_norm_params(
            self,
            in_features,
            normalization=normalization,
            zero_centered_gamma=zero_centered_gamma,
            dtype=dtype,
            device=device,
        )
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
        self.get_rng_state_tracker = get_rng_state_tracker
        set_init_tracker(self, self.weight_names, get_rng_state_tracker)  # TE: weights initialised in its fork
        self.reset_parameters(defer_init=torch.device(device).type == "meta")

    _tp_supported = True

    def _gemm_is_local(self) -> bool:
        """Whether the GEMM runs on this rank alone (no tensor-parallel collectives around it)."""
        return self.tp_size == 1 or self.parallel_mode is None

    def _deferred_weight_names(self) -> list[str]:
        return self.weight_names[:1]

    @no_torch_dynamo
    def forward(
        self,
        inp: torch.Tensor,
        is_first_microbatch: bool | None = None,
        fp8_output: bool | None = False,
        fp8_grad: bool | None = False,
    ) -> Any:
        """``norm(inp) W^T + b``; with ``return_bias`` the bias comes back apart, with
        ``return_layernorm_output`` the norm output too: ``out``, ``(out, bias)``, ``(out, ln_out)`` or
        ``(out, bias, ln_out)`` (TE's order).  ``fp8_output=True`` (delayed or current scaling): the output
        is written in FP8 with the OUTPUT slot (see ``Linear.forward``).  ``fp8_grad``: ignored outside
        FP8 autocast (TE), refused inside: TE hands the FP8 dgrad straight to its C++ norm backward."""
        fp8_io = fp8_boundaries(None, bool(fp8_output), bool(fp8_grad))
        if fp8_io and fp8_io["fp8_grad"] and torch.is_grad_enabled():  # TE: no grad-input quantizer without grad
            # layernorm_linear.py 1133-1161: the dgrad GEMM's Float8Tensor output goes to tex.layernorm_bwd /
            # tex.rmsnorm_bwd, which read it as a plain at::Tensor; what that computes is not emulated
            raise NotImplementedError(
                "transformer_engine.pytorch.LayerNormLinear: fp8_grad=True inside FP8 autocast is not emulated by"
                " fp8sim (TE passes the FP8 dgrad to the C++ norm backward as a plain tensor)"
            )
        self._check_input_dtype(inp)
        weight = cat_params(self, self.weight_names)
        bias = cat_params(self, self.bias_names) if self.use_bias else None
        wparam = weight if len(self.weight_names) == 1 else None
        b = bias if self.apply_bias else None
        if current_state().enabled and self._gemm_is_local() and not self.return_layernorm_output:
            # TE's _LayerNormLinear: the norm inside the linear's autograd function (``_norm_prologue``)
            fused = fused_producer(False, self)
            act = self._activation_dtype(inp)
            norm = NormPrologue(
                self.layer_norm_weight, self.layer_norm_bias, self.eps, self.normalization,
                self.zero_centered_gamma, fused,
            )  # fmt: skip
            fp8_io = {**(fp8_io or {}), "norm": norm}
            out = self._linear(
                "gemm", inp, weight, b, is_first_microbatch, act if fused else None, wparam, fp8_io=fp8_io
            )
        else:
            x, ln, act, fused = norm_for_gemm(self, inp, self.return_layernorm_output)
            out = self._tp_linear(
                self.parallel_mode, "gemm", x, weight, b, is_first_microbatch, act if fused else None, wparam,
                fp8_io=fp8_io,
            )  # fmt: skip
        out = attach_output(self, out, fp8_io)
        outs: tuple = (out,)
        if self.return_bias:
            outs += (None if bias is None else bias.to(act),)  # TE: None without a bias
        if self.return_layernorm_output:
            outs += (ln,)
        return outs if len(outs) > 1 else out
