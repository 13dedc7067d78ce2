"""Cell steps: before any recipe, make sure this machine can build the cell, then make
its build env and prove the torch in it is the variant's build."""

from __future__ import annotations

import shutil

from wheelmill.checks import CheckResult, Verdict, summarize_failures
from wheelmill.checks.torchenv import judge_located, judge_torch
from wheelmill.config import format_size
from wheelmill.context import CellRun
from wheelmill.errors import EnvError, PrecheckError
from wheelmill.matrix import Family
from wheelmill.net import is_transient
from wheelmill.plan import build_requires
from wheelmill.probes import read_torch
from wheelmill.retry import TransientError
from wheelmill.runner import CommandFailed, StepLog
from wheelmill.sources import PackageSources, machine_sources
from wheelmill.toolchain import Found, NotFound, Toolkit, find_compiler, find_python, find_toolkit


def prepare_container(run: CellRun, log: StepLog) -> list[CheckResult]:
    log.note(f"engine {run.plan.engine}: every command runs on this machine, with an explicit environment")
    return [CheckResult.passed("engine", f"{run.plan.engine} (this machine)")]


def pre_checks(run: CellRun, log: StepLog) -> list[CheckResult]:
    results = [_python(run), _compiler(), _toolkit(run), _disk(run)]
    results.append(_torch(run, log) if run.python else CheckResult.skipped("torch-source", "no Python to resolve for"))
    for result in results:
        log.note(f"{result.name}: {result.verdict}: {result.detail}")
    if any(r.verdict is Verdict.FAIL for r in results):
        what, fix = summarize_failures(results)
        raise PrecheckError(f"{run.plan.cell.id}: pre-checks failed: {what}", fix=fix)
    return results


def _python(run: CellRun) -> CheckResult:
    version = run.plan.cell.python
    found = find_python(version)
    if isinstance(found, Found):
        run.python = found.path
        return CheckResult.passed("python", f"CPython {version} at {found.path}")
    return CheckResult.failed(
        "python",
        f"CPython {version} not found (looked: {'; '.join(found.looked)})",
        f"install it (`pyenv install {version}` or `uv python install {version}`) or put python{version} on PATH",
    )


def _compiler() -> CheckResult:
    found = find_compiler()
    if isinstance(found, Found):
        return CheckResult.passed("compiler", f"{found.path} {found.version}")
    return CheckResult.failed("compiler", f"no C++ compiler ({'; '.join(found.looked)})", "install g++ (Debian: apt-get install g++) or set CXX")


def _toolkit(run: CellRun) -> CheckResult:
    variant = run.plan.cell.variant
    found = find_toolkit(variant)
    if found is None:
        return CheckResult.passed("toolkit", "none needed (CPU variant)")
    kind = "CUDA" if variant.family is Family.CUDA else "ROCm"
    compiler = "nvcc" if variant.family is Family.CUDA else "hipcc"
    if isinstance(found, Toolkit):
        run.toolkit = found
        return CheckResult.passed("toolkit", f"{compiler} {found.version} at {found.compiler}")
    assert isinstance(found, NotFound)
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
        return CheckResult.failed(
            "disk", f"{format_size(free)} free under {run.layout.root}, {format_size(need)} needed", "free space or set WHEELMILL_OUTPUT to a bigger disk"
        )
    return CheckResult.passed("disk", f"{format_size(free)} free (>= {format_size(need)})")


def _torch(run: CellRun, log: StepLog) -> CheckResult:
    """Find the variant's torch: the machine's package sources first, then the torch index."""
    variant = run.plan.cell.variant
    base = machine_sources(run.settings)
    candidates = [base] + ([base.with_torch_index(run.plan.torch_index)] if run.plan.torch_index else [])
    tried = []
    for sources in candidates:
        version, reason = _locate(run, sources, log)
        if version is None:
            tried.append(f"{sources.describe()} [{reason}]")
            continue
        verdict = judge_located(version, variant)
        if verdict.verdict is Verdict.PASS:
            run.sources = sources
            return CheckResult.passed("torch-source", f"torch {version} from {sources.describe()}")
        tried.append(f"{sources.describe()} [{verdict.detail}]")
    return CheckResult.failed(
        "torch-source",
        f"{variant.torch_requirement} for Python {run.plan.cell.python} is in none of: {' | '.join(tried)}",
        f"set WHEELMILL_TORCH_INDEX to an index (or mirror) with torch {variant.torch}+{variant.label}, or put its wheel in a WHEELMILL_FIND_LINKS directory",
    )


def _locate(run: CellRun, sources: PackageSources, log: StepLog) -> tuple[str | None, str]:
    """The torch version ``sources`` resolve to, or None and why not (a short reason)."""
    requirements = run.layout.root / "torch-probe.in"
    requirements.write_text(run.plan.cell.variant.torch_requirement + "\n", encoding="utf-8")
    out = run.layout.root / "torch-probe.txt"
    try:
        pins = run.backend.lock(requirements, out, python=run.need_python(), sources=sources, log=log, hashes=False, deps=False, fail_fast=True)
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


def prepare_env(run: CellRun, log: StepLog) -> list[CheckResult]:
    """Lock the build requirements (with hashes) and make a fresh env from the lock."""
    variant = run.plan.cell.variant
    requirements = [variant.torch_requirement, *build_requires(run.matrix, run.plan.recipes)]
    run.layout.requirements.write_text("\n".join(requirements) + "\n", encoding="utf-8")
    sources = run.need_sources()
    try:
        pins = run.backend.lock(run.layout.requirements, run.layout.lock, python=run.need_python(), sources=sources, log=log)
        env = run.backend.create(run.layout.envs / "build", python=run.need_python(), log=log)
        run.backend.sync(env, run.layout.lock, sources=sources, log=log)
    except CommandFailed as failed:
        if is_transient("\n".join(failed.tail)):
            raise TransientError(f"{failed.argv[1]} {failed.argv[2]}: {failed.last_line()}") from None
        raise EnvError(f"{run.plan.cell.id}: build env: {failed.last_line()}", fix=f"see {failed.log}") from None
    run.build_env = env
    run.torch_pins = pins
    return [CheckResult.passed("lock", f"{len(pins)} packages locked with hashes in {run.layout.lock.name}, torch {pins.get('torch')}")]


def env_checks(run: CellRun, log: StepLog) -> list[CheckResult]:
    env = run.build_env
    assert env is not None
    info = read_torch(env.root)
    log.note(f"torch/version.py: {info.version}, cuda {info.cuda}, hip {info.hip}; distribution {info.dist_version}")
    results = judge_torch(info, run.plan.cell.variant)
    if any(r.verdict is Verdict.FAIL for r in results):
        what, fix = summarize_failures(results)
        raise PrecheckError(f"{run.plan.cell.id}: env-checks failed: {what}", fix=fix)
    run.torch = info
    return results
