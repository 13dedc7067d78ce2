"""What wheelmill costs over the raw build, for the CUDA example in one cell.

Both runs happen here, one after the other, in this process tree:

1. wheelmill: ``wheelmill build --cell CELL --recipe example-cuda-ops``, timed whole (it
   builds example-cpp-ops first, as the dependency): pre-checks, locked env, both builds,
   stamping, every check, repair, and an install test of each wheel in a clean env; then
   publishing the wheels and mirroring their closure, which the baseline has no part of,
   so their steps' seconds (the report's) are shown apart and left out of the figure.
2. the raw baseline for the same two packages: a venv synced from the same lock, the same
   frontend (``python -m build --wheel --no-isolation``) with the same environment
   (CUDA_HOME, arch list, MAX_JOBS, nvcc's --threads),
   example-cpp-ops installed before example-cuda-ops is built, and ``auditwheel repair``
   with the same excludes.

An untimed warm-up build fills uv's package cache and the page cache for both sides; then
the two alternate for ``--rounds`` rounds (3), wheelmill first. wheelmill's rounds run in
the warm-up's output root, as on a machine that has built before and keeps the caches
under its output root (``<output>/.cache``, e.g. a CI cache of it): its bytecode store is
warm, the compiler cache is emptied before each round, and the cell, its wheels and the
index go, so every recipe is built, tested and published again. ``--fresh-output`` gives
each round a new output root instead: the first build on a machine, every torch module
compiled again in the build env and the first test env, as the baseline compiles them in
its venv. Each round prints both times and the CPU time they took (a shared machine's
neighbours move a single run by 10 %); the median of the rounds' ratios, up to tested
wheels, is the figure (target: <= 1.15), the ratio with publishing beside it.
``--smoke`` runs the least that goes through all of it (one round, no warm-up): a check that
the script works, not a figure.
Usage: ``.venv/bin/python benchmarks/overhead.py [--cell cuda130-py311] [--fresh-output] [--smoke]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from statistics import median_high

import runs

from wheelmill.building.steps.build import available_memory, max_jobs, nvcc_threads
from wheelmill.inputs.matrix import load_matrix
from wheelmill.inputs.recipes import PathSource, load_recipes, resolve
from wheelmill.machine.process import HostRunner, base_environment
from wheelmill.machine.toolchain import Toolkit, find_toolkit
from wheelmill.machine.tools import uv_bin

ROOT = runs.ROOT
RECIPES = ("example-cpp-ops", "example-cuda-ops")
TARGET = 1.15
PUBLISHING = frozenset({"publish", "closure", "mirror", "channel-checks"})  # the steps after a tested wheel


def run_wheelmill(
    cell: str, output: Path, log: Path, *, recipe: str = RECIPES[-1], extra: tuple[str, ...] = ()
) -> float:
    return runs.wheelmill(
        ["build", "--engine", "none", "--cell", cell, "--recipe", recipe, *extra], output=output, log=log
    )


def publishing_seconds(output: Path, cell: str) -> float:
    """The seconds of the run's publishing steps, as its report has them."""
    report = json.loads((output / cell / "report.json").read_text())
    return float(sum(step["seconds"] for step in report["steps"] if step["step"] in PUBLISHING))


def warm_up(cell: str, output: Path, log: Path) -> float:
    """One untimed build of the first recipe in an output root of its own: uv's package
    cache then holds the lock's wheels and the page cache torch's files, for both sides
    alike, as on a machine that has built before (a cold uv cache alone cost wheelmill's
    env 8 s more than the baseline's, which came second)."""
    return run_wheelmill(cell, output, log, recipe=RECIPES[0], extra=("--no-publish",))


def next_round(output: Path) -> None:
    """The warm-up's output root as a machine that has built before keeps it: its caches
    (``.cache``) but the compiler's, which a round starts empty; no cell, wheel or index."""
    for entry in output.iterdir() if output.is_dir() else ():
        if entry.name != ".cache":
            shutil.rmtree(entry)
    runs.empty_compiler_cache(output)


def run_baseline(cell_id: str, output: Path, work: Path, log: Path) -> float:
    """The same two packages, built and repaired by hand in an env from wheelmill's lock."""
    matrix = load_matrix(ROOT / "recipes" / "matrix.toml")
    cell = matrix.cell(cell_id)
    recipes = load_recipes(ROOT / "recipes")
    toolkit = find_toolkit(cell.variant, HostRunner())
    assert isinstance(toolkit, Toolkit), "the benchmark needs the variant's CUDA toolkit"
    facts = json.loads((output / cell_id / "report.json").read_text())["facts"]
    lock, sources = output / cell_id / "build-env.lock", facts["package_source_args"]
    env_dir = work / "env"
    python = Path(facts["python"])
    uv_env = base_environment([], {"UV_PYTHON_DOWNLOADS": "never"})
    elapsed = runs.timed([uv_bin(), "venv", "--quiet", "--python", str(python), str(env_dir)], env=uv_env, log=log)
    elapsed += runs.timed(
        [
            uv_bin(),
            "pip",
            "sync",
            "--quiet",
            "--python",
            str(env_dir / "bin" / "python"),
            "--require-hashes",
            *sources,
            str(lock),
        ],
        env=uv_env,
        log=log,
    )
    excludes = [arg for pattern in matrix.excludes_for(cell.variant) for arg in ("--exclude", pattern)]
    memory, per_job, cores = available_memory(), matrix.memory_per_job["cuda"], os.cpu_count() or 1
    jobs = max_jobs(memory, per_job, cores)
    # As wheelmill's builds: this measures overhead, not that.
    threads = f"--threads {nvcc_threads(memory, per_job, jobs, cores)}"
    for name in RECIPES:
        recipe = resolve(recipes[name], cell)
        source = work / "src" / name
        assert isinstance(recipe.source, PathSource)
        shutil.copytree(recipe.source.path, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        build_env = base_environment(
            [env_dir / "bin", toolkit.bin_dir],
            {
                **toolkit.environment(),
                "TORCH_CUDA_ARCH_LIST": recipe.arch_list or cell.variant.arch_list or "",
                "FORCE_CUDA": "1",
                "MAX_JOBS": str(jobs),
                "NVCC_PREPEND_FLAGS": threads,
            },
        )
        dist, repaired = work / "dist" / name, work / "repaired" / name
        python_env = str(env_dir / "bin" / "python")
        elapsed += runs.timed(
            [
                python_env,
                "-m",
                "build",
                "--wheel",
                "--no-isolation",
                "--skip-dependency-check",
                "--outdir",
                str(dist),
                str(source),
            ],
            env=build_env,
            cwd=source,
            log=log,
        )
        wheel = next(dist.glob("*.whl"))
        elapsed += runs.timed(
            [python_env, "-m", "auditwheel", "repair", "-w", str(repaired), *excludes, str(wheel)],
            env=build_env,
            log=log,
        )
        if name != RECIPES[-1]:
            repaired_wheel = next(repaired.glob("*.whl"))
            elapsed += runs.timed(
                [uv_bin(), "pip", "install", "--quiet", "--no-deps", "--python", python_env, str(repaired_wheel)],
                env=uv_env,
                log=log,
            )
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", default="cuda130-py311")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="alternate wheelmill and baseline this many times; the median of the ratios is the figure",
    )
    parser.add_argument("--no-warm-up", dest="warm_up", action="store_false", help="start with the caches as they are")
    parser.add_argument(
        "--fresh-output",
        action="store_true",
        help="a new output root each round: wheelmill's bytecode store starts empty",
    )
    parser.add_argument("--smoke", action="store_true", help="one round, no warm-up: the script checked, no figure")
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.warm_up = 1, False
    if args.fresh_output:  # a first build's: no bytecode store kept outside the output root either
        os.environ.pop("WHEELMILL_BYTECODE_STORE", None)
    rounds: list[tuple[float, float, float]] = []  # wheelmill, of which publishing, baseline
    with runs.workspace("wheelmill-bench-") as root:
        log = root / "bench.log"
        if args.warm_up:
            print(
                f"warm-up (untimed): {RECIPES[0]} built once, {warm_up(args.cell, root / 'warm-up', log):.1f} s",
                flush=True,
            )
        for index in range(args.rounds):
            output, work = root / (f"wheels-{index}" if args.fresh_output else "warm-up"), root / f"baseline-{index}"
            next_round(output)
            before = runs.cpu_seconds()
            ours = run_wheelmill(args.cell, output, log)
            between = runs.cpu_seconds()
            theirs = run_baseline(args.cell, output, work, log)
            ours_cpu, theirs_cpu = between - before, runs.cpu_seconds() - between
            publishing = publishing_seconds(output, args.cell)
            rounds.append((ours, publishing, theirs))
            sides = (
                f"wheelmill {ours:.1f} s ({ours_cpu:.0f} s cpu; publishing {publishing:.1f} s), "
                f"baseline {theirs:.1f} s ({theirs_cpu:.0f} s cpu)"
            )
            print(
                f"round {index + 1}: {sides}, ratio {(ours - publishing) / theirs:.3f}, "
                f"with publishing {ours / theirs:.3f}",
                flush=True,
            )
    ours, theirs = median_high([r[0] - r[1] for r in rounds]), median_high([r[2] for r in rounds])
    where = (
        "a new output root each round"
        if args.fresh_output
        else "the warm-up's output root, its compiler cache emptied each round"
    )
    print(f"cell {args.cell}, recipes {', '.join(RECIPES)}; wheelmill in {where}")
    print(
        f"wheelmill (pre-checks, env, build, checks, repair, install tests): {ours:.1f} s; "
        f"publishing after it {median_high([r[1] for r in rounds]):.1f} s"
    )
    print(f"baseline  (venv from the same lock, build, auditwheel repair):  {theirs:.1f} s")
    # Each round's two runs are minutes apart, the rounds further: the paired ratios' median
    # is the figure, the medians' ratio a check on it.
    paired, whole = median_high([(r[0] - r[1]) / r[2] for r in rounds]), median_high([r[0] / r[2] for r in rounds])
    print(
        f"ratio of the medians {ours / theirs:.3f}; median of the rounds' ratios {paired:.3f} (target <= {TARGET}); "
        f"with publishing {whole:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
