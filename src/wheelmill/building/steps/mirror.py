"""The closure and mirror steps: after the cell's wheels are published, resolve the
runtime closure they need (``wheelmill.index.closure``) and mirror it into the cell's channel, so
the channel installs on its own. ``--no-mirror`` leaves both out."""

from __future__ import annotations

from pathlib import Path

from wheelmill.building.context import Outcome, StepContext
from wheelmill.building.products import BuildEnv, Sources
from wheelmill.checks import CheckResult
from wheelmill.index.channels import Published, PublishOutcome
from wheelmill.index.closure import Closure, ClosureInputs, mirror, resolve
from wheelmill.index.roots import Index
from wheelmill.machine import envs
from wheelmill.machine.process import HostRunner
from wheelmill.output.layout import CLOSURE_LOCK_NAME
from wheelmill.output.report import WheelRecord
from wheelmill.planning.spec import CellPlan
from wheelmill.provenance.mirroring import mirror_signer


def closure_inputs(ctx: StepContext) -> ClosureInputs:
    plan = ctx.run.plan
    published = [Path(ctx.done.get(WheelRecord, r.name).path) for r in plan.recipes if ctx.done.find(Published, r.name)]
    return ClosureInputs(
        cell=plan.cell.id,
        channel=Index.of(ctx.run.settings).channel(plan.channel),
        python=plan.cell.python,
        glibc=plan.cell.variant.glibc,
        machine=plan.cell.variant.platform,
        torch=ctx.done.get(BuildEnv).pins["torch"],
        wheels=tuple(published),
        sources=ctx.done.get(Sources).packages,
        toolkit=plan.cell.variant.toolkit_wheels,
    )


def resolve_closure(ctx: StepContext) -> Outcome:
    inputs = closure_inputs(ctx)
    if not inputs.wheels:
        return Outcome(checks=[CheckResult.skipped("closure", "this run published nothing")])
    # Resolved on this machine, whatever ran the build: the channel and its files are here.
    backend = envs.backend(ctx.run.plan.choices.env_backend, HostRunner())
    layout = ctx.run.layout
    found = resolve(inputs, backend=backend, log=ctx.log, work=layout.build / "closure", lock=layout.closure_lock)
    return Outcome(checks=[CheckResult.passed("closure", found.describe())], made=(found,))


def mirror_closure(ctx: StepContext) -> Outcome:
    closure = ctx.done.find(Closure)
    if closure is None:
        return Outcome(checks=[CheckResult.skipped("mirror", "no closure: this run published nothing")])
    index = Index.of(ctx.run.settings)
    channel = index.channel(ctx.run.plan.channel)
    done = mirror(
        closure,
        channel,
        downloads=index.downloads(ctx.run.settings.output),
        sources=ctx.done.get(Sources).packages,
        policy=ctx.run.settings.retry,
        log=ctx.log,
        on_line=ctx.run.on_line,
        signer=mirror_signer(ctx.run.settings, channel=channel.name, started=ctx.run.started),
    )
    kept = [p.filename for p in done.published if p.outcome is PublishOutcome.BUILT_HERE]
    checks = [CheckResult.passed("mirror", done.describe())]
    checks += (
        [CheckResult.passed("built-beats-mirrored", f"not mirrored, built in {channel.name}: {', '.join(kept)}")]
        if kept
        else []
    )
    return Outcome(checks=checks, made=(done,))


def describe_closure(plan: CellPlan) -> str:
    return (
        "resolve the runtime closure of the published wheels "
        "(torch as built against, every dependency, wheels only, with sha256) "
        f"for Python {plan.cell.python}; lock <cell>/{CLOSURE_LOCK_NAME}"
    )


def describe_mirror(plan: CellPlan) -> str:
    return (
        "download the closure (retried, sha256 as locked) into the store "
        f"and publish it into channel {plan.channel} as mirrored (signed where a key is set); "
        "built projects are never mirrored"
    )
