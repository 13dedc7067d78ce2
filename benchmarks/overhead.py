"""What wheelmill costs over the raw build, for the CUDA example in one cell.

Both runs happen here, one after the other, in this process tree:

1. wheelmill: ``wheelmill build --cell CELL --recipe example-cuda-ops``, timed whole (it
   builds example-cpp-ops first, as the dependency): pre-checks, locked env, both builds,
   stamping, every check, repair, and an install test of each wheel in a clean env.
2. the raw baseline for the same two packages: a venv synced from the same lock, the same
   frontend (``python -m build --wheel --no-isolation``) with the same environment
   (CUDA_HOME, arch list, MAX_JOBS, nvcc's --threads),
   example-cpp-ops installed before example-cuda-ops is built, and ``auditwheel repair``
   with the same excludes.

wheelmill runs first, so it meets the colder caches. Prints both times and the ratio
(target: <= 1.15). Usage: ``.venv/bin/python benchmarks/overhead.py [--cell cuda130-py311]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from wheelmill.matrix import load_matrix
from wheelmill.process import HostRunner, base_environment
from wheelmill.recipes import PathSource, load_recipes, resolve
from wheelmill.steps.build import available_memory, max_jobs, nvcc_threads
from wheelmill.toolchain import Toolkit, find_toolkit
from wheelmill.tools import uv_bin

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ("example-cpp-ops", "example-cuda-ops")
TARGET = 1.15


def timed(argv: list[str], *, env: dict[str, str], cwd: Path | None = None, log: Path) -> float:
    started = time.monotonic()
    with log.open("a") as out:
        subprocess.run(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, check=True)
    return time.monotonic() - started


def run_wheelmill(cell: str, output: Path, log: Path) -> float:
    env = {**os.environ, "WHEELMILL_OUTPUT": str(output)}
    argv = [sys.executable, "-m", "wheelmill", "build", "--engine", "none", "--cell", cell, "--recipe", RECIPES[-1]]
    return timed(argv, env=env, cwd=ROOT, log=log)


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
    elapsed = timed([uv_bin(), "venv", "--quiet", "--python", str(python), str(env_dir)], env=uv_env, log=log)
    elapsed += timed(
        [uv_bin(), "pip", "sync", "--quiet", "--python", str(env_dir / "bin" / "python"), "--require-hashes", *sources, str(lock)], env=uv_env, log=log
    )
    excludes = [arg for pattern in matrix.excludes_for(cell.variant) for arg in ("--exclude", pattern)]
    memory, per_job, cores = available_memory(), matrix.memory_per_job["cuda"], os.cpu_count() or 1
    jobs = max_jobs(memory, per_job, cores)
    threads = f"--threads {nvcc_threads(memory, per_job, jobs, cores)}"  # as wheelmill's builds: this measures overhead, not that
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
        elapsed += timed(
            [python_env, "-m", "build", "--wheel", "--no-isolation", "--skip-dependency-check", "--outdir", str(dist), str(source)],
            env=build_env,
            cwd=source,
            log=log,
        )
        wheel = next(dist.glob("*.whl"))
        elapsed += timed([python_env, "-m", "auditwheel", "repair", "-w", str(repaired), *excludes, str(wheel)], env=build_env, log=log)
        if name != RECIPES[-1]:
            repaired_wheel = next(repaired.glob("*.whl"))
            elapsed += timed([uv_bin(), "pip", "install", "--quiet", "--no-deps", "--python", python_env, str(repaired_wheel)], env=uv_env, log=log)
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", default="cuda130-py311")
    parser.add_argument("--rounds", type=int, default=1, help="alternate wheelmill and baseline this many times")
    args = parser.parse_args()
    results: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory(prefix="wheelmill-bench-") as tmp:
        root = Path(tmp)
        log = root / "bench.log"
        for index in range(args.rounds):
            output, work = root / f"wheels-{index}", root / f"baseline-{index}"
            ours = run_wheelmill(args.cell, output, log)
            theirs = run_baseline(args.cell, output, work, log)
            results.append((ours, theirs))
            print(f"round {index + 1}: wheelmill {ours:.1f} s, baseline {theirs:.1f} s, ratio {ours / theirs:.3f}", flush=True)
    ours = sorted(r[0] for r in results)[len(results) // 2]
    theirs = sorted(r[1] for r in results)[len(results) // 2]
    print(f"cell {args.cell}, recipes {', '.join(RECIPES)}")
    print(f"wheelmill (pre-checks, env, build, checks, repair, install tests): {ours:.1f} s")
    print(f"baseline  (venv from the same lock, build, auditwheel repair):  {theirs:.1f} s")
    print(f"ratio {ours / theirs:.3f} (target <= {TARGET})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
