"""The build-keys step: each recipe's build key (``wheelmill.planning.buildkey``), looked up in the
cell's channel: the local index's, and the served index's where WHEELMILL_SERVED_INDEX names
one (the index the fleet's jobs publish to, read over HTTP). A recipe whose key is listed there
was built from these very inputs and published: its steps do not run, and its wheel is the
channel's file (fetched by URL from the served index, its sha256 checked), which is what the
recipes that depend on it install and pin (in ``dist/`` too, where a built wheel is delivered
and where the report's readers look). Where every recipe is published, the steps that are only
there for builds (the container, the env and their checks, the closure and the channel checks) do
not run either. ``--rebuild`` builds everything all the same. It runs with ``--no-publish``
too: a job that publishes elsewhere afterwards builds nothing that was published before.

A file of the served index is taken only once it verifies against its signed provenance and
the team's keys, wherever keys are set (and never without them under
``WHEELMILL_SIGNATURES=required``): the page's sha256 is the word of the server that sent the
file. One that does not verify is a warning, and its recipe is built here instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

from wheelmill.building.context import Outcome, StepContext
from wheelmill.building.products import BuildKeys, GroupWheel, PublishedBuild, Toolchain
from wheelmill.building.steps.install import deliver
from wheelmill.checks import CheckResult
from wheelmill.conda.package import CondaTarget, conda_meta
from wheelmill.errors import FetchError, InvalidWheel, WheelmillError
from wheelmill.files import Linked, write_all
from wheelmill.index.channels import Listing, by_key, listed_files
from wheelmill.index.http_channel import HttpChannel
from wheelmill.index.objects import ObjectChannel
from wheelmill.index.pages import FileEntry
from wheelmill.index.roots import Index, provenance_of
from wheelmill.machine.net import download, fetch_bytes
from wheelmill.machine.toolchain import Found, find_compiler
from wheelmill.planning.buildkey import BuildKey, build_keys, host_identity, image_identity
from wheelmill.planning.spec import CellPlan, RecipeSpec
from wheelmill.provenance.signing import TrustedKey, trusted_keys_of
from wheelmill.provenance.verification import Claims, verify_file
from wheelmill.retry import TransientError, with_retries
from wheelmill.settings import Settings, Signatures
from wheelmill.wheel.buildtags import Taken
from wheelmill.wheel.wheelfile import check_record, read_wheel

CHECK = "served-index"  # the verdict on reading it


@dataclass(frozen=True, kw_only=True)
class Listed:
    """A build key's wheel in a channel: the local index's, or the served index's URL."""

    channel: str
    project: str
    entry: FileEntry
    held: ObjectChannel | None = None  # the local index's channel that lists it
    file: Path | None = None  # its file on this machine, where the local index keeps one (a tree)
    url: str | None = None  # else the served channel's, fetched and checked against entry.sha256
    served_from: str | None = None  # the served channel's address, for the report
    provenance_url: str | None = None  # the served channel's provenance of it, where its page names one

    def into(self, ctx: StepContext, target: Path) -> Path:
        """The wheel at ``target``: linked from the local channel (the published bytes), or
        downloaded from the served one, its sha256 the page's."""
        if self.file is not None:
            write_all({target: Linked(self.file)})
            return target
        if self.held is not None:
            target.parent.mkdir(parents=True, exist_ok=True)
            if not self.held.fetch(self.entry, target):
                raise FetchError(
                    f"{self.channel}: {self.entry.filename} is listed but not stored",
                    fix="`wheelmill index verify` says what is missing; publish it again",
                )
            return target
        assert self.url is not None, "a listing is a local file or a served URL"
        url = self.url
        target.parent.mkdir(parents=True, exist_ok=True)
        with_retries(
            lambda _n: download(url, target, sha256=self.entry.sha256),
            policy=ctx.run.settings.retry,
            on_retry=lambda n, exc, delay: ctx.log.note(f"retry {n} in {delay:.1f}s: {exc}"),
        )
        ctx.log.note(f"fetched {self.entry.filename} from {url} (sha256 {self.entry.sha256[:12]}... checked)")
        return target

    @cached_property
    def provenance(self) -> bytes | None:
        """Its signed provenance, delivered with it (a release publishes it from dist/); None
        where it has none, or the served one cannot be read (the publish step says so). Read
        once: the bytes verified are the bytes delivered, whatever the server answers later."""
        if self.held is not None:
            return provenance_of(self.held, self.entry)
        if self.provenance_url is None:
            return None
        try:
            return fetch_bytes(self.provenance_url)
        except (FetchError, TransientError):
            return None


class Listings:
    """Each channel's build keys, read where first needed: the served index's (where one is
    set), the local index's over them (its file needs no download). A served index that cannot
    be read is a warning: the recipes are built here, as without one."""

    def __init__(self, ctx: StepContext) -> None:
        self.ctx = ctx
        self.read: dict[str, dict[str, Listed]] = {}
        self.problems: list[str] = []
        # Every file name each channel read lists, its keys and sha256: what a new build's name must not take.
        self.names: dict[str, dict[str, Taken]] = {}

    @cached_property
    def trusted(self) -> tuple[TrustedKey, ...]:
        """The trusted keys, read once for every file of the served index the step looks at."""
        return trusted_keys_of(self.ctx.run.settings)

    def admits(self, hit: Listed, wheel: Path) -> bool:
        """Whether the served index's ``wheel`` is taken: the local index's always (this
        machine published it). Where it is not, why is a problem, and the file is removed."""
        if hit.url is None:
            return True
        why = refusal(self.ctx.run.settings, self.trusted, hit, wheel)
        if why is None:
            return True
        wheel.unlink(missing_ok=True)
        self.problems.append(f"{hit.entry.filename} of {hit.served_from} not taken: {why}")
        return False

    def of(self, name: str) -> dict[str, Listed]:
        if name not in self.read:
            self.read[name] = {**self._served(name), **self._local(name)}
        return self.read[name]

    def taken(self, name: str) -> dict[str, Taken]:
        """The file names channel ``name`` lists, here or in the served index (the local
        index's sha256 where both list one), with their keys."""
        self.of(name)
        return self.names.get(name, {})

    def _files(self, name: str, channel: Listing) -> dict[str, tuple[str, FileEntry]]:
        files = listed_files(channel)
        names = self.names.setdefault(name, {})
        for _project, entry in files:
            before = names.get(entry.filename, Taken(frozenset(), entry.sha256))
            names[entry.filename] = Taken(before.keys | frozenset(entry.build_keys), entry.sha256)
        return by_key(files)

    def _local(self, name: str) -> dict[str, Listed]:
        channel = Index.of(self.ctx.run.settings).channel(name)
        return {
            key: Listed(channel=name, project=project, entry=entry, held=channel, file=channel.local_file(entry))
            for key, (project, entry) in self._files(name, channel).items()
        }

    def _served(self, name: str) -> dict[str, Listed]:
        settings = self.ctx.run.settings
        if settings.served_index is None:
            return {}
        served = HttpChannel(base=settings.served_index, name=name, retry=settings.retry)
        try:
            found = self._files(name, served)
            listed = {
                key: Listed(
                    channel=name,
                    project=project,
                    entry=entry,
                    url=served.file_url(project, entry),
                    served_from=served.where(),
                    provenance_url=served.provenance_url(project, entry),
                )
                for key, (project, entry) in found.items()
            }
        except (FetchError, TransientError) as exc:
            self.problems.append(f"channel {name} of the served index could not be read: {exc}")
            return {}
        self.ctx.log.note(f"{served.where()}: {len(found)} build keys")
        return listed


def build_keys_step(ctx: StepContext) -> Outcome:
    plan = ctx.run.plan
    keys = build_keys(plan, builder(ctx))
    for key in keys.values():
        ctx.log.note(f"{key.recipe}: build key {key.digest} of {key.inputs}")
    listings = Listings(ctx)
    listed = {} if plan.rebuilds_all else listings.of(plan.channel)
    taken = listings.taken(plan.channel)  # read with the keys: --rebuild too names its builds apart
    published = {
        spec.name: reused
        for spec in plan.recipes
        if spec.name not in plan.rebuild and (hit := listed.get(keys[spec.name].digest)) is not None
        if spec.group_build is None or _published_for_this_cell(ctx, hit)
        if (reused := _found_published(ctx, keys[spec.name], hit, listings)) is not None
    }
    from_group = {
        spec.name: found
        for spec in plan.recipes
        if spec.group_build and spec.name not in published and spec.name not in plan.rebuild
        if (found := _find_group_build(ctx, spec, keys[spec.name], listings)) is not None
    }
    unpublished = {
        spec.name: unpublished_reason(spec, plan)
        for spec in plan.recipes
        if spec.group_build and not spec.group_build.builds_in(plan.cell.id)
        if spec.name not in published and spec.name not in from_group
    }
    hits: dict[str, PublishedBuild | GroupWheel] = {**published, **from_group}
    checks = [
        _verdict(key, hits.get(name), rebuild=name in plan.rebuild, to_test=unpublished.get(name))
        for name, key in keys.items()
    ]
    checks += [
        CheckResult.warned(CHECK, f"{problem}; built here instead", "check what publishes to WHEELMILL_SERVED_INDEX")
        if " not taken: " in problem
        else CheckResult.warned(CHECK, f"{problem}; its recipes are built here", "check WHEELMILL_SERVED_INDEX")
        for problem in listings.problems
    ]
    made = BuildKeys(
        channel=plan.channel,
        keys=keys,
        published=published,
        from_group=from_group,
        unpublished=unpublished,
        taken=taken,
    )
    return Outcome(checks=checks, made=(made,))


def unpublished_reason(spec: RecipeSpec, plan: CellPlan) -> str:
    """Why a recipe built once for its group, which a cell of a newer torch builds (no channel
    of its group has the one build, or --rebuild), is never published: the one build is made
    against the group's oldest torch, whose stable shims every torch of the group has; this
    cell's torch may add some."""
    assert spec.group_build is not None, "only a recipe built once for its group has one build elsewhere"
    why = "--rebuild" if spec.name in plan.rebuild else "no channel of its ABI group has its group build"
    return (
        f"built here against torch {plan.cell.variant.torch} to be checked and tested, not published ({why}): "
        f"its one build is made against torch {spec.group_build.torch}, the oldest of its group, by a cell of that "
        f"torch ({spec.group_build.builders[0]} or another Python's), and taken by this cell once published"
    )


def _published_for_this_cell(ctx: StepContext, hit: Listed) -> bool:
    """Whether this cell published a recipe built once, which its channel lists for every
    Python of it once one cell put it there: its publish step makes the wheel's conda package
    for the cell's Python too, so that package is there. Else another Python's cell did, and
    this one is given the group's one build: its checks, its corner's install test, its conda
    package. Found in the served index only (over HTTP), it is the group's one build here too:
    checked and tested as such."""
    plan = ctx.run.plan
    if hit.file is None:
        return False
    try:
        meta = conda_meta(read_wheel(hit.file), CondaTarget.of(plan.cell.variant, plan.cell.python))
    except WheelmillError:  # no conda package can be made of it: given as the one build, its publish step says why
        return False
    return Index.of(ctx.run.settings).holds_conda(hit.channel, meta.subdir, meta.filename)


def _find_group_build(ctx: StepContext, spec: RecipeSpec, key: BuildKey, listings: Listings) -> GroupWheel | None:
    """The recipe's one build, where a channel of its ABI group has it: this cell's own
    (another Python's cell put it there), else another one."""
    assert spec.group_build is not None, "only a recipe built once for its group is looked up in other channels"
    cell = ctx.run.plan.cell.id
    for name in spec.group_build.channels:
        hit = listings.of(name).get(key.digest)
        if hit is not None:
            # Into the cell's tree, where its checks and install test reach it (in a container
            # too, which sees the cell and not the index): the published bytes.
            wheel = hit.into(ctx, ctx.run.layout.build / spec.name / "group" / hit.entry.filename)
            if not listings.admits(hit, wheel):
                continue
            # Tested where a corner, and where this cell's own channel (its torch's) does not list
            # it yet: no cell of this torch has tested it, so none is published untested with it.
            tested = spec.group_build.tests_in(cell) or name != ctx.run.plan.channel or hit.file is None
            # Untested here, it is delivered now, as a published one is; tested, its test delivers it.
            delivered = None if tested else deliver(ctx.run.layout.dist, wheel, link=True, provenance=hit.provenance)
            return GroupWheel(
                recipe=spec.name,
                key=key.digest,
                channel=name,
                project=hit.project,
                entry=hit.entry,
                wheel=wheel,
                tested=tested,
                delivered=delivered,
                served_from=hit.served_from,
                provenance=hit.provenance,
            )
    return None


def _found_published(ctx: StepContext, key: BuildKey, hit: Listed, listings: Listings) -> PublishedBuild | None:
    wheel = hit.file or hit.into(ctx, ctx.run.layout.build / key.recipe / "reused" / hit.entry.filename)
    if not listings.admits(hit, wheel):
        return None
    pins = [
        str(r.specifier).removeprefix("==")
        for r in map(Requirement, read_wheel(wheel).requires_dist)
        if r.name == "torch"
    ]
    # The local index's file, tested by the run that published it, is delivered now; the served
    # index's is delivered by its install test here.
    path = wheel if hit.served_from else deliver(ctx.run.layout.dist, wheel, link=True, provenance=hit.provenance)
    return PublishedBuild(
        recipe=key.recipe,
        key=key.digest,
        channel=hit.channel,
        project=hit.project,
        entry=hit.entry,
        path=path,
        torch=pins[0] if pins else None,
        reused_from=hit.served_from,
        provenance=hit.provenance,
    )


def refusal(settings: Settings, trusted: tuple[TrustedKey, ...], hit: Listed, wheel: Path) -> str | None:
    """Why a file of the served index is not taken (None: it is): a wheel whose RECORD is
    true of it, verified against its provenance and the ``trusted`` keys wherever there are
    keys (its provenance placing it in the channel that lists it, as ``verify`` holds it);
    under ``required`` there must be."""
    try:
        check_record(wheel)
    except InvalidWheel as error:
        return error.one_line()
    if not trusted:
        if settings.signatures is Signatures.REQUIRED:
            return "WHEELMILL_SIGNATURES=required, and no trusted key to verify it with (WHEELMILL_TRUSTED_KEYS)"
        return None
    claims = Claims(
        filename=hit.entry.filename,
        sha256=hit.entry.sha256,
        build_keys=hit.entry.build_keys,
        provenance=hit.provenance,
        source=hit.provenance_url or "",
        channel=hit.channel,
    )
    verdict = verify_file(wheel, claims, trusted=trusted)
    return None if verdict.ok else verdict.failures[0].line


def _verdict(
    key: BuildKey, published: PublishedBuild | GroupWheel | None, *, rebuild: bool, to_test: str | None
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
    grouped = [r.name for r in plan.recipes if r.group_build]
    others = (
        f"; {', '.join(grouped)} (built once for every torch and Python, against the oldest torch: that torch "
        "in its key, no Python) in the other channels of its ABI group too, and taken from there"
        if grouped
        else ""
    )
    where = f"channel {plan.channel} of the local index" + (
        f" and of the served index {plan.choices.served_index}" if plan.choices.served_index else ""
    )
    return f"{inputs}, looked up in {where}: a recipe listed there is not built again{others}"
