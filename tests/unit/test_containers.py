"""Containers as data and commands: the argv issued to docker and to podman, engine
detection, which builder image and base a cell gets, image tags, mirrors, locks."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from wheelmill.building.plan import plan_cell
from wheelmill.building.steps.build import build_environment
from wheelmill.building.steps.container import store_checks
from wheelmill.cli import main
from wheelmill.errors import CommandFailed, ConfigError, PrecheckError, UsageError
from wheelmill.inputs.matrix import Matrix, load_matrix
from wheelmill.inputs.recipes import Recipe, load_recipes, resolve_all
from wheelmill.inputs.variants import Cell, Family
from wheelmill.machine.builder_images import (
    BaseKind,
    Baselines,
    baselines,
    choose,
    choose_base,
    debian_mirror,
    image_build_failure,
    require_pinned,
)
from wheelmill.machine.container import Container
from wheelmill.machine.engine import Engine, EngineName, Mount, Probe, detect
from wheelmill.machine.envs import Env, link_site
from wheelmill.machine.pins import Pins, load_pins
from wheelmill.machine.process import Captured, StepLog, yielding
from wheelmill.machine.toolchain import Toolkit
from wheelmill.planning.locks import LockInputs, inputs
from wheelmill.settings import Settings

ROOT = Path(__file__).resolve().parent.parent.parent
DOCKER = Engine(name=EngineName.DOCKER, binary="/usr/bin/docker")
PODMAN = Engine(name=EngineName.PODMAN, binary="/usr/bin/podman")


@pytest.mark.parametrize("engine", [DOCKER, PODMAN], ids=["docker", "podman"])
def test_run_exec_and_remove_commands(engine: Engine) -> None:
    mounts = [
        Mount(source=Path("/srv/wheels"), target=Path("/srv/wheels"), readonly=False),
        Mount(source=Path("/opt/idx"), target=Path("/opt/idx")),
    ]
    run = engine.run_detached(
        container="wheelmill-cpu-py311-7",
        image="localhost/wheelmill-builder:builder-py311-abc",
        mounts=mounts,
        cell="cpu-py311",
    )
    assert run == [
        engine.binary, "run", "--detach", "--name", "wheelmill-cpu-py311-7", "--label", "wheelmill.cell=cpu-py311",
        "--network", "host", "--volume", "/srv/wheels:/srv/wheels:rw", "--volume", "/opt/idx:/opt/idx:ro",
        "--entrypoint", "sleep", "localhost/wheelmill-builder:builder-py311-abc", "infinity",
    ]  # fmt: skip
    weighed = engine.run_detached(container="c", image="i", mounts=[], cell="cpu-py311", network=False, cpu_shares=128)
    assert weighed[weighed.index("--network") : weighed.index("--entrypoint")] == [
        "--network",
        "none",
        "--cpu-shares",
        "128",
    ]
    exec_argv = engine.exec(container="c", argv=["python", "-V"], env_keys=["PATH", "TOKEN"], workdir=Path("/src"))
    assert exec_argv == [
        engine.binary,
        "exec",
        "--workdir",
        "/src",
        "--env",
        "PATH",
        "--env",
        "TOKEN",
        "c",
        "python",
        "-V",
    ]
    assert "secret" not in " ".join(exec_argv)  # values travel in the environment only


def test_remove_and_image_commands_differ_where_the_engines_do() -> None:
    assert DOCKER.remove("c") == ["/usr/bin/docker", "rm", "--force", "c"]
    assert PODMAN.remove("c") == ["/usr/bin/podman", "rm", "--force", "--time", "0", "c"]
    assert PODMAN.image_id("t") == ["/usr/bin/podman", "image", "inspect", "--format", "{{.Id}}", "t"]
    assert DOCKER.image_id("t") == ["/usr/bin/docker", "image", "inspect", "--format", "{{.Id}}", "t"]
    build = DOCKER.build(
        tag="t",
        containerfile=Path("/r/containers/builder/Containerfile"),
        context=Path("/r/containers/builder"),
        build_args={"B": "2", "A": "1"},
    )
    assert build == ["/usr/bin/docker", "build", "--tag", "t", "--file", "/r/containers/builder/Containerfile",
                     "--network", "host", "--build-arg", "A=1", "--build-arg", "B=2",
                     "/r/containers/builder"]  # fmt: skip
    assert DOCKER.import_rootfs(tarball=Path("/tmp/r.tar"), tag="b") == ["/usr/bin/docker", "import", "/tmp/r.tar", "b"]
    assert DOCKER.containers("cpu-py311") == [
        "/usr/bin/docker",
        "ps",
        "--all",
        "--filter",
        "label=wheelmill.cell=cpu-py311",
        "--format",
        "{{.Names}}",
    ]


def answering(*names: str) -> Probe:
    def probe(argv: Sequence[str | Path]) -> Captured:
        binary = str(argv[0])
        ok = any(binary.endswith(n) for n in names)
        return Captured(
            returncode=0 if ok else 1,
            stdout="linux\n" if ok else "",
            stderr="" if ok else "Cannot connect to the Docker daemon",
        )

    return probe


def test_auto_takes_the_engine_that_answers() -> None:
    which = {"docker": "/usr/bin/docker", "podman": "/usr/bin/podman"}.get
    assert detect("auto", which=which, probe=answering("podman")) == PODMAN
    assert detect("auto", which=which, probe=answering("docker")) == DOCKER
    assert detect("auto", which=which, probe=answering()) is None
    assert detect("none", which=which, probe=answering("podman")) is None


def test_a_named_engine_that_does_not_answer_is_a_clear_error() -> None:
    which = {"docker": "/usr/bin/docker"}.get
    with pytest.raises(PrecheckError, match="docker: installed, but no engine answers"):
        detect("docker", which=which, probe=answering())
    with pytest.raises(PrecheckError, match="podman: not installed"):
        detect("podman", which=which, probe=answering())
    with pytest.raises(UsageError):
        detect("lxc", which=which, probe=answering())


def test_a_rootless_engine_needs_the_tun_device_for_a_network_of_its_own(tmp_path: Path) -> None:
    """The images' two-node tier makes an engine network: rootless, the engine's user-mode
    stack opens /dev/net/tun as the user, and where it cannot the reason is one line (a
    root engine, or a device the user opens, needs nothing)."""
    tun = tmp_path / "tun"
    tun.write_bytes(b"")
    tun.chmod(0o600)
    rootless = Engine(name=EngineName.PODMAN, binary="podman", rootless=True)
    assert PODMAN.network_access(tmp_path / "absent") is None
    assert rootless.network_access(tun, can_open=lambda _path: True) is None
    said = rootless.network_access(tun, can_open=lambda _path: False)
    assert said == f"rootless podman gives a container a network through {tun}, which this user cannot open (mode 0600)"
    assert "which this machine lacks" in str(rootless.network_access(tmp_path / "absent"))


def test_a_rootless_store_on_vfs_is_a_warning_that_says_how_to_get_overlay() -> None:
    """Debian's podman 4.3 with no storage.conf gives every user vfs, which copies a whole
    image for each container; the build warns and goes on. Root's store, or overlay, is quiet."""
    said = "linux true vfs\n"
    probe: Probe = lambda argv: Captured(returncode=0, stdout=said, stderr="")  # noqa: E731
    rootless = detect("podman", which={"podman": "/usr/bin/podman"}.get, probe=probe)
    assert rootless == Engine(name=EngineName.PODMAN, binary="/usr/bin/podman", rootless=True, storage="vfs")
    (warning,) = store_checks(rootless)
    assert (warning.name, warning.verdict) == ("image-store", "warn")
    assert "rootless podman keeps its images with vfs" in warning.detail
    assert "containers-storage" in str(warning.fix) and "podman system reset" in str(warning.fix)
    assert store_checks(replace(rootless, storage="overlay")) == []
    assert store_checks(replace(rootless, rootless=False)) == [], "root's store is not this check's"
    docker = Engine(name=EngineName.DOCKER, binary="docker", rootless=True, storage="vfs")
    assert "overlay2" in str(store_checks(docker)[0].fix)


@pytest.fixture(scope="module")
def pins() -> Pins:
    return load_pins(ROOT / "containers" / "pins.toml")


@pytest.fixture(scope="module")
def matrix() -> Matrix:
    return load_matrix(ROOT / "recipes" / "matrix.toml")


def test_unpinned_registry_bases_fall_back_to_the_bootstrapped_one(pins: Pins, matrix: Matrix) -> None:
    cpu = choose(pins, matrix.variants["cpu"], "3.11", containers=ROOT / "containers", policy="auto")
    assert cpu.base.kind is BaseKind.BOOTSTRAP and cpu.base.suite == "bullseye"
    assert cpu.containerfile == ROOT / "containers" / "builder" / "Containerfile"
    cuda = choose(pins, matrix.variants["cuda130"], "3.11", containers=ROOT / "containers", policy="auto")
    assert cuda.base.suite == "bookworm"  # torch 2.14 needs gcc >= 11
    # An unpinned registry base is planned (a plan runs nothing), and refused when built.
    forced = choose(pins, matrix.variants["cpu"], "3.11", containers=ROOT / "containers", policy="registry")
    assert "not pinned by digest" in forced.describe()
    with pytest.raises(ConfigError, match="not pinned by digest"):
        require_pinned(forced)
    with pytest.raises(ConfigError, match="rocm"):
        require_pinned(choose(pins, matrix.variants["rocm62"], "3.11", containers=ROOT / "containers", policy="auto"))
    with pytest.raises(ConfigError, match=r"no pinned CPython source for 3\.14"):
        choose(pins, matrix.variants["cpu"], "3.14", containers=ROOT / "containers", policy="auto")


def test_every_python_of_the_matrix_has_a_cpython_source(pins: Pins, matrix: Matrix) -> None:
    assert set(matrix.pythons) <= set(pins.pythons)
    mirror = "http://mirror.example/debian"
    py39 = choose(pins, matrix.variants["cuda118"], "3.9", containers=ROOT / "containers", policy="auto")
    assert py39.build_args(mirror)["PYTHON_URL"] == f"{mirror}/pool/main/p/python3.9/python3.9_3.9.2.orig.tar.xz"
    py312 = choose(pins, matrix.variants["cpu"], "3.12", containers=ROOT / "containers", policy="auto")
    assert py312.build_args(mirror)["PYTHON_URL"].endswith("/Python-3.12.12.tar.xz")  # no Debian suite has 3.12
    assert not py312.build_args(mirror)["PYTHON_URL"].startswith(mirror)


def test_a_manylinux_base_needs_no_cpython_pin(pins: Pins, matrix: Matrix) -> None:
    digest = "sha256:" + "a" * 64
    pinned = replace(
        pins, bases={**pins.bases, "manylinux_2_28": replace(pins.bases["manylinux_2_28"], digest=digest)}, pythons={}
    )
    image = choose(pinned, matrix.variants["cuda130"], "3.12", containers=ROOT / "containers", policy="auto")
    assert image.containerfile.parent.name == "manylinux" and image.base.reference.endswith("@" + digest)
    assert image.build_args("http://mirror.example/debian") == {
        "BASE": image.base.reference,
        "PYTHON_VERSION": "3.12",
        "PYTHON_URL": "",
        "PYTHON_SHA256": "",
    }


def test_image_tag_follows_definition_pins_and_base(pins: Pins, matrix: Matrix, tmp_path: Path) -> None:
    image = choose(pins, matrix.variants["cpu"], "3.11", containers=ROOT / "containers", policy="auto")
    tag = image.tag("sha256:base1")
    assert tag.startswith("localhost/wheelmill-builder:builder-py311-")
    assert tag == image.tag("sha256:base1")
    assert tag != image.tag("sha256:base2")
    changed = tmp_path / "builder" / "Containerfile"
    changed.parent.mkdir()
    changed.write_text(image.containerfile.read_text() + "\n# changed\n")
    other = choose(pins, matrix.variants["cpu"], "3.11", containers=tmp_path, policy="auto")
    assert other.tag("sha256:base1") != tag


def test_debian_mirror_comes_from_settings_or_apt(tmp_path: Path) -> None:
    assert (
        debian_mirror(
            Settings.from_environ({"WHEELMILL_DEBIAN_MIRROR": "http://m.example/debian/"}).debian_mirror, tmp_path
        )
        == "http://m.example/debian"
    )
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://deb.example/debian-security\n\n"
        "Types: deb\nURIs: http://deb.example/debian\nSuites: bookworm\n"
    )
    assert debian_mirror(Settings.from_environ({}).debian_mirror, tmp_path) == "http://deb.example/debian"
    with pytest.raises(PrecheckError, match="no Debian mirror"):
        debian_mirror(Settings.from_environ({}).debian_mirror, tmp_path / "nothing")


@pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        ('digest = ""', 'digest = "sha256:xyz"', r"bases\.manylinux_2_28\.digest: 'sha256:xyz' is not sha256:<64 hex>"),
        (
            'path = "pool/main/p/python3.9/',
            'url = "https://m.example/x"\npath = "pool/main/p/python3.9/',
            r'pythons\."3\.9": give exactly one of path',
        ),
        (
            'url = "https://www.python.org/ftp/python/3.10.19/Python-3.10.19.tar.xz"',
            "",
            r'pythons\."3\.10": give exactly one of path',
        ),
        (
            'url = "https://www.python.org/ftp/',
            'url = "ftp://www.python.org/ftp/',
            r'pythons\."3\.10"\.url: .* is not an http\(s\) URL',
        ),
        ('sha256 = "3c2034c5', 'sha256 = "3c2034c', r'pythons\."3\.9"\.sha256: not 64 hex digits'),
        (
            '\nglibc = "2.28"',
            '\nglibc = "manylinux_2_28"',
            r"bases\.manylinux_2_28\.glibc: 'manylinux_2_28' is not a glibc",
        ),
        ('bookworm = "2.36"', 'bookworm = "2.36.1"', r"bootstrap\.glibc\.bookworm: '2\.36\.1' is not a glibc"),
    ],
)
def test_bad_pins_are_one_line_errors(tmp_path: Path, old: str, new: str, says: str) -> None:
    text = (ROOT / "containers" / "pins.toml").read_text()
    assert old in text
    bad = tmp_path / "pins.toml"
    bad.write_text(text.replace(old, new, 1))
    with pytest.raises(ConfigError, match=says) as caught:
        load_pins(bad)
    assert str(caught.value).startswith(str(bad)) and caught.value.fix


@pytest.mark.parametrize(
    ("old", "new", "variant", "says"),
    [
        ('\nglibc = "2.28"\n', "\n", "cpu", r"bases\.manylinux_2_28\.glibc: missing"),
        ('bookworm = "2.36"\n', "", "cuda130", r"bootstrap\.glibc: no glibc for Debian bookworm"),
    ],
)
def test_a_base_without_its_glibc_is_refused_not_guessed(
    tmp_path: Path, matrix: Matrix, old: str, new: str, variant: str, says: str
) -> None:
    """The glibc of a base is the promise of every wheel built on it: none is assumed."""
    text = (ROOT / "containers" / "pins.toml").read_text()
    assert old in text
    (tmp_path / "pins.toml").write_text(text.replace(old, new, 1))
    pins = load_pins(tmp_path / "pins.toml")
    with pytest.raises(ConfigError, match=says) as caught:
        baselines(pins, matrix.variants[variant])
    assert caught.value.fix and "glibc" in caught.value.fix


def test_a_base_gives_the_baseline_of_its_glibc(pins: Pins, matrix: Matrix) -> None:
    cpu, rocm, arm = (matrix.variants[name] for name in ("cpu", "rocm62", "cpu-aarch64"))
    assert choose_base(pins, cpu, policy="bootstrap").baseline == "manylinux_2_31"  # bullseye
    assert choose_base(pins, cpu, policy="registry").baseline == "manylinux_2_28"  # the manylinux_2_28 image
    assert choose_base(pins, rocm, policy="auto").baseline == "manylinux_2_35"  # Ubuntu 22.04
    assert baselines(pins, rocm) == Baselines(registry="manylinux_2_35", bootstrap=None)
    assert baselines(pins, arm) == Baselines(registry=None, bootstrap="manylinux_2_36")


def test_an_image_build_failure_says_what_the_containerfile_said() -> None:
    tail = [
        "STEP 7/9: RUN apt-get update -qq && ...",
        "curl: (7) Failed to connect to 127.0.0.1 port 9: Connection refused",
        (
            "wheelmill: cannot download CPython 3.12 from http://127.0.0.1:9/P.tar.xz; "
            "fix: mirror it and set its url in containers/pins.toml"
        ),
        'Error: building at STEP "RUN apt-get update": exit status 1',
    ]
    error = image_build_failure(
        "localhost/wheelmill-builder:builder-py312-abc", CommandFailed(["podman", "build"], 1, Path("image.log"), tail)
    )
    assert (
        str(error)
        == "building localhost/wheelmill-builder:builder-py312-abc failed: cannot download CPython 3.12 from http://127.0.0.1:9/P.tar.xz"
    )
    assert error.fix == "mirror it and set its url in containers/pins.toml"
    other = image_build_failure("t", CommandFailed(["podman", "build"], 1, Path("image.log"), tail[:2]))
    assert (
        str(other) == "building t failed: curl: (7) Failed to connect to 127.0.0.1 port 9: Connection refused"
        and other.fix == "read image.log"
    )


def lock_inputs(matrix: Matrix, recipes: Mapping[str, Recipe], cell: Cell) -> LockInputs:
    return inputs(matrix, resolve_all(recipes, cell), cell)


def test_lock_inputs_cover_every_recipe_of_the_cell(matrix: Matrix) -> None:
    recipes = load_recipes(ROOT / "recipes")
    lock = lock_inputs(matrix, recipes, matrix.cell("cuda130-py311"))
    assert lock.target.platform == "x86_64-manylinux_2_28" and lock.target.python == "3.11"
    assert "torch==2.14.1" in lock.requirements and "nvidia-cuda-nvcc==13.0.88" in lock.requirements
    assert lock.digest == lock_inputs(matrix, recipes, matrix.cell("cuda130-py311")).digest
    assert lock.digest != lock_inputs(matrix, recipes, matrix.cell("cuda130-py312")).digest
    assert lock.header().startswith(f"# wheelmill lock of cuda130-py311; inputs sha256:{lock.digest}")


def test_a_slim_cell_shares_its_parents_lock_and_image(matrix: Matrix, capsys: pytest.CaptureFixture[str]) -> None:
    """cuda130-sm90-py311 builds in cuda130-py311's env: the same inputs, the same file,
    which `wheelmill lock --check` checks once; and on the same builder image."""
    recipes = load_recipes(ROOT / "recipes")
    slim, parent = matrix.cell("cuda130-sm90-py311"), matrix.cell("cuda130-py311")
    assert (
        lock_inputs(matrix, recipes, slim) == lock_inputs(matrix, recipes, parent)
        and lock_inputs(matrix, recipes, slim).cell == "cuda130-py311"
    )
    pins = load_pins(ROOT / "containers" / "pins.toml")
    for policy in ("bootstrap", "auto"):
        assert choose(pins, slim.variant, "3.11", containers=ROOT / "containers", policy=policy) == choose(
            pins, parent.variant, "3.11", containers=ROOT / "containers", policy=policy
        )
    assert main(["--recipes", str(ROOT / "recipes"), "lock", "--check", "--cell", "cuda130-*py311"]) == 0
    out = capsys.readouterr().out
    assert out.count("locks/cuda130-py311.txt: matches its inputs") == 1
    # cuda130-torch2.12-py311 and its slim cell: another torch, a lock of their own, not committed;
    # the four aarch64 twins (cuda130-aarch64-py311, ...): another platform, likewise
    assert "1 committed locks match their inputs; 6 cells resolve theirs at build time" in out


def test_a_build_sees_its_cell_at_a_fixed_path_and_the_host_finds_it_back(tmp_path: Path) -> None:
    """The cell root, mounted a second time at /wheelmill: build paths are named there (the
    same in every cell and output root), and what a command names there is found here."""
    cell_root = tmp_path / "out" / "cuda130-py311"
    stable = Mount(source=cell_root, target=Path("/wheelmill"), readonly=False)
    log = StepLog(tmp_path / "log")
    container = Container(
        PODMAN, cell="cuda130-py311", image="i", mounts=[], log=log, same_path=[tmp_path / "out"], stable=stable
    )
    log.close()
    assert container.stable_path(cell_root / "src" / "x" / "a.cu") == Path("/wheelmill/src/x/a.cu")
    # shared by cells: as it is
    assert container.stable_path(tmp_path / "out" / ".cache") == tmp_path / "out" / ".cache"
    assert (
        container.host_path(Path("/wheelmill/envs/build/bin/python")) == cell_root / "envs" / "build" / "bin" / "python"
    )
    assert container.host_path(cell_root / "dist") == cell_root / "dist"


def test_the_build_environment_names_the_cells_paths_as_the_build_sees_them(tmp_path: Path) -> None:
    """PATH, CUDA_HOME, the nvidia-* wheels' headers and the prefix maps all name the fixed
    path: nothing of the output root reaches a compiler's command line."""
    matrix = load_matrix(ROOT / "recipes" / "matrix.toml")
    cell = matrix.cell("cuda130-py311")
    spec = plan_cell(matrix, load_recipes(ROOT / "recipes"), cell, ["example-cuda-ops"], Settings()).recipe(
        "example-cuda-ops"
    )
    root = tmp_path / "out" / cell.id
    env = Env(root=root / "envs" / "build")
    (env.root / "lib" / "python3.11" / "site-packages" / "nvidia" / "cu13" / "include").mkdir(parents=True)
    nvcc_root = env.root / "lib" / "python3.11" / "site-packages" / "nvidia" / "cu13"
    toolkit = Toolkit(family=Family.CUDA, root=nvcc_root, version="13.0", compiler=nvcc_root / "bin" / "nvcc")

    def stable(path: Path) -> Path:
        return Path("/wheelmill") / path.relative_to(root) if path.is_relative_to(root) else path

    made = build_environment(spec, {}, env=env, cell_root=root, toolkit=toolkit, jobs=2, stable=stable)
    assert made["CUDA_HOME"] == "/wheelmill/envs/build/site/nvidia/cu13"
    assert made["CPATH"] == "/wheelmill/envs/build/site/nvidia/cu13/include"
    assert made["PATH"].startswith("/wheelmill/envs/build/bin:/wheelmill/envs/build/site/nvidia/cu13/bin:")
    assert made["PYTHONPATH"] == "/wheelmill/envs/build/site"
    assert str(tmp_path) not in " ".join(made.values())


def test_in_a_container_every_python_of_a_variant_gets_the_same_compiler_flags_and_paths(tmp_path: Path) -> None:
    """What the compiler cache hashes (flags, prefix maps, the toolkit) and the paths the
    compilers see hold no Python version: the env's site-packages is reached through its
    site link, and the image's Python is not mapped (the image fixes where it is)."""
    matrix = load_matrix(ROOT / "recipes" / "matrix.toml")
    recipes = load_recipes(ROOT / "recipes")
    made = []
    for python, home in (("3.11", "/usr/bin"), ("3.13", "/opt/python/3.13/bin")):
        cell = matrix.cell(f"cuda130-py{python.replace('.', '')}")
        spec = plan_cell(matrix, recipes, cell, ["example-cuda-ops"], Settings()).recipe("example-cuda-ops")
        root = tmp_path / "out" / cell.id
        env = Env(root=root / "envs" / "build")
        nvcc_root = env.root / "lib" / f"python{python}" / "site-packages" / "nvidia" / "cu13"
        (nvcc_root / "include").mkdir(parents=True)
        (env.root / "pyvenv.cfg").write_text(f"home = {home}\n")
        toolkit = Toolkit(family=Family.CUDA, root=nvcc_root, version="13.0", compiler=nvcc_root / "bin" / "nvcc")

        def stable(path: Path, root: Path = root) -> Path:
            return Path("/wheelmill") / path.relative_to(root) if path.is_relative_to(root) else path

        made.append(build_environment(spec, {}, env=env, cell_root=root, toolkit=toolkit, jobs=2, stable=stable))
    for key in ("CFLAGS", "CXXFLAGS", "NVCC_APPEND_FLAGS", "CUDA_HOME", "CPATH", "PATH", "PYTHONPATH"):
        assert made[0][key] == made[1][key], key
    assert "/python" not in made[0]["CFLAGS"] and "python3" not in " ".join(made[0].values())


def test_the_site_link_names_the_envs_site_packages_relatively_once(tmp_path: Path) -> None:
    env = Env(root=tmp_path / "build")
    assert link_site(env) is None  # no site-packages: nothing to link
    (env.root / "lib" / "python3.13" / "site-packages" / "torch").mkdir(parents=True)
    assert link_site(env) == env.site and link_site(env) == env.site  # made once, kept
    assert env.site.readlink() == Path("lib/python3.13/site-packages")  # relative: the container sees it too
    assert (env.site / "torch").is_dir()


def test_a_cell_that_yields_the_cores_gets_containers_of_a_lower_cpu_weight(tmp_path: Path) -> None:
    """Started while the run's cell before it runs, a cell's container weighs 128 against
    the default 1024 (a nice value inside it would not count against another container);
    otherwise the engine's default. The engine here is a script that records its argv."""
    calls = tmp_path / "calls"
    engine = tmp_path / "engine"
    # a root it can see
    engine.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nif [ "$1" = inspect ]; then echo {os.getpid()}; fi\n')
    engine.chmod(0o755)
    podman = Engine(name=EngineName.PODMAN, binary=str(engine))
    with StepLog(tmp_path / "log") as log:
        with yielding(lambda: True), Container(podman, cell="c", image="i", mounts=[], log=log):
            pass
        with yielding(lambda: False), Container(podman, cell="c", image="i", mounts=[], log=log):
            pass
    runs = [line for line in calls.read_text().splitlines() if line.startswith("run ")]
    assert len(runs) == 2 and " --cpu-shares 128 " in runs[0] and "--cpu-shares" not in runs[1], runs


def test_a_command_in_the_container_keeps_the_engines_session_outside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A probe given only PATH for inside the container: podman itself still runs with the
    session's variables (rootless podman finds its containers under XDG_RUNTIME_DIR), and
    only PATH goes inside."""
    import wheelmill.machine.container as container_module  # noqa: PLC0415 - its capture is replaced

    seen: list[tuple[list[str], Mapping[str, str]]] = []

    def fake(argv: Sequence[str], *, env: Mapping[str, str], timeout: float) -> Captured:
        seen.append((list(argv), dict(env)))
        return Captured(returncode=0, stdout="/usr/bin/c++\n", stderr="")

    monkeypatch.setattr(container_module, "capture", fake)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1001")
    log = StepLog(tmp_path / "log")
    container = Container(PODMAN, cell="c", image="i", mounts=[], log=log)
    log.close()
    container.capture(["sh", "-c", "command -v c++"], env={"PATH": "/usr/bin:/bin"})
    ((argv, env),) = seen
    assert env["XDG_RUNTIME_DIR"] == "/run/user/1001" and env["PATH"] == "/usr/bin:/bin"
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--env"] == ["PATH"]
