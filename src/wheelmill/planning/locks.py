"""A cell's build-env lock: its inputs, where the variant's torch is found, resolving it,
and the committed copy, ``locks/<cell>.txt``, with the hashed pins.

A lock records a hash of its inputs (the Python, the platform and every build requirement
of every recipe of the cell) in its first line. A lock made for other inputs is an error in
the pre-checks, before anything builds; ``wheelmill lock --cell <cell>`` remakes it. A cell
without a committed lock is resolved at build time, and its report says so.

A slim cell (``cuda130-sm90-py311``) builds in its parent cell's env, the same torch,
toolkit wheels and recipes, so it shares its parent's lock: one file, ``locks/cuda130-py311.txt``.
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from wheelmill.checks import Verdict
from wheelmill.checks.torchenv import judge_located
from wheelmill.errors import CommandFailed, ConfigError, EnvError, FetchError, PrecheckError
from wheelmill.files import write_atomic
from wheelmill.inputs.matrix import Matrix
from wheelmill.inputs.recipes import Recipe, ResolvedRecipe, resolve_all
from wheelmill.inputs.variants import Cell, Variant
from wheelmill.machine import envs
from wheelmill.machine.envs import EnvBackend, Target
from wheelmill.machine.net import is_transient
from wheelmill.machine.package_sources import PackageSources, machine_sources, torch_index_url
from wheelmill.machine.process import HostRunner, StepLog
from wheelmill.settings import Settings

# The first line of a lock, uv's and conda's: whose it is and the hash of its inputs.
_HEADER = re.compile(r"^# wheelmill (?:conda )?lock of (\S+); inputs sha256:([0-9a-f]{64})$")


@dataclass(frozen=True, kw_only=True)
class LockInputs:
    cell: str  # whose lock file: a slim cell's parent cell
    target: Target
    requirements: tuple[str, ...]

    @property
    def digest(self) -> str:
        data = {
            "python": self.target.python,
            "platform": self.target.platform,
            "requirements": sorted(self.requirements),
        }
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()

    def header(self) -> str:
        return (
            f"# wheelmill lock of {self.cell}; inputs sha256:{self.digest}\n"
            f"# made by `wheelmill lock --cell {self.cell}`; do not edit\n"
        )


def target(cell: Cell) -> Target:
    return Target(python=cell.python, platform=f"{cell.variant.platform}-{cell.variant.glibc}")


def inputs(matrix: Matrix, resolved: Mapping[str, ResolvedRecipe], cell: Cell) -> LockInputs:
    """Everything the build env of ``cell`` installs, whichever of its recipes a run builds.
    A slim cell's inputs are its parent's by construction (recipes match it by the parent's
    id, and its variant pins the parent's torch, toolkit and glibc), hence its parent's lock;
    a cell of another torch pins that torch, in a lock of its own."""
    variant = cell.variant
    extra = [req for recipe in resolved.values() for req in recipe.build_requires]
    requirements = [variant.torch_requirement, *matrix.build_requires, *variant.toolkit_wheels, *extra]
    return LockInputs(cell=cell.lock_id, target=target(cell), requirements=tuple(dict.fromkeys(requirements)))


def path_of(locks: Path, cell: str) -> Path:
    return locks / f"{cell}.txt"


def recorded_digest(lock: Path) -> str | None:
    first = lock.read_text(encoding="utf-8").splitlines()[:1]
    match = _HEADER.match(first[0]) if first else None
    return match.group(2) if match else None


def requirements_text(requirements: Sequence[str]) -> str:
    return "\n".join(requirements) + "\n"


def mismatch(inputs: LockInputs, committed: Path) -> str | None:
    """Why the committed lock does not fit ``inputs``, or None when it does."""
    recorded = recorded_digest(committed)
    if recorded == inputs.digest:
        return None
    return f"{committed} was made for other inputs (recorded {str(recorded)[:12]}..., now {inputs.digest[:12]}...)"


@dataclass(frozen=True)
class Tried:
    """A source that did not give the variant's torch, and why: ``reachable`` is False when
    it could not be asked at all (a network failure, not a missing torch)."""

    sources: str
    reason: str
    reachable: bool = True

    def __str__(self) -> str:
        return f"{self.sources} [{self.reason}]"


def none_reachable(tried: Sequence[Tried]) -> bool:
    """Every source failed for want of a network, none for want of a torch."""
    return bool(tried) and not any(one.reachable for one in tried)


def locate_torch(
    variant: Variant,
    torch_index: str | None,
    base: PackageSources,
    *,
    backend: EnvBackend,
    target: Target,
    work: Path,
    log: StepLog,
    interpreter: Path | None = None,
) -> PackageSources | list[Tried]:
    """The sources that have the variant's torch: ``base`` (the machine's) first, then the
    same with the best match across its indexes (as pip reads them: a mirror of one torch
    release on a second index hides the others of the first from uv's first-index rule),
    then with the torch index. Returns them, or what each candidate said."""
    candidates = [base, base.best_match()] + ([base.with_torch_index(torch_index)] if torch_index else [])
    tried = []
    for sources in candidates:
        located = _locate(variant, sources, backend=backend, target=target, work=work, log=log, interpreter=interpreter)
        if isinstance(located, Tried):
            tried.append(located)
            continue
        verdict = judge_located(located, variant)
        if verdict.verdict is Verdict.PASS:
            return sources
        tried.append(Tried(sources.describe(), verdict.detail))
    return tried


def _locate(
    variant: Variant,
    sources: PackageSources,
    *,
    backend: EnvBackend,
    target: Target,
    work: Path,
    log: StepLog,
    interpreter: Path | None,
) -> str | Tried:
    """The torch version ``sources`` resolve to, or why not."""
    work.mkdir(parents=True, exist_ok=True)
    requirements = work / "torch-probe.in"
    requirements.write_text(variant.torch_requirement + "\n", encoding="utf-8")
    out = work / "torch-probe.txt"
    try:
        pins = backend.lock(
            requirements,
            out,
            target=target,
            sources=sources,
            log=log,
            hashes=False,
            deps=False,
            fail_fast=True,
            interpreter=interpreter,
        )
    except CommandFailed as failed:
        reachable = not is_transient("\n".join(failed.tail))
        kind = "not found" if reachable else "unreachable"
        return Tried(sources.describe(), f"{kind}: {_reason(failed)}", reachable=reachable)
    finally:
        requirements.unlink(missing_ok=True)
        out.unlink(missing_ok=True)
    version = pins.get("torch")
    return version or Tried(sources.describe(), "not found: the resolution has no torch")


def _reason(failed: CommandFailed) -> str:
    """uv's cause, and its hint where it gives one: the hint says why (uv's first-index rule
    hiding a version another index has, a Python or platform no wheel is for)."""
    lines = [line.strip() for line in failed.tail if line.strip()]
    causes = [line.removeprefix("cause:").strip() for line in lines if line.startswith("cause:")]
    hints = [line.removeprefix("hint:").strip() for line in lines if line.startswith("hint:")]
    text = (causes[-1] if causes else (lines[0] if lines else "no output"))[:160]
    return f"{text}; uv's hint: {hints[-1][:240]}" if hints else text


def write_lock(matrix: Matrix, recipes: Mapping[str, Recipe], cell: Cell, locks_dir: Path, settings: Settings) -> str:
    """Resolve ``cell``'s build env and commit it as ``locks_dir/<cell>.txt``; a line about it."""
    lock_inputs = inputs(matrix, resolve_all(recipes, cell), cell)
    backend = envs.backend(settings.env_backend, HostRunner())
    torch_index = torch_index_url(cell.variant, settings=settings, template=matrix.torch_index)
    with tempfile.TemporaryDirectory(prefix="wheelmill-lock-") as tmp:
        work = Path(tmp)
        with StepLog(work / "lock.log") as log:
            found = locate_torch(
                cell.variant,
                torch_index,
                machine_sources(settings),
                backend=backend,
                target=lock_inputs.target,
                work=work,
                log=log,
            )
            if not isinstance(found, PackageSources) and none_reachable(found):
                raise FetchError(
                    f"{cell.id}: no package source could be reached: {' | '.join(map(str, found))}",
                    fix="check the network and the index URLs (pip's configuration, WHEELMILL_INDEX_URL); lock again",
                )
            if not isinstance(found, PackageSources):
                raise PrecheckError(
                    f"{cell.id}: {cell.variant.torch_requirement} is in none of: {' | '.join(map(str, found))}",
                    fix="see `wheelmill build` pre-checks",
                )
            requirements = work / "requirements.in"
            requirements.write_text(requirements_text(lock_inputs.requirements), encoding="utf-8")
            resolved = work / "resolved.txt"
            try:
                pins = backend.lock(requirements, resolved, target=lock_inputs.target, sources=found, log=log)
            except CommandFailed as failed:
                raise EnvError(
                    f"{cell.id}: cannot resolve the build env: {failed.last_line()}",
                    fix="check the requirements in recipes/",
                ) from None
        target_file = path_of(locks_dir, lock_inputs.cell)
        write_atomic(target_file, (lock_inputs.header() + resolved.read_text(encoding="utf-8")).encode())
    return f"{target_file}: {len(pins)} packages, torch {pins.get('torch')}, inputs {lock_inputs.digest[:12]}..."


def check_lock(matrix: Matrix, recipes: Mapping[str, Recipe], cell: Cell, locks_dir: Path) -> str | None:
    """A line about the committed lock of ``cell``; None when it has none."""
    lock_inputs = inputs(matrix, resolve_all(recipes, cell), cell)
    committed = path_of(locks_dir, lock_inputs.cell)
    if not committed.is_file():
        return None
    problem = mismatch(lock_inputs, committed)
    if problem:
        raise ConfigError(problem, fix=f"run `wheelmill lock --cell {lock_inputs.cell}` and commit it")
    return f"{committed}: matches its inputs ({lock_inputs.digest[:12]}...)"
