"""``wheelmill lock``: resolve a cell's build env into ``locks/<cell>.txt``, or check it."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path

from wheelmill import envs, locks
from wheelmill.errors import ConfigError, EnvError, PrecheckError
from wheelmill.matrix import Cell, Matrix
from wheelmill.recipes import Recipe
from wheelmill.runner import CommandFailed, HostRunner, StepLog
from wheelmill.settings import Settings
from wheelmill.sources import PackageSources, machine_sources, torch_index_url
from wheelmill.steps.cell import locate_torch


def write_lock(matrix: Matrix, recipes: Mapping[str, Recipe], cell: Cell, locks_dir: Path, settings: Settings) -> str:
    inputs = locks.inputs(matrix, recipes, cell)
    backend = envs.backend(settings.env_backend, HostRunner())
    torch_index = torch_index_url(cell.variant, settings=settings, template=matrix.torch_index)
    locks_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="wheelmill-lock-") as tmp:
        work = Path(tmp)
        with StepLog(work / "lock.log") as log:
            found = locate_torch(cell.variant, torch_index, machine_sources(settings), backend=backend, target=inputs.target, work=work, log=log)
            if not isinstance(found, PackageSources):
                raise PrecheckError(f"{cell.id}: {cell.variant.torch_requirement} is in none of: {' | '.join(found)}", fix="see `wheelmill build` pre-checks")
            requirements = work / "requirements.in"
            requirements.write_text(locks.requirements_text(inputs.requirements), encoding="utf-8")
            resolved = work / "resolved.txt"
            try:
                pins = backend.lock(requirements, resolved, target=inputs.target, sources=found, log=log)
            except CommandFailed as failed:
                raise EnvError(f"{cell.id}: cannot resolve the build env: {failed.last_line()}", fix="check the requirements in recipes/") from None
        target = locks.path_of(locks_dir, cell.id)
        target.write_text(inputs.header() + resolved.read_text(encoding="utf-8"), encoding="utf-8")
    return f"{target}: {len(pins)} packages, torch {pins.get('torch')}, inputs {inputs.digest[:12]}..."


def check_lock(matrix: Matrix, recipes: Mapping[str, Recipe], cell: Cell, locks_dir: Path) -> str | None:
    """A line about the committed lock of ``cell``; None when it has none."""
    inputs = locks.inputs(matrix, recipes, cell)
    target = locks.path_of(locks_dir, cell.id)
    if not target.is_file():
        return None
    recorded = locks.recorded_digest(target)
    if recorded != inputs.digest:
        raise ConfigError(
            f"{target}: made for other inputs (recorded {str(recorded)[:12]}..., now {inputs.digest[:12]}...)",
            fix=f"run `wheelmill lock --cell {cell.id}` and commit it",
        )
    return f"{target}: matches its inputs ({inputs.digest[:12]}...)"
