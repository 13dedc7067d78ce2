"""``wheelmill matrix upstream`` end to end: the real command against an upstream index of the
test's own, served over HTTP on loopback (torch's page as PEP 691 JSON with its content type,
naming a torch release and a CUDA label the matrix lacks), its report, JSON and diff; the diff
applied with ``patch -p1`` to a copy of the repository's inputs, which then validates and
has the new cells; and what it says where upstream is no PEP 691 index or does not answer."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from wheelmill.errors import FetchError
from wheelmill.index.storage import TreeStorage
from wheelmill.inputs.matrix import load_matrix, torch_tag
from wheelmill.inputs.versions import Track
from wheelmill.machine.net import PEP691_JSON
from wheelmill.releases.records import Manifest, record

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent.parent
WHEELMILL = Path(sys.executable).parent / "wheelmill"
PYTHONS = ("3.10", "3.11", "3.12", "3.13", "3.14")


def filenames(torch: str, label: str) -> list[str]:
    return [
        f"torch-{torch}+{label}-cp{p.replace('.', '')}-cp{p.replace('.', '')}-manylinux_2_28_{machine}.whl"
        for p in PYTHONS
        for machine in ("x86_64", "aarch64")
    ]


class Upstream:
    """An index root on loopback: ``/whl/torch/`` is torch's PEP 691 page, ``/html/torch/`` a
    PEP 503 one of the same files (HTML: no JSON for a client that asks for it, as PyTorch's
    own index answers), anything else 404."""

    def __init__(self, files: list[str]) -> None:
        self.page = json.dumps(
            {
                "meta": {"api-version": "1.1"},
                "name": "torch",
                "files": [{"filename": f, "url": f"/files/{f}", "hashes": {"sha256": "0" * 64}} for f in files],
            }
        ).encode()
        links = "".join(f"<a href='/files/{f}#sha256={'0' * 64}'>{f}</a><br>" for f in files)
        self.html = f"<!DOCTYPE html><html><body>{links}</body></html>".encode()
        self.accepts: list[str] = []
        self.authorizations: list[str] = []
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                upstream.accepts.append(self.headers.get("Accept", ""))
                upstream.authorizations.append(self.headers.get("Authorization", ""))
                answers = {
                    "/whl/torch/": (PEP691_JSON, upstream.page),
                    "/html/torch/": ("text/html", upstream.html),
                }
                content_type, body = answers.get(self.path, ("text/plain", b""))
                self.send_response(200 if body else 404)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler


@pytest.fixture
def scenario() -> tuple[str, str]:
    """A torch release newer than any cuda130 builds, and the CUDA label after cu130's toolkit."""
    cuda130 = load_matrix(ROOT / "recipes" / "matrix.toml").variants["cuda130"]
    newest = max((cuda130.torch, *cuda130.other_torch), key=lambda t: tuple(int(x) for x in t.split(".")))
    major, minor = newest.split(".")[:2]
    return f"{major}.{int(minor) + 1}.0", "cu132"


@pytest.fixture
def upstream(scenario: tuple[str, str]) -> Iterator[Upstream]:
    torch, label = scenario
    served = Upstream([*filenames(torch, "cu130"), *filenames(torch, label), *filenames("2.0.1", "cu117")])
    yield served
    served.close()


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    """A copy of what ``wheelmill validate`` reads: the recipes, with the containers, locks and
    extensions they name."""
    copy = tmp_path / "repo"
    for part in ("recipes", "containers", "locks", "extensions"):
        shutil.copytree(ROOT / part, copy / part, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    return copy


def wheelmill(repository: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "WHEELMILL_UPSTREAM_INDEX"}
    environment |= {"WHEELMILL_OUTPUT": str(repository / "wheels"), **env}
    return subprocess.run(
        [str(WHEELMILL), "--recipes", str(repository / "recipes"), *args],
        env=environment,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def test_upstream_names_what_the_matrix_lacks_and_its_diff_applies(
    upstream: Upstream, repository: Path, scenario: tuple[str, str]
) -> None:
    torch, label = scenario
    url = f"{upstream.url}/whl"
    shown = wheelmill(repository, "matrix", "upstream", "--url", url)
    assert shown.returncode == 0, shown.stderr  # findings are a report, not a failure
    assert f"upstream: {url}/torch/ (final releases)\n" in shown.stdout
    assert f"newer-torch  {torch}+cu130" in shown.stdout and f"new-label    {torch}+{label}" in shown.stdout
    assert "cu117" not in shown.stdout  # an older toolkit the matrix passed over
    assert upstream.accepts[0] == f"{PEP691_JSON}, text/html;q=0.1"  # JSON first, HTML where that is all

    as_json = json.loads(wheelmill(repository, "matrix", "upstream", "--url", url, "--json").stdout)
    assert as_json["url"] == f"{url}/torch/" and as_json["pre"] is False
    assert [(f["kind"], f["variant"]) for f in as_json["findings"]] == [
        ("newer-torch", "cuda130"),
        ("new-label", "cuda132"),
    ]
    assert set(as_json["findings"][0]) == {
        *("kind", "torch", "label", "family", "variant", "pythons", "platforms", "model", "blocked")
    }

    diff = wheelmill(repository, "matrix", "upstream", "--url", url, "--diff")
    assert (
        diff.returncode == 0 and diff.stdout == as_json["diff"] and diff.stdout.startswith("--- a/recipes/matrix.toml")
    )
    subprocess.run(["patch", "-p1", "--dry-run"], input=diff.stdout, text=True, cwd=repository, check=True)
    subprocess.run(["patch", "-p1"], input=diff.stdout, text=True, cwd=repository, check=True, capture_output=True)

    validated = wheelmill(repository, "validate")
    assert validated.returncode == 0, validated.stderr
    cells = {e["cell"] for e in json.loads(wheelmill(repository, "matrix", "--json").stdout)["include"]}
    assert {f"cuda130-{torch_tag(torch)}-py311", f"cuda130-{torch_tag(torch)}-aarch64-py311", "cuda132-py311"} <= cells
    secret = url.replace("http://", "http://ci:s3cret-t0ken@")  # a credential in the URL: sent, never shown
    shown = wheelmill(repository, "matrix", "upstream", "--url", secret, "--json")
    assert json.loads(shown.stdout)["url"] == f"{url}/torch/" and "s3cret" not in shown.stdout + shown.stderr
    assert upstream.authorizations[-1].startswith("Basic ")
    again = wheelmill(repository, "matrix", "upstream", "--url", url, "--diff")
    assert again.returncode == 0 and again.stdout == ""  # the matrix has it all now


def test_an_upstream_of_html_pages_says_the_same_as_one_of_json(upstream: Upstream, repository: Path) -> None:
    as_json = wheelmill(repository, "matrix", "upstream", "--url", f"{upstream.url}/whl", "--json")
    as_html = wheelmill(repository, "matrix", "upstream", "--url", f"{upstream.url}/html", "--json")
    assert as_json.returncode == 0 and as_html.returncode == 0, as_json.stderr + as_html.stderr
    found = [json.loads(shown.stdout) for shown in (as_json, as_html)]
    assert found[0]["findings"] and found[0]["findings"] == found[1]["findings"]
    assert found[0]["diff"] == found[1]["diff"]


def test_an_upstream_without_torchs_page_or_that_does_not_answer_is_an_error_with_a_fix(
    upstream: Upstream, repository: Path
) -> None:
    with socket.socket() as probe:  # a port nothing listens on once it is closed
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}/whl"
    cases = {
        f"{upstream.url}/nothing": "no torch page there",
        closed: "cannot read torch's page upstream",
    }
    for url, said in cases.items():
        failed = wheelmill(repository, "matrix", "upstream", "--url", url, WHEELMILL_RETRIES="1")
        assert failed.returncode == FetchError.exit_code, (url, failed.stderr)
        (line,) = failed.stderr.splitlines()
        assert line.startswith("wheelmill: error: matrix upstream: ") and said in line and "; fix: " in line, line
        assert failed.stdout == ""


def test_coverage_shows_what_upstream_has_and_the_matrix_lacks_as_wanted(
    upstream: Upstream, repository: Path, scenario: tuple[str, str]
) -> None:
    torch, label = scenario
    index = repository / "wheels" / "index"
    head = Manifest(version="2.4.0rc1", track=Track.TEST, commit="c" * 40, tag="v2.4.0-rc1", files=(), gpu_runners={})
    record(TreeStorage(index), head)
    shown = wheelmill(repository, "coverage", "--upstream", "--json", WHEELMILL_UPSTREAM_INDEX=f"{upstream.url}/whl")
    assert shown.returncode == 0, shown.stderr
    wanted = {(found["kind"], found["torch"], found["label"]) for found in json.loads(shown.stdout)["upstream"]}
    assert wanted == {("newer-torch", torch, "cu130"), ("new-label", torch, label)}
    grid = wheelmill(repository, "coverage", "--upstream", WHEELMILL_UPSTREAM_INDEX=f"{upstream.url}/whl")
    assert f"  torch {torch}+{label}: new-label (cuda132)" in grid.stdout.splitlines(), grid.stdout[-2000:]
