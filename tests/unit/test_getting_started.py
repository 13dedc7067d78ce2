"""Getting started's command blocks stay true: every command line in them is run, or shown
to be one that runs. ``scripts/setup`` and the build of a cell are the README's two
commands, which the rootless benchmark runs in a new account with an empty image store and
a fresh ``.venv`` (tests/integration/test_benchmarks.py); each ``nox -s build-<cell>`` names a
session the noxfile makes, and what it passes after ``--`` plans in that cell; each
``wheelmill`` line runs here (read-only ones) and exits 0."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from wheelmill.cli import main
from wheelmill.inputs.matrix import load_matrix

ROOT = Path(__file__).resolve().parent.parent.parent
PAGE = ROOT / "docs" / "getting-started.md"
SESSIONS = {"lint", "tests", "benchmarks"}  # the noxfile's sessions besides a cell's


def command_lines(text: str) -> list[str]:
    """Every command of the page's fenced blocks: comments dropped, continued lines joined,
    commands chained with ``&&`` apart."""
    found = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.DOTALL):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            command = line.split(" #")[0].strip()
            if command and not command.startswith("#"):
                found += [part.strip() for part in command.split("&&")]
    return found


COMMANDS = command_lines(PAGE.read_text())


def test_the_page_has_commands_and_its_setup_and_first_build_are_the_readmes() -> None:
    readme = command_lines((ROOT / "README.md").read_text())
    setup = [c for c in COMMANDS if c.startswith(("scripts/setup", ".venv/bin/nox"))]
    assert setup and all(c in readme for c in setup), "the README's, which the rootless benchmark runs"
    assert any(c.startswith("wheelmill ") for c in COMMANDS) and any(c.startswith("nox -s build-") for c in COMMANDS)


@pytest.mark.parametrize("command", [c for c in COMMANDS if "nox" in c.split()[0]])
def test_each_nox_line_names_a_session_and_its_arguments_plan(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    words = shlex.split(command)
    ours, _, passed = " ".join(words).partition(" -- ")
    sessions = ours.split(" -s ", 1)[1].split()
    cells = {cell.id for cell in load_matrix(ROOT / "recipes" / "matrix.toml").cells}
    for session in sessions:
        assert session in SESSIONS or session.removeprefix("build-") in cells, session
    for session in (s for s in sessions if s.startswith("build-")):
        argv = [
            "--recipes",
            str(ROOT / "recipes"),
            "plan",
            "--cell",
            session.removeprefix("build-"),
            "--engine",
            "none",
        ]
        assert main([*argv, *shlex.split(passed)]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.startswith("wheelmill ")])
def test_each_wheelmill_line_runs(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    words = shlex.split(command)[1:]
    assert words[0] in ("plan", "matrix", "validate", "coverage", "index"), f"{command}: run it here, read-only"
    engine = ["--engine", "none"] if words[0] == "plan" else []
    assert main(["--recipes", str(ROOT / "recipes"), *words, *engine]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.strip()
