"""What the build-like commands share (``plan``, ``build``, ``release``): load the matrix and
recipes, pick the engine, plan the cells, and run the plans."""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from wheelmill.containers.engine import ENGINE_CHOICES, Engine, EngineName, detect
from wheelmill.containers.pins import load_pins
from wheelmill.errors import UsageError
from wheelmill.matrix import Matrix, load_matrix
from wheelmill.plan import CellPlan, ContainerSetup, Options, plan
from wheelmill.recipes import Recipe, load_recipes
from wheelmill.settings import Settings
from wheelmill.ui import UI
from wheelmill.versions import Release


def load_inputs(args: argparse.Namespace) -> tuple[Matrix, dict[str, Recipe]]:
    directory: Path = args.recipes
    if not (directory / "matrix.toml").is_file():
        raise UsageError(f"no matrix.toml in {directory.resolve()}", fix="run from the repository root or pass --recipes DIR")
    return load_matrix(directory / "matrix.toml"), load_recipes(directory)


def settings_of(args: argparse.Namespace) -> Settings:
    return Settings.from_environ().with_output(args.output)


@dataclass(frozen=True, kw_only=True)
class Prepared:
    matrix: Matrix
    plans: tuple[CellPlan, ...]
    settings: Settings
    engine: Engine | None
    containers: ContainerSetup | None


def prepare(args: argparse.Namespace, *, probe: bool, release: Release | None = None) -> Prepared:
    """Load, pick the engine (``probe``: ask it to answer; ``plan`` only looks for it),
    and plan."""
    matrix, recipes = load_inputs(args)
    settings = settings_of(args)
    cells = matrix.select(args.cell)
    root = args.recipes.resolve().parent
    engine = detect(args.engine) if probe else named_engine(args.engine)
    containers = None
    if engine is not None:
        containers = ContainerSetup(pins=load_pins(root / "containers" / "pins.toml"), directory=root / "containers", base_policy=settings.base_policy)
    options = Options(publish=args.publish, engine=engine.name.value if engine else "none", containers=containers, locks_dir=root / "locks", release=release)
    return Prepared(matrix=matrix, plans=plan(matrix, recipes, cells, args.recipe, settings, options), settings=settings, engine=engine, containers=containers)


def named_engine(choice: str) -> Engine | None:
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


def build_cells(prepared: Prepared, console: Console) -> int:
    """Run every cell's plan; the exit status of the first failed cell, else 0."""
    from wheelmill.executor import execute  # noqa: PLC0415 - the build machinery loads only to build

    ui = UI(console)
    worst = 0
    for cell_plan in prepared.plans:
        report = execute(cell_plan, matrix=prepared.matrix, settings=prepared.settings, ui=ui, engine=prepared.engine, containers=prepared.containers)
        failed = report.failed
        if failed is not None and failed.error:
            print_error(f"{failed.step.id}: {failed.error}")
            worst = worst or report.exit_code
    return worst


def print_error(text: str) -> None:
    print(f"wheelmill: error: {' '.join(text.split())}", file=sys.stderr, flush=True)
