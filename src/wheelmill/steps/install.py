"""The install test: the repaired wheel goes into a second, clean env (the locked torch and
nothing of the build), is imported, its torch operators are looked up, and the recipe's
smoke command runs from an empty directory so nothing is imported from the source tree.
Only a wheel that passes lands in ``<cell>/dist``."""

from __future__ import annotations

import json
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from packaging.utils import canonicalize_name

from wheelmill.checks import CheckResult, Verdict
from wheelmill.context import CellRun
from wheelmill.envs import Env, constraints_from_lock
from wheelmill.errors import InstallTestError
from wheelmill.probes import IMPORTS, run_probe
from wheelmill.recipes import ResolvedRecipe
from wheelmill.runner import CommandFailed, StepLog, base_environment
from wheelmill.steps.build import fill
from wheelmill.wheelfile import read_wheel


def install_test(run: CellRun, recipe: ResolvedRecipe, log: StepLog) -> list[CheckResult]:
    wheel = run.repaired[recipe.name]
    env = _test_env(run, recipe, wheel, log)
    # The import probe and the smoke command each start a Python that imports torch
    # (seconds); they are independent, so they run side by side, the probe with its own log.
    probe_log = StepLog(log.path.with_suffix(".imports.log"))
    log.note(f"import probe running beside the smoke command, logging to {probe_log.path}")
    with probe_log, ThreadPoolExecutor(max_workers=1) as pool:
        probing = pool.submit(_probe, run, recipe, env, probe_log)
        smoke = _smoke(run, recipe, env, log) if recipe.smoke else None
        results = probing.result()
    failed = [r for r in results if r.verdict is Verdict.FAIL]
    if failed:
        raise InstallTestError(f"{recipe.name}: " + "; ".join(f"{r.name}: {r.detail}" for r in failed), fix=f"read {probe_log.path}")
    if isinstance(smoke, InstallTestError):
        raise smoke
    results += [smoke] if smoke else []
    _deliver(run, recipe, wheel)
    shutil.rmtree(env.root, ignore_errors=True)
    return results


def _needed_wheels(run: CellRun, recipe: ResolvedRecipe) -> list[str]:
    """The wheel under test and the final wheels of everything it depends on."""
    seen: list[str] = []
    stack = list(recipe.depends_on)
    while stack:
        name = stack.pop()
        if name not in seen:
            seen.append(name)
            stack.extend(run.plan.recipe(name).depends_on)
    return [str(run.repaired[recipe.name]), *(str(run.final[name]) for name in seen)]


def _test_env(run: CellRun, recipe: ResolvedRecipe, wheel: Path, log: StepLog) -> Env:
    env = run.backend.create(run.layout.envs / f"test-{recipe.name}", python=run.need_python(), log=log)
    constraints = constraints_from_lock(run.layout.lock, run.layout.root / "constraints.txt")
    packages = [*_needed_wheels(run, recipe), *run.matrix.test_requires, *recipe.test_requires]
    try:
        run.backend.install(env, packages, sources=run.need_sources(), log=log, constraints=constraints)
    except CommandFailed as failed:
        raise InstallTestError(f"{recipe.name}: {wheel.name} does not install into a clean env: {failed.last_line()}", fix=f"read {failed.log}") from None
    return env


def _probe(run: CellRun, recipe: ResolvedRecipe, env: Env, log: StepLog) -> list[CheckResult]:
    if not recipe.imports and not recipe.torch_ops:
        return [CheckResult.skipped("import", "the recipe names no module or operator")]
    spec = json.dumps({"imports": list(recipe.imports), "ops": list(recipe.torch_ops)})
    with tempfile.TemporaryDirectory(prefix="wheelmill-probe-", dir=run.layout.root) as cwd:
        try:
            data = run_probe(run.runner, env.python, IMPORTS, [spec], env=base_environment([env.bin_dir]), log=log, cwd=Path(cwd))
        except CommandFailed as failed:
            raise InstallTestError(f"{recipe.name}: importing torch in the test env failed: {failed.last_line()}", fix=f"read {failed.log}") from None
    return [
        CheckResult.passed(r["name"], r["detail"]) if r["ok"] else CheckResult.failed(r["name"], r["detail"], "check the module and its operator registration")
        for r in data
    ]


def _smoke(run: CellRun, recipe: ResolvedRecipe, env: Env, log: StepLog) -> CheckResult | InstallTestError:
    """The smoke command's verdict, or its error (raised after the probe's, which says more)."""
    assert recipe.smoke is not None
    values = {"python": str(env.python), "source": str(run.source_dirs[recipe.name]), "cell": run.plan.cell.id, "label": run.plan.cell.variant.label}
    argv = [fill(part, values, recipe, "checks.smoke") for part in recipe.smoke]
    with tempfile.TemporaryDirectory(prefix="wheelmill-smoke-", dir=run.layout.root) as cwd:
        try:
            result = run.runner.run(argv, env=base_environment([env.bin_dir]), log=log, cwd=Path(cwd), on_line=run.on_line, keep_output=True)
        except CommandFailed as failed:
            return InstallTestError(f"{recipe.name}: smoke command failed (exit {failed.returncode}): {failed.last_line()}", fix=f"read {failed.log}")
    last = [line for line in result.output.splitlines() if line.strip()]
    return CheckResult.passed("smoke", last[-1].strip()[:160] if last else "passed")


def _deliver(run: CellRun, recipe: ResolvedRecipe, wheel: Path) -> None:
    """Move the tested wheel into dist/, replacing older wheels of the same project."""
    run.layout.dist.mkdir(parents=True, exist_ok=True)
    name = canonicalize_name(read_wheel(wheel).name)
    for old in run.layout.dist.glob("*.whl"):
        if old.name != wheel.name and canonicalize_name(old.name.split("-", 1)[0]) == name:
            old.unlink()
    target = run.layout.dist / wheel.name
    tmp = target.with_name(f".{target.name}.part")
    shutil.copyfile(wheel, tmp)
    tmp.replace(target)
    run.final[recipe.name] = target
