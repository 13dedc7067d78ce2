"""The publish step: a wheel that passed everything goes into the variant's channel of the
index (``<output>/index`` unless WHEELMILL_INDEX_ROOT says otherwise: a directory, or an
``s3://`` bucket), listed with its build key, so the same inputs are not built again; and,
as a conda package, into the variant's conda channel beside it (``conda/<channel>``). Its
signed provenance (``wheelmill.provenance``), which the install test delivered beside it,
goes with it."""

from __future__ import annotations

import os
from pathlib import Path

from wheelmill.building.context import Outcome, StepContext
from wheelmill.building.products import BuildKeys
from wheelmill.checks import CheckResult
from wheelmill.errors import CommandFailed, IndexConflict
from wheelmill.index.roots import Index, publish
from wheelmill.machine.process import HostRunner, base_environment, wheelmill_command
from wheelmill.output.report import WheelRecord
from wheelmill.planning.spec import CellPlan, RecipeSpec
from wheelmill.provenance.statement import beside, read_beside


def publish_step(ctx: StepContext, spec: RecipeSpec) -> Outcome:
    channel = Index.of(ctx.run.settings).channel(ctx.run.plan.channel)
    key = ctx.done.get(BuildKeys).keys[spec.name].digest
    wheel = Path(ctx.done.get(WheelRecord, spec.name).path)
    provenance = read_beside(wheel)
    done = publish(channel, wheel, build_key=key, provenance=provenance)
    ctx.log.note(f"{done.outcome}: {channel.storage.location}: {channel.name}/{done.filename}")
    replaced = f"; built beats mirrored: replaced {', '.join(done.replaced)}" if done.replaced else ""
    detail = f"{done.outcome} in channel {channel.name}: {done.filename}, build key {key[:12]}...{replaced}"
    conda = conda_package(ctx, wheel)  # the published bytes
    checks = [CheckResult.passed("index", detail), provenance_check(wheel, provenance)]
    return Outcome(checks=[*checks, CheckResult.passed("conda", conda)], made=(done,))


def provenance_check(wheel: Path, provenance: bytes | None) -> CheckResult:
    """What the step says of the signed provenance the install test delivered beside the
    wheel: where none was signed, a skip (a pass would promise what `wheelmill verify`,
    run next, refuses)."""
    if provenance is not None:
        return CheckResult.passed("provenance", f"{beside(wheel).name} beside it")
    unsigned = "not signed: no signing key; wheelmill verify refuses a wheel without provenance"
    sign = "to sign here: wheelmill key new --out signing.pem, then WHEELMILL_SIGNING_KEY_FILE=signing.pem"
    return CheckResult.skipped("provenance", f"{unsigned} ({sign})")


def conda_package(ctx: StepContext, wheel: Path) -> str:
    """The published wheel as a conda package, made by ``wheelmill conda package`` in a
    process of its own: py-rattler's threads may outlive a call, and the build's process
    must not carry them. Immutable like the wheel: the same wheel again is a no-op."""
    settings, plan = ctx.run.settings, ctx.run.plan
    target = Index.of(settings).conda_channel(plan.channel)
    argv = wheelmill_command("conda", "package", "--cell", plan.cell.id, wheel, recipes=settings.recipes)
    aws = {key: value for key, value in os.environ.items() if key.startswith("AWS_")}  # a bucket's, where it is one
    try:
        result = HostRunner().run(
            [*argv, "--channel", target], env=base_environment([], aws), log=ctx.log, keep_output=True
        )
    except CommandFailed as failed:
        if failed.returncode != IndexConflict.exit_code:
            raise
        what, fix = failed.child_error()
        raise IndexConflict(what, fix=fix or "raise the recipe's version") from None
    return f"{result.output.strip().splitlines()[-1]} in {target}"


def describe(plan: CellPlan, _spec: RecipeSpec) -> str:
    immutable = "immutable: the same bytes again are a no-op"
    return (
        f"add to channel {plan.channel} of the local index with its build key ({immutable}), "
        "and as a conda package to its conda channel"
    )
