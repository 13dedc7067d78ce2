"""The ``wheelmill`` command. This is the one place where errors become exit codes: every
``WheelmillError`` is printed as one line (what happened; the fix) with its own code, and
nothing prints a traceback at a user."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import NoReturn

from rich.console import Console
from rich.table import Table

from wheelmill import __version__
from wheelmill.containers.engine import ENGINE_CHOICES
from wheelmill.errors import Interrupted, UsageError, WheelmillError
from wheelmill.index import commands as index_commands
from wheelmill.matrix import Matrix, github_matrix
from wheelmill.plan import CellPlan
from wheelmill.releasecmd import add_commands as add_release_commands
from wheelmill.selection import affected_cells
from wheelmill.session import build_cells, load_inputs, prepare, print_error, settings_of
from wheelmill.ui import make_console


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}", fix=f"see `{self.prog} --help`")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="wheelmill", description="Build, check and repair PyTorch extension wheels for every cell of a matrix.")
    parser.add_argument("--version", action="version", version=f"wheelmill {__version__}")
    parser.add_argument("--recipes", type=Path, default=Path(os.environ.get("WHEELMILL_RECIPES", "recipes")), help="the recipes directory (default: recipes)")
    parser.add_argument("--output", type=Path, default=None, help="output root (default: $WHEELMILL_OUTPUT or wheels)")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    matrix = commands.add_parser("matrix", help="print the supported cells")
    form = matrix.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help='GitHub Actions matrix: {"include": [...]}')
    form.add_argument("--markdown", action="store_true", help="the table as Markdown (the README's copy)")
    matrix.add_argument(
        "--changed-files", type=Path, metavar="FILE", help="with --json: only the cells these changed paths (one a line, from the repo root) affect"
    )
    matrix.set_defaults(func=cmd_matrix)

    for name, func, text in (("plan", cmd_plan, "print the ordered steps; run nothing"), ("build", cmd_build, "build, check, repair and install-test")):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("--cell", action="append", required=True, help="cell id or glob, e.g. cuda118-py311 (repeatable)")
        sub.add_argument("--recipe", action="append", default=[], help="only this recipe and what it depends on (repeatable)")
        sub.add_argument("--no-publish", dest="publish", action="store_false", help="keep the wheels in dist/, out of the local index")
        sub.add_argument(
            "--engine",
            choices=ENGINE_CHOICES,
            default=os.environ.get("WHEELMILL_ENGINE", "auto"),
            help="where commands run: a podman or docker container (auto: whichever answers), or none (this machine)",
        )
        sub.set_defaults(func=func)

    lock = commands.add_parser("lock", help="resolve and write locks/<cell>.txt, the committed lock of a cell's build env")
    lock.add_argument("--cell", action="append", required=True, help="cell id or glob (repeatable)")
    lock.add_argument("--check", action="store_true", help="only check that each committed lock matches its inputs")
    lock.set_defaults(func=cmd_lock)

    validate = commands.add_parser("validate", help="load and check the matrix and every recipe")
    validate.set_defaults(func=cmd_validate)
    index_commands.add_commands(commands)
    add_release_commands(commands)
    return parser


def cmd_matrix(args: argparse.Namespace, console: Console) -> int:
    matrix, recipes = load_inputs(args)
    if args.changed_files and not args.json:
        raise UsageError("matrix: --changed-files goes with --json", fix="add --json")
    if args.json:
        chosen = matrix.cells
        if args.changed_files:
            chosen = affected_cells(matrix, recipes, _changed(args.changed_files), root=args.recipes.resolve().parent)
        print(json.dumps(github_matrix(chosen), separators=(",", ":")))
        return 0
    if args.markdown:
        print(matrix_markdown(matrix))
        return 0
    table = Table(title=f"matrix ({len(matrix.cells)} cells)", title_justify="left")
    for column in ("variant", "toolkit", "torch", "arch list", "glibc", *matrix.pythons):
        table.add_column(column, overflow="fold")
    for v in matrix.variants.values():
        cells = ["yes" if p in v.pythons else "-" for p in matrix.pythons]
        table.add_row(v.name, v.toolkit or "-", f"{v.torch}+{v.label}", v.arch_list or "-", v.glibc, *cells)
    Console(highlight=False, width=max(console.width, 160)).print(table)
    return 0


def _changed(path: Path) -> list[str]:
    try:
        return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except OSError as exc:
        raise UsageError(f"--changed-files {path}: {exc.strerror}", fix="give a file with one changed path a line (git diff --name-only)") from None


def matrix_markdown(matrix: Matrix) -> str:
    head = ["variant", "toolkit", "torch", "arch list", "glibc", *matrix.pythons]
    rows = [
        [
            v.name,
            v.toolkit or "-",
            f"{v.torch}+{v.label}",
            f"`{v.arch_list}`" if v.arch_list else "-",
            v.glibc,
            *("yes" if p in v.pythons else "-" for p in matrix.pythons),
        ]
        for v in matrix.variants.values()
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def cmd_plan(args: argparse.Namespace, _console: Console) -> int:
    for cell_plan in prepare(args, probe=False).plans:
        print(render_plan(cell_plan))
    return 0


def render_plan(cell_plan: CellPlan) -> str:
    cell = cell_plan.cell
    lines = [f"plan for {cell.id}: {cell.variant.describe()}; Python {cell.python}; engine {cell_plan.engine}"]
    lines.append(f"recipes, in build order: {', '.join(r.name for r in cell_plan.recipes)}")
    width = max(len(s.id) for s in cell_plan.steps)
    for index, step in enumerate(cell_plan.steps, start=1):
        lines.append(f"{index:3d}. {step.id:<{width}}  {step.detail}")
    return "\n".join(lines)


def cmd_build(args: argparse.Namespace, console: Console) -> int:
    return build_cells(prepare(args, probe=True), console)


def cmd_lock(args: argparse.Namespace, console: Console) -> int:
    from wheelmill.lockcmd import check_lock, write_lock  # noqa: PLC0415 - resolution machinery loads only here

    matrix, recipes = load_inputs(args)
    settings = settings_of(args)
    locks_dir = args.recipes.resolve().parent / "locks"
    cells = matrix.select(args.cell)
    if not args.check:
        for cell in cells:
            console.print(write_lock(matrix, recipes, cell, locks_dir, settings), highlight=False)
        return 0
    checked = [line for cell in cells if (line := check_lock(matrix, recipes, cell, locks_dir))]
    for line in checked:
        console.print(line, highlight=False)
    console.print(f"{len(checked)} committed locks match their inputs; {len(cells) - len(checked)} cells resolve theirs at build time", highlight=False)
    return 0


def cmd_validate(args: argparse.Namespace, _console: Console) -> int:
    matrix, recipes = load_inputs(args)
    print(f"ok: {len(matrix.variants)} variants, {len(matrix.cells)} cells, {len(recipes)} recipes ({', '.join(sorted(recipes))})")
    return 0


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
            code: int = args.func(args, console)
            return code
    except WheelmillError as exc:
        print_error(exc.one_line())
        return exc.exit_code
    except KeyboardInterrupt:
        print_error("interrupted")
        return Interrupted.exit_code


def entry() -> NoReturn:
    sys.exit(main())
