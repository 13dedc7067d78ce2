"""The benchmarks' runner: a failed command ends a benchmark with its log's tail, not a
traceback, and keeps what it made."""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import pythons
import runs

from tests.integration.test_benchmarks import KEEP_WORK, MEASURES_ONLY, SMOKES


def test_a_passing_benchmark_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with runs.workspace("bench-") as root:
        log = root / "bench.log"
        assert runs.timed([sys.executable, "-c", "print('built')"], log=log) >= 0
        command, output, status = log.read_text().splitlines()
        assert command.startswith("$ ") and output == "built"
        assert status.startswith("# exit status 0 after ")
        assert root.parent == tmp_path
    assert not root.exists()


def test_a_passing_benchmark_asked_to_keep_its_work_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert runs.KEEP_WORK == KEEP_WORK, "the name the smokes set"
    monkeypatch.setenv(KEEP_WORK, "1")
    with runs.workspace("bench-") as root:
        (root / "made").write_text("what a test reads")
    assert (root / "made").read_text() == "what a test reads"
    assert capsys.readouterr().out == f"work directory kept: {root}\n"


def test_a_failed_command_stops_the_benchmark_with_its_log_and_keeps_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    script = "import sys; [print('line', n) for n in range(40)]; sys.exit(3)"

    def benchmark() -> None:
        with runs.workspace("bench-") as root:
            runs.timed([sys.executable, "-c", script], log=root / "bench.log")
            pytest.fail("a failed command goes on")

    with pytest.raises(SystemExit) as stopped:
        benchmark()
    assert stopped.value.code == 1
    (root,) = tmp_path.iterdir()
    err = capsys.readouterr().err
    # the last lines only
    assert "exited 3" in err and "line 39" in err and "# exit status 3" in err and "line 24" not in err
    assert f"kept for a look: {root}" in err
    assert (root / "bench.log").is_file()


def test_cpu_seconds_count_a_finished_child_and_its_own_children(tmp_path: Path) -> None:
    # A child that spends 0.3 s of CPU in a grandchild it waits for, as a cell waits for its
    # compiler cache's server: both count once the child is done, whatever else ran.
    burn = "import time\nwhile time.process_time() < 0.3: pass"
    script = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {burn!r}], check=True)"
    before = runs.cpu_seconds()
    runs.timed([sys.executable, "-c", script], log=tmp_path / "bench.log")
    assert runs.cpu_seconds() - before >= 0.3
    assert 1 <= runs.cores() <= (os.cpu_count() or 1)


def test_a_round_of_pythons_costs_each_extra_python_its_share_of_the_runs_difference() -> None:
    def report(seconds: float, build: float) -> dict[str, object]:
        return {
            "seconds": seconds,
            "steps": [{"step": "build", "seconds": build}, {"step": "install-test", "seconds": seconds - build}],
        }

    cells = {"v-py311": report(51.0, 41.0), "v-py312": report(60.0, 8.0), "v-py313": report(65.0, 10.0)}
    done = pythons.Round(alone=50.0, together=70.0, first=report(49.0, 40.0), reports=cells)
    assert done.difference() == pytest.approx(0.2)  # 20 s more for two extra Pythons: 10 s each, of 50
    assert done.slowed() == pytest.approx(51.0 / 49.0)  # the first cell, beside the others, against alone


def test_a_broken_result_is_an_exit_status_not_a_line(capsys: pytest.CaptureFixture[str]) -> None:
    """A benchmark whose measured thing did not happen as it must (an index left invalid, a
    re-run that compiled) ends with exit status 1 and says why on stderr."""
    assert runs.broken("the re-run compiled example-cpp-ops: nothing was to be built") == 1
    assert capsys.readouterr().err == "benchmark broken: the re-run compiled example-cpp-ops: nothing was to be built\n"
    for script in ("noop.py", "publish.py", "groups.py"):
        assert "runs.broken(" in (Path(runs.__file__).parent / script).read_text(), script


def test_every_benchmark_has_a_smoke_run_and_the_docs_show_it() -> None:
    """tests/integration/test_benchmarks.py runs each benchmark's smallest case; the table of
    docs/benchmarks.md says which."""
    scripts = {path.name for path in Path(runs.__file__).parent.glob("*.py")} - {"runs.py"}
    assert set(SMOKES) == scripts
    text = (runs.ROOT / "docs" / "benchmarks.md").read_text()
    table = text[text.index("## Smoke runs") : text.index("## Overhead against the raw build")]
    rows = dict(re.findall(r"^\| `([a-z_]+\.py)` \| `([^`]+)`", table, flags=re.MULTILINE))
    assert rows == {script: " ".join(args) for script, args in SMOKES.items()}


def test_the_smokes_left_to_the_benchmarks_session_are_the_ones_the_docs_name() -> None:
    """Each smoke of a benchmark that measures only carries the marker the tests session
    leaves out, and no other does; docs/benchmarks.md names them, and the session's command."""
    from tests.integration import test_benchmarks  # noqa: PLC0415 - the module's test functions

    marked = {
        name
        for name, test in vars(test_benchmarks).items()
        if name.startswith("test_") and any(m.name == "benchmark" for m in getattr(test, "pytestmark", []))
    }
    scripts = {name.split("_")[1] + ".py" for name in marked}
    assert scripts == set(MEASURES_ONLY) < set(SMOKES)
    text = " ".join((runs.ROOT / "docs" / "benchmarks.md").read_text().split())
    said = "`publish.py`, `noop.py`, `pythons.py`, `groups.py`, `overhead.py` and `start.py`"
    assert "`.venv/bin/nox -s benchmarks`" in text and said in text
    assert all(f"`{script}`" in said for script in MEASURES_ONLY)
    nox = (runs.ROOT / "noxfile.py").read_text()
    assert '"-m", "not benchmark"' in nox and '"-m", "benchmark"' in nox
