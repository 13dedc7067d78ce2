"""The ``wheelmill`` command. Each group of commands is a module of this package with one
convention: ``register(commands)`` adds its parsers, and each parser's ``func`` is a
``cmd_<name>(args, settings, console) -> int``. Settings are resolved once, here: the
``WHEELMILL_*`` variables with the command line layered over them.

This is the one place where errors become exit codes: every ``WheelmillError`` is printed
as one line (what happened; the fix) with its own code. Anything else is a bug: its
traceback goes to a log file, the terminal gets one line that names it, and the exit code
is ``InternalError``'s. Nothing prints a traceback at a user.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import NoReturn

from wheelmill import __version__
from wheelmill.building.ui import make_console
from wheelmill.cli import build, conda, doctor, gpu, image, index, key, release, verify
from wheelmill.cli.common import Parser, print_error
from wheelmill.errors import InternalError, Interrupted, WheelmillError
from wheelmill.machine.process import StepLog
from wheelmill.settings import Settings


def build_parser() -> Parser:
    parser = Parser(
        prog="wheelmill", description="Build, check and repair PyTorch extension wheels for every cell of a matrix."
    )
    parser.add_argument("--version", action="version", version=f"wheelmill {__version__}")
    parser.add_argument(
        "--recipes", type=Path, default=None, help="the recipes directory (default: $WHEELMILL_RECIPES or recipes)"
    )
    parser.add_argument("--output", type=Path, default=None, help="output root (default: $WHEELMILL_OUTPUT or wheels)")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for group in (build, index, conda, image, release, doctor, gpu, key, verify):
        group.register(commands)
    return parser


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """CI cancels with SIGTERM: treat it like Ctrl-C, so the same cleanup runs."""

    def handler(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    console = make_console()
    try:
        with _sigterm_as_interrupt():
            args = build_parser().parse_args(argv)
            settings = Settings.from_environ().layered(
                output=args.output, recipes=args.recipes, engine=getattr(args, "engine", None)
            )
            code: int = args.func(args, settings, console)
            return code
    except WheelmillError as exc:
        print_error(exc.one_line())
        return exc.exit_code
    except KeyboardInterrupt:
        print_error("interrupted")
        return Interrupted.exit_code
    except Exception as exc:  # noqa: BLE001 - the boundary: a bug gets one line and a log, not a traceback
        log = _crash_log(exc)
        print_error(
            InternalError(
                f"internal error: {type(exc).__name__}: {exc}",
                fix=f"this is a bug in wheelmill; its traceback is in {log}",
            ).one_line()
        )
        return InternalError.exit_code


def _crash_log(exc: Exception) -> Path:
    """Write the traceback where it can be read later: a file of its own."""
    fd, name = tempfile.mkstemp(prefix=f"wheelmill-crash-{time.strftime('%Y%m%dT%H%M%S')}-", suffix=".log")
    os.close(fd)
    with StepLog(Path(name)) as log:
        log.traceback(exc)
    return Path(name)


# Native modules whose background threads outlive a command: py-rattler's runtime may call
# into the interpreter while it finalizes, and a finished command then dies at its exit
# (SIGABRT or SIGSEGV, one run in ten here). After one of them ran, the command ends at once
# instead: everything it wrote is closed by then, and only stdout and stderr need a flush.
_EXIT_AT_ONCE_AFTER = ("rattler", "rattler_build")


def entry() -> NoReturn:
    code = main()
    if any(name in sys.modules for name in _EXIT_AT_ONCE_AFTER):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
