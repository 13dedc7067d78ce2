"""The suite's own images plumbing (tests/images.py), in a pytest run of its own on two workers
as the tests session runs it: the controller's registry answers on loopback for every worker,
an engine test builds with it and pushes nothing (it writes the compiler cache alone), no
other test builds with it, the run ends with what each image store held at the start and
what the registry received, and the registry and its files are gone once the run ends."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.images import answers

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent.parent

CONFTEST = """
from tests import conftest as suite
from tests.conftest import pytest_collection_modifyitems, pytest_unconfigure, run_images

def pytest_configure(config):
    config.addinivalue_line("markers", "engine: drives a container engine")
    config.addinivalue_line("markers", "integration: slow")
    config.addinivalue_line("markers", "makes_images: makes the run's images")
    suite.pytest_configure(config)
"""

SOURCES = """
import os
import pytest
from tests.images import answers, run_registry

@pytest.mark.integration
@pytest.mark.engine
def test_engine():
    registry = run_registry()
    assert registry and answers(registry.split("/")[0])
    assert os.environ["WHEELMILL_IMAGE_REGISTRY"] == registry
    assert os.environ["WHEELMILL_SHARED_WRITES"] == "compiler-cache"
    print(f"REGISTRY {registry} {os.environ['TMPDIR']}")

@pytest.mark.parametrize("n", range(4))
def test_plain(n):
    assert run_registry() and os.environ.get("WHEELMILL_IMAGE_REGISTRY") != run_registry()
"""


def test_the_run_registry_serves_every_worker_the_engine_tests_use_it_and_it_goes_at_the_end(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_images_plumbing.py").write_text(SOURCES)
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist=loadgroup", "-rA"]
    outside = {k: v for k, v in os.environ.items() if not k.startswith(("WHEELMILL_", "UV_CACHE_DIR"))}
    env = {**outside, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "5 passed" in done.stdout, done.stdout[-3000:]
    said = re.search(r"REGISTRY (127\.0\.0\.1:\d+)/wheelmill-tests ", done.stdout)
    assert said, done.stdout[-3000:]
    section = done.stdout[done.stdout.index("image stores") :]
    assert re.search(r"^podman: (found \d+ at the start|does not answer)", section, re.MULTILINE), section
    assert re.search(r"^docker: (found \d+ at the start|does not answer)", section, re.MULTILINE), section
    assert f"the run's registry {said[1]}/wheelmill-tests: received 0" in section, section
    assert not answers(said[1]), "the run's registry is stopped at its end"
    assert not list(Path(os.environ.get("TMPDIR", "/tmp")).glob("wheelmill-tests-images-*"))
