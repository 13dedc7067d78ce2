"""What a build costs when nothing changed: a cell built once, then again.

Both runs happen here, one after the other, in this process tree, into the same temporary
output root and index:

1. ``wheelmill build --cell CELL --recipe RECIPE``: everything built, checked, published
   with its build key;
2. the same command again: every recipe's build key is published already, so nothing is
   fetched, compiled or tested, and the cell's env and closure steps do not run.

Prints both wall times, what the re-run's report says was compiled (nothing, for the
target to mean anything) and the ratio (target: re-run <= 3 s). Usage:
``.venv/bin/python benchmarks/noop.py [--cell cpu-py311] [--recipe example-cpp-ops | --recipe '']``
(an empty recipe: the cell's default recipes).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import runs

TARGET = 3.0


def timed_build(cell: str, recipe: str, output: Path, log: Path) -> float:
    return runs.wheelmill(
        ["build", "--engine", "none", "--cell", cell, *(["--recipe", recipe] if recipe else [])], output=output, log=log
    )


def compiled(report: dict[str, Any]) -> list[str]:
    """The recipes whose build step ran in this run."""
    return [step["recipe"] for step in report["steps"] if step["step"] == "build" and step["status"] == "ok"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", default="cpu-py311")
    parser.add_argument("--recipe", default="example-cpp-ops", help="'' for the cell's default recipes")
    args = parser.parse_args()
    with runs.workspace("wheelmill-bench-") as tmp:
        output, log = tmp / "wheels", tmp / "bench.log"
        first = timed_build(args.cell, args.recipe, output, log)
        built = compiled(json.loads((output / args.cell / "report.json").read_text()))
        again = timed_build(args.cell, args.recipe, output, log)
        report = json.loads((output / args.cell / "report.json").read_text())
    statuses = ", ".join(f"{r['name']} {r['status']}" for r in report["recipes"])
    print(f"cell {args.cell}, recipes {', '.join(r['name'] for r in report['recipes'])}")
    print(f"first run (built {', '.join(built) or 'nothing'}): {first:.1f} s")
    print(
        f"re-run (compiled: {', '.join(compiled(report)) or 'nothing'}; {statuses}): "
        f"{again:.2f} s (target <= {TARGET:.0f} s)"
    )
    print(f"ratio re-run / first run: {again / first:.3f}")
    if compiled(report):
        return runs.broken(f"the re-run compiled {', '.join(compiled(report))}: nothing was to be built")
    return 0


if __name__ == "__main__":
    sys.exit(main())
