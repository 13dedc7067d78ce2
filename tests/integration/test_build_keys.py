"""Nothing rebuilt that is already published: a cell built twice into one output root and
channel builds nothing the second time and publishes nothing new; a changed source file
rebuilds its recipe and what depends on it, and nothing else.

The project is copied, with one more recipe: a tiny C extension that depends on
example-cpp-ops (built first, installed into its build env, pinned exactly)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pytest

from tests.channels import stored_file, tree_channel
from tests.integration.test_cells import ROOT
from wheelmill.index.channels import built_by_key
from wheelmill.index.objects import ObjectChannel
from wheelmill.index.roots import problems
from wheelmill.index.serve import make_server

pytestmark = pytest.mark.integration
CELL = "cpu-py311"

DEPENDENT_RECIPE = """
name = "example-dependent"
description = "a tiny C extension that needs example-cpp-ops"
cells = ["cpu-*"]
depends-on = ["example-cpp-ops"]

[source]
path = "../extensions/dependent"

[requirements]
run = ["example-cpp-ops"]

[checks]
imports = ["example_dependent"]
"""

DEPENDENT_FILES = {
    "setup.py": (
        "from setuptools import Extension, setup\n"
        'setup(name="example-dependent", version="0.1.0", packages=["example_dependent"],'
        ' ext_modules=[Extension("example_dependent._native", ["native.c"])])\n'
    ),
    "example_dependent/__init__.py": (
        "import example_cpp_ops  # noqa: F401\n\nfrom example_dependent._native import answer  # noqa: F401\n"
    ),
    "native.c": (
        "#include <Python.h>\n"
        "static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(42); }\n"
        'static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};\n'
        'static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, methods};\n'
        "PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }\n"
    ),
}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    where = tmp_path / "project"
    for part in ("recipes", "extensions", "locks", "containers"):
        shutil.copytree(ROOT / part, where / part, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    (where / "recipes" / "example-dependent.toml").write_text(DEPENDENT_RECIPE)
    for name, text in DEPENDENT_FILES.items():
        (where / "extensions" / "dependent" / name).parent.mkdir(parents=True, exist_ok=True)
        (where / "extensions" / "dependent" / name).write_text(text)
    return where


def build(project: Path, output: Path, *args: str, served: str | None = None) -> tuple[dict[str, Any], str]:
    env = {**os.environ, "WHEELMILL_OUTPUT": str(output), "WHEELMILL_ENGINE": "none"}
    env |= {"WHEELMILL_SERVED_INDEX": served} if served else {}
    command = [sys.executable, "-m", "wheelmill", "build", "--cell", CELL, "--recipe", "example-dependent", *args]
    done = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=1800, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return json.loads((output / CELL / "report.json").read_text()), done.stdout


@contextmanager
def serving(root: Path, access_log: IO[str] | None = None) -> Iterator[str]:
    """The index tree at ``root`` served over loopback, as a team serves its index."""
    server = make_server(root, "127.0.0.1", 0, access_log)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# What runs of a recipe reused from the served index: its install test, and what that needs.
REUSED_RUN = ("fetch", "post-repair-checks", "install-test")


def statuses(report: dict[str, Any], kind: str) -> dict[str | None, str]:
    return {step["recipe"]: step["status"] for step in report["steps"] if step["step"] == kind}


def files(channel: ObjectChannel) -> dict[str, int]:
    """Each object a publish into the channel writes (its entries' objects, and each listed
    file's bytes and sidecar), with the time it was last written."""
    root = Path(channel.storage.location)
    written = [root / key for key in channel.storage.keys_under(channel.entries())]
    for file in (f for project in channel.projects() for f in project.files):
        blob = stored_file(channel, file.filename)
        written += [blob, blob.with_name(f"{blob.name}.metadata")]
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in written}


def test_a_published_build_is_not_built_again_and_a_changed_source_rebuilds_its_dependents(
    project: Path, tmp_path: Path
) -> None:
    output = tmp_path / "wheels"
    channel = tree_channel(output / "index", "cpu")
    first, _ = build(project, output)
    assert statuses(first, "build") == {"example-cpp-ops": "ok", "example-dependent": "ok"}
    keys = first["facts"]["build_keys"]
    assert {key: entry.filename.split("-")[0] for key, (_p, entry) in built_by_key(channel).items()} == {
        keys["example-cpp-ops"]: "example_cpp_ops",
        keys["example-dependent"]: "example_dependent",
    }
    published = files(channel)

    # Nothing changed: nothing built, nothing published; each recipe's wheel is the channel's.
    again, out = build(project, output)
    assert again["status"] == "ok" and again["facts"]["build_keys"] == keys
    assert {r["name"]: r["status"] for r in again["recipes"]} == {
        "example-cpp-ops": "published",
        "example-dependent": "published",
    }
    assert {s["step"] for s in again["steps"] if s["status"] == "ok"} == {"pre-checks", "build-keys"}
    assert all(Path(r["wheel"]["path"]).parent == output / CELL / "dist" for r in again["recipes"])
    assert again["facts"]["torch"]["version"] == first["facts"]["torch"]["version"]
    assert "not built again" in out and "published: example_cpp_ops-0.1.0+cpu" in out
    assert files(channel) == published, "nothing published again"

    # Runner B, another output root with an empty index of its own, its build publishing
    # nothing (a CI job): every wheel is fetched from A's index, served over HTTP, and
    # install-tested here before it is delivered, as one built here is; nothing compiled.
    with serving(output / "index") as url:
        other, out = build(project, tmp_path / "runner-b", "--no-publish", served=url)
    assert {r["name"]: r["status"] for r in other["recipes"]} == {
        "example-cpp-ops": "reused",
        "example-dependent": "reused",
    }
    ran = {(s["step"], s["recipe"]) for s in other["steps"] if s["status"] == "ok"}
    env = {("pre-checks", None), ("build-keys", None), ("prepare-env", None), ("env-checks", None)}
    tested = {(step, r) for r in ("example-cpp-ops", "example-dependent") for step in REUSED_RUN}
    assert ran == env | tested, ran
    assert statuses(other, "build") == {"example-cpp-ops": "reused", "example-dependent": "reused"}
    assert {r["wheel"]["sha256"] for r in other["recipes"]} == {r["wheel"]["sha256"] for r in again["recipes"]}
    assert all(Path(r["wheel"]["path"]).is_file() for r in other["recipes"])
    assert "reused: example_cpp_ops-0.1.0+cpu" in out and f"from {url}/cpu/simple/" in out
    assert not (tmp_path / "runner-b" / "index").exists(), "B's own index is not written"

    # The dependent's source changed (and its version: published files are immutable): it
    # alone is built, against the channel's example-cpp-ops.
    native, setup = project / "extensions" / "dependent" / "native.c", project / "extensions" / "dependent" / "setup.py"
    native.write_text(native.read_text().replace("42", "43"))
    setup.write_text(setup.read_text().replace('version="0.1.0"', 'version="0.1.1"'))
    third, _ = build(project, output)
    assert statuses(third, "build") == {"example-cpp-ops": "published", "example-dependent": "ok"}
    assert third["facts"]["build_keys"]["example-cpp-ops"] == keys["example-cpp-ops"]
    dependent = channel.project("example-dependent")
    assert dependent is not None
    rebuilt = [f.filename for f in dependent.files if f.filename.startswith("example_dependent-0.1.1+cpu-")]
    assert rebuilt and all(stored_file(channel, name).is_file() for name in rebuilt)

    # A file of example-cpp-ops' source changed (one its wheel does not carry): it and what
    # depends on it are built again; the same bytes, so the listings learn the new keys.
    tests = next((project / "extensions" / "cpp-ops" / "tests").glob("test_*.py"))
    tests.write_text(tests.read_text() + "\n# changed\n")
    fourth, _ = build(project, output)
    assert statuses(fourth, "build") == {"example-cpp-ops": "ok", "example-dependent": "ok"}
    new_keys = fourth["facts"]["build_keys"]
    assert (
        new_keys["example-cpp-ops"] != keys["example-cpp-ops"]
        and new_keys["example-dependent"] != third["facts"]["build_keys"]["example-dependent"]
    )
    listed = built_by_key(channel)
    assert listed[new_keys["example-cpp-ops"]][1] == listed[keys["example-cpp-ops"]][1], "one wheel, two keys"
    assert problems(channel) == []
