"""``wheelmill coverage``: which wheel exists for which torch, accelerator, Python and
platform, for one release of a track; and why not, where none does.

    wheelmill coverage                          the test track's newest release, as a grid
    wheelmill coverage --track release 2.4.0    a final release
    wheelmill coverage --json                   the same as JSON (docs/coverage.md#json)

Read from the matrix, the index's release records and the GPU stages they hold alone: the
same answer on any machine that reads the index, a tree or a bucket.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from wheelmill.cli.basics import Commands, load_inputs
from wheelmill.errors import UsageError, did_you_mean
from wheelmill.index.roots import Index
from wheelmill.inputs.versions import Track
from wheelmill.releases.coverage import Coverage, Mark, Spot, by_recipe, coverage, failures, release_of
from wheelmill.settings import Settings

# How a spot reads in the grid: its mark, then its files' GPU stage where it has one.
SYMBOLS = {
    Mark.BUILT: ("B", "green"),
    Mark.SERVED: ("S", "cyan"),
    Mark.FAILED: ("F", "bold red"),
    Mark.PLANNED: (".", "dim"),
    Mark.OPT_IN: ("o", "dim"),
    Mark.ABSENT: (" ", ""),
}
GPU_SYMBOLS = {"passed": "+", "failed": "x", "mismatch": "x", "import-only": "i", "not-covered": "-"}
LEGEND = (
    "B built here  S served: its group's one build  F failed  . planned  o opt-in  (blank) not in matrix\n"
    "its GPU stage, after B or S: + passed on each runner  x failed  i import-only  ? not run  - none"
)


def register(commands: Commands) -> None:
    cover = commands.add_parser(
        "coverage", help="which wheel exists for each torch, CUDA/ROCm, Python and platform, and why not"
    )
    cover.add_argument(
        "version", nargs="?", default=None, help="the release, e.g. 2.4.0rc1 (default: the track's newest)"
    )
    cover.add_argument(
        "--track",
        default=Track.TEST.value,
        choices=[t.value for t in Track],
        help="the release's track (default: test, where release candidates are)",
    )
    cover.add_argument(
        "--recipe",
        action="append",
        default=[],
        metavar="NAME",
        help="only this recipe (repeatable; default: every recipe)",
    )
    cover.add_argument("--json", action="store_true", help="the coverage as JSON, held to its schema")
    cover.set_defaults(func=cmd_coverage)


def cmd_coverage(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    matrix, recipes = load_inputs(settings)
    for name in args.recipe:
        if name not in recipes:
            raise UsageError(
                f"coverage: unknown recipe '{name}'{did_you_mean(name, recipes)}",
                fix=f"use one of: {', '.join(sorted(recipes))}",
            )
    manifest = release_of(Index.of(settings).storage, Track(args.track), args.version)
    found = coverage(matrix, recipes, manifest, only=args.recipe)
    if args.json:
        print(json.dumps(found.as_dict(), indent=2))
        return 0
    print_coverage(found, console)
    return 0


def print_coverage(found: Coverage, console: Console) -> None:
    """The grid, a recipe at a time and a line per variant, then each failed cell's why."""
    counts = ", ".join(f"{n} {mark}" for mark, n in found.counts().items() if n)
    console.print(f"{found.track}/{found.version} at {found.commit[:12]}: {counts}", highlight=False)
    console.print(LEGEND, style="dim", highlight=False)
    for recipe, lines in by_recipe(found).items():
        if all(s.mark in (Mark.OPT_IN, Mark.ABSENT) for _variant, spots in lines for s in spots):
            cells = sum(s.mark is Mark.OPT_IN for _variant, spots in lines for s in spots)
            console.print(f"{recipe}: opt-in, in {cells} cells of {len(lines)} variants; none built", highlight=False)
            continue
        table = Table(title=recipe, title_justify="left", box=None, pad_edge=False, padding=(0, 1))
        table.add_column("variant", no_wrap=True)
        table.add_column("torch", no_wrap=True)
        table.add_column("accelerator", no_wrap=True)
        for python in found.pythons:
            table.add_column(python, no_wrap=True, min_width=4)
        for variant, spots in lines:
            table.add_row(variant.name, variant.torch, variant.accelerator, *(_cell(s) for s in spots))
        console.print(table)
    _print_failures(failures(found), console)


def _cell(spot: Spot) -> Text:
    symbol, style = SYMBOLS[spot.mark]
    return Text(symbol + _gpu(spot), style=style)


def _gpu(spot: Spot) -> str:
    """One character for the GPU stage of a spot's files on all their runners: the worst."""
    outcomes = [outcome for f in spot.files for outcome in f.gpu.values()]
    if not outcomes:
        return ""
    for worst in ("failed", "mismatch", "not-run", "skipped", "no-gpu", "stopped", "import-only", "not-covered"):
        if worst in outcomes:
            return GPU_SYMBOLS.get(worst, "?")
    return GPU_SYMBOLS["passed"]


def _print_failures(failed: Sequence[Spot], console: Console) -> None:
    if not failed:
        return
    console.print(f"\nfailed cells: {len(failed)}", highlight=False)
    for spot in failed:
        failure = spot.failure
        if failure is None:
            continue
        step = f"{failure.step} ({failure.recipe})" if failure.recipe else failure.step
        console.print(f"  {spot.cell}: {step}, exit {failure.exit_code}: {shortened(failure.error)}", highlight=False)
        for where in (failure.log, failure.run):
            if where:
                console.print(f"    {where}", highlight=False, soft_wrap=True)


def shortened(line: str, most: int = 160) -> str:
    """A long error line cut to ``most`` characters, for the terminal (the JSON keeps it whole)."""
    return line if len(line) <= most else line[: most - 1] + "…"
