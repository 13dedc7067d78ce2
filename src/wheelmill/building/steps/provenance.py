"""The record of a recipe's build (``wheelmill.provenance.record``), from what the steps before
the stamp found: the build key, the env's lock, the toolchain, the builder image and the
source. The stamp step writes its SBOM into the wheel; the install test, which delivers the
wheel into dist/, signs its provenance beside it (where a signing key is set), so a release
publishes it from there as the publish step does.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from wheelmill.building.context import StepContext
from wheelmill.building.products import BuildEnv, BuildKeys, CheckedEnv, Ready, Stamped, Toolchain
from wheelmill.errors import ReleaseError
from wheelmill.inputs.recipes import GitSource, PathSource, SdistSource, Source, UrlSource
from wheelmill.machine.envs import locked_hashes
from wheelmill.machine.git import read_state
from wheelmill.machine.net import sha256_of
from wheelmill.planning.buildkey import source_identity
from wheelmill.planning.spec import RecipeSpec
from wheelmill.provenance.record import BuilderRecord, BuildRecord, Locked, SourceRecord
from wheelmill.provenance.signing import envelope_line, sign_envelope, signing_key_of
from wheelmill.provenance.statement import Repository, build_statement, this_run

# The locked wheels of a toolkit: CUDA's from NVIDIA, ROCm's.
TOOLKIT_WHEELS = ("nvidia-", "rocm-", "pytorch-triton-rocm")
# The build's CPython, x.y.z (the cell says x.y only).
PYTHON_VERSION = "import platform; print(platform.python_version())"


def build_record(
    ctx: StepContext, spec: RecipeSpec, *, project: str, version: str, requires: tuple[str, ...]
) -> BuildRecord:
    """What went into the build of ``spec`` whose wheel is ``project`` ``version``."""
    env, checked = ctx.done.get(BuildEnv), ctx.done.get(CheckedEnv)
    toolchain = ctx.done.get(Toolchain)
    locked = {
        name: Locked(name=name, version=version, sha256=digests)
        for name, (version, digests) in locked_hashes(env.lock.read_text(encoding="utf-8")).items()
    }
    toolkit = checked.toolkit
    return BuildRecord(
        project=project,
        version=version,
        recipe=spec.name,
        cell=ctx.run.plan.cell.id,
        build_key=ctx.done.get(BuildKeys).keys[spec.name].digest,
        python=_python_version(ctx, toolchain),
        compiler=toolchain.compiler,
        toolkit=f"{toolkit.family.value} {toolkit.version}" if toolkit else None,
        torch=_torch(locked.get("torch"), checked.torch.version),
        toolkit_packages=tuple(p for name, p in sorted(locked.items()) if name.startswith(TOOLKIT_WHEELS)),
        builder=_builder(ctx),
        source=source_record(spec),
        lock_sha256=env.lock_sha256,
        requires=requires,
    )


def _torch(locked: Locked | None, version: str) -> Locked | None:
    """The locked torch with the version it says of itself: an index that serves one variant
    lists it without its local label (``2.14.1``), which its ``__version__`` carries
    (``2.14.1+cu130``); the label is what tells a CUDA build from a CPU one."""
    if locked is None or "+" in locked.version or version.partition("+")[0] != locked.version:
        return locked
    return replace(locked, version=version)


def _python_version(ctx: StepContext, toolchain: Toolchain) -> str:
    result = ctx.where.runner.capture([str(toolchain.python), "-c", PYTHON_VERSION], timeout=60)
    return result.stdout.strip() or ctx.run.plan.cell.python


def _builder(ctx: StepContext) -> BuilderRecord:
    ready = ctx.done.find(Ready)
    if ready is None:
        return BuilderRecord(tag="host", image_id=None, base=None)
    return BuilderRecord(tag=ready.tag, image_id=ready.image_id, base=ready.base_identity)


def source_record(spec: RecipeSpec) -> SourceRecord:
    identity = source_identity(spec)
    patches = tuple(identity["patches"])
    return _source(spec.source, identity.get("tree"), patches)


def _source(source: Source, tree: str | None, patches: tuple[str, ...]) -> SourceRecord:
    match source:
        case PathSource():
            return SourceRecord(kind="path", url=None, sha256=tree, commit=None, patches=patches)
        case SdistSource(project=project, version=version, sha256=sha256):
            url = f"pkg:pypi/{project}@{version}"
            return SourceRecord(kind="sdist", url=url, sha256=sha256, commit=None, patches=patches)
        case UrlSource(url=url, sha256=sha256):
            return SourceRecord(kind="url", url=url, sha256=sha256, commit=None, patches=patches)
        case GitSource(url=url, rev=rev):
            return SourceRecord(kind="git", url=url, sha256=None, commit=rev, patches=patches)


def attest(ctx: StepContext, spec: RecipeSpec, wheel: Path) -> bytes | None:
    """The signed provenance of ``wheel``, the tested wheel of ``spec``: the build's statement
    where this cell built it, the one build's own where this cell was given its group build, the served
    index's where it was reused from there; None without a signing key."""
    settings = ctx.run.settings
    signing = signing_key_of(settings)
    keys = ctx.done.get(BuildKeys)
    stamped = ctx.done.find(Stamped, spec.name)
    if stamped is None:  # not built here: the group's one build, or a wheel reused from the served index
        given = keys.from_group.get(spec.name) or keys.published.get(spec.name)
        return given.provenance if given is not None else None
    if signing is None:
        return None
    statement = build_statement(
        filename=wheel.name,
        sha256=sha256_of(wheel),
        record=stamped.record,
        key_inputs=keys.keys[spec.name].inputs,
        repository=repository_of(settings.root),
        run=this_run(ci_run=settings.ci_run, started=ctx.run.started),
        channels=spec.group_build.channels if spec.group_build else (ctx.run.plan.channel,),
    )
    return envelope_line(sign_envelope(json.dumps(statement, sort_keys=True).encode(), signing)).encode()


def repository_of(root: Path) -> Repository:
    """The repository's HEAD and whether its tree is dirty; a tree that is no git clone
    cannot say what it holds, so it counts as dirty."""
    try:
        state = read_state(root)
    except ReleaseError:
        return Repository(commit=None, dirty=True)
    return Repository(commit=state.commit, dirty=state.dirty)
