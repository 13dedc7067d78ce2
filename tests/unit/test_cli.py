"""The command line's table of groups: each command imports its own group alone, and the
table says what the groups register; every command's help teaches (its arguments described,
examples that parse)."""

from __future__ import annotations

import argparse
import fcntl
import importlib
import os
import pty
import re
import shlex
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from wheelmill.cli import GROUPS, HELP_WIDTH, ORDER, SECTIONS, build_parser, main
from wheelmill.cli.basics import Parser, commands
from wheelmill.cli.examples import EXAMPLES
from wheelmill.cli.reference import page
from wheelmill.inputs.matrix import load_matrix

ROOT = Path(__file__).resolve().parent.parent.parent


def test_the_table_names_every_command_of_every_group_and_nothing_else() -> None:
    registered = {}
    for group in ORDER:
        commands = Parser(prog="wheelmill").add_subparsers(dest="command", parser_class=Parser)
        importlib.import_module(f"wheelmill.cli.{group}").register(commands)
        registered.update(dict.fromkeys(commands.choices, group))
    assert registered == GROUPS


def commands_of(parser: Parser) -> set[str]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(action.choices)


@pytest.mark.parametrize(("argv", "group"), [(["publish", "--help"], "index"), (["--recipes", "r", "build"], "build")])
def test_a_command_line_parses_with_its_group_alone(argv: list[str], group: str) -> None:
    assert {GROUPS[name] for name in commands_of(build_parser(argv))} == {group}
    assert commands_of(build_parser(["--help"])) == set(GROUPS) == commands_of(build_parser(["pubish"]))


def test_help_lists_each_command_with_the_line_its_group_registers() -> None:
    """``wheelmill --help`` lists the commands from a table, by section, importing no group:
    each line the one its group registers, and every command listed once."""
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    registered = {choice.dest: choice.help for choice in action._choices_actions}
    listed = {name: said for _title, section in SECTIONS for name, said in section}
    assert listed == registered and sum(len(section) for _title, section in SECTIONS) == len(GROUPS)
    shown = build_parser(["--help"]).format_help()
    assert all(f"{title}:" in shown for title, _section in SECTIONS)
    assert max(len(line) for line in shown.splitlines()) <= HELP_WIDTH


def test_the_image_commands_editions_are_the_images() -> None:
    from wheelmill.cli.image import EDITIONS  # noqa: PLC0415 - this test's alone
    from wheelmill.images.editions import Edition  # noqa: PLC0415

    assert tuple(e.value for e in Edition) == EDITIONS


# Modules a command line never needs to be parsed, or its help printed: the build machinery,
# images, conda, the GPU stage, releases, wheels and their provenance, and the heavy
# libraries under them (CycloneDX's model alone was 0.7 s of every command's start).
HEAVY = (
    "wheelmill.building", "wheelmill.images.build", "wheelmill.conda", "wheelmill.gpu", "wheelmill.releases",
    "wheelmill.planning", "wheelmill.checks", "wheelmill.wheel", "wheelmill.provenance", "cyclonedx", "boto3",
    "jsonschema", "elftools", "rattler", "cryptography",
)  # fmt: skip
PROBE = """
import contextlib, io, sys
from wheelmill.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        code = main(sys.argv[1:])
    except SystemExit as exc:
        code = exc.code
print(code, sorted(m for m in sys.modules if m.startswith(HEAVY)))
"""


@pytest.mark.parametrize(
    "argv",
    [
        "--help", "pubish", "", "index serve --port 70000", "build --bogus", "build --help", "publish --help",
        "image --help", "release --help", "coverage --help", "wants --help", "conda --help", "test-gpu --help",
        "verify --help", "matrix upstream --help", "lock --bogus",
    ],
)  # fmt: skip
def test_a_command_line_parses_and_helps_without_the_heavy_modules(argv: str) -> None:
    """What a mistyped command, an argument error or a command's help costs: the parser's
    modules alone (a command's start was 0.7 to 1.0 s of CPU when every layer loaded)."""
    probe = f"HEAVY = {HEAVY!r}\n{PROBE}"
    done = subprocess.run([sys.executable, "-c", probe, *argv.split()], capture_output=True, text=True, check=True)
    code, loaded = done.stdout.split(" ", 1)
    assert code in ("0", "2") and loaded.strip() == "[]", (argv, loaded)


def test_an_index_command_starts_without_the_build_machinery() -> None:
    probe = (
        "import sys; from wheelmill.cli import build_parser; build_parser(['yank', 'p', '1', '--channel', 'cpu']);"
        "print(sorted(m for m in ('wheelmill.building.plan', 'wheelmill.cli.common') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout


def test_a_mistyped_command_still_gets_its_did_you_mean(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pubish", "x.whl"]) == 2
    assert "publish" in capsys.readouterr().err


def leaves(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Every command a user runs (``index serve``), by its words, and its parser."""
    return {words: command for words, _said, command in commands(parser)}


def test_every_command_has_examples_and_each_parses_as_the_command_it_shows() -> None:
    commands = leaves(build_parser(None))
    assert set(EXAMPLES) == set(commands)
    assert [c for c, examples in EXAMPLES.items() if len(examples) < 2] == [], "two or three examples each"
    for command, examples in EXAMPLES.items():
        assert f"examples:\n  {examples[0][0]}\n" in commands[command].format_help(), command
        for line, does in examples:
            words = shlex.split(line)
            while "=" in words[0]:  # settings before the command, as a shell takes them
                words.pop(0)
            assert words[0] == "wheelmill" and does, line
            argv = words[1:]
            assert argv[: len(command.split())] == command.split(), line
            args = build_parser(argv).parse_args(argv)  # a line that no longer parses raises UsageError
            assert callable(args.func), line


def test_every_argument_of_every_command_says_what_it_is() -> None:
    silent = [
        (command, action.option_strings or action.dest)
        for command, parser in leaves(build_parser(None)).items()
        for action in parser._actions
        # the commands below one (matrix's upstream) say what they are in their own line of help
        if action.help is None and not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))
    ]
    assert silent == []


def test_the_command_reference_page_is_what_the_parser_says() -> None:
    """docs/reference/cli.md, written by ``python -m wheelmill.cli.reference``: every command,
    its arguments' help and its examples, equal to the parser's."""
    committed = (Path(__file__).parents[2] / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
    assert committed == page(), "run: python -m wheelmill.cli.reference > docs/reference/cli.md"
    assert all(f"## wheelmill {words}\n" in committed for words in EXAMPLES)


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def in_a_terminal(argv: list[str], columns: int) -> str:
    """What ``wheelmill ARGV`` shows a terminal ``columns`` wide (a pseudo-terminal of that
    size, as a person's), its colours taken out."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {name: value for name, value in os.environ.items() if name not in ("COLUMNS", "LINES", "CI")}
    command = [sys.executable, "-m", "wheelmill", "--recipes", str(ROOT / "recipes"), *argv]
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower, env=env)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 1 << 16)
        except OSError:  # the terminal closed: the command is done
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert process.wait(timeout=60) == 0
    return ANSI.sub("", b"".join(chunks).decode()).replace("\r\n", "\n")


@pytest.mark.parametrize("argv", [["matrix"], ["plan", "--cell", "cuda130-py311", "--engine", "none"]])
def test_matrix_and_plan_fit_a_terminal_of_100_columns_and_break_no_name(argv: list[str]) -> None:
    lines = in_a_terminal(argv, columns=100).splitlines()
    assert max(len(line) for line in lines) <= 100, max(lines, key=len)
    words = {word for line in lines for word in line.split()}
    matrix = load_matrix(ROOT / "recipes" / "matrix.toml")
    if argv[0] == "matrix":
        assert set(matrix.variants) <= words, "every variant's name whole, on one line"
    else:
        assert {"1.", "pre-checks", "example-cpp-ops/build", "channel-checks"} <= words
