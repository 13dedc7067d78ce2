"""The ``wheelmill`` command. Each group of commands is a module of this package with one
convention: ``register(commands)`` adds its parsers, and each parser's ``func`` is a
``cmd_<name>(args, settings, console) -> int``. A command line imports its own group alone
(``GROUPS``): all of them together were most of a command's start. Settings are resolved
once, here: the ``WHEELMILL_*`` variables with the command line layered over them.

This is the one place where errors become exit codes: every ``WheelmillError`` is printed
as one line (what happened; the fix) with its own code. Anything else is a bug: its
traceback goes to a log file, the terminal gets one line that names it, and the exit code
is ``InternalError``'s. Nothing prints a traceback at a user.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import NoReturn

from wheelmill import __version__
from wheelmill.cli.basics import Parser, print_error
from wheelmill.cli.examples import add_examples
from wheelmill.errors import InternalError, Interrupted, WheelmillError, remember_environment
from wheelmill.settings import Settings
from wheelmill.terminal import make_console

# Each command, and the module of its group. A unit test holds this table to what the groups
# register. A publish's start took 0.86 s of CPU with every group imported, 0.37 s with its own.
GROUPS: dict[str, str] = {
    **dict.fromkeys(("matrix", "validate", "plan", "build", "mirror", "lock"), "build"),
    **dict.fromkeys(("publish", "yank", "unyank", "index"), "index"),
    "wants": "wants",
    "conda": "conda",
    "image": "image",
    "release": "release",
    "coverage": "coverage",
    "doctor": "doctor",
    "test-gpu": "gpu",
    "key": "key",
    "verify": "verify",
}
# as a parser of every command lists them (the reference page's order)
ORDER = ("build", "index", "wants", "conda", "image", "release", "coverage", "doctor", "gpu", "key", "verify")
HELP_WIDTH = 100  # the widest line of the commands' list
# What `wheelmill --help` lists, by what a command is for: from here, so that help, a
# mistyped command and a missing one import no group at all (a unit test holds each line to
# the help its group registers).
SECTIONS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    (
        "build cells",
        (
            ("matrix", "print the supported cells"),
            ("validate", "load and check the matrix and every recipe"),
            ("plan", "print the ordered steps; run nothing"),
            ("build", "build, check, repair and install-test"),
            (
                "mirror",
                "resolve a built cell's runtime closure (torch and every dependency) and mirror it into its channel",
            ),
            ("lock", "resolve and write locks/<cell>.txt, the committed lock of a cell's build env"),
        ),
    ),
    (
        "the index",
        (
            ("publish", "add wheels to a channel of the local index, or upload them to another index"),
            ("yank", "yank every file of a version (PEP 592)"),
            ("unyank", "unyank every file of a version (PEP 592)"),
            ("index", "serve, check and describe the local index"),
            ("wants", "what installers asked the served channels for that they could not serve, from access logs"),
        ),
    ),
    (
        "releases",
        (
            ("release", "build and publish a tag's or a nightly's cells; promote; prune"),
            ("coverage", "which wheel exists for each torch, CUDA/ROCm, Python and platform, and why not"),
        ),
    ),
    (
        "conda and images",
        (
            ("conda", "conda packages and channels beside the wheel index"),
            ("image", "container images that install from a cell's channel alone"),
        ),
    ),
    (
        "GPU machines",
        (
            (
                "doctor",
                "say whether the installed wheels' GPU code would run on this machine's GPUs (or a declared one)",
            ),
            (
                "test-gpu",
                (
                    "the GPU stage: install a cell's wheels from its channel on a GPU machine, run doctor and the "
                    "recipes' GPU checks, and report"
                ),
            ),
        ),
    ),
    (
        "provenance",
        (
            ("key", "the keys that sign the provenance beside published files"),
            (
                "verify",
                "check published wheels against their signed provenance, their SBOMs and the team's public keys",
            ),
        ),
    ),
)
_TAKES_A_VALUE = ("--recipes", "--output")


def command_word(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names, past the options before it (and their values, an
    abbreviation argparse accepts included); None where help or the version comes first.

    >>> command_word(["--recipes", "r", "publish", "--channel", "cpu", "w.whl"]), command_word(["--out=o", "yank"])
    ('publish', 'yank')
    >>> command_word(["--rec", "index", "build"]), command_word(["-h", "build"]), command_word([])
    ('build', None, None)
    """
    words = iter(argv)
    for word in words:
        if word in ("-h", "--help", "--version"):
            return None
        if not word.startswith("-"):
            return word
        if "=" not in word and len(word) > 2 and any(option.startswith(word) for option in _TAKES_A_VALUE):
            next(words, None)
    return None


def build_parser(argv: Sequence[str] | None = None) -> Parser:
    """The parser, with the group of the command ``argv`` names alone; with every group where
    it names none that is known (help lists them all, a mistyped one gets its did-you-mean)."""
    parser = Parser(
        prog="wheelmill", description="Build, check and repair PyTorch extension wheels for every cell of a matrix."
    )
    parser.add_argument("--version", action="version", version=f"wheelmill {__version__}")
    parser.add_argument(
        "--recipes", type=Path, default=None, help="the recipes directory (default: $WHEELMILL_RECIPES or recipes)"
    )
    parser.add_argument("--output", type=Path, default=None, help="output root (default: $WHEELMILL_OUTPUT or wheels)")
    commands = parser.add_subparsers(
        dest="command", required=True, parser_class=Parser, metavar="COMMAND", help="one of those below"
    )
    command = None if argv is None else command_word(argv)
    if argv is not None and command not in GROUPS:  # help, or a command mistyped or missing: the table's
        _listed(parser, commands)
        return parser
    for group in [GROUPS[command]] if command in GROUPS else ORDER:
        importlib.import_module(f"wheelmill.cli.{group}").register(commands)
    add_examples(parser)
    return parser


def _listed(parser: Parser, commands: argparse._SubParsersAction[Parser]) -> None:
    """Every command by name alone, and help that lists them by section (``SECTIONS``)."""
    width = max(len(name) for _title, listed in SECTIONS for name, _said in listed) + 4
    lines = []
    for title, listed in SECTIONS:
        lines.append(f"{title}:")
        for name, said in listed:
            wrapped = textwrap.wrap(said, HELP_WIDTH - width)
            lines += [f"  {name:<{width - 2}}{wrapped[0]}", *(" " * width + more for more in wrapped[1:])]
        lines.append("")
        for name, _said in listed:
            commands.add_parser(name, add_help=False)
    lines.append("`wheelmill COMMAND --help` says what a command takes, with examples.")
    parser.epilog, parser.formatter_class = "\n".join(lines), argparse.RawDescriptionHelpFormatter


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
    remember_environment(os.environ)  # a credential variable's value is masked in all it prints and writes
    console = make_console()
    try:
        with _sigterm_as_interrupt():
            words = sys.argv[1:] if argv is None else list(argv)
            args = build_parser(words).parse_args(words)
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
    from wheelmill.machine.process import StepLog  # noqa: PLC0415 - a bug's path alone needs it

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
