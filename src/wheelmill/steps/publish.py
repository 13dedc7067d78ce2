"""The publish step: a wheel that passed everything goes into the variant's channel of the
local index (``<output>/index`` unless WHEELMILL_INDEX_ROOT says otherwise), listed with
its build key, so the same inputs are not built again."""

from __future__ import annotations

from pathlib import Path

from wheelmill.checks import CheckResult
from wheelmill.context import Outcome, StepContext
from wheelmill.index.store import Channel, publish
from wheelmill.report import WheelRecord
from wheelmill.spec import CellPlan, RecipeSpec
from wheelmill.steps.keys import BuildKeys


def publish_step(ctx: StepContext, spec: RecipeSpec) -> Outcome:
    channel = Channel(ctx.run.settings.index, ctx.run.plan.channel)
    key = ctx.done.get(BuildKeys).keys[spec.name].digest
    done = publish(channel, Path(ctx.done.get(WheelRecord, spec.name).path), build_key=key)
    ctx.log.note(f"{done.outcome}: {channel.path}/files/{done.filename}")
    replaced = f"; built beats mirrored: replaced {', '.join(done.replaced)}" if done.replaced else ""
    detail = f"{done.outcome} in channel {channel.name}: {done.filename}, build key {key[:12]}...{replaced}"
    return Outcome(checks=[CheckResult.passed("index", detail)], made=(done,))


def describe(plan: CellPlan, _spec: RecipeSpec) -> str:
    return f"add to channel {plan.channel} of the local index with its build key (immutable: the same bytes again are a no-op)"
