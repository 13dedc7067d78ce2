"""Cell steps: before any recipe, make sure the cell can be built where its commands run
(this machine or its container), then make its build env from a hashed lock and prove
the torch in it is the variant's build."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from wheelmill.building.bytecode import BytecodeStore
from wheelmill.building.context import Outcome, StepContext, Where
from wheelmill.building.headers import pin_header_times
from wheelmill.building.products import BuildEnv, CheckedEnv, CondaLock, Sources, Toolchain
from wheelmill.checks import CheckResult, failures, require
from wheelmill.checks.torchenv import judge_torch
from wheelmill.conda import envspec
from wheelmill.config import format_size
from wheelmill.errors import CommandFailed, FetchError, PrecheckError, UsageError, WheelmillError
from wheelmill.index.conda_channels import configured_channels
from wheelmill.index.roots import Index
from wheelmill.inputs.variants import X86_64, Cell, Family
from wheelmill.machine.emulation import Execution, emulation_fix, emulation_problem, execution, host_machine
from wheelmill.machine.envs import Env, link_site, pinned_versions, set_venv_home, site_packages, venv_home
from wheelmill.machine.net import is_transient, sha256_of
from wheelmill.machine.package_sources import PackageSources, machine_sources
from wheelmill.machine.probes import read_torch
from wheelmill.machine.process import HostRunner, Runner, View, base_environment, make_view, wheelmill_command
from wheelmill.machine.toolchain import (
    Found,
    NotFound,
    Toolkit,
    find_compiler,
    find_env_toolkit,
    find_python,
    find_toolkit,
)
from wheelmill.output.layout import CellLayout
from wheelmill.planning.locks import locate_torch, mismatch, none_reachable, path_of, requirements_text
from wheelmill.planning.spec import CellPlan
from wheelmill.retry import TransientError
from wheelmill.settings import EnvBackendName, Settings


def _failure(cell: Cell, step: str, kind: type[WheelmillError] = PrecheckError) -> Callable[[str, str], WheelmillError]:
    return lambda what, fix: kind(f"{cell.id}: {step} failed: {what}", fix=fix)


def pre_checks(ctx: StepContext) -> Outcome:
    """What needs no container: disk, the committed lock, where torch comes from; and on
    this machine (no container) the toolchain too, so every failure shows at once."""
    plan = ctx.run.plan
    toolchain_results, toolchain = ([], None) if plan.image else _toolchain(ctx.where.runner, plan.cell)
    lock_result, origin = _lock(plan)
    torch_result, packages, offline = _torch(ctx)
    conda_results, conda = _conda_lock(ctx) if plan.choices.env_backend is EnvBackendName.CONDA else ([], None)
    checks = [_platform(plan), *toolchain_results, _disk(ctx), lock_result, torch_result, *conda_results]
    # No source reachable, and nothing else wrong: a network failure (retry later), not a cell that cannot build.
    kind = FetchError if offline and failures(checks) == [torch_result] else PrecheckError
    results = require(checks, ctx.log, failure=_failure(plan.cell, "pre-checks", kind))
    assert packages is not None, "the torch-source check passed"
    made: tuple[object, ...] = (
        Sources(packages=packages, lock_origin=origin),
        *([toolchain] if toolchain else []),
        *([conda] if conda else []),
    )
    if toolchain is not None:  # on this machine: the cell at a fixed path, where it can be
        view_result, where = _view(ctx, toolchain)
        results, made = [*results, view_result], (*made, *([where] if where else []))
    return Outcome(checks=results, made=made)


def _platform(plan: CellPlan, host: str | None = None) -> CheckResult:
    """Whether this machine runs the cell's code: natively, or another machine's in the
    cell's container under qemu-user emulation (never on the host: its tools are its own)."""
    target, host = plan.cell.variant.platform, host or host_machine()
    if target != X86_64 and plan.choices.env_backend is EnvBackendName.CONDA:
        return CheckResult.failed(
            "platform",
            f"the conda env backend solves linux-64 envs alone, and {plan.cell.id} is {target}",
            "set WHEELMILL_ENV_BACKEND=uv",
        )
    if execution(target, host) is Execution.NATIVE:
        return CheckResult.passed("platform", f"{target} code, run natively")
    if plan.image is None:
        return CheckResult.failed(
            "platform",
            f"{target} code cannot be built on this {host} machine without a container (--engine none)",
            f"build with an engine (podman or docker), which runs it under emulation; {emulation_fix(target)}",
        )
    problem = emulation_problem(target)
    if problem:
        return CheckResult.failed("platform", f"{target} code on this {host} machine: {problem}", emulation_fix(target))
    return CheckResult.passed("platform", f"{target} code, run under qemu-user emulation in the cell's container")


def _view(ctx: StepContext, toolchain: Toolchain) -> tuple[CheckResult, Where | None]:
    """Where this machine allows a mount namespace, every later command of the cell sees the
    cell at a fixed path, and its Python's installation under it, as in a container: the
    build's paths, which the compiler cache hashes and nvcc compiles into module ids, then
    name neither the output root nor the cell nor the Python's location."""
    python = python_installation(toolchain.python)
    view = make_view(ctx.run.layout.root, python, netless=ctx.where.netless is not None)
    if isinstance(view, str):
        why = (
            f"the build sees the cell where it is ({view}): "
            "its compiles are its own, not shared with other cells or output roots"
        )
        return CheckResult.skipped("stable-paths", why), None
    shown = f"the cell at {view.target}" + (f", Python {python} at {view.target / 'python'}" if python else "")
    return CheckResult.passed("stable-paths", f"{shown} (a mount namespace per command)"), viewed(ctx.where, view)


SYSTEM_PREFIXES = ("/", "/usr", "/usr/local")


def python_installation(python: Path) -> Path | None:
    """The installation a Python runs from, where it is one of its own (pyenv's
    ``versions/3.11.7``, ``/opt/python/3.13``): ``<root>/bin/python3.X``. None for a
    system Python (under ``/usr``), whose directory holds far more than Python.

    >>> (python_installation(Path("/root/.pyenv/versions/3.11.7/bin/python3.11")),
    ...  python_installation(Path("/usr/bin/python3.11")))
    (PosixPath('/root/.pyenv/versions/3.11.7'), None)
    """
    root = python.parent.parent
    return None if not python.is_absolute() or python.parent.name != "bin" or str(root) in SYSTEM_PREFIXES else root


def viewed(where: Where, view: View) -> Where:
    """``where`` (this machine, and its network namespace) with every command in ``view``."""

    def moved(place: Where, *, network: bool) -> Where:
        runner, backend = HostRunner(view=view, network=network), place.backend
        return Where(
            runner=runner,
            backend=type(backend)(
                runner, cache_dir=backend.cache_dir, offline=backend.offline, channels=backend.channels
            ),
        )

    online = moved(where, network=True)
    return replace(online, netless=moved(where.netless, network=False)) if where.netless else online


def toolchain_checks(ctx: StepContext) -> Outcome:
    """Where the commands run (the container, or this machine): Python, compiler, toolkit."""
    plan = ctx.run.plan
    results, toolchain = _toolchain(ctx.where.runner, plan.cell)
    return Outcome(checks=require(results, ctx.log, failure=_failure(plan.cell, "toolchain-checks")), made=(toolchain,))


def _toolchain(runner: Runner, cell: Cell) -> tuple[list[CheckResult], Toolchain | None]:
    (python_check, python), (compiler_check, compiler), (toolkit_check, toolkit) = (
        _python(runner, cell.python),
        _compiler(runner),
        _toolkit(runner, cell),
    )
    made = Toolchain(python=python, toolkit=toolkit, compiler=compiler) if python else None
    return [python_check, compiler_check, toolkit_check], made


def _python(runner: Runner, version: str) -> tuple[CheckResult, Path | None]:
    found = find_python(version, runner)
    if isinstance(found, Found):
        return CheckResult.passed("python", f"CPython {version} at {found.path}"), found.path
    return CheckResult.failed(
        "python",
        f"CPython {version} not found (looked: {'; '.join(found.looked)})",
        f"install it (`pyenv install {version}` or `uv python install {version}`) or put python{version} on PATH",
    ), None


def _compiler(runner: Runner) -> tuple[CheckResult, str | None]:
    """The check, and the compiler as the SBOM names it (``g++ 12.2.0``)."""
    found = find_compiler(runner)
    if isinstance(found, Found):
        return CheckResult.passed("compiler", f"{found.path} {found.version}"), f"{found.path.name} {found.version}"
    return CheckResult.failed(
        "compiler",
        f"no C++ compiler ({'; '.join(found.looked)})",
        "install g++ (Debian: apt-get install g++) or set CXX",
    ), None


def _toolkit(runner: Runner, cell: Cell) -> tuple[CheckResult, Toolkit | None]:
    variant = cell.variant
    found = find_toolkit(variant, runner)
    if found is None:
        return CheckResult.passed("toolkit", "none needed (CPU variant)"), None
    kind = "CUDA" if variant.family is Family.CUDA else "ROCm"
    compiler = "nvcc" if variant.family is Family.CUDA else "hipcc"
    if isinstance(found, Toolkit):
        return CheckResult.passed("toolkit", f"{compiler} {found.version} at {found.compiler}"), found
    if variant.toolkit_wheels:
        # Checked once the env exists: env-checks runs its nvcc.
        return CheckResult.passed(
            "toolkit",
            f"none installed; the locked env brings {', '.join(variant.toolkit_wheels[:1])} "
            f"(pip's full {kind} compiler)",
        ), None
    home = "CUDA_HOME" if variant.family is Family.CUDA else "ROCM_PATH"
    return CheckResult.failed(
        "toolkit",
        f"no {kind} {variant.toolkit_short} toolkit (looked: {'; '.join(found.looked)})",
        f"install {kind} {variant.toolkit} and set {home} to it",
    ), None


def _disk(ctx: StepContext) -> CheckResult:
    need, root = ctx.run.plan.min_free_disk, ctx.run.layout.root
    root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(root).free
    if free < need:
        return CheckResult.failed(
            "disk",
            f"{format_size(free)} free under {root}, {format_size(need)} needed",
            "free space or set WHEELMILL_OUTPUT to a bigger disk",
        )
    return CheckResult.passed("disk", f"{format_size(free)} free (>= {format_size(need)})")


def _lock(plan: CellPlan) -> tuple[CheckResult, str]:
    """A committed lock made for other inputs stops the cell here, before anything builds."""
    committed, cell = path_of(plan.locks_dir, plan.lock.cell), plan.lock.cell  # a slim cell's is its parent's
    if not committed.is_file():
        detail = f"no {committed}: the env is resolved now (`wheelmill lock --cell {cell}` commits one)"
        return CheckResult.passed("lock", detail), "resolved at build time (no committed lock)"
    problem = mismatch(plan.lock, committed)
    if problem:
        why = f"{problem}: the build requirements, the Python or the platform changed"
        return CheckResult.failed("lock", why, f"run `wheelmill lock --cell {cell}` and commit {committed}"), ""
    return CheckResult.passed(
        "lock", f"{committed} matches its inputs ({plan.lock.digest[:12]}...)"
    ), f"committed {committed}"


def _conda_lock(ctx: StepContext) -> tuple[list[CheckResult], CondaLock | None]:
    """The conda backend's lock: the committed one, checked against its specs and the
    channels (a changed spec, an unreachable channel, a package with other bytes stop the
    cell here), else one solved now. Done by ``wheelmill conda lock`` in a process of its
    own (py-rattler's threads, see the publish step)."""
    plan, settings, layout = ctx.run.plan, ctx.run.settings, ctx.run.layout
    try:  # the backend's, found as the run started; none there: say why
        channels = ctx.where.backend.channels or configured_channels(settings.conda_channels, Index.of(settings))
    except UsageError as missing:
        return [
            CheckResult.failed(
                "conda-lock", missing.message, missing.fix or "seed one: wheelmill conda seed --cell <cell> --build-env"
            )
        ], None
    committed, copy = envspec.lock_path(plan.locks_dir, plan.lock.cell), layout.root / "conda-lock.txt"
    argv = wheelmill_command("conda", "lock", "--cell", plan.lock.cell, recipes=settings.recipes)
    argv += [arg for url in channels for arg in ("--channel", url)]
    argv += ["--check"] if committed.is_file() else ["--out", str(copy)]
    try:
        said = (
            HostRunner()
            .run(argv, env=base_environment([]), log=ctx.log, keep_output=True)
            .output.strip()
            .splitlines()[-1]
        )
    except CommandFailed as failed:
        what, fix = failed.child_error()
        return [CheckResult.failed("conda-lock", what, fix or f"read {ctx.log.path}")], None
    if committed.is_file():
        shutil.copyfile(committed, copy)
        return [CheckResult.passed("conda-lock", said)], CondaLock(path=copy, origin=f"committed {committed}")
    return [CheckResult.passed("conda-lock", f"no {committed}: solved now: {said}")], CondaLock(
        path=copy, origin="solved at build time"
    )


def _torch(ctx: StepContext) -> tuple[CheckResult, PackageSources | None, bool]:
    """The torch-source check, the sources it found, and whether no source could be reached."""
    plan = ctx.run.plan
    variant = plan.cell.variant
    # Resolved here, before any container: uv resolves for the lock's target, not this Python.
    outcome = locate_torch(
        variant,
        plan.torch_index,
        machine_sources(ctx.run.settings),
        backend=ctx.where.backend,
        target=plan.lock.target,
        work=ctx.run.layout.root,
        log=ctx.log,
        interpreter=Path(sys.executable),
    )
    if isinstance(outcome, PackageSources):
        passed = CheckResult.passed("torch-source", f"{variant.torch_requirement} from {outcome.describe()}")
        return passed, outcome, False
    if none_reachable(outcome):
        return (
            CheckResult.failed(
                "torch-source",
                f"no package source could be reached: {' | '.join(map(str, outcome))}",
                "check the network and the index URLs (pip's configuration, WHEELMILL_INDEX_URL); build again",
            ),
            None,
            True,
        )
    return (
        CheckResult.failed(
            "torch-source",
            f"{variant.torch_requirement} for Python {plan.cell.python} is in none of: {' | '.join(map(str, outcome))}",
            f"set WHEELMILL_TORCH_INDEX to an index (or mirror) with torch {variant.torch}+{variant.label}, "
            "or put its wheel in a WHEELMILL_FIND_LINKS directory",
        ),
        None,
        False,
    )


def prepare_env(ctx: StepContext) -> Outcome:
    """A fresh env from the committed lock, or from one resolved now, hashes checked."""
    plan, layout, backend = ctx.run.plan, ctx.run.layout, ctx.where.backend
    sources, python = ctx.done.get(Sources), ctx.done.get(Toolchain).python
    committed = path_of(plan.locks_dir, plan.lock.cell)
    try:
        if committed.is_file():
            layout.lock.write_text(committed.read_text(encoding="utf-8"), encoding="utf-8")
        else:
            layout.requirements.write_text(requirements_text(plan.lock.requirements), encoding="utf-8")
            backend.lock(
                layout.requirements,
                layout.lock,
                target=plan.lock.target,
                sources=sources.packages,
                log=ctx.log,
                interpreter=python,
            )
        conda = ctx.done.find(CondaLock)
        env = backend.create(layout.envs / "build", python=python, log=ctx.log, lock=conda.path if conda else None)
        home_as_seen(ctx.where.runner, env, python)
        backend.sync(env, layout.lock, sources=sources.packages, log=ctx.log)
        ctx.log.note(
            f"{pin_header_times(ctx.where.runner.host_path(env.root))} headers' times fixed "
            "(GCC's #pragma once compares them)"
        )
        link_site(env)  # builds import torch through it: one path for every Python
        lend_bytecode(ctx, env)  # what an earlier run compiled: the frontend's torch import
    except CommandFailed as failed:
        if is_transient("\n".join(failed.tail)):
            raise TransientError(f"{failed.argv[1]} {failed.argv[2]}: {failed.last_line()}") from None
        raise
    pins = pinned_versions(layout.lock.read_text(encoding="utf-8"))
    made = BuildEnv(env=env, lock=layout.lock, lock_sha256=sha256_of(layout.lock), pins=pins)
    checks = [
        CheckResult.passed(
            "lock", f"{len(pins)} packages with hashes, {sources.lock_origin}; torch {pins.get('torch')}"
        )
    ]
    if conda is not None:
        packages = envspec.read_lock(conda.path)
        shown = ", ".join(f"{p.name} {p.version}" for p in packages)
        checks.append(
            CheckResult.passed(
                "conda-env",
                f"{len(packages)} conda packages ({shown}), lock {conda.origin}; the uv lock's others into its Python",
            )
        )
    return Outcome(checks=checks, made=(made,))


def home_as_seen(runner: Runner, env: Env, python: Path) -> None:
    """Point a venv's ``home`` (pyvenv.cfg: where its interpreter finds the standard library
    and headers) at its Python's installation as the build sees it: in a view, under the
    fixed path, so the headers compiled in are named the same for every Python. Its links
    stay the real interpreter's, so the env runs outside the view too: there that home is
    not found, and the interpreter takes its installation from where it is."""
    seen, root = runner.stable_path(python), runner.host_path(env.root)
    if seen != python and not env.conda and venv_home(root) is not None:
        set_venv_home(root, seen.parent)


def keep_bytecode(ctx: StepContext, env: Env, what: str) -> None:
    """Keep ``env``'s compiled modules in the bytecode store (``wheelmill.building.bytecode``)."""
    for site in site_packages(ctx.where.runner.host_path(env.root))[:1]:
        ctx.log.note(f"{_bytecode_store(ctx).keep(site)} compiled modules {what}")


def lend_bytecode(ctx: StepContext, env: Env) -> None:
    """Give ``env`` the stored bytecode of every source it holds with the same sha256."""
    for site in site_packages(ctx.where.runner.host_path(env.root))[:1]:
        ctx.log.note(
            f"{_bytecode_store(ctx).lend(site)} compiled modules from the bytecode store, "
            "for sources of the same sha256"
        )


def _bytecode_store(ctx: StepContext) -> BytecodeStore:
    return bytecode_store(ctx.run.settings, ctx.run.layout)


def bytecode_store(settings: Settings, layout: CellLayout) -> BytecodeStore:
    """The one ``WHEELMILL_BYTECODE_STORE`` names (every output root of a machine sharing it:
    what one compiled, the next need not), else the output root's own.

    >>> layout = CellLayout(output=Path("/o"), cell="cpu-py311")
    >>> bytecode_store(Settings(), layout).root
    PosixPath('/o/.cache/bytecode')
    >>> bytecode_store(Settings.from_environ({"WHEELMILL_BYTECODE_STORE": "/machine/bytecode"}), layout).root
    PosixPath('/machine/bytecode')
    """
    return BytecodeStore(settings.bytecode_store or layout.cache / "bytecode")


def env_checks(ctx: StepContext) -> Outcome:
    plan, runner = ctx.run.plan, ctx.where.runner
    env = ctx.done.get(BuildEnv).env
    info = read_torch(runner.host_path(env.root))
    ctx.log.note(
        f"torch/version.py: {info.version}, cuda {info.cuda}, hip {info.hip}; distribution {info.dist_version}"
    )
    installed = ctx.done.get(Toolchain).toolkit
    toolkit_checks, toolkit = (
        ([], installed)
        if installed is not None or not plan.cell.variant.toolkit_wheels
        else _env_toolkit(runner, plan, env)
    )
    results = require(
        [*judge_torch(info, plan.cell.variant), *toolkit_checks], ctx.log, failure=_failure(plan.cell, "env-checks")
    )
    return Outcome(checks=results, made=(CheckedEnv(torch=info, toolkit=toolkit),))


def _env_toolkit(runner: Runner, plan: CellPlan, env: Env) -> tuple[list[CheckResult], Toolkit | None]:
    """Without an installed toolkit, the env's pip wheels must hold the variant's nvcc."""
    variant = plan.cell.variant
    found = find_env_toolkit(variant, env.root, runner)
    if isinstance(found, NotFound):
        detail = f"no nvcc {variant.toolkit_short} in the env ({'; '.join(found.looked)})"
        return [
            CheckResult.failed(
                "env-toolkit", detail, f"check variants.{variant.name}.toolkit-wheels in {plan.variant_file}"
            )
        ], None
    linked = link_dev_names(runner.host_path(found.root / "lib"))
    extra = f"; linked {', '.join(linked)} for the linker" if linked else ""
    return [CheckResult.passed("env-toolkit", f"nvcc {found.version} from pip's wheels at {found.root}{extra}")], found


def link_dev_names(lib_dir: Path) -> list[str]:
    """pip's CUDA wheels ship ``libcudart.so.13`` but not the ``libcudart.so`` a toolkit
    has for ``-lcudart``: add those names, as links, where missing."""
    made = []
    for library in sorted(lib_dir.glob("lib*.so.*")):
        stem = library.name.split(".so.", 1)[0] + ".so"
        dev = lib_dir / stem
        if library.name.count(".") == 2 and not dev.exists() and not dev.is_symlink():
            dev.symlink_to(library.name)
            made.append(stem)
    return made


def describe_pre_checks(plan: CellPlan) -> str:
    where = "the configured package sources" + (f", else {plan.torch_index}" if plan.torch_index else "")
    lock = f"{plan.locks_dir.name}/{plan.lock.cell}.txt, if committed, matches its inputs"
    here = "" if plan.image else _toolchain_detail(plan.cell) + "; "
    torch = f"{plan.cell.variant.torch_requirement} locatable in {where}"
    conda = ""
    if plan.choices.env_backend is EnvBackendName.CONDA:
        conda = (
            f"; {plan.locks_dir.name}/conda/{plan.lock.cell}.txt, if committed, matches its specs (else one solved now)"
        )
    machine = plan.cell.variant.platform
    return f"{machine} code runs here; {here}free disk >= {format_size(plan.min_free_disk)}; {lock}; {torch}{conda}"


def describe_toolchain_checks(plan: CellPlan) -> str:
    return "in the container: " + _toolchain_detail(plan.cell)


def _toolchain_detail(cell: Cell) -> str:
    v = cell.variant
    toolkit = {
        Family.CPU: "no GPU toolkit",
        Family.CUDA: f"nvcc {v.toolkit_short}",
        Family.ROCM: f"hipcc {v.toolkit_short}",
    }[v.family]
    if v.toolkit_wheels:
        toolkit += " (installed, or pip's in the locked env)"
    return f"Python {cell.python}; C++ compiler; {toolkit}"


def describe_prepare_env(plan: CellPlan) -> str:
    requirements = ", ".join(plan.lock.requirements)
    env = "fresh conda env (from its conda lock)" if plan.choices.env_backend is EnvBackendName.CONDA else "fresh env"
    return (
        f"{env} with Python {plan.cell.python} from the committed lock (else one resolved now), "
        f"hashes checked: {requirements}"
    )


def describe_env_checks(plan: CellPlan) -> str:
    v = plan.cell.variant
    runtime = {
        Family.CPU: "a CPU build",
        Family.CUDA: f"built for CUDA {v.toolkit_short} (a CPU torch fails)",
        Family.ROCM: f"built for ROCm {v.toolkit_short} (a CPU torch fails)",
    }[v.family]
    return f"torch is {v.torch}+{v.label}, {runtime}; C++ ABI recorded"
