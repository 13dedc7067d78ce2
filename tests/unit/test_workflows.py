"""The GitHub Actions workflows as data: what triggers them, what each job may touch, and
that nothing a pull request reaches publishes or reads a secret.

Each rule is a function that returns the problems it finds. The tests run every rule on
the real files (no problems) and on a copy broken in one place (that problem found), so a
rule that stopped looking would fail too."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"
NAMES = sorted(path.stem for path in WORKFLOWS.glob("*.yml"))

Workflow = dict[str, Any]
Job = dict[str, Any]
Check = Callable[[Workflow], list[str]]

PR_EVENTS = frozenset({"pull_request", "pull_request_target"})
SHA_PINNED = re.compile(r"[^@\s]+@[0-9a-f]{40}")
USES_LINE = re.compile(r"^\s*(?:-\s+)?uses:\s*(?P<ref>\S+)(?P<rest>.*)$", re.MULTILINE)
# What writes an index or uploads anywhere: never reachable from a pull request.
PUBLISHES = re.compile(
    r"wheelmill\s+(?:publish|yank|unyank|release\s+(?:publish|promote|prune))\b|\baws\s+s3\b|\btwine\b|\buv\s+publish\b"
)
PUBLISHING_ACTION = re.compile(r"pypi-publish|upload-release|release-action|s3-sync", re.IGNORECASE)
LOCAL_BUILD = re.compile(r"wheelmill\s+build\b")  # publishes to the runner's local index unless --no-publish
INDEX_GROUP = "index-publish"


def parse(text: str) -> Workflow:
    """A workflow file as a mapping. PyYAML reads YAML 1.1, where the key `on` is the boolean True."""
    data = yaml.safe_load(text)
    assert isinstance(data, dict)
    if True in data:
        data["on"] = data.pop(True)
    return data


def load(name: str) -> Workflow:
    return parse((WORKFLOWS / f"{name}.yml").read_text(encoding="utf-8"))


def triggers(workflow: Workflow) -> dict[str, Any]:
    on = workflow.get("on")
    if isinstance(on, str):
        return {on: None}
    if isinstance(on, list):
        return dict.fromkeys(on)
    return dict(on or {})


def jobs(workflow: Workflow) -> dict[str, Job]:
    return dict(workflow.get("jobs") or {})


def steps(job: Job) -> list[dict[str, Any]]:
    return list(job.get("steps") or [])


def run_lines(job: Job) -> Iterator[str]:
    for step in steps(job):
        yield from str(step.get("run", "")).splitlines()


def strings(node: object) -> Iterator[str]:
    """Every string in a parsed YAML tree, keys included."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from strings(key)
            yield from strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from strings(item)


def reads_secret(node: object) -> bool:
    return any("secrets." in text for text in strings(node))


def label(step: dict[str, Any]) -> str:
    return str(step.get("name") or step.get("uses") or step.get("run", ""))[:60]


def publishing_jobs(workflow: Workflow) -> dict[str, Job]:
    return {
        name: job
        for name, job in jobs(workflow).items()
        if "environment" in job or any(PUBLISHES.search(line) for line in run_lines(job))
    }


# --- the rules --------------------------------------------------------------------------


def _read_only(permissions: object) -> bool:
    if permissions == "read-all":
        return True
    return isinstance(permissions, dict) and all(level in {"read", "none"} for level in permissions.values())


def permission_problems(workflow: Workflow) -> list[str]:
    """Top level grants at most read; every job says what it gets, and none gets a write.
    (No job here needs one: the index storage is S3, reached with the environments' secrets.)"""
    problems = []
    if "permissions" not in workflow:
        problems.append("no top-level permissions: the token gets the repository's default")
    elif not _read_only(workflow["permissions"]):
        problems.append(f"top-level permissions grant more than read: {workflow['permissions']!r}")
    for name, job in jobs(workflow).items():
        if "permissions" not in job:
            problems.append(f"{name}: no permissions block")
        elif not _read_only(job["permissions"]):
            problems.append(f"{name}: permissions grant a write: {job['permissions']!r}")
    return problems


def pull_request_problems(workflow: Workflow) -> list[str]:
    """Nothing a pull request (a fork's included) runs publishes, deploys or reads a secret."""
    on = triggers(workflow)
    problems = (
        ["pull_request_target: runs a fork's change with this repository's secrets"]
        if "pull_request_target" in on
        else []
    )
    if not PR_EVENTS & on.keys():
        return problems
    if reads_secret({key: value for key, value in workflow.items() if key != "jobs"}):
        problems.append("workflow: reads a secret")
    for name, job in jobs(workflow).items():
        if reads_secret(job):
            problems.append(f"{name}: reads a secret")
        if "secrets" in job:
            problems.append(f"{name}: passes secrets to a reusable workflow")
        if "environment" in job:
            problems.append(f"{name}: deploys to environment {job['environment']!r}")
        problems += [f"{name}: publishes: {line.strip()}" for line in run_lines(job) if PUBLISHES.search(line)]
        problems += [
            f"{name}: builds without --no-publish: {line.strip()}"
            for line in run_lines(job)
            if LOCAL_BUILD.search(line) and "--no-publish" not in line
        ]
        problems += [
            f"{name}: uses a publishing action: {step['uses']}"
            for step in steps(job)
            if PUBLISHING_ACTION.search(str(step.get("uses", "")))
        ]
    return problems


def secret_scope_problems(workflow: Workflow) -> list[str]:
    """A secret reaches only the steps that talk to the index storage or log in to the image
    registry, through their env."""
    problems = (
        ["workflow: a secret at workflow level reaches every job"]
        if reads_secret({k: v for k, v in workflow.items() if k != "jobs"})
        else []
    )
    for name, job in jobs(workflow).items():
        if reads_secret({key: value for key, value in job.items() if key != "steps"}):
            problems.append(f"{name}: a secret at job level reaches every step")
        for step in steps(job):
            if reads_secret({key: value for key, value in step.items() if key != "env"}):
                problems.append(f"{name}: {label(step)}: a secret outside the step's env")
            if reads_secret(step.get("env")) and not re.search(
                r"aws s3 |docker login |podman login ", str(step.get("run", ""))
            ):
                problems.append(f"{name}: {label(step)}: gets a secret but does not sync the index")
    return problems


def pr_cancel_problems(workflow: Workflow) -> list[str]:
    """A new push to a pull request cancels the run it supersedes."""
    concurrency = workflow.get("concurrency")
    if not isinstance(concurrency, dict):
        return ["no workflow-level concurrency"]
    problems = []
    group = str(concurrency.get("group", ""))
    if "github.event.pull_request.number" not in group and "github.ref" not in group:
        problems.append(f"concurrency group is not keyed on the pull request or ref: {group!r}")
    cancel = concurrency.get("cancel-in-progress")
    if cancel is not True and not (
        isinstance(cancel, str) and re.search(r"github\.event_name\s*==\s*'pull_request'", cancel)
    ):
        problems.append(f"cancel-in-progress does not cancel superseded pull request runs: {cancel!r}")
    return problems


def publish_cancel_problems(workflow: Workflow) -> list[str]:
    """Publishing jobs run one at a time per index and are never cancelled halfway."""
    problems = []
    concurrency = workflow.get("concurrency")
    if (
        publishing_jobs(workflow)
        and isinstance(concurrency, dict)
        and concurrency.get("cancel-in-progress") is not False
    ):
        problems.append(f"workflow-level concurrency may cancel a publishing run: {concurrency!r}")
    for name, job in publishing_jobs(workflow).items():
        concurrency = job.get("concurrency")
        if not isinstance(concurrency, dict) or concurrency.get("group") != INDEX_GROUP:
            problems.append(f"{name}: publishes outside the {INDEX_GROUP} concurrency group")
        elif concurrency.get("cancel-in-progress") is not False:
            problems.append(f"{name}: a publishing run may be cancelled: {concurrency!r}")
    return problems


def pinning_problems(workflow: Workflow) -> list[str]:
    """Every action and reusable workflow from elsewhere is pinned by a full commit SHA."""
    refs = [str(job["uses"]) for job in jobs(workflow).values() if "uses" in job]
    refs += [str(step["uses"]) for job in jobs(workflow).values() for step in steps(job) if "uses" in step]
    return [
        f"not pinned by a commit SHA: {ref}"
        for ref in refs
        if not ref.startswith("./") and not SHA_PINNED.fullmatch(ref)
    ]


def version_comment_problems(text: str) -> list[str]:
    """A SHA pin says which version it is (`@<sha> # v4.2.2`), so updates can be read."""
    return [
        f"no version comment: {match['ref']}"
        for match in USES_LINE.finditer(text)
        if not match["ref"].startswith("./") and not re.fullmatch(r"\s*#\s*v\d+(\.\d+)*\s*", match["rest"])
    ]


def matrix_problems(workflow: Workflow, plan_command: str) -> list[str]:
    """The build job's cells come from the plan job, which asks wheelmill; all run at once."""
    plan, build = jobs(workflow).get("plan"), jobs(workflow).get("build")
    if plan is None or build is None:
        return ["no plan and build jobs"]
    problems = []
    if not any(plan_command in line for line in run_lines(plan)):
        problems.append(f"plan does not run {plan_command!r}")
    if "matrix" not in (plan.get("outputs") or {}):
        problems.append("plan has no matrix output")
    needs = build.get("needs", [])
    if "plan" not in ([needs] if isinstance(needs, str) else needs):
        problems.append("build does not need plan")
    strategy = build.get("strategy") or {}
    if re.sub(r"\s+", "", str(strategy.get("matrix"))) != "${{fromJSON(needs.plan.outputs.matrix)}}":
        problems.append(f"build matrix is not fromJSON(needs.plan.outputs.matrix): {strategy.get('matrix')!r}")
    if strategy.get("fail-fast") is not False:
        problems.append("fail-fast is not false: one failing cell would cancel the others")
    if "max-parallel" in strategy:
        problems.append("max-parallel serializes cells")
    if build.get("runs-on") != "${{ matrix.runner }}":
        problems.append(f"build runs on {build.get('runs-on')!r}, not its cell's platform's runner (matrix.runner)")
    return problems


def timeout_problems(workflow: Workflow) -> list[str]:
    return [
        f"{name}: no timeout-minutes"
        for name, job in jobs(workflow).items()
        if "uses" not in job and "timeout-minutes" not in job
    ]


def checkout_problems(workflow: Workflow) -> list[str]:
    """The job token is not left in .git/config for later steps to find."""
    return [
        f"{name}: checkout keeps the token in .git/config"
        for name, job in jobs(workflow).items()
        for step in steps(job)
        if str(step.get("uses", "")).startswith("actions/checkout@")
        and (step.get("with") or {}).get("persist-credentials") is not False
    ]


def injection_problems(workflow: Workflow) -> list[str]:
    """Values reach shell scripts through env, never as ${{ }} pasted into the script."""
    return [
        f"{name}: expression in a run script: {line.strip()}"
        for name, job in jobs(workflow).items()
        for line in run_lines(job)
        if "${{" in line
    ]


EVERY_WORKFLOW_CHECK: list[Check] = [
    permission_problems,
    pull_request_problems,
    secret_scope_problems,
    publish_cancel_problems,
    pinning_problems,
    timeout_problems,
    checkout_problems,
    injection_problems,
]
PLAN_COMMANDS = {
    "build": "wheelmill matrix --json",
    "release": 'wheelmill release --tag "$GITHUB_REF_NAME" --json',
    "nightly": "wheelmill release --nightly --json",
}


# --- the real files ---------------------------------------------------------------------


def test_the_three_workflows_are_there() -> None:
    assert NAMES == ["build", "nightly", "release"]
    assert not list(WORKFLOWS.glob("*.yaml"))  # every workflow is a .yml, so NAMES sees it


@pytest.mark.parametrize("check", EVERY_WORKFLOW_CHECK, ids=lambda check: check.__name__)
@pytest.mark.parametrize("name", NAMES)
def test_the_workflows_break_no_rule(name: str, check: Check) -> None:
    assert check(load(name)) == []


@pytest.mark.parametrize("name", NAMES)
def test_every_pin_names_its_version(name: str) -> None:
    text = (WORKFLOWS / f"{name}.yml").read_text(encoding="utf-8")
    assert len(USES_LINE.findall(text)) >= 2
    assert version_comment_problems(text) == []


@pytest.mark.parametrize("name", NAMES)
def test_cells_come_from_the_plan_and_run_in_parallel(name: str) -> None:
    assert matrix_problems(load(name), PLAN_COMMANDS[name]) == []


@pytest.mark.parametrize("name", NAMES)
def test_every_build_job_keeps_its_compiler_cache_in_the_actions_cache(name: str) -> None:
    """sccache's GHA backend (docs/design/compiler-cache.md): enabled for the job, and the cache
    service's variables, which only JavaScript actions see, exported before the build."""
    building = {
        key: job
        for key, job in jobs(load(name)).items()
        if any(re.search(r"wheelmill\s+(build|release)\b.*--cell", line) for line in run_lines(job))
    }
    assert building, f"{name}: a job that builds cells"
    for key, job in building.items():
        assert str((job.get("env") or {}).get("SCCACHE_GHA_ENABLED")) == "true", f"{name}/{key}"
        names = [str(step.get("uses", "")).split("@")[0] or str(step.get("run", "")) for step in steps(job)]
        exporting = names.index("actions/github-script")
        script = str(steps(job)[exporting]["with"]["script"])
        assert all(
            variable in script for variable in ("ACTIONS_RESULTS_URL", "ACTIONS_RUNTIME_TOKEN", "core.exportVariable")
        ), f"{name}/{key}"
        built = next(
            i
            for i, step in enumerate(steps(job))
            if re.search(r"wheelmill\s+(build|release)\b", str(step.get("run", "")))
        )
        assert exporting < built, f"{name}/{key}: the variables are exported before the build"


def test_build_runs_on_pull_requests_and_main_and_never_publishes() -> None:
    workflow = load("build")
    on = triggers(workflow)
    assert on.keys() == {"pull_request", "push"}
    assert on["push"] == {"branches": ["main"]}  # tags go to release.yml
    assert on["pull_request"] is None  # every pull request, forks included
    assert pr_cancel_problems(workflow) == []
    assert publishing_jobs(workflow) == {}
    plan = " ".join(run_lines(jobs(workflow)["plan"]))
    assert "--changed-files changed.txt" in plan
    assert 'git diff --name-only "$range"' in plan


def test_release_runs_on_version_tags_and_builds_or_promotes() -> None:
    workflow = load("release")
    assert triggers(workflow) == {"push": {"tags": ["v*"]}}
    every = jobs(workflow)
    assert every["build"]["if"] == "needs.plan.outputs.action == 'build'"
    assert every["promote"]["if"] == "needs.plan.outputs.action == 'promote'"
    assert every["publish"]["needs"] == ["plan", "build"]
    assert publishing_jobs(workflow).keys() == {"publish", "promote", "record-gpu"}
    assert {job["environment"] for job in publishing_jobs(workflow).values()} == {"release"}
    assert "environment" not in every["build"]
    assert any('wheelmill release publish --tag "$TAG"' in line for line in run_lines(every["publish"]))
    assert any(
        'wheelmill release promote --from test --to release "$VERSION"' in line for line in run_lines(every["promote"])
    )
    # the record is read through wheelmill (its objects, read whole), never as a file of the tree
    promote_lines = " ".join(run_lines(every["promote"]))
    assert 'wheelmill release show --track release "$VERSION" --json' in promote_lines
    assert "releases/release/" not in promote_lines


def test_a_release_candidate_is_proven_on_gpu_runners_before_promotion() -> None:
    """Built on CPU runners, proven on GPU runners: the GPU stage runs per covered cell and
    runner label from the plan, says which runner it ran on, reads the served test channel
    with no secret, and its reports (one artifact per cell and runner) reach the rc's record,
    which promotion reads."""
    every = jobs(load("release"))
    gpu = every["gpu"]
    assert gpu["needs"] == ["plan", "publish"] and gpu["runs-on"] == "${{ matrix.runner }}"
    assert gpu["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.gpu-matrix) }}"
    assert gpu["strategy"]["fail-fast"] is False and "environment" not in gpu and not reads_secret(gpu)
    assert any(
        'wheelmill test-gpu --cell "$CELL" --runner "$RUNNER" --track test --index-url' in line
        for line in run_lines(gpu)
    )
    assert gpu["env"]["RUNNER"] == "${{ matrix.runner }}"
    uploads = [step for step in steps(gpu) if "upload-artifact" in step.get("uses", "")]
    assert [step["with"]["name"] for step in uploads] == ["gpu-report-${{ matrix.cell }}-${{ matrix.runner }}"]
    assert "gpu-matrix" in every["plan"]["outputs"]
    record = every["record-gpu"]
    assert record["needs"] == ["plan", "publish", "gpu"] and record["if"].startswith("always() && ")
    assert any('wheelmill release record-gpu --track test "$VERSION"' in line for line in run_lines(record))


def test_nightly_runs_daily_publishes_and_prunes() -> None:
    workflow = load("nightly")
    on = triggers(workflow)
    assert on.keys() == {"schedule", "workflow_dispatch"}
    assert len(on["schedule"][0]["cron"].split()) == 5
    assert publishing_jobs(workflow).keys() == {"publish"}
    publish = " ".join(run_lines(jobs(workflow)["publish"]))
    assert "wheelmill release publish --nightly" in publish
    assert "wheelmill release prune --track nightly --keep 14" in publish
    assert workflow["concurrency"]["cancel-in-progress"] is False


@pytest.mark.parametrize("name", ["release", "nightly"])
def test_publishing_syncs_the_index_down_publishes_verifies_and_syncs_up(name: str) -> None:
    for job in publishing_jobs(load(name)).values():
        lines = [line for line in run_lines(job) if "aws s3" in line or "wheelmill" in line]
        assert "aws s3 sync" in lines[0]
        assert lines[0].index("s3://") < lines[0].index("wheels/index/")
        assert "wheelmill index verify" in lines[-2]
        assert "aws s3 sync" in lines[-1]
        assert lines[-1].index("wheels/index/") < lines[-1].index("s3://")


def test_actionlint_finds_nothing() -> None:
    assert actionlint(*sorted(WORKFLOWS.glob("*.yml"))) == (0, "")


def test_actionlint_flags_a_broken_workflow(tmp_path: Path) -> None:
    broken = tmp_path / ".github" / "workflows" / "build.yml"
    broken.parent.mkdir(parents=True)
    broken.write_text(
        (WORKFLOWS / "build.yml").read_text(encoding="utf-8").replace("needs: plan", "needs: planner"), encoding="utf-8"
    )
    code, output = actionlint(broken)
    assert code == 1
    assert "planner" in output


def actionlint(*files: Path) -> tuple[int, str]:
    binary = Path(sys.executable).parent / "actionlint"
    if not binary.exists():
        pytest.skip("actionlint is not installed next to this Python (scripts/setup installs it)")
    # -shellcheck= and -pyflakes= empty: the same verdict whether or not those are installed.
    result = subprocess.run(
        [str(binary), "-shellcheck=", "-pyflakes=", *map(str, files)], capture_output=True, text=True, check=False
    )
    return result.returncode, result.stdout + result.stderr


# --- the rules, on broken copies --------------------------------------------------------


def job_in(workflow: Workflow, name: str) -> Job:
    found = workflow["jobs"][name]
    assert isinstance(found, dict)
    return found


def step_in(workflow: Workflow, job_name: str, step_name: str) -> dict[str, Any]:
    found = next(
        s
        for s in steps(job_in(workflow, job_name))
        if s.get("name") == step_name or str(s.get("uses", "")).startswith(step_name)
    )
    assert isinstance(found, dict)
    return found


BUILD_STEP = "Build, check and install-test"
READS_X = "${{ secrets.X }}"
BROKEN: list[Any] = [
    # permissions
    pytest.param(
        "build",
        lambda w: w.pop("permissions"),
        permission_problems,
        "no top-level permissions",
        id="no-top-level-permissions",
    ),
    pytest.param(
        "build",
        lambda w: w.update(permissions="write-all"),
        permission_problems,
        "top-level permissions",
        id="top-level-write-all",
    ),
    pytest.param(
        "nightly",
        lambda w: job_in(w, "plan").pop("permissions"),
        permission_problems,
        "plan: no permissions",
        id="job-without-permissions",
    ),
    pytest.param(
        "release",
        lambda w: job_in(w, "publish")["permissions"].update(contents="write"),
        permission_problems,
        "publish: permissions grant a write",
        id="job-write",
    ),
    # pull requests
    pytest.param(
        "build",
        lambda w: job_in(w, "build")["env"].update({"X": READS_X}),
        pull_request_problems,
        "build: reads a secret",
        id="pr-secret",
    ),
    pytest.param(
        "build",
        lambda w: w.update(env={"X": READS_X}),
        pull_request_problems,
        "workflow: reads a secret",
        id="pr-workflow-secret",
    ),
    pytest.param(
        "build",
        lambda w: job_in(w, "build").update(environment="release"),
        pull_request_problems,
        "build: deploys",
        id="pr-environment",
    ),
    pytest.param(
        "build",
        lambda w: step_in(w, "build", BUILD_STEP).update(run='wheelmill build --cell "$CELL"'),
        pull_request_problems,
        "--no-publish",
        id="pr-local-publish",
    ),
    pytest.param(
        "build",
        lambda w: job_in(w, "build")["steps"].append({"uses": "pypa/gh-action-pypi-publish@" + "0" * 40}),
        pull_request_problems,
        "publishing action",
        id="pr-publish-action",
    ),
    pytest.param(
        "build",
        lambda w: w["on"].update(pull_request_target=None),
        pull_request_problems,
        "pull_request_target",
        id="pull-request-target",
    ),
    pytest.param(
        "nightly",
        lambda w: w["on"].update(pull_request_target=None),
        pull_request_problems,
        "pull_request_target",
        id="pull-request-target-elsewhere",
    ),
    pytest.param(
        "release",
        lambda w: w["on"].update(pull_request=None),
        pull_request_problems,
        "publish: deploys to environment 'release'",
        id="pr-reaches-release",
    ),
    # secrets
    pytest.param(
        "release",
        lambda w: job_in(w, "publish")["env"].update(KEY=READS_X),
        secret_scope_problems,
        "publish: a secret at job level",
        id="job-level-secret",
    ),
    pytest.param(
        "release",
        lambda w: step_in(w, "publish", "Verify the index").update(env={"KEY": READS_X}),
        secret_scope_problems,
        "does not sync",
        id="secret-unused",
    ),
    pytest.param(
        "nightly",
        lambda w: step_in(w, "publish", "Keep the 14 newest nightlies").update(run=READS_X),
        secret_scope_problems,
        "outside",
        id="secret-in-run",
    ),
    # concurrency
    pytest.param(
        "release",
        lambda w: job_in(w, "promote")["concurrency"].update({"cancel-in-progress": True}),
        publish_cancel_problems,
        "promote: a publishing run may",
        id="publish-cancels",
    ),
    pytest.param(
        "nightly",
        lambda w: job_in(w, "publish").pop("concurrency"),
        publish_cancel_problems,
        "outside the index-publish",
        id="publish-unserialized",
    ),
    pytest.param(
        "nightly",
        lambda w: w["concurrency"].update({"cancel-in-progress": True}),
        publish_cancel_problems,
        "workflow-level",
        id="workflow-cancels-publish",
    ),
    pytest.param(
        "build",
        lambda w: w["concurrency"].update({"cancel-in-progress": False}),
        pr_cancel_problems,
        "cancel-in-progress",
        id="pr-not-cancelled",
    ),
    pytest.param(
        "build",
        lambda w: w["concurrency"].update(group="build"),
        pr_cancel_problems,
        "not keyed",
        id="pr-group-unkeyed",
    ),
    pytest.param(
        "build", lambda w: w.pop("concurrency"), pr_cancel_problems, "no workflow-level", id="pr-no-concurrency"
    ),
    # pins
    pytest.param(
        "build",
        lambda w: step_in(w, "build", "actions/checkout@").update(uses="actions/checkout@v4"),
        pinning_problems,
        "actions/checkout@v4",
        id="tag",
    ),
    pytest.param(
        "build",
        lambda w: step_in(w, "build", "actions/checkout@").update(uses="actions/checkout@11bd719"),
        pinning_problems,
        "@11bd719",
        id="short-sha",
    ),
    pytest.param(
        "build",
        lambda w: w["jobs"].update(more={"uses": "org/repo/.github/workflows/x.yml@main"}),
        pinning_problems,
        "x.yml@main",
        id="reusable",
    ),
    # hygiene
    pytest.param(
        "release",
        lambda w: job_in(w, "build").pop("timeout-minutes"),
        timeout_problems,
        "build: no timeout",
        id="no-timeout",
    ),
    pytest.param(
        "nightly",
        lambda w: step_in(w, "plan", "actions/checkout@")["with"].pop("persist-credentials"),
        checkout_problems,
        "plan: checkout",
        id="token-kept",
    ),
    pytest.param(
        "build",
        lambda w: step_in(w, "build", BUILD_STEP).update(run="wheelmill build --cell ${{ matrix.cell }}"),
        injection_problems,
        "${{",
        id="injection",
    ),
]


@pytest.mark.parametrize(("name", "mutate", "check", "expected"), BROKEN)
def test_a_broken_workflow_is_flagged(
    name: str, mutate: Callable[[Workflow], object], check: Check, expected: str
) -> None:
    workflow = load(name)
    mutate(workflow)
    problems = check(workflow)
    assert any(expected in problem for problem in problems), problems


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        pytest.param(lambda w: job_in(w, "build")["strategy"].update({"fail-fast": True}), "fail-fast", id="fail-fast"),
        pytest.param(
            lambda w: job_in(w, "build")["strategy"].update({"max-parallel": 4}), "max-parallel", id="max-parallel"
        ),
        pytest.param(
            lambda w: job_in(w, "build")["strategy"].update(matrix={"cell": ["cpu-py311"]}),
            "fromJSON",
            id="literal-matrix",
        ),
        pytest.param(lambda w: job_in(w, "build").update(needs="other"), "does not need plan", id="needs"),
        pytest.param(lambda w: job_in(w, "plan").pop("outputs"), "no matrix output", id="no-output"),
        pytest.param(
            lambda w: step_in(w, "plan", "Choose the cells").update(run="wheelmill matrix --markdown"),
            "does not run",
            id="plan-command",
        ),
        pytest.param(lambda w: w["jobs"].pop("plan"), "no plan and build", id="no-plan"),
    ],
)
def test_a_broken_matrix_is_flagged(mutate: Callable[[Workflow], object], expected: str) -> None:
    workflow = load("build")
    mutate(workflow)
    problems = matrix_problems(workflow, PLAN_COMMANDS["build"])
    assert any(expected in problem for problem in problems), problems


def test_a_pin_without_its_version_is_flagged() -> None:
    text = (WORKFLOWS / "build.yml").read_text(encoding="utf-8")
    assert version_comment_problems(text.replace(" # v4.2.2", "", 1)) == [
        "no version comment: actions/checkout@11bd71901bbe5b1630ceea73d27597364c9af683"
    ]
    assert version_comment_problems("    - uses: ./.github/actions/local\n") == []


def test_local_actions_and_the_on_key_are_read_right() -> None:
    workflow = parse("on: [push, pull_request]\njobs:\n  a:\n    steps:\n      - uses: ./.github/actions/local\n")
    assert triggers(workflow) == {"push": None, "pull_request": None}
    assert pinning_problems(workflow) == []
    assert triggers(parse("on: push\n")) == {"push": None}


def test_each_aarch64_cells_images_are_joined_with_its_twins_under_one_tag() -> None:
    """Both image steps of the release (the rc's and the final's) register qemu-user first
    and end by joining each aarch64 cell's images with its x86_64 twin's."""
    steps_of = [step for job in jobs(load("release")).values() for step in steps(job)]
    building = [i for i, step in enumerate(steps_of) if "wheelmill image build" in str(step.get("run", ""))]
    assert len(building) == 2
    for index in building:
        run = str(steps_of[index]["run"])
        assert run.index("wheelmill image build") < run.index("wheelmill image manifest --cell")
        assert "qemu-user-static" in str(steps_of[index - 1].get("run", ""))
