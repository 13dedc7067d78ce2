"""``wheelmill conda seed|package|solve|create|index``: the conda channels beside the wheel
index. A cell's conda channel is ``<index>/conda/<variant channel>``; solves read the channels
given with ``--channel`` (URLs or directories), else ``WHEELMILL_CONDA_CHANNELS``, else the
local ones of every variant, so a CPU and a CUDA build of one version are both offered and
``__cuda`` decides."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from rich.console import Console

from wheelmill.cli.common import Commands, load_inputs
from wheelmill.conda.channel import CondaChannel, conda_channel_root, local_channels
from wheelmill.conda.package import CondaTarget, describe, package_wheel
from wheelmill.conda.seed import probe_interpreter, seed
from wheelmill.conda.solve import create, picked, solve
from wheelmill.errors import EnvError, UsageError
from wheelmill.index.store import CONDA_DIR, Channel
from wheelmill.process import HostRunner
from wheelmill.settings import Settings
from wheelmill.toolchain import NotFound, find_python
from wheelmill.variants import Cell


def register(commands: Commands) -> None:
    conda = commands.add_parser("conda", help="conda packages and channels beside the wheel index")
    actions = conda.add_subparsers(dest="action", required=True, parser_class=type(conda))
    sow = actions.add_parser("seed", help="fill a cell's conda channel: its CPython and every wheel of its wheel channel, repackaged")
    _cell(sow)
    sow.add_argument("--python", type=Path, help="the CPython to repackage (default: the cell's, found as builds find it)")
    sow.add_argument("--wheels", type=Path, action="append", metavar="DIR", help="take wheels from here (default: the cell's wheel channel)")
    sow.set_defaults(func=cmd_seed)
    pack = actions.add_parser("package", help="repackage wheels as conda packages into a cell's conda channel")
    _cell(pack)
    pack.add_argument("wheels", nargs="+", type=Path, metavar="WHEEL")
    pack.set_defaults(func=cmd_package)
    ask = actions.add_parser("solve", help="what specs resolve to, with or without a CUDA driver (__cuda)")
    ask.add_argument("specs", nargs="+", metavar="SPEC")
    ask.add_argument("--cuda", metavar="X.Y", help="solve as on a machine whose driver supports CUDA X.Y (default: no GPU)")
    _channels(ask)
    ask.set_defaults(func=cmd_solve)
    make = actions.add_parser("create", help="make a conda env from the channels")
    make.add_argument("prefix", type=Path)
    make.add_argument("specs", nargs="+", metavar="SPEC")
    make.add_argument("--cuda", metavar="X.Y", help="as on a machine whose driver supports CUDA X.Y")
    _channels(make)
    make.set_defaults(func=cmd_create)
    reindex = actions.add_parser("index", help="rewrite the repodata of the local conda channels")
    reindex.set_defaults(func=cmd_index)


def _cell(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cell", required=True, help="the cell whose Python and variant the packages are for (cpu-py311)")
    parser.add_argument("--channel", type=Path, help="the conda channel directory (default: <index>/conda/<variant channel>)")


def _channels(parser: argparse.ArgumentParser) -> None:
    what = "a channel to read (repeat); default: $WHEELMILL_CONDA_CHANNELS, else the local ones"
    parser.add_argument("--channel", action="append", dest="channels", metavar="URL|DIR", help=what)


def _target(args: argparse.Namespace, settings: Settings) -> tuple[Cell, CondaTarget, CondaChannel]:
    matrix, _recipes = load_inputs(settings)
    cell = matrix.cell(args.cell)
    root = args.channel or conda_channel_root(settings.index, cell.variant.channel)
    return cell, CondaTarget.of(cell.variant, cell.python), CondaChannel(root)


def cmd_seed(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    cell, target, channel = _target(args, settings)
    dirs = args.wheels or [Channel(settings.index, cell.variant.channel).files]
    wheels = [w for d in dirs for w in sorted(d.glob("*.whl"))]
    if not wheels:
        fix = f"build and publish the cell first (wheelmill build --cell {cell.id}), or give --wheels DIR"
        raise EnvError(f"conda seed: no wheels in {', '.join(map(str, dirs))}", fix=fix)
    python = args.python or _cell_python(cell)
    with tempfile.TemporaryDirectory(prefix="wheelmill-conda-") as work:
        seeded = seed(channel, target, wheels, Path(work), interpreter=probe_interpreter(python), progress=lambda line: console.print(f"  packaging {line}"))
    console.print(
        f"{channel.root}: {len(seeded.added)} packages added, {seeded.present} already there, "
        f"{len(seeded.skipped)} wheels for other Pythons left out; channel {channel.url}"
    )
    return 0


def _cell_python(cell: Cell) -> Path:
    found = find_python(cell.python, HostRunner())
    if isinstance(found, NotFound):
        raise EnvError(f"conda seed: no CPython {cell.python} on this machine ({'; '.join(found.looked)})", fix="install it (pyenv install) or give --python")
    return found.path


def cmd_package(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    _, target, channel = _target(args, settings)
    with tempfile.TemporaryDirectory(prefix="wheelmill-conda-") as work:
        made = [package_wheel(wheel, target, Path(work) / "out", Path(work)) for wheel in args.wheels]
        added = channel.add([path for path, _meta in made])
    for (_path, meta), result in zip(made, added, strict=True):
        console.print(f"{result.outcome}: {describe(meta)}")
    return 0


def channel_urls(args: argparse.Namespace, settings: Settings) -> list[str]:
    given = args.channels or os.environ.get("WHEELMILL_CONDA_CHANNELS", "").split()
    if given:
        return [c if "://" in c else Path(c).resolve().as_uri() for c in given]
    local = [p for p in local_channels(settings.index) if (p / "noarch" / "repodata.json").is_file()]
    if not local:
        raise UsageError(f"conda: no conda channel under {settings.index / CONDA_DIR}", fix="seed one (wheelmill conda seed --cell ...) or give --channel URL")
    return [p.resolve().as_uri() for p in local]


def cmd_solve(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    records = solve(channel_urls(args, settings), args.specs, cuda=args.cuda)
    console.print(f"as on a machine with {f'a CUDA {args.cuda} driver (__cuda)' if args.cuda else 'no GPU (no __cuda)'}:", highlight=False)
    for pick in picked(records):
        console.print(f"  {pick}  ({pick.channel})", highlight=False)
    return 0


def cmd_create(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    if args.prefix.exists() and any(args.prefix.iterdir()) and not (args.prefix / "conda-meta").is_dir():
        raise UsageError(f"conda create: {args.prefix} is a directory with other files", fix="give a new or empty directory, or an env's prefix")
    records = solve(channel_urls(args, settings), args.specs, cuda=args.cuda)
    create(args.prefix, records, cache_dir=settings.output / ".cache" / "conda-pkgs")
    console.print(f"{args.prefix}: {len(records)} packages: {', '.join(map(str, picked(records)))}", highlight=False)
    return 0


def cmd_index(_args: argparse.Namespace, settings: Settings, console: Console) -> int:
    roots = local_channels(settings.index)
    for root in roots:
        CondaChannel(root).reindex()
        console.print(f"{root}: {len(CondaChannel(root).packages())} packages indexed")
    if not roots:
        console.print(f"no conda channels under {settings.index / CONDA_DIR}")
    return 0
