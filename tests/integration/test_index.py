"""The index for real: wheels published with the CLI, served over HTTP by wheelmill (and by
nginx), installed by pip and uv in fresh venvs, measured from the server's access log."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import NoReturn
from urllib.parse import unquote

import jsonschema
import pytest

from tests.channels import stored_file, tree_channel
from tests.nginx import CONTENT_TYPES, DEPLOY, accept_cases, get, main_context
from tests.ports import free_port
from tests.wheels import make_wheel
from wheelmill.files import TMP_PREFIX
from wheelmill.index import objects
from wheelmill.index.objects import ObjectChannel, verify_file
from wheelmill.index.roots import problems, publish
from wheelmill.index.serve import make_server, parse_access_log
from wheelmill.inputs.matrix import load_matrix
from wheelmill.machine.tools import uv_bin

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent.parent
ANY = "py3-none-any"
JSON = "application/vnd.pypi.simple.v1+json"


class Served:
    def __init__(self, root: Path, log: Path) -> None:
        self.root = root
        self.log = log
        self.handle = log.open("a", encoding="utf-8")
        self.server = make_server(root, "127.0.0.1", 0, self.handle)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def simple(self, channel: str) -> str:
        return f"{self.url}/{channel}/simple/"

    def requests(self) -> list[tuple[str, int, int]]:
        self.handle.flush()
        return parse_access_log(self.log.read_text().splitlines())

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.handle.close()


@pytest.fixture
def index_root(tmp_path: Path) -> Path:
    return tmp_path / "index"


@pytest.fixture
def served(index_root: Path, tmp_path: Path) -> Iterator[Served]:
    index_root.mkdir(parents=True, exist_ok=True)
    server = Served(index_root, tmp_path / "access.log")
    yield server
    server.close()


def wheelmill(
    index_root: Path, *args: str, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "WHEELMILL_INDEX_ROOT": str(index_root), **(env or {})}
    result = subprocess.run(
        [sys.executable, "-m", "wheelmill", *args],
        env=environment,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"wheelmill {' '.join(args)} exited {result.returncode}: {result.stderr[-2000:]}")
    return result


def isolated_env(**extra: str) -> dict[str, str]:
    """No pip or uv configuration of this machine: only what a test passes (the run's uv
    cache stays, see conftest)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_")) or k == "UV_CACHE_DIR"}
    return {
        **env,
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "UV_NO_CONFIG": "1",
        "UV_PYTHON_DOWNLOADS": "never",
        **extra,
    }


def venv(path: Path) -> Path:
    """An empty venv, quickly: no pip inside (the tests' pip acts on it with --python), made
    by uv, which neither unpacks pip nor compiles it as ``python -m venv`` does (6 s each)."""
    done = uv("venv", "--quiet", "--no-config", "--python", sys.executable, str(path))
    assert done.returncode == 0, done.stderr
    return path / "bin" / "python"


def pip(python: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The pinned pip of wheelmill's own env, acting on the venv at ``python``. It installs
    without compiling what it installs: the tests import a few of torch's thousands of modules."""
    if args[:1] == ("install",):
        args = ("install", "--no-compile", *args[1:])
    argv = [sys.executable, "-m", "pip", "--python", str(python), *args]
    return subprocess.run(argv, env=env or isolated_env(), capture_output=True, text=True, check=False, timeout=600)


def uv(
    *args: str, env: dict[str, str] | None = None, input_text: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [uv_bin(), *args],
        env=env or isolated_env(),
        input=input_text,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )


def small_wheels(directory: Path) -> tuple[Path, Path]:
    lib = make_wheel(
        directory, "wm-lib", "1.0", tag=ANY, requires_python=">=3.9", files={"wm_lib/__init__.py": b"VALUE = 41\n"}
    )
    app = make_wheel(
        directory,
        "wm-app",
        "1.0+cu118",
        tag=ANY,
        requires=["wm-lib==1.0"],
        files={"wm_app/__init__.py": b"from wm_lib import VALUE\nANSWER = VALUE + 1\n"},
    )
    return lib, app


def test_pip_and_uv_install_from_the_served_index(served: Served, index_root: Path, tmp_path: Path) -> None:
    lib, app = small_wheels(tmp_path / "dist")
    wheelmill(index_root, "publish", "--channel", "cu118", str(lib), str(app))
    python = venv(tmp_path / "pip-env")
    result = pip(python, "install", "--index-url", served.simple("cu118"), "wm-app==1.0+cu118")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        subprocess.run(
            [str(python), "-c", "import wm_app; print(wm_app.ANSWER)"], capture_output=True, text=True, check=True
        ).stdout
        == "42\n"
    )
    uv_python = venv(tmp_path / "uv-env")
    result = uv(
        "pip", "install", "--python", str(uv_python), "--index-url", served.simple("cu118"), "wm-app==1.0+cu118"
    )
    assert result.returncode == 0, result.stderr
    assert (
        subprocess.run(
            [str(uv_python), "-c", "import wm_app; print(wm_app.ANSWER)"], capture_output=True, text=True, check=True
        ).stdout
        == "42\n"
    )
    paths = {path for path, status, _bytes in served.requests() if status == 200}
    assert "/cu118/simple/wm-app/" in paths and "/cu118/simple/wm-lib/" in paths


def test_resolvers_read_the_metadata_sidecar_not_a_200mb_wheel(
    served: Served, index_root: Path, tmp_path: Path
) -> None:
    payload = os.urandom(200 * 1024 * 1024)
    big = make_wheel(
        tmp_path / "dist",
        "wm-big",
        "1.0",
        tag=ANY,
        files={"wm_big/__init__.py": b"", "wm_big/blob.bin": payload},
        stored=True,
    )
    del payload
    size = big.stat().st_size
    assert size >= 200 * 1024 * 1024
    wheelmill(index_root, "publish", "--channel", "cpu", str(big))
    python = venv(tmp_path / "env")
    result = pip(
        python,
        "install",
        "--dry-run",
        "--ignore-installed",
        "--report",
        str(tmp_path / "report.json"),
        "--index-url",
        served.simple("cpu"),
        "wm-big==1.0",
    )
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "report.json").read_text())["install"][0]["metadata"]["name"] == "wm-big"
    result = uv(
        "pip",
        "compile",
        "-",
        "--index-url",
        served.simple("cpu"),
        "--python",
        str(python),
        env={**isolated_env(), "UV_CACHE_DIR": str(tmp_path / "uv-cache")},
        input_text="wm-big==1.0\n",
    )
    assert result.returncode == 0, result.stderr
    assert "wm-big==1.0" in result.stdout
    requests = served.requests()
    wheel_bytes = sum(sent for path, _status, sent in requests if path.endswith(".whl"))
    sidecars = [path for path, status, _ in requests if path.endswith(".whl.metadata") and status == 200]
    assert len(sidecars) >= 2, requests  # pip and uv both read it
    assert wheel_bytes <= size // 100, f"{wheel_bytes} bytes of a {size}-byte wheel were served"


def test_json_pages_satisfy_pep691_and_pep700(served: Served, index_root: Path, tmp_path: Path) -> None:
    lib, app = small_wheels(tmp_path / "dist")
    wheelmill(index_root, "publish", "--channel", "cu118", str(lib), str(app))
    wheelmill(index_root, "yank", "--channel", "cu118", "wm-lib", "1.0", "--reason", "testing")

    def get(url: str) -> tuple[str, dict[str, object]]:
        with urllib.request.urlopen(urllib.request.Request(url, headers={"Accept": JSON})) as response:
            return response.headers["Content-Type"], json.loads(response.read())

    content_type, root = get(served.simple("cu118"))
    assert content_type == JSON
    jsonschema.validate(root, ROOT_SCHEMA)
    for project in root["projects"]:  # type: ignore[attr-defined]
        content_type, page = get(served.simple("cu118") + project["name"] + "/")
        assert content_type == JSON
        jsonschema.validate(page, PROJECT_SCHEMA)
    _, lib_page = get(served.simple("cu118") + "wm-lib/")
    assert lib_page["files"][0]["yanked"] == "testing"  # type: ignore[index]


RFC3339 = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$"
ROOT_SCHEMA = {
    "type": "object",
    "required": ["meta", "projects"],
    "properties": {
        "meta": {"type": "object", "required": ["api-version"], "properties": {"api-version": {"const": "1.1"}}},
        "projects": {
            "type": "array",
            "items": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}},
        },
    },
}
PROJECT_SCHEMA = {
    "type": "object",
    "required": ["meta", "name", "files", "versions"],
    "properties": {
        "meta": {
            "type": "object",
            "required": ["api-version"],
            "properties": {"api-version": {"type": "string", "pattern": r"^1\.[1-9]"}},
        },
        "name": {"type": "string", "pattern": "^[a-z0-9]([a-z0-9-]*[a-z0-9])?$"},
        "versions": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        "files": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["filename", "url", "hashes", "size"],
                "properties": {
                    "filename": {"type": "string"},
                    "url": {"type": "string"},
                    "hashes": {
                        "type": "object",
                        "additionalProperties": {"type": "string", "pattern": "^[0-9a-f]+$"},
                        "required": ["sha256"],
                    },
                    "requires-python": {"type": ["string", "null"]},
                    "core-metadata": {
                        "oneOf": [{"type": "boolean"}, {"type": "object", "additionalProperties": {"type": "string"}}]
                    },
                    "dist-info-metadata": {
                        "oneOf": [{"type": "boolean"}, {"type": "object", "additionalProperties": {"type": "string"}}]
                    },
                    "yanked": {"type": ["boolean", "string"]},
                    "size": {"type": "integer", "minimum": 0},
                    "upload-time": {"type": "string", "pattern": RFC3339},
                },
            },
        },
    },
}


def test_uv_exclude_newer_honours_upload_time(served: Served, index_root: Path, tmp_path: Path) -> None:
    wheelmill(index_root, "publish", "--channel", "cpu", str(make_wheel(tmp_path / "a", "wm-lib", "1.0", tag=ANY)))
    time.sleep(1.5)
    between = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    time.sleep(1.5)
    wheelmill(index_root, "publish", "--channel", "cpu", str(make_wheel(tmp_path / "b", "wm-lib", "2.0", tag=ANY)))
    env = {**isolated_env(), "UV_CACHE_DIR": str(tmp_path / "uv-cache")}
    newest = uv(
        "pip",
        "compile",
        "-",
        "--index-url",
        served.simple("cpu"),
        "--python-version",
        "3.11",
        env=env,
        input_text="wm-lib\n",
    )
    older = uv(
        "pip",
        "compile",
        "-",
        "--index-url",
        served.simple("cpu"),
        "--python-version",
        "3.11",
        "--exclude-newer",
        between,
        env=env,
        input_text="wm-lib\n",
    )
    assert "wm-lib==2.0" in newest.stdout, newest.stderr
    assert "wm-lib==1.0" in older.stdout, older.stderr


def test_eight_concurrent_publishers(index_root: Path, tmp_path: Path) -> None:
    batches = [
        [
            make_wheel(tmp_path / f"p{p}", f"wm-p{p}-w{w}" if w % 2 else f"wm-shared-{w}", f"{p}.0", tag=ANY)
            for w in range(10)
        ]
        for p in range(8)
    ]
    env = {**os.environ, "WHEELMILL_INDEX_ROOT": str(index_root)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "wheelmill", "publish", "--channel", "cu130", *map(str, batch)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for batch in batches
    ]
    outputs = [proc.communicate(timeout=600) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), outputs
    channel = tree_channel(index_root, "cu130")
    listed = {f.filename for name in channel.project_names() for f in (channel.project(name) or _missing()).files}
    assert listed == {w.name for batch in batches for w in batch}
    assert len(listed) == 80
    assert problems(channel) == []
    assert strays(index_root) == []
    # Every writer finished: none left a temporary file, not even in the storage's own work.
    assert list(index_root.rglob(f"{TMP_PREFIX}*")) == []
    assert wheelmill(index_root, "index", "verify").returncode == 0


def _missing() -> NoReturn:
    raise AssertionError("a listed project has no page")


def strays(root: Path) -> list[str]:
    """What a tree holds beside its objects and the storage's own work (``.storage/``): a
    writer's temporary file in a channel, or a lock, would be one; none may be there."""
    found = (p.relative_to(root) for p in root.rglob("*") if p.is_file())
    return sorted(str(p) for p in found if p.parts[0] != ".storage" and any(x.startswith(".") for x in p.parts))


def unreadable(channel: ObjectChannel) -> list[str]:
    """What a reader of the pages would trip on: a listed project without its page, or a
    listed file whose bytes or sidecar are not stored as listed. (An entry that no page lists
    yet, which a publisher killed before its pages leaves, is none: the next render lists it.)"""
    found = []
    for name in channel.project_names():
        project = channel.project(name)
        if project is None:
            found.append(f"{name}: listed without a page")
            continue
        found += [p for entry in project.files for p in verify_file(channel, entry, hashes=True)]
    return found


def test_a_publisher_killed_at_any_point_leaves_a_valid_index(index_root: Path, tmp_path: Path) -> None:
    big = make_wheel(
        tmp_path / "dist",
        "wm-big",
        "1.0",
        tag=ANY,
        files={"wm_big/blob.bin": os.urandom(64 * 1024 * 1024)},
        stored=True,
    )
    small = make_wheel(tmp_path / "dist", "wm-small", "1.0", tag=ANY)
    channel = tree_channel(index_root, "cpu")
    wheelmill(index_root, "publish", "--channel", "cpu", str(small))
    env = {**os.environ, "WHEELMILL_INDEX_ROOT": str(index_root)}
    for delay in (0.05, 0.3, 0.6, 0.9, 1.2):
        proc = subprocess.Popen(
            [sys.executable, "-m", "wheelmill", "publish", "--channel", "cpu", str(big)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        # No page lists a file that is not there; what the kill left unlisted (an entry made
        # before its pages) a render lists, and then the channel verifies whole.
        assert unreadable(channel) == [], f"after a kill at {delay}s"
        assert strays(index_root) == [], f"after a kill at {delay}s: its temporary files stay in .storage/"
        rendered = wheelmill(index_root, "index", "render", "--channel", "cpu")
        assert "cpu: rendered, ok" in rendered.stdout, rendered.stdout
        assert problems(channel) == [], f"after a kill at {delay}s and a render"
    wheelmill(index_root, "publish", "--channel", "cpu", str(big))
    assert problems(channel) == []
    assert strays(index_root) == []
    assert {f.filename for f in (channel.project("wm-big") or _missing()).files} == {big.name}


def test_same_name_other_bytes_is_refused_and_the_same_bytes_are_a_no_op(index_root: Path, tmp_path: Path) -> None:
    first = make_wheel(tmp_path / "a", "wm-lib", "1.0", tag=ANY, files={"wm_lib/__init__.py": b"A = 1\n"})
    second = make_wheel(tmp_path / "b", "wm-lib", "1.0", tag=ANY, files={"wm_lib/__init__.py": b"A = 2\n"})
    assert "added:" in wheelmill(index_root, "publish", "--channel", "cpu", str(first)).stdout
    again = wheelmill(index_root, "publish", "--channel", "cpu", str(first))
    assert "unchanged:" in again.stdout and again.stderr == ""
    refused = wheelmill(index_root, "publish", "--channel", "cpu", str(second), check=False)
    assert refused.returncode == 14
    (line,) = refused.stderr.strip().splitlines()
    assert "already published with other bytes" in line and "fix:" in line
    assert stored_file(tree_channel(index_root, "cpu"), first.name).read_bytes() == first.read_bytes()


def test_a_yanked_version_is_skipped_by_ranges_and_installed_when_pinned(
    served: Served, index_root: Path, tmp_path: Path
) -> None:
    for version in ("1.0", "1.1"):
        wheelmill(
            index_root, "publish", "--channel", "cpu", str(make_wheel(tmp_path / version, "wm-lib", version, tag=ANY))
        )
    wheelmill(index_root, "yank", "--channel", "cpu", "wm-lib", "1.1", "--reason", "wrong kernels")
    python = venv(tmp_path / "env")
    ranged = pip(
        python,
        "install",
        "--dry-run",
        "--ignore-installed",
        "--report",
        "-",
        "--quiet",
        "--index-url",
        served.simple("cpu"),
        "wm-lib>=1.0",
    )
    assert ranged.returncode == 0, ranged.stderr
    assert json.loads(ranged.stdout)["install"][0]["metadata"]["version"] == "1.0"
    pinned = pip(python, "install", "--index-url", served.simple("cpu"), "wm-lib==1.1")
    assert pinned.returncode == 0, pinned.stderr
    assert "wrong kernels" in pinned.stderr  # pip warns with the reason
    wheelmill(index_root, "unyank", "--channel", "cpu", "wm-lib", "1.1")
    again = pip(
        python,
        "install",
        "--dry-run",
        "--ignore-installed",
        "--report",
        "-",
        "--quiet",
        "--index-url",
        served.simple("cpu"),
        "wm-lib>=1.0",
    )
    assert json.loads(again.stdout)["install"][0]["metadata"]["version"] == "1.1"


def test_consumer_settings_never_take_a_higher_version_from_a_second_index(
    served: Served, index_root: Path, tmp_path: Path
) -> None:
    wheelmill(index_root, "publish", "--channel", "cu118", str(make_wheel(tmp_path / "ours", "wm-lib", "1.0", tag=ANY)))
    # A second index (no variant's channel, so through the channel code itself) with a higher version.
    publish(tree_channel(index_root, "public"), make_wheel(tmp_path / "theirs", "wm-lib", "9.0", tag=ANY))
    python = venv(tmp_path / "env")
    # A machine-wide pip configuration that merges a second index (the venv's site config).
    (tmp_path / "env" / "pip.conf").write_text(f"[global]\nextra-index-url = {served.simple('public')}\n")
    pip_conf = tmp_path / "consumer-pip.conf"
    pip_conf.write_text(
        wheelmill(index_root, "index", "config", "--channel", "cu118", "--url", served.url, "--form", "pip").stdout
    )
    env = {k: v for k, v in isolated_env().items() if k != "PIP_CONFIG_FILE"}

    def resolved(config: Path) -> str:
        result = pip(
            python,
            "install",
            "--dry-run",
            "--ignore-installed",
            "--report",
            "-",
            "--quiet",
            "wm-lib",
            env={**env, "PIP_CONFIG_FILE": str(config)},
        )
        assert result.returncode == 0, result.stderr
        return str(json.loads(result.stdout)["install"][0]["metadata"]["version"])

    assert resolved(pip_conf) == "1.0"
    # The control: an index-url alone still merges the machine's extra index and takes 9.0.
    naive = tmp_path / "naive-pip.conf"
    naive.write_text(f"[global]\nindex-url = {served.simple('cu118')}\n")
    assert resolved(naive) == "9.0"
    uv_toml = tmp_path / "uv.toml"
    uv_toml.write_text(
        wheelmill(index_root, "index", "config", "--channel", "cu118", "--url", served.url, "--form", "uv").stdout
    )
    uv_env = {**isolated_env(), "UV_CACHE_DIR": str(tmp_path / "uv-cache"), "UV_CONFIG_FILE": str(uv_toml)}
    del uv_env["UV_NO_CONFIG"]
    compiled = uv("pip", "compile", "-", "--python-version", "3.11", env=uv_env, input_text="wm-lib\n")
    assert "wm-lib==1.0" in compiled.stdout, compiled.stderr


def test_a_machine_on_either_torch_gets_the_build_for_its_torch_from_its_channel_alone(
    served: Served, index_root: Path, tmp_path: Path
) -> None:
    """cuda130 and its variant of torch 2.12: the same extension built against each torch,
    in the variants' own channels with their own labels. A consumer on either torch names
    its channel as its only index and gets the build for that torch (pip and uv, a fresh
    machine or one that has its torch already). The control: one channel holding both
    builds replaces the machine's torch with the other one."""
    matrix = load_matrix(ROOT / "recipes" / "matrix.toml")
    variants = [matrix.variants["cuda130"], matrix.variants["cuda130-torch2.12"]]
    both = tree_channel(index_root, "both")  # the control: no variant's channel
    for variant in variants:
        torch = make_wheel(tmp_path / variant.name, "torch", variant.torch, tag=ANY, files=_torch_files(variant.torch))
        ops = make_wheel(
            tmp_path / variant.name,
            "wm-ops",
            f"0.1.0+{variant.wheel_label}",
            tag=ANY,
            requires=[f"torch=={variant.torch}"],
            files={"wm_ops/__init__.py": f"BUILT_FOR = '{variant.torch}'\n".encode()},
        )
        wheelmill(index_root, "publish", "--channel", variant.channel, str(ops))
        publish(tree_channel(index_root, variant.channel), torch, mirrored_from=f"https://mirror.invalid/{torch.name}")
        publish(both, ops)
        publish(both, torch, mirrored_from=f"https://mirror.invalid/{torch.name}")
    for variant in variants:
        index = served.simple(variant.channel)
        fresh = _would_install(venv(tmp_path / f"fresh-{variant.name}"), index, "uv")
        assert fresh == {"torch": variant.torch, "wm-ops": f"0.1.0+{variant.wheel_label}"}, fresh
        python = venv(tmp_path / f"has-torch-{variant.name}")
        assert pip(python, "install", "--index-url", index, f"torch=={variant.torch}").returncode == 0
        for installer in ("pip", "uv"):
            plan = _would_install(python, index, installer)
            assert plan == {"wm-ops": f"0.1.0+{variant.wheel_label}"}, (installer, plan)
    # The control: in one channel with both, the highest version wins (+cu130.torch2.12 sorts
    # after +cu130), and a machine on torch 2.14.1 would be moved to 2.12.0.
    newer = venv(tmp_path / "newer-in-both")
    assert pip(newer, "install", "--index-url", served.simple("both"), f"torch=={variants[0].torch}").returncode == 0
    plan = _would_install(newer, served.simple("both"), "pip")
    assert plan == {"torch": variants[1].torch, "wm-ops": f"0.1.0+{variants[1].wheel_label}"}, plan


def _torch_files(version: str) -> dict[str, bytes]:
    return {"torch/__init__.py": f"__version__ = '{version}'\n".encode()}


def _would_install(python: Path, index: str, installer: str) -> dict[str, str]:
    """What ``installer`` would install (or change) for ``wm-ops`` in the env of ``python``."""
    if installer == "pip":
        done = pip(python, "install", "--dry-run", "--report", "-", "--quiet", "--index-url", index, "wm-ops")
        assert done.returncode == 0, done.stderr
        return {i["metadata"]["name"]: i["metadata"]["version"] for i in json.loads(done.stdout)["install"]}
    done = uv("pip", "install", "--dry-run", "--no-config", "--python", str(python), "--index-url", index, "wm-ops")
    assert done.returncode == 0, done.stderr
    return dict(re.findall(r"^ \+ (\S+)==(\S+)$", done.stderr, flags=re.MULTILINE))


def test_the_server_stays_inside_its_root_and_speaks_http_properly(
    served: Served, index_root: Path, tmp_path: Path
) -> None:
    lib, _app = small_wheels(tmp_path / "dist")
    wheelmill(index_root, "publish", "--channel", "cu118", str(lib))
    (index_root.parent / "secret.txt").write_text("no")

    def request(method: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", served.server.server_address[1], timeout=10)
        connection.putrequest(method, path, skip_accept_encoding=True)
        for key, value in (headers or {}).items():
            connection.putheader(key, value)
        connection.endheaders()
        response = connection.getresponse()
        body = response.read()
        connection.close()
        return response.status, dict(response.getheaders()), body

    sha256 = (tree_channel(index_root, "cu118").project("wm-lib") or _missing()).files[0].sha256
    for path in (
        "/../secret.txt",
        "/cu118/files/../../secret.txt",
        "/cu118/files/..%2F..%2Fsecret.txt",
        "/cu118/files/%2e%2e/%2e%2e/secret.txt",
        f"/blobs/sha256/{sha256}/../../../../secret.txt",
        f"/blobs/sha256/{sha256}/..%2F..%2F..%2F..%2Fsecret.txt",
        "/blobs/sha256/%2e%2e/%2e%2e/%2e%2e/secret.txt",
        f"/cu118/entries/wm-lib/{lib.name}/built.json",
        "/cu118/.lock",
        "/cu118/.tmp/",
        "/.storage/tmp/",
        "/.storage/locks/",
        "/cu118/simple/../../secret.txt",
        "//etc/passwd",
    ):
        status, _headers, body = request("GET", path)
        assert status == 404, (path, status)
        assert body != b"no"
    assert request("GET", "/cu118/simple/nothing-here/")[0] == 404
    assert request("GET", "/cu999/simple/")[0] == 404
    assert request("POST", "/cu118/simple/")[0] == 405
    status, headers, _ = request("GET", "/cu118/simple/WM_Lib/")
    assert status == 301 and headers["Location"] == "/cu118/simple/wm-lib/"
    status, headers, body = request("GET", "/cu118/simple/wm-lib/?format=application/vnd.pypi.simple.v1+json")
    assert status == 200 and headers["Content-Type"] == JSON and json.loads(body)["name"] == "wm-lib"
    status, headers, _ = request("GET", "/cu118/simple/wm-lib/", {"Accept": "application/vnd.pypi.simple.v1+html"})
    assert (
        status == 200
        and headers["Content-Type"] == "application/vnd.pypi.simple.v1+html"
        and headers["Vary"] == "Accept"
    )
    assert request("GET", "/cu118/simple/wm-lib/", {"Accept": "image/png"})[0] == 406
    # The file where the page links it: its content-addressed blob, by a relative URL.
    url = urllib.parse.urljoin("/cu118/simple/wm-lib/", json.loads(body)["files"][0]["url"])
    assert url.startswith(f"/blobs/sha256/{sha256}/"), url
    size = lib.stat().st_size
    status, headers, body = request("GET", url, {"Range": "bytes=0-9"})
    assert status == 206 and body == lib.read_bytes()[:10] and headers["Content-Range"] == f"bytes 0-9/{size}"
    status, _headers, body = request("GET", url, {"Range": "bytes=-4"})
    assert status == 206 and body == lib.read_bytes()[-4:]
    assert request("GET", url, {"Range": f"bytes={size}-"})[0] == 416
    status, headers, body = request("HEAD", url)
    assert status == 200 and int(headers["Content-Length"]) == size and body == b""


def nginx_config(template: Path, root: Path, port: int, prefix: Path) -> Path:
    rendered = {"@ROOT@": str(root), "@PORT@": f"127.0.0.1:{port}", "@DEPLOY@": str(DEPLOY)}
    server = re.sub(r"@[A-Z_]+@", lambda m: rendered[m.group(0)], template.read_text())
    (prefix / "logs").mkdir(parents=True, exist_ok=True)
    config = prefix / "nginx.conf"
    config.write_text(
        main_context() + "user root;\nworker_processes 1;\nerror_log stderr;\npid " + str(prefix / "nginx.pid") + ";\n"
        "events { worker_connections 64; }\n"
        "http {\n access_log " + str(prefix / "logs" / "access.log") + ";\n"
        " client_body_temp_path " + str(prefix / "tmp") + ";\n proxy_temp_path " + str(prefix / "tmp") + ";\n"
        " fastcgi_temp_path "
        + str(prefix / "tmp")
        + ";\n uwsgi_temp_path "
        + str(prefix / "tmp")
        + ";\n scgi_temp_path "
        + str(prefix / "tmp")
        + ";\n"
        + server
        + "\n}\n"
    )
    return config


@contextmanager
def serving_nginx(root: Path, work: Path) -> Iterator[str]:
    """nginx with deploy/nginx-index.conf over ``root`` on a loopback port until the block
    ends: its base URL, once it answers. Skips where nginx is not installed."""
    nginx = shutil.which("nginx", path="/usr/sbin:/usr/bin:/sbin")
    if nginx is None:
        pytest.skip("nginx is not installed (scripts/setup --system installs it)")
    port = free_port()
    config = nginx_config(ROOT / "deploy" / "nginx-index.conf", root, port, work)
    (work / "tmp").mkdir()
    tested = subprocess.run([nginx, "-t", "-c", str(config), "-p", str(work)], capture_output=True, check=False)
    assert tested.returncode == 0, tested.stderr
    errors = (work / "error.log").open("w")
    proc = subprocess.Popen(
        [nginx, "-c", str(config), "-p", str(work), "-g", "daemon off;"], stdout=subprocess.DEVNULL, stderr=errors
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 10
        while (
            time.monotonic() < deadline
            and subprocess.run(["curl", "-s", "-o", "/dev/null", f"{base}/"], check=False).returncode != 0
        ):
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        errors.close()


def installs_with_pip_and_uv(index: str, tmp_path: Path, requirement: str = "wm-app==1.0+cu118") -> None:
    """pip and uv, each in a venv of its own, install ``requirement`` from ``index`` alone,
    and it runs."""
    for installer in ("pip", "uv"):
        python = venv(tmp_path / f"{installer}-env")
        if installer == "pip":
            done = pip(python, "install", "--index-url", index, requirement)
        else:
            done = uv("pip", "install", "--python", str(python), "--index-url", index, requirement)
        assert done.returncode == 0, done.stdout + done.stderr
        code = "import wm_app; print(wm_app.ANSWER)"
        ran = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=False)
        assert ran.stdout == "42\n", ran.stderr


def test_nginx_serves_the_same_tree(index_root: Path, tmp_path: Path) -> None:
    lib, app = small_wheels(tmp_path / "dist")
    wheelmill(index_root, "publish", "--channel", "cu118", str(lib), str(app))
    blob = "/" + stored_file(tree_channel(index_root, "cu118"), lib.name).relative_to(index_root).as_posix()
    with serving_nginx(index_root, tmp_path / "nginx") as base:
        installs_with_pip_and_uv(f"{base}/cu118/simple/", tmp_path)
        headers = subprocess.run(
            ["curl", "-s", "-D", "-", "-o", "/dev/null", "-H", f"Accept: {JSON}", f"{base}/cu118/simple/wm-lib/"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert re.search(rf"Content-Type: {re.escape(JSON)}", headers), headers
        assert "Vary: Accept" in headers
        page = subprocess.run(
            ["curl", "-s", f"{base}/cu118/simple/wm-lib/?format={JSON}"], capture_output=True, text=True, check=True
        ).stdout
        assert json.loads(page)["name"] == "wm-lib"
        for path in (
            "/cu118/simple/unknown/",
            "/cu118/.lock",
            "/.storage/tmp/",
            "/cu118/files/nothing.whl",
            "/blobs/sha256/" + "0" * 64 + "/nothing.whl",
            "/elsewhere",
        ):
            assert http_status(base + path) == "404", path
        ranged = subprocess.run(
            ["curl", "-s", "-r", "0-9", "-o", "-", f"{base}{blob}"], capture_output=True, check=True
        ).stdout
        assert ranged == lib.read_bytes()[:10]


def test_index_serve_and_nginx_negotiate_by_the_one_table(served: Served, index_root: Path, tmp_path: Path) -> None:
    """Every row of tests/data/accept.toml, over HTTP, against `wheelmill index serve` and
    nginx with deploy/nginx-index.conf: the same format chosen (q-values, ``latest``, the
    query first), the same Content-Type, and 406 where nothing served is acceptable."""
    lib, _app = small_wheels(tmp_path / "dist")
    wheelmill(index_root, "publish", "--channel", "cu118", str(lib))
    with serving_nginx(index_root, tmp_path / "nginx") as base:
        for url in (served.url, base):
            for case in accept_cases():
                page = f"{url}/cu118/simple/wm-lib/{case.query}"
                answer = get(page, case.headers)
                assert answer.headers["Vary"] == "Accept", (page, case)
                if case.chosen is None:
                    assert answer.status == 406, (page, case, answer.status)
                    continue
                answered = (answer.status, answer.headers["Content-Type"])
                assert answered == (200, CONTENT_TYPES[case.chosen]), (page, case)
                if case.chosen.endswith("+json"):
                    assert json.loads(answer.body)["name"] == "wm-lib", (page, case)
                else:
                    assert b"<a href=" in answer.body, (page, case)


def test_the_docs_name_every_placeholder_of_the_tree_config() -> None:
    docs = (ROOT / "docs" / "wheel-index.md").read_text()
    sentence = docs[docs.index("The config's placeholders are") :].split(".", 1)[0]
    config = (DEPLOY / "nginx-index.conf").read_text()
    assert (
        set(re.findall(r"@[A-Z_]+@", sentence))
        == set(re.findall(r"@[A-Z_]+@", config))
        == {
            "@ROOT@",
            "@PORT@",
            "@DEPLOY@",
        }
    )


def http_status(url: str) -> str:
    curl = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", url]
    return subprocess.run(curl, capture_output=True, text=True, check=False).stdout


def test_a_channel_written_as_objects_on_a_tree_installs_through_index_serve_and_nginx(
    served: Served, index_root: Path, tmp_path: Path
) -> None:
    """The one channel code (``wheelmill.index.objects``) on the tree storage, a release
    channel and a track's (whose pages link one level further up): the pages link to the
    content-addressed blobs both channels share, and both servers serve them, sidecars and
    ranges too, and nothing of the entries or the sweep's objects."""
    lib, app = small_wheels(tmp_path / "dist")
    for channel in ("cu118", "test/cu118"):
        for wheel in (lib, app):
            objects.publish(tree_channel(index_root, channel), wheel)
    entry = tree_channel(index_root, "cu118").project("wm-lib")
    assert entry is not None
    blob = f"/blobs/sha256/{entry.files[0].sha256}/{lib.name}"
    installs_with_pip_and_uv(served.simple("cu118"), tmp_path / "served")
    installs_with_pip_and_uv(served.simple("test/cu118"), tmp_path / "served-test")
    assert {path for path, status, _ in served.requests() if status == 200} >= {blob, f"{blob}.metadata"}
    with serving_nginx(index_root, tmp_path / "nginx") as base:
        installs_with_pip_and_uv(f"{base}/cu118/simple/", tmp_path / "nginx-installs")
        for url in (served.url, base):
            ranged = subprocess.run(["curl", "-s", "-r", "0-9", url + blob], capture_output=True, check=True).stdout
            assert ranged == lib.read_bytes()[:10]
            hidden = (f"/cu118/entries/wm-lib/{lib.name}/built.json", "/blobs/sha256/nothing/x.whl", "/unlisted/")
            assert [http_status(url + path) for path in hidden] == ["404"] * 3, url


def test_a_channel_holding_both_platforms_gives_each_machine_its_own_files(
    served: Served, index_root: Path, tmp_path: Path
) -> None:
    """cpu and its aarch64 twin publish to one channel, each with the torch of its platform
    mirrored beside its wheel (torch 2.13.0+cpu on x86_64, PyPI's 2.10.0 on aarch64). pip,
    told the platform and given the channel's URL alone, resolves each machine's own files;
    uv, told the other platform, too."""
    matrix = load_matrix(ROOT / "recipes" / "matrix.toml")
    x86, arm = matrix.variants["cpu"], matrix.variants["cpu-aarch64"]
    assert x86.channel == arm.channel
    channel = tree_channel(index_root, x86.channel)
    expected = {}
    for variant, platform in ((x86, "manylinux_2_28_x86_64"), (arm, "manylinux_2_34_aarch64")):
        place = tmp_path / variant.name
        torch_version = f"{variant.torch}+cpu" if not variant.torch_on_pypi else variant.torch
        torch = make_wheel(
            place, "torch", torch_version, tag=f"cp311-cp311-{platform}", files=_torch_files(torch_version)
        )
        ops = make_wheel(
            place,
            "wm-ops",
            f"0.1.0+{variant.wheel_label}",
            tag=f"cp311-cp311-{platform}",
            requires=[f"torch=={variant.torch}"],
            files={"wm_ops/_C.so": variant.platform.encode()},
        )
        wheelmill(index_root, "publish", "--channel", variant.channel, str(ops))
        publish(channel, torch, mirrored_from=f"https://mirror.invalid/{torch.name}")
        expected[variant.platform] = {"torch": torch.name, "wm-ops": ops.name}
    index = served.simple(x86.channel)
    for machine, platform in (("x86_64", "manylinux_2_28_x86_64"), ("aarch64", "manylinux_2_34_aarch64")):
        report = tmp_path / f"{machine}.json"
        done = pip(
            Path(sys.executable),
            *("install", "--dry-run", "--quiet", "--ignore-installed", "--report", str(report)),
            *("--only-binary=:all:", "--platform", platform, "--python-version", "3.11"),
            *("--target", str(tmp_path / f"target-{machine}"), "--index-url", index, "wm-ops"),
        )
        assert done.returncode == 0, done.stderr
        installs = json.loads(report.read_text())["install"]
        chosen = {i["metadata"]["name"]: unquote(i["download_info"]["url"].rsplit("/", 1)[-1]) for i in installs}
        assert chosen == expected[machine], (machine, chosen)
    compiled = uv(
        "pip", "compile", "--no-config", "--quiet", "--no-header", "--python-version", "3.11",
        "--python-platform", "aarch64-manylinux_2_34", "--index-url", index, "-",
        input_text="wm-ops\n",
    )  # fmt: skip
    assert compiled.returncode == 0, compiled.stderr
    assert f"torch=={arm.torch}" in compiled.stdout and f"wm-ops==0.1.0+{arm.wheel_label}" in compiled.stdout


LEGACY = ROOT / "tests" / "data" / "legacy-index.tar.gz"


def test_an_index_an_earlier_wheelmill_wrote_installs_as_it_is_and_after_its_migration(tmp_path: Path) -> None:
    """The tree the last wheelmill before the one channel wrote (tests/unit/test_legacy.py
    says what it holds): served as it is, pip installs the cell from it by the old files'
    URLs; migrated, `index verify --hashes` passes, and pip and uv install the same files
    through `index serve` by the blobs' URLs (a migration killed and run again:
    test_fault_reach.py)."""
    with tarfile.open(LEGACY) as tar:
        tar.extractall(tmp_path, filter="data")
    root = tmp_path / "index"

    def installs(tag: str, installer: str) -> list[str]:
        server = Served(root, tmp_path / f"{tag}-{installer}.log")
        try:
            if installer == "pip":
                python = venv(tmp_path / f"{tag}-pip")
                done = pip(python, "install", "--index-url", server.simple("cpu"), "wm-demo")
            else:
                python = venv(tmp_path / f"{tag}-uv")
                done = uv("pip", "install", "--no-config", "--python", str(python), "--index-url", server.simple("cpu"),
                          "wm-demo")  # fmt: skip
            assert done.returncode == 0, done.stdout + done.stderr
            ran = subprocess.run(
                [str(python), "-c", "import wm_demo, wm_dep; print(wm_demo.VALUE, wm_dep.VALUE)"],
                capture_output=True, text=True, check=False, env=isolated_env(),
            )  # fmt: skip
            assert ran.stdout.strip() == "demo 1.0 dep 2.0", ran.stdout + ran.stderr
            return [path for path, status, _size in server.requests() if path.endswith(".whl") and status == 200]
        finally:
            server.close()

    before = installs("before", "pip")
    assert sorted(before) == ["/cpu/files/wm_demo-1.0-py3-none-any.whl", "/cpu/files/wm_dep-2.0-py3-none-any.whl"]
    migrated = wheelmill(root, "index", "migrate")
    assert "cpu: 3 files of 2 projects are objects now" in migrated.stdout, migrated.stdout
    checked = wheelmill(root, "index", "verify", "--hashes")
    assert "cpu: ok" in checked.stdout and "test/cpu: ok" in checked.stdout, checked.stdout
    for installer in ("pip", "uv"):
        after = installs("after", installer)
        assert len(after) == 2 and all(path.startswith("/blobs/sha256/") for path in after), after
