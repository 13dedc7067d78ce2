"""The build and stamp steps.

The build runs the recipe's command in the cell's build env, without build isolation (so
the extension compiles against the env's torch, not a fresh one pip would download), with
an explicit environment: the variant's toolkit and arch list, and ``MAX_JOBS`` sized to the
free memory. The stamp step then writes what the wheel must declare: the variant's version
label and exact pins on the torch it was built against and on sibling recipes.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path

from packaging.utils import canonicalize_name

from wheelmill.checks import CheckResult
from wheelmill.config import format_size
from wheelmill.context import CellRun
from wheelmill.errors import BuildError, ConfigError, EnvError
from wheelmill.matrix import Family
from wheelmill.plan import DEFAULT_BUILD, arch_list
from wheelmill.recipes import ResolvedRecipe
from wheelmill.runner import CommandFailed, StepLog, base_environment
from wheelmill.versions import stamp_version
from wheelmill.wheelfile import read_wheel, rewrite_metadata


def available_memory() -> int:
    """MemAvailable from /proc/meminfo, in bytes (what new processes can get)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def max_jobs(memory: int, per_job: int, cores: int) -> int:
    """Parallel compile jobs that fit in memory and cores, at least one.

    >>> max_jobs(24 * 2**30, 3 * 2**30, 2), max_jobs(5 * 2**30, 3 * 2**30, 16), max_jobs(1, 2**30, 4)
    (2, 1, 1)
    """
    return max(1, min(cores, memory // per_job))


def build(run: CellRun, recipe: ResolvedRecipe, log: StepLog) -> list[CheckResult]:
    env, _torch = run.need_env()
    _install_dependencies(run, recipe, log)
    out = run.layout.build / recipe.name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    source = run.source_dirs[recipe.name]
    values = {"python": str(env.python), "source": str(source), "dist": str(out), "cell": run.plan.cell.id, "label": run.plan.cell.variant.label}
    argv = [fill(part, values, recipe, "build.command") for part in (recipe.command or DEFAULT_BUILD)]
    environment = build_environment(run, recipe, values)
    log.note(f"MAX_JOBS={environment['MAX_JOBS']} ({format_size(available_memory())} available)")
    try:
        run.runner.run(argv, env=environment, log=log, cwd=source, on_line=run.on_line)
    except CommandFailed as failed:
        raise BuildError(f"{recipe.name}: build failed (exit {failed.returncode}): {first_error(log.path, failed.tail)}", fix=f"read {failed.log}") from None
    wheels = sorted(out.glob("*.whl"))
    if len(wheels) != 1:
        raise BuildError(
            f"{recipe.name}: the build made {len(wheels)} wheels in {out}, not one", fix="make the build command write exactly one wheel to {dist}"
        )
    run.built[recipe.name] = wheels[0]
    run.max_jobs[recipe.name] = int(environment["MAX_JOBS"])
    return [CheckResult.passed("wheel", f"{wheels[0].name} ({format_size(wheels[0].stat().st_size)}), MAX_JOBS={environment['MAX_JOBS']}")]


def build_environment(run: CellRun, recipe: ResolvedRecipe, values: Mapping[str, str]) -> dict[str, str]:
    """The explicit environment of a build: env and toolkit on PATH, archs, jobs, recipe env."""
    env, _torch = run.need_env()
    cell = run.plan.cell
    path = [env.bin_dir] + ([run.toolkit.bin_dir] if run.toolkit else [])
    extra: dict[str, str] = dict(run.toolkit.environment()) if run.toolkit else {}
    archs = arch_list(cell, recipe)
    match cell.variant.family:
        case Family.CUDA:
            extra["TORCH_CUDA_ARCH_LIST"] = archs or ""
            extra["FORCE_CUDA"] = "1"
        case Family.ROCM:
            extra["PYTORCH_ROCM_ARCH"] = archs or ""
            extra["FORCE_CUDA"] = "1"
        case Family.CPU:
            extra["FORCE_CUDA"] = "0"
    per_job = recipe.memory_per_job or run.matrix.memory_per_job.get(cell.variant.family.value, 2 * 2**30)
    extra["MAX_JOBS"] = str(max_jobs(available_memory(), per_job, os.cpu_count() or 1))
    extra["WHEELMILL_CELL"] = cell.id
    extra.update({key: fill(value, values, recipe, f"build.env.{key}") for key, value in recipe.env.items()})
    return base_environment(path, extra)


def fill(template: str, values: Mapping[str, str], recipe: ResolvedRecipe, key: str) -> str:
    try:
        return template.format_map(values)
    except (KeyError, ValueError, IndexError) as exc:
        raise ConfigError(f"{recipe.file}: {key}: unknown placeholder in {template!r} ({exc})", fix=f"use only {{{'}, {'.join(values)}}}") from None


_COMPILER_ERROR = re.compile(r":\d+(:\d+)?: (fatal )?error\b|^error\b.*:|\berror: ")


def first_error(log: Path, tail: tuple[str, ...]) -> str:
    """The first compiler-style error of the build log: the cause, not pip's epilogue."""
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        lines = list(tail)
    for line in lines:
        if not line.startswith("# ") and _COMPILER_ERROR.search(line) and "subprocess-exited-with-error" not in line:
            return line.strip()[:240]
    rest = [line.strip() for line in tail if line.strip()]
    return rest[-1][:240] if rest else "no output"


def _install_dependencies(run: CellRun, recipe: ResolvedRecipe, log: StepLog) -> None:
    if not recipe.depends_on:
        return
    env, _torch = run.need_env()
    wheels = [str(run.final[dep]) for dep in recipe.depends_on]
    try:
        run.backend.install(env, wheels, sources=run.need_sources(), log=log, deps=False)
    except CommandFailed as failed:
        raise EnvError(f"{recipe.name}: installing {', '.join(recipe.depends_on)} into the build env: {failed.last_line()}", fix=f"read {failed.log}") from None


def stamp(run: CellRun, recipe: ResolvedRecipe, log: StepLog) -> list[CheckResult]:
    _env, torch = run.need_env()
    built = run.built[recipe.name]
    info = read_wheel(built)
    label = run.plan.cell.variant.label if recipe.local_label else None
    version = stamp_version(recipe.version_rule, str(info.version), release=run.plan.release, label=label)
    pins = expected_pins(run, recipe, torch.dist_version)
    dependencies = {canonicalize_name(d) for d in recipe.depends_on}
    add = [r for r in recipe.run_requires if canonicalize_name(r) not in dependencies]
    out = run.layout.build / recipe.name / "stamped"
    out.mkdir(parents=True, exist_ok=True)
    stamped = rewrite_metadata(built, out, version=version, pins=pins, add=add)
    run.stamped[recipe.name] = stamped
    changes = ([f"version {info.version} -> {version}"] if version else []) + [f"{k}=={v}" for k, v in pins.items()] + add
    log.note(f"{built.name} -> {stamped.name}: {', '.join(changes) or 'no change'}")
    return [CheckResult.passed("metadata", f"{stamped.name}: " + (", ".join(changes) or "unchanged"))]


def expected_pins(run: CellRun, recipe: ResolvedRecipe, torch_version: str) -> dict[str, str]:
    """What the wheel must pin exactly: the build's torch, and the sibling recipes it needs."""
    pins = {"torch": torch_version} if recipe.torch_pin else {}
    for requirement in recipe.run_requires:
        if requirement in recipe.depends_on:
            pins[requirement] = str(read_wheel(run.final[requirement]).version)
    return pins
