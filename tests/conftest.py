"""Shared fixtures: the repository's own data, copies of it to break, and the CLI run
in-process (so a test sees the exit code and the exact stderr a user would)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from wheelmill.cli import main

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class CliResult:
    code: int
    out: str
    err: str


CliRunner = Callable[..., CliResult]


@pytest.fixture(scope="session", autouse=True)
def uv_cache() -> Iterator[Path]:
    """One uv cache for the whole run, removed at its end. uv keys a wheel by the URL it
    came from, and the tests serve channels on new ports every time: in the user's cache,
    each run would leave gigabytes of unpacked torch behind for good."""
    if "UV_CACHE_DIR" in os.environ:
        yield Path(os.environ["UV_CACHE_DIR"])
        return
    path = Path(tempfile.mkdtemp(prefix="uv-cache-of-wheelmill-tests-"))
    os.environ["UV_CACHE_DIR"] = str(path)
    try:
        yield path
    finally:
        del os.environ["UV_CACHE_DIR"]
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def repo_root() -> Path:
    return ROOT


@pytest.fixture
def recipes_copy(tmp_path: Path) -> Path:
    """A writable copy of recipes/ (and the extension sources its paths point at)."""
    shutil.copytree(ROOT / "recipes", tmp_path / "recipes")
    shutil.copytree(ROOT / "extensions", tmp_path / "extensions", ignore=shutil.ignore_patterns("build", "*.egg-info"))
    return tmp_path / "recipes"


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> CliRunner:
    monkeypatch.setenv("WHEELMILL_OUTPUT", str(tmp_path / "wheels"))

    def run(*args: str) -> CliResult:
        capsys.readouterr()
        code = main(list(args))
        captured = capsys.readouterr()
        return CliResult(code=code, out=captured.out, err=captured.err)

    return run
