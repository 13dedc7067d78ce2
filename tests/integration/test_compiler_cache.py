"""The compiler cache for real: a cell built twice into one output root compiles nothing the
second time; a cache that cannot be reached is one warning and a build without it, never a
failed build. In the container, and for nvcc's host and device steps: test_containers.py's
second run, and the CUDA cell's test in test_cells.py, which builds example-cuda-ops again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent.parent
CELL, RECIPE = "cpu-py311", "example-cpp-ops"


def build(output: Path, *, engine: str = "none", cell: str = CELL, recipe: str = RECIPE, **extra: str) -> dict[str, Any]:
    """One recipe of a cell, not published (nothing would skip a rebuild); its report."""
    env = {**os.environ, "WHEELMILL_OUTPUT": str(output), **extra}
    command = [sys.executable, "-m", "wheelmill", "build", "--cell", cell, "--recipe", recipe, "--engine", engine, "--no-publish"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr
    report: dict[str, Any] = json.loads((output / cell / "report.json").read_text())
    report["stdout"] = done.stdout
    return report


def cache_checks(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(step["step"], check["verdict"], check["detail"]) for step in report["steps"] for check in step["checks"] if check["name"] == "compiler-cache"]


def assert_second_build_hits(output: Path, engine: str) -> None:
    first = build(output, engine=engine)
    assert first["facts"]["compiler_cache"][RECIPE]["misses"] > 0, first["facts"]
    second = build(output, engine=engine)
    stats = second["facts"]["compiler_cache"][RECIPE]
    assert stats["hits"] > 0 and stats["misses"] == 0, stats
    assert stats["hits_by_language"].get("C/C++", 0) > 0 and stats["location"].startswith("Local disk")
    assert (output / ".cache" / "sccache").is_dir(), "local disk under the output root"
    assert ("build", "pass", f"{stats['hits']} hits, 0 misses ({stats['location']})") in cache_checks(second)
    assert "compiler cache" in second["stdout"]  # the summary's table
    assert not (output / CELL / "sccache.sock").exists(), "the server is stopped when the cell ends"


def test_a_rebuild_on_this_machine_takes_every_object_from_the_cache(tmp_path: Path) -> None:
    assert_second_build_hits(tmp_path / "out", "none")


def test_an_unreachable_cache_is_one_warning_and_a_build_without_it(tmp_path: Path) -> None:
    report = build(tmp_path / "out", SCCACHE_REDIS_ENDPOINT="redis://127.0.0.1:1")
    assert report["status"] == "ok"
    checks = cache_checks(report)
    warnings = [c for c in checks if c[1] == "warn"]
    assert len(warnings) == 1 and warnings[0][0] == "compiler-cache", checks
    assert warnings[0][2].startswith("builds compile without it: the server did not answer within 15s")
    assert [c[1] for c in checks if c[0] == "build"] == ["skip"]
    assert report["facts"]["compiler_cache"][RECIPE] is None
    assert report["stdout"].count("warn compiler-cache: compiler-cache:") == 1  # one line under the summary
    assert (tmp_path / "out" / CELL / "logs" / "sccache-server.log").exists()
