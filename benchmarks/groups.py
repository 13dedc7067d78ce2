"""What every extra torch and Python costs a recipe built once for all of them (the stable
example, ``abi = "stable"``): one cell built alone, then the ABI group's cells in one
run, where the first builds it and the others take its group build (no compile: their checks after
repair, their install test in the group's corners, and publishing). The group is the
variant and its variants of other torch releases on the variant's own platform (an aarch64
twin is another machine's group), its oldest torch first: that torch's cells build the one
build (issue 42), so the first cell is one of them.

After an untimed warm-up (every cell's lock and env made once, nothing published), both runs
happen here, one after the other, in this process tree, in the warm-up's output root, each
into an empty index (so the first cell always builds) and from an empty compiler cache,
without mirroring the closure (``--no-mirror``: a channel's torch is mirrored once, whatever
is built; it is no cost of the group build):

1. ``wheelmill build --cell FIRST --recipe RECIPE``: the first cell alone;
2. ``wheelmill build --cell FIRST --cell ... --recipe RECIPE``: the same, then every other
   cell of the group given (``--torches`` x ``--pythons``), in one run.

Each round prints both wall times, each cell's own steps (its time but the wait for the cell
that builds, from its report) and the cost of each extra cell as a fraction of the first:
the difference of the two runs over the extra cells (target: <= 0.05; the per-torch example's
extra Python costs 0.13, see ``pythons.py``). The median of the rounds is the result.
``--smoke`` runs the least that goes through all of it (one round, no warm-up): a check that
the script works, not a figure. Usage:
``.venv/bin/python benchmarks/groups.py [--variant cuda130] [--pythons 3.10,3.13] [--rounds 3] [--smoke]``
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from statistics import median_high
from typing import Any

import runs
from packaging.version import Version

from wheelmill.inputs.matrix import Matrix, load_matrix

TARGET = 0.05
RECIPE = "example-stable-ops"


def build(cells: list[str], output: Path, log: Path, *, index: Path | None, publish: bool = True) -> float:
    args = ["build", "--recipe", RECIPE, *(arg for cell in cells for arg in ("--cell", cell))]
    args += ["--no-mirror"] if publish else ["--no-publish"]
    env = {"WHEELMILL_INDEX_ROOT": str(index)} if index else None
    return runs.wheelmill(args, output=output, log=log, env=env)


def fresh_build(cells: list[str], output: Path, log: Path) -> tuple[float, dict[str, dict[str, Any]]]:
    """``build`` into an empty index from an empty compiler cache; its seconds and the reports."""
    index = output.parent / "index"
    shutil.rmtree(index, ignore_errors=True)
    runs.empty_compiler_cache(output)
    seconds = build(cells, output, log, index=index)
    return seconds, {cell: json.loads((output / cell / "report.json").read_text()) for cell in cells}


def group_cells(matrix: Matrix, name: str, pythons: list[str]) -> list[str]:
    """The cells of variant ``name``'s ABI group for ``pythons`` (``311``): the variant and
    its variants of other torch releases on its platform, the oldest torch's first."""
    variant = matrix.variants[name]
    declared = name.removesuffix(f"-{variant.platform_tag}") if variant.platform_tag else name
    others = [v for v in matrix.variants.values() if v.torch_of == declared and v.platform == variant.platform]
    variants = sorted([variant, *others], key=lambda v: Version(v.torch))
    return [f"{v.name}-py{python}" for v in variants for python in pythons]


def own_seconds(report: dict[str, Any]) -> float:
    """A cell's steps but its waiting for the cell that builds what it takes (the steps'
    sum: the wait is before its build-keys step, in no step)."""
    return float(sum(step["seconds"] for step in report["steps"]))


def statuses(report: dict[str, Any]) -> str:
    steps = {step["step"]: step["status"] for step in report["steps"] if step.get("recipe") == RECIPE}
    return f"build {steps.get('build')}, install-test {steps.get('install-test')}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="cuda130")
    parser.add_argument("--pythons", default="3.10,3.13", help="comma-separated; the first is the first cell's")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="one round, no warm-up: the script checked, no figure")
    args = parser.parse_args()
    pythons = [p.strip().replace(".", "") for p in args.pythons.split(",") if p.strip()]
    rounds = 1 if args.smoke else args.rounds
    if rounds < 1 or not pythons:
        parser.error("give one Python or more and one round or more")
    matrix = load_matrix(runs.ROOT / "recipes" / "matrix.toml")
    if args.variant not in matrix.variants:
        parser.error(f"--variant {args.variant}: not a variant of recipes/matrix.toml")
    cells = group_cells(matrix, args.variant, pythons)
    if len(cells) < 2:
        parser.error(f"{args.variant} with --pythons {args.pythons} is one cell: no other takes its group build")
    said = f"{cells[0]} builds, the rest take its group build"
    print(f"recipe {RECIPE}, cells {', '.join(cells)}; {said}; {rounds} round(s)")
    with runs.workspace("wheelmill-bench-groups-") as tmp:
        output, log = tmp / "wheels", tmp / "bench.log"
        if not args.smoke:
            warm = build(cells, output, log, index=None, publish=False)
            print(f"warm-up (untimed, every cell built, nothing published): {warm:.1f} s", flush=True)
        figures = []
        for number in range(1, rounds + 1):
            alone, first = fresh_build(cells[:1], output, log)
            together, reports = fresh_build(cells, output, log)
            extra = (together - alone) / alone / (len(cells) - 1)
            figures.append(extra)
            print(f"round {number}: {cells[0]} alone {alone:.1f} s (its steps {own_seconds(first[cells[0]]):.1f} s); "
                  f"all {len(cells)} in one run {together:.1f} s")  # fmt: skip
            for cell, report in reports.items():
                print(f"  {cell}: its steps {own_seconds(report):.1f} s ({statuses(report)})")
            compiled = [cell for cell, report in list(reports.items())[1:] if "build ok" in statuses(report)]
            if compiled:
                return runs.broken(f"{', '.join(compiled)} compiled {RECIPE}: it was to take the group build")
            print(f"  each extra torch or Python cost {extra:.3f} of the first", flush=True)
    print(
        f"each extra torch or Python costs {median_high(figures):.3f} of the first cell, "
        f"the median of {len(figures)} rounds (target <= {TARGET:.2f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
