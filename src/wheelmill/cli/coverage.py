"""``wheelmill coverage``: which wheel exists for which torch, accelerator, Python and
platform, for one release of a track; and why not, where none does.

    wheelmill coverage                          the test track's newest release, as a grid
    wheelmill coverage --track release 2.4.0    a final release
    wheelmill coverage --json                   the same as JSON (docs/coverage.md#json)
    wheelmill coverage --page                   the same as the index's coverage page, <index>/coverage/

Read from the matrix, the index's release records and the GPU stages they hold alone: the
same answer on any machine that reads the index, a tree or a bucket.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from wheelmill.cli.basics import Commands, load_inputs
from wheelmill.errors import UsageError, did_you_mean
from wheelmill.inputs.versions import Track
from wheelmill.settings import Settings

# What a command does loads when it runs, never to parse a command line or print its help.
if TYPE_CHECKING:
    from wheelmill.index.roots import Index
    from wheelmill.releases.coverage import Coverage, Spot


# How a spot reads in the grid: its mark, then its files' GPU stage where it has one.
SYMBOLS = {  # by each Mark's value (wheelmill.releases.coverage loads when the command runs)
    "built": ("B", "green"),
    "served": ("S", "cyan"),
    "failed": ("F", "bold red"),
    "planned": (".", "dim"),
    "opt-in": ("o", "dim"),
    "absent": (" ", ""),
}
WANTS_SHOWN = 10  # the terminal's; the JSON and the page hold every one
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
    cover.add_argument(
        "--wants",
        action="append",
        default=None,
        metavar="LOG",
        help="count what installers asked for and did not find, from these access logs (a file, a directory, "
        "or an s3:// prefix; repeatable; default: $WHEELMILL_ACCESS_LOGS)",
    )
    cover.add_argument(
        "--upstream",
        action="store_true",
        help="also read torch's upstream index for releases and labels the matrix lacks (`wheelmill matrix upstream`)",
    )
    cover.add_argument(
        "--page",
        action="store_true",
        help="write it as the index's coverage page, coverage/ at its root (the tables, the data, the finder)",
    )
    cover.set_defaults(func=cmd_coverage)


def cmd_coverage(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.cli.upstream import upstream_findings  # noqa: PLC0415
    from wheelmill.index.roots import Index  # noqa: PLC0415
    from wheelmill.releases.coverage import coverage, release_of  # noqa: PLC0415
    from wheelmill.releases.coverage_page import page_data  # noqa: PLC0415

    matrix, recipes = load_inputs(settings)
    for name in args.recipe:
        if name not in recipes:
            raise UsageError(
                f"coverage: unknown recipe '{name}'{did_you_mean(name, recipes)}",
                fix=f"use one of: {', '.join(sorted(recipes))}",
            )
    index = Index.of(settings)
    manifest = release_of(index.storage, Track(args.track), args.version)
    found = coverage(matrix, recipes, manifest, only=args.recipe)
    wanted = _wants(args.wants if args.wants is not None else settings.access_logs, index)
    upstream = [f.as_dict() for f in upstream_findings(matrix, settings)[1]] if args.upstream else []
    if args.page:
        write_coverage_page(found, settings, console, wants=wanted, upstream=upstream)
        return 0
    if args.json:
        print(json.dumps(page_data(found.as_dict(), wants=wanted, upstream=upstream), indent=2))
        return 0
    print_coverage(found, console)
    _print_wanted(wanted, upstream, console)
    return 0


def _wants(logs: Sequence[str], index: Index) -> list[dict[str, Any]]:
    """What installers asked the index's channels for and did not find, from ``logs``."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.index.wants import log_lines  # noqa: PLC0415
    from wheelmill.index.wants import wants as read_wants  # noqa: PLC0415

    lines = (line for log in logs for line in log_lines(log))
    return [want.as_dict() for want in read_wants(lines, index).wants]


def _print_wanted(wanted: Sequence[Mapping[str, Any]], upstream: Sequence[Mapping[str, Any]], console: Console) -> None:
    """The most asked-for wants, and what upstream has that the matrix lacks: a line each."""
    if wanted:
        console.print(f"\nwanted, most asked first ({len(wanted)}; `wheelmill wants` says more):", highlight=False)
    for want in wanted[:WANTS_SHOWN]:
        console.print(
            f"  {want['count']:>5}  {want['channel']}/{want['project']}  Python {want['python']} "
            f"{want['platform']}: {want['reason']}",
            highlight=False,
        )
    if upstream:
        console.print(f"\nupstream, not in the matrix ({len(upstream)}):", highlight=False)
    for found in upstream:
        said = f"  torch {found['torch']}+{found['label']}: {found['kind']} ({found['variant']})"
        console.print(said, highlight=False)


def write_coverage_page(
    found: Coverage,
    settings: Settings,
    console: Console,
    *,
    wants: Sequence[Mapping[str, Any]] = (),
    upstream: Sequence[Mapping[str, Any]] = (),
) -> str:
    """The coverage page of ``found`` beside the index's channels, and one line saying where;
    ``wants`` (``wheelmill wants``) and ``upstream`` (``matrix upstream``) are its wanted section."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.index.roots import Index  # noqa: PLC0415
    from wheelmill.releases.coverage_page import render_page, write_page  # noqa: PLC0415

    files = render_page(found.as_dict(), wants=wants, upstream=upstream, index_url=settings.served_index)
    where = write_page(Index.of(settings).storage, files)
    served = f", served at {settings.served_index}/coverage/" if settings.served_index else ""
    console.print(f"coverage page of {found.track}/{found.version}: {where}{served}", highlight=False, soft_wrap=True)
    return where


def print_coverage(found: Coverage, console: Console) -> None:
    """The grid, a recipe at a time and a line per variant, then each failed cell's why."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.releases.coverage import Mark, by_recipe, failures  # noqa: PLC0415

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
    symbol, style = SYMBOLS[spot.mark.value]
    return Text(symbol + _gpu(spot), style=style)


def _gpu(spot: Spot) -> str:
    """One character for the GPU stage of a spot's files on all their runners: the worst."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.releases.coverage_page import worst_outcome  # noqa: PLC0415

    worst = worst_outcome(outcome for f in spot.files for outcome in f.gpu.values())
    return "" if worst is None else GPU_SYMBOLS.get(worst, "?")


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
