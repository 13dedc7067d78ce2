"""What a command's start costs: the CPU time of ``wheelmill`` command lines that parse, print
help or fail on their arguments and do nothing else, against the interpreter's own start.

Each command line and the baseline (``python -c pass``, the same interpreter) run
``--rounds`` times (15), one after the other in this process tree, each alone; a command's
CPU time is its process's user and system time (this process's children's), and the figure is
the median of its rounds (a shared machine's neighbours move one run). For each, the median,
its ratio to the baseline's, and whether it is within the target (0.15 s of CPU: the CLI's
start was 0.7 to 1.0 s when every layer loaded). ``--smoke`` runs 2 rounds: a check that the
script works, not a figure.

Usage: ``.venv/bin/python benchmarks/start.py [--rounds N] [--smoke]``
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

from runs import cpu_seconds

TARGET = 0.15  # seconds of CPU for a command line that only parses
COMMANDS = (
    "--help",
    "pubish",
    "build --help",
    "build --bogus",
    "index serve --port 70000",
    "publish --help",
    "release --help",
    "coverage --help",
    "verify --help",
)


def cpu_of(argv: list[str]) -> float:
    """The CPU seconds one run of ``argv`` took (its output dropped; its exit status is its own)."""
    before = cpu_seconds()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return cpu_seconds() - before


def median_of(argv: list[str], rounds: int) -> float:
    return statistics.median(cpu_of(argv) for _ in range(rounds))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="runs of each command line; the median is its figure")
    parser.add_argument("--smoke", action="store_true", help="2 rounds: the script checked, no figure")
    args = parser.parse_args()
    rounds = 2 if args.smoke else args.rounds
    baseline = median_of([sys.executable, "-c", "pass"], rounds)
    print(f"baseline `python -c pass`: {baseline:.3f} s of CPU, the median of {rounds} rounds")
    worst = 0.0
    for command in COMMANDS:
        cpu = median_of([sys.executable, "-m", "wheelmill", *command.split()], rounds)
        worst = max(worst, cpu)
        ratio = cpu / baseline if baseline > 0 else float("inf")
        within = "within" if cpu <= TARGET else "over"
        print(f"  wheelmill {command:<26} {cpu:.3f} s of CPU, {ratio:5.1f}x the baseline ({within} {TARGET} s)")
    print(f"the most: {worst:.3f} s of CPU (target {TARGET} s){' (smoke: no figure)' if args.smoke else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
