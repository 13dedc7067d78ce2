"""The compiler cache, without a compiler: what a build's environment gets, what the server
gets, what sccache's statistics say, and when a build warns. The one real process here is
sccache's server itself (no compiler), started and stopped on a socket under tmp_path."""

from __future__ import annotations

import json
import os
import re
import socket
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from wheelmill.building.compiler_cache import (
    SOCKET_PATH_MAX,
    STARTUP_SECONDS,
    CacheStats,
    CompilerCache,
    Server,
    answers,
    cache_check,
    install_client,
    ptx_only_targets,
    server_environment,
    socket_problem,
    uncached_nvcc,
)
from wheelmill.building.plan import plan
from wheelmill.building.steps.build import build_environment, fill
from wheelmill.checks import Verdict
from wheelmill.errors import ConfigError
from wheelmill.inputs.matrix import load_matrix
from wheelmill.inputs.recipes import load_recipes
from wheelmill.inputs.variants import Family
from wheelmill.machine.envs import Env
from wheelmill.machine.process import HostRunner, StepLog
from wheelmill.machine.toolchain import Toolkit
from wheelmill.machine.tools import sccache_bin
from wheelmill.planning.spec import RecipeSpec
from wheelmill.settings import Settings

ROOT = Path(__file__).resolve().parent.parent.parent
# What sccache 0.16.0 printed for a CUDA build here (--show-stats --stats-format=json), trimmed.
STATS = {
    "stats": {
        "compile_requests": 9,
        "requests_unsupported_compiler": 0,
        "requests_not_compile": 4,
        "requests_not_cacheable": 1,
        "cache_errors": {"counts": {}, "adv_counts": {}},
        "cache_hits": {"counts": {"C/C++": 2, "CUDA": 1, "PTX": 1, "CUBIN": 5}, "adv_counts": {}},
        "cache_misses": {"counts": {}, "adv_counts": {}},
        "cache_timeouts": 0,
        "cache_read_errors": 0,
        "non_cacheable_compilations": 0,
        "cache_write_errors": 0,
    },
    "cache_location": 'Local disk: "/o/.cache/sccache"',
    "version": "0.16.0",
}


def spec(cell: str, recipe: str) -> RecipeSpec:
    matrix = load_matrix(ROOT / "recipes" / "matrix.toml")
    (cell_plan,) = plan(
        matrix, load_recipes(ROOT / "recipes"), matrix.select([cell]), [recipe], Settings.from_environ({})
    )
    return cell_plan.recipe(recipe)


def cache_at(root: Path) -> CompilerCache:
    return CompilerCache(
        binary=root / ".cache" / "bin" / "sccache",
        socket=root / "cuda130-py311" / "sccache.sock",
        location="Local disk",
    )


def environment(tmp_path: Path, cache: CompilerCache | None) -> dict[str, str]:
    toolkit = Toolkit(
        family=Family.CUDA,
        root=Path("/usr/local/cuda-13.0"),
        version="13.0",
        compiler=Path("/usr/local/cuda-13.0/bin/nvcc"),
    )
    values = {"python": "python", "source": "src", "dist": "dist"}
    cell_root = tmp_path / "cuda130-py311"
    env = Env(root=cell_root / "envs" / "build")
    return build_environment(
        spec("cuda130-py311", "example-cuda-ops"),
        values,
        env=env,
        cell_root=cell_root,
        toolkit=toolkit,
        jobs=2,
        cache=cache,
    )


def test_a_build_compiles_through_the_cache_torch_and_cmake_alike(tmp_path: Path) -> None:
    cache = cache_at(tmp_path)
    env = environment(tmp_path, cache)
    # torch's cpp_extension prefixes the C++ compiler and nvcc with the sccache on PATH.
    assert str(tmp_path / ".cache" / "bin") in env["PATH"].split(":")
    for language in ("C", "CXX", "CUDA"):
        assert env[f"CMAKE_{language}_COMPILER_LAUNCHER"] == str(cache.binary)
    assert env["SCCACHE_SERVER_UDS"] == str(tmp_path / "cuda130-py311" / "sccache.sock")
    assert env["SCCACHE_IGNORE_SERVER_IO_ERROR"] == "1"
    assert env["TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES"] == "1"  # nvcc -MD: every hit preprocesses again
    # The server compiles: temporary files where it sees them too, on the output mount.
    assert env["TMPDIR"] == str(tmp_path / "cuda130-py311" / "build" / "tmp")
    # cpp_extension would wrap CC/CXX a second time, and `sccache sccache cc` fails.
    assert "CC" not in env and "CXX" not in env
    # sccache runs nvcc's steps under stable names itself; nvcc's own flag for them breaks it.
    assert "--objdir-as-tempdir" not in env["NVCC_APPEND_FLAGS"]
    # Module ids seeded, not ended in nvcc's process id; one seed for every Python.
    assert "--frandom-seed=example-cuda-ops" in env["NVCC_APPEND_FLAGS"].split()
    assert "-Xcompiler=-ffile-prefix-map=" in env["NVCC_APPEND_FLAGS"]


def test_without_the_cache_a_build_environment_names_none_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TMPDIR", raising=False)  # a caller's own passes through; the cache sets none
    for cache in (
        None,
        CompilerCache.off("WHEELMILL_COMPILER_CACHE=off"),
        CompilerCache(binary=Path("/o/bin/sccache"), socket=None),
    ):
        env = environment(tmp_path, cache)
        assert not [
            key for key in env if key.startswith(("SCCACHE_", "CMAKE_", "TORCH_EXTENSION_")) or key == "TMPDIR"
        ], cache
        assert "/o/bin" not in env["PATH"] and str(tmp_path / ".cache" / "bin") not in env["PATH"]
        assert {"--objdir-as-tempdir", "--frandom-seed=example-cuda-ops"} <= set(env["NVCC_APPEND_FLAGS"].split())


def test_the_server_gets_the_callers_cache_configuration_and_wheelmill_decides_the_rest() -> None:
    caller = {
        "SCCACHE_BUCKET": "team-cache",
        "SCCACHE_REGION": "eu-west-1",
        "AWS_ACCESS_KEY_ID": "AKIA",
        "ACTIONS_CACHE_URL": "https://cache/",
        "SCCACHE_GHA_ENABLED": "true",
        "GITHUB_SERVER_URL": "https://github.com",
        "SCCACHE_SERVER_PORT": "4226",
        "SCCACHE_IDLE_TIMEOUT": "0",
        "CC": "clang",
        "SECRET_THING": "x",
    }
    env = server_environment(caller, cache_dir=Path("/o/.cache/sccache"), socket_path=Path("/o/c/sccache.sock"))
    for key in (
        "SCCACHE_BUCKET",
        "SCCACHE_REGION",
        "AWS_ACCESS_KEY_ID",
        "ACTIONS_CACHE_URL",
        "SCCACHE_GHA_ENABLED",
        "GITHUB_SERVER_URL",
    ):
        assert env[key] == caller[key]
    assert "CC" not in env and "SECRET_THING" not in env and "SCCACHE_SERVER_PORT" not in env
    assert env["SCCACHE_DIR"] == "/o/.cache/sccache"  # local disk under the output root by default
    assert env["SCCACHE_SERVER_UDS"] == "/o/c/sccache.sock"
    assert (env["SCCACHE_START_SERVER"], env["SCCACHE_NO_DAEMON"], env["SCCACHE_IDLE_TIMEOUT"]) == ("1", "1", "3600")
    mine = server_environment({"SCCACHE_DIR": "/fast/ssd"}, cache_dir=Path("/o/.cache/sccache"), socket_path=Path("/s"))
    assert mine["SCCACHE_DIR"] == "/fast/ssd"


def test_the_server_strips_the_cell_root_after_the_callers_basedirs() -> None:
    cell, other = Path("/o/cuda130-py313"), Path("/elsewhere")
    env = server_environment({}, cache_dir=Path("/c"), socket_path=Path("/s"), basedirs=[cell, other])
    assert env["SCCACHE_BASEDIRS"] == f"{cell}:{other}"
    theirs = server_environment(
        {"SCCACHE_BASEDIRS": "/home/ci"}, cache_dir=Path("/c"), socket_path=Path("/s"), basedirs=[cell]
    )
    assert theirs["SCCACHE_BASEDIRS"] == f"/home/ci:{cell}"
    assert "SCCACHE_BASEDIRS" not in server_environment({}, cache_dir=Path("/c"), socket_path=Path("/s"))


def test_stats_are_counted_by_language_and_in_all() -> None:
    stats = CacheStats.parse(json.dumps(STATS))
    assert (stats.total_hits, stats.total_misses, stats.errors, stats.not_cached) == (9, 0, 0, 1)
    assert stats.as_dict() == {
        "hits": 9,
        "misses": 0,
        "hits_by_language": {"C/C++": 2, "CUBIN": 5, "CUDA": 1, "PTX": 1},
        "misses_by_language": {},
        "hits_by_tier": None,  # one tier: sccache counts none by tier
        "read_only": False,
        "errors": 0,
        "not_cached": 1,
        "location": 'Local disk: "/o/.cache/sccache"',
    }
    assert stats.describe() == "9 hits, 0 misses, 1 not cacheable"
    empty = CacheStats.parse('{"stats": {}, "cache_location": ""}')
    assert (empty.total_hits, empty.total_misses) == (0, 0)


def test_a_build_warns_once_where_the_cache_went_away_and_never_fails() -> None:
    stats = CacheStats.parse(json.dumps(STATS))
    cache = cache_at(Path("/o"))
    assert cache_check(cache, stopped=False, stats=stats).verdict is Verdict.PASS
    assert "9 hits, 0 misses" in cache_check(cache, stopped=False, stats=stats).detail
    # The cell's step warned already: its builds say why they went without, no second warning.
    off = cache_check(CompilerCache.off("the server did not answer"), stopped=False, stats=None)
    assert (off.verdict, off.detail) == (Verdict.SKIP, "compiled without it: the server did not answer")
    gone = cache_check(CompilerCache.off("stopped answering"), stopped=True, stats=None)
    assert gone.verdict is Verdict.WARN and gone.fix
    assert cache_check(cache, stopped=False, stats=None).verdict is Verdict.WARN
    assert all(c.verdict is not Verdict.FAIL for c in (off, gone))


def test_a_socket_path_longer_than_a_unix_socket_takes_is_refused_before_starting() -> None:
    assert socket_problem(Path("/o/cpu-py311/sccache.sock")) is None
    assert "more than a Unix socket takes" in (socket_problem(Path("/" + "d" * 100 + "/cpu-py311/sccache.sock")) or "")


def test_settings_turn_the_cache_off_and_refuse_a_typo() -> None:
    assert Settings.from_environ({}).compiler_cache == "on"
    assert Settings.from_environ({"WHEELMILL_COMPILER_CACHE": "off"}).compiler_cache == "off"
    with pytest.raises(ConfigError, match="WHEELMILL_COMPILER_CACHE"):
        Settings.from_environ({"WHEELMILL_COMPILER_CACHE": "s3"})


def test_sccache_is_pinned_with_hashes_and_found_in_wheelmills_env() -> None:
    lock = (ROOT / "requirements" / "dev.txt").read_text()
    pinned = re.search(
        r"^sccache==0\.16\.0 \\\n((?:    --hash=sha256:[0-9a-f]{64}(?: \\)?\n)+)", lock, flags=re.MULTILINE
    )
    assert pinned is not None and pinned.group(1).count("--hash") >= 1
    binary = sccache_bin()
    assert binary is not None and binary.is_file() and binary.name == "sccache"


def test_the_client_is_copied_alone_into_its_directory_once(tmp_path: Path) -> None:
    binary = sccache_bin()
    assert binary is not None
    client = install_client(binary, tmp_path / "bin")
    assert [p.name for p in (tmp_path / "bin").iterdir()] == ["sccache"] and client.read_bytes() == binary.read_bytes()
    before = client.stat().st_mtime_ns
    assert install_client(binary, tmp_path / "bin") == client and client.stat().st_mtime_ns == before


def test_the_server_answers_on_its_socket_and_is_gone_after_the_cell(tmp_path: Path) -> None:
    """sccache's own server (no compiler involved): started, answering, then stopped with
    its socket removed."""
    binary = sccache_bin()
    assert binary is not None
    socket = tmp_path / "sccache.sock"
    env = server_environment({}, cache_dir=tmp_path / "cache", socket_path=socket)
    with (
        StepLog(tmp_path / "step.log") as log,
        Server(HostRunner(), binary=binary, env=env, log=log, output=tmp_path / "server.log") as server,
    ):
        assert server.failure is None
        assert answers(socket)
        process = server._process  # the process it must stop
        assert process is not None and process.poll() is None
    assert process.poll() is not None, "the server is stopped when the cell ends"
    assert not socket.exists() and not answers(socket)
    assert STARTUP_SECONDS <= 30


def test_a_socket_deeper_than_a_socket_path_allows_is_still_probed(tmp_path: Path) -> None:
    """In a container the server listens on ``/wheelmill/sccache.sock``; this process
    reaches the same socket under the cell's directory, which may be longer than 107 bytes."""
    deep = tmp_path.joinpath(*["a-long-directory-name"] * 6)
    deep.mkdir(parents=True)
    path = deep / "sccache.sock"
    assert len(str(path)) > SOCKET_PATH_MAX
    directory = os.open(deep, os.O_PATH | os.O_DIRECTORY)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(f"/proc/self/fd/{directory}/sccache.sock")  # how a short name reaches it
        listener.listen(1)
        assert answers(path)
    finally:
        listener.close()
        os.close(directory)
    path.unlink()
    assert not answers(path) and not answers(tmp_path / "missing" / "sccache.sock")


def test_the_servers_credentials_reach_no_log(tmp_path: Path) -> None:
    caller = {
        "AWS_SECRET_ACCESS_KEY": "aws-hunter2",
        "AWS_SESSION_TOKEN": "aws-session-hunter2",
        "ACTIONS_RUNTIME_TOKEN": "gha-hunter2",
        "SCCACHE_REDIS_PASSWORD": "redis-hunter2",
        "SCCACHE_AZURE_CONNECTION_STRING": "AccountKey=azure-hunter2",
    }
    env = server_environment(caller, cache_dir=tmp_path / "cache", socket_path=tmp_path / "s.sock")
    with StepLog(tmp_path / "step.log") as log:
        HostRunner().spawn(["true"], env=env, log=log, output=tmp_path / "server.log").wait()
    text = (tmp_path / "step.log").read_text()
    assert "SCCACHE_AZURE_CONNECTION_STRING=***" in text
    assert "hunter2" not in text


def test_nvcc_compiles_a_files_archs_at_once_unless_the_recipe_chooses_its_own_threads(tmp_path: Path) -> None:
    """``--threads`` goes first (NVCC_PREPEND_FLAGS), so a build's own flag still wins; a
    recipe that sets NVCC_THREADS (flash-attn) or the flag itself (apex) gets none of ours,
    and a CPU cell none at all."""
    toolkit = Toolkit(
        family=Family.CUDA,
        root=Path("/usr/local/cuda-13.0"),
        version="13.0",
        compiler=Path("/usr/local/cuda-13.0/bin/nvcc"),
    )
    env = Env(root=tmp_path / "cuda130-py311" / "envs" / "build")

    def made(cell: str, recipe: str, threads: int, **variables: str) -> dict[str, str]:
        chosen = replace(spec(cell, recipe), env={**spec(cell, recipe).env, **variables})
        kit = toolkit if chosen.family is Family.CUDA else None
        return build_environment(
            chosen, {}, env=env, cell_root=tmp_path / cell, toolkit=kit, jobs=2, nvcc_threads=threads
        )

    assert made("cuda130-py311", "example-cuda-ops", 2)["NVCC_PREPEND_FLAGS"] == "--threads 2"
    assert "NVCC_PREPEND_FLAGS" not in made("cuda130-py311", "example-cuda-ops", 1)
    assert "NVCC_PREPEND_FLAGS" not in made("cuda130-py311", "example-cuda-ops", 2, NVCC_THREADS="4")
    assert "--threads" not in made("cuda130-py311", "example-cuda-ops", 2, NVCC_APPEND_FLAGS="--threads 3").get(
        "NVCC_PREPEND_FLAGS", ""
    )
    assert "NVCC_PREPEND_FLAGS" not in made("cpu-py311", "example-cpp-ops", 2)


def test_the_server_restarts_once_the_cell_before_it_has_built_since_it_started(tmp_path: Path) -> None:
    """A server reads its cache's index once: after the run's cell before this one has
    built again, a build gets a new server (a new process, answering, the old one gone);
    no build of that cell since, no restart."""
    binary = sccache_bin()
    assert binary is not None
    env = server_environment({}, cache_dir=tmp_path / "cache", socket_path=tmp_path / "sccache.sock")
    with (
        StepLog(tmp_path / "build.log") as log,
        Server(HostRunner(), binary=binary, env=env, log=log, output=tmp_path / "server.log", seen=1) as server,
    ):
        first = server._process
        assert server.refresh(log, seen=1) is None and server._process is first, "nothing built since: the same server"
        assert server.refresh(log, seen=2) is None and server._process is not first and server.seen == 2
        assert first is not None and first.poll() is not None, "the old server is stopped"
        assert answers(tmp_path / "sccache.sock")
    assert (tmp_path / "build.log").read_text().count("# restarting the compiler cache's server") == 1


def multi_level(disk: int, redis: int, s3: int) -> list[dict[str, object]]:
    """sccache 0.16.0's ``stats.multi_level`` for chain disk,redis,s3, trimmed."""
    return [
        {"name": "L0 (disk)", "location": 'Local disk: "/o/.cache/sccache"', "hits": disk, "misses": 1, "writes": 1},
        {"name": "L1 (redis)", "location": "redis, name: redis://r:6379, prefix: /cpu/", "hits": redis, "misses": 1},
        {"name": "L2 (s3)", "location": "s3, name: team-cache, prefix: /sccache/cpu/", "hits": s3, "misses": 1},
    ]


def chained(disk: int, redis: int, s3: int, *, write_errors: int = 0) -> str:
    data: dict[str, Any] = json.loads(json.dumps(STATS))
    data["stats"].update(multi_level=multi_level(disk, redis, s3), cache_write_errors=write_errors)
    return json.dumps({**data, "cache_location": "Multi-level (3 levels)"})


def test_hits_are_counted_by_tier_for_the_build_alone() -> None:
    """sccache zeroes its counters but not those by tier: a build's are what they grew by."""
    before = CacheStats.parse(chained(4, 1, 0))
    after = CacheStats.parse(chained(6, 7, 1))
    stats = after.since(before)
    assert stats.tiers == {"disk": 2, "redis": 6, "s3": 1}
    assert stats.as_dict()["hits_by_tier"] == {"disk": 2, "redis": 6, "s3": 1}
    assert stats.describe() == "9 hits (disk 2, redis 6, s3 1), 0 misses, 1 not cacheable"
    assert CacheStats.parse(json.dumps(STATS)).since(before).tiers is None  # one tier: none by tier


def test_a_read_only_chain_says_so_and_a_write_it_refused_is_no_error() -> None:
    """sccache 0.16 refuses every write of a chain with a read-only tier (mozilla/sccache#2773),
    and then counts nothing by tier (``multi_level`` is null)."""
    text = json.loads(chained(0, 0, 0, write_errors=2))
    text["stats"]["multi_level"] = None
    stats = replace(CacheStats.parse(json.dumps(text)), read_only=True)
    assert (stats.errors, stats.write_errors, stats.tiers) == (0, 2, None)
    assert stats.describe() == "9 hits, 0 misses, 1 not cacheable, 2 not stored (read-only)"
    assert stats.as_dict()["read_only"] is True and stats.as_dict()["hits_by_tier"] is None
    assert replace(stats, read_only=False).errors == 2, "read-write, a write that failed is an error"


def test_a_builds_verdict_names_the_tiers_that_served_it() -> None:
    cache = replace(cache_at(Path("/o")), tiers=("disk", "s3"), location="tiers disk, s3")
    stats = replace(CacheStats.parse(chained(1, 0, 8)), location=cache.location)  # as the build step locates it
    detail = cache_check(cache, stopped=False, stats=stats).detail
    assert detail == "9 hits (disk 1, redis 0, s3 8), 0 misses, 1 not cacheable (tiers disk, s3)"


def cuda_cells() -> list[str]:
    matrix = load_matrix(ROOT / "recipes" / "matrix.toml")
    variants = [v for v in matrix.variants.values() if v.family is Family.CUDA]
    return [f"{v.name}-py{v.pythons[0].replace('.', '')}" for v in variants]


def test_no_arch_list_of_the_matrix_asks_nvcc_for_ptx_alone_so_cuda_builds_compile_through_the_cache() -> None:
    """TORCH_CUDA_ARCH_LIST's +PTX asks for PTX beside its SASS, for which nvcc runs no ptxas
    check of its own: what mozilla/sccache#2862 fails on is PTX alone."""
    recipes = load_recipes(ROOT / "recipes")
    matrix = load_matrix(ROOT / "recipes" / "matrix.toml")
    checked = 0
    for cell in cuda_cells():
        (selected,) = matrix.select([cell])
        every = [name for name, recipe in recipes.items() if recipe.applies_to(selected)]  # opt-in ones too
        (cell_plan,) = plan(matrix, recipes, [selected], every, Settings.from_environ({}))
        for chosen in cell_plan.recipes:
            if chosen.family is Family.CUDA:
                values = {"python": "python", "source": "src", "dist": "dist", **chosen.template_values()}
                variables = {**chosen.build_variables(), **{k: fill(v, values) for k, v in chosen.env.items()}}
                argv = [fill(part, values) for part in chosen.command]
                assert uncached_nvcc(variables, argv) is None, (cell, chosen.name, chosen.arch_list)
                checked += 1
    assert checked > 10, checked
    print(f"{checked} CUDA builds of {len(cuda_cells())} cells: none asks nvcc for PTX alone")
    assert ptx_only_targets({"TORCH_CUDA_ARCH_LIST": "7.5;8.0;8.6;9.0;10.0;12.0+PTX"}) == []


@pytest.mark.parametrize(
    ("variables", "argv", "alone"),
    [
        ({"NVCC_APPEND_FLAGS": "-gencode=arch=compute_90,code=compute_90"}, [], ["compute_90"]),
        ({}, ["--generate-code=arch=compute_120,code=[compute_120]", "-c", "k.cu"], ["compute_120"]),
        ({}, ["-gencode", "arch=compute_90,code=[sm_90,compute_90]"], []),  # beside its SASS
        ({"NVCC_APPEND_FLAGS": "-gencode=arch=compute_80,code=compute_80"}, [], []),  # nvcc checks none below 90
        ({}, ["-arch=compute_100"], ["compute_100"]),
        ({}, ["-arch=sm_90"], []),  # SASS and PTX of 90
        ({"CMAKE_CUDA_ARCHITECTURES": "75-virtual;90-virtual;86-real"}, [], ["compute_90"]),
        ({}, ["-DCMAKE_CUDA_ARCHITECTURES=90a-virtual;90a-real"], []),
        ({"CUDAARCHS": "120"}, [], []),
    ],
)
def test_a_build_whose_flags_ask_nvcc_for_ptx_alone_compiles_without_the_cache(
    variables: dict[str, str], argv: list[str], alone: list[str]
) -> None:
    assert ptx_only_targets(variables, argv) == alone
    why = uncached_nvcc(variables, argv)
    assert (why is None) == (not alone)
    if why is not None:
        assert "mozilla/sccache#2862" in why and alone[0] in why
