"""The cell commands: ``matrix`` (and ``matrix upstream``), ``validate``, ``plan``, ``build``, ``mirror``, ``lock``."""

from __future__ import annotations

import argparse
import json
import textwrap
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console  # loaded at start already (wheelmill.terminal)

from wheelmill.cli.basics import Commands, load_inputs
from wheelmill.cli.common import add_cell_options, build_cells, mirror_cells, prepare
from wheelmill.errors import UsageError
from wheelmill.settings import Settings

# What a command does loads when it runs, never to parse a command line or print its help.
if TYPE_CHECKING:
    from rich.table import Table

    from wheelmill.inputs.matrix import Matrix
    from wheelmill.planning.spec import CellPlan


def register(commands: Commands) -> None:
    matrix = commands.add_parser("matrix", help="print the supported cells")
    form = matrix.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help='GitHub Actions matrix: {"include": [...]}')
    form.add_argument("--markdown", action="store_true", help="the table as Markdown (the copy in docs/matrix.md)")
    matrix.add_argument(
        "--changed-files",
        type=Path,
        metavar="FILE",
        help="with --json: only the cells these changed paths (one a line, from the repo root) affect",
    )
    matrix.add_argument(
        "--no-slim",
        dest="slim",
        action="store_false",
        help="with --json: leave the slim cells out (their parent's cells build every arch they have)",
    )
    matrix.set_defaults(func=cmd_matrix)
    from wheelmill.cli.upstream import register_upstream  # noqa: PLC0415 - its parser; what it runs loads later

    register_upstream(matrix)

    validate = commands.add_parser("validate", help="load and check the matrix and every recipe")
    validate.set_defaults(func=cmd_validate)

    for name, func, text in (
        ("plan", cmd_plan, "print the ordered steps; run nothing"),
        ("build", cmd_build, "build, check, repair and install-test"),
    ):
        sub = commands.add_parser(name, help=text)
        add_cell_options(sub)
        sub.set_defaults(func=func)

    mirror = commands.add_parser(
        "mirror",
        help="resolve a built cell's runtime closure (torch and every dependency) and mirror it into its channel",
    )
    mirror.add_argument("--cell", action="append", required=True, help="cell id or glob (repeatable)")
    mirror.set_defaults(func=cmd_mirror)

    lock = commands.add_parser(
        "lock", help="resolve and write locks/<cell>.txt, the committed lock of a cell's build env"
    )
    lock.add_argument("--cell", action="append", required=True, help="cell id or glob (repeatable)")
    lock.add_argument("--check", action="store_true", help="only check that each committed lock matches its inputs")
    lock.set_defaults(func=cmd_lock)


def cmd_matrix(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.inputs.matrix import (  # noqa: PLC0415
        PYTHON_COLUMNS,
        github_matrix,
        matrix_markdown,
        python_row,
        toolchain_row,
    )
    from wheelmill.inputs.selection import affected_cells  # noqa: PLC0415

    matrix, recipes = load_inputs(settings)
    if (args.changed_files or not args.slim) and not args.json:
        raise UsageError("matrix: --changed-files and --no-slim go with --json", fix="add --json")
    if args.json:
        chosen = matrix.cells
        if args.changed_files:
            chosen = affected_cells(matrix, recipes, _changed(args.changed_files), root=settings.root)
        if not args.slim:
            chosen = tuple(c for c in chosen if not c.variant.slim_of)
        print(json.dumps(github_matrix(chosen, matrix.runners), separators=(",", ":")))
        return 0
    promised = _baselines(matrix, settings)
    if args.markdown:
        print(matrix_markdown(matrix, promised))
        return 0
    out = Console(highlight=False, width=max(console.width, MATRIX_WIDTH))  # stdout, so it pipes whole
    out.print(f"matrix: {_count(matrix)}")
    toolchains = _table("toolchains (glibc: its wheels' on the registry base / the bootstrapped one)", GLIBC_HEADS)
    for v in matrix.variants.values():
        name, toolkit, torch, archs, *bases = toolchain_row(v, baselines=promised[v.name])
        toolchains.add_row(name, toolkit, torch, archs.replace(";", "; "), " / ".join(_glibc(base) for base in bases))
    out.print(toolchains)
    pythons = _table("Pythons", (*PYTHON_COLUMNS, *matrix.pythons))
    for v in matrix.variants.values():
        pythons.add_row(*python_row(v, matrix.pythons))
    out.print(pythons)
    return 0


MATRIX_WIDTH = 100  # `matrix` fits this, and a wider terminal
GLIBC_HEADS = ("variant", "toolkit", "torch", "arch list", "glibc")


def _table(title: str, columns: Sequence[str]) -> Table:
    """A table that fits ``MATRIX_WIDTH``: its first column (a variant's name) never broken."""
    from rich.box import SIMPLE_HEAD  # noqa: PLC0415 - see cmd_matrix
    from rich.table import Table  # noqa: PLC0415

    table = Table(title=title, title_justify="left", box=SIMPLE_HEAD, pad_edge=False)
    for number, column in enumerate(columns):
        table.add_column(column, no_wrap=number == 0, overflow="fold")
    return table


def _glibc(base: str) -> str:
    """``manylinux_2_28`` as the glibc it names, ``2.28``; ``-`` as it is."""
    return base.removeprefix("manylinux_").replace("_", ".")


def _baselines(matrix: Matrix, settings: Settings) -> dict[str, tuple[str | None, str | None]]:
    """Each variant's promise on its registry base and on its bootstrapped one: the glibc of
    the base, as the repository's containers/pins.toml makes it."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.machine.builder_images import baselines  # noqa: PLC0415
    from wheelmill.machine.pins import load_pins  # noqa: PLC0415

    pins = load_pins(settings.root / "containers" / "pins.toml")
    promised = {name: baselines(pins, variant) for name, variant in matrix.variants.items()}
    return {name: (b.registry, b.bootstrap) for name, b in promised.items()}


def _count(matrix: Matrix) -> str:
    """``59 cells, 12 of them slim, 8 of another torch, 20 for aarch64``"""
    slim = sum(1 for c in matrix.cells if c.variant.slim_of)
    other = sum(1 for c in matrix.cells if c.variant.torch_of)
    kinds = [f"{slim} of them slim"] if slim else []
    kinds += [f"{other} of another torch"] if other else []
    platforms = Counter(c.variant.platform_tag for c in matrix.cells if c.variant.platform_tag)
    kinds += [f"{n} for {platform}" for platform, n in platforms.items()]
    return ", ".join((f"{len(matrix.cells)} cells", *kinds))


def _changed(path: Path) -> list[str]:
    try:
        return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except OSError as exc:
        raise UsageError(
            f"--changed-files {path}: {exc.strerror}",
            fix="give a file with one changed path a line (git diff --name-only)",
        ) from None


def cmd_validate(_args: argparse.Namespace, settings: Settings, _console: Console) -> int:
    """Load everything and plan every cell with every recipe that applies to it, opt-in ones
    too: what only a cell can tell (a recipe's arch list for its toolkit, its templates, its
    switches) is checked for each one."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.building.plan import Options, plan_cell  # noqa: PLC0415
    from wheelmill.conda import envspec  # noqa: PLC0415

    matrix, recipes = load_inputs(settings)
    envspec.check_spec_file(settings.recipes, matrix.variants)
    plans = [
        plan_cell(
            matrix, recipes, cell, [n for n, r in sorted(recipes.items()) if r.applies_to(cell)], settings, Options()
        )
        for cell in matrix.cells
    ]
    steps = sum(len(p.steps) for p in plans)
    names = ", ".join(sorted(recipes))
    counted = f"{len(matrix.variants)} variants, {_count(matrix)} ({steps} planned steps)"
    print(f"ok: {counted}, {len(recipes)} recipes ({names})")
    return 0


def cmd_plan(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    width = max(console.width, MATRIX_WIDTH)  # the terminal's (COLUMNS), a pipe's 200, never under 100
    for cell_plan in prepare(args, settings, probe=False).plans:
        print(wrapped_plan(cell_plan, width))
    return 0


def wrapped_plan(cell_plan: CellPlan, width: int) -> str:
    """``format_plan``'s lines as a terminal of ``width`` columns shows them whole: each step's
    number and id on a line, what it does wrapped below it."""
    header, steps = [], []
    for line in format_plan(cell_plan).splitlines():
        number, dot, rest = line.strip().partition(". ")
        if dot and number.isdigit():
            step, _, detail = rest.partition("  ")
            steps += [
                f"{number:>3}. {step}",
                *textwrap.wrap(
                    detail.strip(), width, initial_indent=" " * 7, subsequent_indent=" " * 7, break_on_hyphens=False
                ),
            ]
        else:
            header += textwrap.wrap(line, width, subsequent_indent="  ", break_on_hyphens=False)
    return "\n".join([*header, *steps])


def format_plan(cell_plan: CellPlan) -> str:
    cell = cell_plan.cell
    lines = [f"plan for {cell.id}: {cell.variant.describe()}; Python {cell.python}; engine {cell_plan.engine}"]
    lines.append(f"recipes, in build order: {', '.join(r.name for r in cell_plan.recipes)}")
    lines.append(f"choices: {cell_plan.choices.describe()}")
    lines += [f"group build: {r.name} {r.group_build.describe(cell.id)}" for r in cell_plan.recipes if r.group_build]
    width = max(len(s.id) for s in cell_plan.steps)
    for index, step in enumerate(cell_plan.steps, start=1):
        lines.append(f"{index:3d}. {step.id:<{width}}  {step.detail}")
    return "\n".join(lines)


def cmd_build(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    return build_cells(prepare(args, settings, probe=True), console)


def cmd_mirror(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    """What a build's closure and mirror steps do, for cells built earlier (or with --no-mirror)."""
    mirror_cells(args.cell, settings, console)
    return 0


def cmd_lock(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.planning.locks import check_lock, write_lock  # noqa: PLC0415

    matrix, recipes = load_inputs(settings)
    locks_dir = settings.root / "locks"
    cells = matrix.select(args.cell)
    # A slim cell's lock is its parent cell's file: one lock per env, however many cells share it.
    owners = {c.lock_id: matrix.cell(c.lock_id) for c in cells}
    if not args.check:
        for owner in owners.values():
            console.print(write_lock(matrix, recipes, owner, locks_dir, settings), highlight=False)
        return 0
    checked = {lock_id: check_lock(matrix, recipes, owner, locks_dir) for lock_id, owner in owners.items()}
    matched = [line for line in checked.values() if line]
    for line in matched:
        console.print(line, highlight=False)
    late = sum(1 for c in cells if checked[c.lock_id] is None)
    console.print(
        f"{len(matched)} committed locks match their inputs; {late} cells resolve theirs at build time", highlight=False
    )
    return 0
