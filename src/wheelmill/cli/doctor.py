"""``wheelmill doctor``: would the GPU code of the installed wheels run on this machine's
GPUs? A thin wrapper around ``wheelmill.images.doctor``, which also runs alone in the images."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from rich.console import Console

from wheelmill.cli.basics import Commands
from wheelmill.errors import DoctorError, UsageError
from wheelmill.settings import Settings

# What a command does loads when it runs, never to parse a command line or print its help.
if TYPE_CHECKING:
    pass


def register(commands: Commands) -> None:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.images import doctor  # noqa: PLC0415

    sub = commands.add_parser(
        "doctor", help="say whether the installed wheels' GPU code would run on this machine's GPUs (or a declared one)"
    )
    doctor.add_arguments(sub)
    sub.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace, _settings: Settings, _console: Console) -> int:
    """The report on stdout; a wheel that would fail is a ``DoctorError``."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.images import doctor  # noqa: PLC0415

    try:
        result = doctor.run(args, os.environ)
    except doctor.Problem as exc:
        raise UsageError(f"doctor: {exc.message}", fix=exc.fix) from None
    sys.stdout.write(doctor.as_json(result) if args.json else doctor.format_report(result))
    failure = result.failure()
    if failure is not None:
        raise DoctorError(f"doctor: {failure[0]}", fix=failure[1])
    return doctor.EXIT_OK
