"""``fp8sim.accelerate.launch`` in the pytest process (issue 30: the code mutation testing sees).

The two-rank tests (``test_accelerate_distributed.py``) run ``_entry`` in spawned ranks only.  Here:

* ``init_process_group``'s backend choice against accelerate 1.15's own ``PartialState._prepare_backend``
  on a CPU (``state.py``: ``mpi`` when asked for or unset and built in, else ``gloo``; a backend that
  differs from the requested one raises ``ValueError("Your assigned backend ... is not available, please
  use ...")``), with ``torch.distributed.init_process_group`` recorded, MPI availability played both ways;
  and for real in a world of one (``env://`` without a handler, ``file://`` with one);
* ``_entry`` for real in a world of one (its ``os._exit`` intercepted): the rank's environment as
  accelerate's MULTI_CPU state sets it (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``),
  one thread, the result file, the group torn down, exit status 0;
* ``cpu_launcher`` with ``torch.multiprocessing.spawn`` played in-process (each rank's real ``_entry``
  over a ``fake`` process group of the launched size, so ranks run one after the other) and once for
  real with one spawned process.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from datetime import timedelta
from typing import Any

import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")
dist = require("torch.distributed")
astate = require("accelerate.state")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

import fp8sim.accelerate as fa  # noqa: E402
from fp8sim.accelerate import launch  # noqa: E402

_RANK_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


@pytest.fixture(autouse=True)
def _clean_world(monkeypatch: pytest.MonkeyPatch):
    """No process group before or after; the rank variables and the thread count restored."""
    assert not dist.is_initialized()
    for key in (*_RANK_ENV, "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, "stale")  # restored afterwards; a variable _entry forgets stays "stale"
        monkeypatch.delenv(key)
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
    if dist.is_initialized():
        dist.destroy_process_group()
        pytest.fail("a process group was left initialised")


class _Exit(Exception):
    def __init__(self, code: Any) -> None:
        super().__init__(code)
        self.code = code


def _raise_exit(code: Any) -> None:
    raise _Exit(code)


# -- init_process_group ---------------------------------------------------------------------------


def _accelerate_backend(requested: str | None, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str | None]:
    """accelerate's MULTI_CPU choice (``PartialState.__init__`` / ``_prepare_backend(cpu=True)``) and its error."""
    monkeypatch.setenv("LOCAL_RANK", "0")
    backend, kind = astate.PartialState._prepare_backend(None, cpu=True, sagemaker_dp=False, backend=requested)
    monkeypatch.delenv("LOCAL_RANK")
    assert kind == astate.DistributedType.MULTI_CPU
    if requested is not None and backend != requested:
        return backend, f"Your assigned backend {requested} is not available, please use {backend}"
    return backend, None


@pytest.mark.parametrize("mpi", [False, True])
@pytest.mark.parametrize("requested", [None, "gloo", "mpi"])
def test_init_process_group_picks_the_backend_as_accelerates_cpu_state(
    mpi: bool, requested: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dist, "is_mpi_available", lambda: mpi)
    backend, error = _accelerate_backend(requested, monkeypatch)
    calls: list[dict] = []
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: calls.append(kw))
    timeout = timedelta(seconds=77)
    handler = fa.InitProcessGroupKwargs(init_method="file:///nowhere", timeout=timeout)
    if requested is not None:
        handler = dataclasses.replace(handler, backend=requested)
    if error is not None:
        with pytest.raises(ValueError, match=f"^{error}$"):
            fa.init_process_group(3, 5, handler)
        assert calls == []
        return
    assert fa.init_process_group(3, 5, handler) == backend
    assert calls == [
        {"backend": backend, "rank": 3, "world_size": 5, "init_method": "file:///nowhere", "timeout": timeout}
    ]


def test_init_process_group_without_a_handler_passes_only_the_backend_and_the_world(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dist, "is_mpi_available", lambda: False)
    calls: list[dict] = []
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: calls.append(kw))
    assert fa.init_process_group(1, 2) == "gloo"
    assert calls == [{"backend": "gloo", "rank": 1, "world_size": 2}]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(dist.is_mpi_available(), reason="MPI is built in, so accelerate would use it")
def test_init_process_group_initialises_a_real_world_of_one(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a handler torch's ``env://`` rendezvous applies; with one its ``file://`` store serves."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    for handler in (None, fa.InitProcessGroupKwargs(backend="gloo", init_method=f"file://{tmp_path / 'rdv'}")):
        assert fa.init_process_group(0, 1, handler) == "gloo"
        try:
            assert (dist.get_backend(), dist.get_rank(), dist.get_world_size()) == ("gloo", 0, 1)
        finally:
            dist.destroy_process_group()


# -- _entry -------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Seen:
    """What a rank saw; a dataclass and a numpy array, which ``torch.load(weights_only=True)`` refuses."""

    env: dict
    rank: int
    world: int
    threads: int
    args: tuple
    codes: np.ndarray


def _report(*args: Any) -> _Seen:
    return _Seen(
        env={k: os.environ.get(k) for k in _RANK_ENV},
        rank=dist.get_rank(),
        world=dist.get_world_size(),
        threads=torch.get_num_threads(),
        args=args,
        codes=np.arange(4, dtype=np.uint8) * (dist.get_rank() + 1),
    )


def _expected(rank: int, world: int, args: tuple) -> _Seen:
    env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world)}
    return _Seen(env, rank, world, 1, args, np.arange(4, dtype=np.uint8) * (rank + 1))


def _same(a: _Seen, b: _Seen) -> bool:
    return (a.env, a.rank, a.world, a.threads, a.args) == (b.env, b.rank, b.world, b.threads, b.args) and (
        np.array_equal(a.codes, b.codes)
    )


def test_entry_runs_the_function_in_an_initialised_rank_and_exits_zero(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in _RANK_ENV:
        monkeypatch.setenv(key, "stale")
    monkeypatch.setattr(os, "_exit", _raise_exit)
    torch.set_num_threads(2)
    handler = fa.InitProcessGroupKwargs(backend="gloo", init_method=f"file://{tmp_path / 'rdv'}")
    with pytest.raises(_Exit) as exited:
        launch._entry(0, 1, handler, _report, ("a", 7), str(tmp_path))
    assert exited.value.code == 0 and type(exited.value.code) is int
    assert not dist.is_initialized()
    seen = torch.load(tmp_path / "result_0.pt", weights_only=False)
    assert _same(seen, _expected(0, 1, ("a", 7)))
    assert [os.environ[k] for k in _RANK_ENV] == ["0", "1", "0", "1"]


def test_entry_tears_the_group_down_when_the_function_raises(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "_exit", _raise_exit)
    handler = fa.InitProcessGroupKwargs(backend="gloo", init_method=f"file://{tmp_path / 'rdv'}")
    with pytest.raises(ZeroDivisionError):
        launch._entry(0, 1, handler, divmod, (1, 0), str(tmp_path))
    assert not dist.is_initialized() and not (tmp_path / "result_0.pt").exists()


# -- cpu_launcher -------------------------------------------------------------------------------------


class _InProcessSpawn:
    """``torch.multiprocessing.spawn``'s signature; each rank's real ``_entry`` runs here, one after the
    other, over a ``fake`` process group of the launched size (collectives are no-ops; the handler each
    rank would rendezvous with is recorded)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[dict] = []
        self.handlers: list[Any] = []
        monkeypatch.setattr(torch.multiprocessing, "spawn", self)
        monkeypatch.setattr(launch, "init_process_group", self._init)
        monkeypatch.setattr(os, "_exit", _raise_exit)

    def _init(self, rank: int, world_size: int, handler: Any) -> str:
        self.handlers.append(handler)
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
        return "fake"

    def __call__(self, fn: Any, args: tuple = (), nprocs: int = 1, join: bool = True, **kwargs: Any) -> None:
        self.calls.append({"fn": fn, "args": args, "nprocs": nprocs, "join": join, **kwargs})
        for rank in range(nprocs):
            with pytest.raises(_Exit) as exited:
                fn(rank, *args)
            assert exited.value.code == 0


def test_cpu_launcher_spawns_num_processes_ranks_with_a_file_rendezvous_and_returns_rank_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spawn = _InProcessSpawn(monkeypatch)
    handler = fa.InitProcessGroupKwargs(backend="gloo", timeout=timedelta(seconds=42))
    results = fa.cpu_launcher(_report, args=(1, "x"), num_processes=3, init_handler=handler)
    assert len(results) == 3 and all(_same(r, _expected(i, 3, (1, "x"))) for i, r in enumerate(results))
    (call,) = spawn.calls
    assert call["fn"] is launch._entry and call["nprocs"] == 3 and call["join"] is True
    world, passed, function, args, out_dir = call["args"]
    assert (world, function, args) == (3, _report, (1, "x"))
    assert passed == dataclasses.replace(handler, init_method=f"file://{os.path.join(out_dir, 'rendezvous')}")
    assert spawn.handlers == [passed] * 3
    assert not os.path.exists(out_dir)  # the temporary directory is gone


def test_cpu_launcher_defaults_two_gloo_ranks_and_keeps_a_given_init_method(monkeypatch: pytest.MonkeyPatch) -> None:
    spawn = _InProcessSpawn(monkeypatch)
    results = fa.cpu_launcher(_report)
    assert len(results) == 2 and all(_same(r, _expected(i, 2, ())) for i, r in enumerate(results))
    out_dir = spawn.calls[0]["args"][-1]
    assert spawn.handlers[0] == fa.InitProcessGroupKwargs(
        backend="gloo", init_method=f"file://{os.path.join(out_dir, 'rendezvous')}"
    )
    given = fa.InitProcessGroupKwargs(backend="gloo", init_method="tcp://127.0.0.1:1")
    fa.cpu_launcher(_report, num_processes=1, init_handler=given)
    assert spawn.handlers[-1] is given


@pytest.mark.skipif(dist.is_mpi_available(), reason="MPI is built in: the spawned rank would use it")
def test_cpu_launcher_runs_one_real_spawned_rank() -> None:
    (seen,) = fa.cpu_launcher(_report, args=("real",), num_processes=1)
    assert _same(seen, _expected(0, 1, ("real",)))
