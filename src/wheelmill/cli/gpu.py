"""``wheelmill test-gpu``: the GPU stage of a cell, on a GPU machine, from its channel.

    wheelmill test-gpu --cell cuda130-py311                       the local index root's channel
    wheelmill test-gpu --cell cuda130-py311 --index-url URL       a served index (no index root here)
    wheelmill test-gpu --cell cuda130-py311 --python /usr/bin/python3   over an interpreter with the torch
    wheelmill test-gpu --cell cuda130-py311 --track test --release 2.4.0rc1   the release's files
    wheelmill test-gpu --cell cuda130-py311 --runner linux-gpu-h100   say which GPU runner (kind) it ran on

The report goes to ``<output>/<cell>/gpu-report.json`` whatever the outcome.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from wheelmill.cli.basics import Commands, load_inputs, print_error
from wheelmill.cli.common import cell_python
from wheelmill.config import format_duration
from wheelmill.errors import (
    FetchError,
    GpuCheckError,
    GpuUnproven,
    GpuVerdictMismatch,
    NoGpuError,
    SelectionError,
    UsageError,
    WheelmillError,
)
from wheelmill.inputs.versions import Track
from wheelmill.settings import Settings, Signatures

# What a command does loads when it runs, never to parse a command line or print its help.
if TYPE_CHECKING:
    from wheelmill.gpu.report import GpuReport
    from wheelmill.inputs.recipes import ResolvedRecipe
    from wheelmill.inputs.variants import Cell
    from wheelmill.machine.net import IndexFile
    from wheelmill.machine.package_sources import PackageSources
    from wheelmill.planning.gpu_stage import GpuStagePlan
    from wheelmill.provenance.signing import SigningKey
    from wheelmill.releases.attested import Source


_NO_PYTHON = "install it (pyenv install), or give --python an interpreter that has the cell's torch"
# The stage's exit codes, by the error that carries each.
_FAILURES: dict[int, type[WheelmillError]] = {
    error.exit_code: error for error in (NoGpuError, GpuCheckError, GpuVerdictMismatch, GpuUnproven)
}


def register(commands: Commands) -> None:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.index.consumer import base_url  # noqa: PLC0415

    sub = commands.add_parser(
        "test-gpu",
        help="the GPU stage: install a cell's wheels from its channel on a GPU machine, run doctor and the "
        "recipes' GPU checks, and report",
    )
    sub.add_argument("--cell", required=True, help="the cell whose wheels to test, e.g. cuda130-py311")
    sub.add_argument(
        "--index-url", type=base_url, help="a served index's base URL (default: the local index root's channel)"
    )
    sub.add_argument(
        "--track",
        choices=[t.value for t in Track],
        default=Track.RELEASE.value,
        help="whose channel: release (the variant's own, where builds publish; default), test or nightly",
    )
    sub.add_argument("--release", metavar="VERSION", help="the files the track's record of this release names")
    sub.add_argument(
        "--python", type=Path, help="an interpreter that has the cell's torch (default: a fresh env from the channel)"
    )
    sub.add_argument("--capability", metavar="ARCH", help="declare the GPU where nvidia-smi cannot say its arch")
    sub.add_argument(
        "--runner",
        metavar="LABEL",
        help="the CI runner label (a GPU kind of the matrix's ci.gpu-runners) this runs on; a release records the "
        "report per cell and runner",
    )
    sub.set_defaults(func=cmd_test_gpu)


def cmd_test_gpu(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.gpu.stage import GpuStage, StageInputs, channel_location  # noqa: PLC0415
    from wheelmill.index.roots import Index  # noqa: PLC0415
    from wheelmill.inputs.recipes import resolve_all  # noqa: PLC0415
    from wheelmill.inputs.variants import Family  # noqa: PLC0415
    from wheelmill.machine.process import StepLog  # noqa: PLC0415
    from wheelmill.output.layout import CellLayout  # noqa: PLC0415
    from wheelmill.planning.gpu_stage import plan_stage, source_of  # noqa: PLC0415
    from wheelmill.provenance.signing import signing_key_of, trusted_keys  # noqa: PLC0415

    matrix, recipes = load_inputs(settings)
    cell = matrix.cell(args.cell)
    if cell.variant.family is Family.CPU:
        raise SelectionError(
            f"test-gpu: {cell.id} carries no GPU code", fix="give a CUDA or ROCm cell, e.g. cuda130-py311"
        )
    if args.release and args.index_url:
        raise UsageError("test-gpu: --release reads the index root's records", fix="leave out --index-url")
    if args.runner is not None and args.runner not in matrix.gpu_runners_of(cell):
        labels = ", ".join(matrix.gpu_runners_of(cell)) or "none"
        raise UsageError(
            f"test-gpu: --runner {args.runner}: not a GPU runner of {cell.id} (ci.gpu-runners names: {labels})",
            fix="give the runner label the matrix maps the cell to, or leave --runner out",
        )
    # The keys the wheels' provenance is verified with: WHEELMILL_TRUSTED_KEYS alone. The signing
    # key here is the GPU runner's, which signs its report, not builds (a wrong setting of
    # either is said before any channel is read).
    trusted = trusted_keys(settings.trusted_keys) if settings.trusted_keys else ()
    key = signing_key_of(settings)
    resolved = resolve_all(recipes, cell)
    track = Track(args.track)
    channel = track.channel(cell.variant.channel)
    root = Index.of(settings)
    if args.index_url is None and not root.channel(channel).exists():
        raise UsageError(
            f"test-gpu: no channel {channel} under {root.location}", fix="publish the cell first, or give --index-url"
        )
    given = "test-gpu: uv reads the channel's files by path without --index-url"
    where = args.index_url or str(root.read_by_path(given, fix="give --index-url, the URL of the nginx"))
    pages = channel_location(where, channel)
    named = _named(settings, track, args.release, cell) if args.release else None
    listed = {name: _listing(pages, name, settings, console) for name in resolved}
    plan = plan_stage(cell, channel, resolved, listed, named=named)
    if not plan.wheels:
        raise UsageError(
            f"test-gpu: channel {channel} has no wheel of {cell.id}'s recipes", fix="build and publish the cell first"
        )
    layout = CellLayout(output=settings.output.resolve(), cell=cell.id)
    layout.logs.mkdir(parents=True, exist_ok=True)
    test_requires = _test_requires(plan, matrix.test_requires, resolved)
    inputs = StageInputs(
        plan=plan,
        index=where,
        channel_url=pages,
        recipes_dir=settings.recipes.resolve(),
        sources={name: source_of(recipe) for name, recipe in resolved.items()},
        python=_given(args.python),
        fresh_python=None if args.python else cell_python(cell, command="test-gpu", fix=_NO_PYTHON),
        capability=args.capability,
        test_requires=test_requires,
        # Asked of pip's configuration (a subprocess) only where a GPU check needs something.
        test_sources=_test_sources(pages, settings) if test_requires else None,
        runner=args.runner,
        work=layout.root / "gpu-stage",
        provenance=_provenance_source(args.index_url, channel, settings),
        trusted=trusted,
        required=settings.signatures is Signatures.REQUIRED,
    )
    _say_plan(plan, console)
    with StepLog(layout.logs / "gpu-stage.log") as log:
        stage = GpuStage(inputs, log=log, say=lambda line: console.print(line, highlight=False), complain=print_error)
        report = stage.run()
    written = report.write(layout.root)
    _summary(report, written, console)
    _sign(report, written, key, console)
    if stage.failure is not None:
        raise stage.failure
    if stage.refused:  # a wheel did not verify: each failure is a line on stderr already
        return report.exit_code
    if report.exit_code:
        raise _FAILURES[report.exit_code](
            f"test-gpu: {cell.id}: {report.error}", fix=_fix(report, layout.logs / "gpu-stage.log")
        )
    return 0


def _sign(report: GpuReport, written: Path, key: SigningKey | None, console: Console) -> None:
    """The runner's signed statement of what the stage found, beside its report: the only
    form of it ``record-gpu`` takes where GPU runners' keys are trusted. A statement left by
    an earlier run never stays beside a new report."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.provenance.statement import beside  # noqa: PLC0415
    from wheelmill.releases.gpu_attestation import sign_gpu_record, write_signed  # noqa: PLC0415

    beside(written).unlink(missing_ok=True)
    if key is None:
        console.print(
            "gpu-report.json: unsigned (no signing key set): a release that trusts its GPU runners' keys "
            "will not record it",
            highlight=False,
        )
        return
    signed = write_signed(written, sign_gpu_record(report.record(), report.tested_files(), key))
    console.print(f"signed by key {key.key_id}: {signed}", highlight=False)


def _provenance_source(index_url: str | None, channel: str, settings: Settings) -> Source:
    """Where the wheels' provenance is read: the served channel the stage installs from, or
    the index root's."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.index.http_channel import HttpChannel  # noqa: PLC0415
    from wheelmill.index.roots import Index  # noqa: PLC0415
    from wheelmill.releases.attested import local_source, served_source  # noqa: PLC0415

    if index_url is not None:
        return served_source(HttpChannel(base=index_url, name=channel, retry=settings.retry))
    return local_source(Index.of(settings).channel(channel))


def _listing(pages: str, name: str, settings: Settings, console: Console) -> list[IndexFile]:
    """A project's files in the channel, retried where the index does not answer."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.machine.net import project_files  # noqa: PLC0415
    from wheelmill.retry import TransientError, with_retries  # noqa: PLC0415

    def said(attempt: int, exc: Exception, pause: float) -> None:
        console.print(f"{exc} (attempt {attempt}); again in {pause:.0f}s", highlight=False)

    try:
        return with_retries(lambda _attempt: project_files(pages, name), policy=settings.retry, on_retry=said)[0]
    except TransientError as exc:
        raise FetchError(
            f"test-gpu: cannot read the channel: {exc}", fix="check --index-url and that the index is served"
        ) from None


def _test_sources(pages: str, settings: Settings) -> PackageSources:
    """Where the GPU checks' own requirements come from: the channel, and this machine's
    package sources (a GPU runner's, where the channel does not mirror pytest)."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.machine.package_sources import PackageSources, default_index_url, machine_sources  # noqa: PLC0415

    machine = machine_sources(settings)
    default = machine.index_url or default_index_url()  # uv reads no configuration: pip's default, named
    return PackageSources(
        index_url=pages,
        extra_index_urls=(*machine.extra_index_urls, *([default] if default else [])),
        find_links=machine.find_links,
        origin=f"the channel, then {machine.origin}",
        index_strategy="unsafe-best-match",
    )


def _test_requires(
    plan: GpuStagePlan, common: tuple[str, ...], resolved: Mapping[str, ResolvedRecipe]
) -> tuple[str, ...]:
    """What the GPU checks run with: the matrix's test env and each tested recipe's own;
    nothing where no wheel has a GPU check."""
    checked = [wheel for wheel in plan.wheels if wheel.gpu_smoke]
    own = [req for wheel in checked for req in resolved[wheel.recipe].test_requires]
    return tuple(dict.fromkeys([*common, *own])) if checked else ()


def _named(settings: Settings, track: Track, version: str, cell: Cell) -> dict[str, str]:
    """Each recipe's file that the release's record names for the cell."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.index.roots import Index  # noqa: PLC0415
    from wheelmill.releases.records import find_manifest, manifests  # noqa: PLC0415

    records = Index.of(settings).storage
    manifest = find_manifest(records, track, version)
    if manifest is None:
        known = ", ".join(m.version for m in manifests(records, track)) or "none"
        raise UsageError(
            f"test-gpu: the {track} track has no release {version} (there: {known})", fix="give a recorded release"
        )
    named = {f.recipe: f.filename for f in manifest.files if f.cell == cell.id}
    if not named:
        raise UsageError(
            f"test-gpu: the {track} record of {version} has no file of {cell.id}", fix="give a cell the release built"
        )
    return named


def _given(python: Path | None) -> Path | None:
    if python is not None and not python.is_file():
        raise UsageError(
            f"test-gpu: --python {python}: no such file",
            fix="give the path of an interpreter that has the cell's torch",
        )
    return python


def _say_plan(plan: GpuStagePlan, console: Console) -> None:
    console.print(
        f"GPU stage of {plan.cell.id}: {len(plan.wheels)} wheel(s) of channel {plan.channel}", highlight=False
    )
    for wheel in plan.wheels:
        check = " ".join(wheel.gpu_smoke) if wheel.gpu_smoke else "no GPU check in its recipe: import only"
        console.print(f"  {wheel.recipe}: {wheel.filename}; {check}", highlight=False)
    if plan.missing:
        console.print(f"  not in the channel (not tested): {', '.join(plan.missing)}", highlight=False)


def _summary(report: GpuReport, written: Path, console: Console) -> None:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.gpu.report import table  # noqa: PLC0415

    if report.wheels:
        console.print(table(report))
    torch = f"torch {report.torch} sees {', '.join(report.torch_gpus) or 'no GPU'}" if report.torch else "no env"
    console.print(
        f"{report.cell}: {report.status} ({report.counts()}) in {format_duration(report.seconds)} on "
        f"{', '.join(report.gpus) or 'no GPU'}; {torch}; report {written}",
        highlight=False,
    )


def _fix(report: GpuReport, log: Path) -> str:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.images import doctor  # noqa: PLC0415

    if report.exit_code == NoGpuError.exit_code and not report.gpus and any(map(doctor.tool_failed, report.notes)):
        # The tool is there and the driver does not answer it: most often a driver upgraded
        # under a loaded kernel module (NVML's "Driver/library version mismatch").
        return (
            "the GPU driver does not answer: reboot, or reload its kernel module (rmmod and modprobe nvidia) so that "
            "it matches the driver's library, then check that nvidia-smi lists the GPUs"
        )
    if report.exit_code == NoGpuError.exit_code:
        return "run the stage on a machine with a GPU its driver and torch can use (nvidia-smi lists it)"
    if report.exit_code == GpuVerdictMismatch.exit_code:
        return (
            "the wheel's arch record or doctor's rules are wrong: compare its device code (cuobjdump) "
            "with its gpu-archs.json"
        )
    if report.exit_code == GpuUnproven.exit_code:
        return (
            "give each such recipe a GPU check ([checks] gpu-smoke) whose tests run on this GPU; nothing "
            "less than a pass lets a release through"
        )
    return f"read {log}; where doctor predicted it, install a build whose arch list includes this GPU"
