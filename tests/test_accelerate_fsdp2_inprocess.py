"""``prepare_fp8(..., fsdp_plugin=...)`` and ``fp8sim.accelerate.fsdp2`` in the pytest process (issue 30).

The two-rank runs (``test_distributed_accelerate.py``) prepare in spawned ranks, which mutation testing does
not see; here a world of one (gloo over a ``HashStore``, torn down after each test) runs accelerate 1.15's
own ``FullyShardedDataParallelPlugin`` and ``fsdp2_prepare_model`` through fp8sim, checked against
accelerate's semantics: ``AcceleratorState`` sets the plugin's mixed precision unless it is "no"
(``state.py``), ``fsdp2_prepare_model`` upcasts trainable non-float32 parameters to float32 master weights
under mixed precision (``utils/fsdp_utils.py``) and loads ``cpu_ram_efficient_loading`` weights from the main
process, ``_prepare_ao`` registers the float8 all-gather scale precompute as an optimizer step post-hook
(``accelerator.py``), and the optimizer ends up holding the sharded parameters, group by group, in order
(``fsdp2_switch_optimizer_parameters``).  A ``fake`` process group of two plays rank 1 for the main-process
rule.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import warnings
from types import SimpleNamespace
from typing import Any

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")
dist = require("torch.distributed")
autils = require("accelerate.utils")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

from _outcomes import gloo_world_of_one  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.fsdp import FSDPModule  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

import fp8sim.accelerate as fa  # noqa: E402
from fp8sim.accelerate import fsdp2  # noqa: E402
from fp8sim.torchao import Float8Linear  # noqa: E402

_FSDP1 = "fsdp_plugin with fsdp_version={}: fp8sim emulates FSDP2 only (FullyShardedDataParallelPlugin(fsdp_version=2))"
# accelerate 1.15 accelerator.py, Accelerator.prepare (FSDP2 without an optimizer)
_NO_OPTIMIZER = (
    "When using FSDP2, a model and optimizer must be passed together to `Accelerator.prepare()` as the optimizer "
    "needs to have its parameters modified after the model is converted."
)
# accelerate 1.15 utils/fsdp_utils.py, fsdp2_switch_optimizer_parameters
_NOT_SWITCHED = (
    "A parameter in the optimizer couldn't be switched to its sharded version. This breaks the training. "
    "Please raise an issue on GitHub."
)


@pytest.fixture(autouse=True)
def _environment() -> Any:
    """accelerate's plugin writes its settings into ``os.environ`` (``FSDP_*``): restored after each test."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def world() -> Any:
    """A gloo world of one in this process."""
    with gloo_world_of_one():
        yield


def _plugin(**kwargs: Any) -> Any:
    return autils.FullyShardedDataParallelPlugin(fsdp_version=2, **kwargs)


def _model(dtype: torch.dtype = torch.float32) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 16)).to(dtype)


def _two_groups(model: nn.Module) -> torch.optim.Optimizer:
    """Biases first, then weights in reverse order: the mapping must keep each group's order."""
    named = list(model.named_parameters())
    biases = [p for n, p in named if n.endswith("bias")]
    weights = [p for n, p in reversed(named) if n.endswith("weight")]
    return torch.optim.SGD([{"params": biases}, {"params": weights, "lr": 0.25}], lr=0.5)


def _names(model: nn.Module, params: list) -> list[str]:
    by_id = {id(p): n for n, p in model.named_parameters()}
    return [by_id.get(id(p), "?") for p in params]


def _quiet(fn: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn()


# -- the refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("plugin", "with_optimizer", "error", "message"),
    [
        (SimpleNamespace(), True, NotImplementedError, _FSDP1.format("None")),
        (SimpleNamespace(fsdp_version=1), True, NotImplementedError, _FSDP1.format("1")),
        (SimpleNamespace(fsdp_version=2), False, ValueError, _NO_OPTIMIZER),
    ],
)
def test_the_fsdp2_path_refuses_fsdp1_and_a_missing_optimizer_in_accelerates_words(
    plugin: Any, with_optimizer: bool, error: type, message: str
) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.5) if with_optimizer else None
    with pytest.raises(error) as raised:
        fsdp2.check_fsdp_plugin(plugin, opt)
    assert str(raised.value) == message
    with pytest.raises(error) as raised:
        fa.prepare_fp8(model, opt, mixed_precision="no", fsdp_plugin=plugin)
    assert str(raised.value) == message


@pytest.mark.parametrize(
    ("mixed_precision", "handlers"), [("fp16", []), ("fp8", [fa.TERecipeKwargs()]), ("fp8", [fa.MSAMPRecipeKwargs()])]
)
def test_the_fsdp2_path_refuses_fp16_and_the_te_and_msamp_backends(mixed_precision: str, handlers: list) -> None:
    model = _model()
    with pytest.raises(NotImplementedError) as raised:
        _quiet(
            lambda: fa.prepare_fp8(
                model,
                torch.optim.SGD(model.parameters(), lr=0.5),
                kwargs_handlers=handlers,
                mixed_precision=mixed_precision,
                fsdp_plugin=SimpleNamespace(fsdp_version=2),
            )
        )
    backend = "NO" if not handlers else ("TE" if isinstance(handlers[0], fa.TERecipeKwargs) else "MSAMP")
    assert str(raised.value) == (
        "prepare_fp8 with an FSDP2 plugin emulates the torchao backend (AORecipeKwargs) and bf16 / no mixed "
        f"precision; got mixed_precision={mixed_precision!r}, backend {backend}"
    )
    assert all(type(m) is not Float8Linear for m in model)


def test_without_accelerate_the_fsdp2_path_names_the_package(world: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "accelerate.utils.fsdp_utils", None)
    model = _model()
    with pytest.raises(ImportError, match=r"^an FSDP2 plugin needs accelerate: pip install accelerate$"):
        fsdp2.prepare_fsdp2(model, torch.optim.SGD(model.parameters(), lr=0.5), _plugin(), "no")


# -- sharding and the optimizer ----------------------------------------------------------------------


@pytest.mark.parametrize("mixed_precision", ["no", "bf16"])
def test_prepare_shards_the_model_and_hands_the_optimizer_the_shards_group_by_group(
    world: None, mixed_precision: str
) -> None:
    model = _model()
    opt = _two_groups(model)
    before = [_names(model, g["params"]) for g in opt.param_groups]
    values = {n: p.detach().clone() for n, p in model.named_parameters()}
    plugin = _plugin()
    prepared, same_opt = fa.prepare_fp8(model, opt, mixed_precision=mixed_precision, fsdp_plugin=plugin)
    assert same_opt is opt and isinstance(prepared, FSDPModule)
    assert all(type(m) is not Float8Linear for m in prepared)  # no FP8 backend: no conversion
    assert [_names(prepared, g["params"]) for g in opt.param_groups] == before
    assert all(isinstance(p, DTensor) for g in opt.param_groups for p in g["params"])
    for n, p in prepared.named_parameters():
        assert torch.equal(p.full_tensor(), values[n]), n
    prepared(torch.randn(4, 16)).square().mean().backward()
    opt.step()
    assert all(not torch.equal(p.full_tensor(), values[n]) for n, p in prepared.named_parameters())
    # AcceleratorState: the plugin's mixed precision is accelerate's own set_mixed_precision, unless "no"
    expected = _plugin()
    if mixed_precision != "no":
        expected.set_mixed_precision(mixed_precision)
    assert plugin.mixed_precision_policy == expected.mixed_precision_policy


def test_mixed_precision_upcasts_trainable_low_precision_parameters_on_the_main_process(
    world: None, caplog: pytest.LogCaptureFixture
) -> None:
    """fsdp2_prepare_model: under mixed precision a trainable non-float32 parameter becomes float32 (its
    value exactly), a frozen one stays; "no" keeps every dtype.  The main process logs the upcast."""
    for mixed_precision, dtypes in (("no", {torch.bfloat16}), ("bf16", {torch.float32, torch.bfloat16})):
        model = _model(torch.bfloat16)
        model[4].bias.requires_grad_(False)
        values = {n: p.detach().float() for n, p in model.named_parameters()}
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=fsdp2.__name__):
            prepared = fsdp2.prepare_fsdp2(model, _two_groups(model), _plugin(), mixed_precision)
        got = {n: p.dtype for n, p in prepared.named_parameters()}
        upcast = [n for n in values if n != "4.bias"] if mixed_precision != "no" else []
        assert {got[n] for n in upcast} <= {torch.float32} and {d for d in got.values()} == dtypes
        assert got["4.bias"] == torch.bfloat16
        for n, p in prepared.named_parameters():
            assert torch.equal(p.full_tensor().float(), values[n])
        logged = [r.getMessage() for r in caplog.records if r.name == fsdp2.__name__]
        assert logged == (
            [f"FSDP2 upcast {len(upcast)} low-precision parameter(s) to float32 (mixed_precision != 'no'): {upcast}"]
            if upcast
            else []
        )
        dist.barrier()


def test_only_the_main_process_logs_the_upcast(caplog: pytest.LogCaptureFixture) -> None:
    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=2)
    try:
        model = _model(torch.bfloat16)
        with caplog.at_level(logging.INFO, logger=fsdp2.__name__):
            prepared = fsdp2.prepare_fsdp2(model, _two_groups(model), _plugin(), "bf16")
        assert {p.dtype for p in prepared.parameters()} == {torch.float32}
        assert [r for r in caplog.records if r.name == fsdp2.__name__] == []
    finally:
        dist.destroy_process_group()


def test_without_a_group_fully_shard_initialises_it_and_this_process_is_the_main_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No initialised group: torch's ``fully_shard`` initialises the default one from the ``env://`` variables
    (``init_device_mesh``), and this process counts as the main process, as a one-process accelerate run does."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    assert not dist.is_initialized()
    model = _model(torch.bfloat16)
    try:
        with caplog.at_level(logging.INFO, logger=fsdp2.__name__):
            prepared = fsdp2.prepare_fsdp2(model, _two_groups(model), _plugin(), "bf16")
        assert dist.is_initialized() and isinstance(prepared, FSDPModule)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert {p.dtype for p in prepared.parameters()} == {torch.float32}
    assert [r.getMessage()[:23] for r in caplog.records if r.name == fsdp2.__name__] == ["FSDP2 upcast 6 low-prec"]


class Params4bit(nn.Parameter):
    """Named as bitsandbytes' 4-bit parameter, which is all accelerate looks at."""


def test_a_model_holding_params4bit_is_not_upcast(world: None) -> None:
    """fsdp2_prepare_model: a ``Params4bit`` anywhere in the model switches the upcast off."""
    model = _model(torch.bfloat16)
    model[2].weight = Params4bit(model[2].weight.data)
    prepared = fsdp2.prepare_fsdp2(model, _two_groups(model), _plugin(), "bf16")
    assert {p.dtype for p in prepared.parameters()} == {torch.bfloat16}


def test_cpu_ram_efficient_loading_takes_the_main_process_weights(world: None) -> None:
    """The model goes to ``meta`` and the main process's weights are broadcast into the shards."""
    model = _model()
    values = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = _two_groups(model)
    prepared = fsdp2.prepare_fsdp2(model, opt, _plugin(cpu_ram_efficient_loading=True), "no")
    for n, p in prepared.named_parameters():
        assert torch.equal(p.full_tensor(), values[n]), n
    assert [_names(prepared, g["params"]) for g in opt.param_groups] == [
        ["0.bias", "2.bias", "4.bias"],
        ["4.weight", "2.weight", "0.weight"],
    ]


def test_ignored_modules_stay_whole(world: None) -> None:
    model = _model()
    prepared = fsdp2.prepare_fsdp2(model, _two_groups(model), _plugin(ignored_modules="2"), "no")
    assert isinstance(prepared[0].weight, DTensor) and not isinstance(prepared[2].weight, DTensor)


def test_a_parameter_the_optimizer_holds_outside_the_model_is_refused_in_accelerates_words(world: None) -> None:
    model = _model()
    stray = nn.Parameter(torch.zeros(3))
    opt = torch.optim.SGD([*model.parameters(), stray], lr=0.5)
    with pytest.raises(KeyError) as raised:
        fsdp2.prepare_fsdp2(model, opt, _plugin(), "no")
    assert raised.value.args == (_NOT_SWITCHED,)


def test_a_parameter_lost_in_wrapping_is_named(world: None, monkeypatch: pytest.MonkeyPatch) -> None:
    fsdp_utils = require("accelerate.utils.fsdp_utils")
    real = fsdp_utils.fsdp2_prepare_model
    monkeypatch.setattr(fsdp_utils, "fsdp2_prepare_model", lambda acc, m: real(acc, m[:3]))
    model = _model()
    with pytest.raises(KeyError) as raised:
        fsdp2.prepare_fsdp2(model, _two_groups(model), _plugin(), "no")
    assert raised.value.args == ("Parameters missing after FSDP2 wrapping: ['4.weight', '4.bias']",)


# -- the torchao backend ------------------------------------------------------------------------------


def _scales(model: nn.Module) -> list:
    return [getattr(m.weight._local_tensor, "_precomputed_scale", None) for m in model if type(m) is Float8Linear]


@pytest.mark.parametrize("all_gather", [True, False])
def test_the_ao_backend_converts_then_shards_and_precomputes_scales_after_each_step(
    world: None, all_gather: bool
) -> None:
    """``_prepare_ao``: the middle Linear becomes Float8Linear with the handler's config; with float8
    all-gather the optimizer's step post-hook precomputes the weight scales from the stepped weights."""
    model = _model()
    opt = _two_groups(model)
    handler = fa.AORecipeKwargs(enable_fsdp_float8_all_gather=all_gather)
    prepared, _ = _quiet(lambda: fa.prepare_fp8(model, opt, kwargs_handlers=[handler], fsdp_plugin=_plugin()))
    assert [type(m).__name__ for m in prepared] == ["Linear", "ReLU", "Float8Linear", "ReLU", "Linear"]
    assert prepared[2].config is handler.config
    assert _names(prepared, opt.param_groups[1]["params"]) == ["4.weight", "2.weight", "0.weight"]
    assert _scales(prepared) == [None]
    prepared(torch.randn(4, 16)).square().mean().backward()
    opt.step()
    (scale,) = _scales(prepared)
    if not all_gather:
        assert scale is None
        return
    weight = prepared[2].weight.full_tensor()
    expected = torch.finfo(torch.float8_e4m3fn).max / weight.abs().max().double()
    torch.testing.assert_close(scale.double(), expected, rtol=1e-6, atol=0)


def test_the_ao_backend_forwards_the_filter_and_documented(world: None) -> None:
    """A handler's ``module_filter_func`` decides the conversion; accelerate's first-and-last filter used as a
    per-module filter converts every Linear (quirk), ``documented=True`` applies it to the whole model."""
    for documented, converted in ((None, [0, 2, 4]), (True, [2])):
        model = _model()
        handler = fa.AORecipeKwargs(module_filter_func=fa.filter_first_and_last_linear_layers)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prepared, _ = fa.prepare_fp8(
                model, _two_groups(model), kwargs_handlers=[handler], fsdp_plugin=_plugin(), documented=documented
            )
        assert [i for i, m in enumerate(prepared) if type(m) is Float8Linear] == converted
    only_last = fa.AORecipeKwargs(module_filter_func=lambda m, fqn: fqn == "4")
    model = _model()
    prepared, _ = fa.prepare_fp8(model, _two_groups(model), kwargs_handlers=[only_last], fsdp_plugin=_plugin())
    assert [i for i, m in enumerate(prepared) if type(m) is Float8Linear] == [4]


def test_register_float8_scale_precompute_needs_the_all_gather_flag() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for config in (SimpleNamespace(), SimpleNamespace(enable_fsdp_float8_all_gather=False)):
        fsdp2.register_float8_scale_precompute(model, opt, config)
    assert not opt._optimizer_step_post_hooks
    fsdp2.register_float8_scale_precompute(model, opt, SimpleNamespace(enable_fsdp_float8_all_gather=True))
    assert len(opt._optimizer_step_post_hooks) == 1
