"""``wheelmill wants`` over what real installers send: a wheel built for CPython 3.11 alone in
the cpu channel, served by ``wheelmill index serve --access-log`` (and by nginx with
deploy/nginx-index.conf), asked for by real pip and uv on CPython 3.10 and 3.12, which it
cannot serve (the installs fail, as they should), once for a project the channel lacks, and
by this env's own 3.11, which it serves. ``wheelmill wants`` then ranks both interpreters'
wants with their Python and platform, from the log file and from a bucket's prefix holding
it (part of it gzipped, as a rotated log is)."""

from __future__ import annotations

import gzip
import json
import os
import platform
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.channels import tree_channel
from tests.integration.test_index import serving_nginx
from tests.objectstore import ObjectStore
from tests.ports import free_port
from tests.wheels import make_wheel
from wheelmill.index.roots import publish
from wheelmill.machine.process import HostRunner
from wheelmill.machine.toolchain import Found, find_python
from wheelmill.machine.tools import uv_bin

pytestmark = pytest.mark.integration

PROJECT, ABSENT, CHANNEL = "wm-wants", "wm-absent", "cpu"


@dataclass(frozen=True, kw_only=True)
class Asked:
    """An index whose cpu channel holds wm-wants for CPython 3.11 alone, and the access log
    of the installers that asked it."""

    root: Path
    log: Path


def python_of(version: str) -> Path:
    """CPython ``version`` where the builds find a cell's (pyenv's, /opt/python's); skips
    where this machine has none."""
    found = find_python(version, HostRunner())
    if not isinstance(found, Found):
        pytest.skip(f"CPython {version} is not installed (a cell's Python: pyenv's or /opt/python/{version})")
    return found.path


def isolated_env(work: Path) -> dict[str, str]:
    """No pip or uv configuration of this machine's, and no cache left behind: pip keeps
    none, uv its own under ``work``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    return {
        **env,
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_CACHE_DIR": "1",
        "UV_NO_CONFIG": "1",
        "UV_PYTHON_DOWNLOADS": "never",
        "UV_CACHE_DIR": str(work / "uv-cache"),  # uv_install gives each run its own
    }


def ask(argv: list[str], env: dict[str, str], *, served: bool) -> None:
    """Run an installer; it installs where the channel serves it, and fails where not."""
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=300)
    assert (done.returncode == 0) is served, done.stdout + done.stderr


@contextmanager
def index_serve(root: Path, log: Path) -> Iterator[str]:
    """``wheelmill index serve --access-log`` on a loopback port until the block ends: the
    channel's simple URL."""
    port = free_port()
    command = [sys.executable, "-m", "wheelmill", "index", "serve", "--port", str(port), "--access-log", str(log)]
    env = {**os.environ, "WHEELMILL_INDEX_ROOT": str(root)}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not answers(port):
            assert process.poll() is None and time.monotonic() < deadline, "index serve did not start"
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/{CHANNEL}/simple/"
    finally:
        process.terminate()
        _out, err = process.communicate(timeout=30)
    assert process.returncode == 0 and not err, err


def answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def published(work: Path) -> Path:
    """The index tree: wm-wants 1.0 for CPython 3.11 on this machine's platform, alone."""
    root = work / "index"
    wheel = make_wheel(work / "dist", PROJECT, "1.0", tag=f"cp311-cp311-manylinux_2_17_{platform.machine()}")
    publish(tree_channel(root, CHANNEL), wheel)
    return root


def pip(python: str, *args: str) -> list[str]:
    return [python, "-m", "pip", "--no-cache-dir", *args]


def download(python: str, dest: Path, index: str, project: str) -> list[str]:
    return pip(python, "download", "--no-deps", "--dest", str(dest), "--index-url", index, project)


def uv_install(python: str, work: Path, index: str, project: str) -> list[str]:
    """uv with a cache of its own under ``work``, as on a machine of its own: uv keeps a page
    it read for a minute (its Cache-Control), and a second run would not ask again."""
    into = ["--target", str(work / "target"), "--cache-dir", str(work / "cache")]
    return [uv_bin(), "pip", "install", "--python", python, *into, "--index-url", index, project]


def ask_everything(index: str, work: Path) -> None:
    """pip (install and download) and uv on 3.10, pip and uv on 3.12, all failing; pip on
    3.12 for a project the channel lacks; this env's pip on 3.11, served; and a request by
    no installer."""
    env = isolated_env(work)
    for version in ("3.10", "3.12"):
        python = str(python_of(version))
        ask(
            pip(python, "install", "--target", str(work / f"pip-{version}"), "--index-url", index, PROJECT),
            env,
            served=False,
        )
        ask(uv_install(python, work / f"uv-{version}", index, PROJECT), env, served=False)
    ask(download(str(python_of("3.10")), work / "downloads", index, PROJECT), env, served=False)
    ask(download(str(python_of("3.12")), work / "downloads", index, ABSENT), env, served=False)
    ask(download(sys.executable, work / "downloads", index, PROJECT), env, served=True)
    with urllib.request.urlopen(f"{index}{PROJECT}/", timeout=10) as page:
        assert page.status == 200


def expected_platform() -> str:
    """What pip and uv here say of the platform, as ``wants`` labels it: this machine's glibc and cpu."""
    libc, version = platform.libc_ver()
    assert libc == "glibc", "pip and uv say no glibc on this machine"
    return f"manylinux_{version.replace('.', '_')}_{platform.machine()}"


def want(python: str, count: int, installers: dict[str, int], project: str = PROJECT) -> dict[str, Any]:
    return {
        "channel": CHANNEL,
        "project": project,
        "python": python,
        "implementation": "CPython",
        "platform": expected_platform(),
        "reason": "no compatible file" if project == PROJECT else "no such project",
        "count": count,
        "installers": installers,
    }


EXPECTED = [
    want("3.10", 3, {"pip": 2, "uv": 1}),
    want("3.12", 2, {"pip": 1, "uv": 1}),
    want("3.12", 1, {"pip": 1}, project=ABSENT),
]


def wheelmill_wants(root: Path, *args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "wheelmill", "wants", *args],
        env={**os.environ, **(env or {}), "WHEELMILL_INDEX_ROOT": str(root)},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0 and not done.stderr, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def asked(tmp_path_factory: pytest.TempPathFactory) -> Asked:
    work = tmp_path_factory.mktemp("wants")
    for version in ("3.10", "3.12"):
        python_of(version)
    root, log = published(work), work / "access.log"
    with index_serve(root, log) as index:
        ask_everything(index, work)
    return Asked(root=root, log=log)


def test_wants_ranks_what_pip_and_uv_on_pythons_the_channel_cannot_serve_asked(asked: Asked) -> None:
    report = json.loads(wheelmill_wants(asked.root, "--log", str(asked.log), "--json"))
    assert report["wants"] == EXPECTED
    assert (report["requests"], report["served"], report["skipped"]) == (7, 1, 0)
    assert "127.0.0.1" not in asked.log.read_text(), "no client address"
    table = wheelmill_wants(asked.root, "--log", str(asked.log), "--channel", CHANNEL)
    print(f"\nwheelmill wants --log access.log --channel {CHANNEL}:\n{table}")  # what the run shows (-s)
    lines = table.splitlines()
    assert all(len(line) <= 100 for line in lines), table
    said = f"3 wants: 6 of 7 installers' requests of project pages found no file; {report['lines']} lines read"
    assert lines[-1] == f"{said}, 0 skipped"


def test_wants_reads_the_log_from_a_bucket_prefix_a_rotated_part_gzipped(
    asked: Asked, object_store: ObjectStore
) -> None:
    lines = asked.log.read_bytes().splitlines(keepends=True)
    prefix = f"logs-{os.urandom(4).hex()}/"
    client = object_store.client()
    key = f"{prefix}wheelmill-wants.log"
    client.put_object(Bucket=object_store.bucket, Key=f"{key}.1.gz", Body=gzip.compress(b"".join(lines[:5])))
    client.put_object(Bucket=object_store.bucket, Key=key, Body=b"".join(lines[5:]))
    try:
        printed = wheelmill_wants(asked.root, "--log", object_store.url(prefix), "--json", env=object_store.environ())
    finally:
        for name in (key, f"{key}.1.gz"):
            client.delete_object(Bucket=object_store.bucket, Key=name)
    assert json.loads(printed)["wants"] == EXPECTED


def test_nginx_logs_what_wants_reads(asked: Asked, tmp_path: Path) -> None:
    """deploy/nginx-index.conf as it is: its access_log, relative to nginx's prefix."""
    env = isolated_env(tmp_path)
    with serving_nginx(asked.root, tmp_path / "nginx") as base:
        index = f"{base}/{CHANNEL}/simple/"
        ask(download(str(python_of("3.12")), tmp_path / "downloads", index, PROJECT), env, served=False)
        ask(uv_install(str(python_of("3.10")), tmp_path / "uv", index, PROJECT), env, served=False)
        with urllib.request.urlopen(f"{index}{PROJECT}/?format=application/vnd.pypi.simple.v1+json", timeout=10):
            pass
    log = tmp_path / "nginx" / "wheelmill-wants.log"
    assert "127.0.0.1" not in log.read_text(), "no client address"
    report = json.loads(wheelmill_wants(asked.root, "--log", str(log), "--json"))
    assert report["wants"] == [want("3.10", 1, {"uv": 1}), want("3.12", 1, {"pip": 1})]
    assert (report["lines"], report["skipped"]) == (len(log.read_text().splitlines()), 0)
