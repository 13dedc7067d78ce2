"""The channel checks: once the cell's wheels are published, its channel is read back as a
consumer would find it: every page parses and agrees with the others, every listed file
and sidecar is there at its listed size, and each wheel this run published is listed with
the sha256 of the bytes that were tested, and every wheel of the runtime closure with the
sha256 it was locked with."""

from __future__ import annotations

import tempfile
from pathlib import Path

from wheelmill.building.context import Outcome, StepContext
from wheelmill.checks import CheckResult, require
from wheelmill.errors import ChannelError
from wheelmill.index.channels import Published
from wheelmill.index.closure import Closure
from wheelmill.index.objects import ObjectChannel
from wheelmill.index.roots import Index, file_of, problems
from wheelmill.machine.net import sha256_of
from wheelmill.output.report import WheelRecord
from wheelmill.planning.spec import CellPlan


def channel_checks(ctx: StepContext) -> Outcome:
    channel = Index.of(ctx.run.settings).channel(ctx.run.plan.channel)
    published = {
        r.name: ctx.done.get(WheelRecord, r.name) for r in ctx.run.plan.recipes if ctx.done.find(Published, r.name)
    }
    if not published:
        return Outcome(checks=[CheckResult.skipped("channel", "this run published nothing")])
    found = problems(channel, hashes=False)  # sizes and sidecars for all; the hashes of ours below
    valid = (
        CheckResult.failed("channel", "; ".join(found[:5]), "`wheelmill index verify` lists every problem")
        if found
        else None
    )
    results = [
        valid
        or CheckResult.passed(
            "channel", f"{channel.name}: {len(channel.project_names())} projects, pages and files agree"
        )
    ]
    results += [_listed(channel, recipe, wheel) for recipe, wheel in published.items()]
    closure = ctx.done.find(Closure)
    results += [_closure(channel, closure)] if closure is not None else []

    def failure(what: str, fix: str) -> ChannelError:
        return ChannelError(f"{ctx.run.plan.cell.id}: channel {channel.name}: {what}", fix=fix)

    return Outcome(checks=require(results, ctx.log, failure=failure))


def _listed(channel: ObjectChannel, recipe: str, wheel: WheelRecord) -> CheckResult:
    """The tested wheel is what the channel lists and serves, byte for byte."""
    project = channel.project(wheel.name.split("-", 1)[0])
    entry = next((f for f in project.files if f.filename == wheel.name), None) if project else None
    if entry is None:
        return CheckResult.failed(
            recipe,
            f"{wheel.name} is not listed",
            f"publish it again: wheelmill publish --channel {channel.name} {wheel.path}",
        )
    with (
        tempfile.TemporaryDirectory(prefix="wheelmill-channel-") as scratch,
        file_of(channel, entry, Path(scratch)) as stored,
    ):
        served = sha256_of(stored) if stored is not None else "(not stored)"
    if not entry.sha256 == served == wheel.sha256:
        detail = (
            f"{wheel.name}: listed sha256 {entry.sha256[:16]}..., served {served[:16]}..., "
            f"tested {wheel.sha256[:16]}..."
        )
        return CheckResult.failed(
            recipe, detail, "published files are immutable: bump the version, or restore the channel from its storage"
        )
    return CheckResult.passed(recipe, f"{wheel.name} listed and served with the tested sha256")


def _closure(channel: ObjectChannel, closure: Closure) -> CheckResult:
    """Every wheel of the closure is in the channel with its locked sha256, or built there."""
    missing = []
    for wheel in closure.to_mirror:
        project = channel.project(wheel.project)
        files = project.files if project else ()
        if not any(f.built for f in files) and not any(
            f.filename == wheel.filename and f.sha256 == wheel.sha256 for f in files
        ):
            missing.append(wheel.filename)
    if missing:
        return CheckResult.failed(
            "closure",
            f"not in the channel as locked: {', '.join(missing[:5])}",
            "run `wheelmill mirror --cell <cell>` again",
        )
    return CheckResult.passed(
        "closure", f"all {len(closure.wheels)} wheels of the closure are in the channel, built or mirrored as locked"
    )


def describe(plan: CellPlan) -> str:
    return (
        f"channel {plan.channel} reads back as a valid index (pages, files, sidecars agree) "
        "and lists each wheel published here with its tested sha256"
    )
