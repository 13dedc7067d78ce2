"""What every extra Python of a variant costs: one cell built alone, then the same variant's
cells for several Pythons in one run, each from a cold compiler cache.

Both runs happen here, one after the other, in this process tree, each into a fresh
temporary output root (so a fresh local compiler cache, and nothing published to skip):

1. ``wheelmill build --cell VARIANT-pyA --recipe RECIPE``: the first Python alone;
2. ``wheelmill build --cell 'VARIANT-py{A,B,...}' --recipe RECIPE``: the same, and every
   other Python after it, in one run sharing the cache under the output root.

Prints both wall times, the compiler cache's hits and misses per cell, and the cost of each
extra Python as a fraction of the first (target: <= 0.20; device code does not depend on
Python, so only what does should be compiled again). Usage:
``.venv/bin/python benchmarks/pythons.py [--variant cuda130] [--recipe example-cuda-ops] [--pythons 3.11,3.12]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TARGET = 0.20


def timed_build(cells: list[str], recipe: str, output: Path, log: Path) -> float:
    env = {**os.environ, "WHEELMILL_OUTPUT": str(output)}
    argv = [sys.executable, "-m", "wheelmill", "build", "--no-publish", "--recipe", recipe]
    for cell in cells:
        argv += ["--cell", cell]
    started = time.monotonic()
    with log.open("a") as out:
        subprocess.run(argv, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, check=True)
    return time.monotonic() - started


def cache_counts(report: dict[str, Any]) -> str:
    """``hits/misses`` of the compiler cache, over the cell's recipes."""
    hits = misses = 0
    for stats in (report.get("facts", {}).get("compiler_cache") or {}).values():
        if stats:
            hits += sum(stats.get("hits", {}).values())
            misses += sum(stats.get("misses", {}).values())
    return f"{hits} hits, {misses} misses"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="cuda130")
    parser.add_argument("--recipe", default="example-cuda-ops")
    parser.add_argument("--pythons", default="3.11,3.12", help="comma-separated; the first is built alone too")
    args = parser.parse_args()
    cells = [f"{args.variant}-py{python.replace('.', '')}" for python in args.pythons.split(",")]
    with tempfile.TemporaryDirectory(prefix="wheelmill-bench-") as tmp:
        alone_root, all_root, log = Path(tmp) / "alone", Path(tmp) / "all", Path(tmp) / "bench.log"
        alone = timed_build(cells[:1], args.recipe, alone_root, log)
        together = timed_build(cells, args.recipe, all_root, log)
        counts = {cell: cache_counts(json.loads((all_root / cell / "report.json").read_text())) for cell in cells}
    extra = (together - alone) / alone / max(1, len(cells) - 1)
    print(f"variant {args.variant}, recipe {args.recipe}, cold compiler cache")
    print(f"{cells[0]} alone: {alone:.1f} s")
    print(f"{', '.join(cells)} in one run: {together:.1f} s ({'; '.join(f'{c}: {n}' for c, n in counts.items())})")
    print(f"each extra Python costs {extra:.2f} of the first (target <= {TARGET:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
