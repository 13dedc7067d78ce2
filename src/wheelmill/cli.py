"""The ``wheelmill`` command. This is the one place where errors become exit codes: every
``WheelmillError`` is printed as one line (what happened; the fix) with its own code, and
nothing prints a traceback at a user."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import NoReturn

from rich.console import Console
from rich.table import Table

from wheelmill import __version__
from wheelmill.containers.engine import ENGINE_CHOICES, Engine, EngineName, detect
from wheelmill.containers.pins import load_pins
from wheelmill.errors import Interrupted, UsageError, WheelmillError
from wheelmill.index import commands as index_commands
from wheelmill.matrix import Matrix, load_matrix
from wheelmill.plan import CellPlan, ContainerSetup, Options, plan
from wheelmill.recipes import Recipe, load_recipes
from wheelmill.settings import Settings
from wheelmill.ui import UI, make_console


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
    return parser


def _load(args: argparse.Namespace) -> tuple[Matrix, dict[str, Recipe]]:
    directory: Path = args.recipes
    if not (directory / "matrix.toml").is_file():
        raise UsageError(f"no matrix.toml in {directory.resolve()}", fix="run from the repository root or pass --recipes DIR")
    return load_matrix(directory / "matrix.toml"), load_recipes(directory)


def _settings(args: argparse.Namespace) -> Settings:
    return Settings.from_environ().with_output(args.output)


def cmd_matrix(args: argparse.Namespace, console: Console) -> int:
    matrix, _recipes = _load(args)
    if args.json:
        include = [
            {"cell": c.id, "variant": c.variant.name, "python": c.python, "family": c.variant.family.value, "label": c.variant.label} for c in matrix.cells
        ]
        print(json.dumps({"include": include}, separators=(",", ":")))
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


@dataclass(frozen=True, kw_only=True)
class Prepared:
    matrix: Matrix
    plans: tuple[CellPlan, ...]
    settings: Settings
    engine: Engine | None
    containers: ContainerSetup | None


def _prepare(args: argparse.Namespace, *, probe: bool) -> Prepared:
    """Load, pick the engine (``probe``: ask it to answer; ``plan`` only looks for it),
    and plan."""
    matrix, recipes = _load(args)
    settings = _settings(args)
    cells = matrix.select(args.cell)
    root = args.recipes.resolve().parent
    engine = detect(args.engine) if probe else _named_engine(args.engine)
    containers = None
    if engine is not None:
        containers = ContainerSetup(pins=load_pins(root / "containers" / "pins.toml"), directory=root / "containers", base_policy=settings.base_policy)
    options = Options(publish=args.publish, engine=engine.name.value if engine else "none", containers=containers, locks_dir=root / "locks")
    return Prepared(matrix=matrix, plans=plan(matrix, recipes, cells, args.recipe, settings, options), settings=settings, engine=engine, containers=containers)


def _named_engine(choice: str) -> Engine | None:
    """The engine a plan shows: named, or for ``auto`` the first installed (nothing runs)."""
    if choice == "none":
        return None
    if choice not in ENGINE_CHOICES:
        raise UsageError(f"--engine {choice}: not an engine", fix=f"use one of: {', '.join(ENGINE_CHOICES)}")
    names = [EngineName.PODMAN, EngineName.DOCKER] if choice == "auto" else [EngineName(choice)]
    for name in names:
        binary = shutil.which(name.value)
        if binary or choice != "auto":
            return Engine(name=name, binary=binary or name.value)
    return None


def cmd_plan(args: argparse.Namespace, _console: Console) -> int:
    for cell_plan in _prepare(args, probe=False).plans:
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
    from wheelmill.executor import execute  # noqa: PLC0415 - the build machinery loads only to build

    prepared = _prepare(args, probe=True)
    ui = UI(console)
    worst = 0
    for cell_plan in prepared.plans:
        report = execute(cell_plan, matrix=prepared.matrix, settings=prepared.settings, ui=ui, engine=prepared.engine, containers=prepared.containers)
        failed = report.failed
        if failed is not None and failed.error:
            _print_error(f"{failed.step.id}: {failed.error}")
            worst = worst or report.exit_code
    return worst


def cmd_lock(args: argparse.Namespace, console: Console) -> int:
    from wheelmill.lockcmd import check_lock, write_lock  # noqa: PLC0415 - resolution machinery loads only here

    matrix, recipes = _load(args)
    settings = _settings(args)
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
    matrix, recipes = _load(args)
    print(f"ok: {len(matrix.variants)} variants, {len(matrix.cells)} cells, {len(recipes)} recipes ({', '.join(sorted(recipes))})")
    return 0


def _print_error(text: str) -> None:
    print(f"wheelmill: error: {' '.join(text.split())}", file=sys.stderr, flush=True)


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
        _print_error(exc.one_line())
        return exc.exit_code
    except KeyboardInterrupt:
        _print_error("interrupted")
        return Interrupted.exit_code


def entry() -> NoReturn:
    sys.exit(main())
