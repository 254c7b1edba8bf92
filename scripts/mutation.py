"""Mutation testing, one fp8sim package at a time (mutmut 3.x; see docs/mutation.md).

    python scripts/mutation.py native            # mutate fp8sim/native/*, run its targeted tests
    python scripts/mutation.py native --results  # list the survivors of the last run
    python scripts/mutation.py native --recheck  # rerun each survivor against the whole selection
    python scripts/mutation.py --list            # the packages and their test selections

Each package runs in its own work folder ``.mutation/<package>/`` (git-ignored), so its results stay
cached between runs and one package's test selection never invalidates another's.  The folder gets the
checkout's ``pyproject.toml`` with ``[tool.mutmut]`` completed from ``[tool.fp8sim.mutation.<package>]``
(``only_mutate`` and ``tests``), and links to ``fp8sim/``, ``tests/`` and the files the tests read; mutmut
copies them into ``mutants/`` there.  Extra arguments go to ``mutmut run`` (mutant names or globs,
``--max-children``).

mutmut runs each mutant against the tests that called the mutated function in its coverage pass, which
sees only the pytest process: code that runs in spawned processes (the gloo ranks of the distributed
tests) looks untested there.  ``--recheck`` reruns every survivor of the last run (and with
``--no-tests-too`` every mutant with no covering test) against the package's whole test selection, in
mutmut's ``mutants/`` tree with the mutant switched on through ``MUTANT_UNDER_TEST``, which spawned
processes inherit; it prints one verdict per mutant and changes nothing in mutmut's results.  Mutant-name
globs narrow it, ``--tests "tests/test_x.py ..."`` replaces the selection.  ``--one-process`` runs all the
mutants in one pytest process with the test ranks forked from one forkserver (``--fresh-forkserver``: one per
mutant, for ``spawn._entry``).

``--sample N`` runs a uniform random sample of N of the package's mutants (``--seed``, default 30; the names
are kept in ``.mutation/<package>/sample.txt``, ``sample-seed<N>.txt`` for another seed, so a second independent
sample never overwrites the first): a package too large for a session gets an estimated score with its 95 %
(Wilson) interval, printed by ``--sample N --results``; ``--recheck --sample N`` rechecks the
sample's mutants only.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import random
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

try:
    import tomllib
except ImportError:  # Python 3.10: mutmut needs toml there anyway
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
# what the tests read besides the package (mutmut copies fp8sim/ and tests/, [tool.mutmut] also_copy the rest)
_LINKS = (
    "fp8sim",
    "tests",
    "docs",
    "notebooks",
    "reports",
    "scripts",
    "benchmarks",
    "README.md",
    ".gitignore",
    "mkdocs.yml",
)


def _packages() -> dict[str, dict]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    return data["tool"]["fp8sim"]["mutation"]


def _toml_list(values: list[str]) -> str:
    return "[" + ", ".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "]"


def _workdir(name: str, pkg: dict) -> Path:
    """``.mutation/<name>/`` with links to the sources and tests and a pyproject.toml for this package."""
    work = ROOT / ".mutation" / name
    work.mkdir(parents=True, exist_ok=True)
    for link in _LINKS:
        target = work / link
        if not target.is_symlink() and (ROOT / link).exists():
            target.symlink_to(ROOT / link, target_is_directory=(ROOT / link).is_dir())
    text = (ROOT / "pyproject.toml").read_text("utf-8")
    head, sep, tail = text.partition("[tool.mutmut]\n")
    if not sep:
        raise SystemExit("pyproject.toml has no [tool.mutmut] table")
    extra = (
        f"only_mutate = {_toml_list(pkg['only_mutate'])}\n"
        f"do_not_mutate = {_toml_list(pkg.get('do_not_mutate', []))}\n"
        f"pytest_add_cli_args_test_selection = {_toml_list(pkg['tests'])}\n"
    )
    new = head + sep + extra + tail
    path = work / "pyproject.toml"
    if not path.exists() or path.read_text("utf-8") != new:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(new, "utf-8")
        os.replace(tmp, path)
    return work


def _mutmut_args() -> list[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    return list(data["tool"]["mutmut"].get("pytest_add_cli_args", []))


def _recheck(
    work: Path,
    pkg: dict,
    wanted: set[str],
    tests: list[str],
    globs: list[str],
    timeout: float | None = None,
    one_process: str = "",
) -> int:
    """Rerun the last run's mutants whose status is in ``wanted`` against the whole test selection; print the
    verdicts (a run past ``timeout`` seconds is a *timeout*: killed, as mutmut counts it)."""
    listing = subprocess.run(
        [sys.executable, "-m", "mutmut", "results", "--all", "true"], cwd=work, capture_output=True, text=True
    ).stdout
    names = [n.strip() for n, _, v in (ln.rpartition(":") for ln in listing.splitlines()) if v.strip() in wanted]
    names = [n for n in names if not globs or any(fnmatch.fnmatchcase(n, g) for g in globs)]
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:randomly", *_mutmut_args(), *(tests or pkg["tests"])]
    # the tests as they are now in the checkout (mutmut copied them when the run started)
    shutil.copytree(ROOT / "tests", work / "mutants" / "tests", dirs_exist_ok=True)
    if one_process:
        return _recheck_one_process(work, names, cmd, timeout, one_process == "fresh")
    killed = 0
    for name in names:
        env = dict(os.environ, MUTANT_UNDER_TEST=name)
        try:
            rc = subprocess.run(cmd, cwd=work / "mutants", env=env, capture_output=True, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = -1
        verdict = {1: "killed", 0: "survived", -1: "timeout"}.get(rc, f"error (pytest exit {rc})")
        killed += verdict in ("killed", "timeout")
        print(f"{verdict:22s} {name}", flush=True)
    print(f"recheck: {killed} of {len(names)} killed by the whole selection")
    return 0


def _with_mutant(rank: int, world: int, name: str, function: Any, *args: Any) -> Any:
    """A rank of a ``--one-process`` recheck: the forkserver's ranks inherit the server's environment, so the
    parent hands its mutant over."""
    os.environ["MUTANT_UNDER_TEST"] = name
    return function(rank, world, *args)


def _loop_child(names: list[str], pytest_args: list[str], timeout: float | None, fresh_server: bool) -> int:
    """Run in ``mutants/``: every mutant's tests in this one process (``pytest.main`` per mutant, the mutant
    switched through the environment), the test ranks (``tests/_dist.py``) forked from one forkserver that
    imported torch once.  ``spawn._entry`` runs before the mutant is handed over: ``fresh_server`` starts a
    forkserver per mutant, with the mutant in its environment."""
    import faulthandler
    import multiprocessing.forkserver as forkserver

    import pytest

    sys.path[:0] = [os.getcwd(), os.path.join(os.getcwd(), "tests")]
    os.environ["MUTANT_UNDER_TEST"] = ""  # module-level code (imports, the forkserver's preloads) unmutated
    import _dist

    import fp8sim.collectives  # noqa: F401

    preload = ["torch", "torch.distributed", "numpy", "ml_dtypes", "fp8sim.collectives", "fp8sim.collectives.spawn"]
    forkserver.set_forkserver_preload(preload)
    forkserver.ensure_running()
    run = _dist.run_ranks

    def run_ranks(function: Any, args: tuple = (), **kw: Any) -> Any:
        kw["start_method"] = "forkserver"
        return run(_with_mutant, (os.environ["MUTANT_UNDER_TEST"], function, *args), **kw)

    _dist.run_ranks = run_ranks
    for name in names:
        os.environ["MUTANT_UNDER_TEST"] = name
        if fresh_server:  # the rank entry point itself mutated: a server started with this mutant
            forkserver._forkserver._stop()
            forkserver.ensure_running()
        if timeout:
            faulthandler.dump_traceback_later(timeout, exit=True)  # the parent counts the mutant a timeout
        rc = int(pytest.main(pytest_args))
        faulthandler.cancel_dump_traceback_later()
        verdict = {1: "killed", 0: "survived"}.get(rc, f"error (pytest exit {rc})")
        print(f"@@ {verdict:22s} {name}", flush=True)
    return 0


def _recheck_one_process(work: Path, names: list[str], cmd: list[str], timeout: float | None, fresh: bool) -> int:
    """``_loop_child`` over ``names``; a child that dies (a timeout) is restarted after its current mutant."""
    killed, left = 0, list(names)
    while left:
        listing = work / "names.tmp"
        listing.write_text("\n".join(left), "utf-8")
        child = [sys.executable, str(Path(__file__).resolve()), "--loop-child", str(listing)]
        child += ["--timeout", str(timeout)] if timeout else []
        child += ["--fresh-forkserver"] if fresh else []
        proc = subprocess.Popen([*child, "--", *cmd[3:]], cwd=work / "mutants", stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        with open(work / "one_process.log", "a", encoding="utf-8") as log:  # pytest's own output
            for line in proc.stdout:
                if not line.startswith("@@ "):
                    log.write(line)
                    continue
                verdict, _, name = line[3:].rstrip("\n").rpartition(" ")
                left.remove(name)
                killed += verdict.strip() == "killed"
                print(line[3:], end="", flush=True)
        proc.wait()
        if left and proc.returncode != 0:
            print(f"{'timeout':22s} {left.pop(0)}", flush=True)
            killed += 1
        elif left:
            break
    print(f"recheck: {killed} of {len(names)} killed by the whole selection")
    return 0


def _all_mutants(work: Path) -> list[str]:
    """Every mutant name of the package, from mutmut's ``.meta`` files (generated by a first run)."""
    names: list[str] = []
    for meta in sorted((work / "mutants").rglob("*.py.meta")):
        names += json.loads(meta.read_text("utf-8"))["exit_code_by_key"]
    return sorted(names)


def _wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval of a proportion ``k / n`` (95 % by default)."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _sample_file(work: Path, seed: int) -> Path:
    """Where a sample's names are kept: ``sample.txt`` for the default seed 30, ``sample-seed<N>.txt`` otherwise, so
    a second, independent sample (another seed) never overwrites the first."""
    return work / ("sample.txt" if seed == 30 else f"sample-seed{seed}.txt")


def _sample(work: Path, size: int, seed: int, results: bool) -> int:
    """Run (or with ``results`` tally) a uniform random sample of ``size`` of the package's mutants."""
    if not results and not list((work / "mutants").rglob("*.py.meta")):
        # generation and mutmut's coverage pass only: a filter that matches nothing stops it before any mutant
        subprocess.call([sys.executable, "-m", "mutmut", "run", "--max-children", "1", "__no_such_mutant__"], cwd=work)
    names = _all_mutants(work)
    if not names:
        raise SystemExit("no mutants generated: see mutmut's output above")
    chosen = sorted(random.Random(seed).sample(names, min(size, len(names))))
    drawn = _sample_file(work, seed)
    if results and drawn.exists() and drawn.read_text("utf-8").split() != chosen:
        held = len(drawn.read_text("utf-8").split())
        raise SystemExit(f"the sample run for this package has {held} mutants, not --sample {size} --seed {seed}")
    drawn.write_text("\n".join(chosen) + "\n", "utf-8")
    if not results:
        return subprocess.call([sys.executable, "-m", "mutmut", "run", "--max-children", "1", *chosen], cwd=work)
    listing = subprocess.run(
        [sys.executable, "-m", "mutmut", "results", "--all", "true"], cwd=work, capture_output=True, text=True
    ).stdout
    status = {n.strip(): v.strip() for n, _, v in (ln.rpartition(":") for ln in listing.splitlines()) if n.strip()}
    tally: dict[str, int] = {}
    for name in chosen:
        tally[status.get(name, "not checked")] = tally.get(status.get(name, "not checked"), 0) + 1
    for name in chosen:
        if status.get(name) not in ("killed", "timeout"):
            print(f"{status.get(name, 'not checked'):22s} {name}")
    killed = tally.get("killed", 0) + tally.get("timeout", 0)
    low, high = _wilson(killed, len(chosen))
    print(f"sample of {len(chosen)} of {len(names)} mutants (seed {seed}): {tally}")
    print(
        f"mutmut's verdicts: {killed}/{len(chosen)} killed = {100 * killed / len(chosen):.1f} % "
        f"(95 % interval {100 * low:.1f}-{100 * high:.1f} %), before triage"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", nargs="?", help="a key of [tool.fp8sim.mutation] in pyproject.toml")
    parser.add_argument("--list", action="store_true", help="list the packages and their test selections")
    parser.add_argument("--results", action="store_true", help="print the survivors of the last run")
    parser.add_argument("--recheck", action="store_true", help="rerun the survivors against the whole selection")
    parser.add_argument("--no-tests-too", action="store_true", help="with --recheck: also the untested mutants")
    parser.add_argument("--timeouts-too", action="store_true", help="with --recheck: also mutmut's timeouts")
    parser.add_argument("--tests", help="with --recheck: pytest arguments replacing the package's selection")
    parser.add_argument("--timeout", type=float, help="with --recheck: seconds before a run counts as a timeout")
    parser.add_argument(
        "--one-process",
        action="store_true",
        help="with --recheck: one pytest process for all the mutants, the ranks from one forkserver (faster; "
        "not for spawn._entry's mutants)",
    )
    parser.add_argument(
        "--fresh-forkserver", action="store_true", help="with --one-process: a forkserver per mutant (spawn._entry)"
    )
    parser.add_argument("--sample", type=int, help="run (with --results: tally) a random sample of N mutants")
    parser.add_argument("--seed", type=int, default=30, help="with --sample: the sample's seed (default 30)")
    parser.add_argument("--loop-child", help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else argv
    if "--loop-child" in argv:
        sep = argv.index("--")
        args = parser.parse_args(argv[:sep])
        names = Path(args.loop_child).read_text("utf-8").split()
        return _loop_child(names, argv[sep + 1 :], args.timeout, args.fresh_forkserver)
    args, rest = parser.parse_known_args(argv)
    packages = _packages()
    if args.list or args.package is None:
        for name, pkg in packages.items():
            print(f"{name:22s} {' '.join(pkg['only_mutate'])}\n{'':22s} tests: {' '.join(pkg['tests'])}")
        return 0
    if args.package not in packages:
        raise SystemExit(f"unknown package {args.package!r}; known: {', '.join(packages)}")
    if args.sample is not None and args.sample < 1:
        raise SystemExit(f"--sample must be a positive number of mutants, got {args.sample}")
    work = _workdir(args.package, packages[args.package])
    if args.sample is not None and args.recheck:  # the sample's mutants only (and those of the globs)
        drawn = _sample_file(work, args.seed)
        sampled = drawn.read_text("utf-8").split() if drawn.exists() else []
        if not sampled:
            raise SystemExit(f"--recheck --sample: no sample drawn yet for {args.package!r} with --seed {args.seed}")
        rest = [n for n in sampled if not rest or any(fnmatch.fnmatchcase(n, g) for g in rest)]
        if not rest:
            raise SystemExit("--recheck --sample: no sampled mutant matches the given names")
    elif args.sample is not None:
        return _sample(work, args.sample, args.seed, args.results)
    if args.recheck:
        tests = shlex.split(args.tests) if args.tests else []
        wanted = {"survived"} | ({"no tests"} if args.no_tests_too else set())
        wanted |= {"timeout"} if args.timeouts_too else set()
        one = ("fresh" if args.fresh_forkserver else "shared") if args.one_process else ""
        return _recheck(work, packages[args.package], wanted, tests, rest, args.timeout, one)
    cmd = [sys.executable, "-m", "mutmut", "results" if args.results else "run", *rest]
    if not args.results and "--max-children" not in rest:
        cmd[4:4] = ["--max-children", "1"]  # 2 shared cores: one worker
    return subprocess.call(cmd, cwd=work)


if __name__ == "__main__":
    sys.exit(main())
