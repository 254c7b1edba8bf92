"""TE's ``TransformerLayer`` (``transformer.py``): self attention, optional cross attention
(``layer_type="decoder"``), and an MLP, each followed by bias-dropout-add with the residual.

Submodules follow TE: ``self_attention`` (a ``MultiheadAttention`` with ``input_layernorm`` unless
``output_layernorm``), ``inter_attention`` (decoder), ``layernorm_mlp``, and ``layernorm``
(``output_layernorm``).  The projections add their biases inside the GEMM epilogue instead of TE's
``return_bias`` + fused bias-dropout-add, which is the same sum in float32.

Tensor parallelism as TE (``tp_group``/``tp_size`` with ``set_parallel_mode=True``): the attention and
``layernorm_mlp`` are built sharded (``MultiheadAttention``: heads split across ranks; ``LayerNormMLP``:
fc1 column-, fc2 row-parallel), each block's output already summed over ``tp_group``, so the dropout-adds
and the residuals run on the full hidden size of every rank.  With ``sequence_parallel`` the input is this
rank's slice of the sequence (dim 0): the norms, the residual adds and the output stay on those rows, and
the GEMMs gather and reduce-scatter them (``module/_tp.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from . import module as _module
from .attention.dot_product_attention.utils import AttnMaskTypes
from .attention.multi_head_attention import MultiheadAttention, head_size
from .module._params import size_arg

__all__ = ["TransformerLayer"]

LayerTypes = ("encoder", "decoder")


class DropPath(nn.Module):
    """Stochastic depth per sample (TE's ``DropPath``)."""

    def __init__(self, drop_prob: float = 0.0) -> None:
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, hidden_state: torch.Tensor) -> torch.Tensor:
        if self.drop_prob == 0.0 or not self.training:
            return hidden_state
        keep = 1 - self.drop_prob
        shape = (hidden_state.shape[0],) + (1,) * (hidden_state.ndim - 1)
        mask = (keep + torch.rand(shape, dtype=hidden_state.dtype, device=hidden_state.device)).floor_()
        return hidden_state.div(keep) * mask


class TransformerLayer(nn.Module):
    """TE ``TransformerLayer(hidden_size, ffn_hidden_size, num_attention_heads, num_gqa_groups=None,
    layernorm_epsilon=1e-5, hidden_dropout=0.1, attention_dropout=0.1, ..., self_attn_mask_type="causal",
    apply_residual_connection_post_layernorm=False, output_layernorm=False, layer_type="encoder",
    fuse_qkv_params=False, zero_centered_gamma=False, qkv_weight_interleaved=True, bias=True,
    activation="gelu", normalization="LayerNorm", attn_input_format="sbhd")``.

    ``forward(hidden_states, attention_mask=None, self_attn_mask_type=None, ..., encoder_output=None,
    enc_dec_attn_mask=None, is_first_microbatch=None, rotary_pos_emb=None, ...)``.  Tensor and sequence
    parallelism as the module docstring says; ``parallel_attention_mlp`` runs attention and the MLP
    on the same input and adds ``dropout(attention + mlp)`` to it (TE ``transformer.py`` 940-944); under
    ``torch.autocast`` the input is cast to the autocast dtype first (TE 864-866); context parallelism
    and userbuffers are not emulated.
    """

    def __init__(
        self,
        hidden_size: int,
        ffn_hidden_size: int,
        num_attention_heads: int,
        num_gqa_groups: int | None = None,
        layernorm_epsilon: float = 1e-5,
        hidden_dropout: float = 0.1,
        attention_dropout: float = 0.1,
        init_method: Callable | None = None,
        output_layer_init_method: Callable | None = None,
        layer_number: int | None = None,
        kv_channels: int | None = None,
        self_attn_mask_type: str = "causal",
        window_size: tuple[int, int] | None = None,
        bottom_right_diagonal: bool | None = None,
        enc_dec_attn_mask_type: str = "no_mask",
        enc_dec_bottom_right_diagonal: bool | None = None,
        enc_dec_window_size: tuple[int, int] | None = None,
        tp_group: Any = None,
        tp_size: int = 1,
        params_dtype: torch.dtype | None = None,
        get_rng_state_tracker: Callable | None = None,
        fuse_wgrad_accumulation: bool = False,
        seq_length: int | None = None,
        micro_batch_size: int | None = None,
        sequence_parallel: bool = False,
        apply_residual_connection_post_layernorm: bool = False,
        output_layernorm: bool = False,
        parallel_attention_mlp: bool = False,
        layer_type: str = "encoder",
        drop_path_rate: float = 0.0,
        set_parallel_mode: bool = False,
        fuse_qkv_params: bool = False,
        rotary_pos_interleaved: bool = False,
        zero_centered_gamma: bool = False,
        qkv_weight_interleaved: bool = True,
        ub_tp_comm_overlap: bool = False,
        ub_overlap_ag: bool = True,
        ub_overlap_rs: bool = True,
        ub_overlap_rs_dgrad: bool = False,
        ub_bulk_dgrad: bool = True,
        ub_bulk_wgrad: bool = True,
        bias: bool = True,
        activation: str = "gelu",
        activation_params: dict | None = None,
        normalization: str = "LayerNorm",
        device: Any = "cpu",
        attn_input_format: str = "sbhd",
        name: str | None = None,
        qk_norm_type: str | None = None,
        qk_norm_eps: float = 1e-6,
        qk_norm_before_rope: bool = False,
        softmax_type: str = "vanilla",
    ) -> None:
        super().__init__()
        if parallel_attention_mlp:  # TE transformer.py 376-389, checked before layer_type
            if layer_type != "encoder":
                raise ValueError(f"parallel_attention requires layer_type='encoder', but got layer_type={layer_type!r}")
            if apply_residual_connection_post_layernorm:
                raise ValueError(
                    "parallel_attention and apply_residual_connection_post_layernorm are not supported simultaneously."
                )
            if output_layernorm:
                raise ValueError("parallel_attention and output_layernorm are not supported simultaneously.")
        self.parallel_attention_mlp = parallel_attention_mlp
        hidden_size, ffn_hidden_size = (
            size_arg(hidden_size, "hidden_size"),
            size_arg(ffn_hidden_size, "ffn_hidden_size"),
        )
        num_attention_heads = size_arg(num_attention_heads, "num_attention_heads")
        kv_channels = head_size(hidden_size, num_attention_heads, kv_channels)
        if layer_type not in LayerTypes:
            raise ValueError(
                f"layer_type {layer_type!r} is not supported. "
                f"Supported types are: {', '.join(repr(t) for t in LayerTypes)}"
            )
        if tp_group is not None:  # TE: the group's size wins over tp_size
            from .module._tp import get_distributed_world_size

            tp_size = get_distributed_world_size(tp_group)
        self.tp_size, self.seq_length = tp_size, seq_length
        self.sequence_parallel = tp_size > 1 and sequence_parallel
        self.get_rng_state_tracker = get_rng_state_tracker
        tp_kw = dict(  # TE hands these to attention and the MLP alike (transformer.py 432-445, 505-512)
            fuse_wgrad_accumulation=fuse_wgrad_accumulation,
            tp_group=tp_group,
            tp_size=tp_size,
            sequence_parallel=self.sequence_parallel,
            set_parallel_mode=set_parallel_mode,
            get_rng_state_tracker=get_rng_state_tracker,
        )
        if not fuse_qkv_params and fuse_wgrad_accumulation:
            raise ValueError(
                "Gradient accumulation fusion (fuse_wgrad_accumulation=True) "
                "requires fuse_qkv_params=True, but fuse_qkv_params is False."
            )
        self.layer_type, self.output_layernorm = layer_type, output_layernorm
        self.apply_residual_connection_post_layernorm = apply_residual_connection_post_layernorm
        self.self_attn_mask_type, self.window_size = self_attn_mask_type, window_size
        self.bottom_right_diagonal = bottom_right_diagonal
        self.enc_dec_attn_mask_type, self.enc_dec_window_size = enc_dec_attn_mask_type, enc_dec_window_size
        self.enc_dec_bottom_right_diagonal = enc_dec_bottom_right_diagonal
        self.hidden_dropout, self.attn_input_format = hidden_dropout, attn_input_format
        self.kv_channels = kv_channels
        common = dict(
            kv_channels=self.kv_channels,
            attention_dropout=attention_dropout,
            layernorm_epsilon=layernorm_epsilon,
            init_method=init_method,
            output_layer_init_method=output_layer_init_method,
            layer_number=layer_number,
            num_gqa_groups=num_gqa_groups,
            params_dtype=params_dtype,
            return_layernorm_output=apply_residual_connection_post_layernorm,
            fuse_qkv_params=fuse_qkv_params,
            zero_centered_gamma=zero_centered_gamma,
            qkv_weight_interleaved=qkv_weight_interleaved,
            rotary_pos_interleaved=rotary_pos_interleaved,
            qkv_format=attn_input_format,
            bias=bias,
            normalization=normalization,
            device=device,
            qk_norm_type=qk_norm_type,
            softmax_type=softmax_type,
            **tp_kw,
        )
        self.self_attention = MultiheadAttention(
            hidden_size,
            num_attention_heads,
            attn_mask_type=self_attn_mask_type,
            window_size=window_size,
            input_layernorm=not output_layernorm,
            attention_type="self",
            name=None if name is None else name + ".self_attention",
            **common,
        )
        if layer_type == "decoder":
            self.inter_attention = MultiheadAttention(
                hidden_size,
                num_attention_heads,
                attn_mask_type=enc_dec_attn_mask_type,
                window_size=enc_dec_window_size,
                input_layernorm=True,
                attention_type="cross",
                name=None if name is None else name + ".inter_attention",
                **common,
            )
        self.layernorm_mlp = _module.LayerNormMLP(
            hidden_size,
            ffn_hidden_size,
            eps=layernorm_epsilon,
            bias=bias,
            init_method=init_method,
            output_layer_init_method=output_layer_init_method,
            activation=activation,
            activation_params=activation_params,
            normalization=normalization,
            return_layernorm_output=apply_residual_connection_post_layernorm,
            zero_centered_gamma=zero_centered_gamma,
            params_dtype=params_dtype,
            device=device,
            name=None if name is None else name + ".layernorm_mlp",
            **tp_kw,
        )
        if output_layernorm:
            norm_cls = {"LayerNorm": _module.LayerNorm, "RMSNorm": _module.RMSNorm}[normalization]
            self.layernorm = norm_cls(
                hidden_size,
                eps=layernorm_epsilon,
                zero_centered_gamma=zero_centered_gamma,
                params_dtype=params_dtype,
                device=device,
                sequence_parallel=self.sequence_parallel,
            )
        self.drop_path = DropPath(drop_path_rate) if drop_path_rate > 0.0 else None

    def set_tensor_parallel_group(self, tp_group: Any) -> None:
        """TE: the tensor parallel group of every submodule that has one, before the forward pass."""
        for child in list(self.modules())[1:]:
            if hasattr(child, "set_tensor_parallel_group"):
                child.set_tensor_parallel_group(tp_group)

    def _dropout_add(self, x: torch.Tensor, residual: torch.Tensor, drop_path: nn.Module | None = None) -> torch.Tensor:
        out = F.dropout(x, p=self.hidden_dropout, training=self.training)
        if drop_path is not None:
            out = drop_path(out)
        return residual + out

    @staticmethod
    def _diag(mask_type: str, brd: bool | None) -> bool:
        if mask_type in ("causal", "padding_causal"):
            return False
        if brd is None or mask_type in ("causal_bottom_right", "padding_causal_bottom_right"):
            return True
        return brd

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: Any = None,
        self_attn_mask_type: str | None = None,
        window_size: tuple[int, int] | None = None,
        bottom_right_diagonal: bool | None = None,
        encoder_output: torch.Tensor | None = None,
        enc_dec_attn_mask: Any = None,
        enc_dec_attn_mask_type: str | None = None,
        enc_dec_window_size: tuple[int, int] | None = None,
        enc_dec_bottom_right_diagonal: bool | None = None,
        is_first_microbatch: bool | None = None,
        checkpoint_core_attention: bool = False,
        inference_params: Any = None,
        rotary_pos_emb: Any = None,
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
    ) -> torch.Tensor:
        mask_type = self.self_attn_mask_type if self_attn_mask_type is None else self_attn_mask_type
        ed_type = self.enc_dec_attn_mask_type if enc_dec_attn_mask_type is None else enc_dec_attn_mask_type
        window_size = self.window_size if window_size is None else window_size
        enc_dec_window_size = self.enc_dec_window_size if enc_dec_window_size is None else enc_dec_window_size
        brd = self._diag(
            mask_type, self.bottom_right_diagonal if bottom_right_diagonal is None else bottom_right_diagonal
        )
        ed_brd = self._diag(
            ed_type,
            self.enc_dec_bottom_right_diagonal
            if enc_dec_bottom_right_diagonal is None
            else enc_dec_bottom_right_diagonal,
        )
        for what, t in (("self_attn_mask_type", mask_type), ("enc_dec_attn_mask_type", ed_type)):
            if t not in AttnMaskTypes:
                raise ValueError(
                    f"{what} {t!r} is not supported. Supported types are: {', '.join(repr(x) for x in AttnMaskTypes)}"
                )
        for what, m in (("Attention mask", attention_mask), ("Encoder-decoder attention mask", enc_dec_attn_mask)):
            masks = m if isinstance(m, (tuple, list)) else (m,)
            bad = [(i, x.dtype) for i, x in enumerate(masks) if x is not None and x.dtype != torch.bool]
            if bad:
                raise TypeError(f"{what} must be boolean tensor(s), but found non-bool dtypes at indices: {bad}")
        hidden_states = hidden_states.contiguous()
        dev = hidden_states.device.type
        if torch.is_autocast_enabled(dev):  # TE transformer.py 864-866: AMP casts the layer's input
            hidden_states = hidden_states.to(torch.get_autocast_dtype(dev))
        if (
            self.sequence_parallel
            and self.seq_length is not None
            and hidden_states.shape[0] != self.seq_length // self.tp_size
        ):
            raise ValueError(
                "Sequence dimension must be split across TP group when using "
                "sequence parallel. Expected hidden_states.shape[0] to be "
                f"{self.seq_length // self.tp_size} "
                f"(seq_length={self.seq_length} // tp_size={self.tp_size}), "
                f"but got {hidden_states.shape[0]}."
            )
        seq_kw = dict(
            cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_kv=cu_seqlens_kv,
            cu_seqlens_q_padded=cu_seqlens_q_padded,
            cu_seqlens_kv_padded=cu_seqlens_kv_padded,
            max_seqlen_q=max_seqlen_q,
            max_seqlen_kv=max_seqlen_kv,
            pad_between_seqs=pad_between_seqs,
        )
        bias_kw = dict(
            core_attention_bias_type=core_attention_bias_type,
            core_attention_bias=core_attention_bias,
            alibi_slopes=alibi_slopes,
        )
        attn = self.self_attention(
            hidden_states,
            attention_mask=attention_mask,
            attn_mask_type=mask_type,
            window_size=window_size,
            bottom_right_diagonal=brd,
            inference_params=inference_params,
            is_first_microbatch=is_first_microbatch,
            rotary_pos_emb=rotary_pos_emb,
            **bias_kw,
            **seq_kw,
        )
        if self.parallel_attention_mlp:  # TE: both blocks read the input; one dropout-add of their sum
            mlp = self.layernorm_mlp(hidden_states, is_first_microbatch=is_first_microbatch)
            return self._dropout_add(attn + mlp, hidden_states, self.drop_path)
        if self.apply_residual_connection_post_layernorm and not self.output_layernorm:
            attn, residual = attn
        else:
            residual = hidden_states
        hidden_states = self._dropout_add(attn, residual, self.drop_path)
        if self.layer_type == "decoder":
            inter = self.inter_attention(
                hidden_states,
                attention_mask=enc_dec_attn_mask,
                attn_mask_type=ed_type,
                window_size=enc_dec_window_size,
                bottom_right_diagonal=ed_brd,
                encoder_output=encoder_output,
                inference_params=inference_params,
                is_first_microbatch=is_first_microbatch,
                rotary_pos_emb=rotary_pos_emb,
                **bias_kw,
            )
            inter, residual = inter if self.apply_residual_connection_post_layernorm else (inter, hidden_states)
            hidden_states = self._dropout_add(inter, residual)
        mlp = self.layernorm_mlp(hidden_states, is_first_microbatch=is_first_microbatch)
        mlp, residual = mlp if self.apply_residual_connection_post_layernorm else (mlp, hidden_states)
        output = self._dropout_add(mlp, residual, self.drop_path)
        if self.output_layernorm:
            output = self.layernorm(output)
        return output
