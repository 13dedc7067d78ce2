"""A new user without root builds a cell, as a hosted runner does: an account made here (with
the subordinate ids ``useradd`` gives it) and an empty image store; then, as that account:

1. in a fresh clone, the README's first command, ``scripts/setup && .venv/bin/nox -s
   build-<cell>``: the base bootstrapped with mmdebstrap's unshare mode, the builder image
   built, the cell built in a rootless podman container (whichever engine answers first, as
   the README runs it);
2. in another fresh clone, the run steps of build.yml's build job, read from the workflow
   and run with its job environment as GitHub gives it to a push with no repository
   variables (``CELL`` the cell): the base and the builder image reused from the account's
   store; then every path its upload step names must exist;
3. where the account cannot open /dev/net/tun (rootless podman's networks need it),
   ``wheelmill image build`` must stop before building anything, with one line saying so.

Prints each run's time, what its report says of the engine (``rootless``) and the image
(where the base and the builder came from), and the wheels' tags; checks the tags are the
ones the matrix promises the cell (the report's platform-tag and glibc-baseline checks:
within the glibc of the base the cell is built on, which docs/matrix.md's table shows).
Needs root (to make the account; everything after runs as the account) and
``scripts/setup --system`` (podman, uidmap, mmdebstrap). The account and its home go when
the benchmark ends. With ``--image-registry HOST:PORT/NAMESPACE`` (a loopback one) the
README's run is a fleet's first runner: it pushes the base and the builder image it made
there, read-write, for other stores to pull (the test suite's run registry). Where this
process has the compiler cache's tiers set (``WHEELMILL_COMPILER_CACHE_TIERS`` and the shared
tier's location), the README run compiles through them, as a fleet's runner does; the build
job runs with the environment build.yml gives it, no repository variable set. Each run's line
says where its compiles came from (the cache's hits and misses).
Usage: ``sudo .venv/bin/python benchmarks/rootless.py [--cell cpu-py311] [--image-registry REGISTRY]``
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import runs
import yaml

from wheelmill.inputs.matrix import load_matrix
from wheelmill.machine.engine import insecure_registry
from wheelmill.machine.registry import is_registry
from wheelmill.wheel.wheelfile import read_wheel

USER = f"wheelmill-bench-{os.getpid()}"
# What a login shell would reset and the installers need: this machine's indexes and
# certificates (its own TLS authority, where a proxy has one).
# The installers' settings, and the compiler cache's tiers where they are set (a fleet's
# shared tier, as the test suite gives every build of its run).
FORWARDED = ("PIP_", "UV_", "SSL_CERT_", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "WHEELMILL_COMPILER_CACHE_")
OWN = ("_CACHE_DIR",)  # the installers' caches stay the account's own: another user's it may not write
WORKFLOW = runs.ROOT / ".github" / "workflows" / "build.yml"
PROMISES = ("platform-tag", "glibc-baseline")  # the report's checks of a wheel's tag against the cell's base


@contextmanager
def account() -> Iterator[Path]:
    """A user of its own, with subordinate ids and a home where useradd puts one (outside any
    directory only root may enter); removed, with its home and everything it ran. Its home."""
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", USER], check=True)
    entry = pwd.getpwnam(USER)
    uid = entry.pw_uid
    try:
        shutil.rmtree(runtime_dir(), ignore_errors=True)  # a killed run's, whose account had this uid
        runtime_dir().mkdir(mode=0o700)
        os.chown(runtime_dir(), uid, entry.pw_gid)
        yield Path(entry.pw_dir)
    finally:
        # podman leaves a pause process (and the user's systemd, where there is one) behind,
        # and, with no XDG_RUNTIME_DIR, its run-time files in /tmp
        subprocess.run(["pkill", "-KILL", "-u", USER], check=False)
        time.sleep(1)
        subprocess.run(["userdel", "--remove", "--force", USER], check=False, capture_output=True)
        left_behind = (f"/tmp/podman-run-{uid}", f"/tmp/containers-user-{uid}", f"/tmp/wheelmill-run-{uid}")  # noqa: S108
        for left in left_behind:
            shutil.rmtree(left, ignore_errors=True)
        _remove_owned_by(uid, Path("/tmp"))  # noqa: S108 - e.g. uv's lock files for its build backends


def _remove_owned_by(uid: int, directory: Path) -> None:
    """What the account left directly in ``directory``: every entry it owns."""
    for entry in directory.iterdir():
        try:
            if entry.lstat().st_uid != uid:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink()
        except OSError:
            continue  # gone meanwhile, or not ours to remove


def as_account(command: str) -> list[str]:
    """``command`` in a login shell of the account (its own environment, HOME and PATH), with
    this machine's installer settings and the run-time directory a login session
    (systemd-logind) gives a user, which runuser does not."""
    kept = ",".join(sorted(n for n in os.environ if n.startswith(FORWARDED) and not n.endswith(OWN)))
    whitelist = [f"--whitelist-environment={kept}"] if kept else []
    session = f"export XDG_RUNTIME_DIR={runtime_dir()}"
    return ["runuser", "--login", *whitelist, USER, "--command", f"{session} && {command}"]


def as_user(command: str, *, log: Path, cwd: Path) -> float:
    """Seconds ``command`` ran as the account, from ``cwd``; its output into ``log`` (this
    process writes it: the account's home goes with the account, a failed command's log
    stays in the work directory)."""
    return runs.timed(as_account(f"cd {shlex.quote(str(cwd))} && {command}"), log=log)


def runtime_dir() -> Path:
    return Path("/tmp") / f"wheelmill-run-{pwd.getpwnam(USER).pw_uid}"  # noqa: S108 - as logind's /run/user/<uid>


def configured(home: Path) -> None:
    """This machine's installer configuration (its indexes, mirrors and certificates) for the
    account as well: a hosted runner's account has its own; a new one here has none."""
    for relative in (".config/pip/pip.conf", ".config/uv/uv.toml"):
        mine = Path.home() / relative
        if mine.is_file():
            theirs = home / relative
            theirs.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(mine, theirs)
    subprocess.run(["chown", "-R", f"{USER}:{USER}", str(home / ".config")], check=False)


def report(clone: Path, cell: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((clone / "wheels" / cell / "report.json").read_text())
    return loaded


def tags(clone: Path, cell: str) -> list[str]:
    return sorted(
        {str(tag) for wheel in (clone / "wheels" / cell / "dist").glob("*.whl") for tag in read_wheel(wheel).tags}
    )


@dataclass(frozen=True)
class Job:
    """What a job of a workflow runs on its runner: its run steps, its environment, and
    the paths its upload step names."""

    steps: tuple[str, ...]
    env: dict[str, str]
    uploads: tuple[str, ...]


def build_job(cell: str) -> Job:
    """build.yml's build job as GitHub runs it for ``cell`` on a push from this repository
    where no repository variable is set (a fork's runner, or a team without a fleet): the
    steps that run (``uses`` steps are GitHub's: the checkout, the credentials this run does
    not get, the upload), with every expression evaluated."""
    job = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))["jobs"]["build"]
    steps = job["steps"]
    for step in steps:
        if "run" in step and "if" in step:
            raise SystemExit(runs.broken(f"{WORKFLOW.name}: step {step.get('name')!r} has an if: teach the benchmark"))
    uploads = [s["with"]["path"] for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact@")]
    return Job(
        steps=tuple(evaluated(s["run"], cell) for s in steps if "run" in s),
        env={"CI": "true", "GITHUB_ACTIONS": "true", **{k: evaluated(str(v), cell) for k, v in job["env"].items()}},
        uploads=tuple(line.strip() for text in uploads for line in evaluated(text, cell).splitlines() if line.strip()),
    )


def evaluated(text: str, cell: str) -> str:
    """``text`` with each ``${{ }}`` as GitHub evaluates it where no repository variable is
    set: ``matrix.cell`` is the cell, ``vars.X`` empty, and ``vars.X && ... || 'y'`` (or
    ``vars.X != '' && ...``) its fallback ``y``. Any other expression breaks the benchmark,
    which must then learn it, rather than run something the workflow does not."""

    def one(match: re.Match[str]) -> str:
        expression = match.group(1).strip()
        if expression == "matrix.cell":
            return cell
        if re.fullmatch(r"vars\.\w+", expression):
            return ""
        fallback = re.fullmatch(r"vars\.\w+(?: != '')? && .+ \|\| '([^']*)'", expression)
        if fallback is None:
            raise SystemExit(runs.broken(f"{WORKFLOW.name}: cannot evaluate ${{{{ {expression} }}}}"))
        return fallback.group(1)

    return re.sub(r"\$\{\{(.*?)\}\}", one, text)


def run_job(job: Job, *, clone: Path, log: Path) -> float:
    """Seconds the job's steps ran as the account in ``clone``, each as GitHub's default
    shell runs a step (``bash -e``), in the job's environment."""
    exported = " ".join(f"{name}={shlex.quote(value)}" for name, value in sorted(job.env.items()))
    return sum(
        as_user(f"export {exported} && bash -e -c {shlex.quote(step)}", log=log, cwd=clone) for step in job.steps
    )


def missing_uploads(job: Job, clone: Path) -> list[str]:
    return [pattern for pattern in job.uploads if not list(clone.glob(pattern.rstrip("/")))]


def image_refused(clone: Path, cell: str, log: Path) -> str:
    """Where the account cannot open /dev/net/tun: ``wheelmill image build`` must stop at
    once, exit 5, with one line naming it. Else a line saying why nothing was tried."""
    if subprocess.run(as_account("test -r /dev/net/tun -a -w /dev/net/tun"), check=False).returncode == 0:
        return "not tried: the account opens /dev/net/tun, so the images' networks would work"
    argv = f".venv/bin/wheelmill image build --cell {cell} --edition runtime"
    refused = subprocess.run(
        as_account(f"cd {shlex.quote(str(clone))} && {argv}"), capture_output=True, text=True, check=False
    )
    with log.open("a") as out:
        out.write(f"$ {argv}\n{refused.stdout}{refused.stderr}# exit status {refused.returncode}\n")
    lines = refused.stderr.strip().splitlines()
    if refused.returncode != 5 or len(lines) != 1 or "/dev/net/tun" not in lines[0]:
        raise SystemExit(runs.broken(f"image build without /dev/net/tun: exit {refused.returncode}: {lines[-3:]}"))
    return f"refused at once (exit 5): {lines[0]}"


def containers_left(clone: Path, log: Path) -> list[str]:
    """The account's containers of any cell (the engine's label on them) once both runs ended."""
    names = clone / ".containers-left"
    as_user(f"podman ps --all --filter label=wheelmill.cell --format '{{{{.Names}}}}' > {names}", log=log, cwd=clone)
    return names.read_text().split()


def describe(name: str, seconds: float, done: dict[str, Any]) -> str:
    image = done["facts"].get("image", {})
    took = {step["step"]: step["seconds"] for step in done["steps"] if step.get("recipe") is None}
    moved = [f"{t['action']} the {t['image']}" for t in image.get("transfers", [])]
    return (
        f"{USER} ({name}): {seconds:6.1f} s; engine {done['facts']['engine']}, rootless "
        f"{done['facts'].get('rootless')}; base {image.get('base_origin')}, builder {image.get('origin')} "
        f"({image.get('tag')}) in {took.get('prepare-image')} s{''.join(f', {m}' for m in moved)}, its containers "
        f"started in {took.get('prepare-container')} s; {compiles(done)}; status {done['status']}"
    )


def compiles(done: dict[str, Any]) -> str:
    """Where the run's compiles came from: the compiler cache's hits and misses, all recipes."""
    stats = [s for s in done["facts"].get("compiler_cache", {}).values() if s]
    hits, misses = sum(s["hits"] for s in stats), sum(s["misses"] for s in stats)
    return f"compiles {hits} hits, {misses} misses"


def shared_through(registry: str | None) -> str:
    """The README run's settings for a fleet's registry: read-write, as a trusted runner's."""
    if registry is None:
        return ""
    if not is_registry(registry) or not insecure_registry(registry):
        raise SystemExit(runs.broken(f"--image-registry {registry!r}: give a loopback host:port/namespace"))
    return f"export WHEELMILL_IMAGE_REGISTRY={shlex.quote(registry)} WHEELMILL_SHARED_WRITES=read-write && "


def fresh_clone(home: Path, name: str, log: Path) -> Path:
    """A clone of this checkout in the account's home, cloned by root (the checkout may sit
    where the account cannot read), then given to the account."""
    clone = home / name
    runs.timed(["git", "clone", "--quiet", str(runs.ROOT), str(clone)], log=log)
    runs.timed(["chown", "-R", f"{USER}:{USER}", str(clone)], log=log)
    return clone


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", default="cpu-py311")
    parser.add_argument("--image-registry", help="a loopback registry the README run pushes its images to")
    args = parser.parse_args()
    if os.geteuid() != 0:
        return runs.broken("run as root: the benchmark makes an account, then builds as it")
    load_matrix(runs.ROOT / "recipes" / "matrix.toml").cell(args.cell)  # an unknown cell stops here
    job, shared = build_job(args.cell), shared_through(args.image_registry)
    with runs.workspace("wheelmill-rootless-") as work:
        log = work / "rootless.log"
        with account() as home:
            configured(home)
            readme, runner = fresh_clone(home, "wheelmill", log), fresh_clone(home, "runner", log)
            try:
                readme_command = f"{shared}scripts/setup && .venv/bin/nox -s build-{args.cell}"
                first = as_user(readme_command, log=log, cwd=readme)
                made, found = report(readme, args.cell), tags(readme, args.cell)
                wheels = len(list((readme / "wheels" / args.cell / "dist").glob("*.whl")))
                second = run_job(job, clone=runner, log=log)
                again, unloaded = report(runner, args.cell), missing_uploads(job, runner)
                images = image_refused(readme, args.cell, log)
                left = containers_left(readme, log)
            finally:  # the cell's logs outlive the account where a run fails
                for clone in (readme, runner):
                    if (clone / "wheels" / args.cell / "logs").is_dir():
                        kept = work / clone.name / "logs"
                        shutil.copytree(clone / "wheels" / args.cell / "logs", kept, dirs_exist_ok=True)
        print(describe("README, empty store", first, made))
        print(describe("build.yml's build job, second clone", second, again))
        print(f"wheels: {wheels}; their tags: {', '.join(found)}")
        checks = [(s["step"], c) for s in made["steps"] for c in s.get("checks", [])]
        flagged = [f"{step}/{c['name']}: {c['verdict']}" for step, c in checks if c["verdict"] in ("warn", "fail")]
        print(f"the README run's python: {made['facts'].get('python')}; checks warned or failed: "
              f"{', '.join(flagged) or 'none'}")  # fmt: skip
        promises = [c for _step, c in checks if c["name"] in PROMISES]
        for check in promises:
            print(f"  {check['name']}: {check['verdict']}: {check['detail']}")
        uploaded = f"missing {', '.join(unloaded)}" if unloaded else "all there"
        print(f"build job's uploads: {', '.join(job.uploads)}: {uploaded}")
        print(f"images as the account: {images}")
        print(f"the account's containers left: {', '.join(left) or 'none'}")
        if not wheels or not found or not promises or any(c["verdict"] != "pass" for c in promises):
            return runs.broken(f"the wheels' tags {found} are not what the matrix promises {args.cell}")
        if not made["facts"].get("rootless") or made["status"] != "ok" or again["status"] != "ok":
            return runs.broken("the README's run was not rootless, or a run did not end ok")
        if (again["facts"]["image"]["origin"], again["facts"]["image"]["base_origin"]) != ("reused", "reused"):
            return runs.broken("the build job's run did not reuse the base and the builder image")
        if flagged:
            return runs.broken(f"the README's run warned or failed: {flagged}")
        if left:
            return runs.broken(f"the builds left containers behind: {left}")
        if unloaded:
            return runs.broken(f"build.yml's build job uploads {unloaded}, which its run did not write")
    return 0


if __name__ == "__main__":
    sys.exit(main())
