"""The fetch step: retries proven against a real HTTP server that fails N times and then
serves, sha256 verification, sdists found through a PEP 691 index, git at a pinned commit.

The fetch step runs exactly as in a build (the executor's retry wrapper, the real download
and sha256 verification, the shared cache); only the server is ours, on loopback.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from wheelmill.building.context import RunContext
from wheelmill.building.pipeline import host, run_step
from wheelmill.building.plan import StepKind, plan_cell
from wheelmill.building.products import Sources
from wheelmill.building.report import CellReport, StepRecord
from wheelmill.building.ui import UI
from wheelmill.errors import ConfigError, FetchError, IntegrityError
from wheelmill.inputs.matrix import load_matrix
from wheelmill.inputs.recipes import load_recipes
from wheelmill.machine.package_sources import machine_sources
from wheelmill.output.layout import CellLayout
from wheelmill.output.report import Status
from wheelmill.settings import Settings
from wheelmill.terminal import make_console

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent.parent


def sdist_bytes(name: str = "flaky_pkg", version: str = "1.0") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tf:
        for path, text in {
            "setup.py": "from setuptools import setup\nsetup()\n",
            "PKG-INFO": f"Name: {name}\nVersion: {version}\n",
        }.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{name}-{version}/{path}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@dataclass
class Behaviour:
    """What the server does: fail the first ``failures`` requests of a file, then serve."""

    payload: bytes
    failures: int = 0
    failure: str = "503"  # 503 | drop | short | 404
    corrupt: bool = False
    requests: list[str] = field(default_factory=list)


class FlakyServer:
    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        handler = self._handler()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        behaviour = self.behaviour

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                behaviour.requests.append(self.path)
                file_requests = sum(1 for r in behaviour.requests if not r.startswith("/simple/"))
                if self.path.startswith("/simple/"):
                    self._index()
                elif file_requests <= behaviour.failures:
                    self._fail()
                else:
                    self._send(
                        200,
                        behaviour.payload[::-1] if behaviour.corrupt else behaviour.payload,
                        "application/octet-stream",
                    )

            def _index(self) -> None:
                if self.path.rstrip("/") != "/simple/flaky-pkg":
                    self._send(404, b"not found", "text/plain")
                    return
                digest = hashlib.sha256(behaviour.payload).hexdigest()
                page = {
                    "meta": {"api-version": "1.1"},
                    "name": "flaky-pkg",
                    "files": [
                        {
                            "filename": "flaky_pkg-1.0.tar.gz",
                            "url": "/files/flaky_pkg-1.0.tar.gz",
                            "hashes": {"sha256": digest},
                        }
                    ],
                }
                self._send(200, json.dumps(page).encode(), "application/vnd.pypi.simple.v1+json")

            def _fail(self) -> None:
                match behaviour.failure:
                    case "503":
                        self._send(503, b"busy", "text/plain")
                    case "404":
                        self._send(404, b"gone", "text/plain")
                    case "drop":
                        self.close_connection = True
                        self.connection.shutdown(2)
                    case "short":
                        self.send_response(200)
                        self.send_header("Content-Length", str(len(behaviour.payload)))
                        self.end_headers()
                        self.wfile.write(behaviour.payload[:10])
                        self.close_connection = True

            def _send(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        return Handler

    def __enter__(self) -> FlakyServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def fetch_once(
    tmp_path: Path, source: str, *, attempts: int = 4, env: dict[str, str] | None = None
) -> tuple[StepRecord, Path]:
    """Run the fetch step of a recipe with ``source`` (TOML lines) in a fresh cell layout."""
    recipes = tmp_path / "recipes"
    if not recipes.exists():
        recipes.mkdir()
        shutil.copy(ROOT / "recipes" / "matrix.toml", recipes)
    (recipes / "flaky-pkg.toml").write_text(f'name = "flaky-pkg"\n[source]\n{source}\n')
    matrix = load_matrix(recipes / "matrix.toml")
    settings = Settings.from_environ(
        {"WHEELMILL_RETRIES": str(attempts), "WHEELMILL_RETRY_DELAY": "0.01", **(env or {})}
    )
    cell_plan = plan_cell(matrix, load_recipes(recipes), matrix.cell("cpu-py311"), ["flaky-pkg"], settings)
    layout = CellLayout(output=tmp_path / "wheels", cell="cpu-py311")
    run = RunContext(plan=cell_plan, settings=settings, layout=layout, engine=None, on_line=lambda line: None)
    report = CellReport(plan=cell_plan, path=layout.report)
    # What the pre-checks would have found: the package sources.
    sources = Sources(packages=machine_sources(settings), lock_origin="not used")
    report.steps.append(StepRecord(step=cell_plan.steps[0], status=Status.OK, made=(sources,)))
    step = next(s for s in cell_plan.steps if s.kind is StepKind.FETCH)
    with ExitStack() as held:
        record = run_step(
            run,
            step,
            where=host(settings, settings.env_backend),
            report=report,
            position=(1, 1),
            ui=UI(make_console(io.StringIO())),
            hold=held.enter_context,
        )
    return record, layout.cache


@pytest.fixture
def payload() -> bytes:
    return sdist_bytes()


@pytest.fixture
def serve(payload: bytes) -> Iterator[FlakyServer]:
    with FlakyServer(Behaviour(payload=payload)) as server:
        yield server


def url_source(server: FlakyServer, payload: bytes) -> str:
    return f'url = "{server.url}/files/flaky_pkg-1.0.tar.gz"\nsha256 = "{hashlib.sha256(payload).hexdigest()}"'


@pytest.mark.parametrize("failure", ["503", "drop", "short"])
def test_transient_failures_within_the_budget_succeed(
    tmp_path: Path, serve: FlakyServer, payload: bytes, failure: str
) -> None:
    serve.behaviour.failures, serve.behaviour.failure = 2, failure
    record, cache = fetch_once(tmp_path, url_source(serve, payload), attempts=4)
    assert record.status is Status.OK, record.error
    assert record.attempts == 3
    assert len(serve.behaviour.requests) == 3
    cached = list(cache.rglob("*.tar.gz"))
    assert len(cached) == 1
    assert cached[0].read_bytes() == payload
    assert not list(cache.rglob("*.part"))
    log = Path(record.log or "").read_text()
    assert log.count("retrying in") == 2


def test_beyond_the_budget_is_a_clear_error(tmp_path: Path, serve: FlakyServer, payload: bytes) -> None:
    serve.behaviour.failures = 10
    record, cache = fetch_once(tmp_path, url_source(serve, payload), attempts=3)
    assert record.status is Status.FAILED
    assert record.exit_code == FetchError.exit_code
    assert record.attempts == 3
    assert "gave up after 3 attempts" in (record.error or "")
    assert "HTTP 503" in (record.error or "")
    assert "WHEELMILL_RETRIES" in (record.error or "")
    assert len(serve.behaviour.requests) == 3
    assert not [p for p in cache.rglob("*") if p.is_file()], "nothing half-downloaded is kept"


def test_sha256_mismatch_fails_at_once(tmp_path: Path, serve: FlakyServer, payload: bytes) -> None:
    serve.behaviour.corrupt = True
    record, cache = fetch_once(tmp_path, url_source(serve, payload), attempts=5)
    assert record.status is Status.FAILED
    assert record.exit_code == IntegrityError.exit_code
    assert record.attempts == 1
    assert len(serve.behaviour.requests) == 1
    assert "sha256 mismatch" in (record.error or "")
    assert not [p for p in cache.rglob("*") if p.is_file()], "no corrupt bytes are kept"


def test_not_found_is_not_retried(tmp_path: Path, serve: FlakyServer, payload: bytes) -> None:
    serve.behaviour.failures, serve.behaviour.failure = 10, "404"
    record, _cache = fetch_once(tmp_path, url_source(serve, payload), attempts=5)
    assert record.status is Status.FAILED
    assert record.exit_code == FetchError.exit_code
    assert record.attempts == 1
    assert "HTTP 404" in (record.error or "")


def test_sdist_found_through_a_pep691_index_with_retries(tmp_path: Path, serve: FlakyServer, payload: bytes) -> None:
    serve.behaviour.failures = 1
    digest = hashlib.sha256(payload).hexdigest()
    env = {"WHEELMILL_INDEX_URL": f"{serve.url}/simple"}
    record, _cache = fetch_once(tmp_path, f'sdist = "flaky-pkg==1.0"\nsha256 = "{digest}"', attempts=3, env=env)
    assert record.status is Status.OK, record.error
    assert record.attempts == 2
    assert (tmp_path / "wheels" / "cpu-py311" / "src" / "flaky-pkg" / "flaky_pkg-1.0" / "setup.py").is_file()


def test_index_hash_differing_from_the_pin_fails_before_downloading(tmp_path: Path, serve: FlakyServer) -> None:
    env = {"WHEELMILL_INDEX_URL": f"{serve.url}/simple"}
    record, _cache = fetch_once(tmp_path, f'sdist = "flaky-pkg==1.0"\nsha256 = "{"0" * 64}"', attempts=3, env=env)
    assert record.status is Status.FAILED
    assert record.exit_code == IntegrityError.exit_code
    assert "the index lists sha256" in (record.error or "")
    assert all(r.startswith("/simple/") for r in serve.behaviour.requests)


def test_a_cached_download_is_verified_and_reused(tmp_path: Path, serve: FlakyServer, payload: bytes) -> None:
    source = url_source(serve, payload)
    first, _ = fetch_once(tmp_path, source)
    second, _ = fetch_once(tmp_path, source)
    assert first.status is Status.OK and second.status is Status.OK
    assert len(serve.behaviour.requests) == 1
    assert "cache hit" in Path(second.log or "").read_text()


def git_repo(tmp_path: Path) -> tuple[Path, str]:
    repo = tmp_path / "upstream"
    repo.mkdir()
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "PATH": "/usr/bin:/bin",
    }
    (repo / "setup.py").write_text("from setuptools import setup\nsetup(name='from-git')\n")
    for argv in (["git", "init", "-q"], ["git", "add", "."], ["git", "commit", "-q", "-m", "first"]):
        subprocess.run(argv, cwd=repo, env=env, check=True)
    rev = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.strip()
    return repo, rev


def test_git_source_checks_out_the_pinned_commit(tmp_path: Path) -> None:
    repo, rev = git_repo(tmp_path)
    record, _cache = fetch_once(tmp_path, f'git = "{repo.as_uri()}"\nrev = "{rev}"')
    assert record.status is Status.OK, record.error
    checkout = tmp_path / "wheels" / "cpu-py311" / "src" / "flaky-pkg"
    assert (checkout / "setup.py").is_file()
    head = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert head == rev


def test_git_source_with_an_unknown_commit_is_a_clear_error(tmp_path: Path) -> None:
    repo, _rev = git_repo(tmp_path)
    record, _cache = fetch_once(tmp_path, f'git = "{repo.as_uri()}"\nrev = "{"1" * 40}"', attempts=2)
    assert record.status is Status.FAILED
    assert record.exit_code == FetchError.exit_code
    assert record.attempts == 1
    assert "check the URL, the mirror setting and that the commit exists" in (record.error or "")


def test_a_patch_that_does_not_apply_is_a_recipe_error_not_a_failed_download(tmp_path: Path) -> None:
    """A patch out of date with its source says so, as the recipe's (exit 3), tried once:
    nothing failed to download."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "setup.py").write_text("print('as released')\n")
    patch = tmp_path / "stale.patch"
    patch.write_text("--- a/setup.py\n+++ b/setup.py\n@@ -1 +1 @@\n-print('an older release')\n+print('patched')\n")
    record, _cache = fetch_once(tmp_path, f'path = "{source}"\npatches = ["{patch}"]', attempts=3)
    assert record.status is Status.FAILED and record.attempts == 1
    assert record.exit_code == ConfigError.exit_code, record.error
    assert "stale.patch: does not apply to the source" in (record.error or "")
    assert "refresh the patch for this version of the source" in (record.error or "")


def test_lock_and_build_with_no_source_reachable_are_a_network_error(tmp_path: Path) -> None:
    """Every source unreachable (a refused index, no torch index host): the network's failure
    (exit 6) naming each source, not a pre-check's, for `lock` and for a build's pre-checks;
    no lock is written, nothing is built."""
    recipes = tmp_path / "recipes"
    shutil.copytree(ROOT / "recipes", recipes)
    (tmp_path / "extensions").symlink_to(ROOT / "extensions")
    env = {
        **os.environ,
        "WHEELMILL_INDEX_URL": "http://127.0.0.1:9/simple",
        "WHEELMILL_TORCH_INDEX": "http://127.0.0.1:9/torch",
    }
    command = [sys.executable, "-m", "wheelmill", "--recipes", str(recipes), "lock", "--cell", "cpu-py312"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == FetchError.exit_code, done.stderr
    (line,) = done.stderr.splitlines()
    assert "cpu-py312: no package source could be reached:" in line and "[unreachable: " in line, line
    assert not (tmp_path / "locks").exists()

    output = tmp_path / "out"
    env |= {"WHEELMILL_OUTPUT": str(output), "WHEELMILL_ENGINE": "none"}
    command[-3:] = ["build", "--cell", "cpu-py312", "--recipe", "example-cpp-ops"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == FetchError.exit_code, done.stdout[-2000:] + done.stderr
    (line,) = done.stderr.splitlines()
    assert "cpu-py312: pre-checks failed: torch-source: no package source could be reached:" in line, line
    assert "[unreachable: " in line and "fix: torch-source: check the network" in line, line
    assert not list(output.glob("cpu-py312/build/*/dist/*.whl"))


def test_a_git_mirror_that_is_not_there_is_named_and_not_retried(tmp_path: Path) -> None:
    """WHEELMILL_GIT_MIRRORS pointing at a directory this machine lacks: one error naming
    the URL and the mirror, tried once (no network to wait for)."""
    missing = tmp_path / "no-mirrors"
    env = {"WHEELMILL_GIT_MIRRORS": f"https://git.example.invalid/=file://{missing}/"}
    source = f'git = "https://git.example.invalid/team/kernels.git"\nrev = "{"a" * 40}"'
    record, _cache = fetch_once(tmp_path, source, attempts=3, env=env)
    assert record.status is Status.FAILED and record.attempts == 1, record
    assert record.exit_code == FetchError.exit_code
    assert f"its mirror file://{missing}/team/kernels.git does not exist (WHEELMILL_GIT_MIRRORS)" in (
        record.error or ""
    )
    assert "git clone --mirror https://git.example.invalid/team/kernels.git" in (record.error or "")
