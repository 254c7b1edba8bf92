"""accelerate end to end on CPU processes, launched by the real CLIs under ``fp8sim run`` (issue 16, item 5).

Each test writes one training script, runs it on 2 ranks with a real launcher and once as a single
process, and compares the losses bit for bit.  What accelerate 1.15 itself allows on CPUs decides
the shape of each run:

- ``accelerate launch --num_processes 2 --cpu`` starts ONE process (``commands/launch.py``
  ``launch_command``: ``--cpu`` selects ``simple_launcher``, which starts several only through
  ``mpirun``), so the 2-rank runs use ``accelerate launch --multi_gpu --num_processes 2``
  (torchrun underneath) and the script asks for ``cpu=True``: ``state.py`` ``_prepare_backend``
  gives ``MULTI_CPU`` with gloo only when ``cpu`` is set.
- On ``MULTI_CPU`` accelerate's state ignores an FSDP plugin (``state.py``: FSDP only for the
  accelerator device types) and ``prepare`` wraps the model in DDP.  The FSDP2 run therefore
  initialises the process group with accelerate's real ``PartialState(cpu=True)`` and prepares the
  model with ``fp8sim.accelerate.prepare_fp8(..., fsdp_plugin=FullyShardedDataParallelPlugin(
  fsdp_version=2))``, which replays ``Accelerator._prepare_ao`` (the precompute hook) and calls
  accelerate's own ``fsdp2_prepare_model``.  The plugin gets a float32 ``MixedPrecisionPolicy``, so
  that the arithmetic is the single process's: the weight is cast once from its float32 shard with
  the scale of the whole weight.  The oracle is the single process's gradient accumulation over
  the ranks' micro-batches, ``(g_0 + g_1) / 2``; the float8 all-gather must be on (the unsharded
  weight carries gathered codes).
- The TE run uses the real ``Accelerator(cpu=True, mixed_precision="fp8",
  kwargs_handlers=[TERecipeKwargs()])`` (DDP; TE resolved to fp8sim.pytorch by the shim) under
  ``torchrun --nproc_per_node 2``.  Delayed scaling rolls its amax history once per forward, so a
  single process cannot replay two ranks' different micro-batches; both ranks see the same batch
  and the oracle is one process on that batch, where DDP's average ``(g + g) / 2 = g`` is exact.

Both are in the slow suite (about 60 s each on 2 busy cores: four interpreters import torch,
accelerate and torchao); ``tests/test_distributed_accelerate.py`` checks ``prepare_fp8`` with the
FSDP2 plugin inside the default suite's existing spawn.  ``torchrun --master_port 0`` hangs the
rendezvous on this torch, hence ``--standalone``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")
require("accelerate")
dist = require("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

TIMEOUT_S = 240  # process start-up on 2 busy cores; a hung rank fails the test

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    from torch import nn

    mode, out = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    STEPS, WORLD = 3, 2

    def data(step, rank):
        g = torch.Generator().manual_seed(100 * step + rank)
        return torch.randn(8, 32, generator=g) * (1 + 3 * rank), torch.randn(8, 32, generator=g)

    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32))

    def write(rank, result):
        with open(os.path.join(out, f"{mode}_{rank}.json"), "w") as f:
            json.dump(result, f)

    if mode.startswith("ao"):
        import fp8sim.accelerate as fa
        from fp8sim.accelerate.prepare import prepare_fp8

        handler = fa.AORecipeKwargs(enable_fsdp_float8_all_gather=True)
        m = model()
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        losses, gathered = [], []
        if mode == "ao-fsdp2":
            from accelerate import PartialState
            from accelerate.utils import FullyShardedDataParallelPlugin
            from torch.distributed.fsdp import MixedPrecisionPolicy

            state = PartialState(cpu=True)  # accelerate's MULTI_CPU process group (gloo)
            plugin = FullyShardedDataParallelPlugin(
                fsdp_version=2, mixed_precision_policy=MixedPrecisionPolicy(param_dtype=torch.float32)
            )
            m, opt = prepare_fp8(m, opt, kwargs_handlers=[handler], fsdp_plugin=plugin)
            m[2].register_forward_pre_hook(lambda mod, a: gathered.append(hasattr(mod.weight, "_fp8sim_float8")))
            for step in range(STEPS):
                x, y = data(step, state.process_index)
                loss = nn.functional.mse_loss(m(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses.append(loss.item())
            write(state.process_index, {"losses": losses, "gathered": gathered, "world": state.num_processes,
                                        "distributed_type": str(state.distributed_type)})
            state.wait_for_everyone()  # a rank leaving with a live gloo group can abort (test_distributed_reliability)
            state.destroy_process_group()
        else:  # one process, gradient accumulation over the ranks' micro-batches
            fa.convert_model_to_fp8_ao(m, config=handler.config)  # _prepare_ao; FSDP2 runs without autocast
            # the float8 all-gather weight is a new Parameter: the optimizer is built on the converted model
            opt = torch.optim.SGD(m.parameters(), lr=0.5)
            for step in range(STEPS):
                grads, step_losses = [], []
                for r in range(WORLD):
                    loss = nn.functional.mse_loss(m(data(step, r)[0]), data(step, r)[1])
                    loss.backward()
                    grads.append([p.grad.clone() for p in m.parameters()])
                    step_losses.append(loss.item())
                    opt.zero_grad()
                for p, g0, g1 in zip(m.parameters(), *grads):
                    p.grad = (g0 + g1) / 2
                opt.step()
                opt.zero_grad()
                losses.append(step_losses)
            write(0, {"losses": losses})
    else:  # TE through the real Accelerator (DDP on MULTI_CPU); the shim maps transformer_engine to fp8sim
        from accelerate import Accelerator
        from accelerate.utils import TERecipeKwargs

        acc = Accelerator(cpu=True, mixed_precision="fp8", kwargs_handlers=[TERecipeKwargs(amax_history_len=4)])
        m = model()
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        m, opt = acc.prepare(m, opt)
        inner = acc.unwrap_model(m)
        losses, scales = [], []
        for step in range(STEPS):
            x, y = data(step, 0)  # the same micro-batch on every rank (module docstring)
            loss = nn.functional.mse_loss(m(x), y)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
            scales.append([float(s) for mod in inner.modules() if hasattr(mod, "fp8_gemms")
                           for g in mod.fp8_gemms.values() if g.fwd is not None for s in g.fwd.scale])
        write(acc.process_index, {"losses": losses, "scales": scales, "world": acc.num_processes,
                                  "distributed_type": str(acc.distributed_type),
                                  "te_layers": sum(type(mod).__module__.startswith("fp8sim.pytorch")
                                                   for mod in inner.modules())})
        acc.wait_for_everyone()
        acc.end_training()  # destroys the process group
    """
)


def _run(cmd: list[str], cwd: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FP8SIM_QUIET": "1", "PYTHONWARNINGS": "ignore"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).parents[1]), env.get("PYTHONPATH")) if p)
    # a session of its own: on a timeout the launcher and every rank it started are stopped
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} did not finish within {TIMEOUT_S} s:\n{stderr[-6000:]}")
    tail = f"{stdout[-3000:]}\n{stderr[-6000:]}"
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{tail}"


def _fp8sim_run(*args: str) -> list[str]:
    return [sys.executable, "-m", "fp8sim", "run", *args]


def _load(out: Path, name: str) -> dict:
    return json.loads((out / f"{name}.json").read_text())


@pytest.mark.slow
def test_accelerate_launch_fsdp2_float8_all_gather_matches_one_process(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    launch = ["-m", "accelerate.commands.accelerate_cli", "launch", "--multi_gpu", "--num_processes", "2"]
    launch += ["--num_machines", "1", "--mixed_precision", "fp8", "--dynamo_backend", "no", "--main_process_port", "0"]
    _run(_fp8sim_run(*launch, str(script), "ao-fsdp2", str(tmp_path)), tmp_path)
    _run(_fp8sim_run(str(script), "ao-reference", str(tmp_path)), tmp_path)
    ref = _load(tmp_path, "ao-reference_0")["losses"]
    for rank in range(2):
        run = _load(tmp_path, f"ao-fsdp2_{rank}")
        assert run["world"] == 2 and run["distributed_type"] == "DistributedType.MULTI_CPU", run
        assert run["gathered"] and all(run["gathered"]), "the converted Linear was not gathered in float8"
        assert run["losses"] == [step[rank] for step in ref], f"rank {rank}: {run['losses']} vs {ref}"


@pytest.mark.slow
def test_torchrun_te_recipe_ddp_under_fp8sim_run_matches_one_process(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]  # a free port
    _run(_fp8sim_run(*torchrun, str(script), "te-ddp", str(tmp_path)), tmp_path)
    (tmp_path / "te-ddp_0.json").rename(tmp_path / "ddp_0.json")
    (tmp_path / "te-ddp_1.json").rename(tmp_path / "ddp_1.json")
    _run(_fp8sim_run(str(script), "te-ddp", str(tmp_path)), tmp_path)
    ref = _load(tmp_path, "te-ddp_0")
    assert ref["world"] == 1 and ref["te_layers"] > 0, ref
    for rank in range(2):
        run = _load(tmp_path, f"ddp_{rank}")
        assert run["world"] == 2 and run["distributed_type"] == "DistributedType.MULTI_CPU", run
        assert run["te_layers"] == ref["te_layers"], "accelerate converted other layers on the ranks"
        assert run["losses"] == ref["losses"], f"rank {rank}: {run['losses']} vs {ref['losses']}"
        assert run["scales"] == ref["scales"], f"rank {rank}: the delayed-scaling scales differ"
