"""The object-store index served from its bucket by nginx (deploy/nginx-bucket.conf), as the
docs say (docs/wheel-index.md, "Serving from a bucket"): a cell's wheel and its mirrored
closure published into a bucket prefix with ``objects.publish``, then installed by real pip
and real uv from nginx alone, nginx reading the bucket anonymously over S3's path-style URLs.
Pages negotiate (Accept, ?format=) and keep the objects' caching; files and sidecars come by
sha256; entries, release records and anything else are 404, whatever the bucket allows."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import boto3
import pytest

from tests.integration.test_index import pip
from tests.nginx import CONTENT_TYPES, DEPLOY, accept_cases, get, main_context
from tests.objectstore import ACCESS_KEY, SECRET_KEY, ObjectStore
from tests.ports import free_port
from tests.wheels import make_wheel
from wheelmill.gpu.stage import channel_location
from wheelmill.index.objects import ObjectChannel, publish
from wheelmill.index.s3 import S3Storage
from wheelmill.machine.net import project_files
from wheelmill.machine.tools import uv_bin

if TYPE_CHECKING:
    from types_boto3_s3.client import S3Client

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent.parent
TEMPLATE = ROOT / "deploy" / "nginx-bucket.conf"
DOCS = ROOT / "docs" / "wheel-index.md"
NGINX = Path("/usr/sbin/nginx")
JSON = "application/vnd.pypi.simple.v1+json"
HTML = "text/html; charset=utf-8"
ANY = "py3-none-any"
DEMO, DEP = "1.0+cu130", "1.2"  # the built wheel has a local version: a "+" in its file's key
UPSTREAM = "https://upstream.example/packages/dep-1.2-py3-none-any.whl"
CHANNELS = ("cu130", "test/cu130")
RECORD = "releases/test/v1.0rc1/record.json"
# A conda channel beside the wheel channels, as the conda indexer and packager leave it.
CONDA = {
    "conda/cu130/linux-64/repodata.json": b'{"info": {"subdir": "linux-64"}, "packages.conda": {}}',
    "conda/test/cu130/linux-64/demo-1.0-cu130_py311_0.conda": b"PK\x05\x06" + bytes(18),
}


@dataclass(frozen=True, kw_only=True)
class Served:
    """nginx in front of one bucket prefix holding both channels."""

    base: str  # http://127.0.0.1:<port>
    log: Path  # one JSON object a request
    demo: Path  # the built wheel

    def mark(self) -> int:
        """Where the log is now: the requests after it are those of what a test runs next."""
        return len(self.settled_log())

    def settled_log(self) -> list[str]:
        """The log once nginx has written its last line: it logs a request just after the
        answer, so a client may be done a moment before its line is there."""
        lines = self.log.read_text().splitlines()
        while True:
            time.sleep(0.1)
            now = self.log.read_text().splitlines()
            if now == lines:
                return lines
            lines = now

    def requests(self, agent: str, since: int) -> list[dict[str, str]]:
        """What a client (by its User-Agent's start: ``pip/``, ``uv/``, ``Python-urllib/``) asked
        since ``since``, and what it got."""
        lines = self.settled_log()[since:]
        return [r for r in map(json.loads, lines) if r["agent"].startswith(agent)]


def s3_client(store: ObjectStore) -> S3Client:
    client: S3Client = boto3.client(
        "s3",
        endpoint_url=store.endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name="us-east-1",
    )
    return client


def public_read(bucket: str, resources: list[str]) -> str:
    """A bucket policy that lets anyone GET the given keys (``prefix/...`` patterns)."""
    statement = {
        "Effect": "Allow",
        "Principal": "*",
        "Action": ["s3:GetObject"],
        "Resource": [f"arn:aws:s3:::{bucket}/{r}" for r in resources],
    }
    return json.dumps({"Version": "2012-10-17", "Statement": [statement]})


@contextmanager
def bucket_of_its_own(store: ObjectStore, policy: str | None) -> Iterator[str]:
    """A new bucket on the test server with ``policy`` (``@BUCKET@`` standing for its name),
    emptied and removed afterwards; the session's bucket keeps its private default."""
    client = s3_client(store)
    bucket = f"wheelmill-served-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    try:
        if policy is not None:
            client.put_bucket_policy(Bucket=bucket, Policy=policy.replace("@BUCKET@", bucket))
        yield bucket
    finally:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for item in page.get("Contents", []):
                client.delete_object(Bucket=bucket, Key=item["Key"])
        client.delete_bucket(Bucket=bucket)


def nginx_config(bucket_url: str, port: int, prefix: Path) -> Path:
    """deploy/nginx-bucket.conf rendered and wrapped in the http {} block of a server of the
    test's own: loopback only, every file under ``prefix``, a JSON line a request."""
    server = (
        TEMPLATE.read_text()
        .replace("@PORT@", f"127.0.0.1:{port}")
        .replace("@BUCKET_URL@", bucket_url)
        .replace("@RESOLVER@", "127.0.0.1")
        .replace("@DEPLOY@", str(DEPLOY))
    )
    assert not re.findall(r"@[A-Z_]+@", server), "every placeholder rendered"
    (prefix / "tmp").mkdir(parents=True, exist_ok=True)
    temp = "".join(
        f" {kind}_temp_path {prefix / 'tmp'};\n" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    log = (
        ' log_format wheelmill escape=json \'{"uri":"$request_uri","status":"$status",'
        '"accept":"$http_accept","page":"$wheelmill_bucket_page","key":"$wheelmill_bucket_key",'
        '"agent":"$http_user_agent"}\';\n'
        f" access_log {prefix / 'access.log'} wheelmill;\n"
    )
    config = prefix / "nginx.conf"
    config.write_text(
        f"{main_context()}worker_processes 1;\nerror_log {prefix / 'error.log'};\npid {prefix / 'nginx.pid'};\n"
        "events { worker_connections 64; }\n"
        f"http {{\n{log}{temp}{server}\n}}\n"
    )
    return config


def answers(base: str) -> bool:
    try:
        get(f"{base}/")
    except urllib.error.URLError:
        return False
    return True


@contextmanager
def running_nginx(bucket_url: str, prefix: Path) -> Iterator[str]:
    """nginx serving ``bucket_url`` on a free loopback port, until the block ends."""
    if not NGINX.exists():
        pytest.skip("nginx is not installed (scripts/setup --system installs it)")
    port = free_port()
    config = nginx_config(bucket_url, port, prefix)
    checked = subprocess.run([NGINX, "-t", "-c", config, "-p", prefix], capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stderr
    process = subprocess.Popen(
        [NGINX, "-c", config, "-p", prefix, "-g", "daemon off;"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 10
        while not answers(base):
            assert process.poll() is None and time.monotonic() < deadline, (prefix / "error.log").read_text()
            time.sleep(0.1)
        yield base
    finally:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGQUIT)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def published(store: ObjectStore, url: str, wheels: Path) -> tuple[Path, Path]:
    """A cell's wheel (``demo``) and its closure (``dep``, mirrored) in both channels, and a
    release record beside them, as the object store's writers leave them."""
    demo = make_wheel(wheels, "demo", DEMO, requires=["dep>=1"], tag=ANY)
    dep = make_wheel(wheels, "dep", DEP, tag=ANY)
    with pytest.MonkeyPatch.context() as patch:
        for name, value in store.environ().items():
            patch.setenv(name, value)
        storage = S3Storage.of(url)
        for name in CHANNELS:
            channel = ObjectChannel(storage, name)
            publish(channel, demo)
            publish(channel, dep, mirrored_from=UPSTREAM)
        storage.create(RECORD, b"{}")
        for key, data in CONDA.items():
            storage.create(key, data)
    return demo, dep


@pytest.fixture(scope="module")
def served(object_store: ObjectStore) -> Iterator[Served]:
    """Both channels in a prefix of a bucket that lets anyone read every key under it: what
    keeps entries and records in is nginx alone (the documented policy is narrower; see
    test_the_documented_policy_opens_pages_and_files_alone)."""
    work = Path(tempfile.mkdtemp(prefix="wheelmill-bucket-serving-"))
    prefix = f"index-{uuid.uuid4().hex[:8]}"
    try:
        with bucket_of_its_own(object_store, public_read("@BUCKET@", [f"{prefix}/*"])) as bucket:
            demo, _dep = published(object_store, f"s3://{bucket}/{prefix}/", work / "wheels")
            with running_nginx(f"{object_store.endpoint}/{bucket}/{prefix}", work / "nginx") as base:
                yield Served(base=base, log=work / "nginx" / "access.log", demo=demo)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def isolated_env(**extra: str) -> dict[str, str]:
    """No pip or uv configuration of this machine, and a uv cache of the test's own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **extra}


def fresh_venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", path], check=True)
    return path / "bin" / "python"


def installed(python: Path) -> dict[str, str]:
    """The venv's distributions and versions."""
    listing = subprocess.run(
        [
            python,
            "-c",
            "import json, importlib.metadata as m; print(json.dumps({d.name: d.version for d in m.distributions()}))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(listing.stdout))


def pip_install(python: Path, index: str) -> None:
    """The pinned pip of wheelmill's own env, installing into the venv at ``python``."""
    argv = [
        sys.executable,
        "-m",
        "pip",
        "--python",
        str(python),
        "install",
        "--no-cache-dir",
        "--index-url",
        index,
        "demo",
    ]
    result = subprocess.run(argv, env=isolated_env(), capture_output=True, text=True, check=False, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Looking in indexes: {index}\n" in result.stdout and "Looking in links" not in result.stdout, result.stdout


def uv_install(python: Path, index: str, cache: Path) -> None:
    argv = [uv_bin(), "pip", "install", "--no-config", "--python", str(python), "--index-url", index, "demo"]
    env = isolated_env(UV_CACHE_DIR=str(cache), UV_PYTHON_DOWNLOADS="never")
    result = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def test_pip_installs_the_cell_and_its_closure_from_the_bucket_alone(served: Served, tmp_path: Path) -> None:
    python = fresh_venv(tmp_path / "env")
    mark = served.mark()
    pip_install(python, f"{served.base}/cu130/simple/")
    assert installed(python) == {"demo": DEMO, "dep": DEP}
    asked = served.requests("pip/", since=mark)
    pages = [r for r in asked if r["uri"] in ("/cu130/simple/demo/", "/cu130/simple/dep/")]
    assert len(pages) == 2 and all(
        JSON in r["accept"] and r["page"] == "index.json" and r["status"] == "200" for r in pages
    )
    files = {r["uri"].rpartition("/")[2] for r in asked if r["uri"].startswith("/blobs/sha256/")}
    wheels = {"demo-1.0%2Bcu130-py3-none-any.whl", "dep-1.2-py3-none-any.whl"}
    assert files == wheels | {f"{w}.metadata" for w in wheels}, asked
    assert all(r["status"] == "200" for r in asked), asked


def test_uv_installs_the_cell_and_its_closure_reading_the_sidecars(served: Served, tmp_path: Path) -> None:
    python = fresh_venv(tmp_path / "env")
    mark = served.mark()
    uv_install(python, f"{served.base}/cu130/simple/", tmp_path / "uv-cache")
    assert installed(python) == {"demo": DEMO, "dep": DEP}
    asked = served.requests("uv/", since=mark)
    assert all(r["status"] == "200" for r in asked), asked
    sidecars = {r["uri"].rpartition("/")[2] for r in asked if r["uri"].endswith(".metadata")}
    assert sidecars == {"demo-1.0%2Bcu130-py3-none-any.whl.metadata", "dep-1.2-py3-none-any.whl.metadata"}, asked
    assert all(JSON in r["accept"] and r["page"] == "index.json" for r in asked if "/simple/" in r["uri"])


def test_a_track_channel_installs_from_the_url_the_gpu_stage_reads(served: Served, tmp_path: Path) -> None:
    """``wheelmill test-gpu --track test --index-url <base>`` reads <base>/test/cu130/simple/:
    its pages' file URLs climb one more level, to the same blobs."""
    pages = channel_location(served.base + "/", "test/cu130")
    assert pages == f"{served.base}/test/cu130/simple/"
    listed = project_files(pages, "demo")
    assert [f.filename for f in listed] == [served.demo.name] and listed[0].url.startswith(f"{served.base}/blobs/")
    mark = served.mark()
    python = fresh_venv(tmp_path / "pip-env")
    pip_install(python, pages)
    assert installed(python) == {"demo": DEMO, "dep": DEP}
    python = fresh_venv(tmp_path / "uv-env")
    uv_install(python, pages, tmp_path / "uv-cache")
    assert installed(python) == {"demo": DEMO, "dep": DEP}
    asked = served.requests("pip/", since=mark) + served.requests("uv/", since=mark)
    assert all(r["status"] == "200" for r in asked), asked
    assert {r["uri"] for r in asked if "/simple/" in r["uri"]} == {
        "/test/cu130/simple/demo/",
        "/test/cu130/simple/dep/",
    }


def test_pages_negotiate_and_keep_the_objects_caching(served: Served) -> None:
    page = f"{served.base}/cu130/simple/demo/"
    as_json = get(page, {"Accept": f"{JSON}, text/html;q=0.1"})
    assert as_json.status == 200 and as_json.headers.get_all("Content-Type") == [JSON]
    assert as_json.headers.get_all("Vary") == ["Accept"]
    assert json.loads(as_json.body)["name"] == "demo"
    as_html = get(page, {"Accept": "text/html"})
    assert as_html.headers["Content-Type"] == HTML and b"<a href=" in as_html.body
    assert get(page).headers["Content-Type"] == HTML
    for format in (JSON, JSON.replace("+", "%2B")):
        assert json.loads(get(f"{page}?format={format}", {"Accept": "text/html"}).body)["name"] == "demo"
    assert get(f"{page}?format=text/html", {"Accept": JSON}).headers["Content-Type"] == HTML
    assert json.loads(get(f"{served.base}/cu130/simple/", {"Accept": JSON}).body)["projects"] == [
        {"name": "demo"},
        {"name": "dep"},
    ]
    assert as_json.headers["Cache-Control"] == "max-age=600, must-revalidate"
    assert get(f"{served.base}/test/cu130/simple/demo/").headers["Cache-Control"] == "no-cache"
    assert get(f"{served.base}/test/cu130/simple/").headers["Cache-Control"] == "no-cache"
    etag = as_json.headers["ETag"]
    again = get(page, {"Accept": JSON, "If-None-Match": etag})
    assert again.status == 304 and again.headers["ETag"] == etag and again.body == b""
    assert not any(h.lower().startswith(("x-amz-", "seaweed-")) for h in as_json.headers), as_json.headers
    # The one table `index serve` and deploy/nginx-index.conf are held to (tests/data/accept.toml).
    for case in accept_cases():
        answer = get(page + case.query, case.headers)
        assert answer.headers.get_all("Vary") == ["Accept"], case
        if case.chosen is None:
            assert answer.status == 406, (case, answer.status)
            continue
        assert (answer.status, answer.headers["Content-Type"]) == (200, CONTENT_TYPES[case.chosen]), case
        assert (json.loads(answer.body)["name"] == "demo") if case.chosen.endswith("+json") else b"<a " in answer.body


def test_files_and_sidecars_come_by_sha256_immutable_with_ranges(served: Served) -> None:
    page = json.loads(get(f"{served.base}/cu130/simple/demo/", {"Accept": JSON}).body)
    (entry,) = page["files"]
    url = urllib.parse.urljoin(f"{served.base}/cu130/simple/demo/", entry["url"])
    assert url.startswith(f"{served.base}/blobs/sha256/{entry['hashes']['sha256']}/")
    whole = get(url)
    assert whole.status == 200 and whole.body == served.demo.read_bytes()
    assert whole.headers.get_all("Cache-Control") == ["public, max-age=31536000, immutable"]
    assert whole.headers.get_all("Content-Type") == ["application/octet-stream"] and "ETag" in whole.headers
    ranged = get(url, {"Range": "bytes=0-9"})
    assert ranged.status == 206 and ranged.body == served.demo.read_bytes()[:10]
    sidecar = get(url + ".metadata")
    assert sidecar.status == 200 and b"Requires-Dist: dep>=1" in sidecar.body
    assert get(url, method="HEAD").headers["Content-Length"] == str(served.demo.stat().st_size)


def test_a_plus_in_a_files_name_reaches_the_bucket_percent_encoded(served: Served) -> None:
    """S3 reads a bare "+" in a path as a space: whether a client sends "%2B" (as the pages
    write it) or "+", the bucket is asked for "%2B"."""
    page = json.loads(get(f"{served.base}/cu130/simple/demo/", {"Accept": JSON}).body)
    url = urllib.parse.urljoin(f"{served.base}/cu130/simple/demo/", page["files"][0]["url"])
    assert "%2Bcu130" in url
    mark = served.mark()
    for sent in (url, url.replace("%2B", "+")):
        assert get(sent).body == served.demo.read_bytes()
    keys = [r["key"] for r in served.requests("Python-urllib/", since=mark) if r["uri"].startswith("/blobs/")]
    assert len(keys) == 2 and all(k.endswith("/demo-1.0%2Bcu130-py3-none-any.whl") for k in keys), keys
    assert get(url.replace("%2B", "+").replace("cu130", "a+b")).status == 404  # no wheel's name has two


def test_only_pages_and_files_are_served(served: Served) -> None:
    """Entries and release records are in the prefix, readable to anyone who asks the bucket
    itself; nginx answers 404 for them, for what the bucket does not have, and for the rest."""
    entry = f"cu130/entries/demo/{served.demo.name}/built.json"
    for path in (
        f"/{entry}",
        "/cu130/entries/demo/",
        "/test/cu130/entries/dep/dep-1.2-py3-none-any.whl/mirrored.json",
        f"/{RECORD}",
        "/releases/",
        "/cu130/simple/unknown/",
        "/cu999/simple/",
        "/cu130/simple/demo/index.json",
        "/blobs/sha256/" + "0" * 64 + "/nothing-1.0-py3-none-any.whl",
        "/blobs/sha256/",
        "/",
    ):
        assert get(served.base + path).status == 404, path
    assert get(f"{served.base}/cu130/simple/", method="POST").status == 405
    assert get(f"{served.base}/cu130/simple/", method="DELETE").status == 405


def test_the_conda_channels_beside_are_served_their_repodata_and_packages_alone(served: Served) -> None:
    for key, data in CONDA.items():
        answer = get(f"{served.base}/{key}")
        assert answer.status == 200 and answer.body == data, key
        wanted = "application/json" if key.endswith(".json") else "application/octet-stream"
        assert answer.headers["Content-Type"] == wanted, key
    for path in ("/conda/cu130/", "/conda/cu130/linux-64/", "/conda/cu130/win-64/repodata.json", "/conda/x.txt"):
        assert get(served.base + path).status == 404, path


def test_a_bucket_that_refuses_anonymous_reads_is_404_not_403(object_store: ObjectStore, tmp_path: Path) -> None:
    """S3 answers 403 for a key to a reader it does not let in (and, on AWS, for a missing key
    to a reader who may not list): a client sees 404 either way."""
    with bucket_of_its_own(object_store, None) as bucket:
        published(object_store, f"s3://{bucket}/index/", tmp_path / "wheels")
        assert get(f"{object_store.endpoint}/{bucket}/index/cu130/simple/index.html").status == 403
        with running_nginx(f"{object_store.endpoint}/{bucket}/index", tmp_path / "nginx") as base:
            assert get(f"{base}/cu130/simple/").status == 404
            assert get(f"{base}/cu130/simple/demo/", {"Accept": JSON}).status == 404


def documented_policy() -> str:
    """The bucket policy of the docs' section, as JSON."""
    text = DOCS.read_text()
    section = text[text.index("## Serving from a bucket") :]
    return section.split("```json\n", 1)[1].split("```", 1)[0]


def test_the_docs_name_every_placeholder_of_the_config() -> None:
    text = DOCS.read_text()
    table = text[text.index("## Serving from a bucket") :].split("```json", 1)[0]
    documented = set(re.findall(r"^\| `(@[A-Z_]+@)` \|", table, flags=re.MULTILINE))
    placeholders = {"@PORT@", "@BUCKET_URL@", "@RESOLVER@", "@DEPLOY@"}
    assert documented == set(re.findall(r"@[A-Z_]+@", TEMPLATE.read_text())) == placeholders


def test_the_documented_policy_opens_pages_and_files_alone(object_store: ObjectStore, tmp_path: Path) -> None:
    policy = documented_policy().replace("wheels-bucket", "@BUCKET@")
    assert "@BUCKET@/index/blobs/*" in policy and "@BUCKET@/index/*/simple/*" in policy
    assert "@BUCKET@/index/conda/*" in policy
    with bucket_of_its_own(object_store, policy) as bucket:
        demo, _dep = published(object_store, f"s3://{bucket}/index/", tmp_path / "wheels")
        direct = f"{object_store.endpoint}/{bucket}/index"
        assert get(f"{direct}/cu130/simple/demo/index.json").status == 200
        assert get(f"{direct}/test/cu130/simple/index.html").status == 200
        assert get(f"{direct}/cu130/entries/demo/{demo.name}/built.json").status == 403
        assert get(f"{direct}/{RECORD}").status == 403
        assert get(f"{direct}/{next(iter(CONDA))}").status == 200
        with running_nginx(direct, tmp_path / "nginx") as base:
            python = fresh_venv(tmp_path / "env")
            uv_install(python, f"{base}/test/cu130/simple/", tmp_path / "uv-cache")
            assert installed(python) == {"demo": DEMO, "dep": DEP}


def test_a_cell_built_with_a_bucket_root_publishes_there_and_installs_through_nginx(
    object_store: ObjectStore, tmp_path: Path
) -> None:
    """``wheelmill build`` with WHEELMILL_INDEX_ROOT an ``s3://`` prefix and no tree anywhere:
    the publish step (the wheel, its conda package), the closure's mirror (torch and its
    dependencies, downloaded under the output root, uploaded once) and the channel checks
    write and read the bucket; then pip, given nginx in front of the bucket as its only
    index, installs the cell's wheel with the torch it was built against."""
    prefix = f"built-{uuid.uuid4().hex[:8]}"
    with bucket_of_its_own(object_store, public_read("@BUCKET@", [f"{prefix}/*"])) as bucket:
        url = f"s3://{bucket}/{prefix}/"
        env = {
            **os.environ,
            **object_store.environ(),
            "WHEELMILL_INDEX_ROOT": url,
            "WHEELMILL_OUTPUT": str(tmp_path / "wheels"),
            "WHEELMILL_ENGINE": "none",
        }
        argv = [sys.executable, "-m", "wheelmill", "build", "--cell", "cpu-py311", "--recipe", "example-cpp-ops"]
        build = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False, timeout=1800)
        assert build.returncode == 0, build.stdout[-4000:] + build.stderr
        assert "cpu-py311: ok" in build.stdout and not (tmp_path / "wheels" / "index").exists()
        report = json.loads((tmp_path / "wheels" / "cpu-py311" / "report.json").read_text())
        steps = {step["step"]: step["status"] for step in report["steps"]}
        assert {steps[s] for s in ("publish", "closure", "mirror", "channel-checks")} == {"ok"}, steps
        with pytest.MonkeyPatch.context() as patch:
            for name, value in object_store.environ().items():
                patch.setenv(name, value)
            storage = S3Storage.of(url)
            channel = ObjectChannel(storage, "cpu")
            (built,) = channel.project("example-cpp-ops").files  # type: ignore[union-attr]
            (torch,) = channel.project("torch").files  # type: ignore[union-attr]
            assert built.built and not torch.built and torch.version == "2.13.0+cpu"
            assert [k for k in storage.keys_under("conda/cpu/") if k.endswith(".conda")], "its conda package"
        with running_nginx(f"{object_store.endpoint}/{bucket}/{prefix}", tmp_path / "nginx") as base:
            python = fresh_venv(tmp_path / "consumer")
            done = pip(python, "install", "--no-cache-dir", "--index-url", f"{base}/cpu/simple/", "example-cpp-ops")
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        versions = installed(python)
        assert versions["example-cpp-ops"] == built.version and versions["torch"] == "2.13.0+cpu", versions
