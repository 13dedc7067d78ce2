"""How long publishing one wheel takes in a big index.

Fills a channel with 10,000 wheels across 1,000 projects (through the same publish code),
then publishes more wheels one at a time, half into existing projects and half as new
projects, and prints the median of each: once through the API (the store itself) and once
through the CLI (``wheelmill publish``, a whole process, as users and the build run it).
Target: <= 0.5 s. Usage: ``.venv/bin/python benchmarks/publish.py [--projects 1000 --files 10]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import runs  # noqa: E402 - beside this file, as for the other benchmarks

from tests.wheels import make_wheel  # noqa: E402 - the test helper that writes real wheels
from wheelmill.index.store import Channel, publish  # noqa: E402
from wheelmill.index.verify import verify  # noqa: E402

TARGET = 0.5


def fill(channel: Channel, work: Path, projects: int, files: int) -> float:
    started = time.monotonic()
    for p in range(projects):
        for f in range(files):
            publish(
                channel,
                make_wheel(
                    work / "fill", f"bench-project-{p:04d}", f"1.{f}", tag="py3-none-any", files={"m.py": b"x = 1\n"}
                ),
            )
            (work / "fill").joinpath(f"bench_project_{p:04d}-1.{f}-py3-none-any.whl").unlink()
        if p % 100 == 99:
            print(f"  filled {(p + 1) * files} files", flush=True)
    return time.monotonic() - started


def measure(channel: Channel, work: Path, rounds: int, projects: int) -> tuple[list[float], list[float]]:
    api, cli = [], []
    env = {**os.environ, "WHEELMILL_INDEX_ROOT": str(channel.root)}
    for r in range(rounds):
        target = f"bench-project-{r * 37 % projects:04d}" if r % 2 == 0 else f"bench-new-{r}"
        wheel = make_wheel(work / "api", target, f"2.{r}", tag="py3-none-any")
        started = time.monotonic()
        publish(channel, wheel)
        api.append(time.monotonic() - started)
        wheel = make_wheel(work / "cli", target, f"3.{r}", tag="py3-none-any")
        started = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "wheelmill", "publish", "--channel", channel.name, str(wheel)],
            env=env,
            check=True,
            capture_output=True,
        )
        cli.append(time.monotonic() - started)
    return api, cli


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--projects", type=int, default=1000)
    parser.add_argument("--files", type=int, default=10, help="files per project")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="wheelmill-publish-bench-") as tmp:
        work = Path(tmp)
        channel = Channel(work / "index", "cu130")
        seconds = fill(channel, work, args.projects, args.files)
        print(f"index: {args.projects * args.files} files in {args.projects} projects (filled in {seconds:.0f} s)")
        api, cli = measure(channel, work, args.rounds, args.projects)
        problems = verify(channel, hashes=False)
        print(f"publish one wheel, median of {args.rounds}:")
        print(f"  API {statistics.median(api):.3f} s (max {max(api):.3f})")
        print(f"  CLI {statistics.median(cli):.3f} s (max {max(cli):.3f})")
        print(f"target <= {TARGET} s; index valid afterwards: {not problems}")
    if problems:
        return runs.broken(f"the index is not valid after the publishes: {problems[0]} ({len(problems)} problems)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
