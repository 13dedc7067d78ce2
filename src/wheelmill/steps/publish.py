"""The publish step: a wheel that passed everything goes into the variant's channel of the
local index (``<output>/index`` unless WHEELMILL_INDEX_ROOT says otherwise)."""

from __future__ import annotations

from wheelmill.checks import CheckResult
from wheelmill.context import CellRun
from wheelmill.index.store import Channel, publish
from wheelmill.recipes import ResolvedRecipe
from wheelmill.runner import StepLog


def publish_step(run: CellRun, recipe: ResolvedRecipe, log: StepLog) -> list[CheckResult]:
    channel = Channel(run.settings.index, run.plan.channel)
    done = publish(channel, run.final[recipe.name])
    log.note(f"{done.outcome}: {channel.path}/files/{done.filename}")
    return [CheckResult.passed("index", f"{done.outcome} in channel {channel.name}: {done.filename}")]
