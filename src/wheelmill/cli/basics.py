"""What every group of commands shares and nothing heavy: the parser, the argument types, the
error line, the repository's inputs loaded. A command imports its own group alone
(``wheelmill.cli``); what only the build-like commands need is ``common``'s."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn, TypeAlias, TypeVar

from wheelmill.errors import UsageError, redact
from wheelmill.settings import Settings

if TYPE_CHECKING:  # the inputs load when a command reads them, not to parse its line (wheelmill.cli)
    from wheelmill.inputs.matrix import Matrix
    from wheelmill.inputs.recipes import Recipe


class Parser(argparse.ArgumentParser):
    """A bad command line is a ``UsageError`` like any other: one line, exit 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}", fix=f"see `{self.prog} --help`")


Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
_N = TypeVar("_N", int, float)


def commands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """Every command a user runs below ``parser`` (``index serve``), in the parser's order:
    its words, its line of help and its parser. One that runs on its own as well as with a
    command below it (``matrix`` and ``matrix upstream``) is both."""
    found = []
    for action in parser._actions:  # argparse offers no other way to its subparsers
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                below = [(f"{name} {words}", said, leaf) for words, said, leaf in commands(sub)]
                alone = not below or sub.get_default("func") is not None
                found += [(name, helps.get(name, ""), sub)] * alone + below
    return found


def _number(text: str, parse: Callable[[str], _N], *, what: str, fits: Callable[[_N], bool], bounds: str) -> _N:
    """``text`` as a number (or ``what`` it is not), within ``bounds`` (or not)."""
    try:
        value = parse(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if not fits(value):
        raise argparse.ArgumentTypeError(f"{text} is not {bounds}")
    return value


def positive(text: str) -> int:
    """An argument that counts something: a whole number, at least 1."""
    return _number(text, int, what="a whole number", fits=lambda value: value >= 1, bounds="at least 1")


def port(text: str) -> int:
    """A TCP port to listen on: 0 (any free one) to 65535."""
    return _number(
        text,
        int,
        what="a port number",
        fits=lambda value: 0 <= value <= 65535,
        bounds="a port (0 to 65535; 0 picks a free one)",
    )


def seconds(text: str) -> float:
    """A duration: a finite number of seconds above 0 (not NaN, not infinity)."""
    return _number(
        text,
        float,
        what="a number of seconds",
        fits=lambda value: math.isfinite(value) and value > 0,
        bounds="a duration above 0 seconds",
    )


def days(text: str) -> float:
    """A period in days: a finite number, 0 or more (0: now)."""
    return _number(
        text,
        float,
        what="a number of days",
        fits=lambda value: math.isfinite(value) and value >= 0,
        bounds="0 days or more",
    )


def print_error(text: str) -> None:
    print(f"wheelmill: error: {redact(' '.join(text.split()))}", file=sys.stderr, flush=True)


def load_inputs(settings: Settings) -> tuple[Matrix, dict[str, Recipe]]:
    directory = settings.recipes
    if not (directory / "matrix.toml").is_file():
        raise UsageError(
            f"no matrix.toml in {directory.resolve()}", fix="run from the repository root or pass --recipes DIR"
        )
    from wheelmill.inputs.matrix import load_matrix  # noqa: PLC0415 - see the imports
    from wheelmill.inputs.recipes import check_cells, load_recipes  # noqa: PLC0415

    matrix, recipes = load_matrix(directory / "matrix.toml"), load_recipes(directory)
    check_cells(recipes, matrix.cells)
    return matrix, recipes
