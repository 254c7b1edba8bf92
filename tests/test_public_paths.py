"""Every public import path users had before the loose modules got rooms (issue 25) still imports,
and an old path is the very module of its new home (so ``monkeypatch.setattr`` and pickles agree).

The list is the tree of ``fp8sim`` at commit c469a68 (every module without a ``_`` in its path);
``fp8sim.testing.compare`` is left out: that name is the function ``compare`` (the module, now
``fp8sim.testing.assertions``, was shadowed by it).
"""

from __future__ import annotations

import importlib
import pickle
import subprocess
import sys
import warnings

import pytest

from fp8sim.testing.oracles import require

BEFORE = """
fp8sim fp8sim.accelerate fp8sim.accelerate.ao fp8sim.accelerate.fsdp2 fp8sim.accelerate.handlers
fp8sim.accelerate.launch fp8sim.accelerate.prepare fp8sim.accelerate.recipes fp8sim.accelerate.transformer_engine
fp8sim.cast fp8sim.cast.e8m0 fp8sim.cast.numpy_backend fp8sim.cast.philox fp8sim.cast.ptx_sr fp8sim.cast.te_nvfp4_sr
fp8sim.cast.torch_backend fp8sim.cli fp8sim.conformance fp8sim.conventions fp8sim.distributed
fp8sim.distributed.collectives fp8sim.distributed.groups fp8sim.distributed.spawn fp8sim.distributed.study
fp8sim.formats fp8sim.gemm fp8sim.gemm.accumulators fp8sim.gemm.emulate fp8sim.gemm.grouped fp8sim.gemm.instructions
fp8sim.gemm.profiles fp8sim.gemm.scaled_mm fp8sim.gemm.splitk fp8sim.gemm.study fp8sim.native fp8sim.native.capture
fp8sim.native.compare fp8sim.native.fileformat fp8sim.native.hardware fp8sim.native.infer_split fp8sim.native.schema
fp8sim.native.suite fp8sim.pytorch fp8sim.pytorch.attention fp8sim.pytorch.attention.dot_product_attention
fp8sim.pytorch.attention.dot_product_attention.backends
fp8sim.pytorch.attention.dot_product_attention.dot_product_attention
fp8sim.pytorch.attention.dot_product_attention.fp8_boundaries fp8sim.pytorch.attention.dot_product_attention.utils
fp8sim.pytorch.attention.multi_head_attention fp8sim.pytorch.attention.rope fp8sim.pytorch.constants
fp8sim.pytorch.cpp_extensions fp8sim.pytorch.cpp_extensions.gemm fp8sim.pytorch.distributed fp8sim.pytorch.module
fp8sim.pytorch.module.base fp8sim.pytorch.module.grouped_linear fp8sim.pytorch.module.layernorm
fp8sim.pytorch.module.layernorm_linear fp8sim.pytorch.module.layernorm_mlp fp8sim.pytorch.module.linear
fp8sim.pytorch.module.rmsnorm fp8sim.pytorch.quantization fp8sim.pytorch.tensor fp8sim.pytorch.tensor.custom_recipe
fp8sim.pytorch.tensor.float8_blockwise_tensor fp8sim.pytorch.tensor.float8_tensor fp8sim.pytorch.tensor.identity_tensor
fp8sim.pytorch.tensor.mxfp8_tensor fp8sim.pytorch.tensor.nvfp4_tensor fp8sim.pytorch.tensor.quantized_tensor
fp8sim.pytorch.tensor.storage fp8sim.pytorch.tensor.storage.float8_blockwise_tensor_storage
fp8sim.pytorch.tensor.storage.float8_tensor_storage fp8sim.pytorch.tensor.storage.identity_tensor_storage
fp8sim.pytorch.tensor.storage.mxfp8_tensor_storage fp8sim.pytorch.tensor.storage.nvfp4_tensor_storage
fp8sim.pytorch.tensor.storage.quantized_tensor_storage fp8sim.pytorch.tensor.utils fp8sim.pytorch.transformer
fp8sim.pytorch.utils fp8sim.recipe fp8sim.report fp8sim.scaling fp8sim.scaling.amax fp8sim.scaling.block
fp8sim.scaling.current fp8sim.scaling.delayed fp8sim.scaling.mx fp8sim.scaling.nvfp4 fp8sim.scaling.nvfp4_4over6
fp8sim.scaling.nvfp4_te_sr fp8sim.scaling.packing fp8sim.scaling.quantized fp8sim.scaling.swizzle fp8sim.shim
fp8sim.study fp8sim.testing fp8sim.testing.emulator fp8sim.testing.pytest_plugin fp8sim.testing.strategies
fp8sim.torchao fp8sim.torchao.config fp8sim.torchao.float8_linear_utils fp8sim.torchao.fsdp fp8sim.torchao.linear
fp8sim.torchao.moe fp8sim.torchao.mx_linear fp8sim.torchao.nvfp4_linear fp8sim.torchao.tp
""".split()

MOVED = {
    "fp8sim.shim": "fp8sim.run.shim",
    "fp8sim.study": "fp8sim.report.training_study",
    "fp8sim.conformance": "fp8sim.report.conformance",
    "fp8sim.conventions": "fp8sim.cast.conventions",
    "fp8sim.distributed": "fp8sim.collectives",
    "fp8sim.distributed.collectives": "fp8sim.collectives.wire",
    "fp8sim.distributed.groups": "fp8sim.collectives.groups",
    "fp8sim.distributed.spawn": "fp8sim.collectives.spawn",
    "fp8sim.distributed.study": "fp8sim.report.distributed_study",
}

# public names users reach through a path that moved (README, notebooks, docs)
NAMES = {
    "fp8sim": ["CONVENTIONS", "Convention", "get_convention", "encode", "decode", "quantize", "FORMATS"],
    "fp8sim.conventions": ["CONVENTIONS", "Convention", "get_convention"],
    "fp8sim.shim": ["install", "uninstall", "is_installed", "EMULATED_TE_VERSION", "NotEmulatedError"],
    "fp8sim.report": ["formats_table", "write_compare_report", "build_default_report", "publish_dir", "DEFAULT_OUT"],
    "fp8sim.study": ["StudyResult", "run_study", "write_study", "plot_losses", "STUDY_RECIPES"],
    "fp8sim.conformance": ["run", "format_table", "count_mismatches"],
    "fp8sim.distributed": ["all_gather_into_tensor", "all_gather", "reduce_scatter_tensor", "ParallelLayout"],
    "fp8sim.distributed.spawn": ["run_ranks", "RankFailure"],
    "fp8sim.distributed.study": ["run_distributed_study", "write_distributed_study"],
    "fp8sim.testing": ["compare", "assert_bit_exact", "assert_within_ulp", "ComparisonResult"],
    "fp8sim.recipe": ["DelayedScaling", "Float8CurrentScaling", "MXFP8BlockScaling", "Format"],
}

_NEEDS_TORCH = (
    "fp8sim.cast.torch_backend",
    "fp8sim.pytorch",
    "fp8sim.torchao",
    "fp8sim.accelerate",
    "fp8sim.distributed",
    "fp8sim.collectives",
)


def _import(path: str):  # noqa: ANN202
    if path.startswith(_NEEDS_TORCH):
        require("torch")
    if path.startswith("fp8sim.torchao") or path.startswith("fp8sim.accelerate"):
        require(path.split(".")[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return importlib.import_module(path)


@pytest.mark.parametrize("path", BEFORE)
def test_every_public_module_path_of_before_still_imports(path: str) -> None:
    mod = _import(path)
    if path in MOVED:
        assert mod is importlib.import_module(MOVED[path]), f"{path} is not {MOVED[path]}"
        assert mod.__name__ == MOVED[path] and mod.__spec__.name == MOVED[path]


@pytest.mark.parametrize("path", list(NAMES))
def test_public_names_under_old_paths(path: str) -> None:
    mod = _import(path)
    missing = [n for n in NAMES[path] if not hasattr(mod, n)]
    assert not missing, f"{path} lacks {missing}"


def test_old_module_names_are_attributes_of_fp8sim_after_a_plain_import() -> None:
    """``import fp8sim; fp8sim.conventions.X`` worked (``__init__`` imported it); it still does."""
    code = "import fp8sim; print(fp8sim.conventions.get_convention('ml_dtypes').name)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "ml_dtypes"
    import fp8sim

    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        fp8sim.nonexistent  # noqa: B018


def test_old_distributed_path_is_deprecated_and_the_new_ones_are_silent() -> None:
    require("torch")
    code = "import warnings; warnings.simplefilter('error'); import fp8sim.{}"
    for path, fails in (("distributed", True), ("collectives", False), ("shim", False), ("study", False)):
        r = subprocess.run([sys.executable, "-c", code.format(path)], capture_output=True, text=True)
        assert (r.returncode != 0) == fails, (path, r.stderr)
        if fails:
            assert "DeprecationWarning: fp8sim.distributed is now fp8sim.collectives" in r.stderr


def test_no_second_copy_of_a_moved_package_submodule() -> None:
    """``fp8sim.distributed.wire`` (the old package name, a new submodule) is the new module, not a
    second copy loaded from the same file."""
    require("torch")
    new = importlib.import_module("fp8sim.collectives.wire")
    assert _import("fp8sim.distributed.wire") is new


def test_objects_pickled_under_the_old_path_load() -> None:
    from fp8sim.report.training_study import StudyResult

    blob = pickle.dumps(StudyResult(["fp32"]), protocol=0).replace(b"fp8sim.report.training_study", b"fp8sim.study")
    assert b"fp8sim.study" in blob
    assert pickle.loads(blob) == StudyResult(["fp32"])


def test_the_root_holds_only_its_few_modules() -> None:
    """Issue 25: ``fp8sim/`` keeps ``__init__``, ``__main__``, ``formats`` and ``cli`` as files; everything
    else lives in a room (a package)."""
    from pathlib import Path

    import fp8sim

    root = Path(fp8sim.__file__).parent
    files = sorted(p.name for p in root.glob("*.py"))
    assert files == ["__init__.py", "__main__.py", "cli.py", "formats.py"]
