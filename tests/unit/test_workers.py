"""The tests session's two workers: the tests that drive a container engine keep to one worker
and start first, whatever pytest and pytest-xdist the lock pins (a pytest whose node ids xdist
cannot tag spreads them over both, silently)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

CONFTEST = """
import pytest
from tests.conftest import pytest_collection_modifyitems

def pytest_configure(config):
    config.addinivalue_line("markers", "engine: drives a container engine")
    config.addinivalue_line("markers", "integration: slow")
    config.addinivalue_line("markers", "makes_images: makes the run's images")
"""

# Engine tests in two files, behind plain ones: spread one by one, they would land on both workers.
SOURCES = {
    "test_a.py": """
import pytest

def test_unit():
    pass

@pytest.mark.integration
@pytest.mark.parametrize("n", range(6))
def test_slow(n):
    pass

@pytest.mark.integration
@pytest.mark.engine
@pytest.mark.parametrize("n", range(4))
def test_engine_a(n):
    pass
""",
    "test_b.py": """
import pytest

@pytest.mark.parametrize("n", range(6))
def test_unit(n):
    pass

@pytest.mark.integration
@pytest.mark.parametrize("engine", ["none", pytest.param("podman", marks=pytest.mark.engine)])
def test_engine_b(engine):
    pass

@pytest.mark.integration
@pytest.mark.engine
@pytest.mark.makes_images
def test_maker():
    pass
""",
}


def test_engine_tests_keep_to_one_worker_and_run_first_the_images_maker_first_of_all(tmp_path: Path) -> None:
    """The test that makes the run's images (tests/images.py) comes before every other engine
    test, written last as it is."""
    (tmp_path / "conftest.py").write_text(CONFTEST)
    for name, text in SOURCES.items():
        (tmp_path / name).write_text(text)
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist=loadgroup", "-v"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ran = re.findall(r"^\[(gw\d)\] \[ *\d+%\] PASSED (\S+)", done.stdout, re.MULTILINE)
    assert len(ran) == 20, done.stdout
    engine = [(worker, test) for worker, test in ran if "engine_a" in test or "[podman]" in test or "maker" in test]
    assert len(engine) == 6 and all(test.endswith("@container-engine") for _, test in engine), engine
    assert len({worker for worker, _ in engine}) == 1, f"engine tests on two workers: {engine}"
    on_that_worker = [test for worker, test in ran if worker == engine[0][0]]
    assert on_that_worker[:6] == [test for _, test in engine], "the engine tests start the run"
    assert "test_maker" in on_that_worker[0], "the images' maker starts the engine tests"


SKIPPING = """
import pytest

def test_runs():
    pass

def test_needs_a_tool():
    pytest.skip("nginx is not installed")
"""


def test_in_ci_a_skip_fails_the_run_and_names_the_test_and_its_reason(tmp_path: Path) -> None:
    """A skip means a prerequisite is missing: in CI the run fails saying which (on two workers,
    as the tests session runs); elsewhere it is a skip."""
    (tmp_path / "conftest.py").write_text("from tests.conftest import SkipsInCi, pytest_configure\n")
    (tmp_path / "test_tools.py").write_text(SKIPPING)
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "-q"]
    outside = {k: v for k, v in os.environ.items() if k != "CI"}
    for ci, code in (("true", 1), (None, 0)):
        env = {**outside, "PYTHONPATH": str(ROOT), **({"CI": ci} if ci else {})}
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == code, (ci, done.stdout[-3000:] + done.stderr[-3000:])
        said = "SKIPPED IN CI (a prerequisite is missing): test_tools.py::test_needs_a_tool: Skipped: nginx is not"
        assert (said in done.stdout) == bool(ci), done.stdout[-2000:]
