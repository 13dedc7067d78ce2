"""Build keys: every input of a build changes its key, the same inputs (wherever the clone
is) give the same key, a dependency's change reaches what depends on it and nothing else;
the channel lists each built wheel's keys; and the pipeline does not run what is published."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.channels import pages_dir, stored_file, tree_channel
from tests.ports import free_port
from tests.wheels import make_wheel
from wheelmill.building.context import RunContext, StepContext
from wheelmill.building.pipeline import blocked, host
from wheelmill.building.plan import REBUILD_ALL, Options, plan_cell
from wheelmill.building.products import BuildKeys, PublishedBuild
from wheelmill.building.report import CellReport, Done, StepRecord
from wheelmill.building.steps.keys import build_keys_step
from wheelmill.checks import CheckResult, Verdict
from wheelmill.errors import FetchError, IntegrityError, SelectionError
from wheelmill.index.channels import built_by_key
from wheelmill.index.roots import problems, publish, set_yanked
from wheelmill.index.serve import make_server
from wheelmill.inputs.matrix import load_matrix
from wheelmill.inputs.recipes import GitSource, SdistSource, load_recipes
from wheelmill.machine.process import StepLog
from wheelmill.output.layout import CellLayout
from wheelmill.output.report import Status, WheelRecord
from wheelmill.planning import buildkey
from wheelmill.planning.buildkey import build_keys, left_out, plain, tree_hash
from wheelmill.planning.spec import CellPlan, Step, StepKind
from wheelmill.retry import RetryPolicy
from wheelmill.settings import Settings

ROOT = Path(__file__).resolve().parent.parent.parent
HOST = {"host": {"compiler": ["/usr/bin/c++", "12.2.0"]}}


def cell_plan(repo: Path, cell: str = "cpu-py311", names: tuple[str, ...] = (), **options: object) -> CellPlan:
    matrix = load_matrix(repo / "recipes" / "matrix.toml")
    recipes = load_recipes(repo / "recipes")
    chosen = Options(locks_dir=repo / "locks", **options)  # type: ignore[arg-type]
    return plan_cell(matrix, recipes, matrix.cell(cell), list(names), Settings(), chosen)


def digests(plan: CellPlan, builder: dict[str, object] | None = None) -> dict[str, str]:
    return {name: key.digest for name, key in build_keys(plan, builder or HOST).items()}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the repository's data and example extensions, to change."""
    for part in ("recipes", "extensions", "locks"):
        shutil.copytree(
            ROOT / part,
            tmp_path / "project" / part,
            ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"),
        )
    return tmp_path / "project"


def test_the_same_inputs_give_the_same_key_wherever_the_clone_is(project: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "deeper" / "other"
    shutil.copytree(project, elsewhere)
    assert digests(cell_plan(project)) == digests(cell_plan(project)) == digests(cell_plan(elsewhere))
    assert len(set(digests(cell_plan(project)).values())) == len(cell_plan(project).recipes), "each recipe its own key"


def test_a_changed_source_file_changes_its_recipe_key_and_nothing_else(project: Path) -> None:
    before = digests(cell_plan(project))
    source = project / "extensions" / "cpp-ops" / "csrc"
    changed = next(p for p in sorted(source.rglob("*")) if p.is_file())
    changed.write_text(changed.read_text() + "\n// a comment\n")
    after = digests(cell_plan(project))
    assert after["example-cpp-ops"] != before["example-cpp-ops"]
    assert after["torchsort"] == before["torchsort"]


def test_what_fetch_leaves_out_is_no_part_of_the_key(project: Path) -> None:
    tree = project / "extensions" / "cpp-ops"
    before = tree_hash(tree)
    for ignored in ("build/lib/x.o", "__pycache__/m.cpython-311.pyc", "example_cpp_ops.egg-info/PKG-INFO", "_C.so"):
        (tree / ignored).parent.mkdir(parents=True, exist_ok=True)
        (tree / ignored).write_bytes(b"output")
    assert tree_hash(tree) == before
    (tree / "setup.py").chmod(0o755)
    assert tree_hash(tree) != before, "the executable bit is part of a tree"


def test_a_build_folder_below_the_root_is_source(project: Path) -> None:
    """``build`` and ``dist`` are outputs at the source's root only: a package of that name
    deeper down is code, part of the key and of what fetch copies."""
    tree = project / "extensions" / "cpp-ops"
    before = tree_hash(tree)
    (tree / "example_cpp_ops" / "build").mkdir(parents=True)
    (tree / "example_cpp_ops" / "build" / "__init__.py").write_text("STEPS = 1\n")
    assert tree_hash(tree) != before
    copied = project / "copied"
    shutil.copytree(tree, copied, ignore=left_out(tree))
    assert (copied / "example_cpp_ops" / "build" / "__init__.py").is_file()
    assert tree_hash(copied) == tree_hash(tree)


def test_every_input_changes_the_key(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = cell_plan(project)
    base = digests(plan)["example-cpp-ops"]
    spec = plan.recipe("example-cpp-ops")

    def with_spec(**changes: object) -> CellPlan:
        return replace(plan, recipes=tuple(replace(r, **changes) if r.name == spec.name else r for r in plan.recipes))  # type: ignore[arg-type]

    patch = project / "recipes" / "patches" / "extra.patch"
    patch.write_text("--- a/x\n+++ b/x\n")
    variant = replace(plan.cell.variant, torch="2.13.1")
    changed = {
        "source (sdist)": digests(with_spec(source=SdistSource(project="p", version="1", sha256="a" * 64))),
        "source (git commit)": digests(with_spec(source=GitSource(url="https://example.org/x", rev="b" * 40))),
        "patches": digests(with_spec(patches=(patch,))),
        "recipe": digests(with_spec(env={"MY_FLAG": "1"})),
        "lock inputs": digests(replace(plan, lock=replace(plan.lock, requirements=(*plan.lock.requirements, "extra")))),
        "builder": digests(plan, {"image": {"definition": "0" * 64}}),
        "variant": digests(replace(plan, cell=replace(plan.cell, variant=variant))),
    }
    with monkeypatch.context() as m:
        m.setattr(buildkey, "__version__", "99.0")
        buildkey.wheelmill_identity.cache_clear()
        changed["wheelmill version"] = digests(plan)
    code = shutil.copytree(
        Path(buildkey.__file__).parents[1], project / "wheelmill-changed", ignore=shutil.ignore_patterns("__pycache__")
    )
    step = code / "building" / "steps" / "build.py"
    step.write_text(step.read_text() + "# a changed flag\n")
    with monkeypatch.context() as m:
        m.setattr(buildkey, "__file__", str(code / "planning" / "buildkey.py"))
        buildkey.wheelmill_identity.cache_clear()
        changed["wheelmill code"] = digests(plan)
    buildkey.wheelmill_identity.cache_clear()
    assert digests(plan)["example-cpp-ops"] == base
    (project / "locks" / "cpu-py311.txt").write_text((project / "locks" / "cpu-py311.txt").read_text() + "# changed\n")
    changed["committed lock"] = digests(plan)
    assert {what: keys["example-cpp-ops"] for what, keys in changed.items() if keys["example-cpp-ops"] == base} == {}


def test_a_dependency_key_change_changes_its_dependents_and_nothing_else(project: Path) -> None:
    before = digests(cell_plan(project, "cuda130-py311"))
    assert set(before) == {"example-cpp-ops", "example-cuda-ops", "example-stable-ops", "torchsort"}
    (project / "extensions" / "cpp-ops" / "setup.py").write_text(
        (project / "extensions" / "cpp-ops" / "setup.py").read_text() + "\n"
    )
    after = digests(cell_plan(project, "cuda130-py311"))
    assert after["example-cpp-ops"] != before["example-cpp-ops"]
    assert after["example-cuda-ops"] != before["example-cuda-ops"], "it depends on example-cpp-ops"
    assert after["torchsort"] == before["torchsort"]
    (project / "extensions" / "cuda-ops" / "setup.py").write_text(
        (project / "extensions" / "cuda-ops" / "setup.py").read_text() + "\n"
    )
    last = digests(cell_plan(project, "cuda130-py311"))
    assert last["example-cuda-ops"] != after["example-cuda-ops"] and last["example-cpp-ops"] == after["example-cpp-ops"]


def test_an_unreadable_source_file_is_a_fetch_error_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "csrc").mkdir()
    (tmp_path / "csrc" / "ops.cpp").write_text("int x;\n")

    def denied(path: Path) -> str:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(buildkey, "sha256_of", denied)
    with pytest.raises(FetchError) as caught:
        tree_hash(tmp_path)
    assert caught.value.exit_code == 6
    assert caught.value.one_line().startswith(
        f"{tmp_path / 'csrc' / 'ops.cpp'}: cannot be read to key the source (Permission denied)"
    )
    assert "fix: make the source tree readable" in caught.value.one_line()


def test_a_path_is_never_part_of_a_key() -> None:
    with pytest.raises(TypeError, match="no part of a build key"):
        plain({"where": Path("somewhere")})


def test_every_recipe_in_every_cell_has_a_key(repo_root: Path) -> None:
    """No spec field holds a path or a value JSON cannot carry."""
    matrix, recipes = load_matrix(repo_root / "recipes" / "matrix.toml"), load_recipes(repo_root / "recipes")
    for cell in matrix.cells:
        names = [n for n, r in sorted(recipes.items()) if r.applies_to(cell)]
        plan = plan_cell(matrix, recipes, cell, names, Settings(), Options(locks_dir=repo_root / "locks"))
        assert len(build_keys(plan, HOST)) == len(names)


# The channel: keys listed beside each built wheel.


def test_the_channel_lists_a_built_wheel_by_its_keys(tmp_path: Path) -> None:
    channel = tree_channel(tmp_path / "index", "cpu")
    wheel = make_wheel(tmp_path / "dist", "example-cpp-ops", "0.1.0+cpu")
    publish(channel, wheel, build_key="k1")
    assert {key: entry.filename for key, (_project, entry) in built_by_key(channel).items()} == {"k1": wheel.name}
    # The same bytes from other inputs (an edited comment, a reproducible build): the
    # listing learns the key, the file stays as it is.
    mtime = stored_file(channel, wheel.name).stat().st_mtime_ns
    publish(channel, wheel, build_key="k2")
    assert set(built_by_key(channel)) == {"k1", "k2"}
    assert stored_file(channel, wheel.name).stat().st_mtime_ns == mtime
    assert problems(channel) == [], "the HTML link carries the same keys"
    page = pages_dir(channel) / "example-cpp-ops"
    assert '"_build-keys": [\n    "k1",\n    "k2"\n   ]' in (page / "index.json").read_text()
    assert 'data-build-keys="k1 k2"' in (page / "index.html").read_text()
    set_yanked(channel, "example-cpp-ops", "0.1.0+cpu", "bad")
    assert built_by_key(channel) == {}, "a yanked wheel answers for no key"


def test_a_mirrored_file_and_an_empty_channel_have_no_keys(tmp_path: Path) -> None:
    channel = tree_channel(tmp_path / "index", "cpu")
    assert built_by_key(channel) == {}
    publish(
        channel, make_wheel(tmp_path / "dist", "filelock", "3.0"), mirrored_from="https://example.org/filelock-3.0.whl"
    )
    assert built_by_key(channel) == {}


# The skip decision: blocked() in the pipeline.


def _report(plan: CellPlan, tmp_path: Path, published: tuple[str, ...]) -> CellReport:
    keys = build_keys(plan, HOST)
    channel = tree_channel(tmp_path / "index", plan.channel)
    hits = {}
    for name in published:
        wheel = make_wheel(tmp_path / "dist", name, "0.1.0+cpu")
        done = publish(channel, wheel, build_key=keys[name].digest)
        _project, entry = built_by_key(channel)[keys[name].digest]
        path = stored_file(channel, wheel.name)
        hits[name] = PublishedBuild(
            recipe=name,
            key=keys[name].digest,
            channel=channel.name,
            project=done.project,
            entry=entry,
            path=path,
            torch=None,
        )
    made = BuildKeys(channel=channel.name, keys=keys, published=hits)
    report = CellReport(plan=plan, path=tmp_path / "report.json")
    report.steps += [
        StepRecord(step=plan.steps[0], status=Status.OK),
        StepRecord(step=plan.steps[1], status=Status.OK, made=(made,)),
    ]
    return report


def _step(plan: CellPlan, kind: StepKind, recipe: str | None = None) -> Step:
    return next(s for s in plan.steps if s.kind is kind and s.recipe == recipe)


def test_a_published_recipe_does_not_run_and_stands_for_its_wheel(project: Path, tmp_path: Path) -> None:
    plan = cell_plan(project, names=("example-cpp-ops", "torchsort"))
    assert [s.kind for s in plan.steps[:2]] == [StepKind.PRE_CHECKS, StepKind.BUILD_KEYS]
    report = _report(plan, tmp_path, ("example-cpp-ops",))
    stop = blocked(_step(plan, StepKind.FETCH, "example-cpp-ops"), plan, report)
    assert (
        stop is not None and stop.status is Status.PUBLISHED and "published: example_cpp_ops-0.1.0+cpu" in stop.reason
    )
    (wheel,) = [m for m in stop.made if isinstance(m, WheelRecord)]
    assert Path(wheel.path) == stored_file(
        tree_channel(tmp_path / "index", "cpu"), "example_cpp_ops-0.1.0+cpu-cp311-cp311-linux_x86_64.whl"
    ), "the channel's own file"
    assert blocked(_step(plan, StepKind.FETCH, "torchsort"), plan, report) is None
    assert blocked(_step(plan, StepKind.PREPARE_ENV), plan, report) is None, "torchsort is to be built"
    assert blocked(_step(plan, StepKind.CLOSURE), plan, report) is None


def test_when_every_recipe_is_published_the_build_steps_of_the_cell_do_not_run(project: Path, tmp_path: Path) -> None:
    plan = cell_plan(project, names=("example-cpp-ops", "torchsort"))
    report = _report(plan, tmp_path, ("example-cpp-ops", "torchsort"))
    for kind in (StepKind.PREPARE_ENV, StepKind.ENV_CHECKS, StepKind.CLOSURE, StepKind.MIRROR, StepKind.CHANNEL_CHECKS):
        stop = blocked(_step(plan, kind), plan, report)
        assert stop is not None and stop.status is Status.PUBLISHED and "nothing to build" in stop.reason, kind


def test_a_published_dependency_is_no_failure_and_gives_its_wheel_to_what_depends_on_it(
    project: Path, tmp_path: Path
) -> None:
    plan = cell_plan(project, "cuda130-py311", names=("example-cuda-ops",))
    report = _report(plan, tmp_path, ("example-cpp-ops",))
    for step in (s for s in plan.steps if s.recipe == "example-cpp-ops"):
        stop = blocked(step, plan, report)
        assert stop is not None
        report.steps.append(StepRecord(step=step, status=stop.status, error=stop.reason, made=stop.made))
    assert blocked(_step(plan, StepKind.PREPARE_ENV), plan, report) is None
    assert blocked(_step(plan, StepKind.BUILD, "example-cuda-ops"), plan, report) is None
    given = report.done.get(WheelRecord, "example-cpp-ops")
    assert Path(given.path) == stored_file(tree_channel(tmp_path / "index", "cu130"), given.name), "cu130's file"
    assert report.recipe_status("example-cpp-ops") is Status.PUBLISHED


def test_a_failure_still_blocks_and_rebuild_publishes_nothing_as_found(project: Path, tmp_path: Path) -> None:
    plan = cell_plan(project, names=("example-cpp-ops", "torchsort"))
    report = _report(plan, tmp_path, ())
    report.steps.append(StepRecord(step=_step(plan, StepKind.FETCH, "example-cpp-ops"), status=Status.FAILED))
    stop = blocked(_step(plan, StepKind.BUILD, "example-cpp-ops"), plan, report)
    assert stop is not None and stop.status is Status.SKIPPED
    assert blocked(_step(plan, StepKind.FETCH, "torchsort"), plan, report) is None
    rebuild = cell_plan(project, names=("example-cpp-ops",), rebuild=(REBUILD_ALL,))
    assert rebuild.rebuild == {"example-cpp-ops"} and "--rebuild" in _step(rebuild, StepKind.BUILD_KEYS).detail


def test_a_build_that_publishes_nothing_looks_up_its_keys_too(project: Path) -> None:
    """A CI job builds with --no-publish and publishes afterwards: it builds nothing that was
    published before either."""
    assert StepKind.BUILD_KEYS in {s.kind for s in cell_plan(project, publish=False).steps}


def _run_keys_step(
    plan: CellPlan,
    tmp_path: Path,
    *,
    served_index: str | None = None,
    retry: RetryPolicy | None = None,
    checks: list[CheckResult] | None = None,
) -> BuildKeys:
    settings = Settings(output=tmp_path / "wheels", served_index=served_index, retry=retry or RetryPolicy())
    run = RunContext(
        plan=plan,
        settings=settings,
        layout=CellLayout(output=settings.output, cell=plan.cell.id),
        engine=None,
        on_line=lambda _line: None,
    )
    (tmp_path / "logs").mkdir(parents=True, exist_ok=True)
    with StepLog(tmp_path / "logs" / "build-keys.log") as log:
        ctx = StepContext(
            run=run,
            where=host(settings, settings.env_backend),
            done=Done([]),
            log=log,
            hold=lambda manager: manager.__enter__(),
        )
        outcome = build_keys_step(ctx)
    (made,) = outcome.made
    assert isinstance(made, BuildKeys)
    if checks is not None:
        checks.extend(outcome.checks)
    return made


def test_the_step_finds_what_the_channel_lists_for_the_key_unless_rebuild(project: Path, tmp_path: Path) -> None:
    plan = cell_plan(project, names=("example-cpp-ops", "torchsort"))
    first = _run_keys_step(plan, tmp_path)
    assert first.published == {} and not first.nothing_to_build
    wheel = make_wheel(tmp_path / "dist", "example-cpp-ops", "0.1.0+cpu", requires=["torch==2.13.0+cpu"])
    channel = tree_channel(tmp_path / "wheels" / "index", "cpu")
    publish(channel, wheel, build_key=first.keys["example-cpp-ops"].digest)
    again = _run_keys_step(plan, tmp_path)
    assert again.keys == first.keys, "the host's toolchain is asked the same"
    assert (
        set(again.published) == {"example-cpp-ops"} and again.published["example-cpp-ops"].entry.filename == wheel.name
    )
    delivered = again.published["example-cpp-ops"].path
    assert delivered == tmp_path / "wheels" / "cpu-py311" / "dist" / wheel.name, (
        "linked into dist/, where reports are read with their wheels"
    )
    assert delivered.stat().st_ino == stored_file(channel, wheel.name).stat().st_ino
    assert again.facts()["torch"] == {"version": "2.13.0+cpu"}, "the torch it pins, where no env checks run"
    assert _run_keys_step(replace(plan, rebuild=frozenset({"example-cpp-ops", "torchsort"})), tmp_path).published == {}
    assert set(_run_keys_step(replace(plan, rebuild=frozenset({"torchsort"})), tmp_path).published) == {
        "example-cpp-ops"
    }, "only what it names"
    assert _run_keys_step(replace(plan, rebuild=frozenset({"example-cpp-ops"})), tmp_path).published == {}


def test_rebuild_names_recipes_of_the_build_and_nothing_else(project: Path) -> None:
    """``--rebuild NAME`` builds that one again and looks the rest up; a name this build
    does not have is a selection error naming what it builds, not a silent no-op."""
    plan = cell_plan(project, names=("example-cpp-ops", "torchsort"), rebuild=("torchsort",))
    assert plan.rebuild == {"torchsort"} and not plan.rebuilds_all
    assert cell_plan(project, names=("example-cpp-ops",), rebuild=(REBUILD_ALL,)).rebuilds_all
    assert not replace(plan, recipes=(), rebuild=frozenset()).rebuilds_all, (
        "a plan without recipes and --rebuild asks its channel"
    )
    detail = _step(plan, StepKind.BUILD_KEYS).detail
    assert "--rebuild torchsort: built even where channel cpu lists it, the rest looked up there" in detail
    with pytest.raises(SelectionError) as raised:
        cell_plan(project, names=("example-cpp-ops",), rebuild=("torchsort",))
    assert (
        "--rebuild torchsort: not a recipe of this build of cpu-py311 (it builds example-cpp-ops)"
        in raised.value.one_line()
    )
    assert "add --recipe torchsort" in raised.value.one_line()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """Runner A's index (a tree under its output root) served over loopback by wheelmill's
    index server: the index the team serves, as runner B reads it."""
    root = tmp_path / "a" / "index"
    root.mkdir(parents=True)
    server = make_server(root, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_key_listed_in_the_served_index_is_fetched_from_it_not_built(
    project: Path, tmp_path: Path, served: tuple[Path, str]
) -> None:
    """Runner B, with an empty index of its own, finds runner A's wheel by its build key in the
    served index, fetches it into its cell's build tree (its own bytes, not a link into A's
    tree), for its checks and install test, which deliver it to dist/; says where it came from;
    its local index stays empty."""
    root, url = served
    plan = cell_plan(project, names=("example-cpp-ops", "torchsort"))
    b = tmp_path / "b"
    keys = _run_keys_step(plan, b, served_index=url)
    assert keys.published == {}, "nothing served yet"
    wheel = make_wheel(tmp_path / "dist", "example-cpp-ops", "0.1.0+cpu", requires=["torch==2.13.0+cpu"])
    publish(tree_channel(root, "cpu"), wheel, build_key=keys.keys["example-cpp-ops"].digest)
    found = _run_keys_step(plan, b, served_index=url).published["example-cpp-ops"]
    assert found.status is Status.REUSED and found.reused_from == f"{url}/cpu/simple/"
    assert found.describe().startswith(f"reused: {wheel.name} from {url}/cpu/simple/ (build key ")
    assert (
        found.tested_here
        and found.path == b / "wheels" / "cpu-py311" / "build" / "example-cpp-ops" / "reused" / wheel.name
    )
    assert found.path.read_bytes() == wheel.read_bytes() and found.path.stat().st_ino != wheel.stat().st_ino
    assert found.repaired().wheel == found.path, "its checks after repair and its install test take it"
    assert not (b / "wheels" / "cpu-py311" / "dist").exists(), "its install test delivers it"
    assert not (b / "wheels" / "index" / "cpu").exists()
    assert found.torch == "2.13.0+cpu"


def test_a_served_file_whose_bytes_differ_from_its_listed_sha256_is_refused(
    project: Path, tmp_path: Path, served: tuple[Path, str]
) -> None:
    """The page's sha256 is checked: bytes that differ are an integrity error (exit 7), and
    nothing is left in dist/."""
    root, url = served
    plan = cell_plan(project, names=("example-cpp-ops",))
    b = tmp_path / "b"
    digest = _run_keys_step(plan, b, served_index=url).keys["example-cpp-ops"].digest
    wheel = make_wheel(tmp_path / "dist", "example-cpp-ops", "0.1.0+cpu")
    channel = tree_channel(root, "cpu")
    publish(channel, wheel, build_key=digest)
    stored = stored_file(channel, wheel.name)
    stored.unlink()  # a new file under the blob's name: bytes rewritten in place would reach its other names
    data = bytearray(wheel.read_bytes())
    data[len(data) // 2] ^= 0xFF
    stored.write_bytes(data)
    with pytest.raises(IntegrityError, match="sha256 mismatch") as caught:
        _run_keys_step(plan, b, served_index=url)
    assert caught.value.exit_code == 7
    assert not list((b / "wheels" / "cpu-py311").rglob("*.whl"))


def test_a_served_index_that_cannot_be_read_warns_and_the_recipes_are_built(project: Path, tmp_path: Path) -> None:
    plan = cell_plan(project, names=("example-cpp-ops",))
    checks: list[CheckResult] = []
    keys = _run_keys_step(
        plan, tmp_path, served_index=f"http://127.0.0.1:{free_port()}", retry=RetryPolicy(attempts=1), checks=checks
    )
    assert keys.published == {}
    (warning,) = [c for c in checks if c.verdict is Verdict.WARN]
    assert warning.name == "served-index" and "could not be read" in warning.detail
    assert "its recipes are built here" in warning.detail
