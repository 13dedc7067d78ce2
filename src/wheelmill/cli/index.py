"""The index commands: ``publish``, ``yank``, ``unyank`` and ``index serve|config|verify|render|sweep|list|migrate``.
Publishing, yanking, checking, rendering, listing and the sweep of what no channel lists work on
a tree and on an object store alike (``wheelmill.index.roots``); serving is a tree's, and so is
a migration from the layout of an earlier wheelmill."""

from __future__ import annotations

import argparse
import errno
import sys
from datetime import timedelta
from pathlib import Path
from typing import IO, TYPE_CHECKING

from rich.console import Console

from wheelmill.cli.basics import Commands, days, port, positive, seconds
from wheelmill.config import format_size
from wheelmill.errors import ChannelError, SelectionError, UsageError, did_you_mean
from wheelmill.index.limits import IDLE_TIMEOUT, PER_CLIENT
from wheelmill.inputs.versions import Track
from wheelmill.settings import Settings, Signatures

# What a command does loads when it runs, never to parse a command line or print its help.
if TYPE_CHECKING:
    from wheelmill.index.downloads import Downloads
    from wheelmill.index.pages import FileEntry
    from wheelmill.index.roots import AnyChannel, Index
    from wheelmill.index.serve import IndexServer


SWEEP_GRACE = 7.0  # days: a week's nightlies, and a publisher long gone


def register(commands: Commands) -> None:
    pub = commands.add_parser(
        "publish", help="add wheels to a channel of the local index, or upload them to another index"
    )
    pub.add_argument("wheels", nargs="+", type=Path, metavar="WHEEL", help="wheel files (each verified first)")
    pub.add_argument("--channel", help="the local channel (cpu, cu118, rocm6.2, ...)")
    pub.add_argument("--to", metavar="URL", help="upload to this index's upload API instead")
    pub.add_argument("--check-url", metavar="URL", help="that index's simple API (default: URL/simple/)")
    pub.set_defaults(func=cmd_publish)

    for name, func in (("yank", cmd_yank), ("unyank", cmd_unyank)):
        sub = commands.add_parser(name, help=f"{name} every file of a version (PEP 592)")
        sub.add_argument("project", help="the project's name, as pip takes it (torchsort)")
        sub.add_argument("version", help="the exact version, local label included (0.1.10+cu130)")
        sub.add_argument("--channel", required=True, help="the local channel that lists it (cpu, cu130, ...)")
        if name == "yank":
            sub.add_argument("--reason", required=True, help="shown to whoever still installs it")
        sub.set_defaults(func=func)

    index = commands.add_parser("index", help="serve, check and describe the local index")
    actions = index.add_subparsers(dest="action", required=True, parser_class=type(index))
    serve = actions.add_parser("serve", help="serve the index over HTTP (read-only)")
    serve.add_argument(
        "--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1: this machine alone)"
    )
    serve.add_argument("--port", type=port, default=8080, help="0 picks a free one")
    serve.add_argument(
        "--access-log",
        type=Path,
        metavar="FILE",
        help="append a line of JSON a request here (time, method, path, status, user agent, bytes; no client "
        "address): what `wheelmill wants` reads",
    )
    serve.add_argument(
        "--idle-timeout",
        type=seconds,
        default=IDLE_TIMEOUT,
        metavar="S",
        help=f"close a connection idle this long (default {IDLE_TIMEOUT:.0f})",
    )
    serve.add_argument(
        "--per-client",
        type=positive,
        default=PER_CLIENT,
        metavar="N",
        help=f"connections one client may hold open (default {PER_CLIENT})",
    )
    serve.set_defaults(func=cmd_serve)
    config = actions.add_parser("config", help="pip and uv settings that use one channel, and only it")
    config.add_argument("--channel", required=True, help="the channel the settings install from (cpu, cu130, ...)")
    config.add_argument("--url", default="http://127.0.0.1:8080", help="where the index is served")
    config.add_argument(
        "--form",
        choices=("all", "pip", "uv", "env"),
        default="all",
        help="pip.conf, uv's pyproject table, environment variables, or all three (default)",
    )
    config.set_defaults(func=cmd_config)
    check = actions.add_parser("verify", help="check that channels are valid indexes")
    check.add_argument("--channel", action="append", help="default: every channel")
    check.add_argument(
        "--hashes",
        action="store_true",
        help="read every file back and hash it too, on a tree as on an object store (without it: every page, "
        "entry, file and sidecar is there with the listed size, and each sidecar has the listed sha256)",
    )
    check.set_defaults(func=cmd_verify)
    draw = actions.add_parser(
        "render",
        help="write channels' pages again from their entries (what a writer killed midway left), and check them",
    )
    draw.add_argument("--channel", action="append", help="default: every channel")
    draw.set_defaults(func=cmd_render)
    clean = actions.add_parser(
        "sweep",
        help="delete the stored files no channel lists any more (pruned nightlies, removed files), "
        "a grace period after a sweep first found them unlisted",
    )
    clean.add_argument(
        "--grace",
        type=days,
        default=SWEEP_GRACE,
        metavar="DAYS",
        help=f"days a file stays unlisted (since the sweep that first found it so) before it goes ({SWEEP_GRACE:g})",
    )
    clean.set_defaults(func=cmd_sweep)
    listing = actions.add_parser("list", help="projects and versions of a channel")
    listing.add_argument("--channel", required=True, help="the local channel (cpu, cu130, ...)")
    listing.set_defaults(func=cmd_list)
    move = actions.add_parser(
        "migrate",
        help="write a tree's channels of an earlier wheelmill's layout as objects (once; run it again after a kill)",
    )
    move.set_defaults(func=cmd_migrate)


def _channel(args: argparse.Namespace, settings: Settings) -> AnyChannel:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.index.roots import Index  # noqa: PLC0415

    index = Index.of(settings)
    channel = index.channel(args.channel)
    if not channel.exists():
        known = ", ".join(index.channel_names()) or "none"
        raise ChannelError(
            f"{index.location}: no channel '{args.channel}' in the index",
            fix=f"publish to it first; channels here: {known}",
        )
    return channel


def _defined(name: str, settings: Settings, index: Index) -> None:
    """A channel is a variant's (in some track): publishing never makes up another one. On an
    index host without the repository (no matrix), a channel the index has is one."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.index.channels import is_channel_name  # noqa: PLC0415
    from wheelmill.inputs.matrix import load_matrix  # noqa: PLC0415

    if not (settings.recipes / "matrix.toml").is_file():
        # Its project list read, the one object that makes it a channel of the index (as
        # ``channel_names`` decides); every channel listed only to say which there are.
        if is_channel_name(name) and index.channel(name).exists():
            return
        existing = index.channel_names()
        raise UsageError(
            f"publish: no matrix.toml in {settings.recipes.resolve()} to define channel '{name}', "
            f"and the index {index.location} has no such channel{did_you_mean(name, existing)}",
            fix=f"publish into a channel the index has ({', '.join(existing) or 'none yet'}), "
            "or run from the repository (--recipes DIR)",
        )
    # The matrix alone names the channels: the recipes, and their cells' check, are a build's.
    matrix = load_matrix(settings.recipes / "matrix.toml")
    channels = [track.channel(v.channel) for track in Track for v in matrix.variants.values()]
    if name not in channels:
        raise SelectionError(
            f"publish: no variant of {matrix.path} has the channel '{name}'{did_you_mean(name, channels)}",
            fix=f"use a variant's channel: {', '.join(v.channel for v in matrix.variants.values())} "
            "(or test/..., nightly/...)",
        )


def cmd_publish(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.index.roots import Index, publish  # noqa: PLC0415
    from wheelmill.wheel.wheelfile import read_wheel  # noqa: PLC0415

    missing = [str(w) for w in args.wheels if not w.is_file()]
    if missing:
        raise UsageError(f"publish: no such file: {', '.join(missing)}", fix="give paths of .whl files")
    if bool(args.to) == bool(args.channel):
        raise UsageError(
            "publish: give either --channel (the local index) or --to URL (another index)",
            fix="see `wheelmill publish --help`",
        )
    # Signing and verification import cryptography: loaded by a publish alone, not by every index command.
    from wheelmill.provenance.signing import trusted_keys_of  # noqa: PLC0415
    from wheelmill.provenance.statement import read_beside  # noqa: PLC0415
    from wheelmill.provenance.verification import refuse_unverified  # noqa: PLC0415

    trusted, required = trusted_keys_of(settings), settings.signatures is Signatures.REQUIRED
    for wheel in args.wheels:  # every one before any is published: all or nothing
        read_wheel(wheel)  # a wheel at all, first
        refuse_unverified(wheel, read_beside(wheel), trusted=trusted, required=required, channel=args.channel)
    if args.to:
        return _publish_remote(args, settings, console)
    index = Index.of(settings)  # one for the check and the publish: a bucket's client is made once
    _defined(args.channel, settings, index)
    channel = index.channel(args.channel)
    for wheel in args.wheels:
        done = publish(channel, wheel)
        console.print(f"{done.outcome}: {channel.name}/{done.filename}", highlight=False)
    return 0


def _publish_remote(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.index.remote import Remote, upload  # noqa: PLC0415
    from wheelmill.machine.process import HostRunner, StepLog  # noqa: PLC0415

    remote = Remote.of(args.to, args.check_url, settings)
    log_path = settings.output / "logs" / "publish.log"
    with StepLog(log_path, secrets=remote.secrets) as log:
        for wheel in args.wheels:

            def on_retry(attempt: int, error: Exception, pause: float, name: str = wheel.name) -> None:
                console.print(
                    log.redact(f"  attempt {attempt} for {name} failed: {error}; retrying in {pause:.1f}s"),
                    highlight=False,
                )

            outcome, attempts = upload(
                remote, wheel, runner=HostRunner(), log=log, policy=settings.retry, on_retry=on_retry
            )
            console.print(
                f"{outcome}: {wheel.name} -> {remote.url} ({attempts} attempt{'s' if attempts > 1 else ''})",
                highlight=False,
            )
    return 0


def cmd_yank(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.index.roots import set_yanked  # noqa: PLC0415

    files = set_yanked(_channel(args, settings), args.project, args.version, args.reason)
    console.print(f"yanked {', '.join(files)}: {args.reason}", highlight=False)
    return 0


def cmd_unyank(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.index.roots import set_yanked  # noqa: PLC0415

    files = set_yanked(_channel(args, settings), args.project, args.version, None)
    console.print(f"unyanked {', '.join(files)}", highlight=False)
    return 0


def cmd_serve(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.index.roots import Index  # noqa: PLC0415

    root = Index.of(settings).served_tree()
    server = _bound(args, root)
    try:
        log = _access_log(args.access_log) if args.access_log else None
    except UsageError:
        server.server_close()
        raise
    if log:
        server.log_to(log)
    host, port = str(server.server_address[0]), int(server.server_address[1])
    channels = Index(tree=root).channel_names()
    console.print(
        f"serving {root} at http://{host}:{port}/ (channels: {', '.join(channels) or 'none yet'}); Ctrl-C stops",
        highlight=False,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        if log:
            log.close()
    return 0


def _bound(args: argparse.Namespace, root: Path) -> IndexServer:
    """The server, listening: an address this machine cannot listen on is the user's to fix."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.index.serve import make_server  # noqa: PLC0415

    try:
        return make_server(root, args.host, args.port, None, idle_timeout=args.idle_timeout, per_client=args.per_client)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise UsageError(
                f"--port {args.port}: in use on {args.host}", fix="stop what listens there, or give another --port"
            ) from None
        raise UsageError(
            f"--host {args.host} --port {args.port}: cannot listen there ({exc.strerror or exc})",
            fix="give an address of this machine (127.0.0.1, 0.0.0.0, ::) and a free port",
        ) from None


def _access_log(path: Path) -> IO[str]:
    try:
        return path.open("a", encoding="utf-8")
    except OSError as exc:
        raise UsageError(
            f"--access-log {path}: cannot be opened to append ({exc.strerror or exc})",
            fix="give a file in a directory that exists and this user may write",
        ) from None


def cmd_config(args: argparse.Namespace, _settings: Settings, _console: Console) -> int:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.index import consumer  # noqa: PLC0415
    from wheelmill.index.channels import checked_channel  # noqa: PLC0415

    checked_channel(args.channel)
    sys.stdout.write(consumer.format_settings(consumer.base_url(args.url), args.channel, args.form))
    return 0


def _channels(args: argparse.Namespace, settings: Settings) -> list[AnyChannel]:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.index.roots import Index  # noqa: PLC0415

    index = Index.of(settings)
    names = args.channel or index.channel_names()
    if not names:
        raise ChannelError(f"{index.location}: no channels", fix="publish a wheel first")
    return [index.channel(name) for name in names]


def cmd_verify(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.index.roots import problems  # noqa: PLC0415

    found_all = []
    for channel in _channels(args, settings):
        found = problems(channel, hashes=args.hashes)
        found_all += found
        verdict = f"{len(found)} problem(s)" if found else "ok"
        console.print(f"{channel.name}: {verdict}", highlight=False)
    for leftover in _downloads(settings).stale_downloads():
        console.print(
            f"  note: downloads: {leftover.name}, left by an interrupted mirror (`wheelmill index sweep` removes it)",
            highlight=False,
        )
    if found_all:
        more = f" and {len(found_all) - 5} more" if len(found_all) > 5 else ""
        raise ChannelError(
            "index verify: " + "; ".join(found_all[:5]) + more,
            fix="run `wheelmill index render`, then republish what it reports",
        )
    return 0


def _downloads(settings: Settings) -> Downloads:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.index.downloads import Downloads  # noqa: PLC0415
    from wheelmill.index.roots import Index  # noqa: PLC0415

    return Downloads(Index.of(settings).downloads(settings.output))


def cmd_render(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    """Every page of the channels written again from their entries, then checked."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.index.objects import render  # noqa: PLC0415
    from wheelmill.index.roots import problems  # noqa: PLC0415

    for channel in _channels(args, settings):
        said = render(channel)
        for done in said:
            console.print(f"{channel.name}: {done}", highlight=False)
        found = problems(channel, hashes=False)
        console.print(f"{channel.name}: rendered, {'ok' if not found else '; '.join(found[:5])}", highlight=False)
        if found:
            raise ChannelError(
                f"index render: {channel.name} is still not valid: {found[0]}",
                fix="publish again what it names (its bytes are missing from the index's storage)",
            )
    return 0


def cmd_migrate(_args: argparse.Namespace, settings: Settings, console: Console) -> int:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.index.roots import Index, migrate  # noqa: PLC0415

    index = Index.of(settings)
    done = migrate(index, on_channel=lambda m: console.print(m.describe(), highlight=False))
    console.print(
        f"{index.location}: migrated {len(done)} channel(s)" if done else f"{index.location}: nothing to migrate",
        highlight=False,
    )
    return 0


def cmd_sweep(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.index.roots import Index, tidy  # noqa: PLC0415
    from wheelmill.index.sweep import sweep  # noqa: PLC0415

    index = Index.of(settings)
    console.print(f"sweeping {index.location} (grace {args.grace:g} days)", highlight=False)
    swept = sweep(index.storage, grace=timedelta(days=args.grace))
    for blob in swept.deleted:
        console.print(f"  deleted {blob}", highlight=False)
    console.print(f"{index.location}: {swept.describe()}", highlight=False)
    work = tidy(index)
    if work:
        console.print(f"work files: removed {len(work)} that writers killed midway left", highlight=False)
    downloads = _downloads(settings)
    left = [*downloads.stale_downloads(), *downloads.orphans()]
    freed = sum(p.stat().st_size for p in left)
    for leftover in left:
        leftover.unlink(missing_ok=True)
    if left:
        console.print(
            f"downloads: removed {len(left)} files no channel holds or a mirror left ({format_size(freed)})",
            highlight=False,
        )
    return 0


def cmd_list(args: argparse.Namespace, settings: Settings, _console: Console) -> int:
    """Each project, its versions, whether wheelmill built or mirrored it and the GPU archs
    a built wheel carries; then the bytes the channels list against the bytes stored."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.index.roots import Index, usage  # noqa: PLC0415

    channel = _channel(args, settings)
    for project in channel.projects():
        yanked = {f.version for f in project.files if f.yanked is not None}
        versions = [f"{v} (yanked)" if v in yanked else v for v in project.versions]
        origins = sorted({_origin(f) for f in project.files})
        print(f"{project.name}: {', '.join(versions)}  [{'; '.join(origins)}]")
    print(usage(Index.of(settings)).describe())
    return 0


def _origin(entry: FileEntry) -> str:
    """``built, cuda 8.0;9.0+PTX``, ``built`` (a wheel without an arch record) or ``mirrored from URL``."""
    if not entry.built:
        return f"mirrored from {entry.mirrored_from}"
    return f"built, {entry.gpu_archs}" if entry.gpu_archs else "built"
