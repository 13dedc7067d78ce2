"""Small pieces: sources from pip's configuration, locks, retries, runner, jobs."""

from __future__ import annotations

import base64
import http.server
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from wheelmill.building.steps.build import first_error, max_jobs
from wheelmill.errors import CommandFailed, FetchError, PublishError
from wheelmill.index.remote import Remote, upload_failure
from wheelmill.inputs.matrix import load_matrix
from wheelmill.machine import net
from wheelmill.machine.envs import Target, UvBackend, pinned_versions
from wheelmill.machine.net import is_transient, project_files, upload_refusal
from wheelmill.machine.package_sources import PackageSources, machine_sources, sources_from_pip_config
from wheelmill.machine.process import HostRunner, StepLog, base_environment
from wheelmill.planning import locks
from wheelmill.planning.locks import locate_torch
from wheelmill.retry import RetryPolicy, TransientError, with_retries
from wheelmill.settings import Settings
from wheelmill.wheel.elf import system_lib_dirs

ROOT = Path(__file__).resolve().parent.parent.parent


def test_pip_configuration_becomes_uv_arguments() -> None:
    listing = "\n".join(
        [
            "global.index-url='https://mirror.example/simple'",
            "global.extra-index-url='file:///a/simple file:///b/simple'",
            "global.find-links='/wheels'",
            ":env:.find-links='/env-wheels'",
            "global.cert='/etc/ssl/certs/ca.crt'",
        ]
    )
    sources = sources_from_pip_config(listing)
    assert sources.uv_args() == [
        "--index-url", "https://mirror.example/simple",
        "--extra-index-url", "file:///a/simple",
        "--extra-index-url", "file:///b/simple",
        "--find-links", "/env-wheels",
    ]  # fmt: skip
    assert sources.origin == "pip configuration"


def test_no_pip_configuration_means_installer_defaults() -> None:
    assert sources_from_pip_config("global.cert='/x'").uv_args() == []


def test_settings_replace_pip_configuration() -> None:
    settings = Settings.from_environ(
        {"WHEELMILL_INDEX_URL": "https://i.example/simple", "WHEELMILL_FIND_LINKS": "/w1 /w2"}
    )
    sources = machine_sources(settings)
    assert sources.origin == "WHEELMILL_* settings"
    assert sources.uv_args() == [
        "--index-url",
        "https://i.example/simple",
        "--find-links",
        "/w1",
        "--find-links",
        "/w2",
    ]


def test_torch_index_goes_after_the_machine_sources() -> None:
    base = PackageSources(index_url=None, extra_index_urls=("file:///a",))
    with_torch = base.with_torch_index("https://torch.example/whl/cu118")
    assert with_torch.extra_index_urls == ("file:///a", "https://torch.example/whl/cu118")
    assert with_torch.uv_args()[-2:] == ["--index-strategy", "unsafe-first-match"]


def test_lock_pins_are_read() -> None:
    lock = (
        "torch==2.14.1 \\\n    --hash=sha256:aa\n"
        "nvidia-cuda-runtime==13.0.96 ; platform_machine == 'x86_64' \\\n    --hash=sha256:bb\n"
    )
    assert pinned_versions(lock) == {"torch": "2.14.1", "nvidia-cuda-runtime": "13.0.96"}


@pytest.mark.parametrize(
    ("output", "transient"),
    [
        ("error: Failed to fetch: https://x/simple/torch/\n  cause: error sending request for url", True),
        ("cause: dns error", True),
        ("HTTP status server error (503 Service Unavailable)", True),
        ("Because there is no version of torch==2.7.1+cu118 and you require it", False),
        ("HTTP status client error (404 Not Found)", False),
    ],
)
def test_transient_failures_are_told_apart(output: str, transient: bool) -> None:
    assert is_transient(output) is transient


_UV_REFUSED = [
    "Uploading w-1.0-py3-none-any.whl (724B)",
    "error: Failed to publish `dist/w-1.0-py3-none-any.whl` to `http://idx/`",
    "  cause: Server returned status code 403 Forbidden. Server says:",
    "             <html>",
    "                 <title>Error: 403 Forbidden (timed out)</title>",
    "             </html>",
]
_UV_BROKEN_PIPE = [
    "error: Failed to publish `dist/w-1.0-py3-none-any.whl` to `http://idx/`",
    "  cause: error sending request for url (http://idx/)",
    "  cause: Broken pipe (os error 32)",
]
_UV_BAD_REQUEST = [
    "error: Failed to publish `w.whl`",
    "  cause: Server returned status code 400 Bad Request. Server says: bad metadata",
]


@pytest.mark.parametrize(
    ("tail", "kind", "says"),
    [
        (
            _UV_REFUSED,
            PublishError,
            (
                "upload of w-1.0-py3-none-any.whl: Server returned status code 403 Forbidden.; "
                "fix: set WHEELMILL_PUBLISH_USERNAME"
            ),
        ),
        (
            _UV_BROKEN_PIPE,
            TransientError,
            "uv publish: error sending request for url (http://idx/): Broken pipe (os error 32)",
        ),
        (
            _UV_BAD_REQUEST,
            PublishError,
            (
                "w-1.0-py3-none-any.whl failed: Server returned status code 400 Bad Request. "
                "Server says: bad metadata; fix: read"
            ),
        ),
    ],
)
def test_upload_failures_are_told_apart(tail: list[str], kind: type[Exception], says: str) -> None:
    failed = CommandFailed(["uv", "publish"], 2, Path("publish.log"), tail)
    error = upload_failure(Remote.of("http://idx/", None, Settings.from_environ({})), "w-1.0-py3-none-any.whl", failed)
    assert type(error) is kind
    assert says in (f"{error}; fix: {error.fix}" if isinstance(error, PublishError) else str(error))
    assert "<html>" not in str(error)


@pytest.fixture
def upload_endpoint() -> Iterator[str]:
    """An index that takes uploads from user:secret alone, checking credentials first, as
    pypiserver does: 403 without reading the body, else 400 for the missing file."""
    allowed = "Basic " + base64.b64encode(b"user:secret").decode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            self.send_response(400 if self.headers.get("Authorization") == allowed else 403)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def test_an_upload_refusal_is_told_by_asking_without_the_file(upload_endpoint: str) -> None:
    # After uv's broken pipe (the index closed the connection as it refused), this tells a
    # refusal, which is not retried, from a network fault, which is.
    assert upload_refusal(upload_endpoint, ("user", "wrong")) == "status code 403 Forbidden"
    assert upload_refusal(upload_endpoint, None) == "status code 403 Forbidden"
    assert upload_refusal(upload_endpoint, ("user", "secret")) is None
    # nothing listens: not a refusal
    assert upload_refusal("http://127.0.0.1:9/", ("user", "secret"), timeout=2) is None


@pytest.fixture
def project_pages() -> Iterator[str]:
    """An index whose answer for a project is in its name: ``/simple/404/`` answers 404, and
    so on; ``/simple/huge/`` sends a page past the bound, without a length."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            name = self.path.strip("/").rsplit("/", 1)[-1]
            if name.isdigit():
                self.send_response(int(name))
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            chunk = b"<a href='x-1.0-py3-none-any.whl'>x</a>" * 1000
            for _ in range((net.PAGE_LIMIT // len(chunk)) + 2):
                self.wfile.write(chunk)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    server.shutdown()
    server.server_close()


def test_a_project_page_that_is_absent_refused_or_unbounded_is_told_apart(project_pages: str) -> None:
    """404 and 410 say the project is not there; 401 and 403 say nothing of it (credentials)
    and are errors, never "not on this index"; a page is read to a bound and no further."""
    assert project_files(project_pages, "404") == [] and project_files(project_pages, "410") == []
    for code in ("401", "403"):
        with pytest.raises(FetchError, match=rf"HTTP {code} .*: the index refused access") as refused:
            project_files(project_pages, code)
        assert "credentials" in (refused.value.fix or "")
    with pytest.raises(FetchError, match="larger than 64 MiB; not read further"):
        project_files(project_pages, "huge")


def test_retries_back_off_and_stop_at_the_budget() -> None:
    pauses: list[float] = []
    calls: list[int] = []

    def flaky(attempt: int) -> str:
        calls.append(attempt)
        if attempt < 3:
            raise TransientError("503")
        return "ok"

    policy = RetryPolicy(attempts=5, base_delay=1.0, max_delay=8.0)
    result = with_retries(flaky, policy=policy, on_retry=lambda *a: None, sleep=pauses.append, rng=random.Random(1))  # noqa: S311
    assert result == ("ok", 3)
    assert calls == [1, 2, 3]
    assert 0.5 <= pauses[0] <= 1.0 and 1.0 <= pauses[1] <= 2.0

    def always(attempt: int) -> str:
        raise TransientError("down")

    with pytest.raises(TransientError):
        with_retries(always, policy=RetryPolicy(attempts=2), on_retry=lambda *a: None, sleep=pauses.append)


def test_other_errors_are_never_retried() -> None:
    calls: list[int] = []

    def broken(attempt: int) -> None:
        calls.append(attempt)
        raise ValueError("compile error")

    with pytest.raises(ValueError, match="compile error"):
        with_retries(broken, policy=RetryPolicy(attempts=5), on_retry=lambda *a: None, sleep=lambda s: None)
    assert calls == [1]


def test_max_jobs_fits_memory_and_cores() -> None:
    gib = 2**30
    assert max_jobs(24 * gib, 3 * gib, 2) == 2
    assert max_jobs(7 * gib, 3 * gib, 64) == 2
    assert max_jobs(gib, 3 * gib, 8) == 1


def test_runner_logs_command_env_and_output(tmp_path: Path) -> None:
    lines: list[str] = []
    with StepLog(tmp_path / "step.log") as log:
        result = HostRunner().run(
            ["sh", "-c", "echo hello; echo $WM_X"],
            env=base_environment([], {"WM_X": "explicit"}),
            log=log,
            on_line=lines.append,
            keep_output=True,
        )
    text = (tmp_path / "step.log").read_text()
    assert result.output == "hello\nexplicit\n"
    assert lines == ["hello\n", "explicit\n"]
    assert "$ sh -c" in text and "# env WM_X=explicit" in text and "exit status 0" in text


def test_runner_environment_is_explicit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_HOME", "/leaked")
    env = base_environment(["/opt/tool/bin"])
    assert "CUDA_HOME" not in env
    assert env["PATH"].split(":")[0] == "/opt/tool/bin"
    assert "/usr/local/bin" not in env["PATH"].split(":")


def test_uv_keeps_the_callers_cache_location_and_no_other_uv_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UV_CACHE_DIR", "/elsewhere/uv")
    monkeypatch.setenv("UV_INDEX_URL", "http://example.invalid/simple")
    env = UvBackend(HostRunner())._env()
    assert env["UV_CACHE_DIR"] == "/elsewhere/uv" and "UV_INDEX_URL" not in env
    assert UvBackend(HostRunner(), cache_dir=tmp_path / "uv")._env()["UV_CACHE_DIR"] == str(tmp_path / "uv"), (
        "the cell's own cache wins"
    )
    monkeypatch.delenv("UV_CACHE_DIR")
    assert "UV_CACHE_DIR" not in UvBackend(HostRunner())._env()


def test_runner_failure_carries_the_tail(tmp_path: Path) -> None:
    with StepLog(tmp_path / "step.log") as log, pytest.raises(CommandFailed) as failed:
        HostRunner().run(
            ["sh", "-c", "echo first; echo 'fatal: broken' >&2; exit 3"], env=base_environment([]), log=log
        )
    assert failed.value.returncode == 3
    assert failed.value.last_line() == "fatal: broken"
    with StepLog(tmp_path / "step.log") as log, pytest.raises(CommandFailed) as missing:
        HostRunner().run(["/nonexistent/tool"], env=base_environment([]), log=log)
    assert missing.value.returncode == 127


def test_interrupt_stops_the_whole_process_group(tmp_path: Path) -> None:
    """Ctrl-C during a command kills its children too (nvcc spawns a tree)."""
    pid_file = tmp_path / "child.pid"

    def interrupt_on_first_line(line: str) -> None:
        raise KeyboardInterrupt

    script = f"sleep 300 & echo $! > {pid_file}; echo started; wait"
    with StepLog(tmp_path / "step.log") as log, pytest.raises(KeyboardInterrupt):
        HostRunner().run(["sh", "-c", script], env=base_environment([]), log=log, on_line=interrupt_on_first_line)
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and Path(f"/proc/{child}").exists():
        time.sleep(0.05)
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]


def test_loader_cache_directories() -> None:
    dirs = system_lib_dirs("\tlibm.so.6 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libm.so.6\n")
    assert dirs[0] == Path("/usr/lib/x86_64-linux-gnu")
    assert Path("/lib64") in dirs


def test_build_error_is_the_first_compiler_error(tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    log.write_text(
        "# env PATH=/usr/bin\n"
        "  [1/2] c++ -c ops.cpp\n"
        "  /env/torch/include/ATen/cuda/CUDAContextLight.h:10:10: fatal error: cusparse.h: No such file or directory\n"
        "  RuntimeError: Error compiling objects for extension\n"
        "  error: subprocess-exited-with-error\n"
    )
    assert (
        first_error(log, ())
        == "/env/torch/include/ATen/cuda/CUDAContextLight.h:10:10: fatal error: cusparse.h: No such file or directory"
    )
    log.write_text("nothing useful\n")
    assert first_error(log, ("last words",)) == "last words"


class _Indexes:
    """uv as the machine's indexes answer it: torch 2.12.0 sits on the default index, after
    an extra index that has other torch releases (the first index with torch wins uv's
    first-index rule; the best match across indexes finds it)."""

    def __init__(self) -> None:
        self.asked: list[str | None] = []

    def lock(self, requirements: Path, out: Path, *, sources: PackageSources, **_: object) -> dict[str, str]:
        self.asked.append(sources.index_strategy)
        if sources.index_strategy != "unsafe-best-match":
            raise CommandFailed(["uv"], 1, None, ["cause: torch==2.12.0 is not in file:///extra"])
        return {"torch": "2.12.0"}


def test_a_torch_on_the_default_index_behind_an_extra_one_is_found_by_the_best_match(tmp_path: Path) -> None:
    variant = load_matrix(ROOT / "recipes" / "matrix.toml").variants["cuda130-torch2.12"]
    base = PackageSources(index_url=None, extra_index_urls=("file:///extra",), origin="pip configuration")
    backend = _Indexes()
    with StepLog(tmp_path / "pre-checks.log") as log:
        found = locate_torch(
            variant,
            None,
            base,
            backend=backend,  # type: ignore[arg-type]
            target=Target(python="3.11", platform="x86_64-manylinux_2_28"),
            work=tmp_path / "work",
            log=log,
        )
    assert backend.asked == [None, "unsafe-best-match"]
    assert isinstance(found, PackageSources) and found.uv_args()[-2:] == ["--index-strategy", "unsafe-best-match"]
    assert found.origin == "pip configuration, best match across indexes"


def test_a_source_that_lacks_torch_says_uvs_cause_and_its_hint() -> None:
    """uv's hint says why a source lacks the torch (its first-index rule, a Python no wheel
    is for): the pre-check's line keeps it beside the cause."""
    tail = [
        "error: No solution found when resolving dependencies:",
        (
            "  cause: Because there is no version of torch==2.12.0 and you require torch==2.12.0, "
            "we can conclude that your requirements are unsatisfiable."
        ),
        "",
        (
            "  hint: `torch` was found on file:///opt/pypi/simple, but not at the requested version "
            "(torch==2.12.0). A compatible version may be available on a subsequent index."
        ),
    ]
    reason = locks._reason(CommandFailed(["uv", "pip", "compile"], 1, None, tail))
    assert reason.startswith("Because there is no version of torch==2.12.0")
    assert "; uv's hint: `torch` was found on file:///opt/pypi/simple, but not at the requested version" in reason
    assert reason.endswith("may be available on a subsequent index.")
    assert locks._reason(CommandFailed(["uv"], 1, None, ["  cause: no torch"])) == "no torch"
