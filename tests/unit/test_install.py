"""The install test from the command line, in the sandbox: the import probe's interpreter runs
a smoke command of the env's Python after its checks (one import of torch, not two), as that
Python would run it on its own; any other smoke command runs beside the probe."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CliRunner
from tests.sandbox import Sandbox, assert_recorded, build
from wheelmill.building.context import Outcome, StepContext
from wheelmill.building.products import Repaired, Stamped
from wheelmill.building.steps import BY_KIND
from wheelmill.building.steps.install import _smoke_passed
from wheelmill.errors import InstallTestError
from wheelmill.planning.spec import RecipeSpec, StepKind

WHEEL = "thing-1.0-py3-none-manylinux_2_28_x86_64.whl"
DIST_INFO = {
    "thing-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: thing\nVersion: 1.0\n",
    "thing-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: py3-none-manylinux_2_28_x86_64\n",
}
# What the smoke command sees: whether the probe's import of thing came before it (the same
# interpreter), its arguments, its __name__, and the first entry of its module path.
SMOKE = b"""import os, sys
print("stdout before the last line")
first = "cwd" if sys.path[0] in ("", os.getcwd()) else os.path.basename(sys.path[0])
print("joined=%s argv=%s main=%s path0=%s" % ("thing" in sys.modules, sys.argv[1:], __name__, first))
if "fail" in sys.argv:
    print("the smoke says why")
    raise SystemExit(3)
if "skips" in sys.argv:
    print("SKIPPED [8] tests/test_ops.py:17: no CUDA device")
    print("1 passed, 8 skipped in 0.12s")
"""


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Sandbox:
    # The sandbox's build env has no auditwheel: the stamped wheel, with no library, is the repaired one.
    def repair(ctx: StepContext, spec: RecipeSpec) -> Outcome:
        return Outcome(made=(Repaired(wheel=ctx.done.get(Stamped, spec.name).wheel),))

    monkeypatch.setitem(BY_KIND, StepKind.REPAIR, dataclasses.replace(BY_KIND[StepKind.REPAIR], run=repair))  # type: ignore[arg-type]
    return Sandbox(tmp_path / "repo")


def thing(sandbox: Sandbox, *, imports: list[str], smoke: list[str]) -> None:
    sandbox.recipe(
        "thing", {"thing/__init__.py": b"", "thing/smoke.py": SMOKE, "thing_smoke.py": SMOKE, **DIST_INFO}, wheel=WHEEL
    )
    toml = sandbox.recipes / "thing.toml"
    toml.write_text(toml.read_text() + f"\n[checks]\nimports = {json.dumps(imports)}\nsmoke = {json.dumps(smoke)}\n")


def install_step(sandbox: Sandbox) -> dict[str, Any]:
    report: dict[str, list[dict[str, Any]]] = json.loads(
        (sandbox.output / sandbox.cell("cpu") / "report.json").read_text()
    )
    (step,) = [s for s in report["steps"] if s["step"] == "install-test"]
    return step


@pytest.mark.parametrize(
    ("smoke", "says"),
    [
        (["{python}", "-m", "thing.smoke", "a", "b"], "joined=True argv=['a', 'b'] main=__main__ path0=cwd"),
        (["{python}", "-c", "import thing.smoke", "a"], "joined=True argv=['a'] main=thing.smoke path0=cwd"),
        (
            ["{python}", "{source}/payload/thing_smoke.py.payload", "a"],
            "joined=True argv=['a'] main=__main__ path0=payload",
        ),
    ],
    ids=["module", "code", "script"],
)
def test_a_smoke_command_of_the_envs_python_runs_in_the_probes_interpreter(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox, smoke: list[str], says: str
) -> None:
    thing(sandbox, imports=["thing"], smoke=smoke)
    result = build(cli, monkeypatch, sandbox, "cpu")
    assert result.code == 0, (result.out + result.err)[-3000:]
    step = install_step(sandbox)
    checks = {c["name"]: (c["verdict"], c["detail"]) for c in step["checks"]}
    assert checks["import thing"] == ("pass", "imported")
    assert checks["smoke"] == ("pass", says), checks  # its last line, as from its own interpreter
    log = Path(step["log"])
    assert "stdout before the last line" in log.read_text() and not log.with_suffix(".imports.log").exists()


def test_a_smoke_that_skipped_tests_is_a_skip_counted_apart_from_passes(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox
) -> None:
    """A test suite that skipped its GPU tests proved nothing about them: the smoke check is a
    skip, not a pass, in the report and in the summary, with pytest's count and reason."""
    thing(sandbox, imports=["thing"], smoke=["{python}", "-m", "thing.smoke", "skips"])
    result = build(cli, monkeypatch, sandbox, "cpu")
    assert result.code == 0, (result.out + result.err)[-3000:]
    checks = {c["name"]: (c["verdict"], c["detail"]) for c in install_step(sandbox)["checks"]}
    said = "1 passed, 8 skipped (no CUDA device): what did not run proved nothing here"
    assert checks["smoke"] == ("skip", said), checks
    assert f"skip thing/install-test: smoke: {said}" in " ".join(result.out.split())


def test_a_smoke_command_with_interpreter_options_runs_beside_the_probe(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox
) -> None:
    thing(sandbox, imports=["thing"], smoke=["{python}", "-I", "-m", "thing_smoke", "a"])
    result = build(cli, monkeypatch, sandbox, "cpu")
    assert result.code == 0, (result.out + result.err)[-3000:]
    step = install_step(sandbox)
    assert {c["name"]: c["detail"] for c in step["checks"]}["smoke"].startswith(
        "joined=False argv=['a'] main=__main__ "
    )
    assert "import thing" in Path(step["log"]).with_suffix(".imports.log").read_text()


def test_a_failed_smoke_in_the_probes_interpreter_is_its_exit_status_and_last_line(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox
) -> None:
    thing(sandbox, imports=["thing"], smoke=["{python}", "-m", "thing.smoke", "fail"])
    result = build(cli, monkeypatch, sandbox, "cpu")
    says = "smoke command failed (exit 3): the smoke says why"
    assert_recorded(result, sandbox, "cpu", step="thing/install-test", code=InstallTestError.exit_code, says=says)
    assert not (sandbox.output / sandbox.cell("cpu") / "dist").exists() or not list(
        (sandbox.output / sandbox.cell("cpu") / "dist").glob("*.whl")
    )


def test_a_failed_import_is_the_error_and_the_smoke_does_not_run(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox
) -> None:
    thing(sandbox, imports=["thing", "thing.missing"], smoke=["{python}", "-m", "thing.smoke"])
    result = build(cli, monkeypatch, sandbox, "cpu")
    log = assert_recorded(
        result,
        sandbox,
        "cpu",
        step="thing/install-test",
        code=InstallTestError.exit_code,
        says="import thing.missing: ModuleNotFoundError",
    )
    assert "stdout before the last line" not in log


@pytest.mark.parametrize(
    ("output", "verdict"),
    [
        (["....", "4 passed in 0.10s"], "pass"),
        (["Ran 0 tests in 0.000s", "", "OK"], "skip"),
        (["3 passed, 1 xfailed in 0.20s"], "skip"),
        (["1 deselected in 0.01s"], "skip"),
        (["all good"], "pass"),
    ],
)
def test_a_smoke_that_ran_no_test_or_only_expected_failures_is_a_skip(output: list[str], verdict: str) -> None:
    """Zero tests, or a test expected to fail, proved nothing: the same meaning as the GPU stage's."""
    assert _smoke_passed(output).verdict.value == verdict
