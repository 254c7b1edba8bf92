"""TE's ``MultiheadAttention`` (``attention/multi_head_attention.py``): QKV projection (optionally
after a LayerNorm/RMSNorm), optional rotary embeddings, ``DotProductAttention``, output ``proj``.

Submodule names follow TE: self attention has ``layernorm_qkv`` (``input_layernorm=True``) or
``qkv``; cross attention has ``layernorm_query`` or ``query_layer`` plus ``key_value``; then
``core_attention`` and ``proj``.  The fused QKV output is split as TE splits it: with
``qkv_weight_interleaved`` (only with ``fuse_qkv_params``) the rows are ``[ng, np/ng + 2, hn]``, else
``[np/ng + 2, ng, hn]``.

FP8 boundaries as TE's ``forward`` sets them (``qkv_fp8_output``, ``dpa_fp8_output``,
``proj_fp8_grad``): with ``fp8_dpa`` or ``fp8_mha`` under delayed or current scaling DPA returns O in
FP8 and ``proj`` takes its codes and scale_inv as its input operand (no INPUT cast); under delayed
scaling ``proj``'s dgrad is written in FP8 (its GRAD_INPUT slot) and DPA uses it as dO (no dO cast);
under ``fp8_mha`` with delayed scaling and no RoPE the QKV GEMM writes Q, K, V in FP8 with its
OUTPUT slot's scale (DPA's QKV cast skipped) and DPA returns dQ, dK, dV in FP8 (its dQKV slot) to the
QKV GEMM's backward (no GRAD_OUTPUT cast).  MXFP8 keeps every boundary in high precision (TE).
Each boundary slot's quantizer role names its consumer (TE's ``_update_output_quantizer_roles``).
fp8sim limits: the thd format, and a ``CustomRecipe`` with ``fp8_mha``, keep the boundaries in high precision.

Tensor parallelism as TE (``tp_group``/``tp_size``, ``set_parallel_mode=True``): the QKV projection is
column-parallel, each of its ``query``/``key``/``value`` splits divided across the ranks, so a rank holds
``num_attention_heads / tp_size`` heads and ``num_gqa_groups / tp_size`` GQA groups and runs attention on
them alone; ``proj`` is row-parallel (its partial outputs summed over ``tp_group``, the bias added after).
With ``sequence_parallel`` the QKV input is gathered along dim 0 and ``proj``'s output reduce-scattered
(``module/_tp.py``).  With ``fp8_dpa``/``fp8_mha`` each rank runs FP8 attention on its own heads; the FP8
hand-offs above are this rank's (the QKV output and dQKV of its column shard, proj's FP8 input and FP8 dgrad
before its row reduction), and DPA's delayed-scaling amaxes are MAX-reduced over the autocast's
``amax_reduction_group`` (default: world) as the GEMM modules' are (TE: DPA is a TE module in the region's
global amax buffer).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ...recipe import DelayedScaling, Float8CurrentScaling
from .. import module as _module
from ..module._fp8_handoff import FP8Handoff, attach, handoff_of
from ..module._params import size_arg
from ..quantization import current_state, get_recipe
from .dot_product_attention import DotProductAttention
from .rope import apply_rotary_pos_emb

__all__ = ["MultiheadAttention"]


def head_size(hidden_size: int, num_attention_heads: int, kv_channels: Any) -> int:
    """TE's ``kv_channels if kv_channels else hidden_size // num_attention_heads``, refusing a head size of 0."""
    if kv_channels:
        return size_arg(kv_channels, "kv_channels")
    if hidden_size < num_attention_heads:
        raise ValueError(
            f"hidden_size {hidden_size} is smaller than num_attention_heads {num_attention_heads}: each head "
            "would have kv_channels = hidden_size // num_attention_heads = 0; pass kv_channels"
        )
    return hidden_size // num_attention_heads


class MultiheadAttention(nn.Module):
    """TE ``MultiheadAttention(hidden_size, num_attention_heads, kv_channels=None, attention_dropout=0.1,
    layernorm_epsilon=1e-5, ..., attn_mask_type="causal", num_gqa_groups=None, input_layernorm=False,
    attention_type="self", fuse_qkv_params=False, zero_centered_gamma=False,
    qkv_weight_interleaved=True, rotary_pos_interleaved=False, bias=True, normalization="LayerNorm",
    qkv_format="sbhd")``; ``forward(hidden_states, attention_mask=None, encoder_output=None, ...,
    rotary_pos_emb=None, ...)``.  ``return_bias=True``: ``proj`` leaves its bias out of the GEMM and forward
    returns ``(out, bias)`` (then ``ln_out`` with ``return_layernorm_output``), TE's order; the QKV GEMMs keep
    theirs.  Tensor/sequence parallelism with ``set_parallel_mode=True`` (module docstring); userbuffers are
    not emulated."""

    def __init__(
        self,
        hidden_size: int,
        num_attention_heads: int,
        kv_channels: int | None = None,
        attention_dropout: float = 0.1,
        layernorm_epsilon: float = 1e-5,
        init_method: Callable | None = None,
        output_layer_init_method: Callable | None = None,
        layer_number: int | None = None,
        attn_mask_type: str = "causal",
        window_size: tuple[int, int] | None = None,
        bottom_right_diagonal: bool | None = None,
        tp_group: Any = None,
        tp_size: int = 1,
        num_gqa_groups: int | None = None,
        fuse_wgrad_accumulation: bool = False,
        get_rng_state_tracker: Callable | None = None,
        sequence_parallel: bool = False,
        params_dtype: torch.dtype | None = None,
        return_bias: bool = False,
        return_layernorm_output: bool = False,
        input_layernorm: bool = False,
        attention_type: str = "self",
        set_parallel_mode: bool = False,
        fuse_qkv_params: bool = False,
        zero_centered_gamma: bool = False,
        qkv_weight_interleaved: bool = True,
        rotary_pos_interleaved: bool = False,
        ub_overlap_ag: bool = False,
        ub_overlap_rs: bool = False,
        ub_overlap_rs_dgrad: bool = False,
        ub_bulk_dgrad: bool = False,
        ub_bulk_wgrad: bool = False,
        bias: bool = True,
        normalization: str = "LayerNorm",
        device: Any = "cpu",
        qkv_format: str = "sbhd",
        name: str | None = None,
        qk_norm_type: str | None = None,
        qk_norm_eps: float = 1e-6,
        qk_norm_before_rope: bool = False,
        seq_length: int | None = None,
        micro_batch_size: int | None = None,
        softmax_type: str = "vanilla",
    ) -> None:
        super().__init__()
        hidden_size, num_attention_heads = (
            size_arg(hidden_size, "hidden_size"),
            size_arg(num_attention_heads, "num_attention_heads"),
        )
        kv_channels = head_size(hidden_size, num_attention_heads, kv_channels)
        num_gqa_groups = size_arg(num_gqa_groups, "num_gqa_groups", none=True)
        if tp_group is not None:  # TE: the group's size wins over tp_size
            from ..module._tp import get_distributed_world_size

            tp_size = get_distributed_world_size(tp_group)
        if tp_size > 1 and not set_parallel_mode:  # TE would build unsharded GEMMs around sharded attention
            raise NotImplementedError("fp8sim: MultiheadAttention with tp_size > 1 needs set_parallel_mode=True")
        self.tp_group, self.tp_size = tp_group, tp_size
        self.sequence_parallel = tp_size > 1 and sequence_parallel
        if qk_norm_type is not None:
            raise NotImplementedError("fp8sim does not emulate qk_norm_type")
        if attention_type not in ("self", "cross"):
            raise AssertionError(f"attention_type {attention_type} not supported")
        if layer_number is not None and layer_number <= 0:
            raise AssertionError("layer_number must be a positive integer")
        self.qkv_format, self.attn_mask_type, self.window_size = qkv_format, attn_mask_type, window_size
        self.bottom_right_diagonal = bottom_right_diagonal
        self.layer_number = 1 if layer_number is None else layer_number
        self.input_layernorm, self.attention_type = input_layernorm, attention_type
        self.return_layernorm_output, self.return_bias = return_layernorm_output, return_bias
        self.params_dtype = torch.get_default_dtype() if params_dtype is None else params_dtype
        self.num_attention_heads = num_attention_heads
        self.qkv_weight_interleaved = qkv_weight_interleaved if fuse_qkv_params else False
        self.rotary_pos_interleaved = rotary_pos_interleaved
        self.num_gqa_groups = num_attention_heads if num_gqa_groups is None else num_gqa_groups
        if num_attention_heads % self.num_gqa_groups:
            raise AssertionError("The number of attention heads must be divisible by the number of GQA groups!")
        from ..module._tp import divide

        self.num_attention_heads_per_partition = divide(num_attention_heads, tp_size)
        if self.num_gqa_groups % tp_size:
            raise AssertionError("The number of GQA groups must be divisible by tensor parallel size!")
        self.num_gqa_groups_per_partition = self.num_gqa_groups // tp_size
        self.hidden_size_per_attention_head = kv_channels
        self.hidden_size_q = kv_channels * num_attention_heads
        self.hidden_size_kv = kv_channels * self.num_gqa_groups
        kw = {"params_dtype": self.params_dtype, "device": device, "bias": bias, "init_method": init_method}
        kw.update(tp_group=tp_group, tp_size=tp_size, sequence_parallel=sequence_parallel)
        kw["get_rng_state_tracker"] = get_rng_state_tracker  # TE common_gemm_kwargs: weights init in its fork
        kw["fuse_wgrad_accumulation"] = fuse_wgrad_accumulation  # TE common_gemm_kwargs: wgrad into main_grad
        qkv_mode = "column" if set_parallel_mode else None
        ln_kw = {
            **kw,
            "eps": layernorm_epsilon,
            "zero_centered_gamma": zero_centered_gamma,
            "return_layernorm_output": return_layernorm_output,
            "normalization": normalization,
        }
        LNL, Lin = _module.LayerNormLinear, _module.Linear

        def sub(suffix: str) -> str | None:  # TE names the submodules after the parent (QuantizerRole.name)
            return None if name is None else name + "." + suffix

        if attention_type == "self":
            out = self.hidden_size_q + 2 * self.hidden_size_kv
            split = None  # TE: separate query/key/value parameters unless fuse_qkv_params
            if not fuse_qkv_params:
                split = {"query": self.hidden_size_q, "key": self.hidden_size_kv, "value": self.hidden_size_kv}
            if input_layernorm:
                self.layernorm_qkv = LNL(
                    hidden_size,
                    out,
                    parameters_split=split,
                    parallel_mode=qkv_mode,
                    name=sub("layernorm_linear_qkv"),
                    **ln_kw,
                )
            else:
                self.qkv = Lin(
                    hidden_size, out, parameters_split=split, parallel_mode=qkv_mode, name=sub("linear_qkv"), **kw
                )
        else:
            if input_layernorm:
                q_split = None if fuse_qkv_params else ("query",)
                self.layernorm_query = LNL(
                    hidden_size,
                    self.hidden_size_q,
                    parameters_split=q_split,
                    parallel_mode=qkv_mode,
                    name=sub("layernorm_linear_q"),
                    **ln_kw,
                )
            else:  # TE (multi_head_attention.py 429-437 at d0067d0) gives this Linear no name: its roles say ""
                self.query_layer = Lin(hidden_size, self.hidden_size_q, parallel_mode=qkv_mode, **kw)
            kv_split = None if fuse_qkv_params else ("key", "value")
            self.key_value = Lin(
                hidden_size,
                2 * self.hidden_size_kv,
                parameters_split=kv_split,
                parallel_mode=qkv_mode,
                name=sub("linear_kv"),
                **kw,
            )
        self.core_attention = DotProductAttention(
            num_attention_heads,
            kv_channels,
            num_gqa_groups=self.num_gqa_groups,
            attention_dropout=attention_dropout,
            qkv_format=qkv_format,
            layer_number=self.layer_number,
            attention_type=attention_type,
            softmax_type=softmax_type,
            tp_size=tp_size,
            tp_group=tp_group,
            sequence_parallel=sequence_parallel,
            get_rng_state_tracker=get_rng_state_tracker,
            name=sub("core_attention"),
        )
        proj_mode = "row" if set_parallel_mode else None
        proj_kw = {**kw, "init_method": output_layer_init_method, "return_bias": return_bias, "name": sub("proj")}
        self.proj = Lin(self.hidden_size_q, hidden_size, parallel_mode=proj_mode, **proj_kw)

    def set_tensor_parallel_group(self, tp_group: Any) -> None:
        """TE: this module's tensor parallel group (``TransformerLayer.set_tensor_parallel_group`` sets every
        submodule's)."""
        self.tp_group = tp_group

    def _fp8_boundaries(self, rotary_pos_emb: Any) -> tuple[bool, bool, bool]:
        """TE's ``(qkv_fp8_output, dpa_fp8_output, proj_fp8_grad)`` (``multi_head_attention.py`` forward):
        the QKV GEMM writes FP8 under ``fp8_mha`` without RoPE, not under current scaling or MXFP8;
        DPA writes FP8 O under ``fp8_dpa``/``fp8_mha`` except MXFP8; ``proj``'s FP8 dgrad follows DPA's
        O except under current scaling.  fp8sim: delayed/current scaling only, not for thd."""
        st = current_state()
        if not st.enabled or st.calibrating or self.qkv_format == "thd":
            return False, False, False
        recipe = get_recipe()
        ds, cs = isinstance(recipe, DelayedScaling), isinstance(recipe, Float8CurrentScaling)
        qkv = bool(recipe.fp8_mha) and rotary_pos_emb is None and ds
        dpa = bool(recipe.fp8_dpa or recipe.fp8_mha) and (ds or cs)
        return qkv, dpa, dpa and not cs

    def _role_boundaries(self, rotary_pos_emb: Any) -> tuple[bool, bool, bool] | None:
        """TE ``forward``'s boundary roles (``multi_head_attention.py`` 877-926): ``(qkv_fp8_output,
        proj_fp8_grad, dpa_fp8_output)`` from the recipe's flags, for every recipe fp8sim runs or refuses.
        Under a ``CustomRecipe`` with ``fp8_mha`` TE wires ``(rotary_pos_emb is None, True, True)`` before DPA
        builds its recipe state, asks DPA for its QKV quantizer's capabilities, and returns None here (roles
        already set)."""
        st = current_state()
        fp8 = st.enabled
        recipe = get_recipe()
        custom, fp8_dpa, fp8_mha = recipe.custom(), bool(recipe.fp8_dpa), bool(recipe.fp8_mha)
        cs, mx = recipe.float8_current_scaling(), recipe.mxfp8()
        if fp8 and custom and fp8_mha:
            self._update_output_quantizer_roles(rotary_pos_emb is None, True, True)
            self.core_attention.get_qkv_quantization_capabilities()
            if not getattr(self, "_warned_custom_fp8_mha", False):  # once per module: a limit, not a per-step event
                self._warned_custom_fp8_mha = True
                warnings.warn(
                    "fp8sim: MultiheadAttention under a CustomRecipe with fp8_mha=True keeps the QKV output, the "
                    "attention output and proj's input gradient in high precision, where TE hands them between its "
                    "sub-modules in FP8 with the quantizers made for these roles: results can differ from TE's "
                    "(an fp8sim limit; docs/te.md)",
                    UserWarning,
                    stacklevel=5,  # the caller of mha(...): forward, _call_impl, _wrapped_call_impl
                )
            return None
        qkv = fp8 and fp8_mha and rotary_pos_emb is None and not cs and not mx
        dpa = fp8 and (fp8_mha if custom else (fp8_dpa or fp8_mha)) and not mx
        return qkv, dpa and not cs, dpa

    def _update_output_quantizer_roles(self, qkv_fp8_output: bool, proj_fp8_grad: bool, dpa_fp8_output: bool) -> None:
        """TE's boundary roles between the QKV GEMM, DPA and ``proj`` (``multi_head_attention.py`` 483-559): a
        boundary tensor's slot is labelled with its consumer's role, or None where the flag is off.  QKV
        output: ``dpa|qkv|<core_attention.name>``; ``proj``'s grad input: ``dpa|do|<core_attention.name>``;
        DPA's output: ``linear|input|<proj.name>``; DPA's grad input (``dpa_fp8_output`` too):
        ``linear|grad_output|<QKV GEMM's name>`` (``layernorm_query``/``query_layer`` in cross attention)."""
        from ..tensor import QuantizerRole

        def role(on: bool, module_type: str, tensor_type: str, name: str | None) -> Any:
            return QuantizerRole(module_type=module_type, tensor_type=tensor_type, name=name or "") if on else None

        dpa_name = self.core_attention.name
        qkv_out = role(qkv_fp8_output, "dpa", "qkv", dpa_name)
        if self.attention_type == "self":
            qkv_linear = self.layernorm_qkv if self.input_layernorm else self.qkv
            qkv_linear.output_quantizer_role = qkv_out
        else:
            qkv_linear = self.layernorm_query if self.input_layernorm else self.query_layer
            qkv_linear.output_quantizer_role = qkv_out
            self.key_value.output_quantizer_role = qkv_out
        self.proj.grad_input_quantizer_role = role(proj_fp8_grad, "dpa", "do", dpa_name)
        self.core_attention.output_quantizer_role = role(dpa_fp8_output, "linear", "input", self.proj.name)
        self.core_attention.grad_input_quantizer_role = role(dpa_fp8_output, "linear", "grad_output", qkv_linear.name)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        if self.qkv_format == "thd":
            return x.reshape(x.shape[0], -1, self.hidden_size_per_attention_head)
        return x.reshape(x.shape[0], x.shape[1], -1, self.hidden_size_per_attention_head)

    def _split_qkv(self, mixed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ng, hn = self.num_gqa_groups_per_partition, self.hidden_size_per_attention_head
        per = self.num_attention_heads_per_partition // ng
        if self.qkv_weight_interleaved:  # [.., ng, np/ng + 2, hn]
            mixed, dim = mixed.view(*mixed.shape[:-1], ng, per + 2, hn), -2
        else:  # [.., np/ng + 2, ng, hn]
            mixed, dim = mixed.view(*mixed.shape[:-1], per + 2, ng, hn), -3
        q, k, v = torch.split(mixed, (per, 1, 1), dim=dim)
        return self._heads(q), self._heads(k), self._heads(v)

    def _split_kv(self, mixed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ng, hn = self.num_gqa_groups_per_partition, self.hidden_size_per_attention_head
        if self.qkv_weight_interleaved:  # [.., ng, 2 * hn]
            mixed, dim = mixed.view(*mixed.shape[:-1], ng, 2 * hn), -1
        else:  # [.., 2 * ng, hn]
            mixed, dim = mixed.view(*mixed.shape[:-1], 2 * ng, hn), -2
        k, v = torch.split(mixed, mixed.shape[dim] // 2, dim=dim)
        return self._heads(k), self._heads(v)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: Any = None,
        encoder_output: torch.Tensor | None = None,
        attn_mask_type: str | None = None,
        window_size: tuple[int, int] | None = None,
        bottom_right_diagonal: bool | None = None,
        is_first_microbatch: bool | None = None,
        checkpoint_core_attention: bool = False,
        inference_params: Any = None,
        rotary_pos_emb: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None,
        core_attention_bias_type: str = "no_bias",
        core_attention_bias: torch.Tensor | None = None,
        alibi_slopes: torch.Tensor | None = None,
        cu_seqlens_q: torch.Tensor | None = None,
        cu_seqlens_kv: torch.Tensor | None = None,
        cu_seqlens_q_padded: torch.Tensor | None = None,
        cu_seqlens_kv_padded: torch.Tensor | None = None,
        max_seqlen_q: int | None = None,
        max_seqlen_kv: int | None = None,
        fast_zero_fill: bool = True,
        pad_between_seqs: bool | None = None,
    ) -> Any:
        if attn_mask_type is None:
            attn_mask_type = self.attn_mask_type
        if window_size is None:
            window_size = self.window_size
        roles = self._role_boundaries(rotary_pos_emb)
        if roles is not None:
            self._update_output_quantizer_roles(*roles)
        qkv_fp8, dpa_fp8_output, proj_fp8_grad = self._fp8_boundaries(rotary_pos_emb)
        ln_out = None
        if self.attention_type == "self":
            if self.input_layernorm:
                res = self.layernorm_qkv(hidden_states, is_first_microbatch=is_first_microbatch, fp8_output=qkv_fp8)
                mixed, ln_out = res if self.return_layernorm_output else (res, None)
            else:
                mixed = self.qkv(hidden_states, is_first_microbatch=is_first_microbatch, fp8_output=qkv_fp8)
            q, k, v = self._split_qkv(mixed)
            _split_fp8(mixed, (q, k, v), self._split_qkv)
        else:
            if encoder_output is None:
                raise ValueError("encoder_output must be given for attention_type='cross'")
            kv = self.key_value(encoder_output, is_first_microbatch=is_first_microbatch, fp8_output=qkv_fp8)
            k, v = self._split_kv(kv)
            if self.input_layernorm:
                res = self.layernorm_query(hidden_states, is_first_microbatch=is_first_microbatch, fp8_output=qkv_fp8)
                q, ln_out = res if self.return_layernorm_output else (res, None)
            else:
                q = self.query_layer(hidden_states, is_first_microbatch=is_first_microbatch, fp8_output=qkv_fp8)
            mixed_q, q = q, self._heads(q)
            if handoff_of(mixed_q) is not None and handoff_of(kv) is not None:
                _split_fp8(mixed_q, (q,), lambda t: (self._heads(t),))
                _split_fp8(kv, (k, v), self._split_kv)
                hq, hk = handoff_of(q), handoff_of(k)
                on_q, on_kv = hq.on_grad, hk.on_grad
                hq.on_grad = lambda dq, dk, dv: (on_q(dq), on_kv(dk, dv))
        if rotary_pos_emb is not None:
            q_emb, k_emb = rotary_pos_emb if isinstance(rotary_pos_emb, tuple) else (rotary_pos_emb,) * 2
            cu_q = cu_seqlens_q_padded if pad_between_seqs else cu_seqlens_q
            cu_kv = cu_seqlens_kv_padded if pad_between_seqs else cu_seqlens_kv
            q = apply_rotary_pos_emb(
                q, q_emb, self.qkv_format, fused=True, cu_seqlens=cu_q, interleaved=self.rotary_pos_interleaved
            )
            k = apply_rotary_pos_emb(
                k, k_emb, self.qkv_format, fused=True, cu_seqlens=cu_kv, interleaved=self.rotary_pos_interleaved
            )
        context = self.core_attention(
            q,
            k,
            v,
            attention_mask=attention_mask,
            qkv_format=self.qkv_format,
            cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_kv=cu_seqlens_kv,
            cu_seqlens_q_padded=cu_seqlens_q_padded,
            cu_seqlens_kv_padded=cu_seqlens_kv_padded,
            max_seqlen_q=max_seqlen_q,
            max_seqlen_kv=max_seqlen_kv,
            attn_mask_type=attn_mask_type,
            window_size=window_size,
            bottom_right_diagonal=bottom_right_diagonal,
            core_attention_bias_type=core_attention_bias_type,
            core_attention_bias=core_attention_bias,
            alibi_slopes=alibi_slopes,
            inference_params=inference_params,
            fp8_output=dpa_fp8_output,
        )
        out = self.proj(context, is_first_microbatch=is_first_microbatch, fp8_grad=proj_fp8_grad)
        outputs = out if self.return_bias else (out,)  # proj returns (out, bias) when it leaves its bias unadded
        if self.input_layernorm and self.return_layernorm_output:
            outputs += (ln_out,)
        return outputs if len(outputs) > 1 else outputs[0]


def _split_fp8(mixed: torch.Tensor, parts: tuple, split: Callable) -> None:
    """Attach the FP8 data of ``mixed`` (the QKV GEMM's FP8 output), split as ``split`` splits the
    tensor, to ``parts``; the FP8 gradients of the parts (DPA's dQKV) come back merged into ``mixed``'s
    handoff for the GEMM's backward.  The merge reads the split's element map off an index tensor."""
    hm = handoff_of(mixed)
    if hm is None:
        return
    lead, n = mixed.shape[:-1], mixed.shape[-1]
    for t, vals, codes in zip(parts, split(hm.vals), split(hm.codes), strict=True):
        attach(t, FP8Handoff(vals, codes, hm.sinv, hm.fmt))
    index = [i.reshape(-1) for i in split(torch.arange(n).view(*([1] * len(lead)), n))]

    def merge(*grads: FP8Handoff) -> None:
        vals = torch.zeros(*lead, n, dtype=torch.float32)
        codes = torch.zeros(*lead, n, dtype=torch.uint8)
        for i, g in zip(index, grads, strict=True):
            vals[..., i] = g.vals.reshape(*lead, -1)
            codes[..., i] = g.codes.reshape(*lead, -1)
        hm.grad = FP8Handoff(vals, codes, grads[0].sinv, grads[0].fmt)

    handoff_of(parts[0]).on_grad = merge
