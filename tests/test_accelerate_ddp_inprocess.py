"""``prepare_fp8``'s multi-process branch and the DDP communication hooks in the pytest process (issue 30).

The two-rank run (``test_accelerate_distributed.py``) wraps the model in DDP in spawned ranks only.  Here a
``fake`` process group of two (torch's single-process stand-in: collectives are no-ops) makes this process
rank 0 of a MULTI_CPU world, and a gloo world of one hosts real ``DistributedDataParallel`` models for the
hooks.  Checked against accelerate 1.15: ``DistributedDataParallelKwargs.register_comm_hook`` registers the
same hook and state on a DDP model as accelerate's own class (``utils/dataclasses.py``); ``prepare_model``
on MULTI_CPU wraps the FP8 autocast around the module's forward *before* DDP (only MULTI_GPU delays it),
passes the handler's ``to_kwargs()`` to DDP, registers the hook, and TE's amaxes reduce over the world
group unless one is given; ``ConvertOutputsToFp32`` refuses pickling with accelerate's message.
"""

from __future__ import annotations

import pickle
import warnings
from typing import Any

import pytest
from _outcomes import gloo_world_of_one, outcome

from fp8sim.testing.oracles import require

torch = require("torch")
dist = require("torch.distributed")
autils = require("accelerate.utils")
aops = require("accelerate.utils.operations")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

from torch import nn  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

import fp8sim.accelerate as fa  # noqa: E402
import fp8sim.pytorch as fpt  # noqa: E402
from fp8sim.accelerate import launch  # noqa: E402
from fp8sim.accelerate import prepare as fprep  # noqa: E402
from fp8sim.accelerate.prepare import ConvertOutputsToFp32  # noqa: E402
from fp8sim.torchao import Float8Linear  # noqa: E402

HookType = fa.DDPCommunicationHookType


@pytest.fixture
def world_of_one() -> Any:
    with gloo_world_of_one():
        yield


@pytest.fixture
def two_ranks() -> Any:
    """This process as rank 0 of a fake world of two."""
    assert not dist.is_initialized()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32))


def _quiet(fn: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn()


# -- register_comm_hook ------------------------------------------------------------------------------


def _hook_key(hook: Any) -> tuple:
    """A hook function, or a wrapper's name and the hook it wraps."""
    inner = tuple(c.cell_contents for c in hook.__closure__ or ())
    return (hook.__qualname__, inner) if inner else (hook,)


def _state_key(state: Any) -> Any:
    if state is None:
        return None
    return type(state).__name__, {k: v for k, v in state.__getstate__().items() if k != "rng"}


def _registered(handler: Any) -> list:
    ddp = DDP(_model())
    handler.register_comm_hook(ddp)
    return [(_hook_key(h), _state_key(s)) for h, s in ddp._comm_hooks]


@pytest.mark.parametrize("wrapper", [HookType.NO, HookType.FP16, HookType.BF16])
@pytest.mark.parametrize("hook", list(HookType))
def test_register_comm_hook_registers_what_accelerates_handler_registers(
    world_of_one: None, hook: Any, wrapper: Any
) -> None:
    """A bf16 hook raises torch's TypeError on a CPU build (it needs CUDA and NCCL), the same from both."""
    options = {"matrix_approximation_rank": 3, "start_powerSGD_iter": 7} if "power" in hook.value else {}
    ours = outcome(
        lambda: _registered(
            fa.DistributedDataParallelKwargs(comm_hook=hook, comm_wrapper=wrapper, comm_state_option=options)
        )
    )
    theirs = outcome(
        lambda: _registered(
            autils.DistributedDataParallelKwargs(
                comm_hook=autils.DDPCommunicationHookType(hook.value),
                comm_wrapper=autils.DDPCommunicationHookType(wrapper.value),
                comm_state_option=options,
            )
        )
    )
    assert ours == theirs
    if ours[0] == "ok":
        assert len(ours[1]) == (hook != HookType.NO)


def test_power_sgd_gets_the_state_options(world_of_one: None) -> None:
    handler = fa.DistributedDataParallelKwargs(
        comm_hook=HookType.POWER_SGD, comm_state_option={"matrix_approximation_rank": 3, "start_powerSGD_iter": 7}
    )
    ((_, (kind, state)),) = _registered(handler)
    assert kind == "PowerSGDState" and state["matrix_approximation_rank"] == 3 and state["start_powerSGD_iter"] == 7


# -- prepare_fp8 on a MULTI_CPU world -----------------------------------------------------------------


def _fp8_on_inside(module: nn.Module, inner: nn.Module) -> bool:
    """Whether fp8sim's TE autocast is on while ``inner`` runs in a call of ``module``: where the autocast sits."""
    seen: list = []
    handle = inner.register_forward_pre_hook(lambda m, a: seen.append(fpt.FP8GlobalStateManager.is_fp8_enabled()))
    try:
        module(torch.randn(8, 32))
    finally:
        handle.remove()
    (on,) = seen
    return on


def _groups_seen(model: nn.Module, inner: nn.Module) -> list:
    """The amax reduction group fp8sim's TE autocast holds while ``inner`` runs in a forward of ``model``."""
    seen: list = []
    inner.register_forward_pre_hook(lambda m, a: seen.append(fpt.FP8GlobalStateManager.get_fp8_group()))
    model(torch.randn(8, 32))
    return seen


def test_te_on_multi_cpu_wraps_autocast_before_ddp_with_the_handlers_kwargs_and_hook(two_ranks: None) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ddp_kwargs = {"bucket_cap_mb": 1, "gradient_as_bucket_view": True, "comm_hook": HookType.FP16}
    handlers = [fa.TERecipeKwargs(), fa.DistributedDataParallelKwargs(**ddp_kwargs)]
    prepared, _ = _quiet(lambda: fa.prepare_fp8(model, opt, kwargs_handlers=handlers))
    assert type(prepared) is DDP and prepared.module is model
    assert [type(m) for m in model] == [fpt.Linear, nn.ReLU, fpt.Linear]
    # accelerate's to_kwargs() reaches DDP; the hook is accelerate's choice
    expected = autils.DistributedDataParallelKwargs(**ddp_kwargs).to_kwargs()
    assert expected == {"bucket_cap_mb": 1, "gradient_as_bucket_view": True}
    assert (prepared.bucket_bytes_cap, prepared.gradient_as_bucket_view) == (1024 * 1024, True)
    assert [h for h, _ in prepared._comm_hooks] == [default_hooks.fp16_compress_hook]
    # MULTI_CPU: the autocast wraps the module's forward, not DDP's
    assert _fp8_on_inside(model, model[0]) and _fp8_on_inside(prepared, model[0])
    assert _groups_seen(prepared, model[0]) == [dist.group.WORLD]


def test_a_given_amax_group_is_kept_on_multi_cpu(two_ranks: None) -> None:
    group = dist.new_group(ranks=[0, 1])
    model = _model()
    prepared, _ = _quiet(
        lambda: fa.prepare_fp8(
            model,
            torch.optim.SGD(model.parameters(), lr=0.5),
            kwargs_handlers=[fa.TERecipeKwargs()],
            amax_reduction_group=group,
        )
    )
    assert type(prepared) is DDP and prepared._comm_hooks == []
    assert prepared.bucket_bytes_cap == 25 * 1024 * 1024  # DDP's default: no handler, no kwargs
    assert _groups_seen(prepared, model[0]) == [group]


def test_one_process_keeps_no_amax_group(world_of_one: None) -> None:
    model = _model()
    prepared, _ = _quiet(
        lambda: fa.prepare_fp8(
            model, torch.optim.SGD(model.parameters(), lr=0.5), kwargs_handlers=[fa.TERecipeKwargs()]
        )
    )
    assert prepared is model and _groups_seen(prepared, model[0]) == [None]


@pytest.mark.parametrize("mixed_precision", ["fp8", "no"])
def test_ao_and_no_fp8_on_multi_cpu_are_wrapped_in_ddp(two_ranks: None, mixed_precision: str) -> None:
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32))
    handlers = [fa.AORecipeKwargs()] if mixed_precision == "fp8" else []
    handlers.append(fa.DistributedDataParallelKwargs(bucket_cap_mb=2))
    prepared, _ = _quiet(
        lambda: fa.prepare_fp8(
            model,
            torch.optim.SGD(model.parameters(), lr=0.5),
            kwargs_handlers=handlers,
            mixed_precision=mixed_precision,
        )
    )
    assert type(prepared) is DDP and prepared.bucket_bytes_cap == 2 * 1024 * 1024
    assert sum(type(m) is Float8Linear for m in model) == (mixed_precision == "fp8")


class _RecordingDDP(nn.Module):
    """DistributedDataParallel's constructor and hook registration, recorded (CUDA DDP cannot run here)."""

    made: list = []

    def __init__(self, module: nn.Module, **kwargs: Any) -> None:
        super().__init__()
        self.module, self.hooks = module, []
        self.made.append(kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def register_comm_hook(self, state: Any, hook: Any) -> None:
        self.hooks.append((state, hook))


def test_multi_gpu_gives_ddp_the_device_and_wraps_te_autocast_around_ddp(
    two_ranks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MULTI_GPU, played: the model reports cuda:1 (``_device_of``) and DDP is recorded.  accelerate's
    prepare_model then gives DDP ``device_ids=[index], output_device=index`` with the handler's kwargs and,
    ``delayed_fp8_autocast`` (TE on MULTI_GPU, accelerator.py), wraps the TE autocast around the DDP model
    with the handler's recipe (``documented=True`` forwards ``amax_compute_algo``)."""
    monkeypatch.setattr(fprep, "_device_of", lambda model: torch.device("cuda", 1))
    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", _RecordingDDP)
    monkeypatch.setattr(_RecordingDDP, "made", [])
    model = _model()
    handlers = [
        fa.TERecipeKwargs(amax_compute_algo="most_recent"),
        fa.DistributedDataParallelKwargs(bucket_cap_mb=1, comm_hook=HookType.FP16),
    ]
    prepared, _ = _quiet(
        lambda: fa.prepare_fp8(
            model, torch.optim.SGD(model.parameters(), lr=0.5), kwargs_handlers=handlers, documented=True
        )
    )
    assert type(prepared) is _RecordingDDP and prepared.module is model
    assert _RecordingDDP.made == [{"device_ids": [1], "output_device": 1, "bucket_cap_mb": 1}]
    assert prepared.hooks == [(None, default_hooks.fp16_compress_hook)]
    assert _fp8_on_inside(prepared, model[0]) and not _fp8_on_inside(model, model[0])
    recipes: list = []
    model[0].register_forward_pre_hook(lambda m, a: recipes.append(fpt.FP8GlobalStateManager.get_fp8_recipe()))
    assert _groups_seen(prepared, model[2]) == [dist.group.WORLD]
    assert [r.amax_compute_algo for r in recipes] == ["most_recent"]


def test_a_launched_rank_initialises_the_group_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """``WORLD_SIZE`` > 1 and an ``InitProcessGroupKwargs``: the group is initialised (here a fake one, with the
    rank and size ``init_process_group`` gets) and the model wrapped in DDP."""
    calls: list = []

    def init(rank: int, world_size: int, handler: Any) -> str:
        calls.append((rank, world_size, handler))
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
        return "fake"

    monkeypatch.setattr(launch, "init_process_group", init)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    handler = fa.InitProcessGroupKwargs(backend="gloo")
    model = _model()
    try:
        prepared, _ = fa.prepare_fp8(model, kwargs_handlers=[handler], mixed_precision="no")
        assert calls == [(1, 2, handler)] and type(prepared) is DDP
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


# -- refusals -----------------------------------------------------------------------------------------


def test_the_fp32_outputs_wrapper_refuses_pickling_in_accelerates_words() -> None:
    with pytest.raises(pickle.PicklingError) as ours:
        pickle.dumps(ConvertOutputsToFp32(torch.relu))
    with pytest.raises(pickle.PicklingError) as theirs:
        pickle.dumps(aops.ConvertOutputsToFp32(torch.relu))
    assert str(ours.value) == str(theirs.value)


def test_prepare_fp8_names_what_fp16_and_msamp_need() -> None:
    model = _model()
    with pytest.raises(NotImplementedError) as fp16:
        fa.prepare_fp8(model, mixed_precision="fp16")
    assert str(fp16.value) == (
        "prepare_fp8 prepares fp8, bf16 and no mixed precision; fp16 needs accelerate's GradScaler "
        "training loop (use accelerate itself)"
    )
    with pytest.raises(NotImplementedError) as msamp:
        _quiet(lambda: fa.prepare_fp8(model, kwargs_handlers=[fa.MSAMPRecipeKwargs()]))
    assert str(msamp.value) == (
        "MS-AMP is not emulated: fp8sim has no counterpart of msamp.initialize(model, optimizer, opt_level=...) "
        "(O1: FP8 weights and FP8 weight gradients with scaling metadata; O2: also FP8/FP16 Adam states and "
        "master weights). Use the TE (TERecipeKwargs) or torchao (AORecipeKwargs) backend."
    )
