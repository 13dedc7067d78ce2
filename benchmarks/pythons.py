"""What every extra Python of a variant costs: one cell built alone, then the same variant's
cells for several Pythons in one run, each from a cold compiler cache.

After an untimed warm-up (every cell's image, lock and env made once), both runs happen here,
one after the other, in this process tree, in the warm-up's output root, as on a machine
that has built these cells before: the package caches (uv's, which a container keeps under
the output root) are warm, the compiler cache (``<output>/.cache/sccache``) is emptied
before each run, and nothing is published (``--no-publish``), so nothing is skipped:

1. ``wheelmill build --cell VARIANT-pyA --recipe RECIPE``: the first Python alone;
2. ``wheelmill build --cell 'VARIANT-py{A,B,...}' --recipe RECIPE``: the same, and every
   other Python after it, in one run sharing the cache under the output root.

The two runs make a round, repeated ``--rounds`` times (3). Each round prints both wall
times, each cell's time and build steps (from its report) with the compiler cache's hits
and misses, the first cell's time in the run of several against its time alone, and the
cost of each extra Python as a fraction of the first (target: <= 0.20; device code does
not depend on Python, so only what does should be compiled again): the difference of the
two runs. The run of several starts each cell once the one before it starts building, its
commands at a lower priority and each of its builds after that cell's of the same recipe,
so an extra cell's own clock spans most of the first cell's and says nothing of its cost;
what the run takes longer does. The median of the rounds' figures is the result.
Then the extra cells are built once more, alone, every compile a cache hit: what an extra
Python's cell does that no compiler cache takes away (its env, the frontends importing
torch, the cache's lookups, repair, the install tests), as a fraction of the first, and
the CPU time that rebuild's processes used. ``--smoke`` runs the least that goes through all
of it (one round, no warm-up): a check that the script works, not a figure. Usage:
``.venv/bin/python benchmarks/pythons.py [--variant cuda130] [--recipe example-cuda-ops]
[--pythons 3.11,3.12] [--rounds 3] [--smoke]``
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean, median_high
from typing import Any

import runs

TARGET = 0.20


def warm_up(cells: list[str], output: Path, log: Path) -> float:
    """One untimed build of every cell's lightest recipe: each Python's env, lock and image
    are then in uv's cache and the engine's, for both runs alike (else the run of several
    Pythons alone would unpack the other Pythons' torch)."""
    return timed_build(cells, "example-cpp-ops", output, log)


def timed_build(cells: list[str], recipe: str, output: Path, log: Path) -> float:
    # WHEELMILL_ENGINE etc. as set
    return runs.wheelmill(
        ["build", "--no-publish", "--recipe", recipe, *(arg for cell in cells for arg in ("--cell", cell))],
        output=output,
        log=log,
    )


def cold_build(cells: list[str], recipe: str, output: Path, log: Path) -> tuple[float, dict[str, dict[str, Any]]]:
    """``timed_build`` from an empty compiler cache; its seconds and the cells' reports."""
    runs.empty_compiler_cache(output)
    seconds = timed_build(cells, recipe, output, log)
    return seconds, {cell: json.loads((output / cell / "report.json").read_text()) for cell in cells}


def build_seconds(report: dict[str, Any]) -> float:
    """The cell's build steps (the compilers' work), without the env, image and tests."""
    return float(sum(step["seconds"] for step in report["steps"] if step["step"] == "build"))


def cache_counts(report: dict[str, Any]) -> str:
    """``hits/misses`` of the compiler cache, over the cell's recipes."""
    hits = misses = 0
    for stats in (report.get("facts", {}).get("compiler_cache") or {}).values():
        if stats:
            hits += stats["hits"]
            misses += stats["misses"]
    return f"{hits} hits, {misses} misses"


@dataclass(frozen=True)
class Round:
    """One round: the first Python alone, then every Python in one run, both cold."""

    alone: float  # seconds of the run of the first Python
    together: float  # seconds of the run of them all
    first: dict[str, Any]  # the first Python's report, alone
    reports: dict[str, dict[str, Any]]  # each cell's report, in the run of them all

    @property
    def extras(self) -> list[dict[str, Any]]:
        return list(self.reports.values())[1:]

    def difference(self) -> float:
        """What the run of several took longer, a fraction of the first alone, per extra Python."""
        return (self.together - self.alone) / self.alone / len(self.extras)

    def slowed(self) -> float:
        """The first cell's time in the run of several against its time alone: what the
        cells beside it took from it."""
        return float(next(iter(self.reports.values()))["seconds"]) / float(self.first["seconds"])


def one_round(cells: list[str], recipe: str, output: Path, log: Path) -> Round:
    alone, first = cold_build(cells[:1], recipe, output, log)
    together, reports = cold_build(cells, recipe, output, log)
    return Round(alone=alone, together=together, first=first[cells[0]], reports=reports)


def print_round(number: int, cells: list[str], done: Round) -> None:
    print(
        f"round {number}: {cells[0]} alone {done.alone:.1f} s ({described(done.first)}); "
        f"all in one run {done.together:.1f} s"
    )
    for cell, report in zip(cells, done.reports.values(), strict=True):
        print(f"  {cell} in the run: {described(report)}")
    print(
        f"  the first cell in the run took {done.slowed():.2f} of its time alone; "
        f"each extra Python cost {done.difference():.2f} of the first",
        flush=True,
    )


def described(report: dict[str, Any]) -> str:
    """A cell's time and its build steps' (from its report), with the compiler cache's counts."""
    return (
        f"the cell {report['seconds']:.1f} s, of which build steps {build_seconds(report):.1f} s "
        f"({cache_counts(report)})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="cuda130")
    parser.add_argument("--recipe", default="example-cuda-ops")
    parser.add_argument("--pythons", default="3.11,3.12", help="comma-separated; the first is built alone too")
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds of the two runs; the median of the rounds' figures is the result"
    )
    parser.add_argument("--no-warm-up", dest="warm_up", action="store_false", help="start with the caches as they are")
    parser.add_argument("--smoke", action="store_true", help="one round, no warm-up: the script checked, no figure")
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.warm_up = 1, False
    pythons = list(dict.fromkeys(python.strip() for python in args.pythons.split(",") if python.strip()))
    if len(pythons) < 2:
        parser.error(
            f"--pythons {args.pythons}: name at least two different Pythons "
            "(an extra Python is what this measures), e.g. 3.11,3.13"
        )
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: give 1 or more")
    cells = [f"{args.variant}-py{python.replace('.', '')}" for python in pythons]
    print(f"variant {args.variant}, recipe {args.recipe}, cold compiler cache, {args.rounds} round(s)")
    with runs.workspace("wheelmill-bench-") as tmp:
        output, log = tmp / "wheels", tmp / "bench.log"
        if args.warm_up:
            print(
                f"warm-up (untimed): example-cpp-ops built once in {', '.join(cells)}, "
                f"{warm_up(cells, output, log):.1f} s",
                flush=True,
            )
        rounds = []
        for number in range(1, args.rounds + 1):
            rounds.append(one_round(cells, args.recipe, output, log))
            print_round(number, cells, rounds[-1])
        before = runs.cpu_seconds()
        timed_build(cells[1:], args.recipe, output, log)  # every compile from the cache now
        work = (runs.cpu_seconds() - before) / len(cells[1:])
        rebuilt = [json.loads((output / cell / "report.json").read_text()) for cell in cells[1:]]
    # On 2 shared cores one run moves by a tenth or more, and a difference of two runs
    # carries both runs' noise: the median of the rounds is the figure (the higher middle
    # one, where the rounds are even), each round's pair a few minutes apart.
    difference = median_high([done.difference() for done in rounds])
    first = median_high([float(done.first["seconds"]) for done in rounds])
    median = f"the median of {len(rounds)} rounds"
    print(
        f"each extra Python costs {difference:.2f} of the first by the runs' difference, "
        f"{median} (target <= {TARGET:.2f})"
    )
    # What no compiler cache takes away: the same cells again, alone, every compile a hit.
    floor = fmean([float(report["seconds"]) for report in rebuilt]) / first
    print(
        f"each extra Python's cell alone, every compile from the cache ({cache_counts(rebuilt[0])}): "
        f"{floor:.2f} of the first"
    )
    # Its processes' CPU time over the cores: alone, no order of its steps takes less; beside
    # the first cell, it runs on what the first leaves idle (one core of two while nvcc
    # compiles a file's host code, say), so the run of both takes less than the sum.
    cores = runs.cores()
    least = work / cores
    print(
        f"  its processes used {work:.1f} s of CPU; "
        f"on {cores} cores that work alone takes at least {least:.1f} s, {least / first:.2f} of the first"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
