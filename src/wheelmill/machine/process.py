"""The one way wheelmill runs a process.

Every command a step runs goes through a ``Runner``: it logs the command and its explicit
environment to the step log, streams the output there (and to a progress callback), and
raises ``CommandFailed`` when the exit status is not zero. ``HostRunner`` runs on this
machine; a container runner only has to wrap the argv, so no step changes when builds move
into containers. Children get their own process group, so Ctrl-C stops a whole compiler
tree, not just its parent.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import IO, Protocol

from wheelmill.errors import SECRET_NAME, CommandFailed, redact

# Variables a build may legitimately need from the caller; everything else is explicit.
PASSTHROUGH = (
    "HOME",
    "USER",
    "LOGNAME",
    "TERM",
    "TMPDIR",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "SOURCE_DATE_EPOCH",
    # Rootless podman keeps its state (its pause process, its containers' run-time files) in
    # the session's run-time directory; a command without it looks under TMPDIR, which a
    # step sets, and finds none of it. And with systemd, reaches it over the session's bus.
    "XDG_RUNTIME_DIR",
    "DBUS_SESSION_BUS_ADDRESS",
)
# /usr/local/bin is left out on purpose: a stray nvcc there must not turn a CPU build into
# a CUDA one. Toolkits are added to PATH explicitly, per variant.
SYSTEM_PATH = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")
TERMINATE_GRACE = 10.0
TRACEBACK_MARK = "#| "  # a traceback's lines in a step log
# The commands running now, from any thread: Ctrl-C reaches the one the main thread waits
# on, and ``stop_running`` the others (a step running beside it).
_RUNNING: set[subprocess.Popen[str]] = set()
_RUNNING_LOCK = threading.Lock()
# A cell that runs beside the one before it in a run (``pipeline``) starts its commands at a
# lower CPU priority while that one runs: they take the cores it leaves idle (a host compile
# on one core, a test importing torch) instead of slowing it. Each command is a session of
# its own (its process group must be stoppable whole), and where the kernel schedules a
# session's processes as one group (autogroup), a process's nice value counts only inside
# that group; so the group's is set too, before the command starts.
YIELD_NICE = 10
_YIELD_SCRIPT = f'echo {YIELD_NICE} > /proc/self/autogroup 2>/dev/null; exec nice -n {YIELD_NICE} "$@"'
_YIELDING: ContextVar[Callable[[], bool] | None] = ContextVar("yielding", default=None)


class StepLog:
    """A step's log file: every command, its environment and all of its output, with every
    credential masked (``secrets``, and whatever carries one)."""

    def __init__(self, path: Path, *, secrets: Sequence[str] = ()) -> None:
        self.path = path
        self.secrets = tuple(s for s in secrets if s)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] = path.open("a", encoding="utf-8", errors="replace")

    def redact(self, text: str) -> str:
        return redact(text, self.secrets)

    def write(self, text: str) -> None:
        self._file.write(self.redact(text))
        self._file.flush()

    def note(self, text: str) -> None:
        self.write(f"# {text}\n")

    def traceback(self, exc: BaseException) -> None:
        """An exception's traceback, for whoever debugs wheelmill: marked, so that what
        shows a log's tail to a user can leave it out."""
        text = "".join(traceback.format_exception(exc))
        self.write("".join(f"{TRACEBACK_MARK}{line}\n" for line in text.splitlines()))

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> StepLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True, kw_only=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    seconds: float
    output: str


class Runner(Protocol):
    """Where a cell's commands run: this machine, or the cell's container."""

    environ: Mapping[str, str]  # what discovery may read (CUDA_HOME, PATH, ...)
    network: bool  # whether its commands can reach the network

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        log: StepLog,
        cwd: Path | None = None,
        on_line: Callable[[str], None] | None = None,
        keep_output: bool = False,
    ) -> CommandResult: ...

    def capture(
        self, argv: Sequence[str | Path], *, env: Mapping[str, str] | None = None, timeout: float = 60.0
    ) -> Captured:
        """A quick query (a version, a listing), unlogged; never raises for its status."""
        ...

    def spawn(
        self, argv: Sequence[str], *, env: Mapping[str, str], log: StepLog, output: Path
    ) -> subprocess.Popen[str]:
        """A long-running process (a server) left running: logged like a command, its
        output to a file of its own (it outlives the step's log); ``terminate`` stops it."""
        ...

    def host_path(self, path: Path) -> Path:
        """Where a path of the runner's file system is readable from this process."""
        ...

    def stable_path(self, path: Path) -> Path:
        """The name a build should use for a path of this process, the same whatever the
        output root or the cell (what a compiler writes into its output, and what a
        compiler cache keys on)."""
        ...


# Where engine none's commands see the cell, on every machine: a build compiles the paths
# it sees into its output (nvcc's module ids hash the source's path, which no prefix map
# reaches) and the compiler cache hashes them, so they must not name the output root or the
# cell. Under /tmp, which every machine has, and hidden: a mount namespace binds the cell
# over it for each command, the directory itself stays empty.
VIEW_ROOT = Path("/tmp/.wheelmill-cell")  # noqa: S108 - only ever a mount point in a namespace of one build's own
# Binds the cell ($1) at $2 and the Python installation ($3, if any) at $2/python, goes to
# the working directory ($4, if any: one under the view exists only in there), then runs
# the command; in a mount namespace of its own, so nothing of it is seen outside.
_VIEW_SCRIPT = (
    'mount --bind "$1" "$2" || exit 125; if [ -n "$3" ]; then mount --bind "$3" "$2/python" || exit 125; fi; '
    'if [ -n "$4" ]; then cd "$4" || exit 125; fi; shift 4; exec "$@"'
)


@dataclass(frozen=True)
class View:
    """A cell seen at a fixed path on this machine, as a container mounts it at /wheelmill:
    each command runs in a mount namespace of its own where the cell root is bound at
    ``target`` and the Python installation (``python``, pyenv's ``versions/3.11.7``) at
    ``target/python``, so an env made from that Python names its headers there too."""

    cell: Path
    python: Path | None  # None: the Python is seen where it is (a system one, under /usr)
    target: Path = VIEW_ROOT

    def _pairs(self) -> list[tuple[Path, Path]]:
        return [*([(self.python, self.target / "python")] if self.python else []), (self.cell, self.target)]

    def stable(self, path: Path) -> Path:
        for source, target in self._pairs():
            if path.is_relative_to(source):
                return target / path.relative_to(source)
        return path

    def host(self, path: Path) -> Path:
        for source, target in self._pairs():
            if path.is_relative_to(target):
                return source / path.relative_to(target)
        return path

    def prefix(self, *, network: bool, cwd: Path | None = None) -> tuple[str, ...] | None:
        """The command that runs one in the view (and without network), in ``cwd``; None
        where this machine allows no mount namespace."""
        unshare = unshare_prefix("--mount", *(() if network else ("--net",)))
        if unshare is None:
            return None
        where = (str(self.cell), str(self.target), str(self.python or ""), str(cwd or ""))
        return (*unshare, "sh", "-c", _VIEW_SCRIPT, "wheelmill-view", *where)


def make_view(cell: Path, python: Path | None, *, netless: bool) -> View | str:
    """The cell's view (``python``: the installation to show under it too), or why this
    machine gives none: the fixed directory cannot be made, or no mount namespace (with no
    network too, for ``netless``) can be started here."""
    view = View(cell=cell, python=python)
    taken = [
        p for p in (cell, python) if p is not None and (p.is_relative_to(view.target) or view.target.is_relative_to(p))
    ]
    if taken:
        return f"{taken[0]} overlaps {view.target}"
    try:
        view.target.mkdir(exist_ok=True)
        if view.target.is_symlink() or not view.target.is_dir():
            return f"{view.target} is not a directory"
        if python is not None:
            (cell / "python").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot make {exc.filename}: {exc.strerror}"
    for network in (True, *((False,) if netless else ())):
        prefix = view.prefix(network=network)
        done = capture([*prefix, "true"], timeout=30) if prefix else None
        if done is None or done.returncode != 0:
            said = f": {(done.stderr or done.stdout).strip()[-200:]}" if done else ""
            return f"no mount namespace here (run as root, or where user namespaces are allowed){said}"
    return view


class HostRunner:
    """Runs commands directly on this machine (engine ``none``); with ``netless``, each in a
    network namespace of its own, which has no network, loopback included; with ``view``,
    in a mount namespace that shows the cell at a fixed path (``View``)."""

    def __init__(self, *, netless: Sequence[str] = (), view: View | None = None, network: bool = True) -> None:
        self.environ: Mapping[str, str] = os.environ
        self.network = network and not netless  # with a view, its namespace takes the network away
        self.view = view
        viewed = view.prefix(network=self.network) if view else None
        assert view is None or viewed is not None, "a view is made only where its namespace works (View.prefix)"
        self.prefix = viewed or tuple(netless)  # the command that starts one in its namespaces

    def capture(
        self, argv: Sequence[str | Path], *, env: Mapping[str, str] | None = None, timeout: float = 60.0
    ) -> Captured:
        return capture([*self.prefix, *argv], env=env, timeout=timeout)

    def host_path(self, path: Path) -> Path:
        return self.view.host(path) if self.view else path

    def stable_path(self, path: Path) -> Path:
        # Without a view paths are what they are; the prefix maps name them in what is compiled.
        return self.view.stable(path) if self.view else path

    def spawn(
        self, argv: Sequence[str], *, env: Mapping[str, str], log: StepLog, output: Path
    ) -> subprocess.Popen[str]:
        return spawn([*self.prefix, *argv], env=env, log=log, output=output)

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        log: StepLog,
        cwd: Path | None = None,
        on_line: Callable[[str], None] | None = None,
        keep_output: bool = False,
    ) -> CommandResult:
        if self.view is not None and cwd is not None:  # a directory of the view: entered in there
            viewed = self.view.prefix(network=self.network, cwd=cwd)
            assert viewed is not None, "made where its namespace works"
            prefix, cwd, seen = viewed, None, cwd
        else:
            prefix, seen = self.prefix, cwd
        argv = [*prefix, *(str(a) for a in argv)]
        started_as = _prioritized(argv)
        _log_command(log, started_as, env, seen)
        started = time.monotonic()
        try:
            proc = subprocess.Popen(
                started_as,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(env),
                cwd=cwd,
                start_new_session=True,
                text=True,
                errors="replace",
                bufsize=1,
            )
        except OSError as exc:
            log.note(f"could not start: {exc}")
            raise CommandFailed(argv, 127, log.path, [str(exc)]) from None
        with proc, _running(proc):  # closes the pipe and reaps the child, whatever happens
            tail, kept = _drain(proc, log, on_line, keep_output)
        seconds = time.monotonic() - started
        log.note(f"exit status {proc.returncode} after {seconds:.1f}s")
        if proc.returncode != 0:
            raise CommandFailed(argv, proc.returncode, log.path, tail)
        return CommandResult(argv=tuple(argv), returncode=0, seconds=seconds, output="".join(kept))


def spawn(argv: Sequence[str], *, env: Mapping[str, str], log: StepLog, output: Path) -> subprocess.Popen[str]:
    """Start a process that runs on after this call, in its own process group (so that
    ``terminate`` stops its whole tree), its output appended to ``output``."""
    argv = _prioritized(argv)
    _log_command(log, argv, env, None)
    log.note(f"started in the background; its output goes to {output}")
    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("a", encoding="utf-8") as sink:  # the child keeps its own descriptor
        return subprocess.Popen(
            list(argv),
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env),
            start_new_session=True,
            text=True,
        )


@contextlib.contextmanager
def yielding(now: Callable[[], bool]) -> Iterator[None]:
    """Commands started in this context (and in threads given a copy of it) start at a
    lower CPU priority whenever ``now()`` says so as they start."""
    token = _YIELDING.set(now)
    try:
        yield
    finally:
        _YIELDING.reset(token)


def yields_now() -> bool:
    """Whether what this context starts now yields the cores (``yielding``)."""
    now = _YIELDING.get()
    return now is not None and now()


def _prioritized(argv: Sequence[str | Path]) -> list[str]:
    """``argv``, started at a lower CPU priority where this context yields now.

    >>> with yielding(lambda: True):
    ...     _prioritized(["cc", "--version"])[3:]
    ['wheelmill-yield', 'cc', '--version']
    >>> _prioritized(["cc", "--version"])
    ['cc', '--version']
    """
    started = [str(a) for a in argv]
    return ["sh", "-c", _YIELD_SCRIPT, "wheelmill-yield", *started] if yields_now() else started


def netless_prefix() -> tuple[str, ...] | None:
    """How this machine starts a command without network: a network namespace (as root, or
    in a user namespace where those are allowed); None where the platform allows neither."""
    return unshare_prefix("--net")


@cache
def unshare_prefix(*namespaces: str) -> tuple[str, ...] | None:
    """``unshare`` with these namespaces, as root or in a user namespace, whichever works
    here; None where neither does."""
    for prefix in (("unshare", *namespaces, "--"), ("unshare", *namespaces, "--map-root-user", "--")):
        if capture([*prefix, "true"], timeout=30).returncode == 0:
            return prefix
    return None


def _drain(
    proc: subprocess.Popen[str],
    log: StepLog,
    on_line: Callable[[str], None] | None,
    keep_output: bool,
) -> tuple[list[str], list[str]]:
    tail: deque[str] = deque(maxlen=60)
    kept: list[str] = []
    assert proc.stdout is not None
    try:
        for raw in proc.stdout:
            line = log.redact(raw)  # what a server says back reaches no log or terminal unmasked
            log.write(line)
            tail.append(line.rstrip("\n"))
            if keep_output:
                kept.append(line)
            if on_line:
                on_line(line)
        proc.wait()
    except BaseException:
        terminate(proc)
        raise
    return list(tail), kept


@contextlib.contextmanager
def _running(proc: subprocess.Popen[str]) -> Iterator[None]:
    with _RUNNING_LOCK:
        _RUNNING.add(proc)
    try:
        yield
    finally:
        with _RUNNING_LOCK:
            _RUNNING.discard(proc)


def stop_running() -> None:
    """Stop every command that is running, whichever thread waits on it."""
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    for proc in running:
        terminate(proc)


def terminate(proc: subprocess.Popen[str]) -> None:
    """Stop a child's whole process group: SIGTERM, then SIGKILL after a grace period."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, TERMINATE_GRACE), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _log_command(log: StepLog, argv: Sequence[str], env: Mapping[str, str], cwd: Path | None) -> None:
    log.write(f"$ {subprocess.list2cmdline(argv)}\n")
    if cwd:
        log.note(f"cwd {cwd}")
    for key in sorted(env):
        log.note(f"env {key}={'***' if SECRET_NAME.search(key) else env[key]}")


@dataclass(frozen=True, kw_only=True)
class Captured:
    returncode: int
    stdout: str
    stderr: str


def capture(argv: Sequence[str | Path], *, env: Mapping[str, str] | None = None, timeout: float = 60.0) -> Captured:
    """Run a quick query (a version, a config list) and return its output; never raises
    for a non-zero status. A missing program is status 127, a hung one 124."""
    try:
        done = subprocess.run(
            _prioritized(argv),
            capture_output=True,
            text=True,
            errors="replace",
            env=None if env is None else dict(env),
            stdin=subprocess.DEVNULL,
            timeout=timeout,
            check=False,
        )
    except OSError as exc:
        return Captured(returncode=127, stdout="", stderr=str(exc))
    except subprocess.TimeoutExpired:
        return Captured(returncode=124, stdout="", stderr=f"timed out after {timeout:.0f}s")
    return Captured(returncode=done.returncode, stdout=done.stdout, stderr=done.stderr)


# Zip entries and other build timestamps come from here unless the caller sets it: the same
# source gives the same wheel bytes, so publishing a rebuild is a no-op, not a conflict.
DEFAULT_SOURCE_DATE_EPOCH = "315532800"  # 1980-01-01, the earliest a zip can say


def wheelmill_command(*args: str | Path, recipes: Path | None = None) -> list[str]:
    """This wheelmill, as a child process: for work done apart from the calling process
    (py-rattler's threads may outlive a call, and a build's process must not carry them)."""
    return [
        sys.executable,
        "-m",
        "wheelmill",
        *(["--recipes", str(recipes.resolve())] if recipes else []),
        *map(str, args),
    ]


def base_environment(path: Sequence[Path | str], extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """An explicit environment: the pass-through variables, a UTF-8 locale, a fixed
    SOURCE_DATE_EPOCH, the given PATH (then the system directories), and ``extra``."""
    env = {key: os.environ[key] for key in PASSTHROUGH if key in os.environ}
    env.setdefault("SOURCE_DATE_EPOCH", DEFAULT_SOURCE_DATE_EPOCH)
    env["LANG"] = env["LC_ALL"] = "C.UTF-8"
    env["PYTHONUNBUFFERED"] = "1"
    dirs = [str(p) for p in path] + [d for d in SYSTEM_PATH if d not in map(str, path)]
    env["PATH"] = os.pathsep.join(dict.fromkeys(dirs))
    env.update(extra or {})
    return env
