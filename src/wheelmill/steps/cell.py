"""Cell steps: before any recipe, make sure the cell can be built where its commands run
(this machine or its container), then make its build env from a hashed lock and prove
the torch in it is the variant's build."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from wheelmill.checks import CheckResult, Verdict, summarize_failures
from wheelmill.checks.torchenv import judge_located, judge_torch
from wheelmill.config import format_size
from wheelmill.context import CellRun
from wheelmill.envs import EnvBackend, Target, pinned_versions
from wheelmill.errors import EnvError, PrecheckError
from wheelmill.locks import path_of, recorded_digest, requirements_text
from wheelmill.matrix import Family, Variant
from wheelmill.net import is_transient
from wheelmill.probes import read_torch
from wheelmill.retry import TransientError
from wheelmill.runner import CommandFailed, StepLog
from wheelmill.sources import PackageSources, machine_sources
from wheelmill.toolchain import Found, NotFound, Toolkit, find_compiler, find_env_toolkit, find_python, find_toolkit


def pre_checks(run: CellRun, log: StepLog) -> list[CheckResult]:
    """What needs no container: disk, the committed lock, where torch comes from; and on
    this machine (no container) the toolchain too, so every failure shows at once."""
    toolchain = [] if run.plan.image else [_python(run), _compiler(run), _toolkit(run)]
    return _verdicts(run, "pre-checks", [*toolchain, _disk(run), _lock(run), _torch(run, log)], log)


def toolchain_checks(run: CellRun, log: StepLog) -> list[CheckResult]:
    """Where the commands run (the container, or this machine): Python, compiler, toolkit."""
    return _verdicts(run, "toolchain-checks", [_python(run), _compiler(run), _toolkit(run)], log)


def _verdicts(run: CellRun, step: str, results: list[CheckResult], log: StepLog) -> list[CheckResult]:
    """All checks run, then all failures are reported at once."""
    for result in results:
        log.note(f"{result.name}: {result.verdict}: {result.detail}")
    if any(r.verdict is Verdict.FAIL for r in results):
        what, fix = summarize_failures(results)
        raise PrecheckError(f"{run.plan.cell.id}: {step} failed: {what}", fix=fix)
    return results


def _python(run: CellRun) -> CheckResult:
    version = run.plan.cell.python
    found = find_python(version, run.runner)
    if isinstance(found, Found):
        run.python = found.path
        return CheckResult.passed("python", f"CPython {version} at {found.path}")
    return CheckResult.failed(
        "python",
        f"CPython {version} not found (looked: {'; '.join(found.looked)})",
        f"install it (`pyenv install {version}` or `uv python install {version}`) or put python{version} on PATH",
    )


def _compiler(run: CellRun) -> CheckResult:
    found = find_compiler(run.runner)
    if isinstance(found, Found):
        return CheckResult.passed("compiler", f"{found.path} {found.version}")
    return CheckResult.failed("compiler", f"no C++ compiler ({'; '.join(found.looked)})", "install g++ (Debian: apt-get install g++) or set CXX")


def _toolkit(run: CellRun) -> CheckResult:
    variant = run.plan.cell.variant
    found = find_toolkit(variant, run.runner)
    if found is None:
        return CheckResult.passed("toolkit", "none needed (CPU variant)")
    kind = "CUDA" if variant.family is Family.CUDA else "ROCm"
    compiler = "nvcc" if variant.family is Family.CUDA else "hipcc"
    if isinstance(found, Toolkit):
        run.toolkit = found
        return CheckResult.passed("toolkit", f"{compiler} {found.version} at {found.compiler}")
    if variant.toolkit_wheels:
        # Checked once the env exists: env-checks runs its nvcc.
        return CheckResult.passed("toolkit", f"none installed; the locked env brings {', '.join(variant.toolkit_wheels[:1])} (pip's full {kind} compiler)")
    home = "CUDA_HOME" if variant.family is Family.CUDA else "ROCM_PATH"
    return CheckResult.failed(
        "toolkit",
        f"no {kind} {variant.toolkit_short} toolkit (looked: {'; '.join(found.looked)})",
        f"install {kind} {variant.toolkit} and set {home} to it",
    )


def _disk(run: CellRun) -> CheckResult:
    need = run.matrix.min_free_disk.get(run.plan.cell.variant.family.value, 0)
    run.layout.root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(run.layout.root).free
    if free < need:
        detail = f"{format_size(free)} free under {run.layout.root}, {format_size(need)} needed"
        return CheckResult.failed("disk", detail, "free space or set WHEELMILL_OUTPUT to a bigger disk")
    return CheckResult.passed("disk", f"{format_size(free)} free (>= {format_size(need)})")


def _lock(run: CellRun) -> CheckResult:
    """A committed lock made for other inputs stops the cell here, before anything builds."""
    committed = path_of(run.plan.locks_dir, run.plan.cell.id)
    if not committed.is_file():
        run.lock_origin = "resolved at build time (no committed lock)"
        return CheckResult.passed("lock", f"no {committed}: the env is resolved now (`wheelmill lock --cell {run.plan.cell.id}` commits one)")
    recorded = recorded_digest(committed)
    if recorded != run.plan.lock.digest:
        return CheckResult.failed(
            "lock",
            f"{committed} was made for other inputs (recorded {str(recorded)[:12]}..., now {run.plan.lock.digest[:12]}...): "
            "the build requirements, the Python or the platform changed",
            f"run `wheelmill lock --cell {run.plan.cell.id}` and commit {committed}",
        )
    run.lock_origin = f"committed {committed}"
    return CheckResult.passed("lock", f"{committed} matches its inputs ({run.plan.lock.digest[:12]}...)")


def _torch(run: CellRun, log: StepLog) -> CheckResult:
    variant = run.plan.cell.variant
    base = machine_sources(run.settings)
    # Resolved here, before any container: uv resolves for the lock's target, not this Python.
    outcome = locate_torch(
        variant, run.plan.torch_index, base, backend=run.backend, target=run.plan.lock.target, work=run.layout.root, log=log, interpreter=Path(sys.executable)
    )
    if isinstance(outcome, PackageSources):
        run.sources = outcome
        return CheckResult.passed("torch-source", f"{variant.torch_requirement} from {outcome.describe()}")
    return CheckResult.failed(
        "torch-source",
        f"{variant.torch_requirement} for Python {run.plan.cell.python} is in none of: {' | '.join(outcome)}",
        f"set WHEELMILL_TORCH_INDEX to an index (or mirror) with torch {variant.torch}+{variant.label}, or put its wheel in a WHEELMILL_FIND_LINKS directory",
    )


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
) -> PackageSources | list[str]:
    """The sources that have the variant's torch: ``base`` (the machine's) first, then with
    the torch index. Returns them, or what each candidate said."""
    candidates = [base] + ([base.with_torch_index(torch_index)] if torch_index else [])
    tried = []
    for sources in candidates:
        version, reason = _locate(variant, sources, backend=backend, target=target, work=work, log=log, interpreter=interpreter)
        if version is None:
            tried.append(f"{sources.describe()} [{reason}]")
            continue
        verdict = judge_located(version, variant)
        if verdict.verdict is Verdict.PASS:
            return sources
        tried.append(f"{sources.describe()} [{verdict.detail}]")
    return tried


def _locate(
    variant: Variant, sources: PackageSources, *, backend: EnvBackend, target: Target, work: Path, log: StepLog, interpreter: Path | None
) -> tuple[str | None, str]:
    """The torch version ``sources`` resolve to, or None and why not (a short reason)."""
    work.mkdir(parents=True, exist_ok=True)
    requirements = work / "torch-probe.in"
    requirements.write_text(variant.torch_requirement + "\n", encoding="utf-8")
    out = work / "torch-probe.txt"
    try:
        pins = backend.lock(requirements, out, target=target, sources=sources, log=log, hashes=False, deps=False, fail_fast=True, interpreter=interpreter)
    except CommandFailed as failed:
        kind = "unreachable" if is_transient("\n".join(failed.tail)) else "not found"
        return None, f"{kind}: {_reason(failed)}"
    finally:
        requirements.unlink(missing_ok=True)
        out.unlink(missing_ok=True)
    return pins.get("torch"), "resolved"


def _reason(failed: CommandFailed) -> str:
    lines = [line.strip() for line in failed.tail if line.strip()]
    causes = [line.removeprefix("cause:").strip() for line in lines if line.startswith("cause:")]
    text = causes[-1] if causes else (lines[0] if lines else "no output")
    return text[:160]


def resolve_lock(run: CellRun, log: StepLog, target: Target) -> dict[str, str]:
    """Resolve the cell's lock inputs into the cell's lock file, with hashes."""
    run.layout.requirements.write_text(requirements_text(run.plan.lock.requirements), encoding="utf-8")
    return run.backend.lock(run.layout.requirements, run.layout.lock, target=target, sources=run.need_sources(), log=log, interpreter=run.python)


def prepare_env(run: CellRun, log: StepLog) -> list[CheckResult]:
    """A fresh env from the committed lock, or from one resolved now, hashes checked."""
    committed = path_of(run.plan.locks_dir, run.plan.cell.id)
    sources = run.need_sources()
    try:
        if committed.is_file():
            run.layout.lock.write_text(committed.read_text(encoding="utf-8"), encoding="utf-8")
        else:
            resolve_lock(run, log, run.plan.lock.target)
        env = run.backend.create(run.layout.envs / "build", python=run.need_python(), log=log)
        run.backend.sync(env, run.layout.lock, sources=sources, log=log)
    except CommandFailed as failed:
        if is_transient("\n".join(failed.tail)):
            raise TransientError(f"{failed.argv[1]} {failed.argv[2]}: {failed.last_line()}") from None
        raise EnvError(f"{run.plan.cell.id}: build env: {failed.last_line()}", fix=f"read {failed.log}") from None
    pins = pinned_versions(run.layout.lock.read_text(encoding="utf-8"))
    run.build_env = env
    run.torch_pins = pins
    return [CheckResult.passed("lock", f"{len(pins)} packages with hashes, {run.lock_origin}; torch {pins.get('torch')}")]


def env_checks(run: CellRun, log: StepLog) -> list[CheckResult]:
    env = run.build_env
    assert env is not None
    info = read_torch(run.runner.host_path(env.root))
    log.note(f"torch/version.py: {info.version}, cuda {info.cuda}, hip {info.hip}; distribution {info.dist_version}")
    results = judge_torch(info, run.plan.cell.variant)
    results += _env_toolkit(run)
    if any(r.verdict is Verdict.FAIL for r in results):
        what, fix = summarize_failures(results)
        raise PrecheckError(f"{run.plan.cell.id}: env-checks failed: {what}", fix=fix)
    run.torch = info
    return results


def _env_toolkit(run: CellRun) -> list[CheckResult]:
    """Without an installed toolkit, the env's pip wheels must hold the variant's nvcc."""
    variant = run.plan.cell.variant
    if run.toolkit is not None or not variant.toolkit_wheels:
        return []
    assert run.build_env is not None
    found = find_env_toolkit(variant, run.build_env.root, run.runner)
    if isinstance(found, NotFound):
        detail = f"no nvcc {variant.toolkit_short} in the env ({'; '.join(found.looked)})"
        return [CheckResult.failed("env-toolkit", detail, "check toolkit-wheels of the variant in the matrix")]
    run.toolkit = found
    linked = link_dev_names(run.runner.host_path(found.root / "lib"))
    extra = f"; linked {', '.join(linked)} for the linker" if linked else ""
    return [CheckResult.passed("env-toolkit", f"nvcc {found.version} from pip's wheels at {found.root}{extra}")]


def link_dev_names(lib_dir: Path) -> list[str]:
    """pip's CUDA wheels ship ``libcudart.so.13`` but not the ``libcudart.so`` a toolkit
    has for ``-lcudart``: add those names, as links, where missing."""
    made = []
    for library in sorted(lib_dir.glob("lib*.so.*")):
        stem = library.name.split(".so.", 1)[0] + ".so"
        dev = lib_dir / stem
        if library.name.count(".") == 2 and not dev.exists() and not dev.is_symlink():
            dev.symlink_to(library.name)
            made.append(stem)
    return made
