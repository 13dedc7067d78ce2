"""Container engines: docker and podman, first-class both, and the commands wheelmill
issues to them. Every argv is built by a pure method here (unit-tested for both engines);
running them is the runner's job.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from wheelmill.errors import PrecheckError, UsageError
from wheelmill.inputs.variants import X86_64
from wheelmill.machine.emulation import DEBIAN_ARCH, OCI_PLATFORM
from wheelmill.machine.process import Captured, capture
from wheelmill.settings import ENGINE_CHOICES


class EngineName(StrEnum):
    DOCKER = "docker"
    PODMAN = "podman"


LABEL = "wheelmill.cell"
CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))  # where the NVIDIA Container Toolkit writes its CDI specs
# A rootless engine gives a container a network of its own through a user-mode stack
# (slirp4netns, pasta, or rootlesskit's), each of which opens this device as the user.
TUN = Path("/dev/net/tun")


def _opens(path: Path) -> bool:
    return os.access(path, os.R_OK | os.W_OK)


@dataclass(frozen=True, kw_only=True)
class Mount:
    source: Path
    target: Path
    readonly: bool = True

    def volume(self) -> str:
        return f"{self.source}:{self.target}:{'ro' if self.readonly else 'rw'}"


@dataclass(frozen=True, kw_only=True)
class Engine:
    """``store``: podman only, an image store of its own in that directory instead of the
    machine's (``--root``/``--runroot``/``--tmpdir`` under it): a second machine's images on this
    one, for tests and benchmarks of what two machines share. docker's store is its daemon's."""

    name: EngineName
    binary: str
    store: Path | None = None
    rootless: bool = False  # it runs as this user (rootless podman, or rootless docker), not as root
    storage: str = ""  # its image store's driver as its info names it (overlay, vfs, ...); "" where not asked

    def __post_init__(self) -> None:
        if self.store is not None and self.name is not EngineName.PODMAN:
            raise UsageError(
                f"{self.name}: an image store of its own needs podman (docker's is its daemon's)",
                fix="use podman, or start another docker daemon with --data-root",
            )

    @property
    def command(self) -> list[str]:
        """The engine's argv up to its subcommand: the binary, and the options of a store of its own."""
        if self.store is None or self.runroot is None:
            return [self.binary]
        own = {"--root": self.store / "root", "--runroot": self.runroot, "--tmpdir": self.store / "tmp"}
        return [self.binary, *(part for flag, path in own.items() for part in (flag, str(path)))]

    @property
    def runroot(self) -> Path | None:
        """A store of its own's run-time state (locks, mount points), which podman wants at a
        path of at most 50 characters: in /tmp, named by the store; whoever removes the store
        removes this too."""
        if self.store is None:
            return None
        return Path("/tmp") / f"wheelmill-run-{hashlib.sha256(str(self.store).encode()).hexdigest()[:12]}"  # noqa: S108

    def run_detached(
        self,
        *,
        container: str,
        image: str,
        mounts: Sequence[Mount],
        cell: str,
        network: bool = True,
        cpu_shares: int | None = None,
        platform: str | None = None,
    ) -> list[str]:
        """A long-lived container of the cell; commands are exec'd into it, each with its own
        explicit environment. With ``network``, the host's (package downloads of the level-2
        env); without, none at all (builds). ``cpu_shares``: its weight against the other
        containers when the cores are busy (the engines' default is 1024)."""
        argv = [
            *self.command,
            "run",
            "--detach",
            "--name",
            container,
            "--label",
            f"{LABEL}={cell}",
            "--network",
            "host" if network else "none",
        ]
        argv += ["--cpu-shares", str(cpu_shares)] if cpu_shares is not None else []
        argv += ["--platform", platform] if platform else []
        for mount in mounts:
            argv += ["--volume", mount.volume()]
        return [*argv, "--entrypoint", "sleep", image, "infinity"]

    def exec(self, *, container: str, argv: Sequence[str], env_keys: Sequence[str], workdir: Path | None) -> list[str]:
        """``--env KEY`` without a value takes it from exec's own environment, so values
        (tokens too) never appear on a command line."""
        out = [*self.command, "exec"]
        if workdir is not None:
            out += ["--workdir", str(workdir)]
        for key in env_keys:
            out += ["--env", key]
        return [*out, container, *argv]

    def remove(self, container: str) -> list[str]:
        # podman waits 10 s for a stop by default; the container only runs `sleep`.
        extra = ["--time", "0"] if self.name is EngineName.PODMAN else []
        return [*self.command, "rm", "--force", *extra, container]

    def build(
        self,
        *,
        tag: str,
        containerfile: Path,
        context: Path,
        build_args: Mapping[str, str],
        labels: Mapping[str, str] | None = None,
        platform: str | None = None,
    ) -> list[str]:
        """``platform``: an OCI platform (``linux/arm64``) for an image of another machine."""
        argv = [*self.command, "build", "--tag", tag, "--file", str(containerfile), "--network", "host"]
        argv += ["--platform", platform] if platform else []
        for key in sorted(build_args):
            argv += ["--build-arg", f"{key}={build_args[key]}"]
        for key in sorted(labels or {}):
            argv += ["--label", f"{key}={(labels or {})[key]}"]
        return [*argv, str(context)]

    def run(
        self,
        *,
        image: str,
        argv: Sequence[str],
        network: str = "none",
        env_keys: Sequence[str] = (),
        mounts: Sequence[Mount] = (),
        name: str | None = None,
        ip: str | None = None,
        gpus: bool = False,
    ) -> list[str]:
        """A one-off container that runs ``argv`` and is removed; ``network``: none, host,
        or an engine network (with a fixed ``ip`` on it); ``gpus``: every NVIDIA GPU of the
        machine in it (docker's NVIDIA runtime, podman's CDI device)."""
        out = [
            *self.command,
            "run",
            "--rm",
            "--network",
            network,
            *(["--name", name] if name else []),
            *(["--ip", ip] if ip else []),
            *(self._gpus() if gpus else []),
        ]
        for key in env_keys:
            out += ["--env", key]
        for mount in mounts:
            out += ["--volume", mount.volume()]
        return [*out, image, *argv]

    def _gpus(self) -> list[str]:
        return ["--device", "nvidia.com/gpu=all"] if self.name is EngineName.PODMAN else ["--gpus", "all"]

    def gpu_access(self, cdi_dirs: Sequence[Path] = CDI_DIRS) -> str | None:
        """Why a container of this engine cannot get the machine's NVIDIA GPUs, or None where
        it can: a CDI spec of ``nvidia.com/gpu`` (podman, and docker from 25 on), or docker's
        NVIDIA runtime."""
        specs = [p for d in cdi_dirs if d.is_dir() for p in d.iterdir() if p.suffix in (".yaml", ".yml", ".json")]
        if any("nvidia.com/gpu" in p.read_text(encoding="utf-8", errors="replace") for p in specs):
            return None
        if self.name is EngineName.DOCKER:
            runtimes = capture([*self.command, "info", "--format", "{{json .Runtimes}}"]).stdout
            if "nvidia" in runtimes:
                return None
        return f"{self.name} has no NVIDIA runtime or CDI spec of nvidia.com/gpu (in {', '.join(map(str, cdi_dirs))})"

    def network_access(self, tun: Path = TUN, *, can_open: Callable[[Path], bool] = _opens) -> str | None:
        """Why this engine cannot give a container a network of its own (an engine network,
        as the images' two-node smoke tier makes), or None where it can: a rootless engine
        needs ``tun`` opened as this user. Host and no network need nothing."""
        if not self.rootless or (tun.exists() and can_open(tun)):
            return None
        through = f"rootless {self.name} gives a container a network through {tun}"
        if not tun.exists():
            return f"{through}, which this machine lacks"
        return f"{through}, which this user cannot open (mode {tun.stat().st_mode & 0o777:04o})"

    def slow_store(self) -> str | None:
        """Why this engine's image store is slow, or None: a rootless engine that keeps its
        images with vfs copies every layer whole, for each build step and each container (a
        builder image of 1 GB: about 10 s a container); overlay shares them."""
        if not self.rootless or self.storage != "vfs":
            return None
        return (
            f"rootless {self.name} keeps its images with vfs, which copies a whole image for every container "
            "and every image build step (overlay shares them)"
        )

    def network_create(self, name: str, subnet: str) -> list[str]:
        return [*self.command, "network", "create", "--subnet", subnet, name]

    def networks(self) -> list[str]:
        return [*self.command, "network", "ls", "--format", "{{.Name}}"]

    def network_remove(self, name: str) -> list[str]:
        return (
            [*self.command, "network", "rm", "--force", name]
            if self.name is EngineName.PODMAN
            else [*self.command, "network", "rm", name]
        )

    def remove_image(self, tag: str) -> list[str]:
        return [*self.command, "rmi", "--force", tag]

    def untag(self, reference: str) -> list[str]:
        """Remove the name ``reference`` and nothing else: the image stays under its other
        names (docker's rmi of a name, without --force, only untags while others remain)."""
        if self.name is EngineName.PODMAN:
            return [*self.command, "untag", reference, reference]
        return [*self.command, "rmi", reference]

    def image_size(self, tag: str) -> list[str]:
        return [*self.command, "image", "inspect", "--format", "{{.Size}}", tag]

    def tag(self, source: str, target: str) -> list[str]:
        return [*self.command, "tag", source, target]

    def push(self, reference: str, *, digest_file: Path, insecure: bool) -> list[str]:
        """Push ``reference``; podman writes the pushed digest to ``digest_file`` (docker's is
        read back with ``repo_digests``)."""
        if self.name is EngineName.PODMAN:
            return [
                *self.command,
                "push",
                *(["--tls-verify=false"] if insecure else []),
                "--digestfile",
                str(digest_file),
                reference,
            ]
        return [*self.command, "push", reference]

    def manifest_create(self, local: str, target: str, members: Sequence[str], *, insecure: bool) -> list[list[str]]:
        """The commands that make a manifest list of ``members`` (pushed references, by
        digest): podman builds ``local`` and adds each member; docker makes ``target`` at once."""
        if self.name is EngineName.PODMAN:
            tls = ["--tls-verify=false"] if insecure else []
            made = [[*self.command, "manifest", "create", local]]
            return made + [[*self.command, "manifest", "add", *tls, local, f"docker://{m}"] for m in members]
        return [[*self.command, "manifest", "create", *(["--insecure"] if insecure else []), target, *members]]

    def manifest_push(self, local: str, target: str, *, digest_file: Path, insecure: bool) -> list[str]:
        """Push the list to ``target``: podman writes the digest to ``digest_file``, docker prints it."""
        if self.name is EngineName.PODMAN:
            tls = ["--tls-verify=false"] if insecure else []
            return [
                *self.command,
                "manifest",
                "push",
                *tls,
                "--digestfile",
                str(digest_file),
                local,
                f"docker://{target}",
            ]
        return [*self.command, "manifest", "push", *(["--insecure"] if insecure else []), target]

    def manifest_remove(self, local: str, target: str) -> list[str]:
        """The local list, gone again (podman's by its local name, docker's by the target)."""
        if self.name is EngineName.PODMAN:
            return [*self.command, "manifest", "rm", local]
        return [*self.command, "manifest", "rm", target]

    def pull(self, reference: str, *, insecure: bool, platform: str | None = None) -> list[str]:
        """Pull ``reference``; ``platform`` (``linux/arm64``) for an image of another machine.
        A loopback registry speaks plain http: podman must be told, docker trusts 127.0.0.0/8."""
        argv = [*self.command, "pull"]
        argv += ["--tls-verify=false"] if insecure and self.name is EngineName.PODMAN else []
        argv += ["--platform", platform] if platform else []
        return [*argv, reference]

    def rootfs_layers(self, reference: str) -> list[str]:
        """The image's layers as diff ids (digests of each layer uncompressed), one a line: what
        its file system is, the same after a push and a pull, unlike the local image id."""
        return [
            *self.command,
            "image",
            "inspect",
            "--format",
            "{{range .RootFS.Layers}}{{println .}}{{end}}",
            reference,
        ]

    def repo_digests(self, reference: str) -> list[str]:
        return [*self.command, "image", "inspect", "--format", "{{range .RepoDigests}}{{println .}}{{end}}", reference]

    def image_id(self, tag: str) -> list[str]:
        return [*self.command, "image", "inspect", "--format", "{{.Id}}", tag]

    def import_rootfs(self, *, tarball: Path, tag: str, platform: str = X86_64) -> list[str]:
        """The image records the machine of its files: podman's ``--arch``, docker's
        ``--platform`` (a foreign image is then run through emulation, not refused)."""
        if platform == X86_64:
            return [*self.command, "import", str(tarball), tag]
        if self.name is EngineName.PODMAN:
            return [*self.command, "import", "--arch", DEBIAN_ARCH[platform], str(tarball), tag]
        return [*self.command, "import", "--platform", OCI_PLATFORM[platform], str(tarball), tag]

    def pid(self, container: str) -> list[str]:
        return [*self.command, "inspect", "--format", "{{.State.Pid}}", container]

    def containers(self, cell: str | None = None) -> list[str]:
        selector = f"label={LABEL}={cell}" if cell else f"label={LABEL}"
        return [*self.command, "ps", "--all", "--filter", selector, "--format", "{{.Names}}"]


def insecure_registry(reference: str) -> bool:
    """Whether a registry (or a reference into it) is on loopback: spoken to without TLS.

    >>> insecure_registry("127.0.0.1:5000/team"), insecure_registry("registry.internal/wheelmill:t")
    (True, False)
    """
    return reference.split("/", 1)[0].rsplit(":", 1)[0] in ("127.0.0.1", "localhost", "[::1]")


def left_behind(names: Sequence[str]) -> list[str]:
    """Of wheelmill's containers and networks (``wheelmill-<cell>-<pid>[-netless]``,
    ``wheelmill-smoke-<pid>``), those whose wheelmill process is gone: a killed run's. A live
    run's, another output root building the same cell, is not touched.

    >>> left_behind([f"wheelmill-cpu-py311-{os.getpid()}", f"wheelmill-smoke-{os.getpid()}-netless",
    ...              "wheelmill-cpu-py311-999999999", "other"])
    ['wheelmill-cpu-py311-999999999', 'other']
    """
    return [name for name in names if not _alive(_owner(name))]


def _owner(name: str) -> int | None:
    parts = name.removesuffix("-netless").rsplit("-", 1)
    return int(parts[1]) if len(parts) == 2 and parts[1].isdigit() else None


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return pid < 2**22  # another user's process (or no pid at all)
    return True


Which = Callable[[str], str | None]
Probe = Callable[[Sequence[str | Path]], Captured]


# What ``info`` is asked: the engine answers at all, whether it runs as this user, and its
# image store's driver.
INFO = {
    EngineName.PODMAN: "{{.Host.OS}} {{.Host.Security.Rootless}} {{.Store.GraphDriverName}}",
    EngineName.DOCKER: "{{.OSType}} {{.Driver}} {{.SecurityOptions}}",
}

# Where a rootless engine's store is vfs: how to give it overlay (Debian's podman 4.3, with
# no storage.conf, picks vfs for every user; containers-storage's names overlay, which Linux
# 5.13 on gives a user without fuse).
SLOW_STORE_FIX = {
    EngineName.PODMAN: "as root, install Debian's containers-storage (scripts/setup --system does), then as this "
    "user: podman system reset (it removes this user's images and containers)",
    EngineName.DOCKER: 'set "storage-driver": "overlay2" in ~/.config/docker/daemon.json and restart rootless docker',
}


def is_rootless(name: EngineName, info: str) -> bool:
    """Whether the engine's ``info`` (as ``INFO`` asks it) says it runs rootless.

    >>> is_rootless(EngineName.PODMAN, "linux true vfs"), is_rootless(EngineName.PODMAN, "linux false overlay")
    (True, False)
    >>> is_rootless(EngineName.DOCKER, "linux overlay2 [name=seccomp,profile=builtin name=rootless name=cgroupns]")
    True
    """
    words = info.split()
    return words[1:2] == ["true"] if name is EngineName.PODMAN else "name=rootless" in info


def storage_driver(name: EngineName, info: str) -> str:
    """The image store's driver the engine's ``info`` (as ``INFO`` asks it) names.

    >>> storage_driver(EngineName.PODMAN, "linux true vfs"), storage_driver(EngineName.DOCKER, "linux overlay2 []")
    ('vfs', 'overlay2')
    """
    words = info.split()
    return "".join(words[2:3] if name is EngineName.PODMAN else words[1:2])


def detect(
    choice: str, *, which: Which = shutil.which, probe: Probe | None = lambda argv: capture(argv, timeout=30)
) -> Engine | None:
    """The engine to use: ``auto`` takes podman, then docker, whichever answers; ``none``
    is the host. A named engine that does not answer is an error that says why. With no
    ``probe`` (a plan, which runs nothing) no engine is asked: ``auto`` takes the first
    installed, and a named one is taken as named."""
    if choice == "none":
        return None
    if choice not in ENGINE_CHOICES:
        raise UsageError(f"--engine {choice}: not an engine", fix=f"use one of: {', '.join(ENGINE_CHOICES)}")
    names = [EngineName.PODMAN, EngineName.DOCKER] if choice == "auto" else [EngineName(choice)]
    reasons = []
    for name in names:
        binary = which(name.value)
        if probe is None:  # nothing is asked: the first installed, or the one named
            if binary or choice != "auto":
                return Engine(name=name, binary=binary or name.value)
            continue
        if binary is None:
            reasons.append(f"{name}: not installed")
            continue
        answer = probe([binary, "info", "--format", INFO[name]])
        if answer.returncode == 0:
            said = answer.stdout
            return Engine(
                name=name, binary=binary, rootless=is_rootless(name, said), storage=storage_driver(name, said)
            )
        reasons.append(
            f"{name}: installed, but no engine answers ({(answer.stderr.strip().splitlines() or ['?'])[-1][:120]})"
        )
    if choice == "auto":
        return None
    raise PrecheckError(
        f"engine {choice}: {'; '.join(reasons)}",
        fix="start the engine (or run scripts/setup --system for podman), or use --engine none",
    )
