"""The install test: the repaired wheel goes into a second, clean env (the locked torch and
nothing of the build), is imported, its torch operators are looked up, and the recipe's
smoke command runs from an empty directory so nothing is imported from the source tree:
in the probe's interpreter, after its checks, where it runs the env's Python
(``probes.joined``). Only a wheel that passes lands in ``<cell>/dist``."""

from __future__ import annotations

import json
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from wheelmill.building.context import Outcome, StepContext
from wheelmill.building.products import BuildEnv, Fetched, Repaired, ShippedAbi, Sources, Toolchain
from wheelmill.building.steps.build import fill
from wheelmill.building.steps.cell import keep_bytecode, lend_bytecode
from wheelmill.building.steps.provenance import attest
from wheelmill.checks import CheckResult, Verdict
from wheelmill.checks.tally import tally
from wheelmill.errors import CommandFailed, InstallTestError
from wheelmill.files import Content, Linked, write_all
from wheelmill.machine.envs import Env, constraints_from_lock
from wheelmill.machine.probes import IMPORTS, MARK, joined, parse
from wheelmill.machine.process import StepLog, base_environment
from wheelmill.output.report import WheelRecord
from wheelmill.planning.spec import CellPlan, RecipeSpec
from wheelmill.provenance.statement import beside
from wheelmill.settings import InstallTests
from wheelmill.wheel.wheelfile import read_wheel

UNTESTED = "WHEELMILL_INSTALL_TESTS=none"


def install_test(ctx: StepContext, spec: RecipeSpec) -> Outcome:
    wheel = ctx.done.get(Repaired, spec.name).wheel
    abi = ctx.done.get(ShippedAbi, spec.name).text
    if ctx.run.plan.choices.install_tests is InstallTests.NONE:
        # No provenance: a signed statement is a claim that the checks ran, and this one did not.
        delivered = deliver(ctx.run.layout.dist, wheel)
        keep_bytecode(ctx, ctx.done.get(BuildEnv).env, "of the build env kept")  # as a test env's start keeps it
        untested = CheckResult.skipped("install-test", f"{UNTESTED}: {delivered.name} delivered untested")
        return Outcome(checks=[untested], made=(WheelRecord.of(delivered, abi=abi),))
    env = _test_env(ctx, spec, wheel)
    smoke = _smoke_argv(ctx, spec, env)
    then = joined(smoke, str(env.python)) if smoke and (spec.imports or spec.torch_ops) else None
    # The import probe's interpreter runs the smoke command after its checks where it can:
    # one import of torch (seconds of CPU) where two interpreters would each make one.
    results = _probe(ctx, spec, env, ctx.log, then=then) if then else _beside(ctx, spec, env, smoke)
    delivered = deliver(ctx.run.layout.dist, wheel, provenance=attest(ctx, spec, wheel))
    keep_bytecode(ctx, env, "of the test env kept, for the next envs")
    shutil.rmtree(env.root, ignore_errors=True)
    return Outcome(checks=results, made=(WheelRecord.of(delivered, abi=abi),))


def _beside(ctx: StepContext, spec: RecipeSpec, env: Env, smoke: list[str] | None) -> list[CheckResult]:
    """The probe and a smoke command it cannot run (another program, interpreter options):
    each imports torch (seconds), so they run side by side, the probe with its own log."""
    probe_log = StepLog(ctx.log.path.with_suffix(".imports.log"))
    ctx.log.note(f"import probe running beside the smoke command, logging to {probe_log.path}")
    with probe_log, ThreadPoolExecutor(max_workers=1) as pool:
        probing = pool.submit(_probe, ctx, spec, env, probe_log)
        verdict = _smoke(ctx, spec, env, smoke) if smoke else None
        results = probing.result()  # its error first: it says more than the smoke's
    if isinstance(verdict, InstallTestError):
        raise verdict
    return [*results, verdict] if verdict else results


def _test_env(ctx: StepContext, spec: RecipeSpec, wheel: Path) -> Env:
    backend, layout = ctx.where.backend, ctx.run.layout
    env = backend.create(layout.envs / f"test-{spec.name}", python=ctx.done.get(Toolchain).python, log=ctx.log)
    build_env = ctx.done.get(BuildEnv)
    constraints = constraints_from_lock(build_env.lock, layout.root / "constraints.txt")
    # The wheel under test and the delivered wheels of everything it depends on.
    packages = [str(wheel), *(ctx.done.get(WheelRecord, name).path for name in spec.needs), *spec.test_requires]
    try:
        backend.install(env, packages, sources=ctx.done.get(Sources).packages, log=ctx.log, constraints=constraints)
    except CommandFailed as failed:
        raise InstallTestError(
            f"{spec.name}: {wheel.name} does not install into a clean env: {failed.last_line()}",
            fix=f"read {failed.log}",
        ) from None
    # What the build compiled (torch's modules) and earlier tests did (pytest, sympy, which
    # torch's operators import at their first call), so the test's imports compile none of it.
    keep_bytecode(ctx, build_env.env, "of the build env kept")
    lend_bytecode(ctx, env)
    return env


def _probe(
    ctx: StepContext, spec: RecipeSpec, env: Env, log: StepLog, *, then: dict[str, Any] | None = None
) -> list[CheckResult]:
    """The import probe's checks, each passed (else its error); ``then``: the smoke command's
    verdict after them, run by the same interpreter (its output to the terminal too)."""
    if not spec.imports and not spec.torch_ops:
        return [CheckResult.skipped("import", "the recipe names no module or operator")]
    request = json.dumps({"imports": list(spec.imports), "ops": list(spec.torch_ops), "then": then})
    lines: list[str] = []

    def seen(line: str) -> None:
        lines.append(line)
        if then:
            ctx.run.on_line(line)

    failed: CommandFailed | None = None
    with tempfile.TemporaryDirectory(prefix="wheelmill-probe-", dir=ctx.run.layout.root) as cwd:
        try:
            ctx.where.runner.run(
                [str(env.python), "-c", IMPORTS, request],
                env=base_environment([env.bin_dir]),
                log=log,
                cwd=Path(cwd),
                on_line=seen,
            )
        except CommandFailed as exc:  # the smoke's failure, where the probe said its result first
            failed = exc
    checks = _checks(spec, parse("".join(lines)), failed, log)
    if then is None:
        return checks
    if failed:
        raise _smoke_failed(spec, failed)
    return [*checks, _smoke_passed(lines[_marked(lines) + 1 :])]


def _checks(
    spec: RecipeSpec, data: list[dict[str, Any]] | None, failed: CommandFailed | None, log: StepLog
) -> list[CheckResult]:
    """The probe's result as checks, or the error that says why there is none, or which failed."""
    if data is None and failed:
        raise InstallTestError(
            f"{spec.name}: importing torch in the test env failed: {failed.last_line()}", fix=f"read {failed.log}"
        )
    if data is None:
        raise InstallTestError(
            f"{spec.name}: the import probe printed no result: "
            "something it imported ended the interpreter or printed a result line of its own",
            fix=f"read {log.path}",
        )
    checks = [
        CheckResult.passed(r["name"], r["detail"])
        if r["ok"]
        else CheckResult.failed(r["name"], r["detail"], "check the module and its operator registration")
        for r in data
    ]
    wrong = [c for c in checks if c.verdict is Verdict.FAIL]
    if wrong:
        raise InstallTestError(
            f"{spec.name}: " + "; ".join(f"{c.name}: {c.detail}" for c in wrong), fix=f"read {log.path}"
        )
    return checks


def _marked(lines: list[str]) -> int:
    return max(i for i, line in enumerate(lines) if line.startswith(MARK))


def _smoke_argv(ctx: StepContext, spec: RecipeSpec, env: Env) -> list[str] | None:
    if not spec.smoke:
        return None
    values = {"python": str(env.python), "source": str(ctx.done.get(Fetched, spec.name).root), **spec.template_values()}
    return [fill(part, values) for part in spec.smoke]


def _smoke(ctx: StepContext, spec: RecipeSpec, env: Env, argv: list[str]) -> CheckResult | InstallTestError:
    """The smoke command's verdict, or its error (raised after the probe's, which says more)."""
    with tempfile.TemporaryDirectory(prefix="wheelmill-smoke-", dir=ctx.run.layout.root) as cwd:
        try:
            result = ctx.where.runner.run(
                argv,
                env=base_environment([env.bin_dir]),
                log=ctx.log,
                cwd=Path(cwd),
                on_line=ctx.run.on_line,
                keep_output=True,
            )
        except CommandFailed as failed:
            return _smoke_failed(spec, failed)
    return _smoke_passed(result.output.splitlines())


def _smoke_passed(output: list[str]) -> CheckResult:
    """The smoke's verdict: its last line said; where it counts tests that were skipped
    (a GPU test on a machine without one), expected to fail, or none at all, a skip: what was
    not run is never a pass."""
    said = [line.strip() for line in output if line.strip()]
    counted = tally(said)
    if counted is not None and not counted.complete:
        return CheckResult.skipped("smoke", f"{counted.describe()}: what did not run proved nothing here")
    return CheckResult.passed("smoke", said[-1][:160] if said else "passed")


def _smoke_failed(spec: RecipeSpec, failed: CommandFailed) -> InstallTestError:
    return InstallTestError(
        f"{spec.name}: smoke command failed (exit {failed.returncode}): {failed.last_line()}", fix=f"read {failed.log}"
    )


def deliver(dist: Path, wheel: Path, *, link: bool = False, provenance: bytes | None = None) -> Path:
    """Copy the tested wheel into dist/ (``link``: hard-link a published, immutable one), with
    its signed provenance beside it where it has one (``<wheel>.intoto.jsonl``, which a
    release publishes with it), replacing older wheels of the same project and theirs."""
    dist.mkdir(parents=True, exist_ok=True)
    name = canonicalize_name(read_wheel(wheel).name)
    for old in dist.glob("*.whl"):
        if old.name != wheel.name and canonicalize_name(old.name.split("-", 1)[0]) == name:
            beside(old).unlink(missing_ok=True)
            old.unlink()
    kept = beside(dist / wheel.name)
    kept.unlink(missing_ok=True)  # a provenance of other bytes of that name must not outlive them
    files: dict[Path, Content] = {dist / wheel.name: Linked(wheel) if link else wheel}
    if provenance is not None:
        files[kept] = provenance
    write_all(files)
    return dist / wheel.name


def describe(plan: CellPlan, spec: RecipeSpec) -> str:
    if plan.choices.install_tests is InstallTests.NONE:
        return f"none ({UNTESTED}): the wheel delivered to dist/ untested, unsigned"
    what = [f"import {', '.join(spec.imports)}"] if spec.imports else []
    what += [f"torch.ops {', '.join(spec.torch_ops)}"] if spec.torch_ops else []
    what += [f"smoke: {' '.join(spec.smoke)}"] if spec.smoke else []
    when = (
        "beside the next recipe's steps"
        if plan.choices.install_tests is InstallTests.BESIDE
        else "before the next step"
    )
    return f"clean env with the locked torch, {when}; " + "; ".join(what or ["install only"])
