"""Every benchmark (benchmarks/*.py) run in its smallest case, so that none rots: the least
work that still goes through its whole path (one round, no warm-up, the cheapest cell), its
exit status 0 and the lines it promises printed. A smoke of the script, not a timing: the
figures in docs/benchmarks.md come from full runs.

Cells are built on this machine (engine none), into the benchmark's own work directory, kept
under the test's temporary directory where a benchmark fails. The CUDA cells are the slim
cuda130-sm90 ones (one arch to compile) on Python 3.10 and 3.11, whose torch the serving and
cell tests install too.


A smoke gives no figure, so the smokes whose lines say nothing of where a compile came from
(noop, pythons, serving, overhead) compile through the run's shared tier like the other
integration tests (tests/compiles.py). The ones whose lines count hits and misses (cache,
fleet) and the engine ones keep their own caches, marked ``own_compiler_cache``."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.images import run_registry, seed
from tests.integration.test_compiler_cache import cache_checks
from tests.matrix_table import BOOTSTRAP, table_rows

pytestmark = pytest.mark.integration
# What counts hits and misses compiles into its own cache: none taken from what other tests compiled.
own_compiles = pytest.mark.own_compiler_cache
# A benchmark that measures only, and whose smoke no promise of wheelmill's rests on: `nox -s
# benchmarks` runs these, `nox -s tests` leaves them out (docs/benchmarks.md). The others stay
# in the suite: cache's reports are the compiler cache's rebuild test, fleet's the fleet's,
# builder_registry's and rootless's the builder images' and the README's.
measures_only = pytest.mark.benchmark
MEASURES_ONLY = ("publish.py", "noop.py", "pythons.py", "groups.py", "overhead.py", "start.py")
ROOT = Path(__file__).resolve().parent.parent.parent
KEEP_WORK = "WHEELMILL_BENCHMARK_KEEP_WORK"  # benchmarks/runs.py's: a passing benchmark's work directory kept
NVCC = ("/usr/local/cuda-13.0/bin", os.environ.get("CUDA_HOME", "") + "/bin")
# Each benchmark's smallest case, as docs/benchmarks.md's table of smoke runs shows it.
SMOKES = {
    "publish.py": ("--smoke",),
    "start.py": ("--smoke",),
    "noop.py": ("--cell", "cpu-py311", "--recipe", "example-cpp-ops"),
    "cache.py": ("--case", "torchsort"),
    "pythons.py": ("--variant", "cuda130-sm90", "--pythons", "3.10,3.11", "--recipe", "example-cpp-ops", "--smoke"),
    "groups.py": ("--variant", "cuda130-sm90", "--pythons", "3.10", "--smoke"),
    "overhead.py": ("--cell", "cuda130-sm90-py311", "--smoke"),
    "builder_registry.py": ("--smoke",),
    "rootless.py": ("--cell", "cpu-py311"),
    "fleet.py": (
        "--cell",
        "cpu-py311",
        "--recipe",
        "example-cpp-ops",
        "--smoke",
        "--pull-request",
        "cpu-py311:example-stable-ops",
    ),
}


def benchmark(
    tmp_path: Path, script: str, timeout: float = 1800, extra: tuple[str, ...] = (), *, keep: bool = False
) -> str:
    """What ``benchmarks/SCRIPT`` printed in its smallest case (and ``extra``); it must exit 0.
    ``keep``: its work directory stays (``work directory kept: PATH``), for the test to read
    what it built."""
    env = {**os.environ, "WHEELMILL_ENGINE": "none", "TMPDIR": str(tmp_path)}  # a kept work directory lands here
    env[KEEP_WORK] = "1" if keep else "0"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *SMOKES[script], *extra],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert keep or not list(tmp_path.glob("*bench*")), "a passing benchmark removes its work directory"
    return done.stdout


def kept(out: str) -> Path:
    (line,) = [line for line in out.splitlines() if line.startswith("work directory kept: ")]
    return Path(line.removeprefix("work directory kept: "))


def needs_cuda() -> None:
    if shutil.which("nvcc", path=os.pathsep.join(NVCC)) is None:
        pytest.skip("no CUDA 13.0 toolkit")


@measures_only
def test_start_times_a_commands_start_against_the_interpreters(tmp_path: Path) -> None:
    out = benchmark(tmp_path, "start.py", timeout=300)
    assert out.startswith("baseline `python -c pass`: ") and "the median of 2 rounds" in out
    assert "  wheelmill --help " in out and "  wheelmill index serve --port 70000 " in out and "x the baseline (" in out
    assert "the most: " in out and "(smoke: no figure)" in out


@measures_only
@pytest.mark.parametrize("store", ["tree", "s3"])
def test_publish_into_a_small_index_one_at_a_time_and_at_once(tmp_path: Path, store: str) -> None:
    """The bucket is a SeaweedFS of the benchmark's own; either storage is filled in bulk, then checked."""
    out = benchmark(tmp_path, "publish.py", timeout=300, extra=("--store", store))
    assert f"store {store}: " in out
    assert "index: 4 files in 2 projects (filled in " in out and "in bulk; valid)" in out
    assert "second index: one project of 4 files" in out
    assert "publish one wheel, median of 2 " in out and "  API " in out and "  CLI " in out
    assert "  into one project of 4 files: API " in out and "  into one project of 4 files: CLI " in out
    assert "3 publishers at once, 2 wheels each (3 into one project): all 6 in " in out
    assert "every file listed: True; index valid afterwards: True" in out
    assert f"summary ({store}): one wheel " in out


@measures_only
def test_noop_builds_a_cell_twice_and_the_second_time_builds_nothing(tmp_path: Path) -> None:
    out = benchmark(tmp_path, "noop.py")
    assert "first run (built example-cpp-ops): " in out
    assert "re-run (compiled: nothing; example-cpp-ops published): " in out
    assert "ratio re-run / first run: " in out


@own_compiles
def test_cache_rebuilds_torchsort_warm(tmp_path: Path) -> None:
    """The benchmark's lines, and what its two builds into one output root show: the second
    compiled nothing, every object a hit of the local disk cache under the output root, said
    in the build step's check and the summary; the cache's server gone with the cell."""
    out = benchmark(tmp_path, "cache.py", keep=True)
    assert "torchsort: torchsort in cpu-py311" in out
    cold = re.search(r"cold \(empty cache\) +build step +[\d.]+ s +\(\d+ hits, (\d+) misses\)", out)
    assert cold and int(cold[1]) > 0, out
    assert re.search(r"warm \(same cache\) +build step +[\d.]+ s +\([1-9]\d* hits, 0 misses\)", out), out
    assert "ratio cold/warm: build step " in out
    work = kept(out)
    output = work / "torchsort"
    warm = json.loads((output / "cpu-py311" / "report.json").read_text())
    stats = warm["facts"]["compiler_cache"]["torchsort"]
    assert stats["hits"] > 0 and stats["misses"] == 0, stats
    assert stats["hits_by_language"].get("C/C++", 0) > 0 and stats["location"].startswith("Local disk"), stats
    assert (output / ".cache" / "sccache").is_dir(), "local disk under the output root"
    assert ("build", "pass", f"{stats['hits']} hits, 0 misses ({stats['location']})") in cache_checks(warm)
    *_, second = (work / "torchsort.log").read_text().split("\n$ ")  # the warm build's output
    assert "\ncompiler cache: " in second, "the summary's line, after the second build"
    assert not (output / "cpu-py311" / "sccache.sock").exists(), "the server is stopped when the cell ends"


@measures_only
def test_pythons_builds_one_python_then_two(tmp_path: Path) -> None:
    out = benchmark(tmp_path, "pythons.py")
    assert "round 1: cuda130-sm90-py310 alone " in out and "  cuda130-sm90-py311 in the run: " in out
    assert "each extra Python costs " in out and "the median of 1 rounds" in out
    assert "each extra Python's cell alone, every compile from the cache" in out


@measures_only
def test_groups_builds_the_stable_example_once_for_the_group(tmp_path: Path) -> None:
    """The group's two corners on Python 3.10: the oldest torch's cell builds, the other takes the group build."""
    out = benchmark(tmp_path, "groups.py")
    assert "cells cuda130-sm90-torch2.12-py310, cuda130-sm90-py310; cuda130-sm90-torch2.12-py310 builds" in out
    assert "aarch64" not in out, "the group of this machine's platform: the aarch64 twin stays out"
    assert "  cuda130-sm90-py310: its steps " in out and "(build from-group, install-test ok)" in out
    assert "each extra torch or Python cost " in out and "the median of 1 rounds" in out


@measures_only
@pytest.mark.cuda
def test_overhead_against_the_raw_build(tmp_path: Path) -> None:
    needs_cuda()
    out = benchmark(tmp_path, "overhead.py")
    assert "round 1: wheelmill " in out and ", baseline " in out
    assert "median of the rounds' ratios " in out and "with publishing " in out


@pytest.mark.engine
def test_builder_registry_pushes_from_one_store_and_pulls_into_another(tmp_path: Path) -> None:
    """podman stores of their own and a loopback docker-registry; a tiny base and Containerfile."""
    if shutil.which("podman") is None or shutil.which("docker-registry", path="/usr/bin:/usr/sbin") is None:
        pytest.skip("needs podman and docker-registry (scripts/setup --system)")
    out = benchmark(tmp_path, "builder_registry.py", timeout=300)
    assert "A: base reused, builder built in " in out and "B: base pulled, builder pulled; pulled in " in out
    assert "same tag: True; same base identity: True" in out
    assert "digests match: base True, builder True" in out
    assert "B bootstrapped: False; B built: False; B asked for a Debian mirror: False" in out


@own_compiles
def test_fleet_reuses_from_the_served_index_and_compiles_from_the_shared_tier(tmp_path: Path) -> None:
    """Runner B builds nothing runner A published, takes its rebuild's compiles from Redis,
    and a pull request's build writes no key there."""
    out = benchmark(tmp_path, "fleet.py", timeout=900)
    assert "recipes {'example-cpp-ops': 'reused'}" in out
    rebuilt = re.search(r"\((\d+) hits, 0 misses, 100%; by tier \{'disk': 0, 'redis': (\d+)\}", out)
    assert rebuilt and rebuilt[1] == rebuilt[2] != "0", out
    assert "ratio A cold / B from the shared tier" in out
    assert re.search(r"example-cpp-ops again [1-9]\d* hits, 0 misses \(read-only True\)", out), out
    pull_request = r"cpu-py311:example-stable-ops 0 hits, [1-9]\d* misses; Redis keys (\d+) before, \1 after"
    assert re.search(pull_request, out), out


@pytest.mark.engine
@pytest.mark.makes_images
def test_rootless_a_new_user_runs_the_readme_and_the_build_job_in_an_empty_store(tmp_path: Path) -> None:
    """An account made for the test, no root after that, an empty image store: the README's
    build command in a fresh clone (base by mmdebstrap's unshare mode, builder image built,
    the cell in rootless podman; both pushed to the run's registry, the run's one maker of
    them: tests/images.py; or, where root's podman store holds both, pushed from there into
    the registry first and pulled by the account), then build.yml's build job's
    steps in another fresh clone (the base and builder reused); the image build without
    /dev/net/tun refused in one line. The README run compiles through the run's shared tier
    (the build job, with no repository variables, through its own cache)."""
    if os.geteuid() != 0 or shutil.which("useradd", path="/usr/sbin:/usr/bin") is None:
        pytest.skip("needs root, to make the account")
    if shutil.which("mmdebstrap") is None or shutil.which("newuidmap") is None:
        pytest.skip("needs mmdebstrap and uidmap (scripts/setup --system)")
    registry = run_registry()
    given = registry is not None and seed(registry, tmp_path)
    out = benchmark(tmp_path, "rootless.py", timeout=1800, extra=("--image-registry", registry) if registry else ())
    print(out)
    rootless = r": +[\d.]+ s; engine podman, rootless True; "
    pushed = ", pushed the base, pushed the builder" if registry else ","
    made = r"base built, builder built \(\S+\) in [\d.]+ s" + pushed
    if given:  # as a fleet's next runner: nothing compiled again for another store
        made = r"base pulled, builder pulled \(\S+\) in [\d.]+ s, pulled the base, pulled the builder"
    assert re.search(r"\(README, empty store\)" + rootless + made, out), out
    assert re.search(r"\(build.yml's build job, second clone\)" + rootless + "base reused, builder reused", out), out
    assert out.count("status ok") == 2, out
    # none warned: image-store neither (setup --system's containers-storage gives the account overlay, not vfs)
    assert "python: /opt/python/3.11/bin/python3.11; checks warned or failed: none" in out, out
    # the glibc docs/matrix.md promises the cell on a bootstrapped base, kept by every wheel
    wheels = int(re.findall(r"^wheels: (\d+);", out, re.MULTILINE)[0])
    baselines = [line for line in out.splitlines() if line.startswith("  glibc-baseline: pass: ")]
    promised = table_rows()["cpu"][BOOTSTRAP]
    assert len(baselines) == wheels > 0 and all(f"within {promised}, " in line for line in baselines), out
    assert "platform-tag: pass" in out and "the account's containers left: none" in out, out
    assert "report.json, wheels/cpu-py311/logs/: all there" in out, out
    assert re.search(r"images as the account: (refused at once \(exit 5\): .*/dev/net/tun|not tried)", out), out
