"""The GitHub Actions workflows as data: what triggers them, what each job may touch (a write
to GitHub only where a job opens a pull request), that
nothing a pull request reaches publishes, reads a secret or asks for an OIDC token, and that
every job that writes the index writes its object store directly, with credentials it gets
by OIDC, and no lock around it.

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
    r"wheelmill\s+(?:publish|yank|unyank|index\s+(?:render|sweep)|release\s+(?:publish|promote|prune|record-gpu))\b"
    r"|wheelmill\s+coverage\b.*--page\b"
    r"|\baws\s+s3\b|\btwine\b|\buv\s+publish\b"
)
# What changes an index: where the job's WHEELMILL_INDEX_ROOT is the bucket, it changes the bucket.
WRITES_INDEX = re.compile(
    r"wheelmill\s+(?:publish|yank|unyank|index\s+(?:render|repair|sweep)|release\s+(?:publish|promote|prune|record-gpu))\b"
    r"|wheelmill\s+coverage\b.*--page\b"
)
PUBLISHING_ACTION = re.compile(r"pypi-publish|upload-release|release-action|s3-sync", re.IGNORECASE)
LOCAL_BUILD = re.compile(r"wheelmill\s+build\b")  # publishes to the runner's local index unless --no-publish
BUILDS_A_CELL = re.compile(r"wheelmill\s+(?:build|release)\b.*--cell")
SYNC = re.compile(r"\baws\s+s3\s+sync\b")
INDEX_GROUP = "index-publish"  # the lock the index once needed: no workflow has it now
BUCKET_ROOT = "s3://${{ vars.WHEELMILL_INDEX_BUCKET }}/index"
OIDC_ACTION = "aws-actions/configure-aws-credentials@"
INDEX_ROLE = "${{ vars.WHEELMILL_INDEX_ROLE }}"
# The role a job that only reads the index assumes (the GPU stage reads its rc's record).
INDEX_READ_ROLE = "${{ vars.WHEELMILL_INDEX_READ_ROLE }}"
READS_ONLY = re.compile(r"wheelmill\s+(?:test-gpu|verify|release\s+show)\b")
# The compiler cache's shared tier's roles: one that may write its bucket (release.yml and
# nightly.yml, on tags and main), one that may only read it (build.yml, pull requests).
CACHE_ROLE = "${{ vars.WHEELMILL_CACHE_ROLE }}"
CACHE_READ_ROLE = "${{ vars.WHEELMILL_CACHE_READ_ROLE }}"
STATIC_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "aws-access-key-id", "aws-secret-access-key")
# The one action that writes to GitHub: it opens the pull request of `wheelmill matrix upstream`'s
# change (docs/matrix.md#new-torch-releases-on-day-one), and needs these writes, no more.
OPENS_A_PULL_REQUEST = "peter-evans/create-pull-request@"
PULL_REQUEST_WRITES = {"contents": "write", "pull-requests": "write"}


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


def env_of(node: dict[str, Any]) -> dict[str, Any]:
    return dict(node.get("env") or {})


def bucket_steps(job: Job) -> list[int]:
    """The steps that reach the index's object store: wheelmill run where WHEELMILL_INDEX_ROOT
    (the step's, else its job's) is an s3:// location, or the AWS CLI's s3 commands."""
    job_root = env_of(job).get("WHEELMILL_INDEX_ROOT", "")
    found = []
    for index, step in enumerate(steps(job)):
        root = str(env_of(step).get("WHEELMILL_INDEX_ROOT", job_root))
        run = str(step.get("run", ""))
        if (root.startswith("s3://") and "wheelmill" in run) or re.search(r"\baws\s+s3\b", run):
            found.append(index)
    return found


def index_jobs(workflow: Workflow) -> dict[str, Job]:
    """The jobs that read or write the index's object store, so need its credentials."""
    return {name: job for name, job in jobs(workflow).items() if bucket_steps(job)}


def oidc_steps(job: Job) -> list[int]:
    return [i for i, step in enumerate(steps(job)) if str(step.get("uses", "")).startswith(OIDC_ACTION)]


def role_of(job: Job, index: int) -> str:
    return str((steps(job)[index].get("with") or {}).get("role-to-assume"))


def cache_steps(job: Job) -> list[int]:
    """The OIDC steps that assume one of the compiler cache's roles."""
    return [i for i in oidc_steps(job) if role_of(job, i) in (CACHE_ROLE, CACHE_READ_ROLE)]


def index_oidc_steps(job: Job) -> list[int]:
    return [i for i in oidc_steps(job) if i not in cache_steps(job)]


def reads_the_cache_only(job: Job) -> bool:
    """A job whose every OIDC step assumes the compiler cache's read-only role, in no
    environment: the index's role, whose trust policy names its environments, refuses its token."""
    found = oidc_steps(job)
    return bool(found) and all(role_of(job, i) == CACHE_READ_ROLE for i in found) and not job.get("environment")


# --- the rules --------------------------------------------------------------------------


def _read_only(permissions: object) -> bool:
    if permissions == "read-all":
        return True
    return isinstance(permissions, dict) and all(level in {"read", "none"} for level in permissions.values())


def opens_a_pull_request(job: Job) -> bool:
    return any(str(step.get("uses", "")).startswith(OPENS_A_PULL_REQUEST) for step in steps(job))


def permission_problems(workflow: Workflow) -> list[str]:
    """Top level grants at most read; every job says what it gets, and none gets a write to
    GitHub but the job that opens a pull request, which gets exactly contents and
    pull-requests (no builder job needs one: the index is an object store). `id-token:
    write` only lets a job ask for its OIDC token; oidc_problems says which jobs may."""
    problems = []
    if "permissions" not in workflow:
        problems.append("no top-level permissions: the token gets the repository's default")
    elif not _read_only(workflow["permissions"]):
        problems.append(f"top-level permissions grant more than read: {workflow['permissions']!r}")
    for name, job in jobs(workflow).items():
        granted = job.get("permissions")
        if "permissions" not in job:
            problems.append(f"{name}: no permissions block")
        elif opens_a_pull_request(job):
            problems += _pull_request_job_problems(workflow, name, job)
        elif not _read_only(
            {k: v for k, v in granted.items() if k != "id-token"} if isinstance(granted, dict) else granted
        ):
            problems.append(f"{name}: permissions grant a write: {granted!r}")
    return problems


def _pull_request_job_problems(workflow: Workflow, name: str, job: Job) -> list[str]:
    """The job that opens a pull request writes to GitHub and to nothing else: exactly
    contents and pull-requests, in no environment, with no secret, on no pull request's run,
    and it publishes nothing."""
    problems = []
    if job.get("permissions") != PULL_REQUEST_WRITES:
        problems.append(f"{name}: opens a pull request with permissions other than {PULL_REQUEST_WRITES}")
    if "environment" in job or reads_secret(job):
        problems.append(f"{name}: opens a pull request in an environment or with a secret")
    if PR_EVENTS & triggers(workflow).keys():
        problems.append(f"{name}: writes to GitHub in a workflow that pull requests run")
    problems += [
        f"{name}: opens a pull request and publishes: {line.strip()}"
        for line in run_lines(job)
        if PUBLISHES.search(line)
    ]
    return problems


def _asks_for_a_token(permissions: object) -> bool:
    if permissions == "write-all":
        return True
    return isinstance(permissions, dict) and permissions.get("id-token", "none") != "none"


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
    if _asks_for_a_token(workflow.get("permissions")):
        problems.append("workflow: asks for an OIDC token (id-token), which could assume the index's role")
    for name, job in jobs(workflow).items():
        if reads_secret(job):
            problems.append(f"{name}: reads a secret")
        if _asks_for_a_token(job.get("permissions")) and not reads_the_cache_only(job):
            problems.append(f"{name}: asks for an OIDC token (id-token), which could assume the index's role")
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
    """A secret reaches only the steps that log in to the image registry, through their env
    (the index's credentials are no secret: they come by OIDC)."""
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
            if reads_secret(step.get("env")) and not _needs_its_secrets(step):
                problems.append(f"{name}: {label(step)}: gets a secret but neither logs in to a registry nor signs")
    return problems


def _needs_its_secrets(step: dict[str, Any]) -> bool:
    """A registry login gets the registry's secrets; a release's build or promotion, which signs
    provenance (docs/provenance.md), gets the signing key and no other; the GPU stage, which
    signs its report (docs/gpu-stage.md), the GPU runners' key."""
    run = str(step.get("run", ""))
    if re.search(r"docker login |podman login ", run):
        return True
    secrets = {key for key, value in (step.get("env") or {}).items() if reads_secret(value)}
    if re.search(r"wheelmill test-gpu ", run):
        return secrets == {"WHEELMILL_SIGNING_KEY"} and "WHEELMILL_GPU_SIGNING_KEY" in str(step["env"])
    return secrets == {"WHEELMILL_SIGNING_KEY"} and bool(re.search(r"wheelmill release (--|promote )", run))


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


def ordering_problems(workflow: Workflow) -> list[str]:
    """No concurrency group is a lock around the index: jobs write it at once, each its own
    objects. What stays is ordering: a workflow that writes the index may queue its runs, but
    never cancels one, running or pending (a third queued run waits too: queue: max)."""
    problems = []
    concurrency = workflow.get("concurrency")
    groups = [("workflow", concurrency)] + [(name, job.get("concurrency")) for name, job in jobs(workflow).items()]
    problems += [
        f"{where}: concurrency group {INDEX_GROUP}, a lock around the index"
        for where, found in groups
        if (isinstance(found, dict) and found.get("group") == INDEX_GROUP) or found == INDEX_GROUP
    ]
    problems += [
        f"{name}: a concurrency group around a job that writes the index: {job['concurrency']!r}"
        for name, job in index_jobs(workflow).items()
        if "concurrency" in job
    ]
    if publishing_jobs(workflow) and isinstance(concurrency, dict):
        if concurrency.get("cancel-in-progress") is not False:
            problems.append(f"workflow-level concurrency may cancel a publishing run: {concurrency!r}")
        if concurrency.get("queue") != "max":
            problems.append(f"workflow-level concurrency keeps one pending run (no queue: max): {concurrency!r}")
    return problems


def oidc_problems(workflow: Workflow) -> list[str]:
    """Every job that reaches the index's object store gets its credentials by OIDC: it may
    ask for the token (id-token: write, and contents: read, nothing else), it assumes the
    role vars.WHEELMILL_INDEX_ROLE (vars.WHEELMILL_INDEX_READ_ROLE where every wheelmill
    command it runs only reads) with the pinned configure-aws-credentials action before
    its first step that reaches the store, in an environment (whose name is what the role's
    trust policy checks), and nothing anywhere names a static key. No other job may ask for
    the token."""
    problems = [
        f"workflow: names a static key ({key})" for key in STATIC_KEYS if any(key in text for text in strings(workflow))
    ]
    reaching = index_jobs(workflow)
    for name, job in jobs(workflow).items():
        if name not in reaching:
            if (_asks_for_a_token(job.get("permissions")) or oidc_steps(job)) and not reads_the_cache_only(job):
                problems.append(f"{name}: asks for an OIDC token but never reaches the index")
            continue
        if job.get("permissions") != {"contents": "read", "id-token": "write"}:
            problems.append(f"{name}: reaches the index without exactly contents: read, id-token: write")
        if not job.get("environment"):
            problems.append(f"{name}: reaches the index in no environment (the role trusts the environment)")
        assumed = index_oidc_steps(job)
        if not assumed:
            problems.append(f"{name}: no OIDC step ({OIDC_ACTION}...)")
            continue
        given = dict(steps(job)[assumed[0]].get("with") or {})
        commands = [line for line in run_lines(job) if re.search(r"wheelmill\s", line)]
        role = INDEX_READ_ROLE if commands and all(READS_ONLY.search(line) for line in commands) else INDEX_ROLE
        if given.get("role-to-assume") != role:
            problems.append(f"{name}: the OIDC step assumes {given.get('role-to-assume')!r}, not {role}")
        if "vars.WHEELMILL_INDEX_REGION" not in str(given.get("aws-region", "")):
            problems.append(f"{name}: the OIDC step's region is not vars.WHEELMILL_INDEX_REGION")
        problems += [
            f"{name}: {label(steps(job)[i])}: reaches the index before the OIDC step"
            for i in bucket_steps(job)
            if i < assumed[0]
        ]
    return problems


def index_root_problems(workflow: Workflow) -> list[str]:
    """The bucket is named one way, from the variable; and a job that builds nothing writes
    the bucket, never the runner's own tree (gone when the job ends)."""
    problems = []
    for name, job in jobs(workflow).items():
        roots = [env_of(job).get("WHEELMILL_INDEX_ROOT")] + [env_of(s).get("WHEELMILL_INDEX_ROOT") for s in steps(job)]
        problems += [
            f"{name}: WHEELMILL_INDEX_ROOT is {root!r}, not {BUCKET_ROOT}"
            for root in roots
            if root not in (None, BUCKET_ROOT)
        ]
        if any(BUILDS_A_CELL.search(line) for line in run_lines(job)):
            continue
        reaching = set(bucket_steps(job))
        problems += [
            f"{name}: {label(step)}: writes the runner's own index, not the bucket"
            for index, step in enumerate(steps(job))
            if WRITES_INDEX.search(str(step.get("run", ""))) and index not in reaching
        ]
    return problems


def sync_problems(workflow: Workflow) -> list[str]:
    """Nothing copies the index down or up whole: every job writes its own objects."""
    return [
        f"{name}: syncs the index: {line.strip()}"
        for name, job in jobs(workflow).items()
        for line in run_lines(job)
        if SYNC.search(line)
    ]


def apt_problems(workflow: Workflow) -> list[str]:
    """A runner's package lists may be stale: apt-get update comes before any apt-get install."""
    problems = []
    for name, job in jobs(workflow).items():
        updated = False
        for line in run_lines(job):
            if re.search(r"\bapt-get\s+(?:-\S+\s+)*install\b", line) and not updated:
                problems.append(f"{name}: apt-get install before apt-get update: {line.strip()}")
            updated = updated or bool(re.search(r"\bapt-get\s+(?:-\S+\s+)*update\b", line))
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
    ordering_problems,
    oidc_problems,
    index_root_problems,
    sync_problems,
    apt_problems,
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


@pytest.mark.parametrize(
    ("name", "writes"), [("build", "read-only"), ("release", "read-write"), ("nightly", "read-write")]
)
def test_every_build_job_shares_the_fleets_served_index_cache_and_registry(name: str, writes: str) -> None:
    """Each build job looks its build keys up in the served index, compiles through the shared
    tier (disk, then S3) with credentials from the cache's role assumed before the build, and
    pulls its builder image from the registry; build.yml writes none of them (the read-only
    role), release.yml and nightly.yml write them (the cache's role, a registry login)."""
    building = {
        key: job
        for key, job in jobs(load(name)).items()
        if any(re.search(r"wheelmill\s+(build|release)\b.*--cell", line) for line in run_lines(job))
    }
    assert building, f"{name}: a job that builds cells"
    for key, job in building.items():
        env = env_of(job)
        assert env["WHEELMILL_SERVED_INDEX"] == "${{ vars.WHEELMILL_SERVED_INDEX }}", f"{name}/{key}"
        assert env["WHEELMILL_IMAGE_REGISTRY"] == "${{ vars.WHEELMILL_IMAGE_REGISTRY }}", f"{name}/{key}"
        assert "'disk,s3'" in env["WHEELMILL_COMPILER_CACHE_TIERS"] and "WHEELMILL_CACHE_BUCKET" in str(
            env["WHEELMILL_COMPILER_CACHE_S3"]
        ), f"{name}/{key}"
        assert env["WHEELMILL_SHARED_WRITES"] == writes, f"{name}/{key}"
        assert "SCCACHE_GHA_ENABLED" not in env, f"{name}/{key}: the Actions cache is not the fleet's"
        (cache,) = cache_steps(job)
        assert role_of(job, cache) == (CACHE_READ_ROLE if writes == "read-only" else CACHE_ROLE), f"{name}/{key}"
        assert cache < build_step(job), f"{name}/{key}: the cache's credentials come before the build"
        logins = [i for i, step in enumerate(steps(job)) if "docker login" in str(step.get("run", ""))]
        if writes == "read-only":
            assert logins == [] and not reads_secret(job), f"{name}/{key}: pulls anonymously, reads no secret"
        else:
            assert logins and logins[0] < build_step(job), f"{name}/{key}: logged in before the build pushes"


def test_build_runs_on_pull_requests_and_main_and_never_publishes() -> None:
    workflow = load("build")
    on = triggers(workflow)
    assert on.keys() == {"pull_request", "push"}
    assert on["push"] == {"branches": ["main"]}  # tags go to release.yml
    assert on["pull_request"] is None  # every pull request, forks included
    assert pr_cancel_problems(workflow) == []
    assert publishing_jobs(workflow) == {}
    # read-only: the one token a job asks for is the compiler cache's read-only role's, in no
    # environment, which the index's role (it trusts its environments only) refuses
    assert [key for key, job in jobs(workflow).items() if _asks_for_a_token(job.get("permissions"))] == ["build"]
    assert reads_the_cache_only(jobs(workflow)["build"])
    assert not _asks_for_a_token(workflow.get("permissions"))
    assert index_jobs(workflow) == {}
    plan = " ".join(run_lines(jobs(workflow)["plan"]))
    assert "--changed-files changed.txt" in plan
    assert 'git diff --name-only "$range"' in plan


def publish_step(job: Job, command: str) -> int:
    """The step that runs ``command`` against the bucket (its WHEELMILL_INDEX_ROOT)."""
    found = [i for i in bucket_steps(job) if command in str(steps(job)[i].get("run", ""))]
    assert len(found) == 1, f"one step runs {command!r} against the bucket"
    return found[0]


def build_step(job: Job) -> int:
    return next(i for i, step in enumerate(steps(job)) if BUILDS_A_CELL.search(str(step.get("run", ""))))


@pytest.mark.parametrize(
    ("name", "command"), [("release", 'release publish --tag "$TAG"'), ("nightly", "release publish --nightly")]
)
def test_each_build_job_publishes_its_own_cell_into_the_bucket(name: str, command: str) -> None:
    """After its cell is built, in the same job: credentials by OIDC, then the one cell under
    the runner's output root published straight into the bucket. Nothing syncs the index."""
    build = jobs(load(name))["build"]
    built, assumed, published = build_step(build), index_oidc_steps(build)[0], publish_step(build, command)
    assert "--no-publish" in str(steps(build)[built]["run"])  # the build itself writes no index
    assert built < assumed < published
    assert env_of(steps(build)[published])["WHEELMILL_INDEX_ROOT"] == BUCKET_ROOT
    assert "WHEELMILL_INDEX_ROOT" not in env_of(build)  # the build itself uses the runner's tree
    assert env_of(steps(build)[published])["AWS_ENDPOINT_URL_S3"] == "${{ vars.WHEELMILL_INDEX_ENDPOINT }}"


@pytest.mark.parametrize("name", NAMES)
def test_no_workflow_syncs_the_index_or_locks_it(name: str) -> None:
    text = (WORKFLOWS / f"{name}.yml").read_text(encoding="utf-8")
    assert not SYNC.search(text) and "--delete" not in text
    assert INDEX_GROUP not in text
    assert not any(key in text for key in STATIC_KEYS)
    assert sync_problems(load(name)) == ordering_problems(load(name)) == []


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("build", set()),
        ("release", {"build", "render", "coverage", "gpu", "record-gpu", "promote", "final-images"}),
        ("nightly", {"build", "prune"}),
    ],
)
def test_every_job_that_reaches_the_index_gets_credentials_by_oidc(name: str, expected: set[str]) -> None:
    workflow = load(name)
    assert index_jobs(workflow).keys() == expected
    assert oidc_problems(workflow) == []
    for job in index_jobs(workflow).values():
        (assumed,) = index_oidc_steps(job)
        assert SHA_PINNED.fullmatch(str(steps(job)[assumed]["uses"]))
        assert not {"aws-access-key-id", "aws-secret-access-key"} & set(steps(job)[assumed]["with"])


def test_release_runs_on_version_tags_and_builds_or_promotes() -> None:
    workflow = load("release")
    assert triggers(workflow) == {"push": {"tags": ["v*"]}}
    # rcs queue behind rcs, finals behind finals: a final beside its rc waits for its record (promote --wait)
    group = "release-${{ contains(github.ref_name, '-rc') && 'rc' || 'final' }}"
    assert workflow["concurrency"] == {"group": group, "cancel-in-progress": False, "queue": "max"}
    every = jobs(workflow)
    assert every["build"]["if"] == "needs.plan.outputs.action == 'build'"
    assert every["promote"]["if"] == "needs.plan.outputs.action == 'promote'"
    # (the GPU stage's environment holds the GPU runners' signing key; it publishes nothing)
    assert {job["environment"] for job in publishing_jobs(workflow).values()} == {"release", "gpu"}
    assert [line for line in run_lines(every["gpu"]) if PUBLISHES.search(line)] == []
    # the publish job is gone: what is left after the cells is render, then verify, of the bucket
    assert "publish" not in every
    render = every["render"]
    assert render["needs"] == ["plan", "build"]
    assert env_of(render)["WHEELMILL_INDEX_ROOT"] == BUCKET_ROOT
    lines = [line for line in run_lines(render) if "wheelmill index" in line]  # then the coverage page
    assert re.findall(r"wheelmill index (\w+)", " ".join(lines)) == ["render", "verify"]
    assert all('"${args[@]}"' in line for line in lines)  # the run's channels, not every channel
    promote_run = " ".join(run_lines(every["promote"]))
    assert 'wheelmill release promote --from test --to release --wait 18000 "$VERSION"' in promote_run
    assert every["promote"]["timeout-minutes"] * 60 > 18000, "the job outlives its wait"
    assert env_of(every["promote"])["WHEELMILL_INDEX_ROOT"] == BUCKET_ROOT
    # the record is read through wheelmill (its objects, read whole), never as a file of the tree
    promote_lines = " ".join(run_lines(every["promote"]))
    assert 'wheelmill release show --track release "$VERSION" --json' in promote_lines
    assert "releases/release/" not in promote_lines
    assert "download-artifact" not in str(every["promote"])  # nothing of the rc passes through the runner


def test_a_release_candidate_is_proven_on_gpu_runners_before_promotion() -> None:
    """Built on CPU runners, proven on GPU runners: the GPU stage runs per covered cell and
    runner label from the plan, says which runner it ran on, reads the served test channel,
    signs its report with the GPU runners' key (a secret of the gpu environment, reaching
    that step alone), and its reports with their statements (one artifact per cell and
    runner) reach the rc's record in the bucket, which promotion reads; both count a GPU stage
    only as a GPU runner's committed public key verifies it."""
    every = jobs(load("release"))
    gpu = every["gpu"]
    assert gpu["needs"] == ["plan", "render"] and gpu["runs-on"] == "${{ matrix.runner }}"
    assert gpu["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.gpu-matrix) }}"
    assert gpu["strategy"]["fail-fast"] is False and gpu["environment"] == "gpu"
    (signs,) = [step for step in steps(gpu) if reads_secret(step)]
    assert signs["env"] == {"WHEELMILL_SIGNING_KEY": "${{ secrets.WHEELMILL_GPU_SIGNING_KEY }}"}
    assert "wheelmill test-gpu" in signs["run"] and not reads_secret({k: v for k, v in gpu.items() if k != "steps"})
    for job in ("record-gpu", "promote"):
        assert env_of(every[job])["WHEELMILL_GPU_TRUSTED_KEYS"] == "keys/gpu-runners"
    assert gpu["permissions"] == {"contents": "read", "id-token": "write"}
    # Its own rc's files, named by the rc's record (read with the index's read-only role): a
    # re-run after a newer rc tests its own.
    assert any(
        'wheelmill test-gpu --cell "$CELL" --runner "$RUNNER" --track test --release "$VERSION" --index-url' in line
        for line in run_lines(gpu)
    )
    assert gpu["env"]["VERSION"] == "${{ needs.plan.outputs.version }}"
    assert gpu["env"]["WHEELMILL_INDEX_ROOT"] == BUCKET_ROOT
    (assumed,) = index_oidc_steps(gpu)
    assert steps(gpu)[assumed]["with"]["role-to-assume"] == INDEX_READ_ROLE
    assert gpu["env"]["RUNNER"] == "${{ matrix.runner }}"
    uploads = [step for step in steps(gpu) if "upload-artifact" in step.get("uses", "")]
    assert [step["with"]["name"] for step in uploads] == ["gpu-report-${{ matrix.cell }}-${{ matrix.runner }}"]
    assert "wheels/${{ matrix.cell }}/gpu-report.json.intoto.jsonl" in uploads[0]["with"]["path"].splitlines()
    assert "gpu-matrix" in every["plan"]["outputs"]
    record = every["record-gpu"]
    assert record["needs"] == ["plan", "render", "gpu"] and record["if"].startswith("always() && ")
    assert "needs.render.result == 'success'" in record["if"]
    assert env_of(record)["WHEELMILL_INDEX_ROOT"] == BUCKET_ROOT
    publish_step(record, 'wheelmill release record-gpu --track test "$VERSION"')


def test_the_coverage_page_is_written_after_every_cell_failed_or_not_and_after_the_gpu_stage_is_recorded() -> None:
    """docs/coverage.md: the rc's coverage page is written into the bucket by a job of its own
    after every cell's job, also where one failed (its recorded failure is what the page is
    for), and again as the last step of record-gpu (the GPU stages recorded), with the served
    index's URL for the finder's pip and uv lines and its access logs for the wants."""
    every = jobs(load("release"))
    page_job = every["coverage"]
    assert page_job["needs"] == ["plan", "build", "render"]
    assert page_job["if"] == "always() && needs.plan.outputs.action == 'build'"
    for job in (page_job, every["record-gpu"]):
        page = publish_step(job, 'wheelmill coverage --track test --page --upstream "$VERSION"')
        assert page == len(steps(job)) - 1
        said = env_of(steps(job)[page])
        assert said["WHEELMILL_SERVED_INDEX"] == "${{ vars.WHEELMILL_SERVED_INDEX }}"
        assert said["WHEELMILL_ACCESS_LOGS"] == "${{ vars.WHEELMILL_ACCESS_LOGS }}"
        assert {**env_of(job), **said}["VERSION"] == "${{ needs.plan.outputs.version }}"
    assert any("wheelmill release record-gpu" in str(step.get("run", "")) for step in steps(every["record-gpu"]))


def test_nightly_runs_daily_publishes_and_prunes() -> None:
    workflow = load("nightly")
    on = triggers(workflow)
    assert on.keys() == {"schedule", "workflow_dispatch"}
    assert len(on["schedule"][0]["cron"].split()) == 5
    assert publishing_jobs(workflow).keys() == {"build", "prune"}
    every = jobs(workflow)
    # only main publishes: a manual run elsewhere builds and tests, in no environment
    build = every["build"]
    assert build["environment"] == "${{ github.ref == 'refs/heads/main' && 'nightly' || '' }}"
    assert steps(build)[publish_step(build, "wheelmill release publish --nightly")]["if"] == (
        "github.ref == 'refs/heads/main'"
    )
    # the credentials come after a failed build too, which records its failure and nothing else
    assert (
        steps(build)[index_oidc_steps(build)[0]]["if"] == "(success() || failure()) && github.ref == 'refs/heads/main'"
    )
    failure = steps(build)[publish_step(build, "wheelmill release record-failure --nightly")]
    assert failure["if"] == "failure() && github.ref == 'refs/heads/main'"
    # one version for the run, the plan job's: a job that clones after a final tag takes it too
    assert every["plan"]["outputs"]["version"] == "${{ steps.plan.outputs.version }}"
    assert build["env"]["VERSION"] == "${{ needs.plan.outputs.version }}"
    nightly_commands = [line for line in run_lines(build) if "wheelmill release" in line]
    assert len(nightly_commands) == 3 and all('--nightly --version "$VERSION"' in line for line in nightly_commands)
    prune = every["prune"]
    assert prune["needs"] == ["plan", "build"] and prune["if"] == "github.ref == 'refs/heads/main'"
    assert env_of(prune)["WHEELMILL_INDEX_ROOT"] == BUCKET_ROOT
    assert re.findall(r"wheelmill (release prune --track nightly --keep 14|index \w+)", " ".join(run_lines(prune))) == [
        "release prune --track nightly --keep 14",
        "index render",
        "index verify",
        "index sweep",
    ]
    assert workflow["concurrency"] == {"group": "nightly", "cancel-in-progress": False, "queue": "max"}


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
        lambda w: job_in(w, "render")["permissions"].update(contents="write"),
        permission_problems,
        "render: permissions grant a write",
        id="job-write",
    ),
    pytest.param(
        "nightly",
        lambda w: job_in(w, "upstream")["permissions"].update(issues="write"),
        permission_problems,
        "upstream: opens a pull request with permissions other than",
        id="pull-request-job-writes-more",
    ),
    pytest.param(
        "nightly",
        lambda w: job_in(w, "upstream").update(environment="nightly"),
        permission_problems,
        "upstream: opens a pull request in an environment",
        id="pull-request-job-in-an-environment",
    ),
    pytest.param(
        "nightly",
        lambda w: job_in(w, "prune")["permissions"].update({"pull-requests": "write"}),
        permission_problems,
        "prune: permissions grant a write",
        id="pull-request-write-elsewhere",
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
        "render: deploys to environment 'release'",
        id="pr-reaches-release",
    ),
    # secrets
    pytest.param(
        "release",
        lambda w: job_in(w, "render")["env"].update(KEY=READS_X),
        secret_scope_problems,
        "render: a secret at job level",
        id="job-level-secret",
    ),
    pytest.param(
        "release",
        lambda w: step_in(w, "render", "Verify the index").update(env={"KEY": READS_X}),
        secret_scope_problems,
        "neither logs in to a registry nor signs",
        id="secret-unused",
    ),
    pytest.param(
        "release",
        lambda w: step_in(w, "build", "Publish the cell into the index").update(
            env={"WHEELMILL_SIGNING_KEY": "${{ secrets.WHEELMILL_SIGNING_KEY }}"}
        ),
        secret_scope_problems,
        "neither logs in to a registry nor signs",
        id="signing-key-where-nothing-signs",
    ),
    pytest.param(
        "nightly",
        lambda w: step_in(w, "prune", "Keep the 14 newest nightlies").update(run=READS_X),
        secret_scope_problems,
        "outside",
        id="secret-in-run",
    ),
    # concurrency: ordering only, never a lock around the index
    pytest.param(
        "release",
        lambda w: job_in(w, "promote").update(concurrency={"group": INDEX_GROUP, "cancel-in-progress": False}),
        ordering_problems,
        "promote: concurrency group index-publish",
        id="index-lock",
    ),
    pytest.param(
        "nightly",
        lambda w: job_in(w, "prune").update(concurrency={"group": "prune"}),
        ordering_problems,
        "prune: a concurrency group around a job that writes the index",
        id="lock-around-a-writer",
    ),
    pytest.param(
        "nightly",
        lambda w: w["concurrency"].update({"cancel-in-progress": True}),
        ordering_problems,
        "workflow-level concurrency may cancel",
        id="workflow-cancels-publish",
    ),
    pytest.param(
        "release",
        lambda w: w["concurrency"].pop("queue"),
        ordering_problems,
        "no queue: max",
        id="third-run-cancels-the-pending-one",
    ),
    # OIDC
    pytest.param(
        "build",
        lambda w: step_in(w, "build", OIDC_ACTION)["with"].update({"role-to-assume": INDEX_ROLE}),
        pull_request_problems,
        "build: asks for an OIDC token",
        id="pr-id-token",
    ),
    pytest.param(
        "build",
        lambda w: job_in(w, "build").update(environment="release"),
        pull_request_problems,
        "build: asks for an OIDC token",
        id="pr-cache-token-in-an-environment",
    ),
    pytest.param(
        "build",
        lambda w: job_in(w, "plan")["permissions"].update({"id-token": "write"}),
        oidc_problems,
        "plan: asks for an OIDC token but never reaches the index",
        id="token-without-a-step",
    ),
    pytest.param(
        "build",
        lambda w: w.update(permissions={"id-token": "write"}),
        pull_request_problems,
        "workflow: asks for an OIDC token",
        id="pr-workflow-id-token",
    ),
    pytest.param(
        "release",
        lambda w: job_in(w, "render")["permissions"].pop("id-token"),
        oidc_problems,
        "render: reaches the index without exactly",
        id="no-id-token",
    ),
    pytest.param(
        "release",
        lambda w: job_in(w, "promote")["steps"].remove(step_in(w, "promote", OIDC_ACTION)),
        oidc_problems,
        "promote: no OIDC step",
        id="no-oidc-step",
    ),
    pytest.param(
        "release",
        lambda w: step_in(w, "record-gpu", OIDC_ACTION)["with"].update({"aws-access-key-id": READS_X}),
        oidc_problems,
        "static key (aws-access-key-id)",
        id="static-key-input",
    ),
    pytest.param(
        "nightly",
        lambda w: step_in(w, "prune", "Keep the 14 newest nightlies").update(env={"AWS_SECRET_ACCESS_KEY": READS_X}),
        oidc_problems,
        "static key (AWS_SECRET_ACCESS_KEY)",
        id="static-key-env",
    ),
    pytest.param(
        "release",
        lambda w: step_in(w, "final-images", OIDC_ACTION)["with"].update({"role-to-assume": "arn:aws:iam::1:role/x"}),
        oidc_problems,
        "final-images: the OIDC step assumes 'arn:aws:iam::1:role/x'",
        id="another-role",
    ),
    pytest.param(
        "release",
        lambda w: job_in(w, "build")["steps"].append(
            job_in(w, "build")["steps"].pop(index_oidc_steps(job_in(w, "build"))[0])
        ),
        oidc_problems,
        "build: Publish the cell into the index: reaches the index before the OIDC step",
        id="oidc-too-late",
    ),
    pytest.param(
        "release",
        lambda w: job_in(w, "render").pop("environment"),
        oidc_problems,
        "render: reaches the index in no environment",
        id="no-environment",
    ),
    pytest.param(
        "nightly",
        lambda w: job_in(w, "plan")["permissions"].update({"id-token": "write"}),
        oidc_problems,
        "plan: asks for an OIDC token but never reaches the index",
        id="idle-id-token",
    ),
    # the bucket
    pytest.param(
        "release",
        lambda w: job_in(w, "promote")["env"].pop("WHEELMILL_INDEX_ROOT"),
        index_root_problems,
        "promote: Promote the rc's wheels from test to release: writes the runner's own index",
        id="promote-into-the-runners-tree",
    ),
    pytest.param(
        "nightly",
        lambda w: job_in(w, "prune")["env"].update(WHEELMILL_INDEX_ROOT="s3://wheels/index"),
        index_root_problems,
        "prune: WHEELMILL_INDEX_ROOT is 's3://wheels/index'",
        id="literal-bucket",
    ),
    pytest.param(
        "release",
        lambda w: job_in(w, "render")["steps"].append({"run": "aws s3 sync wheels/index/ s3://b/index/"}),
        sync_problems,
        "render: syncs the index",
        id="sync",
    ),
    pytest.param(
        "nightly",
        lambda w: job_in(w, "prune")["steps"].insert(2, {"run": "sudo apt-get install -y -qq jq\nsudo apt-get update"}),
        apt_problems,
        "prune: apt-get install before apt-get update",
        id="apt-install-first",
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


@pytest.mark.parametrize(
    ("building", "joining", "artifact"),
    [
        ("build", "images", "images-${{ matrix.cell }}"),
        ("final-images", "final-manifests", "final-images-${{ matrix.cell }}"),
    ],
)
def test_images_are_built_per_cell_and_each_aarch64_cells_joined_with_its_twins(
    building: str, joining: str, artifact: str
) -> None:
    """The rc's images and the final's are each built in a job per cell on the cell's own
    runner (an aarch64 cell's natively: no emulation), outside any lock; a job after all of
    them joins each aarch64 cell's images with its x86_64 twin's under one tag."""
    every = jobs(load("release"))
    cell_job, join_job = every[building], every[joining]
    assert cell_job["runs-on"] == "${{ matrix.runner }}" and "concurrency" not in cell_job
    assert cell_job["strategy"]["fail-fast"] is False
    images = [line for line in run_lines(cell_job) if "wheelmill image build" in line]
    assert re.findall(r"--edition (\w+)", " ".join(images)) == ["runtime", "devel"]
    assert all('--cell "$CELL"' in line and '--push "$REGISTRY"' in line for line in images)
    uploads = [step["with"]["name"] for step in steps(cell_job) if "upload-artifact" in step.get("uses", "")]
    assert artifact in uploads
    needs = join_job["needs"]
    assert building in ([needs] if isinstance(needs, str) else needs)
    assert any("wheelmill image manifest --cell" in line for line in run_lines(join_job))
    assert not any("qemu" in line for line in run_lines(cell_job))


def test_the_rc_images_install_from_the_bucket_and_are_recorded_there() -> None:
    """`wheelmill image build` fetches what the cell's images install from the bucket (after
    the cell's publish, with the job's OIDC credentials) and records them in the rc's record
    itself: no second publish into the runner's tree, no copy of record objects."""
    every = jobs(load("release"))
    build = every["build"]
    image = next(i for i, step in enumerate(steps(build)) if "wheelmill image build" in str(step.get("run", "")))
    assert publish_step(build, 'release publish --tag "$TAG"') < image and image in bucket_steps(build)
    assert env_of(steps(build)[image])["WHEELMILL_INDEX_ROOT"] == BUCKET_ROOT
    assert sum('wheelmill release publish --tag "$TAG"' in str(step.get("run", "")) for step in steps(build)) == 1
    assert not bucket_steps(every["images"]) and "id-token" not in every["images"]["permissions"]


def test_apt_rule_reads_the_order() -> None:
    job = {"steps": [{"run": "sudo apt-get update"}, {"run": "sudo apt-get install -y -qq jq"}]}
    assert apt_problems({"jobs": {"a": job}}) == []
    assert apt_problems({"jobs": {"a": {"steps": job["steps"][::-1]}}}) == [
        "a: apt-get install before apt-get update: sudo apt-get install -y -qq jq"
    ]


def test_a_failed_cell_of_an_rc_records_its_failure_and_publishes_nothing() -> None:
    build = jobs(load("release"))["build"]
    oidc = steps(build)[index_oidc_steps(build)[0]]
    assert oidc["if"] == "success() || failure()", "credentials after a failed build too, never a cancelled one"
    failure = publish_step(build, "wheelmill release record-failure --tag")
    publish = publish_step(build, "wheelmill release publish --tag")
    assert steps(build)[failure]["if"] == "failure()" and "if" not in steps(build)[publish]
    assert build_step(build) < index_oidc_steps(build)[0] < failure < publish


def test_the_nightly_opens_a_pull_request_with_the_change_upstream_asks_for() -> None:
    """docs/matrix.md#new-torch-releases-on-day-one: a job of its own runs `wheelmill matrix
    upstream --diff` on main and, where the diff is not empty, opens a pull request with the
    matrix's change alone, on one branch, with the workflow's token and no more than it needs."""
    nightly = load("nightly")
    job = job_in(nightly, "upstream")
    assert job["permissions"] == PULL_REQUEST_WRITES and "environment" not in job and not reads_secret(job)
    assert job["if"] == "github.ref == 'refs/heads/main'"
    assert any(re.search(r"wheelmill matrix upstream --diff\b", line) for line in run_lines(job))
    opening = step_in(nightly, "upstream", OPENS_A_PULL_REQUEST)
    assert opening["if"] == "steps.upstream.outputs.changed == 'true'"
    assert opening["with"]["add-paths"] == "recipes/matrix.toml"
    assert opening["with"]["branch"] == "wheelmill/upstream-torch"
    assert [name for name, each in jobs(nightly).items() if opens_a_pull_request(each)] == ["upstream"]
