"""The cell's container: a context manager that starts one long-lived container
(``sleep infinity``) and removes it on exit, whatever way the cell ends, and a ``Runner``
whose commands are ``exec``'d into it.

Every command gets its own explicit environment, so a step cannot tell it from the host
runner but for where its files are: the output root is mounted at the same path, and
anything else of the container's is reached through ``/proc/<pid>/root``. The cell's own
root is mounted a second time at a fixed path (``/wheelmill``) for builds: what a compiler
writes into its output (nvcc's module ids, debug info) and what a compiler cache keys on
are then the same in every cell and under every output root.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from wheelmill.errors import CommandFailed, PrecheckError
from wheelmill.machine.engine import Engine, Mount, left_behind
from wheelmill.machine.process import (
    Captured,
    CommandResult,
    HostRunner,
    StepLog,
    base_environment,
    capture,
    spawn,
    yields_now,
)

# A container's processes are scheduled by its cgroup's weight against the other
# containers', which no nice value inside it changes: a cell that yields the cores to the one
# before it in the run (``process.yielding``) gets a container of a lower weight, for its
# life: about what nice 10 weighs against nice 0 (110 of 1024).
YIELDING_CPU_SHARES = 128


class Container:
    def __init__(
        self,
        engine: Engine,
        *,
        cell: str,
        image: str,
        mounts: Sequence[Mount],
        log: StepLog,
        same_path: Sequence[Path] = (),
        stable: Mount | None = None,
        network: bool = True,
        platform: str | None = None,
        server_files: Sequence[Path] = (),
    ) -> None:
        self.engine = engine
        self.cell = cell
        self.image = image
        self.mounts = tuple(mounts)
        self.same_path = tuple(same_path)  # mounted at the same path: no translation needed
        self.stable = stable  # a host directory mounted a second time, at a fixed path
        self.log = log  # of the step that starts it
        self.network = network
        self.platform = platform  # an OCI platform (linux/arm64) where the image is another machine's
        # Files of this machine that a server run in the online container reads (the compiler
        # cache's credentials): read-only at the same path, so the variables naming them hold.
        self.server_files = tuple(server_files)
        self.name = f"wheelmill-{cell}-{os.getpid()}" + ("" if network else "-netless")
        self.environ: Mapping[str, str] = {}  # discovery looks only at the image, not our variables
        self.stale: list[str] = []  # containers of the cell a killed wheelmill left behind
        self._host = HostRunner()
        self._pid: int | None = None

    def __enter__(self) -> Container:
        self.stale = self._remove_stale() if self.network else []  # the netless one starts second
        try:
            self._start()
        except BaseException:  # Ctrl-C or a failed start: nothing of it stays
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _remove_stale(self) -> list[str]:
        listed = left_behind(capture(self.engine.containers(self.cell), timeout=60).stdout.split())
        for name in listed:
            self.log.note(f"removing a container left behind: {name}")
            capture(self.engine.remove(name), timeout=120)
        return listed

    def all_mounts(self) -> list[Mount]:
        """What the container is started with: the mounts, the stable root, and in the
        online container only, the servers' files (the builds, without network, use none)."""
        files = [Mount(source=path, target=path) for path in self.server_files] if self.network else []
        return [*self.mounts, *([self.stable] if self.stable else []), *files]

    def _start(self) -> None:
        mounts = self.all_mounts()
        shares = YIELDING_CPU_SHARES if yields_now() else None
        argv = self.engine.run_detached(
            container=self.name,
            image=self.image,
            mounts=mounts,
            cell=self.cell,
            network=self.network,
            cpu_shares=shares,
            platform=self.platform,
        )
        try:
            self._host.run(argv, env=base_environment([]), log=self.log)
        except CommandFailed as failed:
            raise PrecheckError(
                f"{self.cell}: the container did not start: {failed.last_line()}", fix=f"read {failed.log}"
            ) from None
        pid = capture(self.engine.pid(self.name), timeout=60).stdout.strip()
        if not pid.isdigit() or pid == "0" or not Path(f"/proc/{pid}/root").exists():
            raise PrecheckError(
                f"{self.cell}: the container started but is not running (pid {pid or 'none'})",
                fix=f"read {self.log.path}",
            )
        self._pid = int(pid)

    def stop(self) -> None:
        capture(self.engine.remove(self.name), timeout=120)
        self._pid = None

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
        outer = self.engine.exec(container=self.name, argv=[str(a) for a in argv], env_keys=_inside(env), workdir=cwd)
        log.note(f"in container {self.name}:")
        return self._host.run(outer, env=env, log=log, on_line=on_line, keep_output=keep_output)

    def spawn(
        self, argv: Sequence[str], *, env: Mapping[str, str], log: StepLog, output: Path
    ) -> subprocess.Popen[str]:
        """The exec'd process runs on in the container; removing the container ends it, if
        nothing stopped it before."""
        outer = self.engine.exec(container=self.name, argv=[str(a) for a in argv], env_keys=_inside(env), workdir=None)
        log.note(f"in container {self.name}:")
        return spawn(outer, env=env, log=log, output=output)

    def capture(
        self, argv: Sequence[str | Path], *, env: Mapping[str, str] | None = None, timeout: float = 60.0
    ) -> Captured:
        environment = dict(env) if env is not None else base_environment([])
        outer = self.engine.exec(
            container=self.name, argv=[str(a) for a in argv], env_keys=_inside(environment), workdir=None
        )
        # The engine's own process keeps the session it runs in (HOME, XDG_RUNTIME_DIR: where
        # rootless podman finds its containers); only ``env``'s variables go inside.
        return capture(outer, env={**base_environment([]), **environment}, timeout=timeout)

    def stable_path(self, path: Path) -> Path:
        """``<output>/<cell>/src/x`` as ``/wheelmill/src/x``; other paths as they are."""
        if self.stable is not None and path.is_relative_to(self.stable.source):
            return self.stable.target / path.relative_to(self.stable.source)
        return path

    def host_path(self, path: Path) -> Path:
        """Where a path of the container is visible here (its root, as its init sees it)."""
        if self.stable is not None and path.is_relative_to(self.stable.target):
            return self.stable.source / path.relative_to(self.stable.target)
        if any(path.is_relative_to(mounted) for mounted in self.same_path):
            return path
        root = Path(f"/proc/{self._pid}/root") if self._pid is not None else None
        if root is None or not root.exists():
            raise PrecheckError(
                f"{self.cell}: the container {self.name} is gone (stopped or removed while the build ran)",
                fix="build the cell again, and leave wheelmill-* containers alone while it runs",
            )
        return root / path.relative_to(path.anchor)


def _inside(env: Mapping[str, str]) -> list[str]:
    """The variables a command in the container gets: not TMPDIR, a directory of this
    machine the container does not have (tools that write temporary files there fail)."""
    return sorted(key for key in env if key != "TMPDIR")
