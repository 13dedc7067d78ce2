"""The compiler cache's shared tiers without a server: what the settings give sccache's server
(the chain, each tier's keys under the toolkit's folder, read-only), the files its variables
name (mounted into the online container), and what is left out where one is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from wheelmill.building.cache_tiers import Tiers, credential_files, files_to_mount, missing_files
from wheelmill.building.compiler_cache import CompilerCache, remote_variables, server_environment
from wheelmill.building.plan import plan
from wheelmill.building.steps.cache import describe, serve, server_verdict, usable_tiers
from wheelmill.checks import Verdict
from wheelmill.inputs.matrix import load_matrix
from wheelmill.inputs.recipes import load_recipes
from wheelmill.machine.container import Container
from wheelmill.machine.engine import Engine, EngineName, Mount
from wheelmill.machine.process import StepLog
from wheelmill.settings import Settings, SharedWrites

ROOT = Path(__file__).resolve().parent.parent.parent
TIERS = {
    "WHEELMILL_COMPILER_CACHE_TIERS": "disk,redis,s3",
    "WHEELMILL_COMPILER_CACHE_REDIS": "redis://cache.internal:6379/1",
    "WHEELMILL_COMPILER_CACHE_S3": "s3://team-cache/sccache",
    "AWS_ENDPOINT_URL_S3": "https://s3.internal:9000",
    "AWS_REGION": "eu-west-1",
}


def server_env(environ: dict[str, str], *, toolkit: str = "cuda130") -> dict[str, str]:
    settings = Settings.from_environ(environ)
    tiers = Tiers.chosen(settings.cache_tiers, settings.shared_writes, toolkit=toolkit)
    return server_environment(
        environ, cache_dir=Path("/o/.cache/sccache"), socket_path=Path("/o/c/sccache.sock"), tiers=tiers
    )


def test_tiers_make_a_multi_level_chain_with_each_shared_tiers_keys_under_the_toolkit() -> None:
    env = server_env(TIERS)
    assert env["SCCACHE_MULTILEVEL_CHAIN"] == "disk,redis,s3"
    assert env["SCCACHE_DIR"] == "/o/.cache/sccache", "local disk under the output root, as without tiers"
    assert (env["SCCACHE_REDIS_ENDPOINT"], env["SCCACHE_REDIS_DB"]) == ("redis://cache.internal:6379", "1")
    assert env["SCCACHE_REDIS_KEY_PREFIX"] == "cuda130/"
    assert (env["SCCACHE_BUCKET"], env["SCCACHE_S3_KEY_PREFIX"]) == ("team-cache", "sccache/cuda130/")
    # Reached as the AWS SDK's variables say; TLS by the endpoint's scheme.
    assert (env["SCCACHE_ENDPOINT"], env["SCCACHE_S3_USE_SSL"]) == ("https://s3.internal:9000", "true")
    assert env["SCCACHE_REGION"] == "eu-west-1"
    assert (env["SCCACHE_REDIS_RW_MODE"], env["SCCACHE_S3_RW_MODE"]) == ("READ_WRITE", "READ_WRITE")
    plain = server_env({**TIERS, "AWS_ENDPOINT_URL_S3": "", "AWS_ENDPOINT_URL": "http://127.0.0.1:8333"})
    assert (plain["SCCACHE_ENDPOINT"], plain["SCCACHE_S3_USE_SSL"]) == ("http://127.0.0.1:8333", "false")
    no_prefix = server_env({**TIERS, "WHEELMILL_COMPILER_CACHE_S3": "s3://team-cache"}, toolkit="cpu")
    assert no_prefix["SCCACHE_S3_KEY_PREFIX"] == "cpu/"


def test_every_cell_of_a_toolkit_shares_its_folder_and_toolkits_are_apart() -> None:
    """The folder is the variant as declared: a slim variant, another torch's and another
    platform's share their toolkit's keys; each declared variant has its own."""
    matrix = load_matrix(ROOT / "recipes" / "matrix.toml")
    folders = {variant.name: variant.base_name for variant in matrix.variants.values()}
    assert folders["cuda130-sm90-torch2.12-aarch64"] == folders["cuda130"] == "cuda130"
    assert folders["rocm64-gfx942"] == "rocm64" and folders["cpu-aarch64"] == "cpu"
    declared = {name for name, folder in folders.items() if name == folder}
    assert declared >= {"cpu", "cuda118", "cuda130", "rocm64"} and set(folders.values()) == declared
    prefixes = {server_env(TIERS, toolkit=t)["SCCACHE_S3_KEY_PREFIX"] for t in declared}
    assert len(prefixes) == len(declared)


def test_a_pull_requests_build_reads_the_shared_tiers_and_writes_nothing_there() -> None:
    for environ in (
        {**TIERS, "GITHUB_EVENT_NAME": "pull_request"},  # WHEELMILL_SHARED_WRITES=auto, CI's default
        {**TIERS, "WHEELMILL_SHARED_WRITES": "read-only"},
    ):
        env = server_env(environ)
        assert (env["SCCACHE_REDIS_RW_MODE"], env["SCCACHE_S3_RW_MODE"]) == ("READ_ONLY", "READ_ONLY")
        assert "SCCACHE_LOCAL_RW_MODE" not in env, "local disk is the runner's own"
    for event in ("push", ""):  # pushes and tags write
        assert server_env({**TIERS, "GITHUB_EVENT_NAME": event})["SCCACHE_S3_RW_MODE"] == "READ_WRITE"
    tiers = Tiers.chosen(Settings.from_environ(TIERS).cache_tiers, SharedWrites.READ_ONLY, toolkit="cpu")
    assert tiers.describe() == "disk, redis (read-only), s3 (read-only)"


def test_without_a_tiers_setting_the_callers_sccache_variables_say_where_the_cache_lives() -> None:
    caller = {"SCCACHE_BUCKET": "theirs", "SCCACHE_REDIS_ENDPOINT": "redis://r:6379", "SCCACHE_REGION": "x"}
    default = server_env(caller)
    assert default == server_environment(
        caller, cache_dir=Path("/o/.cache/sccache"), socket_path=Path("/o/c/sccache.sock")
    )
    assert "SCCACHE_MULTILEVEL_CHAIN" not in default and default["SCCACHE_BUCKET"] == "theirs"
    # With tiers, the chain is the settings': sccache builds exactly its tiers; the caller's
    # explicit endpoint and region still win over the AWS SDK's.
    chosen = server_env({**caller, **TIERS, "WHEELMILL_COMPILER_CACHE_TIERS": "disk,s3"})
    assert chosen["SCCACHE_MULTILEVEL_CHAIN"] == "disk,s3" and chosen["SCCACHE_BUCKET"] == "team-cache"
    assert chosen["SCCACHE_REGION"] == "x"


def test_a_redis_url_with_credentials_keeps_them_out_of_the_endpoint() -> None:
    env = server_env({**TIERS, "WHEELMILL_COMPILER_CACHE_REDIS": "redis://ci:p%40ss@cache.internal:6380"})
    assert env["SCCACHE_REDIS_ENDPOINT"] == "redis://cache.internal:6380"
    assert (env["SCCACHE_REDIS_USERNAME"], env["SCCACHE_REDIS_PASSWORD"]) == ("ci", "p@ss")
    assert "SCCACHE_REDIS_DB" not in env


def test_the_files_the_servers_variables_name_are_found_and_named_absolutely(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    caller = {
        "AWS_WEB_IDENTITY_TOKEN_FILE": "/var/run/secrets/token",
        "AWS_SHARED_CREDENTIALS_FILE": "/home/ci/.aws/credentials",
        "AWS_CONFIG_FILE": "aws.cfg",  # relative: as this process finds it
        "SCCACHE_GCS_KEY_PATH": "/etc/gcs.json",
        "SCCACHE_CONF": "/etc/sccache.toml",
        "SCCACHE_DIR": "/fast/ssd",  # a directory sccache writes: no credential
        "LD_LIBRARY_PATH": "/opt/lib",  # does not reach the server
    }
    files = credential_files(remote_variables(caller))
    assert set(files) == {
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_SHARED_CREDENTIALS_FILE",
        "AWS_CONFIG_FILE",
        "SCCACHE_GCS_KEY_PATH",
        "SCCACHE_CONF",
    }
    assert files["AWS_CONFIG_FILE"] == tmp_path / "aws.cfg"
    env = server_environment(caller, cache_dir=Path("/c"), socket_path=Path("/s"))
    assert env["AWS_CONFIG_FILE"] == str(tmp_path / "aws.cfg"), "the server may run from elsewhere"
    assert env["AWS_WEB_IDENTITY_TOKEN_FILE"] == caller["AWS_WEB_IDENTITY_TOKEN_FILE"]


def test_the_online_container_mounts_each_file_read_only_at_its_path_and_the_build_container_none(
    tmp_path: Path,
) -> None:
    token, config, output = tmp_path / "token", tmp_path / "out" / "aws.cfg", tmp_path / "out"
    output.mkdir()
    token.write_text("t")
    config.write_text("[default]\n")
    files = {"AWS_WEB_IDENTITY_TOKEN_FILE": token, "AWS_CONFIG_FILE": config, "AWS_X_FILE": tmp_path / "gone"}
    mounted = files_to_mount(files, visible=[output])
    assert mounted == [token], "under the output root it is mounted already; a missing file is none"
    assert missing_files(files) == [f"AWS_X_FILE names {tmp_path / 'gone'}, which does not exist"]
    engine = Engine(name=EngineName.PODMAN, binary="podman")
    with StepLog(tmp_path / "log") as log:
        online, netless = (
            Container(engine, cell="cpu-py311", image="i", mounts=[], log=log, network=net, server_files=mounted)
            for net in (True, False)
        )
        assert Mount(source=token, target=token, readonly=True) in online.all_mounts()
        assert f"{token}:{token}:ro" in [m.volume() for m in online.all_mounts()]
        assert netless.all_mounts() == []


def test_a_missing_credential_file_is_one_warning_and_the_builds_compile_without_the_shared_tiers(
    tmp_path: Path,
) -> None:
    gone = {"AWS_WEB_IDENTITY_TOKEN_FILE": str(tmp_path / "token")}
    tiers, notes = usable_tiers(Settings.from_environ(TIERS), gone, toolkit="cpu")
    assert tiers.chain == ("disk",)
    missing = f"AWS_WEB_IDENTITY_TOKEN_FILE names {tmp_path}/token, which does not exist"
    assert notes == [f"without the shared tiers redis, s3: {missing}"]
    cache = CompilerCache(binary=Path("/b/sccache"), socket=Path("/wheelmill/sccache.sock"), location="Local disk")
    verdict = server_verdict(cache, tiers, notes)
    assert verdict.verdict is Verdict.WARN and verdict.fix, "a warning, never a failure"
    # Without a tiers setting, the caller's own configuration stays; the warning says why it may fail.
    raw, said = usable_tiers(Settings.from_environ({}), gone, toolkit="cpu")
    assert raw.chain == ("disk",) and said == [
        f"AWS_WEB_IDENTITY_TOKEN_FILE names {tmp_path}/token, which does not exist"
    ]
    assert usable_tiers(Settings.from_environ(TIERS), {}, toolkit="cpu") == (
        Tiers.chosen(Settings.from_environ(TIERS).cache_tiers, SharedWrites.READ_WRITE, toolkit="cpu"),
        [],
    )


class Started:
    def __init__(self, tiers: Tiers, failure: str | None) -> None:
        self.tiers, self.failure = tiers, failure


def test_a_server_that_does_not_answer_with_the_shared_tiers_is_started_again_with_local_disk() -> None:
    tiers = Tiers.chosen(Settings.from_environ(TIERS).cache_tiers, SharedWrites.READ_WRITE, toolkit="cpu")
    tried: list[tuple[str, ...]] = []

    def start(chosen: Tiers) -> Started:
        tried.append(chosen.chain)
        return Started(chosen, "the server did not answer within 15s" if chosen.shared else None)

    server, used, notes = serve(tiers, [], start)
    assert tried == [("disk", "redis", "s3"), ("disk",)] and server.failure is None and used.chain == ("disk",)
    assert notes == ["without the shared tiers redis, s3: the server did not answer within 15s"]
    tried.clear()
    _, local, none = serve(tiers.local(), [], start)
    assert tried == [("disk",)] and local.chain == ("disk",) and none == []


@pytest.mark.parametrize(
    ("writes", "read_only"),
    [("read-write", False), ("compiler-cache", False), ("images", True), ("read-only", True)],
)
def test_the_shared_tiers_are_written_where_the_setting_names_the_compiler_cache(writes: str, read_only: bool) -> None:
    settings = Settings.from_environ({**TIERS, "WHEELMILL_SHARED_WRITES": writes})
    assert Tiers.chosen(settings.cache_tiers, settings.shared_writes, toolkit="cpu").read_only is read_only


def test_the_steps_verdict_names_the_tiers_and_the_mode() -> None:
    tiers = Tiers.chosen(Settings.from_environ(TIERS).cache_tiers, SharedWrites.READ_ONLY, toolkit="cpu")
    cache = CompilerCache(
        binary=Path("/b/sccache"), socket=Path("/wheelmill/sccache.sock"), location=f"tiers {tiers.describe()}"
    )
    verdict = server_verdict(cache, tiers, [])
    assert verdict.verdict is Verdict.PASS
    assert verdict.detail == "sccache server on /wheelmill/sccache.sock; tiers disk, redis (read-only), s3 (read-only)"
    local = server_verdict(CompilerCache(socket=Path("/s"), location='Local disk: "/c"'), Tiers(), [])
    assert local.detail == 'sccache server on /s; cache: Local disk: "/c"'


def test_the_printed_plan_says_the_tiers_and_their_mode(repo_root: Path) -> None:
    """The plan's choices line and the compiler-cache step name the shared tiers, read-only on
    a pull request's build; without them, the plan reads as it always did."""
    matrix, recipes = load_matrix(repo_root / "recipes" / "matrix.toml"), load_recipes(repo_root / "recipes")
    environ = {
        "WHEELMILL_COMPILER_CACHE_TIERS": "disk,redis,s3",
        "WHEELMILL_COMPILER_CACHE_REDIS": "redis://127.0.0.1:6379",
        "WHEELMILL_COMPILER_CACHE_S3": "s3://cache/sccache",
        "GITHUB_EVENT_NAME": "pull_request",
    }
    (shared,) = plan(matrix, recipes, matrix.select(["cpu-py311"]), [], Settings.from_environ(environ))
    assert "compiler cache on (tiers disk, redis (read-only), s3 (read-only));" in shared.choices.describe()
    assert "tiers disk, redis (read-only), s3 (read-only), local disk" in describe(shared)
    (alone,) = plan(matrix, recipes, matrix.select(["cpu-py311"]), [], Settings.from_environ({}))
    assert "compiler cache on;" in alone.choices.describe() and "tiers" not in describe(alone)
