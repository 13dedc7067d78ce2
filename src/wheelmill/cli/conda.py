"""``wheelmill conda seed|package|solve|create|index``: the conda channels beside the wheel
index. A cell's conda channel is ``<index>/conda/<variant channel>``; solves read the channels
given with ``--channel`` (URLs or directories), else ``WHEELMILL_CONDA_CHANNELS``, else the
local ones of every variant, so a CPU and a CUDA build of one version are both offered and
``__cuda`` decides."""

from __future__ import annotations

import argparse
import re
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from wheelmill.cli.basics import Commands, load_inputs
from wheelmill.cli.common import cell_python, prepare
from wheelmill.errors import CommandFailed, ConfigError, EnvError, UsageError
from wheelmill.settings import Settings

# What a command does loads when it runs, never to parse a command line or print its help.
if TYPE_CHECKING:
    from wheelmill.conda import envspec
    from wheelmill.conda.package import CondaTarget
    from wheelmill.index.conda_channels import AnyCondaChannel
    from wheelmill.inputs.variants import Cell


def register(commands: Commands) -> None:
    conda = commands.add_parser("conda", help="conda packages and channels beside the wheel index")
    actions = conda.add_subparsers(dest="action", required=True, parser_class=type(conda))
    sow = actions.add_parser(
        "seed", help="fill a cell's conda channel: its CPython and every wheel of its wheel channel, repackaged"
    )
    _cell(sow)
    sow.add_argument(
        "--python", type=Path, help="the CPython to repackage (default: the cell's, found as builds find it)"
    )
    sow.add_argument(
        "--wheels",
        type=Path,
        action="append",
        metavar="DIR",
        help="take wheels from here (default: the cell's wheel channel)",
    )
    sow.add_argument(
        "--build-env",
        action="store_true",
        help="what the cell's conda build env needs instead: its CPython and the tools of recipes/conda/envs.toml",
    )
    sow.set_defaults(func=cmd_seed)
    pack = actions.add_parser("package", help="repackage wheels as conda packages into a cell's conda channel")
    _cell(pack)
    pack.add_argument("wheels", nargs="+", type=Path, metavar="WHEEL", help="wheel files built for the cell")
    pack.set_defaults(func=cmd_package)
    ask = actions.add_parser("solve", help="what specs resolve to, with or without a CUDA driver (__cuda)")
    ask.add_argument("specs", nargs="+", metavar="SPEC", help="conda match specs (example-cpp-ops, python=3.11)")
    ask.add_argument(
        "--cuda",
        type=cuda_version,
        metavar="X.Y",
        help="solve as on a machine whose driver supports CUDA X.Y (default: no GPU)",
    )
    _channels(ask)
    ask.set_defaults(func=cmd_solve)
    pin = actions.add_parser(
        "lock",
        help="solve a cell's conda env (recipes/conda/envs.toml) into its committed lock, locks/conda/<cell>.txt",
    )
    pin.add_argument("--cell", required=True, help="the cell (cpu-py311)")
    pin.add_argument("--out", type=Path, help="write the lock here instead")
    pin.add_argument(
        "--check",
        action="store_true",
        help="write nothing: check that the committed lock fits its specs and the channels hold its packages",
    )
    _channels(pin)
    pin.set_defaults(func=cmd_lock)
    make = actions.add_parser("create", help="make a conda env from the channels")
    make.add_argument("prefix", type=Path, help="a new or empty directory, or an earlier env's prefix (replaced)")
    make.add_argument("specs", nargs="*", metavar="SPEC", help="conda match specs, where no --lock is given")
    make.add_argument(
        "--pkgs-dir",
        type=Path,
        help="where packages are unpacked before they are linked (default: <output>/.cache/conda-pkgs)",
    )
    make.add_argument(
        "--lock", type=Path, help="exactly the packages of this conda lock (wheelmill conda lock), their sha256 checked"
    )
    make.add_argument("--cuda", type=cuda_version, metavar="X.Y", help="as on a machine whose driver supports CUDA X.Y")
    _channels(make)
    make.set_defaults(func=cmd_create)
    reindex = actions.add_parser("index", help="rewrite the repodata of the local conda channels")
    reindex.set_defaults(func=cmd_index)


def _cell(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cell", required=True, help="the cell whose Python and variant the packages are for (cpu-py311)"
    )
    parser.add_argument(
        "--channel",
        help="the conda channel: a directory, or s3://bucket/prefix/conda/<channel> "
        "(default: <index>/conda/<variant channel>)",
    )


def _channels(parser: argparse.ArgumentParser) -> None:
    what = "a channel to read (repeat); default: $WHEELMILL_CONDA_CHANNELS, else the local ones"
    parser.add_argument("--channel", action="append", dest="channels", metavar="URL|DIR", help=what)


def _target(args: argparse.Namespace, settings: Settings) -> tuple[Cell, CondaTarget, AnyCondaChannel]:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.conda.package import CondaTarget  # noqa: PLC0415

    matrix, _recipes = load_inputs(settings)
    cell = matrix.cell(args.cell)
    return cell, CondaTarget.of(cell.variant, cell.python), _conda_channel(args.channel, settings, cell)


def _env_inputs(settings: Settings, cell: Cell) -> envspec.CondaEnvInputs:
    """The cell's conda env specs, the spec file's variant names held to the matrix's."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.conda import envspec  # noqa: PLC0415

    return envspec.inputs(settings.recipes, cell, known=load_inputs(settings)[0].variants)


def _conda_channel(given: str | None, settings: Settings, cell: Cell) -> AnyCondaChannel:
    """The channel given (a directory, or an s3:// location), else the cell's beside the index."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.index.conda_channels import channel_at  # noqa: PLC0415
    from wheelmill.index.roots import Index  # noqa: PLC0415

    return channel_at(given or Index.of(settings).conda_channel(cell.variant.channel))


def _seed_wheels(args: argparse.Namespace, settings: Settings, cell: Cell, held: ExitStack) -> tuple[list[Path], str]:
    """The wheels a seed makes packages of: those in ``--wheels`` directories, else every file
    the cell's channel lists (a bucket's fetched into ``held``'s scratch, for as long as it is
    held); and where they were looked for."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.index.roots import Index, file_of  # noqa: PLC0415

    if args.wheels:
        return [w for d in args.wheels for w in sorted(d.glob("*.whl"))], ", ".join(map(str, args.wheels))
    index = Index.of(settings)
    channel = index.channel(cell.variant.channel)
    listed = [f for project in channel.projects() for f in project.files if f.yanked is None]
    scratch = Path(held.enter_context(tempfile.TemporaryDirectory(prefix="wheelmill-conda-wheels-")))
    found = [path for f in listed if (path := held.enter_context(file_of(channel, f, scratch))) is not None]
    return sorted(found, key=lambda p: p.name), f"channel {channel.name} of {index.location}"


def cmd_seed(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.conda.seed import probe_interpreter, seed  # noqa: PLC0415

    cell, target, channel = _target(args, settings)
    if args.build_env:
        _env_inputs(settings, cell)  # a malformed spec file stops it before any image or interpreter
    with ExitStack() as held, tempfile.TemporaryDirectory(prefix="wheelmill-conda-") as work:
        wheels, where = ([], "") if args.build_env else _seed_wheels(args, settings, cell, held)
        if not wheels and not args.build_env:
            fix = (
                f"build and publish the cell first (wheelmill build --cell {cell.id}), "
                "give --wheels DIR, or seed --build-env"
            )
            raise EnvError(f"conda seed: no wheels in {where}", fix=fix)
        python = (
            args.python
            or (_image_python(args, settings, Path(work), console) if args.build_env else None)
            or cell_python(cell, command="conda seed", fix="install it (pyenv install) or give --python")
        )
        interpreter = probe_interpreter(python)
        if interpreter.minor != cell.python:
            raise UsageError(
                f"conda seed --python {python}: CPython {interpreter.version}, not the {cell.python} of cell {cell.id}",
                fix=f"give --python a CPython {cell.python}, or seed the cell of its version",
            )
        wheels += _tool_wheels(cell, channel, settings, Path(work)) if args.build_env else []
        seeded = seed(
            channel,
            target,
            wheels,
            Path(work),
            interpreter=interpreter,
            progress=lambda line: console.print(f"  packaging {line}"),
        )
    console.print(
        f"{channel.location}: {len(seeded.added)} packages added, {seeded.present} already there, "
        f"{len(seeded.skipped)} wheels for other Pythons left out; channel {channel.url}"
    )
    return 0


def _tool_wheels(cell: Cell, channel: AnyCondaChannel, settings: Settings, work: Path) -> list[Path]:
    """Wheels, from the package sources, of what the cell's conda env specs name beyond its
    Python (ninja, cmake) and the channel lacks: downloaded, sha256 as resolved, to be
    repackaged like the rest."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.conda import envspec  # noqa: PLC0415
    from wheelmill.index.closure import read as read_closure  # noqa: PLC0415
    from wheelmill.machine.envs import UvBackend, package_name  # noqa: PLC0415
    from wheelmill.machine.net import download  # noqa: PLC0415
    from wheelmill.machine.package_sources import machine_sources  # noqa: PLC0415
    from wheelmill.machine.process import HostRunner, StepLog  # noqa: PLC0415
    from wheelmill.planning.locks import target  # noqa: PLC0415

    have = {package_name(Path(name)) for name in channel.package_names()}
    names = [spec.split()[0] for spec in _env_inputs(settings, cell).specs]
    missing = [name for name in names if name not in ("python", "python_abi", *have)]
    if not missing:
        return []
    requirements = work / "tools.in"
    requirements.write_text("\n".join(missing) + "\n", encoding="utf-8")
    with StepLog(work / "tools.log") as log:
        try:
            UvBackend(HostRunner()).lock_wheels(
                requirements,
                work / "pylock.tools.toml",
                target=target(cell),
                sources=machine_sources(settings),
                log=log,
            )
        except CommandFailed as failed:
            raise EnvError(
                f"conda seed: no wheels of {', '.join(missing)} in the package sources: {failed.last_line()}",
                fix=f"check the package sources, or the specs in {settings.recipes / envspec.SPEC_FILE}",
            ) from None
    out = work / "tools"
    out.mkdir()
    return [download(w.url, out / w.filename, sha256=w.sha256) for w in read_closure(work / "pylock.tools.toml").wheels]


def _image_python(args: argparse.Namespace, settings: Settings, work: Path, console: Console) -> Path | None:
    """The CPython of the cell's builder image (``/opt/python/X.Y``), copied out of it, where
    the cell builds in a container: the build env's interpreter must run on the image's
    glibc, which may be older than this machine's. None where the cell builds here."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.machine.builder_images import debian_mirror, prepare_builder  # noqa: PLC0415
    from wheelmill.machine.engine import Mount  # noqa: PLC0415
    from wheelmill.machine.process import HostRunner, StepLog, base_environment  # noqa: PLC0415
    from wheelmill.output.layout import CellLayout  # noqa: PLC0415

    selection = argparse.Namespace(cell=[args.cell], recipe=[], publish=False, mirror=False, rebuild=[])
    prepared = prepare(selection, settings, probe=True)
    (cell_plan,) = prepared.plans
    if cell_plan.image is None or prepared.engine is None:
        return None
    engine, version = prepared.engine, cell_plan.cell.python
    cache = CellLayout(output=settings.output.resolve(), cell=cell_plan.cell.id).cache
    with StepLog(cache / f"conda-seed-{cell_plan.cell.id}.log") as log:
        console.print(f"  the builder image of {cell_plan.cell.id} ({log.path} logs it)", highlight=False)
        ready = prepare_builder(
            engine,
            cell_plan.image,
            mirror=lambda: debian_mirror(settings.debian_mirror),  # asked only where something is made
            work=cache / "bootstrap",
            log=log,
            on_line=lambda _l: None,
            sharing=cell_plan.choices.image_sharing,
            policy=settings.retry,
        )
        out = work / "image-python"
        out.mkdir()
        copy = ["cp", "-a", f"/opt/python/{version}/.", "/out/"]
        HostRunner().run(
            engine.run(image=ready.tag, argv=copy, mounts=[Mount(source=out, target=Path("/out"), readonly=False)]),
            env=base_environment([]),
            log=log,
        )
    executable = out / "bin" / f"python{version}"
    if executable.is_symlink() or not executable.is_file():
        what = f"conda seed: the CPython of {ready.tag} is its distribution's (/opt/python/{version} links to /usr)"
        raise EnvError(
            what, fix="give --python a CPython that runs on the image's glibc, installed in a prefix of its own"
        )
    return executable


def cmd_package(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.conda.package import describe, package_wheel  # noqa: PLC0415

    cell, target, channel = _target(args, settings)
    for wheel in args.wheels:  # all checked before any is made: nothing of a refused call lands
        _refuse_unfit(wheel, cell)
    with tempfile.TemporaryDirectory(prefix="wheelmill-conda-") as work:
        made = [package_wheel(wheel, target, Path(work) / "out", Path(work)) for wheel in args.wheels]
        added = channel.add([path for path, _meta in made])
    for (_path, meta), result in zip(made, added, strict=True):
        console.print(f"{result.outcome}: {describe(meta)}")
    return 0


def _refuse_unfit(wheel: Path, cell: Cell) -> None:
    """A conda package of a cell's channel installs into that cell's Python on its machine: a
    wheel for another Python, ABI or platform would be published under the cell's name."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.conda.package import SUBDIRS  # noqa: PLC0415
    from wheelmill.conda.seed import fits  # noqa: PLC0415
    from wheelmill.wheel.wheelfile import read_wheel  # noqa: PLC0415

    info, machine = read_wheel(wheel), cell.variant.platform
    if not fits(info, cell.python, machine):
        tags = ", ".join(sorted(str(tag) for tag in info.tags))
        raise UsageError(
            f"conda package: {wheel.name} is for {tags}, not for cell {cell.id} "
            f"(CPython {cell.python}, {SUBDIRS[machine]})",
            fix=f"give a wheel built for {cell.id}: cp{cell.python.replace('.', '')}, abi3 from an older CPython, "
            f"or pure, on manylinux/linux {machine}",
        )


def channel_urls(args: argparse.Namespace, settings: Settings) -> list[str]:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.index.conda_channels import configured_channels  # noqa: PLC0415
    from wheelmill.index.roots import Index  # noqa: PLC0415

    return configured_channels(args.channels or settings.conda_channels, Index.of(settings))


def cmd_solve(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.conda.solve import picked, solve  # noqa: PLC0415

    records = solve(channel_urls(args, settings), args.specs, cache_dir=repodata_cache(settings), cuda=args.cuda)
    console.print(
        f"as on a machine with {f'a CUDA {args.cuda} driver (__cuda)' if args.cuda else 'no GPU (no __cuda)'}:",
        highlight=False,
    )
    for pick in picked(records):
        console.print(f"  {pick}  ({pick.channel})", highlight=False)
    return 0


def cuda_version(text: str) -> str:
    """A CUDA release as a driver reports what it supports: ``12.8``, ``13.0``."""
    if not re.fullmatch(r"\d{1,2}\.\d{1,2}", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a CUDA version (X.Y, e.g. 12.8)")
    return text


def cmd_create(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.conda.envspec import read_lock  # noqa: PLC0415
    from wheelmill.conda.solve import check_bytes, create, find_locked, picked, solve  # noqa: PLC0415

    if args.prefix.exists() and not args.prefix.is_dir():
        raise UsageError(
            f"conda create: {args.prefix} is a file, not a directory", fix="give a new or empty directory for the env"
        )
    if args.prefix.exists() and any(args.prefix.iterdir()) and not (args.prefix / "conda-meta").is_dir():
        raise UsageError(
            f"conda create: {args.prefix} is a directory with other files",
            fix="give a new or empty directory, or an env's prefix",
        )
    if bool(args.lock) == bool(args.specs):
        fix = "e.g. wheelmill conda create ENV torch, or --lock locks/conda/<cell>.txt"
        raise UsageError("conda create: give specs or --lock FILE, not both or neither", fix=fix)
    if args.lock:
        packages = read_lock(_readable(args.lock))
        records = find_locked(
            channel_urls(args, settings), packages, lock=args.lock, cache_dir=repodata_cache(settings)
        )
    else:
        records = solve(channel_urls(args, settings), args.specs, cache_dir=repodata_cache(settings), cuda=args.cuda)
        check_bytes(records)
    cache = args.pkgs_dir or settings.output / ".cache" / "conda-pkgs"
    create(
        args.prefix,
        records,
        cache_dir=cache,
        said=f"{args.lock} locks" if args.lock else "its channel's repodata lists",
    )
    console.print(f"{args.prefix}: {len(records)} packages: {', '.join(map(str, picked(records)))}", highlight=False)
    return 0


def cmd_lock(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.conda import envspec  # noqa: PLC0415
    from wheelmill.conda.envspec import read_lock  # noqa: PLC0415
    from wheelmill.conda.solve import find_locked, locked, solve  # noqa: PLC0415
    from wheelmill.files import write_atomic  # noqa: PLC0415

    matrix, _recipes = load_inputs(settings)
    cell = matrix.cell(args.cell)
    wanted = envspec.inputs(settings.recipes, cell, known=matrix.variants)
    committed = envspec.lock_path(settings.root / "locks", wanted.cell)
    channels = channel_urls(args, settings)
    if args.check:
        problem = envspec.mismatch(wanted, _readable(committed))
        if problem:
            raise ConfigError(problem, fix=f"run `wheelmill conda lock --cell {wanted.cell}` and commit {committed}")
        packages = read_lock(committed)
        find_locked(channels, packages, lock=committed, cache_dir=repodata_cache(settings))
        console.print(
            f"{committed}: fits its specs; the channels hold its {len(packages)} packages, sha256 as locked",
            highlight=False,
        )
        return 0
    packages = locked(solve(channels, wanted.specs, cache_dir=repodata_cache(settings)))
    out = args.out or committed
    write_atomic(out, envspec.lock_text(wanted, packages).encode())
    shown = ", ".join(f"{p.name} {p.version}" for p in packages)
    console.print(f"{out}: {len(packages)} packages ({shown}), specs {wanted.digest[:12]}...", highlight=False)
    return 0


def _readable(path: Path) -> Path:
    if not path.is_file():
        raise ConfigError(f"conda: no lock at {path}", fix="make one: wheelmill conda lock --cell <cell>")
    return path


def cmd_index(_args: argparse.Namespace, settings: Settings, console: Console) -> int:
    """Every conda channel beside the index's wheel channels, indexed again."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.index.channels import CONDA_DIR  # noqa: PLC0415
    from wheelmill.index.conda_channels import index_channels  # noqa: PLC0415
    from wheelmill.index.roots import Index  # noqa: PLC0415

    index = Index.of(settings)
    channels = index_channels(index)
    for channel in channels:
        channel.reindex()
        console.print(f"{channel.location}: {len(channel.package_names())} packages indexed", highlight=False)
    if not channels:
        console.print(f"no conda channels under {index.location.rstrip('/')}/{CONDA_DIR}", highlight=False)
    return 0


def repodata_cache(settings: Settings) -> Path:
    """Where a solve keeps served channels' repodata: under the output root, beside the
    package cache, never in the user's home."""
    return settings.output / ".cache" / "conda-repodata"
