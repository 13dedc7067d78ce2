"""A new user without root builds a cell, as a hosted runner does: an account made here (with
the subordinate ids ``useradd`` gives it), a fresh clone in its home, an empty image store,
then the README's first command as that user, twice:

1. ``scripts/setup && .venv/bin/nox -s <build session>`` with an empty store: the base
   bootstrapped with mmdebstrap's unshare mode, the builder image built, the cell built in a
   rootless podman container;
2. the build again from an empty output root (else nothing would be built): the base and the
   builder image reused from the account's store, nothing bootstrapped or built.

Prints each run's time, what its report says of the engine (``rootless``) and the image
(where the base and the builder came from), and the wheels' tags; checks the tags are the
ones the matrix promises the cell (the report's platform-tag and glibc-baseline checks:
within the glibc of the base the cell is built on, which docs/matrix.md's table shows).
Needs root (to make the account; everything after runs as the account) and
``scripts/setup --system`` (podman, uidmap, mmdebstrap). The account and its home go when
the benchmark ends. ``--smoke``: the account bootstraps the cell's base with the argv wheelmill
gives mmdebstrap's unshare mode, imports it into its own (rootless) podman store, and runs
a container of it with no network (a minute; no build, no figure). Usage:
``sudo .venv/bin/python benchmarks/rootless.py [--cell cpu-py311] [--smoke]``
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import runs

from wheelmill.inputs.matrix import load_matrix
from wheelmill.machine.bootstrap import Bootstrapper, bootstrapper
from wheelmill.machine.builder_images import choose_base, debian_mirror
from wheelmill.machine.pins import load_pins
from wheelmill.wheel.wheelfile import read_wheel

USER = f"wheelmill-bench-{os.getpid()}"
# What a login shell would reset and the installers need: this machine's indexes and
# certificates (its own TLS authority, where a proxy has one).
FORWARDED = ("PIP_", "UV_", "SSL_CERT_", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
PROMISES = ("platform-tag", "glibc-baseline")  # the report's checks of a wheel's tag against the cell's base


@contextmanager
def account() -> Iterator[Path]:
    """A user of its own, with subordinate ids and a home where useradd puts one (outside any
    directory only root may enter); removed, with its home and everything it ran. Its home."""
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", USER], check=True)
    entry = pwd.getpwnam(USER)
    uid = entry.pw_uid
    runtime_dir().mkdir(mode=0o700)
    os.chown(runtime_dir(), uid, entry.pw_gid)
    try:
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


def as_user(command: str, *, log: Path, cwd: Path) -> float:
    """Seconds ``command`` ran as the account, in a login shell (its own environment, HOME
    and PATH), from ``cwd``; its output into ``log`` (this process writes it: the account's
    home goes with the account, a failed command's log stays in the work directory)."""
    kept = ",".join(sorted(name for name in os.environ if name.startswith(FORWARDED)))
    login = ["runuser", "--login", *([f"--whitelist-environment={kept}"] if kept else []), USER]
    # the run-time directory a login session (systemd-logind) gives a user, which runuser does not
    session = f"export XDG_RUNTIME_DIR={runtime_dir()} && cd {shlex.quote(str(cwd))}"
    return runs.timed([*login, "--command", f"{session} && {command}"], log=log)


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


def smoke(cell: str, home: Path, log: Path) -> int:
    """The base bootstrapped, imported and run by the account alone."""
    variant = load_matrix(runs.ROOT / "recipes" / "matrix.toml").cell(cell).variant
    base = choose_base(load_pins(runs.ROOT / "containers" / "pins.toml"), variant, policy="bootstrap")
    how: Bootstrapper = bootstrapper(root=False, user=USER)
    tarball = home / "base.tar"
    argv = how.commands(base, mirror=debian_mirror(None), tarball=tarball)[0]
    made = as_user(shlex.join(argv), log=log, cwd=home)
    ran = as_user(
        f"podman import --quiet {tarball} {base.reference} && podman info --format '{{{{.Host.Security.Rootless}}}}' "
        f"&& podman run --rm --network=none {base.reference} cat /etc/debian_version",
        log=log,
        cwd=home,
    )
    lines = log.read_text().splitlines()
    rootless, debian = lines[-3], lines[-2]
    print(f"{USER}: {how.tool} --mode=unshare {base.suite} in {made:.1f} s; imported and run in {ran:.1f} s")
    print(f"  podman rootless: {rootless}; the base says Debian {debian}")
    if rootless != "true" or not debian[:1].isdigit():
        return runs.broken(f"the account's podman is not rootless ({rootless}) or its container did not run")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", default="cpu-py311")
    parser.add_argument("--smoke", action="store_true", help="bootstrap, import and run the base as the account")
    args = parser.parse_args()
    if os.geteuid() != 0:
        return runs.broken("run as root: the benchmark makes an account, then builds as it")
    load_matrix(runs.ROOT / "recipes" / "matrix.toml").cell(args.cell)  # an unknown cell stops here
    if args.smoke:
        with runs.workspace("wheelmill-rootless-") as work, account() as home:
            return smoke(args.cell, home, work / "rootless.log")
    with runs.workspace("wheelmill-rootless-") as work:
        user, log = USER, work / "rootless.log"
        with account() as home:
            clone = home / "wheelmill"
            configured(home)
            # cloned by root (the checkout may sit where the account cannot read), then given to it
            runs.timed(["git", "clone", "--quiet", str(runs.ROOT), str(clone)], log=log)
            runs.timed(["chown", "-R", f"{user}:{user}", str(clone)], log=log)
            session = f"build-{args.cell}"
            env = "WHEELMILL_ENGINE=podman"
            try:
                first = as_user(f"scripts/setup && {env} .venv/bin/nox -s {session}", log=log, cwd=clone)
                made = report(clone, args.cell)
                # the output root gone (else nothing is built again): the base and builder image stay
                second = as_user(f"rm -rf wheels && {env} .venv/bin/nox -s {session}", log=log, cwd=clone)
                again = report(clone, args.cell)
                found = tags(clone, args.cell)
            finally:  # the cell's logs outlive the account where a run fails
                if (clone / "wheels" / args.cell / "logs").is_dir():
                    shutil.copytree(clone / "wheels" / args.cell / "logs", work / "logs", dirs_exist_ok=True)
        for name, seconds, done in (("empty store", first, made), ("second run", second, again)):
            image = done["facts"].get("image", {})
            print(
                f"{user} ({name}): {seconds:6.1f} s; engine {done['facts']['engine']}, rootless "
                f"{done['facts'].get('rootless')}; base {image.get('base_origin')}, builder {image.get('origin')} "
                f"({image.get('tag')}); status {done['status']}"
            )
        print(f"wheels' tags: {', '.join(found)}")
        promises = [c for s in made["steps"] for c in s.get("checks", []) if c["name"] in PROMISES]
        for check in promises:
            print(f"  {check['name']}: {check['verdict']}: {check['detail']}")
        if not found or not promises or any(c["verdict"] != "pass" for c in promises):
            return runs.broken(f"the wheels' tags {found} are not what the matrix promises {args.cell}")
        if not (made["facts"].get("rootless") and again["facts"]["image"]["origin"] == "reused"):
            return runs.broken("the first run was not rootless, or the second did not reuse the builder image")
    return 0


if __name__ == "__main__":
    sys.exit(main())
