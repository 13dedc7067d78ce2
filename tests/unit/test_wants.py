"""``wheelmill wants`` and the access log it reads: pip's and uv's User-Agents as they send
them, the tags an interpreter takes held to packaging's own for this one, what a channel
serves whom, the ranking, lines of another format, .gz files and a bucket's prefix; the
log ``index serve`` writes (one whole JSON line a request, no client address, a failing
write that never stops the serving) and nginx's formats for it; and the docs' section,
its keys and its example output."""

from __future__ import annotations

import gzip
import io
import json
import platform
import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from packaging.tags import sys_tags

from tests.conftest import CliRunner
from tests.wheels import make_wheel
from wheelmill.errors import ChannelError, UsageError
from wheelmill.index import s3
from wheelmill.index.access_log import KEYS, Request, parse_request
from wheelmill.index.pages import FileEntry
from wheelmill.index.roots import Index, publish, set_yanked
from wheelmill.index.serve import IndexServer, make_server
from wheelmill.index.storage import TreeStorage
from wheelmill.index.wants import (
    DAMAGED,
    Interpreter,
    Want,
    log_lines,
    parse_user_agent,
    project_page,
    serves,
    supported_tags,
    wants,
)

ROOT = Path(__file__).resolve().parent.parent.parent
# As pip 24.2 (CPython 3.13.0) and uv 0.13.9 (for CPython 3.12.1) sent them on Debian 12,
# logged by a server of the test's own; the kernel's release shortened.
PIP = (
    'pip/24.2 {"ci":null,"cpu":"x86_64","distro":{"id":"bookworm","libc":{"lib":"glibc","version":"2.36"},'
    '"name":"Debian GNU/Linux","version":"12"},"implementation":{"name":"CPython","version":"3.13.0"},'
    '"installer":{"name":"pip","version":"24.2"},"openssl_version":"OpenSSL 3.0.19 27 Jan 2026",'
    '"python":"3.13.0","rustc_version":"1.95.0","system":{"name":"Linux","release":"6.1.0"}}'
)
UV = (
    'uv/0.13.9 {"installer":{"name":"uv","version":"0.13.9","subcommand":["pip","install"]},"python":"3.12.1",'
    '"implementation":{"name":"CPython","version":"3.12.1"},"distro":{"name":"Debian GNU/Linux","version":"12",'
    '"id":"bookworm","libc":{"lib":"glibc","version":"2.36"}},"system":{"name":"Linux","release":"6.1.0"},'
    '"cpu":"x86_64","openssl_version":null,"setuptools_version":null,"rustc_version":null,"ci":null}'
)
CP311 = "cp311-cp311-manylinux_2_28_x86_64"


def agent(template: str, python: str, *, glibc: str = "2.36", cpu: str = "x86_64") -> str:
    """``template``'s User-Agent as its installer sends it for another Python, glibc or cpu."""
    head, _, body = template.partition(" ")
    data = json.loads(body)
    data["python"] = data["implementation"]["version"] = python
    data["distro"]["libc"]["version"], data["cpu"] = glibc, cpu
    return f"{head} {json.dumps(data, separators=(',', ':'))}"


def line(path: str, ua: str, *, status: int = 200, method: str = "GET") -> str:
    request = Request(time="2026-11-22T13:05:01.000000Z", method=method, path=path, status=status, ua=ua, sent=1)
    return request.as_line().rstrip("\n")


def interpreter(python: str = "3.12.7", **facts: str) -> Interpreter:
    given = {"implementation": "CPython", "system": "Linux", "cpu": "x86_64", "libc": "glibc", "libc_version": "2.36"}
    return Interpreter(python=python, **{**given, **facts})


def entry(filename: str, *, requires_python: str | None = None, yanked: str | None = None) -> FileEntry:
    return FileEntry(
        filename=filename,
        version="1.0",
        sha256="0" * 64,
        size=1,
        upload_time="2026-11-22T13:05:01.000000Z",
        requires_python=requires_python,
        metadata_sha256="0" * 64,
        yanked=yanked,
    )


def index_with(root: Path, channel: str, *wheels: tuple[str, str, str]) -> Index:
    """An index tree whose ``channel`` holds a wheel of each (name, version, tag)."""
    index = Index(tree=root / "index")
    for name, version, tag in wheels:
        publish(index.channel(channel), make_wheel(root / "dist", name, version, tag=tag))
    return index


# -- who asks ---------------------------------------------------------------------------------


def test_pip_and_uv_user_agents_name_the_installer_and_the_interpreter() -> None:
    pip, uv = parse_user_agent(PIP), parse_user_agent(UV)
    assert pip is not None and uv is not None
    assert (pip.installer, pip.version, uv.installer, uv.version) == ("pip", "24.2", "uv", "0.13.9")
    assert pip.interpreter == interpreter("3.13.0", implementation_version="3.13.0", os_version="12"), (
        "CPython 3.13.0 on Linux, x86_64, glibc 2.36"
    )
    assert (uv.interpreter.python_minor, uv.interpreter.platform) == ("3.12", "manylinux_2_36_x86_64")


@pytest.mark.parametrize(
    "ua",
    [
        "",
        "curl/8.5.0",
        "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0",
        "pip/24.2",
        'pip/24.2 {"python": "three"}',
        'pip/24.2 {"cpu": "x86_64"}',
        "pip/24.2 {cut",
        "uv/0.13.9 []",
        'Python-urllib/3.11 {"python": 3.11}',
    ],
)
def test_anything_else_is_no_installer(ua: str) -> None:
    assert parse_user_agent(ua) is None


@pytest.mark.parametrize(
    ("facts", "label"),
    [
        ({}, "manylinux_2_36_x86_64"),
        ({"cpu": "aarch64", "libc_version": "2.39"}, "manylinux_2_39_aarch64"),
        ({"libc": "musl", "libc_version": "1.2"}, "musllinux_1_2_x86_64"),
        ({"libc": "", "libc_version": ""}, "linux_x86_64"),  # pip sends no libc on musl
        (
            {"system": "Darwin", "cpu": "arm64", "libc": "", "libc_version": "", "os_version": "14.5"},
            "macosx_14_0_arm64",
        ),
        ({"system": "Windows", "cpu": "AMD64", "libc": "", "libc_version": ""}, "win_amd64"),
        ({"system": "", "cpu": ""}, "unknown"),
    ],
)
def test_the_platform_is_the_newest_tag_the_interpreter_takes(facts: dict[str, str], label: str) -> None:
    assert interpreter(**facts).platform == label


def test_this_interpreters_own_tags_are_among_those_its_user_agent_gives() -> None:
    """packaging computes the tags of the running interpreter from the interpreter itself;
    from what its installer's User-Agent says, the same tags come out (and the older glibcs'
    manylinux tags below the oldest packaging lists)."""
    libc, version = platform.libc_ver()
    if platform.system() != "Linux" or libc != "glibc" or platform.python_implementation() != "CPython":
        pytest.skip("the comparison is of a CPython on Linux with glibc")
    here = Interpreter(
        python=platform.python_version(),
        implementation="CPython",
        system="Linux",
        cpu=platform.machine(),
        libc="glibc",
        libc_version=version,
    )
    assert set(sys_tags()) <= supported_tags(here)


# -- what a channel serves whom ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("file", "python", "served"),
    [
        (entry(f"demo-1.0-{CP311}.whl"), "3.11.9", True),
        (entry(f"demo-1.0-{CP311}.whl"), "3.12.7", False),
        (entry("demo-1.0-cp39-abi3-manylinux_2_17_x86_64.whl"), "3.12.7", True),
        (entry("demo-1.0-cp313-abi3-manylinux_2_17_x86_64.whl"), "3.12.7", False),
        (entry("demo-1.0-cp312-cp312-manylinux2014_x86_64.whl"), "3.12.7", True),  # PEP 599's name
        (entry("demo-1.0-cp312-cp312-manylinux_2_38_x86_64.whl"), "3.12.7", False),  # a newer glibc's
        (entry("demo-1.0-cp312-cp312-manylinux_2_17_aarch64.whl"), "3.12.7", False),
        (entry("demo-1.0-cp312-cp312-musllinux_1_2_x86_64.whl"), "3.12.7", False),
        (entry("demo-1.0-cp312-cp312-linux_x86_64.whl"), "3.12.7", True),
        (entry("demo-1.0-py3-none-any.whl"), "3.12.7", True),
        (entry("demo-1.0-py3-none-any.whl", requires_python=">=3.13"), "3.12.7", False),
        (entry("demo-1.0-py3-none-any.whl", requires_python="not a specifier"), "3.12.7", True),
        (entry("demo-1.0-py3-none-any.whl", yanked="broken"), "3.12.7", False),
        (entry("demo-1.0.tar.gz"), "3.12.7", True),  # an sdist an installer may build
        (entry("demo-1.0-not-a-wheel.whl"), "3.12.7", False),
    ],
)
def test_a_file_serves_an_interpreter_whose_tags_and_python_it_fits(file: FileEntry, python: str, served: bool) -> None:
    assert serves(file, interpreter(python)) is served


def test_pypy_takes_its_own_abi_and_pure_wheels() -> None:
    pypy = interpreter("3.10.14", implementation="PyPy", implementation_version="7.3.16")
    assert serves(entry("demo-1.0-pp310-pypy310_pp73-manylinux_2_17_x86_64.whl"), pypy)
    assert serves(entry("demo-1.0-py3-none-any.whl"), pypy)
    assert not serves(entry("demo-1.0-cp310-cp310-manylinux_2_17_x86_64.whl"), pypy)


@pytest.mark.parametrize(
    ("path", "page"),
    [
        ("/cu130/simple/torchsort/", ("cu130", "torchsort")),
        ("/cu130/simple/Torch_Sort", ("cu130", "torch-sort")),
        ("/test/cu130/simple/torchsort/", ("test/cu130", "torchsort")),
        ("/nightly/cpu/simple/flash%2Dattn/", ("nightly/cpu", "flash-attn")),
        ("/cu130/simple/", None),
        ("/", None),
        ("/blobs/sha256/ab/demo-1.0-py3-none-any.whl", None),
        ("/cu130/files/demo-1.0-py3-none-any.whl", None),
        ("/Cu130/simple/torchsort/", None),  # no channel's name
        ("/releases/simple/torchsort/", None),
        ("/cu130/simple/torch sort/", None),  # no project's name
        ("/a/b/c/simple/d/", None),
    ],
)
def test_a_project_page_names_its_channel_and_project(path: str, page: tuple[str, str] | None) -> None:
    assert project_page(path) == page


# -- the report ---------------------------------------------------------------------------------


def test_wants_are_ranked_most_asked_first_with_the_installers_that_asked(tmp_path: Path) -> None:
    index = index_with(tmp_path, "cu130", ("demo", "1.0", CP311))
    page, missing = "/cu130/simple/demo/", "/cu130/simple/absent/"
    lines = [
        *[line(page, agent(PIP, "3.10.15"))] * 2,
        *[line(page, agent(PIP, "3.12.7"))] * 2,
        *[line(page, agent(UV, "3.12.1"))] * 3,
        line(page, agent(PIP, "3.11.10")),  # served
        *[line(missing, agent(UV, "3.11.10"), status=404)] * 2,
    ]
    report = wants(lines, index)
    assert [(w.project, w.python, w.reason, w.count, w.installers) for w in report.wants] == [
        ("demo", "3.12", "no compatible file", 5, (("uv", 3), ("pip", 2))),
        ("absent", "3.11", "no such project", 2, (("uv", 2),)),  # a tie: by channel, project, Python
        ("demo", "3.10", "no compatible file", 2, (("pip", 2),)),
    ]
    assert (report.lines, report.skipped, report.requests, report.served) == (10, 0, 10, 1)
    assert report.top(1).wants == report.wants[:1]
    assert report.as_dict()["wants"][0] == {
        "channel": "cu130",
        "project": "demo",
        "python": "3.12",
        "implementation": "CPython",
        "platform": "manylinux_2_36_x86_64",
        "reason": "no compatible file",
        "count": 5,
        "installers": {"uv": 3, "pip": 2},
    }


def test_interpreters_apart_are_wants_apart(tmp_path: Path) -> None:
    index = index_with(tmp_path, "cpu", ("demo", "1.0", CP311))
    lines = [
        line("/cpu/simple/demo/", agent(PIP, "3.12.7")),
        line("/cpu/simple/demo/", agent(PIP, "3.12.7", glibc="2.39", cpu="aarch64")),
    ]
    assert [w.platform for w in wants(lines, index).wants] == ["manylinux_2_36_x86_64", "manylinux_2_39_aarch64"]


def test_lines_of_another_format_are_counted_and_skipped_and_other_requests_are_no_wants(tmp_path: Path) -> None:
    index = index_with(tmp_path, "cpu", ("demo", "1.0", CP311))
    page, pip = "/cpu/simple/demo/", agent(PIP, "3.12.7")
    lines = [
        '127.0.0.1 - - [22/Nov/2026:13:05:01 +0000] "GET /cpu/simple/demo/ HTTP/1.1" 200 653 "pip/24.2"',
        "",
        '{"time":"2026-11-22T13:05:01Z","method":"GET","path":"/cpu/sim',  # cut
        "[1, 2]",
        '{"method":"GET","path":"/cpu/simple/demo/","status":"two hundred","ua":""}',
        DAMAGED,
        line(page, "curl/8.5.0"),  # no installer
        line(page, ""),
        line("/cpu/simple/Demo/", pip, status=301),  # followed by the request that counts
        line(page, pip, status=406),
        line(page, pip, method="POST", status=405),
        line("/blobs/sha256/ab/demo-1.0.whl", pip),
        line(f"{page}?format=application/vnd.pypi.simple.v1+json", pip),  # nginx's $request_uri
    ]
    report = wants(lines, index)
    assert (report.lines, report.skipped, report.requests, report.served) == (13, 6, 1, 0)
    assert [w.count for w in report.wants] == [1]


def test_the_channel_asked_for_keeps_its_requests_alone_and_a_track_is_part_of_a_channel(tmp_path: Path) -> None:
    index = index_with(tmp_path, "test/cu130", ("demo", "1.0", CP311))
    index_with(tmp_path, "cu130", ("demo", "1.0", "py3-none-any"))
    pip = agent(PIP, "3.12.7")
    lines = [line("/test/cu130/simple/demo/", pip), line("/cu130/simple/demo/", pip)]
    assert [w.channel for w in wants(lines, index).wants] == ["test/cu130"]
    assert wants(lines, index, channel="cu130").wants == ()
    report = wants(lines, index, channel="test/cu130")
    assert (len(report.wants), report.requests) == (1, 1)


def test_what_the_channel_holds_now_decides(tmp_path: Path) -> None:
    """A 404 logged before the project was published is no want now; a yanked file is none."""
    index = index_with(tmp_path, "cpu", ("demo", "1.0", "py3-none-any"))
    lines = [line("/cpu/simple/demo/", agent(PIP, "3.12.7"), status=404)]
    assert wants(lines, index).wants == ()
    set_yanked(index.channel("cpu"), "demo", "1.0", "broken")
    assert [w.reason for w in wants(lines, index).wants] == ["no compatible file"]


# -- where the lines come from ---------------------------------------------------------------


def test_a_file_a_directory_and_gz_files_are_read_and_a_cut_gz_is_one_damaged_line(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    (logs / "old").mkdir(parents=True)
    (logs / "access.log").write_text("a\nb\n")
    (logs / "access.log.1.gz").write_bytes(gzip.compress(b"c\nd\n"))
    (logs / "old" / "access.log.2.gz").write_bytes(gzip.compress(b"e\nf\n" * 50)[:-12])
    (logs / ".hidden").write_text("never read\n")
    (logs / ".work").mkdir()
    (logs / ".work" / "partial.log").write_text("never read\n")
    assert list(log_lines(str(logs / "access.log"))) == ["a", "b"]
    assert list(log_lines(str(logs / "access.log.1.gz"))) == ["c", "d"]
    read = list(log_lines(str(logs)))
    assert read[:4] == ["a", "b", "c", "d"] and read[-1] == DAMAGED and "never read" not in read


def test_a_bucket_prefix_is_read_through_the_index_storage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every object under the prefix, by the storage ``Index`` makes for a bucket (a tree
    stands in for the bucket here; tests/integration/test_wants.py reads a real one)."""
    bucket = tmp_path / "bucket"
    (bucket / "nginx").mkdir(parents=True)
    (bucket / "nginx" / "wheelmill-wants.log").write_text("a\n")
    (bucket / "nginx" / "wheelmill-wants.log-20261122.gz").write_bytes(gzip.compress(b"b\n"))
    asked: list[str] = []

    def storage_of(url: str) -> TreeStorage:
        asked.append(url)
        return TreeStorage(bucket / "nginx")

    monkeypatch.setattr(s3.S3Storage, "of", staticmethod(storage_of))
    assert list(log_lines("s3://logs/nginx/")) == ["a", "b"]
    assert asked == ["s3://logs/nginx/"]


# -- the log index serve writes ------------------------------------------------------------


@pytest.fixture
def logged(tmp_path: Path) -> Iterator[tuple[IndexServer, io.StringIO]]:
    index_with(tmp_path, "cpu", ("demo", "1.0", "py3-none-any"))
    log = io.StringIO()
    server = make_server(tmp_path / "index", "127.0.0.1", 0, log)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, log
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def get(server: IndexServer, target: str, ua: str | None = None) -> int:
    headers = {"User-Agent": ua} if ua is not None else {}
    url = f"http://127.0.0.1:{server.server_address[1]}{target}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as answer:
            answer.read()
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return error.code


def written(log: io.StringIO, count: int) -> list[str]:
    """The log's lines once it has ``count``: the server writes a request's line just after
    its answer, so a client may be done a moment before."""
    deadline = time.monotonic() + 10
    while len(log.getvalue().splitlines()) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return log.getvalue().splitlines()


def test_serve_logs_one_json_line_a_request_without_the_client_address(logged: tuple[IndexServer, io.StringIO]) -> None:
    server, log = logged
    assert get(server, "/cpu/simple/demo/?format=text/html", PIP) == 200
    assert get(server, "/cpu/simple/absent/", "curl/8.5.0") == 404
    first, second = (json.loads(text) for text in written(log, 2))
    assert tuple(first) == KEYS
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", first["time"]), "RFC 3339, UTC"
    assert (first["method"], first["path"], first["status"], first["ua"]) == ("GET", "/cpu/simple/demo/", 200, PIP)
    assert first["bytes"] > 0
    assert (second["path"], second["status"], second["ua"]) == ("/cpu/simple/absent/", 404, "curl/8.5.0")
    assert "127.0.0.1" not in log.getvalue()


def test_a_request_without_a_user_agent_logs_an_empty_one(logged: tuple[IndexServer, io.StringIO]) -> None:
    server, log = logged
    sent = urllib.request.Request(f"http://127.0.0.1:{server.server_address[1]}/cpu/simple/", method="HEAD")
    sent.remove_header("User-agent")
    opener = urllib.request.build_opener()
    opener.addheaders = []  # urllib sends its own User-Agent otherwise
    with opener.open(sent, timeout=10) as answer:
        assert answer.status == 200
    (logged_line,) = written(log, 1)
    request = parse_request(logged_line)
    assert request is not None and (request.method, request.ua, request.sent) == ("HEAD", "", 0)


def test_threads_write_whole_lines(logged: tuple[IndexServer, io.StringIO]) -> None:
    server, log = logged
    with ThreadPoolExecutor(max_workers=16) as pool:
        statuses = list(pool.map(lambda n: get(server, f"/cpu/simple/demo/?n={n}", PIP), range(64)))
    assert statuses == [200] * 64
    assert [parse_request(text) is not None for text in written(log, 64)] == [True] * 64


class FullDisk(io.StringIO):
    def write(self, _text: str) -> int:
        raise OSError(28, "No space left on device")


def test_a_log_that_cannot_be_written_loses_lines_never_answers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    index_with(tmp_path, "cpu", ("demo", "1.0", "py3-none-any"))
    server = make_server(tmp_path / "index", "127.0.0.1", 0, FullDisk())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert [get(server, "/cpu/simple/demo/", PIP) for _ in range(3)] == [200, 200, 200]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
    said = capsys.readouterr().err.splitlines()
    assert said == [
        "wheelmill index serve: the access log cannot be written ([Errno 28] No space left on device); serving on"
    ]


# -- nginx's formats ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "name"), [("nginx-index.conf", "wheelmill_wants"), ("nginx-bucket.conf", "wheelmill_bucket_wants")]
)
def test_nginx_logs_the_same_format_without_the_client_address(config: str, name: str) -> None:
    text = (ROOT / "deploy" / config).read_text()
    match = re.search(rf"^log_format {name} escape=json ((?:'[^']*'\s*)+);$", text, flags=re.MULTILINE)
    assert match, f"{config}: log_format {name}"
    assert re.search(rf"^access_log \S+ {name};$", text, flags=re.MULTILINE), f"{config}: an access_log using it"
    template = "".join(re.findall(r"'([^']*)'", match.group(1)))
    assert not re.search(r"\$(remote|binary_remote|realip|http_x_forwarded|proxy_add_x)", template), "no address"
    values = {
        "$time_iso8601": "2026-11-22T13:05:01+00:00",
        "$request_method": "GET",
        "$request_uri": "/cu130/simple/demo/?format=text/html",
        "$status": "404",
        "$http_user_agent": json.dumps(PIP)[1:-1],  # what escape=json writes
        "$body_bytes_sent": "9",
    }
    written = re.sub(r"\$[a-z0-9_]+", lambda m: values[m.group(0)], template)
    assert tuple(json.loads(written)) == KEYS
    assert parse_request(written) == Request(
        time="2026-11-22T13:05:01+00:00", method="GET", path="/cu130/simple/demo/", status=404, ua=PIP, sent=9
    )


# -- the command and the docs ------------------------------------------------------------------

DOCS = ROOT / "docs" / "wheel-index.md"


def documented_scenario(tmp_path: Path) -> tuple[Path, Path]:
    """The example of docs/wheel-index.md: torchsort built for CPython 3.11 alone in cu130,
    asked for by 3.11, 3.12 and 3.13 (an aarch64 machine), and flash-attn, which it lacks.
    The index and the log."""
    index = index_with(tmp_path, "cu130", ("torchsort", "0.1.10+cu130", CP311))
    torchsort, flash_attn = "/cu130/simple/torchsort/", "/cu130/simple/flash-attn/"
    lines = [
        '127.0.0.1 - - [22/Nov/2026:13:05:01 +0000] "GET /cu130/simple/torchsort/ HTTP/1.1" 200 653',
        *[line(torchsort, agent(PIP, "3.12.7"))] * 3,
        line(torchsort, agent(UV, "3.12.7")),
        *[line(torchsort, agent(PIP, "3.11.10"))] * 2,
        line(torchsort, agent(UV, "3.13.1", glibc="2.39", cpu="aarch64")),
        *[line(flash_attn, agent(PIP, "3.11.10"), status=404)] * 2,
        line(torchsort, "curl/8.5.0"),
        line(f"{torchsort}?format=application/vnd.pypi.simple.v1+json", "Mozilla/5.0"),
    ]
    log = tmp_path / "access.log"
    log.write_text("\n".join(lines) + "\n")
    assert index.tree is not None
    return index.tree, log


def documented_block(starting: str) -> str:
    """The code block of the docs' section that starts with ``starting``."""
    text = DOCS.read_text()
    section = text[text.index("## What users asked for") :]
    blocks = section.split("```\n")[1::2]
    (found,) = [block for block in blocks if block.startswith(starting)]
    return found


def test_the_docs_example_is_what_wants_prints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli: CliRunner) -> None:
    root, log = documented_scenario(tmp_path)
    monkeypatch.setenv("WHEELMILL_INDEX_ROOT", str(root))
    result = cli("wants", "--log", str(log))
    assert result.code == 0, result.err
    printed = [text.rstrip() for text in result.out.splitlines()]
    assert printed == documented_block("wheelmill wants --log").splitlines()[1:]
    assert all(len(text) <= 100 for text in result.out.splitlines())
    shown = json.loads(cli("wants", "--log", str(log), "--json", "--top", "1").out)
    documented = json.loads(documented_block("{\n"))
    assert shown == documented


def test_the_docs_name_every_key_of_the_log_and_keep_no_address() -> None:
    text = DOCS.read_text()
    section = text[text.index("## What users asked for") :]
    table = re.findall(r"^\| `([a-z]+)` \|", section, flags=re.MULTILINE)
    assert tuple(table[: len(KEYS)]) == KEYS
    sample = documented_block('{"time"')
    assert parse_request(sample.strip()) is not None and tuple(json.loads(sample)) == KEYS
    assert "No client address is kept" in section


def test_wants_says_what_is_wrong_with_its_input_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli: CliRunner
) -> None:
    root, log = documented_scenario(tmp_path)
    monkeypatch.setenv("WHEELMILL_INDEX_ROOT", str(root))
    cases = {
        ("--log", str(tmp_path / "absent.log")): (UsageError, "no such file or directory"),
        ("--log", str(log), "--channel", "Cu130"): (UsageError, "not a channel name"),
        ("--log", str(log), "--top", "0"): (UsageError, "at least 1"),
    }
    (tmp_path / "other.log").write_text('127.0.0.1 - - [22/Nov/2026:13:05:01 +0000] "GET / HTTP/1.1" 200 1\n')
    cases[("--log", str(tmp_path / "other.log"))] = (UsageError, "(1 read) is a request in the access log's format")
    for args, (error, said) in cases.items():
        result = cli("wants", *args)
        assert result.code == error.exit_code, result.err
        assert len(result.err.splitlines()) == 1 and said in result.err and "; fix: " in result.err, result.err
    monkeypatch.setenv("WHEELMILL_INDEX_ROOT", str(tmp_path / "empty"))
    result = cli("wants", "--log", str(log))
    assert result.code == ChannelError.exit_code and "has no channels" in result.err


def test_a_want_as_json_has_its_installers_as_an_object() -> None:
    want = Want(
        channel="cpu",
        project="demo",
        python="3.12",
        implementation="CPython",
        platform="manylinux_2_36_x86_64",
        reason="no such project",
        count=4,
        installers=(("pip", 3), ("uv", 1)),
    )
    assert want.as_dict()["installers"] == {"pip": 3, "uv": 1}
