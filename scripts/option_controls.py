"""Negative controls of the user-settable options (issue 30.2): plant each option's drop, run its tests.

    python scripts/option_controls.py              # every plant, one after the other (tens of minutes)
    python scripts/option_controls.py accumulator  # the plants whose option name contains "accumulator"
    python scripts/option_controls.py --list

Each plant replaces the code that consumes one option with what it would do if the option were ignored (or
replaced by its default) and runs the named tests; a control holds when they fail.  The plants are made in a
temporary copy of the checkout (its ``fp8sim/`` and ``tests/``), never in the checkout itself.  The table
printed at the end is the one in ``reports/mutation.md``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Plant:
    option: str  # what a user sets
    path: str  # the file that consumes it
    old: str  # the consuming code (unique in the file)
    new: str  # the code with the option ignored / replaced by its default
    tests: tuple[str, ...]  # pytest arguments: files and -k selections


_MOD = "fp8sim/pytorch/module/"
_DPA = "fp8sim/pytorch/attention/dot_product_attention/dot_product_attention.py"
_ACC = ("tests/test_pytorch_module_accumulators.py",)

PLANTS = [
    # -- TE modules ---------------------------------------------------------------------------------------------
    Plant(
        "Linear(accumulator=)",
        _MOD + "base.py",
        "acc = st.accumulator if st.accumulator is not None else self.accumulator",
        "acc = st.accumulator",
        _ACC,
    ),
    Plant(
        "autocast(accumulator=) for modules",
        _MOD + "base.py",
        "acc = st.accumulator if st.accumulator is not None else self.accumulator",
        "acc = self.accumulator",
        _ACC,
    ),
    Plant(
        "recipe.fp8_gemm_fprop/dgrad/wgrad",
        _MOD + "_gemm_plan.py",
        "return bool(params.use_split_accumulator)",
        "return _SPLIT[which]",
        _ACC,
    ),
    Plant(
        "TE split constants (recipes without fp8_gemm_*)",
        _MOD + "_gemm_plan.py",
        '_SPLIT = {"fprop": False, "dgrad": True, "wgrad": True}',
        '_SPLIT = {"fprop": False, "dgrad": True, "wgrad": False}',
        _ACC,
    ),
    Plant(
        "accumulator='exact' (vs float32 sum)",
        _MOD + "_gemm.py",
        "    per_tensor = a.vals is not None and b.vals is not None\n",
        "    per_tensor = a.vals is not None and b.vals is not None\n    accumulator = None\n",
        _ACC,
    ),
    Plant(
        "return_bias (Linear)",
        _MOD + "linear.py",
        "        if self.return_bias:\n            return out, None",
        "        if False:\n            return out, None",
        ("tests/test_pytorch_module_api.py", "tests/test_pytorch_modules.py", "tests/test_pytorch_grouped_linear.py"),
    ),
    Plant(
        "return_bias (bias not applied)",
        _MOD + "base.py",
        "self.apply_bias = self.use_bias and not self.return_bias",
        "self.apply_bias = self.use_bias",
        ("tests/test_pytorch_module_api.py", "tests/test_pytorch_modules.py", "tests/test_pytorch_grouped_linear.py"),
    ),
    Plant(
        "zero_centered_gamma",
        _MOD + "_normalization.py",
        "    if zero_centered_gamma:\n        g = g + 1",
        "    if False:\n        g = g + 1",
        ("tests/test_pytorch_module_semantics.py", "tests/test_pytorch_modules.py", "-k", "gamma or norm"),
    ),
    Plant(
        "zero_centered_gamma (init)",
        _MOD + "_params.py",
        "init_fn=init_method_constant(float(not zero_centered_gamma))",
        "init_fn=init_method_constant(1.0)",
        ("tests/test_pytorch_module_api.py", "tests/test_pytorch_modules.py", "tests/test_pytorch_module_semantics.py"),
    ),
    Plant(
        "normalization='RMSNorm'",
        _MOD + "_normalization.py",
        '    if normalization == "LayerNorm":',
        "    if True:",
        ("tests/test_pytorch_module_semantics.py", "tests/test_pytorch_modules.py"),
    ),
    Plant(
        "activation",
        _MOD + "layernorm_mlp.py",
        "self._act = activation_fn(activation, activation_params)",
        'self._act = activation_fn("gelu" if activation not in ("geglu", "reglu", "sreglu", "swiglu", "qgeglu", '
        '"glu", "clamped_swiglu") else "geglu", activation_params)',
        ("tests/test_pytorch_module_semantics.py", "-k", "activation"),
    ),
    Plant(
        "activation_params (clamped_swiglu)",
        _MOD + "_activations.py",
        "        return lambda x: _clamped_swiglu(x.float(), **params)",
        "        return lambda x: _clamped_swiglu(x.float())",
        ("tests/test_pytorch_module_semantics.py", "tests/test_pytorch_modules.py", "tests/test_pytorch_module_api.py"),
    ),
    Plant(
        "recipe.backward_override",
        _MOD + "_linear_function.py",
        'override = getattr(recipe, "backward_override", None)',
        "override = None",
        ("tests/test_pytorch_module_semantics.py", "-k", "override"),
    ),
    Plant(
        "Linear(fp8_output=)",
        _MOD + "linear.py",
        "        out = attach_output(self, out, fp8_io)\n        if self.return_bias:\n            return out, None",
        "        if self.return_bias:\n            return out, None",
        ("tests/test_pytorch_fp8_boundaries_current.py",),
    ),
    Plant(
        "Linear(fp8_grad=)",
        _MOD + "linear.py",
        "fp8_io = fp8_boundaries(inp, bool(fp8_output), bool(fp8_grad))",
        "fp8_io = fp8_boundaries(inp, bool(fp8_output), False)",
        ("tests/test_pytorch_fp8_boundaries_current.py",),
    ),
    Plant(
        "sequence_parallel",
        _MOD + "base.py",
        "tp_size > 1 and sequence_parallel, tp_group, tp_size",
        "tp_size > 1 and False, tp_group, tp_size",
        (  # the rule in one process; what the flag does in the 2-rank spawn
            "tests/test_distributed_te_tp_local.py",
            "tests/test_distributed_te_tp.py",
            "-k",
            "follow_te or (megatron and current)",
        ),
    ),
    Plant(
        "LayerNormLinear(return_layernorm_output=)",
        _MOD + "layernorm_linear.py",
        "        if self.return_layernorm_output:\n            outs += (ln,)",
        "        if False:\n            outs += (ln,)",
        ("tests/test_pytorch_modules.py", "tests/test_pytorch_module_api.py"),
    ),
    # -- recipes ---------------------------------------------------------------------------------------------------
    Plant(
        "Float8CurrentScaling fp8_quant_*.power_2_scale",
        _MOD + "_operands.py",
        "q = quantize_current_scaling(x.detach(), fmt, pow2=qp.power_2_scale, eps=qp.amax_epsilon)",
        "q = quantize_current_scaling(x.detach(), fmt, pow2=False, eps=qp.amax_epsilon)",
        ("tests/test_pytorch_fp8_boundaries_current.py", "tests/test_pytorch_tensor_quantizers.py"),
    ),
    Plant(
        "Float8CurrentScaling fp8_quant_*.amax_epsilon",
        _MOD + "_operands.py",
        "q = quantize_current_scaling(x.detach(), fmt, pow2=qp.power_2_scale, eps=qp.amax_epsilon)",
        "q = quantize_current_scaling(x.detach(), fmt, pow2=qp.power_2_scale, eps=0.0)",
        (
            "tests/test_pytorch_modules.py",
            "tests/test_pytorch_tensor_quantizers.py",
            "tests/test_recipe.py",
            "tests/test_pytorch_fp8_boundaries_current.py",
        ),
    ),
    Plant(
        "Float8CurrentScaling.fp8_format",
        _MOD + "_operands.py",
        "    fmt = tensor_format(recipe.fp8_format, forward)\n    if isinstance(recipe, DelayedScaling):",
        "    fmt = tensor_format(type(recipe)().fp8_format, forward)\n    if isinstance(recipe, DelayedScaling):",
        (
            "tests/test_pytorch_modules.py",
            "tests/test_pytorch_module_api.py",
            "tests/test_pytorch_tensor_quantizers.py",
            "tests/test_pytorch_fp8_boundaries_current.py",
        ),
    ),
    Plant(
        "DelayedScaling.margin",
        "fp8sim/scaling/delayed.py",
        "scaled_max = np.float32(self.fp8_max * np.float32(2.0**-self.recipe.margin))",
        "scaled_max = np.float32(self.fp8_max)",
        ("tests/test_scaling_delayed.py",),
    ),
    Plant(
        "DelayedScaling.amax_compute_algo",
        "fp8sim/scaling/delayed.py",
        'if self.recipe.amax_compute_algo == "most_recent":',
        "if False:",
        ("tests/test_scaling_delayed.py",),
    ),
    Plant(
        "DelayedScaling.amax_history_len",
        "fp8sim/scaling/delayed.py",
        "self.amax_history = np.zeros((self.recipe.amax_history_len, n), np.float32)",
        "self.amax_history = np.zeros((1024, n), np.float32)",
        ("tests/test_scaling_delayed.py",),
    ),
    Plant(
        "DelayedScaling.fp8_format",
        "fp8sim/scaling/delayed.py",
        "self.fmt = tensor_format(self.recipe.fp8_format, forward)",
        "self.fmt = tensor_format(Format.HYBRID, forward)",
        ("tests/test_scaling_delayed.py", "tests/test_pytorch_modules.py"),
    ),
    Plant(
        "Float8BlockScaling x/w/grad_block_scaling_dim",
        _MOD + "_operands.py",
        'dim = {"input": recipe.x_block_scaling_dim, "weight": recipe.w_block_scaling_dim}.get(',
        'dim = {"input": 1, "weight": 2}.get(',
        ("tests/test_pytorch_modules.py", "tests/test_pytorch_tensor_blockwise.py", "tests/test_recipe.py"),
    ),
    Plant(
        "MXFP8BlockScaling enable_2d_quantization",
        _MOD + "_operands.py",
        '        if kind == "weight" and getattr(recipe, "enable_2d_quantization", False):\n'
        "            q = quantize_mx_2d",
        "        if False:\n            q = quantize_mx_2d",
        ("tests/test_pytorch_module_semantics.py", "-k", "mxfp8"),
    ),
    Plant(
        "NVFP4BlockScaling disable_rht",
        "fp8sim/recipe/__init__.py",
        "self.fp4_quant_fwd_inp = QParams(random_hadamard_transform=not self.disable_rht)",
        "self.fp4_quant_fwd_inp = QParams(random_hadamard_transform=True)",
        ("tests/test_recipe.py", "tests/test_pytorch_modules.py", "tests/test_pytorch_tensor_quantizers.py"),
    ),
    Plant(
        "NVFP4BlockScaling disable_2d_quantization",
        "fp8sim/recipe/__init__.py",
        "self.fp4_quant_fwd_weight = QParams(fp4_2d_quantization=not self.disable_2d_quantization)",
        "self.fp4_quant_fwd_weight = QParams(fp4_2d_quantization=True)",
        ("tests/test_recipe.py", "tests/test_pytorch_modules.py", "tests/test_pytorch_tensor_quantizers.py"),
    ),
    Plant(
        "NVFP4BlockScaling disable_stochastic_rounding",
        "fp8sim/recipe/__init__.py",
        "stochastic_rounding=not self.disable_stochastic_rounding,",
        "stochastic_rounding=True,",
        ("tests/test_recipe.py", "tests/test_pytorch_modules.py", "tests/test_pytorch_tensor_quantizers.py"),
    ),
    # -- attention -------------------------------------------------------------------------------------------------
    Plant(
        "DotProductAttention(accumulator=)",
        _DPA,
        "acc = st.accumulator if st.accumulator is not None else self.accumulator",
        "acc = st.accumulator",
        ("tests/test_pytorch_attention_fp8.py",),
    ),
    Plant(
        "autocast(accumulator=) for attention",
        _DPA,
        "acc = st.accumulator if st.accumulator is not None else self.accumulator",
        "acc = self.accumulator",
        ("tests/test_pytorch_attention_fp8.py",),
    ),
    Plant(
        "DotProductAttention(softmax_scale=)",
        _DPA,
        "softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(self.hidden_size_per_attention_head_k)",
        "1.0 / math.sqrt(self.hidden_size_per_attention_head_k)",
        ("tests/test_pytorch_attention.py",),
    ),
    Plant(
        "DotProductAttention(attention_dropout=)",
        _DPA,
        "self.attention_dropout = attention_dropout",
        "self.attention_dropout = 0.0",
        ("tests/test_pytorch_attention.py",),
    ),
    Plant(
        "DotProductAttention(window_size=)",
        _DPA,
        "window = utils.check_set_window_size(mask_type, self.window_size if window_size is None else window_size)",
        "window = utils.check_set_window_size(mask_type, None)",
        ("tests/test_pytorch_attention.py",),
    ),
    Plant(
        "DotProductAttention(pv_bf16=, dqkv_bf16=)",
        _DPA,
        "cfg.pv_bf16, cfg.dqkv_bf16 = self.pv_bf16, self.dqkv_bf16",
        "cfg.pv_bf16, cfg.dqkv_bf16 = False, False",
        ("tests/test_pytorch_attention_causal_bf16.py",),
    ),
    Plant(
        "DotProductAttention forward(fp8_output=)",
        _DPA,
        "        if fp8_output and fp8_io:\n            out = attach_fp8_output(",
        "        if False:\n            out = attach_fp8_output(",
        ("tests/test_pytorch_attention_mha_fp8.py",),
    ),
    Plant(
        "recipe.fp8_mha (MultiheadAttention)",
        "fp8sim/pytorch/attention/multi_head_attention.py",
        "qkv = bool(recipe.fp8_mha) and rotary_pos_emb is None and ds",
        "qkv = False",
        ("tests/test_pytorch_attention_mha_fp8.py",),
    ),
    Plant(
        "recipe.fp8_dpa (MultiheadAttention)",
        "fp8sim/pytorch/attention/multi_head_attention.py",
        "dpa = bool(recipe.fp8_dpa or recipe.fp8_mha) and (ds or cs)",
        "dpa = bool(recipe.fp8_mha) and (ds or cs)",
        ("tests/test_pytorch_attention_mha_fp8.py",),
    ),
    Plant(
        "recipe.fp8_dpa / fp8_mha (DotProductAttention)",
        _DPA,
        "        if not (recipe.fp8_dpa or recipe.fp8_mha):",
        "        if True:",
        ("tests/test_pytorch_attention_fp8.py",),
    ),
    Plant(
        "DotProductAttention(attn_mask_type=)",
        _DPA,
        "self.attn_mask_type = utils.normalize_mask_type(attn_mask_type)",
        'self.attn_mask_type = utils.normalize_mask_type("causal")',
        ("tests/test_pytorch_attention.py",),
    ),
    Plant(
        "DotProductAttention forward(attn_mask_type=)",
        _DPA,
        "mask_type = self.attn_mask_type if attn_mask_type is None else utils.normalize_mask_type(attn_mask_type)",
        "mask_type = self.attn_mask_type",
        ("tests/test_pytorch_attention.py",),
    ),
    # -- scaled_mm -------------------------------------------------------------------------------------------------
    Plant(
        "scaled_mm(epilogue=)",
        "fp8sim/gemm/scaled_mm.py",
        '        if epilogue == "alpha":\n            return ((sa32 * sb32)',
        "        if True:\n            return ((sa32 * sb32)",
        ("tests/test_gemm_scaled_mm.py", "tests/test_gemm_profiles.py"),
    ),
    Plant(
        "scaled_mm(use_fast_accum=)",
        "fp8sim/gemm/scaled_mm.py",
        "acc = _pick_accumulator(accumulator, use_fast_accum, device)",
        "acc = _pick_accumulator(accumulator, False, device)",
        ("tests/test_gemm_scaled_mm.py",),
    ),
    Plant(
        "scaled_mm(device=)",
        "fp8sim/gemm/scaled_mm.py",
        "acc = _pick_accumulator(accumulator, use_fast_accum, device)",
        'acc = _pick_accumulator(accumulator, use_fast_accum, "hopper")',
        ("tests/test_gemm_scaled_mm.py", "tests/test_gemm_scaled_mm_checks.py"),
    ),
    Plant(
        "scaled_mm(scale_result=)",
        "fp8sim/gemm/scaled_mm.py",
        "sr = np.float32(1.0) if scale_result is None else np.asarray(_scale(scale_result), np.float32).reshape(())",
        "sr = np.float32(1.0)",
        ("tests/test_gemm_scaled_mm.py",),
    ),
    Plant(
        "scaled_mm(bias=)",
        "fp8sim/gemm/scaled_mm.py",
        "        d = (d + bvals).astype(np.float32)",
        "        d = d.astype(np.float32)",
        ("tests/test_gemm_scaled_mm.py",),
    ),
    Plant(
        "scaled_mm(split_k=)",
        "fp8sim/gemm/scaled_mm.py",
        "    split = check_split_k(split_k)\n",
        "    split = check_split_k(split_k) and None\n",
        ("tests/test_gemm_splitk.py",),
    ),
    Plant(
        "scaled_mm(profile=)",
        "fp8sim/gemm/scaled_mm.py",
        "    if profile is not None:\n        from .profiles import get_profile",
        "    if False:\n        from .profiles import get_profile",
        ("tests/test_gemm_profiles.py",),
    ),
    Plant(
        "scaled_mm(block_order=)",
        "fp8sim/gemm/scaled_mm.py",
        "d = _blockwise(ac, bc, fa, fb, acc, sa, sb, layout, tiling, block_order, on_torch)",
        "d = _blockwise(ac, bc, fa, fb, acc, sa, sb, layout, tiling, None, on_torch)",
        ("tests/test_gemm_block_tiling.py",),
    ),
    # -- torchao ---------------------------------------------------------------------------------------------------
    Plant(
        "Float8LinearConfig.round_scales_to_power_of_2",
        "fp8sim/torchao/linear.py",
        "pad, pow2 = config.pad_inner_dim, config.round_scales_to_power_of_2",
        "pad, pow2 = config.pad_inner_dim, False",
        ("tests/test_torchao_float8.py",),
    ),
    Plant(
        "Float8LinearConfig.pad_inner_dim",
        "fp8sim/torchao/linear.py",
        "pad, pow2 = config.pad_inner_dim, config.round_scales_to_power_of_2",
        "pad, pow2 = False, config.round_scales_to_power_of_2",
        ("tests/test_torchao_float8.py",),
    ),
    Plant(
        "CastConfig.scaling_granularity (axiswise)",
        "fp8sim/torchao/linear.py",
        "    axiswise = granularity is ScalingGranularity.AXISWISE\n",
        "    axiswise = False\n",
        ("tests/test_torchao_float8.py",),
    ),
    Plant(
        "MXFP8TrainingOpConfig.wgrad_with_hp",
        "fp8sim/torchao/mx_linear.py",
        "        if cfg.wgrad_with_hp:\n            grad_weight = torch.mm(go.t(), x)",
        "        if False:\n            grad_weight = torch.mm(go.t(), x)",
        ("tests/test_torchao_mx_training.py",),
    ),
    Plant(
        "MXFP8TrainingOpConfig.scale_calculation_mode",
        "fp8sim/torchao/mx_linear.py",
        "        mode, kern = cfg.scale_calculation_mode, cfg.kernel_preference\n        with torch.autocast(",
        "        mode, kern = ScaleCalculationMode.RCEIL, cfg.kernel_preference\n        with torch.autocast(",
        ("tests/test_torchao_mx_training.py",),
    ),
    Plant(
        "Float8GemmConfig.use_fast_accum (output)",
        "fp8sim/torchao/linear.py",
        '_GemmSpec(config.gemm_config_output.use_fast_accum, pad, pow2, acc, site, "fprop"),',
        '_GemmSpec(False, pad, pow2, acc, site, "fprop"),',
        ("tests/test_torchao_float8.py",),
    ),
]


def _run(p: Plant, copy: Path) -> str:
    path = copy / p.path
    text = path.read_text("utf-8")
    if text.count(p.old) != 1:
        return f"NOT PLANTED ({text.count(p.old)} matches)"
    path.write_text(text.replace(p.old, p.new), "utf-8")
    try:  # python -m pytest puts the copy's folder first on sys.path: its fp8sim is imported
        cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:randomly", "-n", "0", *p.tests]
        rc = subprocess.run(cmd, cwd=copy, capture_output=True, text=True).returncode
    finally:
        path.write_text(text, "utf-8")
    return {0: "SURVIVED (no test fails)", 1: "killed"}.get(rc, f"error (pytest exit {rc})")


def _copy(dest: Path) -> Path:
    for name in ("fp8sim", "tests", "docs", "pyproject.toml", "README.md", "mkdocs.yml"):
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        elif src.exists():
            shutil.copy2(src, dest / name)
    return dest


def main(argv: list[str]) -> int:
    if "--list" in argv:
        for p in PLANTS:
            print(f"{p.option:48s} {p.path}")
        return 0
    chosen = [p for p in PLANTS if not argv or any(a.lower() in p.option.lower() for a in argv)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="fp8sim-controls-") as tmp:
        copy = _copy(Path(tmp))
        for p in chosen:
            verdict = _run(p, copy)
            rows.append((p, verdict))
            print(f"{verdict:28s} {p.option}", flush=True)
    print("\n| option | file | planted drop | tests | result |\n|---|---|---|---|---|")
    for p, verdict in rows:
        new = p.new.strip().splitlines()[0][:60]
        print(f"| {p.option} | `{p.path}` | `{new}` | {' '.join(p.tests)} | {verdict} |")
    return 0 if all(v == "killed" for _, v in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
