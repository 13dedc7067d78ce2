"""The command reference page (docs/reference/cli.md), written from the parser itself: each
command's line of help, its arguments and their help, and its examples. A unit test holds
the committed page to what this writes, so the page and ``--help`` never disagree.

Usage: ``python -m wheelmill.cli.reference > docs/reference/cli.md``
"""

from __future__ import annotations

import argparse

from wheelmill.cli import build_parser
from wheelmill.cli.basics import commands
from wheelmill.cli.examples import EXAMPLES

INTRO = """# Commands

Every `wheelmill` command, as its `--help` says it: what it does, its arguments and the
examples at the foot of its help. Settings that every command reads (`WHEELMILL_*`) are in
[Settings](settings.md), what each failure's exit code means in [Exit codes](exit-codes.md).
Written by `python -m wheelmill.cli.reference`; a unit test keeps it equal to the parser.
"""


def page() -> str:
    """The reference page's Markdown."""
    top = build_parser(None)
    parts = [INTRO, "## wheelmill\n\nOptions before any command:\n", _table(top)]
    for words, said, parser in commands(top):
        parts.append(f"## wheelmill {words}\n\n{_cell(said)}\n")
        if any(_shown(action) for action in parser._actions):
            parts.append(_table(parser))
        lines = [f"{line}   # {does}" for line, does in EXAMPLES[words]]
        parts.append("```\n" + "\n".join(lines) + "\n```\n")
    return "\n".join(parts)


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
