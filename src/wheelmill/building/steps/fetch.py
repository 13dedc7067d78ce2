"""The fetch step: put the recipe's source, verified, under ``<cell>/src/<recipe>``.

Downloads land in a cache keyed by their sha256 and are checked again on every use; a
mismatch is an ``IntegrityError`` at once, never retried. Network failures raise
``TransientError`` so the step's retry policy can try again.
"""

from __future__ import annotations

import shutil
import tarfile
import urllib.parse
import zipfile
from pathlib import Path

from packaging.utils import InvalidSdistFilename, canonicalize_name, parse_sdist_filename
from packaging.version import Version

from wheelmill.building.context import Outcome, StepContext
from wheelmill.building.headers import pin_header_times
from wheelmill.building.products import Fetched, Sources
from wheelmill.checks import CheckResult
from wheelmill.config import format_size
from wheelmill.errors import CommandFailed, ConfigError, FetchError, IntegrityError, PrecheckError
from wheelmill.inputs.recipes import GitSource, PathSource, SdistSource, UrlSource
from wheelmill.machine.net import IndexFile, download, is_transient, project_files, sha256_of
from wheelmill.machine.process import HostRunner, base_environment
from wheelmill.planning.buildkey import left_out
from wheelmill.planning.spec import CellPlan, RecipeSpec, describe_source
from wheelmill.retry import TransientError


def fetch(ctx: StepContext, spec: RecipeSpec) -> Outcome:
    dest = ctx.run.layout.src / spec.name
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    match spec.source:
        case PathSource(path=path):
            shutil.copytree(path, dest, ignore=left_out(path), symlinks=True)
            root, detail = dest, f"copied {path}"
        case SdistSource() as sdist:
            archive = _fetch_sdist(ctx, sdist)
            root, detail = _unpack(archive, dest), f"{archive.name}, sha256 verified"
        case UrlSource(url=url, sha256=sha256):
            archive = _cached_download(ctx, url, _filename(url), sha256)
            root, detail = _unpack(archive, dest), f"{archive.name}, sha256 verified"
        case GitSource() as git:
            via = _git_checkout(ctx, git, dest)
            root, detail = dest, f"{git.url} at {git.rev}" + (f" (from {via})" if via != git.url else "")
    for patch in spec.patches:
        _apply_patch(ctx, patch, root)
        detail += f", patched with {patch.name}"
    ctx.log.note(f"{pin_header_times(dest)} headers' times fixed (GCC's #pragma once compares them)")
    if spec.subdir:
        root = root / spec.subdir
        if not root.is_dir():
            raise FetchError(
                f"{spec.file}: source.subdir: {spec.subdir} is not in the source",
                fix="point subdir at the package inside the source",
            )
    return Outcome(checks=[CheckResult.passed("source", detail)], made=(Fetched(root=root),))


def describe(plan: CellPlan, spec: RecipeSpec) -> str:
    patches = [str(p.relative_to(plan.root)) if p.is_relative_to(plan.root) else str(p) for p in spec.patches]
    return (
        describe_source(spec.source, plan.root)
        + (f", subdir {spec.subdir}" if spec.subdir else "")
        + (f", patched with {', '.join(patches)}" if patches else "")
    )


def _filename(url: str) -> str:
    return urllib.parse.unquote(urllib.parse.urlparse(url).path.rsplit("/", 1)[-1]) or "source.tar.gz"


def _fetch_sdist(ctx: StepContext, sdist: SdistSource) -> Path:
    sources, log = ctx.done.get(Sources).packages, ctx.log
    locations = [(index, False) for index in sources.indexes()] + [(links, True) for links in sources.find_links]
    for location, flat in locations:
        log.note(f"looking for {sdist.project}=={sdist.version} at {location}")
        match = _pick_sdist(project_files(location, sdist.project, flat=flat), sdist)
        if match is None:
            continue
        if match.sha256 and match.sha256 != sdist.sha256:
            raise IntegrityError(
                f"{match.url}: the index lists sha256 {match.sha256}, the recipe pins {sdist.sha256}",
                fix="the release was replaced or the pin is wrong; check it before updating sha256",
            )
        return _cached_download(ctx, match.url, match.filename, sdist.sha256)
    raise FetchError(
        f"sdist {sdist.project}=={sdist.version} is on none of: {', '.join(loc for loc, _ in locations) or 'no index'}",
        fix="check the project and version, or set WHEELMILL_INDEX_URL to an index that has it",
    )


def _pick_sdist(files: list[IndexFile], sdist: SdistSource) -> IndexFile | None:
    want_name, want_version = canonicalize_name(sdist.project), Version(sdist.version)
    for file in files:
        try:
            name, version = parse_sdist_filename(file.filename)
        except InvalidSdistFilename:
            continue
        if name == want_name and version == want_version:
            return file
    return None


def _cached_download(ctx: StepContext, url: str, filename: str, sha256: str) -> Path:
    cached, log = ctx.run.layout.cache / "sources" / sha256 / filename, ctx.log
    if cached.is_file():
        if sha256_of(cached) == sha256:
            log.note(f"cache hit {cached}")
            return cached
        cached.unlink()  # corrupt cache entry: fetch again
    log.note(f"downloading {url}")

    def progress(done: int, total: int | None) -> None:
        ctx.run.on_line(f"downloaded {format_size(done)}" + (f" of {format_size(total)}" if total else ""))

    try:
        return download(url, cached, sha256=sha256, on_progress=progress)
    except TransientError as exc:
        log.note(f"transient failure: {exc}")
        raise


def _unpack(archive: Path, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    if archive.name.endswith(".zip"):
        try:
            with zipfile.ZipFile(archive) as zf:
                for name in zf.namelist():
                    if not (dest / name).resolve().is_relative_to(dest.resolve()):
                        raise IntegrityError(
                            f"{archive.name}: unsafe path {name!r} in the archive", fix="do not use this archive"
                        )
                zf.extractall(dest)  # noqa: S202 - every member was checked to stay inside dest
        except (zipfile.BadZipFile, OSError) as exc:
            raise IntegrityError(f"{archive.name}: cannot unpack: {exc}", fix="check the archive") from None
    else:
        try:
            with tarfile.open(archive) as tf:
                if hasattr(tarfile, "data_filter"):
                    tf.extractall(dest, filter="data")  # the "data" filter refuses unsafe members
                else:  # a CPython before 3.11.4 (Debian 12's 3.11.2): no filters; each member checked here
                    _refuse_unsafe(archive, tf.getmembers(), dest)
                    tf.extractall(dest)  # noqa: S202 - every member was checked to stay inside dest
        except (tarfile.TarError, OSError) as exc:
            raise IntegrityError(f"{archive.name}: cannot unpack: {exc}", fix="check the archive") from None
    entries = list(dest.iterdir())
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else dest


def _refuse_unsafe(archive: Path, members: list[tarfile.TarInfo], dest: Path) -> None:
    """What the "data" filter refuses: a member outside ``dest``, a link that leads outside
    it, a device or a pipe."""
    root = dest.resolve()
    for member in members:
        target = (dest / member.name).resolve()
        linked = (target.parent / member.linkname).resolve() if member.issym() else (dest / member.linkname).resolve()
        unsafe = (
            not target.is_relative_to(root)
            or ((member.issym() or member.islnk()) and not linked.is_relative_to(root))
            or not (member.isfile() or member.isdir() or member.issym() or member.islnk())
        )
        if unsafe:
            raise IntegrityError(
                f"{archive.name}: unsafe member {member.name!r} in the archive", fix="do not use this archive"
            )


def git_config(mirrors: tuple[tuple[str, str], ...]) -> list[str]:
    """git's own redirection, so submodules follow too: ``-c url.<mirror>.insteadOf=<upstream>``.
    A file:// mirror needs file transport allowed for submodules (git refuses it by default
    since 2.38.1).

    >>> git_config((("https://github.com/", "file:///srv/git/"),))
    ['-c', 'url.file:///srv/git/.insteadOf=https://github.com/', '-c', 'protocol.file.allow=always']
    """
    argv = [arg for upstream, mirror in mirrors for arg in ("-c", f"url.{mirror}.insteadOf={upstream}")]
    if any(mirror.startswith(("file://", "/")) for _, mirror in mirrors):
        argv += ["-c", "protocol.file.allow=always"]
    return argv


def _local_mirror_exists(url: str, via: str) -> None:
    """A mirror on this machine (a path, a file:// URL) that is not there is a setting to fix,
    said at once, not a network failure to retry."""
    if not via.startswith(("file://", "/")):
        return
    path = Path(urllib.parse.urlparse(via).path if via.startswith("file://") else via)
    if not path.exists():
        raise FetchError(
            f"git {url}: its mirror {via} does not exist (WHEELMILL_GIT_MIRRORS)",
            fix=f"make the mirror (git clone --mirror {url} {path}) or correct WHEELMILL_GIT_MIRRORS",
        )


def mirrored_url(url: str, mirrors: tuple[tuple[str, str], ...]) -> str:
    """Where git will fetch ``url`` from: the longest matching upstream prefix wins, as in git.

    >>> mirrored_url("https://github.com/pytorch/vision", (("https://github.com/", "file:///m/"),))
    'file:///m/pytorch/vision'
    """
    matches = [(upstream, mirror) for upstream, mirror in mirrors if url.startswith(upstream)]
    if not matches:
        return url
    upstream, mirror = max(matches, key=lambda pair: len(pair[0]))
    return mirror + url[len(upstream) :]


def _git_checkout(ctx: StepContext, git: GitSource, dest: Path) -> str:
    """Clone and check out the pinned commit (and its submodules) on this machine, where the
    site's mirrors and credentials are; the build then sees the tree. Returns the URL used."""
    if shutil.which("git") is None:
        raise FetchError(
            f"git {git.url}: git is not installed on this machine", fix="install git (apt-get install git)"
        )
    env, runner, log = base_environment([], {"GIT_TERMINAL_PROMPT": "0"}), HostRunner(), ctx.log
    mirrors = ctx.run.settings.git_mirrors
    git_argv, via = ["git", *git_config(mirrors)], mirrored_url(git.url, mirrors)
    if via != git.url:
        log.note(f"{git.url} is fetched from its mirror {via} (WHEELMILL_GIT_MIRRORS)")
        _local_mirror_exists(git.url, via)
    where = f"{git.url}" + (f" (mirror {via})" if via != git.url else "")
    try:
        runner.run(
            [*git_argv, "clone", "--progress", "--no-checkout", "--filter=blob:none", git.url, str(dest)],
            env=env,
            log=log,
        )
        runner.run([*git_argv, "-C", str(dest), "checkout", "--progress", "--detach", git.rev], env=env, log=log)
        if git.submodules:
            runner.run(
                [*git_argv, "-C", str(dest), "submodule", "update", "--progress", "--init", "--recursive"],
                env=env,
                log=log,
            )
        head = runner.run(
            ["git", "-C", str(dest), "rev-parse", "HEAD"], env=env, log=log, keep_output=True
        ).output.strip()
    except CommandFailed as failed:
        shutil.rmtree(dest, ignore_errors=True)
        if is_transient("\n".join(failed.tail)) or "could not read from remote" in "\n".join(failed.tail).lower():
            raise TransientError(f"git {where}: {failed.last_line()}") from None
        raise FetchError(
            f"git {where} at {git.rev}: {failed.last_line()}",
            fix="check the URL, the mirror setting and that the commit exists there",
        ) from None
    if head != git.rev:
        raise IntegrityError(f"git {git.url}: checked out {head}, not {git.rev}", fix="pin a full commit id")
    return via


def _apply_patch(ctx: StepContext, patch: Path, root: Path) -> None:
    """A recipe's patch, applied once to the verified source; one that does not apply is
    a recipe out of date with its source, never ignored."""
    if shutil.which("patch") is None:
        raise PrecheckError(
            f"{patch.name}: the patch program is not installed on this machine",
            fix="install patch (apt-get install patch)",
        )
    argv = [
        "patch",
        "-p1",
        "--forward",
        "--batch",
        "--no-backup-if-mismatch",
        "--directory",
        str(root),
        "--input",
        str(patch),
    ]
    try:
        HostRunner().run(argv, env=base_environment([]), log=ctx.log)
    except CommandFailed as failed:  # the recipe is out of date with its source: nothing failed to download
        raise ConfigError(
            f"{patch}: does not apply to the source: {failed.last_line()}",
            fix="refresh the patch for this version of the source",
        ) from None
