"""The runtime closure of a cell, and mirroring it into the cell's channel, so that a
consumer who names the channel as its only index installs everything from it.

The closure is the exact torch the cell built against and every dependency, transitively,
of every wheel the cell publishes, for the cell's Python and platform: wheels only,
resolved by uv from the sources the build uses, and recorded as a PEP 751 lock beside the
cell's report (``<cell>/pylock.closure.toml``): one wheel per package, its URL, its sha256.
Projects built in the channel are resolved against the built wheels (offered first, in an
index of their own: uv takes a project from the first index that has it) and are never
mirrored: built beats mirrored.

Mirroring downloads every other wheel of the lock into the mirror's download area (each
retried with backoff, its sha256 checked against the lock, a mismatch never retried) and
only when all of them are there publishes them into the channel, marked as mirrored: a
failed download leaves the channel as it was.
"""

from __future__ import annotations

import datetime
import html
import os
import re
import shutil
import sys
import tomllib
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from wheelmill.config import format_size
from wheelmill.errors import CommandFailed, EnvError, FetchError, IntegrityError, PrecheckError
from wheelmill.files import Linked, write_all, write_atomic
from wheelmill.index.channels import Published, now_rfc3339
from wheelmill.index.downloads import Downloads
from wheelmill.index.objects import ObjectChannel, publish
from wheelmill.inputs.manylinux import oldest_glibc
from wheelmill.inputs.variants import X86_64
from wheelmill.machine.envs import EnvBackend, Target
from wheelmill.machine.net import download, is_transient, sha256_of, split_credentials
from wheelmill.machine.package_sources import PackageSources
from wheelmill.machine.process import StepLog
from wheelmill.output.layout import CellLayout
from wheelmill.output.report import ReportError, found_beside, load_report
from wheelmill.provenance.mirroring import MirrorSigner
from wheelmill.retry import RetryPolicy, TransientError, with_retries

_BUILT_LINE = "# built here, not mirrored: "


@dataclass(frozen=True, kw_only=True)
class ClosureInputs:
    """What a cell's closure is resolved from."""

    cell: str
    channel: ObjectChannel
    python: str  # 3.11
    glibc: str  # the variant's baseline, manylinux_2_28
    machine: str  # the variant's platform, x86_64 or aarch64
    torch: str  # the exact version the cell built against
    wheels: tuple[Path, ...]  # what the cell published (or would)
    sources: PackageSources  # what the build resolved its env from
    toolkit: tuple[str, ...] = ()  # the variant's toolkit wheels (pinned): the devel image installs them


@dataclass(frozen=True, kw_only=True)
class LockedWheel:
    project: str  # normalized
    version: str
    filename: str
    url: str
    sha256: str
    size: int | None
    upload_time: str | None  # RFC 3339, where the upstream index gave one


@dataclass(frozen=True, kw_only=True)
class Closure:
    """A cell's runtime closure, as its lock says."""

    path: Path
    wheels: tuple[LockedWheel, ...]
    built: frozenset[str]  # projects taken from the channel's (or the cell's) built wheels

    @property
    def to_mirror(self) -> tuple[LockedWheel, ...]:
        return tuple(w for w in self.wheels if w.project not in self.built)

    def facts(self) -> dict[str, Any]:
        mirror_bytes = _bytes(self.to_mirror)
        return {
            "closure": {
                "lock": str(self.path),
                "wheels": len(self.wheels),
                "built": sorted(self.built),
                "mirror_bytes": mirror_bytes,
            }
        }

    def describe(self) -> str:
        size = _bytes(self.to_mirror)
        to_mirror = f"{len(self.to_mirror)} to mirror" + (f", {format_size(size)}" if size else "")
        return f"{len(self.wheels)} wheels ({len(self.built)} built here, {to_mirror}); lock {self.path}"


@dataclass(frozen=True, kw_only=True)
class Mirrored:
    """What mirroring a closure did."""

    channel: str
    published: tuple[Published, ...]
    fetched_bytes: int  # downloaded now; the rest was in the download area already

    def facts(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for done in self.published:
            counts[done.outcome.value] = counts.get(done.outcome.value, 0) + 1
        return {"mirror": {"channel": self.channel, **counts, "fetched_bytes": self.fetched_bytes}}

    def describe(self) -> str:
        counts = self.facts()["mirror"]
        parts = [f"{n} {what}" for what, n in counts.items() if what not in ("channel", "fetched_bytes")]
        return (
            f"{', '.join(parts) or 'nothing to mirror'} in channel {self.channel}; "
            f"downloaded {format_size(self.fetched_bytes)}"
        )


def inputs_of_report(
    layout: CellLayout,
    *,
    channel_of: Callable[[str], ObjectChannel],
    glibc: str,
    machine: str,
    toolkit: tuple[str, ...] = (),
) -> ClosureInputs:
    """The closure inputs of a cell built earlier, from its report: the wheels it delivered
    (found beside the report, still the bytes it tested), the torch it built against, the
    sources it used."""
    report = layout.report
    try:
        built = load_report(report, cell=layout.cell)
        torch, args = built.torch, built.package_source_args
    except FileNotFoundError:
        raise PrecheckError(
            f"{report}: no report: the cell was not built here", fix="build it first: wheelmill build --cell <cell>"
        ) from None
    except (OSError, ReportError, KeyError, TypeError) as exc:
        raise PrecheckError(f"{report}: not a report of a built cell ({exc})", fix="build the cell again") from None
    wheels = built.delivered
    if not wheels:
        raise PrecheckError(f"{report}: the cell delivered no wheel", fix="build it: wheelmill build --cell <cell>")
    paths = []
    for wheel in wheels:
        path = found_beside(layout, wheel)
        if path is None:
            raise PrecheckError(
                f"{report}: {layout.dist / wheel.name} is gone or not the wheel the report describes",
                fix="build the cell again",
            )
        paths.append(path)
    return ClosureInputs(
        cell=built.cell,
        channel=channel_of(built.channel),
        python=built.python,
        glibc=glibc,
        machine=machine,
        torch=torch,
        wheels=tuple(paths),
        sources=PackageSources.from_uv_args(list(args), f"the sources of {report}"),
        toolkit=toolkit,
    )


def platform_of(glibc: str, wheels: Iterable[Path], machine: str = X86_64) -> str:
    """uv's platform for the closure: the variant's machine and glibc baseline, raised to
    what the most demanding of the cell's wheels needs (a consumer needs that glibc anyway).

    >>> platform_of("manylinux_2_28", [Path("t-1-cp311-cp311-manylinux_2_31_x86_64.whl")])
    'x86_64-manylinux_2_31'
    >>> platform_of("manylinux_2_28", [Path("t-1-cp311-cp311-manylinux2014_aarch64.whl")], "aarch64")
    'aarch64-manylinux_2_28'
    """
    needs = [oldest_glibc([f"{glibc}_{machine}"]) or (2, 17)]
    needs += [
        found
        for wheel in wheels
        if (found := oldest_glibc(tag.platform for tag in parse_wheel_filename(wheel.name)[3]))
    ]
    major, minor = max(needs)
    return f"{machine}-manylinux_{major}_{minor}"


def requirements(inputs: ClosureInputs) -> list[str]:
    """Each published wheel at its version, and the torch the cell built against (unless
    the cell built torch itself: then that one); then the variant's toolkit wheels."""
    pins = {}
    for wheel in inputs.wheels:
        name, version, *_ = parse_wheel_filename(wheel.name)
        pins[name] = f"{name}=={version}"
    return [*sorted(pins.values()), *([] if "torch" in pins else [f"torch=={inputs.torch}"]), *inputs.toolkit]


def built_wheels(inputs: ClosureInputs, scratch: Path) -> dict[str, tuple[Path, str]]:
    """Every wheel built here that the closure may take: the channel's built files (where
    the index keeps them, or fetched into ``scratch``) and the cell's own; filename -> (where
    it is, its sha256)."""
    found: dict[str, tuple[Path, str]] = {}
    channel = inputs.channel
    for project in channel.projects() if channel.exists() else ():
        for entry in project.files:
            path = channel.local_file(entry) if entry.built else None
            if entry.built and path is None:
                scratch.mkdir(parents=True, exist_ok=True)
                path = scratch / entry.filename if channel.fetch(entry, scratch / entry.filename) else None
            if path is not None:
                found[entry.filename] = (path.resolve(), entry.sha256)
    for wheel in inputs.wheels:
        if wheel.name not in found:  # published already: its hash is on the page
            found[wheel.name] = (wheel.resolve(), sha256_of(wheel))
    return found


def write_built_index(directory: Path, built: dict[str, tuple[Path, str]]) -> str:
    """A PEP 503 index of the built wheels, linking each where it lies; its URL."""
    by_project: dict[str, list[str]] = {}
    for filename, (path, sha256) in sorted(built.items()):
        link = f'<a href="{html.escape(path.as_uri())}#sha256={sha256}">{html.escape(filename)}</a><br>'
        by_project.setdefault(str(parse_wheel_filename(filename)[0]), []).append(link)
    for project, links in by_project.items():
        page = directory / "simple" / project / "index.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text("<!DOCTYPE html>\n<html><body>\n" + "\n".join(links) + "\n</body></html>\n", encoding="utf-8")
    (directory / "simple").mkdir(parents=True, exist_ok=True)
    return (directory / "simple").resolve().as_uri()


def resolve(inputs: ClosureInputs, *, backend: EnvBackend, log: StepLog, work: Path, lock: Path) -> Closure:
    """Resolve the closure of ``inputs`` and write its lock; the closure."""
    work.mkdir(parents=True, exist_ok=True)
    built = built_wheels(inputs, work / "fetched")
    sources = inputs.sources.first(write_built_index(work / "built", built), "the channel's built wheels")
    pins = requirements(inputs)
    wanted = work / "closure.in"
    wanted.write_text("\n".join(pins) + "\n", encoding="utf-8")
    resolved = work / "pylock.resolved.toml"
    target = Target(python=inputs.python, platform=platform_of(inputs.glibc, inputs.wheels, inputs.machine))
    log.note(f"resolving {', '.join(pins)} for Python {target.python} on {target.platform} from {sources.describe()}")
    try:
        backend.lock_wheels(wanted, resolved, target=target, sources=sources, log=log, interpreter=Path(sys.executable))
    except CommandFailed as failed:
        if is_transient("\n".join(failed.tail)):  # after uv's own retries
            raise FetchError(
                f"{inputs.cell}: the package sources did not answer while resolving the closure: {failed.last_line()}",
                fix="check the network and the package sources; nothing was mirrored",
            ) from None
        raise EnvError(
            f"{inputs.cell}: cannot resolve the runtime closure from wheels: {failed.last_line()}",
            fix="every dependency must have a wheel for this Python and platform in the package sources",
        ) from None
    built_projects = sorted({str(parse_wheel_filename(f)[0]) for f in built})
    header = (
        f"# wheelmill runtime closure of {inputs.cell}: {', '.join(pins)}; target {target.python} {target.platform}\n"
    )
    text = resolved.read_text(encoding="utf-8")
    write_atomic(lock, (header + _BUILT_LINE + ", ".join(built_projects) + "\n" + text).encode())
    closure = read(lock)
    taken = {w.project for w in closure.wheels}
    return Closure(path=lock, wheels=closure.wheels, built=frozenset(p for p in built_projects if p in taken))


def read(lock: Path) -> Closure:
    """A closure lock, checked: every package a wheel with a sha256 (an sdist is refused)."""
    try:
        text = lock.read_text(encoding="utf-8")
        data = tomllib.loads(text)
    except (OSError, ValueError) as exc:
        raise EnvError(
            f"{lock}: not a readable lock ({exc})", fix="resolve it again: wheelmill mirror --cell <cell>"
        ) from None
    built_line = next((line for line in text.splitlines() if line.startswith(_BUILT_LINE)), _BUILT_LINE)
    built = frozenset(p.strip() for p in built_line.removeprefix(_BUILT_LINE).split(",") if p.strip())
    # uv resolved for the cell's one target: every package in it applies there.
    wheels = [wheel for package in data.get("packages", []) for wheel in _wheels(lock, package)]
    return Closure(path=lock, wheels=tuple(wheels), built=built)


def _wheels(lock: Path, package: dict[str, Any]) -> list[LockedWheel]:
    name = str(package.get("name", "?"))
    wheels = package.get("wheels") or []
    if not wheels:
        raise EnvError(
            f"{lock}: {name} has no wheel in the lock (an sdist is never mirrored)",
            fix=f"make a wheel of {name} available in the package sources",
        )
    out = []
    for wheel in wheels:
        url, sha256 = str(wheel.get("url", "")), str(wheel.get("hashes", {}).get("sha256", ""))
        filename = urllib.parse.unquote(urllib.parse.urlparse(url).path.rsplit("/", 1)[-1])
        try:
            project, version, *_ = parse_wheel_filename(filename)
        except InvalidWheelFilename:
            raise EnvError(
                f"{lock}: {name}: {filename!r} is not a wheel's name", fix="resolve the closure again"
            ) from None
        if not re.fullmatch(r"[0-9a-f]{64}", sha256):
            raise EnvError(f"{lock}: {filename} has no sha256", fix="resolve the closure again")
        uploaded = wheel.get("upload-time")
        out.append(
            LockedWheel(
                project=str(project),
                version=str(version),
                filename=filename,
                url=url,
                sha256=sha256,
                size=wheel.get("size"),
                upload_time=_rfc3339(uploaded) if isinstance(uploaded, datetime.datetime) else None,
            )
        )
    return out


def _rfc3339(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _bytes(wheels: Sequence[LockedWheel]) -> int:
    return sum(w.size or 0 for w in wheels)


def mirror(
    closure: Closure,
    channel: ObjectChannel,
    *,
    downloads: Path,
    sources: PackageSources,
    policy: RetryPolicy,
    log: StepLog,
    on_line: Callable[[str], None],
    signer: MirrorSigner | None = None,
) -> Mirrored:
    """Download what the closure needs from upstream into the download area under
    ``downloads`` (kept there: the next cell needs the same torch), every file verified,
    then publish it all into ``channel`` as mirrored, each with the statement ``signer``
    signs of its upstream sha256 where one is given (a file listed unsigned learns it).
    Projects built in the channel are left out (the channel says so again at publish time)."""
    area = Downloads(downloads)
    wanted = [w for w in closure.to_mirror if not _built_in(channel, w.project)]
    missing = {w.sha256 for w in wanted if not area.holds(w.sha256)}
    digests = local_digests([w for w in wanted if w.sha256 in missing])
    fetched = 0
    for number, wheel in enumerate(wanted, start=1):
        if wheel.sha256 not in missing:
            log.note(f"[{number}/{len(wanted)}] {wheel.filename}: in the store already")
            continue
        on_line(
            f"mirror [{number}/{len(wanted)}] {wheel.filename}"
            + (f" ({format_size(wheel.size)})" if wheel.size else "")
        )
        _fetch(wheel, area, sources=sources, policy=policy, log=log, digests=digests)
        fetched += area.path_of(wheel.sha256).stat().st_size
        missing.discard(wheel.sha256)  # the same bytes under two names: stored once
    published = tuple(_publish(channel, area, wheel, signer) for wheel in wanted)
    for done in published:
        log.note(f"{done.outcome}: {channel.name}/{done.filename}")
    return Mirrored(channel=channel.name, published=published, fetched_bytes=fetched)


def local_digests(wheels: Sequence[LockedWheel]) -> dict[Path, str]:
    """The sha256 of the wheels that are files on this machine, computed side by side:
    hashing a closure's gigabytes is most of mirroring it from a local source, and hashlib
    lets threads run at once. A file that cannot be read is left out (its check says why)."""

    def digest(path: Path) -> str | None:
        try:
            return sha256_of(path)
        except OSError:
            return None

    local = sorted({path for w in wheels if (path := _local_file(w.url)) is not None})
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return {path: found for path, found in zip(local, pool.map(digest, local), strict=True) if found}


def _built_in(channel: ObjectChannel, project: str) -> bool:
    found = channel.project(project) if channel.exists() else None
    return found is not None and any(f.built for f in found.files)


def _fetch(
    wheel: LockedWheel,
    downloads: Downloads,
    *,
    sources: PackageSources,
    policy: RetryPolicy,
    log: StepLog,
    digests: Mapping[Path, str],
) -> None:
    shown = _without_credentials(wheel.url)
    local = _local_file(wheel.url)
    if local is not None:
        _link_local(wheel, local, downloads, log, digest=digests.get(local))
        return

    def attempt(_number: int) -> Path:
        return download(
            wheel.url,
            downloads.path_of(wheel.sha256),
            sha256=wheel.sha256,
            auth=_auth_for(wheel.url, sources),
            tmp_dir=downloads.incoming,
        )

    def on_retry(attempt: int, error: Exception, pause: float) -> None:
        log.note(f"{wheel.filename}: attempt {attempt} failed: {error}; retrying in {pause:.1f}s")

    downloads.path_of(wheel.sha256).parent.mkdir(parents=True, exist_ok=True)
    try:
        with_retries(attempt, policy=policy, on_retry=on_retry)
    except TransientError as exc:
        raise FetchError(
            f"mirror: {shown} is unreachable after {policy.attempts} attempts: {exc}",
            fix="check the package sources and the network (WHEELMILL_RETRIES sets the attempts); "
            "the channel is unchanged",
        ) from None
    except IntegrityError as exc:
        raise IntegrityError(
            f"mirror: {wheel.filename}: {exc.message}", fix=f"{exc.fix}; the channel is unchanged"
        ) from None
    log.note(f"{wheel.filename}: downloaded from {shown}, sha256 {wheel.sha256} as locked")


def _local_file(url: str) -> Path | None:
    """The path of a ``file://`` URL (a package source on this machine's disk), else None.

    >>> _local_file("file:///srv/wheels/files/a-1.0-py3-none-any.whl"), _local_file("https://m.example/a.whl")
    (PosixPath('/srv/wheels/files/a-1.0-py3-none-any.whl'), None)
    """
    parsed = urllib.parse.urlsplit(url)
    return Path(urllib.request.url2pathname(parsed.path)) if parsed.scheme == "file" else None


def _link_local(
    wheel: LockedWheel, source: Path, downloads: Downloads, log: StepLog, *, digest: str | None = None
) -> None:
    """A wheel already on this machine's disk: its sha256 (``digest``, where it was computed
    already) checked, then stored as another name of the same file where the file system
    allows (no second copy of a closure's gigabytes), else copied. A source rewritten in
    place would change the stored bytes too; ``wheelmill index verify`` finds that, and
    package sources replace files, not rewrite them."""
    if not source.is_file():
        raise FetchError(
            f"mirror: {source}: no such file (the lock's URL for {wheel.filename})",
            fix="check the package sources, then lock again",
        )
    actual = digest or sha256_of(source)
    if actual != wheel.sha256:
        raise IntegrityError(
            f"mirror: {wheel.filename}: {source}: sha256 mismatch: expected {wheel.sha256} (the lock's), got {actual}",
            fix="the file changed or was tampered with; check the source and lock again only if you trust it; "
            "the channel is unchanged",
        )
    downloads.path_of(wheel.sha256).parent.mkdir(parents=True, exist_ok=True)
    write_all({downloads.path_of(wheel.sha256): Linked(source)}, tmp_dir=downloads.incoming)
    log.note(
        f"{wheel.filename}: stored from {source} (linked where the file system allows), sha256 {wheel.sha256} as locked"
    )


def _publish(
    channel: ObjectChannel, downloads: Downloads, wheel: LockedWheel, signer: MirrorSigner | None
) -> Published:
    """Publish a stored wheel under its own name: another name of the download, briefly,
    handed to the index (a tree keeps it as one more name of the same bytes)."""
    staged = downloads.incoming / f"{os.getpid()}" / wheel.filename
    staged.parent.mkdir(parents=True, exist_ok=True)
    staged.unlink(missing_ok=True)
    try:
        os.link(downloads.path_of(wheel.sha256), staged)
    except OSError:  # a file system without hard links
        shutil.copyfile(downloads.path_of(wheel.sha256), staged)
    upstream = _without_credentials(wheel.url)
    try:
        upload_time = wheel.upload_time or now_rfc3339()
        return publish(
            channel,
            staged,
            upload_time=upload_time,
            mirrored_from=upstream,
            sha256=wheel.sha256,
            provenance=signer(wheel.filename, wheel.sha256, upstream) if signer else None,
            handed_over=True,
        )
    finally:
        staged.unlink(missing_ok=True)


def _without_credentials(url: str) -> str:
    """
    >>> _without_credentials("https://ci:secret@mirror.example/files/a.whl")
    'https://mirror.example/files/a.whl'
    """
    return split_credentials(url)[0]


def _auth_for(url: str, sources: PackageSources) -> tuple[str, str] | None:
    """The credentials a package source gives for ``url``'s host (uv leaves them out of
    the URLs it locks)."""
    host = urllib.parse.urlsplit(url).hostname
    for source in (*sources.extra_index_urls, *([sources.index_url] if sources.index_url else []), *sources.find_links):
        _bare, username, password = split_credentials(source)
        if username and urllib.parse.urlsplit(source).hostname == host:
            return username, password or ""
    return None
