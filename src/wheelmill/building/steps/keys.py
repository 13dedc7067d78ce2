"""The build-keys step: each recipe's build key (``wheelmill.planning.buildkey``), looked up in the
cell's channel. A recipe whose key is listed there was built from these very inputs and
published: its steps do not run, and its wheel is the channel's file, which is what the
recipes that depend on it install and pin (linked into ``dist/`` too, where a built wheel
is delivered and where the report's readers look). Where every recipe is published, the steps
that only serve builds (the container, the env and their checks, the closure and the
channel checks) do not run either. ``--rebuild`` builds everything all the same.
"""

from __future__ import annotations

from typing import Any

from packaging.requirements import Requirement

from wheelmill.building.context import Outcome, StepContext
from wheelmill.building.products import BuildKeys, PublishedBuild, ServedBuild, Toolchain
from wheelmill.building.steps.install import deliver
from wheelmill.checks import CheckResult
from wheelmill.conda.channel import conda_channel_root
from wheelmill.conda.package import CondaTarget, conda_meta
from wheelmill.errors import WheelmillError
from wheelmill.files import Linked, write_all
from wheelmill.index.pages import FileEntry
from wheelmill.index.store import Channel, built_by_key
from wheelmill.machine.toolchain import Found, find_compiler
from wheelmill.planning.buildkey import BuildKey, build_keys, host_identity, image_identity
from wheelmill.planning.spec import CellPlan, RecipeSpec
from wheelmill.wheel.wheelfile import read_wheel


def build_keys_step(ctx: StepContext) -> Outcome:
    plan = ctx.run.plan
    keys = build_keys(plan, builder(ctx))
    for key in keys.values():
        ctx.log.note(f"{key.recipe}: build key {key.digest} of {key.inputs}")
    channel = Channel(ctx.run.settings.index, plan.channel)
    listed = {} if plan.rebuilds_all else built_by_key(channel)
    published = {
        spec.name: _found_published(ctx, channel, keys[spec.name], *hit)
        for spec in plan.recipes
        if spec.name not in plan.rebuild and (hit := listed.get(keys[spec.name].digest)) is not None
        if spec.serving is None or _published_for_this_cell(ctx, channel, hit[1])
    }
    listings = {channel.name: listed}  # each channel of a serving group read once, whatever recipes look
    served = {
        spec.name: found
        for spec in plan.recipes
        if spec.serving and spec.name not in published and spec.name not in plan.rebuild
        if (found := _find_served(ctx, spec, keys[spec.name], listings)) is not None
    }
    unpublished = {
        spec.name: unpublished_reason(spec, plan)
        for spec in plan.recipes
        if spec.serving and not spec.serving.builds_in(plan.cell.id)
        if spec.name not in published and spec.name not in served
    }
    hits: dict[str, PublishedBuild | ServedBuild] = {**published, **served}
    checks = [
        _verdict(key, hits.get(name), rebuild=name in plan.rebuild, to_test=unpublished.get(name))
        for name, key in keys.items()
    ]
    made = BuildKeys(channel=channel.name, keys=keys, published=published, served=served, unpublished=unpublished)
    return Outcome(checks=checks, made=(made,))


def unpublished_reason(spec: RecipeSpec, plan: CellPlan) -> str:
    """Why a served recipe that a cell of a newer torch builds (no channel of its group has the
    one build, or --rebuild) is never published: the one build is made against the group's
    oldest torch, whose stable shims every torch it serves has; this cell's torch may add some."""
    assert spec.serving is not None, "only a served recipe has one build elsewhere"
    why = "--rebuild" if spec.name in plan.rebuild else "no channel of its serving group has its one build"
    return (
        f"built here against torch {plan.cell.variant.torch} to be checked and tested, not published ({why}): "
        f"its one build is made against torch {spec.serving.torch}, the oldest it serves, by a cell of that torch "
        f"({spec.serving.builders[0]} or another Python's), and served to this cell once published"
    )


def _published_for_this_cell(ctx: StepContext, channel: Channel, entry: FileEntry) -> bool:
    """Whether this cell published a recipe built once, which its channel lists for every
    Python of it once one cell put it there: its publish step makes the wheel's conda package
    for the cell's Python too, so that package is there. Else another Python's cell did, and
    this one is served the file: its checks, its corner's install test, its conda package."""
    plan = ctx.run.plan
    try:
        meta = conda_meta(
            read_wheel(channel.files / entry.filename), CondaTarget.of(plan.cell.variant, plan.cell.python)
        )
    except WheelmillError:  # no conda package can be made of it: served, its publish step says why
        return False
    return (conda_channel_root(ctx.run.settings.index, channel.name) / meta.subdir / meta.filename).is_file()


def _find_served(
    ctx: StepContext, spec: RecipeSpec, key: BuildKey, listings: dict[str, dict[str, tuple[str, FileEntry]]]
) -> ServedBuild | None:
    """The recipe's one build, where a channel of its serving group has it: this cell's own
    (another Python's cell put it there), else another one. ``listings``: each channel's
    build keys, read where first needed."""
    assert spec.serving is not None, "only a served recipe is looked up in other channels"
    index, cell = ctx.run.settings.index, ctx.run.plan.cell.id
    for name in spec.serving.channels:
        if name not in listings:
            listings[name] = built_by_key(Channel(index, name))
        hit = listings[name].get(key.digest)
        if hit is not None:
            project, entry = hit
            # Into the cell's tree, where its checks and install test reach it (in a container
            # too, which sees the cell and not the index): linked, the published bytes.
            wheel = ctx.run.layout.build / spec.name / "served" / entry.filename
            write_all({wheel: Linked(Channel(index, name).files / entry.filename)})
            # Tested where a corner, and where this cell's own channel (its torch's) does not list
            # it yet: no cell of this torch has tested it, so none is published untested with it.
            tested = spec.serving.tests_in(cell) or name != ctx.run.plan.channel
            # Untested here, it is delivered now, as a published one is; tested, its test delivers it.
            delivered = None if tested else deliver(ctx.run.layout.dist, wheel, link=True)
            return ServedBuild(
                recipe=spec.name,
                key=key.digest,
                channel=name,
                project=project,
                entry=entry,
                wheel=wheel,
                tested=tested,
                delivered=delivered,
            )
    return None


def _found_published(
    ctx: StepContext, channel: Channel, key: BuildKey, project: str, entry: FileEntry
) -> PublishedBuild:
    wheel = channel.files / entry.filename
    pins = [
        str(r.specifier).removeprefix("==")
        for r in map(Requirement, read_wheel(wheel).requires_dist)
        if r.name == "torch"
    ]
    path = deliver(ctx.run.layout.dist, wheel, link=True)
    return PublishedBuild(
        recipe=key.recipe,
        key=key.digest,
        channel=channel.name,
        project=project,
        entry=entry,
        path=path,
        torch=pins[0] if pins else None,
    )


def _verdict(
    key: BuildKey, published: PublishedBuild | ServedBuild | None, *, rebuild: bool, to_test: str | None
) -> CheckResult:
    if published is not None:
        return CheckResult.passed(key.recipe, published.describe())
    if to_test is not None:
        return CheckResult.passed(key.recipe, f"to build: {to_test}")
    why = "--rebuild" if rebuild else "not published"
    return CheckResult.passed(key.recipe, f"to build ({why}): build key {key.short}...")


def builder(ctx: StepContext) -> dict[str, Any]:
    """What builds the wheels: the cell's builder image, by its definition; else this
    machine's toolchain (the pre-checks found its Python and toolkit; the compiler is asked)."""
    plan = ctx.run.plan
    if plan.image is not None:
        return {"image": image_identity(plan.image)}
    toolchain = ctx.done.find(Toolchain)
    compiler = find_compiler(ctx.where.runner)
    toolkit = toolchain.toolkit if toolchain else None
    return {
        "host": host_identity(
            compiler=(str(compiler.path), compiler.version) if isinstance(compiler, Found) else None,
            python=(str(toolchain.python), plan.cell.python) if toolchain else None,
            toolkit=(str(toolkit.root), toolkit.version) if toolkit else None,
        )
    }


def describe(plan: CellPlan) -> str:
    inputs = "each recipe's build key (source, recipe, lock, builder, variant, wheelmill, dependencies)"
    if plan.rebuilds_all:
        return f"{inputs}; --rebuild: built even where channel {plan.channel} lists it"
    if plan.rebuild:
        return (
            f"{inputs}; --rebuild {', '.join(sorted(plan.rebuild))}: "
            f"built even where channel {plan.channel} lists it, the rest looked up there"
        )
    served = [r.name for r in plan.recipes if r.serving]
    others = (
        f"; {', '.join(served)} (built once for every torch and Python, against the oldest torch: that torch "
        "in its key, no Python) in the other channels of its serving group too, and served from there"
        if served
        else ""
    )
    return f"{inputs}, looked up in channel {plan.channel}: a recipe listed there is not built again{others}"
