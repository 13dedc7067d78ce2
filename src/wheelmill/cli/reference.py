"""The command reference page (docs/reference/cli.md), written from the parser itself: each
command's line of help, its arguments and their help, and its examples. A unit test holds
the committed page to what this writes, so the page and ``--help`` never disagree.

Usage: ``python -m wheelmill.cli.reference > docs/reference/cli.md``
"""

from __future__ import annotations

import argparse
import re
import textwrap

from wheelmill.cli import build_parser
from wheelmill.cli.basics import commands
from wheelmill.cli.examples import EXAMPLES

INTRO = """# Commands

Every `wheelmill` command, as its `--help` says it: what it does, its arguments and the
examples at the foot of its help. Settings that every command reads (`WHEELMILL_*`) are in
[Settings](settings.md), what each failure's exit code means in [Exit codes](exit-codes.md).
Written by `python -m wheelmill.cli.reference`; a unit test keeps it equal to the parser.
"""
# The docs' code lines fit 80 columns (tests/unit/test_docs.py holds every page to it).
WIDTH = 80
# A word of a command line: a quoted argument stays one word, its spaces and all.
WORD = re.compile(r"""(?:'[^']*'|"[^"]*"|\S)+""")


def page() -> str:
    """The reference page's Markdown."""
    top = build_parser(None)
    parts = [INTRO, "## wheelmill\n\nOptions before any command:\n", _table(top)]
    for words, said, parser in commands(top):
        parts.append(f"## wheelmill {words}\n\n{_cell(said)}\n")
        if any(_shown(action) for action in parser._actions):
            parts.append(_table(parser))
        lines = [shown for line, does in EXAMPLES[words] for shown in _example(line, does)]
        parts.append("```\n" + "\n".join(lines) + "\n```\n")
    return "\n".join(parts)


def _example(line: str, does: str) -> list[str]:
    """An example as the page shows it: what it does as a comment above the command, and the
    command broken with ``\\`` before an option where it is wider than the page's code.

    >>> _example("wheelmill validate", "the matrix and every recipe, checked")
    ['# the matrix and every recipe, checked', 'wheelmill validate']
    >>> for shown in _example("wheelmill a " + "--option value " * 6 + "--why 'not now'", "a long one"):
    ...     print(shown)
    # a long one
    wheelmill a --option value --option value --option value --option value \\
        --option value --option value --why 'not now'
    """
    comment = [f"# {part}" for part in textwrap.wrap(does, WIDTH - 2)]
    if len(line) <= WIDTH:
        return [*comment, line]
    groups: list[str] = []  # an option with the values after it
    for word in WORD.findall(line):
        if groups and not word.startswith("-"):
            groups[-1] += f" {word}"
        else:
            groups.append(word)
    broken = [groups[0]]
    for group in groups[1:]:
        if len(f"{broken[-1]} {group} \\") <= WIDTH:
            broken[-1] += f" {group}"
        else:
            broken.append(f"    {group}")
    return [*comment, *(f"{part} \\" for part in broken[:-1]), broken[-1]]


def _shown(action: argparse.Action) -> bool:
    return not isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction))


def _table(parser: argparse.ArgumentParser) -> str:
    rows = [_row(action) for action in parser._actions if _shown(action)]
    return "| argument | what it is |\n|---|---|\n" + "\n".join(rows) + "\n"


def _row(action: argparse.Action) -> str:
    names = ", ".join(action.option_strings) or (action.metavar if isinstance(action.metavar, str) else action.dest)
    value = ""
    if action.option_strings and action.nargs != 0:
        metavar = action.metavar or (f"{{{','.join(map(str, action.choices))}}}" if action.choices else action.dest)
        value = f" {str(metavar).upper() if metavar == action.dest else metavar}"
    return f"| `{names}{value}` | {_cell(action.help or '')} |"


def _cell(text: str) -> str:
    """Help text as a Markdown table cell or paragraph: its pipes escaped, its % doubled back."""
    return text.replace("%%", "%").replace("|", "\\|")


if __name__ == "__main__":
    print(page(), end="")
