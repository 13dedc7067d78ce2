"""The compiler cache (sccache) of a cell's builds: its server, the variables a build needs
to use it, and what it says it did.

A build runs without network (a network namespace of this machine, or the cell's netless
container), where sccache's client cannot reach a server on loopback, nor a server there a
remote cache. So one server per cell runs where the network is (this machine, or the
cell's online container) and listens on a Unix socket in the cell's directory, which both
sides see at the same path on the output mount; the compile clients reach it there. The
server runs each compiler with the client's arguments, environment and working directory,
so a build's files, its temporary ones included, live on that mount too.

Where the cache lives: local disk under the output root, then the shared tiers the settings
choose (``cache_tiers``); without them, sccache's own configuration, the caller's
``SCCACHE_*`` variables (S3, Redis, the GitHub Actions cache, ...). A cache that cannot be
reached is never a failed build: the builds compile without it and the cell says so once.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from wheelmill.building.cache_tiers import DISK, Tiers, credential_files
from wheelmill.checks import CheckResult
from wheelmill.files import copy_atomic
from wheelmill.machine.process import Runner, StepLog, base_environment, terminate

CHECK = "compiler-cache"  # the name of its verdicts
# What sccache reads to find and reach a remote cache: its own variables, the AWS
# credentials its S3 backend reads, and the GitHub Actions cache service's (GITHUB_SERVER_URL
# included).
REMOTE_PREFIXES = ("SCCACHE_", "AWS_", "ACTIONS_", "GITHUB_SERVER_URL")
# What wheelmill decides itself, whatever the caller's environment says.
OWN = frozenset(
    {"SCCACHE_SERVER_UDS", "SCCACHE_SERVER_PORT", "SCCACHE_START_SERVER", "SCCACHE_NO_DAEMON", "SCCACHE_IDLE_TIMEOUT"}
)
# A Unix socket's path is at most 107 bytes (sun_path is 108 with its NUL).
SOCKET_PATH_MAX = 107
STARTUP_SECONDS = 15.0  # sccache's own client waits 10 s for a server
# A backstop only: the cell stops its server when it ends; one whose wheelmill was killed
# goes away after an hour without a compile.
IDLE_TIMEOUT = "3600"


@dataclass(frozen=True, kw_only=True)
class CompilerCache:
    """The cell's compiler cache as its builds see it: the client binary and the server's
    socket, or why the builds compile without it."""

    binary: Path | None = None
    socket: Path | None = None
    location: str = ""  # where the server keeps the cache, as it says
    tiers: tuple[str, ...] = (DISK,)  # the chain the server was given (local disk alone without a tiers setting)
    read_only: bool = False  # its shared tiers are read, never written
    without: str | None = None  # why there is none
    server: Server | None = field(default=None, compare=False, repr=False)  # the cell's, to restart

    @classmethod
    def off(cls, why: str) -> CompilerCache:
        return cls(without=why)

    def client_environment(self, tmp: Path) -> dict[str, str]:
        """What a build needs to compile through the cache. torch's cpp_extension prefixes
        the C++ compiler and nvcc itself with the sccache it finds on PATH (``_wrap_compiler``;
        so CC/CXX stay unset: it would wrap them a second time, and ``sccache sccache cc``
        fails); CMake reads its launchers from the environment. ``tmp``: temporary files on
        the mount the server sees too (setuptools' flag probes compile there)."""
        if not self.active:
            return {}
        launcher = str(self.binary)
        return {
            "SCCACHE_SERVER_UDS": str(self.socket),
            # A server that went away mid-build: compile here rather than fail the build.
            "SCCACHE_IGNORE_SERVER_IO_ERROR": "1",
            "CMAKE_C_COMPILER_LAUNCHER": launcher,
            "CMAKE_CXX_COMPILER_LAUNCHER": launcher,
            "CMAKE_CUDA_COMPILER_LAUNCHER": launcher,
            # nvcc's -MD makes every cache hit run the preprocessor again (about twice the
            # time of a hit without it); its depfile serves ninja's incremental rebuilds,
            # and a build here always starts from a clean build directory.
            "TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES": "1",
            "TMPDIR": str(tmp),
        }

    @property
    def active(self) -> bool:
        return self.binary is not None and self.socket is not None and self.without is None

    @property
    def chained(self) -> bool:
        """Whether the server runs a chain of tiers (the settings named shared ones), whose
        hits sccache counts by tier."""
        return self.tiers != (DISK,)

    def path(self) -> list[Path]:
        """The directory to put on a build's PATH: the binary's, which holds nothing else."""
        return [self.binary.parent] if self.active and self.binary is not None else []


@dataclass(frozen=True, kw_only=True)
class CacheStats:
    """What the server counted for one build (zeroed before it): by language
    (``C/C++``, ``CUDA``, ``PTX``, ``CUBIN``), by tier where it has several (which tier
    served each hit), and the calls it could not cache."""

    hits: Mapping[str, int] = field(default_factory=dict)
    misses: Mapping[str, int] = field(default_factory=dict)
    # Hits by tier (disk, redis, s3); None where sccache counts none (one tier, or a
    # read-only chain: mozilla/sccache#2773).
    tiers: Mapping[str, int] | None = None
    read_errors: int = 0  # cache reads that failed or timed out: compiled anyway
    write_errors: int = 0  # what it compiled and could not store
    not_cached: int = 0  # links, unsupported compilers or arguments: run, never cached
    location: str = ""
    read_only: bool = False  # the shared tiers were read-only: a write refused is no error

    @classmethod
    def parse(cls, text: str) -> CacheStats:
        """From ``sccache --show-stats --stats-format=json``.

        >>> s = CacheStats.parse('{"stats": {"cache_hits": {"counts": {"C/C++": 2}}, "cache_misses": {"counts": {}},'
        ...     ' "cache_read_errors": 1, "requests_not_cacheable": 3}, "cache_location": "Local disk: \\\\"/c\\\\""}')
        >>> s.total_hits, s.total_misses, s.errors, s.not_cached, s.location, s.tiers
        (2, 0, 1, 3, 'Local disk: "/c"', None)
        """
        data = json.loads(text)
        stats: Mapping[str, Any] = data.get("stats") or {}
        read_errors = sum(int(stats.get(key) or 0) for key in ("cache_read_errors", "cache_timeouts"))
        not_cached = sum(
            int(stats.get(key) or 0)
            for key in ("requests_not_cacheable", "requests_unsupported_compiler", "non_cacheable_compilations")
        )
        return cls(
            hits=_counts(stats, "cache_hits"),
            misses=_counts(stats, "cache_misses"),
            tiers=_tier_hits(stats.get("multi_level")),
            read_errors=read_errors,
            write_errors=int(stats.get("cache_write_errors") or 0),
            not_cached=not_cached,
            location=str(data.get("cache_location", "")),
        )

    def since(self, before: CacheStats | None) -> CacheStats:
        """These counts less ``before``'s by tier: sccache zeroes the others, not those."""
        if before is None or before.tiers is None or self.tiers is None:
            return self
        return replace(self, tiers={tier: n - before.tiers.get(tier, 0) for tier, n in self.tiers.items()})

    @property
    def total_hits(self) -> int:
        return sum(self.hits.values())

    @property
    def total_misses(self) -> int:
        return sum(self.misses.values())

    @property
    def errors(self) -> int:
        """Reads and writes that failed; a write a read-only chain refused is none: sccache
        0.16 refuses every write of a chain with a read-only tier (mozilla/sccache#2773)."""
        return self.read_errors + (0 if self.read_only else self.write_errors)

    def describe(self) -> str:
        by_tier = f" ({_tier_list(self.tiers)})" if self.tiers else ""
        extra = "".join(
            f", {n} {what}"
            for n, what in (
                (self.errors, "cache errors"),
                (self.not_cached, "not cacheable"),
                (self.write_errors if self.read_only else 0, "not stored (read-only)"),
            )
            if n
        )
        return f"{self.total_hits} hits{by_tier}, {self.total_misses} misses{extra}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "hits": self.total_hits,
            "misses": self.total_misses,
            "hits_by_language": dict(self.hits),
            "misses_by_language": dict(self.misses),
            "hits_by_tier": dict(self.tiers) if self.tiers is not None else None,
            "read_only": self.read_only,
            "errors": self.errors,
            "not_cached": self.not_cached,
            "location": self.location,
        }


def _counts(stats: Mapping[str, Any], key: str) -> dict[str, int]:
    counts = (stats.get(key) or {}).get("counts") or {}
    return {str(language): int(n) for language, n in sorted(counts.items())}


def _tier_hits(levels: Any) -> dict[str, int] | None:
    """Hits by tier from sccache's multi-level figures (``[{"name": "L0 (disk)", "hits": 3}, ...]``).

    >>> _tier_hits([{"name": "L0 (disk)", "hits": 3}, {"name": "L1 (redis)", "hits": 1}]), _tier_hits(None)
    ({'disk': 3, 'redis': 1}, None)
    """
    if not isinstance(levels, list):
        return None
    entries = [level for level in levels if isinstance(level, dict)]
    return {_tier_name(level, index): int(level.get("hits") or 0) for index, level in enumerate(entries)}


def _tier_name(level: Mapping[str, Any], index: int) -> str:
    """``L1 (redis)`` as ``redis``: the tier as the chain names it."""
    match = re.search(r"\((.+)\)", str(level.get("name", "")))
    return match.group(1) if match else f"L{index}"


def _tier_list(tiers: Mapping[str, int]) -> str:
    return ", ".join(f"{tier} {n}" for tier, n in tiers.items())


def remote_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """The caller's variables that reach the server: what sccache reads to find and reach
    a remote cache."""
    return {key: value for key, value in environ.items() if key.startswith(REMOTE_PREFIXES) and key not in OWN}


def server_environment(
    environ: Mapping[str, str],
    *,
    cache_dir: Path,
    socket_path: Path,
    basedirs: Sequence[Path] = (),
    tiers: Tiers | None = None,
) -> dict[str, str]:
    """The server's explicit environment: the caller's remote-cache variables, then the
    shared tiers the settings chose (``tiers``), local disk under the output root unless
    they name another ``SCCACHE_DIR``, the socket, and the base directories stripped from
    paths before hashing (after the caller's own). Files the variables name are named by
    their absolute paths: the server may run elsewhere (in a container, from ``/``).

    >>> env = server_environment(
    ...     {"SCCACHE_REDIS_ENDPOINT": "redis://r:6379", "SCCACHE_SERVER_PORT": "1", "HOMEBREW": "x"},
    ...     cache_dir=Path("/o/.cache/sccache"), socket_path=Path("/o/c/sccache.sock"))
    >>> {k: v for k, v in env.items() if k.startswith("SCCACHE_")}  # doctest: +NORMALIZE_WHITESPACE
    {'SCCACHE_REDIS_ENDPOINT': 'redis://r:6379', 'SCCACHE_DIR': '/o/.cache/sccache',
     'SCCACHE_SERVER_UDS': '/o/c/sccache.sock', 'SCCACHE_START_SERVER': '1', 'SCCACHE_NO_DAEMON': '1',
     'SCCACHE_IDLE_TIMEOUT': '3600'}
    """
    extra = remote_variables(environ)
    extra.update(tiers.environment(environ) if tiers else {})
    extra.update({key: str(path) for key, path in credential_files(extra).items()})
    extra.setdefault("SCCACHE_DIR", str(cache_dir))
    if basedirs:
        extra["SCCACHE_BASEDIRS"] = ":".join([*filter(None, [extra.get("SCCACHE_BASEDIRS")]), *map(str, basedirs)])
    # In the foreground (no daemon): the cell owns the process and stops it.
    extra.update(
        SCCACHE_SERVER_UDS=str(socket_path),
        SCCACHE_START_SERVER="1",
        SCCACHE_NO_DAEMON="1",
        SCCACHE_IDLE_TIMEOUT=IDLE_TIMEOUT,
    )
    return base_environment([], extra)


def install_client(binary: Path, directory: Path) -> Path:
    """The binary, copied once into a directory of the output root that holds nothing else:
    a container sees it through the output mount, and a build's PATH gets it alone."""
    target = directory / "sccache"
    if not _same_file(binary, target):
        directory.mkdir(parents=True, exist_ok=True)
        copy_atomic(binary, target)  # a server of another cell keeps the old file open
        target.chmod(0o755)
    return target


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.stat().st_size == b.stat().st_size and a.read_bytes() == b.read_bytes()
    except OSError:
        return False


def socket_problem(path: Path) -> str | None:
    """Why a Unix socket cannot be made at ``path``, or None."""
    size = len(os.fsencode(path))
    if size > SOCKET_PATH_MAX:
        return f"the socket path {path} is {size} bytes, more than a Unix socket takes ({SOCKET_PATH_MAX})"
    return None


class Server:
    """One sccache server in the foreground of ``runner``: entered, it is started and waited
    for (``failure`` says why it did not answer: then it is stopped already); exited, it is
    stopped, whatever way the cell ends."""

    def __init__(
        self, runner: Runner, *, binary: Path, env: Mapping[str, str], log: StepLog, output: Path, seen: int = 0
    ) -> None:
        self.runner = runner
        self.binary = binary
        self.env = dict(env)
        self.socket = Path(self.env["SCCACHE_SERVER_UDS"])
        self.log = log  # of the step that starts it
        self.output = output
        self.failure: str | None = None
        self.seen = seen  # the builds the run's cell before this one had ended when it started (``refresh``)
        self._process: subprocess.Popen[str] | None = None

    def __enter__(self) -> Server:
        self._start()
        return self

    def _start(self) -> None:
        self.runner.host_path(self.socket).unlink(missing_ok=True)  # a killed server's: the cell's lock says none runs
        try:
            self._process = self.runner.spawn([str(self.binary)], env=self.env, log=self.log, output=self.output)
            self.failure = self._wait()
        except BaseException:
            self.stop()
            raise
        if self.failure is not None:
            self.stop()

    def refresh(self, log: StepLog, *, seen: int) -> str | None:
        """Stopped and started again where the run's cell before this one has ended builds
        since it started (``seen``: how many now), to find what they compiled: a server
        reads its local disk cache's index once, at its first lookup, and never looks for
        files another server adds later. Why it does not answer then, or None."""
        if seen <= self.seen:
            return None
        log.note(
            "restarting the compiler cache's server: the cell before this one has built since it started, "
            "and it reads the cache's index once"
        )
        self.stop()
        self.log, self.seen = log, seen
        self._start()
        return self.failure

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _wait(self) -> str | None:
        deadline = time.monotonic() + STARTUP_SECONDS
        while time.monotonic() < deadline:
            if answers(self.runner.host_path(self.socket)):
                return None
            if self._process is not None and self._process.poll() is not None:
                return f"the server exited ({self._process.returncode}): {_last_line(self.output)}"
            time.sleep(0.1)
        return (
            f"the server did not answer within {STARTUP_SECONDS:.0f}s (a remote cache it cannot reach?): "
            f"{_last_line(self.output)}"
        )

    def stop(self) -> None:
        if self._process is None:
            return
        self.runner.capture(
            [self.binary, "--stop-server"],
            env=base_environment([], {"SCCACHE_SERVER_UDS": str(self.socket)}),
            timeout=30,
        )
        terminate(self._process)
        self._process = None
        self.runner.host_path(self.socket).unlink(missing_ok=True)


def answers(path: Path) -> bool:
    """Whether a server listens on the Unix socket at ``path``. Reached through its
    directory's descriptor (``/proc/self/fd/N/sccache.sock``): a socket's path is limited to
    107 bytes, and the cell's directory here can be longer than the name the runner gives it
    (``/wheelmill/sccache.sock`` in a container)."""
    try:
        directory = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    except OSError:
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(2.0)
        probe.connect(f"/proc/self/fd/{directory}/{path.name}")
    except OSError:
        return False
    finally:
        probe.close()
        os.close(directory)
    return True


def _last_line(output: Path) -> str:
    try:
        lines = [
            line.strip() for line in output.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()
        ]
    except OSError:
        return "no output"
    return lines[-1][:200] if lines else "no output"


def zero_stats(cache: CompilerCache, runner: Runner) -> str | None:
    """Zero the server's counters before a build; why the build goes without the cache, or
    None. Asked only of a server that answers: sccache's client starts one of its own where
    none does, which would run where the build is, without the cell's configuration."""
    assert cache.binary is not None, "zeroed only when active"
    assert cache.socket is not None, "zeroed only when active"
    if not answers(runner.host_path(cache.socket)):
        return f"the cell's sccache server stopped answering on {cache.socket}"
    done = runner.capture([cache.binary, "--zero-stats"], env=_client(cache), timeout=60)
    return (
        None
        if done.returncode == 0
        else f"sccache --zero-stats exited with {done.returncode}: {done.stderr.strip()[:200]}"
    )


def read_stats(cache: CompilerCache, runner: Runner) -> CacheStats | None:
    """What the server counted since it was zeroed; None where it cannot say."""
    assert cache.binary is not None
    done = runner.capture([cache.binary, "--show-stats", "--stats-format=json"], env=_client(cache), timeout=60)
    if done.returncode != 0:
        return None
    try:
        return CacheStats.parse(done.stdout)
    except (ValueError, TypeError, AttributeError):
        return None


def _client(cache: CompilerCache) -> dict[str, str]:
    return base_environment([], {"SCCACHE_SERVER_UDS": str(cache.socket)})


def cache_check(cache: CompilerCache, *, stopped: bool, stats: CacheStats | None) -> CheckResult:
    """A build's verdict on the cache. One warning where it cannot be reached: the
    compiler-cache step's when the cell started, this build's where the server stopped
    answering since; a build never fails for it."""
    if stopped:
        return CheckResult.warned(
            CHECK,
            f"compiled without it: {cache.without}",
            "nothing to do for this build; the next run of the cell starts a new server",
        )
    if not cache.active:
        return CheckResult.skipped(CHECK, f"compiled without it: {cache.without}")
    if stats is None:
        return CheckResult.warned(
            CHECK,
            "sccache did not say what it did (--show-stats failed)",
            f"read the server's log next to {cache.socket}",
        )
    return CheckResult.passed(CHECK, f"{stats.describe()} ({stats.location or cache.location})")


# nvcc checks what it compiles to PTX alone (a target of compute_90 or later, no SASS of it
# beside) with one more ptxas run, which writes nothing: sccache 0.16 leaves that run out,
# so the check does not happen, and later releases fail the compile on it ("Missing "cubin"
# file output", mozilla/sccache#2862). A PTX target beside its own SASS gets no such run:
# that is what TORCH_CUDA_ARCH_LIST's +PTX asks for, and the only way a wheelmill arch list
# can ask for PTX. A build whose own flags ask for PTX alone compiles without the cache.
PTX_CHECKED_FROM = 90  # nvcc 13.0 --dryrun: a ptxas check for compute_90 and later, none for compute_89
NVCC_FLAGS = ("NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS", "CMAKE_CUDA_FLAGS", "CUDAFLAGS")
CMAKE_ARCHS = ("CMAKE_CUDA_ARCHITECTURES", "CUDAARCHS")
_GENCODE = re.compile(r"(?:-gencode|--generate-code)[=\s]+[\"']?arch=compute_\w+,code=([\[\]\"'\w,]+)")
_ARCH = re.compile(r"(?:-arch|--gpu-architecture)[=\s]+(compute|sm)_(\w+)")
_CODE = re.compile(r"(?:^|\s)(?:-code|--gpu-code)[=\s]")
_TORCH_ARCH = re.compile(r"^(\d+)\.(\d+)([af]?)(\+PTX)?$")
_CMAKE_ARCH = re.compile(r"^(\d+[af]?)(?:-(real|virtual))?$")


def ptx_only_targets(variables: Mapping[str, str], argv: Sequence[str] = ()) -> list[str]:
    """The targets of compute_90 and later that a build's arch list and nvcc flags (its
    variables, its command's arguments) ask for as PTX without their SASS.

    >>> ptx_only_targets({"TORCH_CUDA_ARCH_LIST": "8.0;12.0+PTX"}), ptx_only_targets({}, ["-arch=compute_90"])
    ([], ['compute_90'])
    """
    sass, ptx = _torch_targets(variables.get("TORCH_CUDA_ARCH_LIST", ""))
    flags = " ".join([*(variables.get(key, "") for key in NVCC_FLAGS), *argv])
    for more_sass, more_ptx in (_gencode_targets(flags), _cmake_targets(variables, argv)):
        sass, ptx = sass | more_sass, ptx | more_ptx
    alone = [arch for arch in ptx - sass if int(re.sub(r"\D", "", arch)) >= PTX_CHECKED_FROM]
    return [f"compute_{arch}" for arch in sorted(alone, key=lambda arch: (len(arch), arch))]


def uncached_nvcc(variables: Mapping[str, str], argv: Sequence[str] = ()) -> str | None:
    """Why a build compiles without the cache for its nvcc flags, or None."""
    targets = ptx_only_targets(variables, argv)
    if not targets:
        return None
    return (
        f"it asks nvcc for PTX alone ({', '.join(targets)}, without its SASS), which sccache does not compile "
        "as nvcc does (mozilla/sccache#2862)"
    )


def _torch_targets(arch_list: str) -> tuple[set[str], set[str]]:
    """SASS of every item, PTX of those marked +PTX (torch's ``_get_cuda_arch_flags``)."""
    sass: set[str] = set()
    ptx: set[str] = set()
    for item in (item for item in re.split(r"[;,\s]+", arch_list) if item):
        match = _TORCH_ARCH.match(item)
        if match:
            arch = "".join(match.group(1, 2, 3))
            sass.add(arch)
            ptx.update([arch] if match.group(4) else [])
    return sass, ptx


def _gencode_targets(flags: str) -> tuple[set[str], set[str]]:
    """``-gencode arch=compute_90,code=[sm_90,compute_90]``; ``-arch=compute_90`` alone is PTX alone."""
    sass: set[str] = set()
    ptx: set[str] = set()
    for codes in _GENCODE.findall(flags):
        for code in re.split(r"[,\[\]\"']+", codes):
            kind, _, arch = code.partition("_")
            if kind == "sm":
                sass.add(arch)
            elif kind == "compute":
                ptx.add(arch)
    if not _CODE.search(flags):
        for kind, arch in _ARCH.findall(flags):
            ptx.add(arch)  # -arch=sm_90 is SASS and PTX of 90
            sass.update([arch] if kind == "sm" else [])
    return sass, ptx


def _cmake_targets(variables: Mapping[str, str], argv: Sequence[str]) -> tuple[set[str], set[str]]:
    """CMake's ``90`` (SASS and PTX), ``90-real`` (SASS), ``90-virtual`` (PTX)."""
    lists = [variables.get(key, "") for key in CMAKE_ARCHS]
    lists += [arg.partition("=")[2] for arg in argv if arg.startswith("-DCMAKE_CUDA_ARCHITECTURES")]
    sass: set[str] = set()
    ptx: set[str] = set()
    for item in (item for text in lists for item in re.split(r"[;,\s]+", text.strip("\"'")) if item):
        match = _CMAKE_ARCH.match(item)
        if match:
            arch, kind = match.groups()
            sass.update([arch] if kind != "virtual" else [])
            ptx.update([arch] if kind != "real" else [])
    return sass, ptx
