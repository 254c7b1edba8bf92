"""TE's ``DotProductAttention``: ``softmax(scale * Q K^T + bias, masked) V`` with TE's arguments.

Outside ``autocast``, or when the recipe has neither ``fp8_dpa`` nor ``fp8_mha``, attention runs in
float32 (TE's fused backends compute in float32 too) and the result is cast to the input dtype.
With ``fp8_dpa`` the quantization points of TE's FP8 fused attention apply (see ``backends``):
delayed scaling keeps TE's DPA ``fp8_meta`` (3 GEMMs: forward slots QKV=2, O=3, S=8; backward slots
dQKV=0, dO=3, dP=5), current scaling quantizes QKV/O/dO/dQKV from current amaxes with a delayed
S/dP state (TE's ``init_fp8_metadata``), MXFP8 blocks Q, K, V, dO by 32.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch
from torch import nn

from ....recipe import DelayedScaling, Float8CurrentScaling, Format, MXFP8BlockScaling, Recipe, tensor_format
from ....scaling.delayed import DelayedScaler, load_state_dicts
from ..._recompute import _replay_fp8_state
from ..._rng_tracker import attention_tracker, dropout_fork
from ...module._fp8_handoff import handoff_of
from ...module._meta_states import RecipeStateLifecycle
from ...module._operands import Operand
from ...module._params import size_arg
from ...quantization import _register, current_state, get_recipe
from . import padding, utils
from .backends import AttentionConfig, Quantizer, attention, check_bf16_options
from .fp8_boundaries import attach_fp8_output, send_dqkv
from .fp8_meta import (
    dpa_ds_recipe,
    dpa_fp8_meta,
    dpa_qkv_capabilities,
    dpa_quantizers,
    dpa_recipe_state,
    install_dpa_quantizers,
)

__all__ = ["DotProductAttention"]

META_QKV, META_O, META_S = 2, 3, 8  # FP8FwdTensorIdx GEMM1_OUTPUT, GEMM2_INPUT, GEMM3_OUTPUT
META_DQKV, META_DO, META_DP = 0, 3, 5  # FP8BwdTensorIdx GRAD_OUTPUT1, GRAD_INPUT2, GRAD_INPUT3
_MXFP8_SOFTMAX = ("none", "mxfp8")


def _kv_channels(kv_channels: Any) -> tuple[int, int]:
    """TE's ``kv_channels``: one head size for K and V, or a ``(k, v)`` pair."""
    if isinstance(kv_channels, (tuple, list)):
        if len(kv_channels) != 2:
            raise ValueError(f"kv_channels must be an int or a (k, v) pair of ints, got {kv_channels!r:.60}")
        return size_arg(kv_channels[0], "kv_channels[0]"), size_arg(kv_channels[1], "kv_channels[1]")
    k = size_arg(kv_channels, "kv_channels")
    return k, k


class DotProductAttention(RecipeStateLifecycle, nn.Module):
    """TE ``DotProductAttention(num_attention_heads, kv_channels, num_gqa_groups=None,
    attention_dropout=0.0, qkv_format="sbhd", attn_mask_type="causal", window_size=None, ...)``.

    ``forward(query_layer, key_layer, value_layer, attention_mask=None, qkv_format=None,
    cu_seqlens_q=None, cu_seqlens_kv=None, ...)`` returns ``[s, b, h*d]`` (sbhd), ``[b, s, h*d]``
    (bshd) or ``[t, h*d]`` (thd).  fp8sim extensions: ``accumulator`` (the GEMM model of FP8
    attention, None = exact products summed in float32) and ``mxfp8_softmax`` ("none": P and dS stay
    unquantized under MXFP8, as TE's own emulation; "mxfp8": blocked by 32 like the other operands;
    cuDNN's choice is not in TE's code); causal-safe MXFP8 (cuDNN-frontend, see ``backends``): ``pv_bf16``
    (PV in BF16, PR#983) and ``dqkv_bf16`` (the dQ, dK, dV GEMMs on BF16 operands, PR#1123).

    FP8 boundaries (delayed and current scaling, sbhd/bshd): Q, K, V that carry FP8 data (a QKV GEMM
    with ``fp8_output=True``) are used with their codes and scales, the QKV cast skipped, and dQ, dK, dV
    go back in FP8 (dQKV slot; TE ``is_input_fp8``); ``fp8_output=True`` returns O with its FP8 data
    attached (delayed: cuDNN's FP8 O; current: the O quantizer's cast of the F16 O), and an FP8 dO
    that the consumer's backward writes (``Linear(fp8_grad=True)``) replaces the dO cast.
    """

    def __init__(
        self,
        num_attention_heads: int,
        kv_channels: int | tuple[int, int],
        num_gqa_groups: int | None = None,
        attention_dropout: float = 0.0,
        qkv_format: str = "sbhd",
        attn_mask_type: str = "causal",
        window_size: tuple[int, int] | None = None,
        bottom_right_diagonal: bool | None = None,
        sequence_parallel: bool = False,
        tp_size: int = 1,
        get_rng_state_tracker: Any = None,
        tp_group: Any = None,
        layer_number: int | None = None,
        attention_type: str = "self",
        cp_group: Any = None,
        cp_global_ranks: Any = None,
        cp_stream: Any = None,
        cp_comm_type: str = "p2p",
        softmax_scale: float | None = None,
        softmax_type: str = "vanilla",
        return_max_logit: bool = False,
        name: str | None = None,
        *,
        accumulator: str | None = None,
        mxfp8_softmax: str = "none",
        pv_bf16: bool = False,
        dqkv_bf16: bool = False,
    ) -> None:
        super().__init__()
        if cp_group is not None:
            raise NotImplementedError("fp8sim does not emulate context parallelism (cp_group)")
        if softmax_type != "vanilla":
            raise NotImplementedError(f"fp8sim emulates softmax_type='vanilla' only; got {softmax_type!r}")
        if return_max_logit:
            raise NotImplementedError("fp8sim does not emulate return_max_logit")
        if attention_type not in ("self", "cross"):
            raise AssertionError(f"attention_type {attention_type} not supported")
        if qkv_format not in utils.QKVFormats:
            raise AssertionError("DotProductAttention only supports qkv_format = {'sbhd', 'bshd', 'thd'}!")
        if mxfp8_softmax not in _MXFP8_SOFTMAX:
            raise ValueError(f"mxfp8_softmax must be one of {', '.join(_MXFP8_SOFTMAX)}; got {mxfp8_softmax!r}")
        check_bf16_options(pv_bf16, dqkv_bf16)
        num_attention_heads = size_arg(num_attention_heads, "num_attention_heads")
        num_gqa_groups = size_arg(num_gqa_groups, "num_gqa_groups", none=True)
        k_channels, v_channels = _kv_channels(kv_channels)
        self.num_attention_heads = num_attention_heads
        self.hidden_size_per_attention_head_k = k_channels
        self.hidden_size_per_attention_head_v = v_channels
        self.num_gqa_groups = num_attention_heads if num_gqa_groups is None else num_gqa_groups
        if num_attention_heads % self.num_gqa_groups:
            raise AssertionError("The number of attention heads must be divisible by the number of GQA groups!")
        self.tp_size = tp_size
        self.num_gqa_groups_per_partition = self.num_gqa_groups // tp_size
        self.attention_dropout = attention_dropout
        self.rng_states_tracker = attention_tracker(get_rng_state_tracker, sequence_parallel)
        self.qkv_format = qkv_format
        self.attn_mask_type = utils.normalize_mask_type(attn_mask_type)
        self.window_size = utils.check_set_window_size(self.attn_mask_type, window_size)
        self.bottom_right_diagonal = bottom_right_diagonal
        self.layer_number = 1 if layer_number is None else layer_number
        self.attention_type = attention_type
        self.softmax_scale = (
            softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(self.hidden_size_per_attention_head_k)
        )
        self.softmax_type = softmax_type
        self.accumulator = accumulator
        self.mxfp8_softmax = mxfp8_softmax
        self.pv_bf16, self.dqkv_bf16 = pv_bf16, dqkv_bf16
        self.name = name
        self.fwd: DelayedScaler | None = None
        self.bwd: DelayedScaler | None = None
        self._custom_scalers: tuple | None = None  # a CustomRecipe step's delayed-scaling states (fwd, bwd)
        self.group: Any = None

    # -- FP8 state (TE's fp8_meta of a 3-GEMM module) ------------------------------------------------
    fp8_meta = property(dpa_fp8_meta, doc="TE's ``fp8_meta``: ``recipe``, ``num_gemms``, ``scaling_fwd`` / ``_bwd``")
    quantizers = property(dpa_quantizers, doc="TE's ``quantizers``: 9 forward, 6 backward slots once FP8 ran")
    _new_recipe_state = dpa_recipe_state
    _install_quantizers = install_dpa_quantizers
    get_qkv_quantization_capabilities = dpa_qkv_capabilities

    def _ensure_state(self, recipe: DelayedScaling) -> None:
        if self.fwd is None or self.fwd.recipe != recipe:
            old = (self.fwd, self.bwd)
            self.fwd = DelayedScaler(recipe, n=9, forward=True)
            self.bwd = DelayedScaler(recipe, n=6, forward=False)
            for new, prev in zip((self.fwd, self.bwd), old, strict=True):
                if prev is not None and prev.amax_history.shape == new.amax_history.shape:
                    new.scale, new.amax_history = prev.scale, prev.amax_history

    def _update_forward_scales(self) -> None:
        fwd = self.fwd if self._custom_scalers is None else self._custom_scalers[0]
        if fwd is not None:
            fwd.update(group=self.group)

    def _update_backward_scales(self) -> None:
        bwd = self.bwd if self._custom_scalers is None else self._custom_scalers[1]
        if bwd is not None:
            bwd.update(group=self.group)

    def get_extra_state(self) -> torch.Tensor:
        """TE's ``_extra_state`` (the base module's format): an empty uint8 tensor before any FP8 step,
        else the pickled delayed-scaling state of the module's 3-GEMM layout (9 forward, 6 backward)."""
        from ..._extra_state_te import encode_te_extra_state

        if self.fwd is None:
            return torch.empty(0, dtype=torch.uint8)
        return encode_te_extra_state(
            self.fwd.recipe,
            scale_fwd=torch.from_numpy(self.fwd.scale.copy()),
            amax_history_fwd=torch.from_numpy(self.fwd.amax_history.copy()),
            scale_bwd=torch.from_numpy(self.bwd.scale.copy()),
            amax_history_bwd=torch.from_numpy(self.bwd.amax_history.copy()),
            extra_fp8_variables={"fp8_checkpoint": True, "num_gemms": 3},
        )

    def set_extra_state(self, state: Any) -> None:
        """Load TE's format (a delayed-scaling pickle needs ``NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1``,
        as in TE) or a dict of ``fwd_scale``, ``fwd_amax_history``, ``bwd_scale``, ``bwd_amax_history``."""
        from ..._extra_state_te import decode_te_extra_state

        if state is None or (isinstance(state, dict) and not state):
            return
        if isinstance(state, dict):
            keys = ("fwd_scale", "fwd_amax_history", "bwd_scale", "bwd_amax_history")
            if set(state) != set(keys):
                raise RuntimeError(f"DotProductAttention: _extra_state has keys {sorted(state)}; expected {list(keys)}")
            arrays = [state[k] for k in keys]
            for k, a in zip(keys, arrays, strict=True):
                if len(getattr(a, "shape", ())) != (1 if k.endswith("scale") else 2):
                    raise RuntimeError(f"DotProductAttention: _extra_state[{k!r}] must be a tensor; got {a!r:.80}")
            recipe = None
        else:
            te_state = decode_te_extra_state(state, "DotProductAttention")
            if te_state is None or te_state.scale_fwd is None:
                return
            arrays = [te_state.scale_fwd, te_state.amax_history_fwd, te_state.scale_bwd, te_state.amax_history_bwd]
            recipe = te_state.recipe if isinstance(te_state.recipe, DelayedScaling) else None
        if tuple(arrays[0].shape) != (9,) or tuple(arrays[2].shape) != (6,):
            raise RuntimeError(
                "DotProductAttention: _extra_state holds "
                f"{tuple(arrays[0].shape)} forward / {tuple(arrays[2].shape)} backward scales; expected (9,) / (6,)"
            )
        hist_len = arrays[1].shape[0]
        if recipe is None or recipe.amax_history_len != hist_len:
            recipe = self.fwd.recipe if self.fwd is not None else DelayedScaling(amax_history_len=hist_len)
            if recipe.amax_history_len != hist_len:
                recipe = DelayedScaling(amax_history_len=hist_len)
        self._ensure_state(recipe)
        f_s, f_h, b_s, b_h = arrays
        try:
            load_state_dicts(
                [(self.fwd, {"scale": f_s, "amax_history": f_h}), (self.bwd, {"scale": b_s, "amax_history": b_h})]
            )
        except (TypeError, ValueError) as exc:
            raise RuntimeError(f"DotProductAttention: _extra_state: {exc}") from None

    def _quantizers(self, recipe: Recipe) -> dict[str, Quantizer | None]:
        fwd_fmt, bwd_fmt = tensor_format(recipe.fp8_format, True), tensor_format(recipe.fp8_format, False)
        if isinstance(recipe, DelayedScaling):
            self._ensure_state(recipe)
            f, b = self.fwd, self.bwd
            return {
                "qkv": Quantizer("delayed", fwd_fmt, f, META_QKV),
                "s": Quantizer("delayed", fwd_fmt, f, META_S),
                "o": Quantizer("delayed", fwd_fmt, f, META_O),
                "do": Quantizer("delayed", bwd_fmt, b, META_DO),
                "dp": Quantizer("delayed", bwd_fmt, b, META_DP),
                "dqkv": Quantizer("delayed", bwd_fmt, b, META_DQKV),
            }
        if isinstance(recipe, Float8CurrentScaling):
            self._ensure_state(dpa_ds_recipe(recipe))
            return {
                "qkv": Quantizer("current", fwd_fmt),
                "s": Quantizer("delayed", fwd_fmt, self.fwd, META_S),
                "o": None,  # NVTE_DPA_FP8CS_O_in_F16=1 (TE's default): O stays in high precision
                "do": Quantizer("current", bwd_fmt),
                "dp": Quantizer("delayed", bwd_fmt, self.bwd, META_DP),
                "dqkv": None,
            }
        if isinstance(recipe, MXFP8BlockScaling):
            mx_soft = self.mxfp8_softmax == "mxfp8"
            return {
                "qkv": Quantizer("mxfp8", fwd_fmt),
                "s": Quantizer("mxfp8", fwd_fmt) if mx_soft else None,
                "o": None,
                "do": Quantizer("mxfp8", bwd_fmt),
                "dp": Quantizer("mxfp8", bwd_fmt) if mx_soft else None,
                "dqkv": None,
            }
        raise AssertionError(f"FP8 attention is not supported for {type(recipe).__name__}.")

    # -- forward --------------------------------------------------------------------------------------
    def forward(
        self,
        query_layer: torch.Tensor,
        key_layer: torch.Tensor,
        value_layer: torch.Tensor,
        attention_mask: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None,
        qkv_format: str | None = None,
        cu_seqlens_q: torch.Tensor | None = None,
        cu_seqlens_kv: torch.Tensor | None = None,
        cu_seqlens_q_padded: torch.Tensor | None = None,
        cu_seqlens_kv_padded: torch.Tensor | None = None,
        max_seqlen_q: int | None = None,
        max_seqlen_kv: int | None = None,
        attn_mask_type: str | None = None,
        window_size: tuple[int, int] | None = None,
        bottom_right_diagonal: bool | None = None,
        checkpoint_core_attention: bool = False,
        core_attention_bias_type: str = "no_bias",
        core_attention_bias: torch.Tensor | None = None,
        alibi_slopes: torch.Tensor | None = None,
        fast_zero_fill: bool = True,
        inference_params: Any = None,
        pad_between_seqs: bool | None = None,
        fp8_output: bool = False,
    ) -> torch.Tensor:
        if inference_params is not None:
            raise NotImplementedError("fp8sim does not emulate KV caching (inference_params)")
        q, k, v = query_layer, key_layer, value_layer
        if not (q.dtype == k.dtype == v.dtype):
            raise AssertionError("Queries, keys and values must have the same data type!")
        if k.shape[:-1] != v.shape[:-1]:
            raise AssertionError("Keys and values must have the same batch size, sequence length and number of heads!")
        if q.shape[-1] != k.shape[-1]:
            raise AssertionError("Queries and keys must have the same head dimension!")
        if q.shape[-1] != self.hidden_size_per_attention_head_k:
            raise AssertionError(
                f"Keys have head_dim = {q.shape[-1]}, but expected head_dim = {self.hidden_size_per_attention_head_k}!"
            )
        if v.shape[-1] != self.hidden_size_per_attention_head_v:
            raise AssertionError(
                f"Values have head_dim = {v.shape[-1]}, but expected head_dim ="
                f" {self.hidden_size_per_attention_head_v}!"
            )
        if k.shape[-2] != self.num_gqa_groups_per_partition:
            raise AssertionError(
                f"Keys and values must have num_gqa_group = {self.num_gqa_groups_per_partition} heads! "
                f"Found {k.shape[-2]}."
            )
        if q.shape[-2] != self.num_attention_heads // self.tp_size:
            raise AssertionError(
                f"Queries must have num_attention_heads = {self.num_attention_heads // self.tp_size} heads! "
                f"Found {q.shape[-2]}."
            )
        mask_type = self.attn_mask_type if attn_mask_type is None else utils.normalize_mask_type(attn_mask_type)
        window = utils.check_set_window_size(mask_type, self.window_size if window_size is None else window_size)
        brd = self.bottom_right_diagonal if bottom_right_diagonal is None else bottom_right_diagonal
        if mask_type in ("causal", "padding_causal"):
            brd = False
        if brd is None or mask_type in ("causal_bottom_right", "padding_causal_bottom_right"):
            brd = True
        fmt = self.qkv_format if qkv_format is None else qkv_format
        if fmt not in utils.QKVFormats:
            raise AssertionError("DotProductAttention only supports qkv_format = {'sbhd', 'bshd', 'thd'}!")
        if core_attention_bias_type not in utils.AttnBiasTypes:
            raise AssertionError(
                f"core_attention_bias_type must be one of {', '.join(utils.AttnBiasTypes)};"
                f" got {core_attention_bias_type!r}"
            )
        if alibi_slopes is not None and core_attention_bias_type != "alibi":
            raise AssertionError("core_attention_bias_type must be alibi in order to use alibi_slopes!")
        if core_attention_bias_type == "alibi" and core_attention_bias is not None:
            raise AssertionError("core_attention_bias must be None when core_attention_bias_type is alibi!")
        if core_attention_bias_type in ("pre_scale_bias", "post_scale_bias") and core_attention_bias is None:
            raise AssertionError("core_attention_bias should not be None!")

        thd = None
        if fmt == "thd":
            qb, kb, vb, thd = padding.thd_inputs(
                self.attention_type,
                q,
                k,
                v,
                mask_type,
                cu_seqlens_q,
                cu_seqlens_kv,
                cu_seqlens_q_padded,
                cu_seqlens_kv_padded,
                max_seqlen_q,
                max_seqlen_kv,
            )
            attention_mask = thd["mask"]
        else:
            if not all(x.dim() == 4 for x in (q, k, v)):
                raise AssertionError(f"Queries, keys and values must be 4D tensors when qkv_format={fmt!r}!")
            qb, kb, vb = (utils.to_bhsd(x, fmt) for x in (q, k, v))
            if "padding" in mask_type and attention_mask is None:
                attention_mask = padding.padding_mask_from_cu_seqlens(
                    self.attention_type, qb, kb, cu_seqlens_q, cu_seqlens_kv
                )
        b, _, sq, _ = qb.shape
        skv = kb.shape[2]
        if "padding" in mask_type:
            padding.check_padding_mask(self.attention_type, attention_mask, b, sq, skv)
        elif mask_type == "arbitrary":
            if attention_mask is None:
                raise AssertionError("attention_mask must be given for attn_mask_type='arbitrary'")
        else:
            attention_mask = None
        mask, seq_q, seq_kv = utils.get_full_mask(sq, skv, mask_type, attention_mask, window, self.attention_type, brd)
        bias = None
        if core_attention_bias_type == "alibi":
            padded = "padding" in mask_type
            bias = utils.get_alibi_bias(
                qb.shape[1], sq, skv, alibi_slopes, brd, seq_q if padded else None, seq_kv if padded else None
            )
        elif core_attention_bias_type != "no_bias":
            bias = core_attention_bias.detach()
        cfg = AttentionConfig(
            self.softmax_scale, mask, bias, core_attention_bias_type, self.attention_dropout if self.training else 0.0
        )
        trainable = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        self._configure_fp8(
            cfg, core_attention_bias_type, sq, skv, qb.shape[-1], vb.shape[-1], trainable, bool(fp8_output)
        )
        fp8_io = cfg.qkv is not None and cfg.qkv.kind != "mxfp8" and thd is None
        hs = [handoff_of(t) for t in (q, k, v)] if fp8_io else [None]
        if all(h is not None for h in hs):  # FP8 Q, K, V (fp8_mha): their codes and scales as they are
            to = lambda t: utils.to_bhsd(t, fmt)  # noqa: E731
            cfg.qkv_in = tuple(Operand(None, h.fmt, to(h.vals), to(h.codes), h.sinv) for h in hs)
            if cfg.dqkv is not None:
                cfg.dqkv_out = lambda d: send_dqkv(hs, d, fmt)
        # its delayed-scaling state, stashed/replayed under te.checkpoint; dropout in the tracker fork (TE)
        with _replay_fp8_state(self, self), dropout_fork(self.rng_states_tracker, self.attention_dropout):
            out = attention(qb, kb, vb, cfg)
        if "padding" in mask_type:  # padded query rows are zero
            out = out.masked_fill(mask.all(dim=-1, keepdim=True), 0.0)
        out = out.to(q.dtype)
        if thd is not None:
            return utils.bhsd_to_thd(out, thd["cu_q"], thd["off_q"], q.shape[0])
        out = utils.from_bhsd(out, fmt)
        if fp8_output and fp8_io:
            out = attach_fp8_output(out, cfg, fmt, qb.shape[1])
        return out

    def _configure_fp8(
        self,
        cfg: AttentionConfig,
        bias_type: str,
        sq: int,
        skv: int,
        dqk: int,
        dv: int,
        trainable: bool = True,
        fp8_output: bool = False,
    ) -> None:
        st = current_state()
        if not st.enabled or st.calibrating:
            if not st.enabled:
                self._fp8_forward_off()
            return
        recipe = get_recipe()
        if not (recipe.fp8_dpa or recipe.fp8_mha):
            return
        if bias_type != "no_bias":
            raise NotImplementedError("fp8sim's FP8 attention emulates core_attention_bias_type='no_bias' only")
        self._init_fp8_metadata(recipe, st.group)  # TE init_fp8_metadata: fp8_meta's recipe states
        self._custom_scalers, o_cast = None, None
        if recipe.custom():  # TE: the flow follows the QKV slot's quantizer class
            from .custom_recipe import custom_attention_quantizers, custom_scalers

            kind, quantizers, o_cast = custom_attention_quantizers(self, recipe, self.mxfp8_softmax == "mxfp8")
            self._custom_scalers = custom_scalers(self)
            mx = kind == "mxfp8"
        else:
            mx, quantizers = isinstance(recipe, MXFP8BlockScaling), None
        if fp8_output and mx:
            raise NotImplementedError("fp8sim's DotProductAttention returns O in high precision under MXFP8")
        if mx and (sq % 128 or skv % 128 or dqk % 32 or dv % 32):
            raise AssertionError(
                "MXFP8 quantization requires s_q % 128 == 0, s_kv % 128 == 0, d_qk % 32 == 0, d_v % 32"
                f" == 0. Found s_q={sq}, s_kv={skv}, d_qk={dqk}, d_v={dv}."
            )
        if recipe.fp8_format == Format.E5M2:
            raise AssertionError('DotProductAttention only supports "E4M3" and "E5M2" FP8 data types.')
        check_bf16_options(self.pv_bf16, self.dqkv_bf16, type(recipe).__name__, mx)
        for name, qz in (quantizers if quantizers is not None else self._quantizers(recipe)).items():
            setattr(cfg, name, qz)
        if o_cast is not None:
            cfg.saved["o_cast"] = o_cast
        cfg.pv_bf16, cfg.dqkv_bf16 = self.pv_bf16, self.dqkv_bf16
        cfg.bwd_fp8 = bool(int(os.getenv("NVTE_FP8_DPA_BWD", "1")))
        acc = st.accumulator if st.accumulator is not None else self.accumulator
        # cuDNN's accumulation inside attention is not documented: a device name, or a device profile (whose
        # split-K tables are cuBLASLt's, not cuDNN's), picks the device's fast preset, unsplit
        cfg.accumulator = _attention_preset(acc)
        cfg.site, cfg.profile = self, _profile_name(acc)
        self.group = st.group
        if _register(self, trainable):  # the region's first trainable FP8 module: its backward runs last
            region = st.modules
            cfg.on_backward_end = lambda: [m._update_backward_scales() for m in list(region)]

    def extra_repr(self) -> str:
        return (
            f"num_attention_heads={self.num_attention_heads}, kv_channels={self.hidden_size_per_attention_head_k}, "
            f"num_gqa_groups={self.num_gqa_groups}, qkv_format={self.qkv_format}, attn_mask_type={self.attn_mask_type}"
        )


def _attention_preset(acc: Any) -> Any:
    """The accumulator of FP8 attention's GEMMs (cuDNN's fused kernels, not cuBLAS) for the region's or the
    module's ``accumulator``: a device or a profile gives its fast preset."""
    from ....gemm.profiles import get_profile, is_profile

    if is_profile(acc):
        return get_profile(acc).fast
    return {"hopper": "hopper_fast", "ada": "ada_fast", "blackwell": "blackwell"}.get(acc, acc)


def _profile_name(acc: Any) -> str | None:
    from ....gemm.profiles import get_profile, is_profile

    return get_profile(acc).name if is_profile(acc) else None
