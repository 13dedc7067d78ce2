"""``wheelmill wants``: what installers asked the served index's channels for that they could
not serve (``wheelmill.index.wants``), read from its access logs and held to the index
(``WHEELMILL_INDEX_ROOT``) as it is now: a ranked table, or the report as JSON."""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console
from rich.table import Table

from wheelmill.cli.basics import Commands, positive
from wheelmill.errors import ChannelError, UsageError
from wheelmill.settings import Settings

# What a command does loads when it runs, never to parse a command line or print its help.
if TYPE_CHECKING:
    from wheelmill.index.wants import WantsReport


WIDTH = 100  # the table's columns at most, whatever the terminal's


def register(commands: Commands) -> None:
    parser = commands.add_parser(
        "wants", help="what installers asked the served channels for that they could not serve, from access logs"
    )
    parser.add_argument(
        "--log",
        action="append",
        required=True,
        metavar="LOG",
        help="an access log (.gz too), a directory of them, or s3://bucket/prefix/ (every object under it); repeatable",
    )
    parser.add_argument("--channel", help="only the requests of this channel (cu130, test/cu130, ...)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    parser.add_argument("--top", type=positive, metavar="N", help="only the N most asked wants")
    parser.set_defaults(func=cmd_wants)


def cmd_wants(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    report = _read(args, settings)
    shown = report.top(args.top) if args.top else report
    if args.json:
        console.out(json.dumps(shown.as_dict(), indent=2), highlight=False)
        return 0
    if shown.wants:
        console.print(_table(shown), width=min(console.width, WIDTH))
    console.print(_summary(report, shown), highlight=False, markup=False)
    return 0


def _read(args: argparse.Namespace, settings: Settings) -> WantsReport:
    """The report of the logs ``--log`` names, held to the index; one error where the
    command line, the index or the logs cannot give one."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.index.channels import is_channel_name  # noqa: PLC0415
    from wheelmill.index.roots import Index  # noqa: PLC0415
    from wheelmill.index.wants import wants  # noqa: PLC0415

    if args.channel is not None and not is_channel_name(args.channel):
        raise UsageError(
            f"wants: --channel {args.channel}: not a channel name",
            fix="give a channel as the index names it: cu130, or test/cu130 in a track",
        )
    locations = [_checked_log(location) for location in args.log]
    index = Index.of(settings)
    if not index.channel_names():
        raise ChannelError(
            f"wants: the index {index.location} has no channels to hold the requests to",
            fix="set WHEELMILL_INDEX_ROOT to the index the logs are of",
        )
    report = wants(_every_line(locations), index, channel=args.channel)
    if report.lines and report.skipped == report.lines:
        raise UsageError(
            f"wants: no line of {', '.join(locations)} ({report.lines} read) is a request in the access log's format",
            fix="log with `wheelmill index serve --access-log FILE` or nginx's wheelmill_wants format "
            "(docs/wheel-index.md, 'What users asked for')",
        )
    return report


def _checked_log(location: str) -> str:
    """``location`` where it is a bucket's or is on this machine; a ``UsageError`` otherwise."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.index.roots import is_bucket_location  # noqa: PLC0415

    if is_bucket_location(location) or Path(location).exists():
        return location
    raise UsageError(
        f"wants: --log {location}: no such file or directory",
        fix="give an access log, a directory of them, or s3://bucket/prefix/",
    )


def _every_line(locations: list[str]) -> Iterator[str]:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.index.wants import log_lines  # noqa: PLC0415

    return itertools.chain.from_iterable(log_lines(location) for location in locations)


def _table(report: WantsReport) -> Table:
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1), collapse_padding=True)
    table.add_column("asked", justify="right")
    for column in ("channel", "project", "python", "platform", "reason", "installers"):
        table.add_column(column, overflow="fold")
    for want in report.wants:
        installers = ", ".join(f"{name} {count}" for name, count in want.installers)
        python = want.python if want.implementation == "CPython" else f"{want.implementation} {want.python}"
        table.add_row(str(want.count), want.channel, want.project, python, want.platform, want.reason, installers)
    return table


def _summary(report: WantsReport, shown: WantsReport) -> str:
    """One line: how many wants, from how many of the installers' requests, from how many lines."""
    top = f" (the {len(shown.wants)} most asked shown)" if len(shown.wants) < len(report.wants) else ""
    unserved = report.requests - report.served
    return (
        f"{len(report.wants)} wants{top}: {unserved} of {report.requests} installers' requests of project pages "
        f"found no file; {report.lines} lines read, {report.skipped} skipped"
    )
