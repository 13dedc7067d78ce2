"""What the compiler cache saves: a cold build and a warm rebuild of the same recipe, side by
side in one run, on this machine (engine none).

For each case:

1. cold: ``wheelmill build --cell CELL --recipe RECIPE --rebuild RECIPE --no-mirror`` into
   a fresh output root, so the cache (local disk, ``<output>/.cache/sccache``) starts empty;
2. warm: the same command again into the same output root. Every build cleans its build
   directory and fetches its source again, and ``--rebuild`` builds the recipe although
   the first run published it: every object is compiled again or taken from the cache (and
   the wheel, the same bytes, is published again: a no-op).

A recipe's dependencies are built and published into that output root's channel first,
untimed, with the compiler cache emptied after, so both runs take them from the channel and
build the measured recipe alone: else a dependency's install test runs beside the measured
build (as the pipeline does, to shorten the whole command), and the share of the machine it
takes, which no cache changes, would be timed as the build's.

The figure is the recipe's build step as report.json times it (the compile, which is what
the cache serves), with the cache's hits and misses; the whole command's time alongside.
Cases: the CUDA example (example-cuda-ops in cuda130-py311 at the variant's full arch list,
after its dependency example-cpp-ops; needs the CUDA 13.0 toolkit; target: warm >= 6x
faster) and torchsort in cpu-py311. Usage: ``.venv/bin/python benchmarks/cache.py [--case cuda|torchsort]...``
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import runs

TARGET = 6.0  # the CUDA example's warm rebuild against its cold build


@dataclass(frozen=True)
class Case:
    cell: str
    recipe: str
    target: float | None = None
    needs: tuple[str, ...] = ()  # published first


CASES = {
    "cuda": Case("cuda130-py311", "example-cuda-ops", TARGET, needs=("example-cpp-ops",)),
    "torchsort": Case("cpu-py311", "torchsort"),
}


@dataclass(frozen=True)
class Run:
    total: float  # the whole command
    build: float  # the recipe's build step
    hits: int
    misses: int


def publish_needs(case: Case, output: Path, log: Path) -> None:
    """The case's dependencies, built and published (untimed), then the compiler cache emptied."""
    if case.needs:
        recipes = [arg for name in case.needs for arg in ("--recipe", name)]
        runs.wheelmill(
            ["build", "--engine", "none", "--cell", case.cell, *recipes, "--no-mirror"], output=output, log=log
        )
        runs.empty_compiler_cache(output)


def run(case: Case, output: Path, log: Path) -> Run:
    argv = [
        "build",
        "--engine",
        "none",
        "--cell",
        case.cell,
        "--recipe",
        case.recipe,
        "--rebuild",
        case.recipe,
        "--no-mirror",
    ]
    total = runs.wheelmill(argv, output=output, log=log, env={"WHEELMILL_COMPILER_CACHE": "on"})
    report: dict[str, Any] = json.loads((output / case.cell / "report.json").read_text())
    built = {s["recipe"]: s["seconds"] for s in report["steps"] if s["step"] == "build" and s["status"] == "ok"}
    assert list(built) == [case.recipe], f"built {list(built)}: the case's dependencies were not taken from the channel"
    build = built[case.recipe]
    stats = report["facts"]["compiler_cache"][case.recipe] or {"hits": 0, "misses": 0}
    return Run(total=total, build=build, hits=stats["hits"], misses=stats["misses"])


def compare(name: str, case: Case, root: Path) -> None:
    output, log = root / name, root / f"{name}.log"
    publish_needs(case, output, log)
    cold = run(case, output, log)
    warm = run(case, output, log)
    print(
        f"{name}: {case.recipe} in {case.cell}"
        + (f", {', '.join(case.needs)} published first (untimed)" if case.needs else "")
    )
    for label, result in (("cold (empty cache)", cold), ("warm (same cache)", warm)):
        print(
            f"  {label:<19} build step {result.build:7.1f} s  ({result.hits} hits, {result.misses} misses); "
            f"whole command {result.total:6.1f} s"
        )
    target = f" (target >= {case.target:.0f}x)" if case.target else ""
    print(
        f"  ratio cold/warm: build step {cold.build / warm.build:.1f}x{target}; "
        f"whole command {cold.total / warm.total:.2f}x",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="repeatable; default: every case")
    args = parser.parse_args()
    with runs.workspace("wheelmill-cache-bench-") as tmp:
        for name in args.case or sorted(CASES):
            compare(name, CASES[name], tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
