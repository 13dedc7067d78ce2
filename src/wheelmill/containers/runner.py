"""A runner whose commands run in the cell's container.

One long-lived container per cell (``sleep infinity``); every command is ``exec``'d into
it with its own explicit environment, so a step cannot tell it from the host runner but
for where its files are: the output root is mounted at the same path, and anything else
of the container's is reached through ``/proc/<pid>/root``. The container is removed when
the cell ends: on success, failure and Ctrl-C alike.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from wheelmill.containers.engine import Engine, Mount
from wheelmill.errors import PrecheckError
from wheelmill.runner import Captured, CommandFailed, CommandResult, HostRunner, StepLog, base_environment, capture


class ContainerRunner:
    def __init__(self, engine: Engine, *, cell: str, same_path: Sequence[Path] = ()) -> None:
        self.engine = engine
        self.same_path = tuple(same_path)  # mounted at the same path: no translation needed
        self.cell = cell
        self.name = engine.name.value
        self.container = f"wheelmill-{cell}-{os.getpid()}"
        self.environ: Mapping[str, str] = {}  # discovery looks only at the image, not our variables
        self._host = HostRunner()
        self._pid: int | None = None

    def remove_stale(self, log: StepLog) -> list[str]:
        """Containers of this cell left by a wheelmill that was killed outright."""
        listed = capture(self.engine.containers(self.cell), timeout=60).stdout.split()
        for name in listed:
            log.note(f"removing a container left behind: {name}")
            capture(self.engine.remove(name), timeout=120)
        return listed

    def start(self, *, image: str, mounts: Sequence[Mount], log: StepLog) -> None:
        argv = self.engine.run_detached(container=self.container, image=image, mounts=mounts, cell=self.cell)
        try:
            self._host.run(argv, env=base_environment([]), log=log)
        except CommandFailed as failed:
            self.stop()
            raise PrecheckError(f"{self.cell}: the container did not start: {failed.last_line()}", fix=f"read {failed.log}") from None
        pid = capture(self.engine.pid(self.container), timeout=60).stdout.strip()
        if not pid.isdigit() or pid == "0":
            self.stop()
            raise PrecheckError(f"{self.cell}: the container started but is not running", fix=f"read {log.path}")
        self._pid = int(pid)

    def stop(self) -> None:
        capture(self.engine.remove(self.container), timeout=120)
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
        outer = self.engine.exec(container=self.container, argv=[str(a) for a in argv], env_keys=sorted(env), workdir=cwd)
        log.note(f"in container {self.container}:")
        return self._host.run(outer, env=env, log=log, on_line=on_line, keep_output=keep_output)

    def capture(self, argv: Sequence[str | Path], *, env: Mapping[str, str] | None = None, timeout: float = 60.0) -> Captured:
        environment = dict(env) if env is not None else base_environment([])
        outer = self.engine.exec(container=self.container, argv=[str(a) for a in argv], env_keys=sorted(environment), workdir=None)
        return capture(outer, env=environment, timeout=timeout)

    def host_path(self, path: Path) -> Path:
        """Where a path of the container is visible here (its root, as its init sees it)."""
        if any(path.is_relative_to(mounted) for mounted in self.same_path):
            return path
        if self._pid is None:
            raise RuntimeError("the container is not running")
        return Path(f"/proc/{self._pid}/root") / path.relative_to(path.anchor)
