"""``wheelmill release``: what a tag or a nightly builds and where it goes, promotion between
tracks, and the nightly track's retention.

    wheelmill release --tag v2.4.0-rc1 --dry-run        cells, channels and versions
    wheelmill release --tag v2.4.0-rc1 --json           the same for CI (matrix, action)
    wheelmill release --tag v2.4.0-rc1 [--cell GLOB]    build, then publish to test/<channel>
    wheelmill release publish --tag v2.4.0-rc1          publish what was built (CI's publish job)
    wheelmill release record-gpu --track test 2.4.0rc1 wheels/*/gpu-report.json   the GPU stage's reports
    wheelmill release promote --from test --to release 2.4.0   the rc of HEAD's commit, once its record
                                                               has a passed GPU stage per cell and runner
    wheelmill release record-failure --tag v2.4.0-rc1 --cell cuda130-py311   a failed cell, for coverage
    wheelmill release list [--track test] [--json]             the releases recorded, newest first
    wheelmill release show --track release 2.4.0 [--json]     a release's record, read whole
    wheelmill release prune --track nightly --keep 14

Each works on the index WHEELMILL_INDEX_ROOT names: a tree, or an object store
(``s3://bucket/prefix``) that every build job of a fleet publishes its own cell into.
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Callable
from pathlib import Path
from time import monotonic, sleep
from typing import TYPE_CHECKING, Any, TypedDict

from rich.console import Console
from rich.table import Table

from wheelmill.cli.basics import Commands, load_inputs, positive
from wheelmill.cli.common import add_cell_options, build_cells, mirror_cells, prepare
from wheelmill.errors import ReleaseError, ReleasePending, SignatureError, UsageError
from wheelmill.inputs.versions import Action, Release, Track, VersionRule, for_nightly, for_tag
from wheelmill.settings import Settings, Signatures

# What a command does loads when it runs, never to parse a command line or print its help.
if TYPE_CHECKING:
    from wheelmill.index.channels import Published
    from wheelmill.inputs.matrix import Matrix
    from wheelmill.planning.spec import CellPlan, RecipeSpec
    from wheelmill.provenance.signing import TrustedKey
    from wheelmill.releases.promotion import Signer
    from wheelmill.releases.records import Manifest


def register(commands: Commands) -> None:
    release = commands.add_parser("release", help="build and publish a tag's or a nightly's cells; promote; prune")
    _which(release)
    form = release.add_mutually_exclusive_group()
    form.add_argument("--dry-run", action="store_true", help="print the cells, channels and versions; run nothing")
    form.add_argument(
        "--json", action="store_true", help="the same as JSON for CI: version, track, action and the cells' matrix"
    )
    add_cell_options(release, cell_required=False, publish_help="build only (CI publishes in a later job)")
    release.set_defaults(func=cmd_release)
    actions = release.add_subparsers(dest="action", parser_class=type(release))

    pub = actions.add_parser(
        "publish", help="publish the cells built for the release (under the output root) and record it"
    )
    _which(pub)
    pub.add_argument(
        "--no-mirror",
        dest="mirror",
        action="store_false",
        default=argparse.SUPPRESS,
        help="the built wheels only, not the runtime closure",
    )
    pub.add_argument(
        "--wait",
        type=positive,
        default=0,
        metavar="SECONDS",
        help="a cell of a newer torch waits this long for its ABI group's group build, which the job of the "
        "group's oldest torch publishes (default: look once)",
    )
    pub.set_defaults(func=cmd_publish)

    promo = actions.add_parser(
        "promote", help="copy a release's files to another track's channels, re-verified, without rebuilding"
    )
    promo.add_argument(
        "--from", dest="source", required=True, choices=[t.value for t in Track], help="the track it is in (test)"
    )
    promo.add_argument(
        "--to", dest="target", required=True, choices=[t.value for t in Track], help="the track it goes to (release)"
    )
    promo.add_argument("version", help="the version to promote (2.4.0 picks the newest 2.4.0 release candidate)")
    promo.add_argument(
        "--wait",
        type=positive,
        default=0,
        metavar="SECONDS",
        help="where the rc of this commit, or a GPU stage its record asks for, is not recorded yet (a final tag "
        "pushed with its rc), look again every minute for this long; a failed stage stops at once (default: once)",
    )
    promo.set_defaults(func=cmd_promote)

    gpu = actions.add_parser(
        "record-gpu", help="record GPU stage reports (gpu-report.json) in a release's record; promotion needs them"
    )
    gpu.add_argument("--track", required=True, choices=[t.value for t in Track], help="the release's track")
    gpu.add_argument("version", help="the release whose cells the reports tested, e.g. 2.4.0rc1")
    gpu.add_argument("reports", nargs="+", type=Path, metavar="REPORT", help="gpu-report.json files")
    gpu.set_defaults(func=cmd_record_gpu)

    failure = actions.add_parser(
        "record-failure",
        help="record a cell's failed build in the release's record (its step, error line and log's end), "
        "for `wheelmill coverage`",
    )
    _which(failure)
    failure.add_argument(
        "--cell", required=True, help="the cell whose build failed (its report under the output root, if it wrote one)"
    )
    failure.set_defaults(func=cmd_record_failure)

    listing = actions.add_parser(
        "list", help="the releases the index records, newest first: cells, files, failures, GPU stages, images"
    )
    listing.add_argument("--track", choices=[t.value for t in Track], help="only this track's (default: every track's)")
    listing.add_argument("--json", action="store_true", help="the same as JSON, a release an object")
    listing.set_defaults(func=cmd_list)

    show = actions.add_parser("show", help="a release's record: its files, GPU stages and images, read whole")
    show.add_argument("--track", required=True, choices=[t.value for t in Track], help="the release's track")
    show.add_argument("version", help="the release, e.g. 2.4.0rc1")
    show.add_argument("--json", action="store_true", help="the record as JSON (for CI's steps)")
    show.set_defaults(func=cmd_show)

    retention = actions.add_parser("prune", help="keep a track's newest releases, remove older ones' files")
    retention.add_argument(
        "--track", required=True, choices=[Track.NIGHTLY.value, Track.TEST.value], help="the track to prune"
    )
    retention.add_argument(
        "--keep", type=positive, required=True, metavar="N", help="how many of the newest releases to keep (at least 1)"
    )
    retention.set_defaults(func=cmd_prune)


def _which(parser: argparse.ArgumentParser) -> None:
    # Defined on both `release` and `release publish`; SUPPRESS keeps one from erasing the other.
    parser.add_argument("--tag", default=argparse.SUPPRESS, help="a release tag at HEAD: vX.Y.Z or vX.Y.Z-rcN")
    parser.add_argument(
        "--nightly",
        action="store_true",
        default=argparse.SUPPRESS,
        help="the nightly of HEAD: the next version's .devYYYYMMDDHHMMSS (HEAD's commit time)",
    )
    parser.add_argument(
        "--version",
        default=argparse.SUPPRESS,
        metavar="VERSION",
        help="with --nightly: the version the nightly's plan job computed for HEAD, which every job takes",
    )


def _release(args: argparse.Namespace, settings: Settings, *, preview: bool = False) -> Release:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.machine.git import read_state, recipes_problem  # noqa: PLC0415

    tag, nightly = getattr(args, "tag", None), getattr(args, "nightly", False)
    given = getattr(args, "version", None)
    if bool(tag) == bool(nightly):
        raise UsageError("release: give either --tag vX.Y.Z[-rcN] or --nightly", fix="see `wheelmill release --help`")
    if given is not None and not nightly:
        raise UsageError("release: --version is for a nightly", fix="give --nightly --version VERSION, or leave it out")
    state = read_state(settings.root)
    problem = None if preview else recipes_problem(settings.recipes.resolve())
    if problem is not None:  # a release is built from its commit: recipes from elsewhere make another
        raise ReleaseError(
            f"release: {problem}", fix="release from the repository's own recipes, committed (unset WHEELMILL_RECIPES)"
        )
    return for_tag(state, tag, preview=preview) if tag else for_nightly(state, preview=preview, given=given)


def cmd_release(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.index.roots import Index  # noqa: PLC0415
    from wheelmill.releases.promotion import promote  # noqa: PLC0415

    release = _release(args, settings, preview=args.dry_run)
    args.cell = args.cell or ["*"]
    if args.json or args.dry_run:
        args.publish = False  # versions and channels do not depend on the engine
        prepared = prepare(args, settings.layered(engine="none"), probe=False, release=release)
        if args.json:
            matrix, _recipes = load_inputs(settings)
            print(json.dumps(release_json(release, prepared.plans, matrix)))
        else:
            _print_plan(release, prepared.plans, console)
        return 0
    if release.action is Action.PROMOTE:
        console.print(
            f"{release.tag}: promoting the tested {release.promote_from} to the release channels, no rebuild",
            highlight=False,
        )
        manifest = promote(
            Index.of(settings),
            Track.TEST,
            Track.RELEASE,
            release.version,
            commit=release.commit,
            tag=release.tag,
            on_file=_printer(console),
            **_promotion_trust(settings),
        )
        _print_gpu(manifest, console)
        return 0
    publish, args.publish = args.publish, False  # the release's own publish records it; the cells' step would not
    code = build_cells(prepare(args, settings, probe=True, release=release), console)
    if code or not publish:
        return code
    return _publish(release, settings, console, mirror=args.mirror)


def cmd_publish(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    release = _release(args, settings)
    return _publish(release, settings, console, mirror=getattr(args, "mirror", True), wait=args.wait)


def one_build_channels(matrix: Matrix, release: Release, cell: str) -> list[str]:
    """The channels of the cells that make ``cell``'s group build (its oldest torch's)."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.planning.groups import channel_of, group_build  # noqa: PLC0415

    builders = group_build(matrix, matrix.cell(cell), (), release).builders
    return list(dict.fromkeys(channel_of(matrix.cell(c).variant, release) for c in builders))


def _publish(release: Release, settings: Settings, console: Console, *, mirror: bool, wait: float = 0) -> int:
    """Publish the release's wheels and record it; then each cell's runtime closure into
    its channel, so the track's channels install on their own too."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.index.roots import Index  # noqa: PLC0415
    from wheelmill.inputs.variants import Family  # noqa: PLC0415
    from wheelmill.provenance.signing import trusted_keys_of  # noqa: PLC0415
    from wheelmill.releases.publish import (  # noqa: PLC0415
        collect_built,
        one_build_lookup,
        publish_conda_packages,
        publish_release,
        refuse_unattested,
    )

    say = _sayer(console)
    matrix, _recipes = load_inputs(settings)
    index = Index.of(settings)
    lookup = one_build_lookup(index, functools.partial(one_build_channels, matrix, release), wait, say)
    built = collect_built(settings.output, release, lookup=lookup)
    refuse_unattested(built, required=settings.signatures is Signatures.REQUIRED, trusted=trusted_keys_of(settings))
    cells = [matrix.cell(cell) for cell in sorted({wheel.cell for wheel in built})]
    gpu_cells = {cell.id: matrix.gpu_runners_of(cell) for cell in cells if cell.variant.family is not Family.CPU}
    record = publish_release(index, release, built, gpu_runners=gpu_cells, on_file=_printer(console))
    console.print(f"{release.version}: recorded in {index.location}: {record}", highlight=False)
    publish_conda_packages(built, settings, say)
    if mirror:
        mirror_cells([cell.id for cell in cells], settings, console)
    return 0


def _sayer(console: Console) -> Callable[[str], None]:
    return lambda line: console.print(line, highlight=False)


# How often a waiting promotion reads the rc's record again (one object).
PROMOTE_POLL_SECONDS = 60.0


def cmd_promote(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.index.roots import Index  # noqa: PLC0415
    from wheelmill.machine.git import read_state  # noqa: PLC0415
    from wheelmill.releases.promotion import promote  # noqa: PLC0415

    target = Track(args.target)
    # Into the release track, the rc of the checked-out commit (the final tag's), and no other.
    commit = read_state(settings.root).commit if target is Track.RELEASE else None
    trust = _promotion_trust(settings)
    manifest = _waiting(
        lambda: promote(
            Index.of(settings), Track(args.source), target, args.version, commit=commit,
            on_file=_printer(console), **trust,
        ),
        args.wait,
        console,
    )  # fmt: skip
    console.print(
        f"{manifest.promoted_from} -> {manifest.track}/{manifest.version}: {len(manifest.files)} files, "
        "every sha256 re-verified",
        highlight=False,
    )
    _print_gpu(manifest, console)
    return 0


def _waiting(attempt: Callable[[], Manifest], wait: float, console: Console) -> Manifest:
    """``attempt``'s promotion, tried again every minute for ``wait`` seconds while what it
    needs is not recorded yet; nothing is copied before that is known."""
    deadline = monotonic() + wait
    while True:
        try:
            return attempt()
        except ReleasePending as pending:
            left = deadline - monotonic()
            if left <= 0:
                raise
            console.print(f"waiting ({int(left)} s left): {pending.message}", highlight=False)
            sleep(min(PROMOTE_POLL_SECONDS, left))


class _Trust(TypedDict):
    signer: Signer | None
    trusted: tuple[TrustedKey, ...]
    gpu_trusted: tuple[TrustedKey, ...]
    required: bool


def _promotion_trust(settings: Settings) -> _Trust:
    """What a promotion signs with, what it holds each built file's provenance to first, and
    the keys each GPU stage it counts must be signed with."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.provenance.signing import gpu_trusted_keys_of, trusted_keys_of  # noqa: PLC0415

    signer = _promotion_signer(settings)
    required = settings.signatures is Signatures.REQUIRED
    gpu_trusted = gpu_trusted_keys_of(settings)
    return _Trust(signer=signer, trusted=trusted_keys_of(settings), gpu_trusted=gpu_trusted, required=required)


def _promotion_signer(settings: Settings) -> Signer | None:
    """What signs the promotion's statements: the signing key, read before anything is
    promoted; where signatures are required, a promotion without one is refused."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.provenance.signing import signing_key_of  # noqa: PLC0415
    from wheelmill.releases.promotion import signer_of  # noqa: PLC0415

    key = signing_key_of(settings)
    if key is None and settings.signatures is Signatures.REQUIRED:
        raise SignatureError(
            "promote: WHEELMILL_SIGNATURES is required and no signing key is set",
            fix="set WHEELMILL_SIGNING_KEY (CI: the release environment's secret) or WHEELMILL_SIGNING_KEY_FILE",
        )
    return signer_of(key, ci_run=settings.ci_run) if key is not None else None


def _print_gpu(manifest: Manifest, console: Console) -> None:
    for record in manifest.gpu:
        console.print(f"GPU stage: {record.describe()}", highlight=False)


def cmd_record_gpu(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    """Each report as its runner signed it (where a GPU runner's key is trusted, or signatures
    are required), all checked before the first is recorded."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.gpu.report import load_gpu_report  # noqa: PLC0415
    from wheelmill.index.roots import Index  # noqa: PLC0415
    from wheelmill.provenance.signing import gpu_trusted_keys_of  # noqa: PLC0415
    from wheelmill.releases.gpu_attestation import admitted, envelope_beside  # noqa: PLC0415
    from wheelmill.releases.records import record_gpu  # noqa: PLC0415

    trusted = gpu_trusted_keys_of(settings)
    required = settings.signatures is Signatures.REQUIRED
    found = [
        admitted(
            load_gpu_report(path).record(), envelope_beside(path), trusted=trusted, required=required, source=str(path)
        )
        for path in args.reports
    ]
    path = record_gpu(Index.of(settings).storage, Track(args.track), args.version, found)
    for record in found:
        signed = f"signed by {record.signed_by}" if record.signed_by else "unsigned: no GPU runner's key is trusted"
        console.print(f"GPU stage: {record.describe()} ({signed})", highlight=False)
    console.print(f"{args.version}: {len(found)} GPU stage report(s) recorded in {path}", highlight=False)
    return 0


def cmd_record_failure(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.index.roots import Index  # noqa: PLC0415
    from wheelmill.output.layout import CellLayout  # noqa: PLC0415
    from wheelmill.releases.publish import failed_build  # noqa: PLC0415
    from wheelmill.releases.records import Manifest, record_failure  # noqa: PLC0415

    release = _release(args, settings)
    matrix, _recipes = load_inputs(settings)
    cell = matrix.cell(args.cell)
    failed, log = failed_build(CellLayout(output=settings.output, cell=cell.id), release, run=settings.ci_run)
    head = Manifest(
        version=release.version, track=release.track, commit=release.commit, tag=release.tag, files=(), gpu_runners={}
    )
    where = record_failure(Index.of(settings).storage, head, failed, log)
    console.print(f"{cell.id}: failed at {failed.step}; recorded in {where}", highlight=False)
    return 0


def cmd_list(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from rich.table import Table  # noqa: PLC0415

    from wheelmill.index.roots import Index  # noqa: PLC0415
    from wheelmill.releases.records import manifests  # noqa: PLC0415

    storage = Index.of(settings).storage
    tracks = [Track(args.track)] if args.track else list(Track)
    found = [release_summary(m) for track in tracks for m in manifests(storage, track)]
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    if not found:
        console.print(f"no release recorded in {storage.location}", highlight=False)
        return 0
    table = Table(title=f"releases in {storage.location}", title_justify="left")
    for column in ("track", "version", "from", "commit", "cells", "files", "failed", "GPU passed", "images"):
        table.add_column(column, no_wrap=column in ("version", "commit"))
    for one in found:
        gpu = f"{one['gpu_passed']} of {one['gpu_cells']}" if one["gpu_cells"] else "-"
        origin = one["promoted_from"] or one["tag"] or "-"
        counts = (one["cells"], one["files"], one["failed"] or "-", gpu, one["images"] or "-")
        table.add_row(one["track"], one["version"], origin, one["commit"][:12], *map(str, counts))
    console.print(table)
    return 0


def release_summary(manifest: Manifest) -> dict[str, Any]:
    """A release in a few counts: its cells with files, its files, its cells whose latest
    build failed (and has no files), how many of its GPU cells passed on every runner the
    record names with every file tested, and its images."""
    cells = {f.cell for f in manifest.files}
    named = {cell: labels for cell, labels in (manifest.gpu_runners or {}).items() if labels and cell in cells}
    passed = sum(1 for cell, labels in named.items() if all(_passed_on(manifest, cell, r) for r in labels))
    return {
        "track": manifest.track.value,
        "version": manifest.version,
        "tag": manifest.tag,
        "promoted_from": manifest.promoted_from,
        "commit": manifest.commit,
        "cells": len(cells),
        "files": len(manifest.files),
        "failed": len({f.cell for f in manifest.failed} - cells),
        "gpu_cells": len(named),
        "gpu_passed": passed,
        "images": len(manifest.images),
    }


def _passed_on(manifest: Manifest, cell: str, runner: str) -> bool:
    """Whether the cell's newest GPU stage on ``runner`` passed every file the record names for it."""
    files = {f.sha256 for f in manifest.files if f.cell == cell}
    stage = next((g for g in manifest.gpu if g.cell == cell and g.runner == runner), None)
    return stage is not None and stage.passed and all(stage.tested.get(sha) is not None and stage.tested[sha].passed
                                                      for sha in files)  # fmt: skip


def cmd_show(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.index.roots import Index  # noqa: PLC0415
    from wheelmill.releases.records import load_manifest  # noqa: PLC0415

    manifest = load_manifest(Index.of(settings).storage, Track(args.track), args.version)
    if args.json:
        print(json.dumps(manifest.as_dict(), indent=2))
        return 0
    where = f"promoted from {manifest.promoted_from}" if manifest.promoted_from else f"tag {manifest.tag or '-'}"
    console.print(f"{manifest.track}/{manifest.version}: commit {manifest.commit[:12]}, {where}", highlight=False)
    for released in manifest.files:
        console.print(f"  {released.cell}: {released.channel}/{released.filename}", highlight=False)
    _print_gpu(manifest, console)
    for image in manifest.images:
        console.print(f"image {image.cell} {image.kind}: {image.reference}", highlight=False)
    return 0


def cmd_prune(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.index.roots import Index  # noqa: PLC0415
    from wheelmill.releases.publish import prune  # noqa: PLC0415

    removed = prune(Index.of(settings), Track(args.track), args.keep)
    for name in removed:
        console.print(f"removed: {name}", highlight=False)
    console.print(f"{args.track}: kept the {args.keep} newest releases; removed {len(removed)} files", highlight=False)
    return 0


def _printer(console: Console) -> Callable[[Published], None]:
    def on_file(done: Published) -> None:
        console.print(f"{done.outcome}: {done.channel}/{done.filename}", highlight=False)

    return on_file


def release_json(release: Release, plans: tuple[CellPlan, ...], matrix: Matrix) -> dict[str, Any]:
    """What CI's jobs take: the cells to build, and the GPU stage's jobs of a release
    candidate (each GPU cell a runner covers, on each of its runners)."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.inputs.matrix import github_matrix  # noqa: PLC0415

    building = release.action is Action.BUILD and release.track is Track.TEST
    runners = {p.cell.id: matrix.gpu_runners_of(p.cell) for p in plans} if building else {}
    gpu_jobs = [{"cell": cell, "runner": runner} for cell, labels in sorted(runners.items()) for runner in labels]
    return {
        "tag": release.tag,
        "version": release.version,
        "track": release.track.value,
        "action": release.action.value,
        "promote-from": release.promote_from,
        "commit": release.commit,
        "matrix": github_matrix((p.cell for p in plans if release.action is Action.BUILD), matrix.runners),
        "gpu-matrix": {"include": gpu_jobs},
    }


def _print_plan(release: Release, plans: tuple[CellPlan, ...], console: Console) -> None:
    out = Console(highlight=False, width=max(console.width, 120))  # stdout, so a dry run pipes whole
    what = release.tag or "nightly"
    for note in release.notes:
        out.print(f"note (a real run stops here): {note}")
    if release.action is Action.PROMOTE:
        out.print(
            f"{what}: promote test/{release.promote_from or '(no rc on this commit)'} to the release channels as "
            f"{release.version}; "
            "nothing is built"
        )
    else:
        out.print(
            f"{what}: build {len(plans)} cells at {release.commit[:12]}, "
            f"publish {release.version} to the {release.track} track"
        )
    table = Table(title=None)
    for column in ("cell", "channel", "recipe", "version"):
        table.add_column(column)
    for cell_plan in plans:
        channel = (
            Track.RELEASE.channel(cell_plan.cell.variant.channel)
            if release.action is Action.PROMOTE
            else cell_plan.channel
        )
        for recipe in cell_plan.recipes:
            table.add_row(
                cell_plan.cell.id,
                channel,
                recipe.name,
                _promoted(recipe.version.expected(recipe.source), release, recipe),
            )
    out.print(table)


def _promoted(version: str, release: Release, recipe: RecipeSpec) -> str:
    if release.action is Action.PROMOTE and recipe.version.rule is VersionRule.REPO:
        return f"{version} (from {release.promote_from})"
    return version
