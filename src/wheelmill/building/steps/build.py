"""The build and stamp steps.

The build runs the recipe's command in the cell's build env, without build isolation (so
the extension compiles against the env's torch, not a fresh one pip would download), with
an explicit environment: the variant's toolkit and arch list, and ``MAX_JOBS`` sized to the
free memory. The stamp step then writes what the wheel must declare: the variant's version
label, exact pins on the torch it was built against and on sibling recipes, and the GPU
archs it carries (``gpu-archs.json``, which the index shows and ``wheelmill doctor`` reads).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import Version

from wheelmill.building.compiler_cache import (
    CacheStats,
    CompilerCache,
    cache_check,
    read_stats,
    uncached_nvcc,
    zero_stats,
)
from wheelmill.building.context import Outcome, StepContext
from wheelmill.building.products import BuildEnv, Built, CheckedEnv, Fetched, Repaired, Sources, Stamped
from wheelmill.building.report import Done
from wheelmill.building.steps.provenance import build_record
from wheelmill.checks import CheckResult
from wheelmill.checks.device import carries_device_code
from wheelmill.config import format_size
from wheelmill.errors import BuildError, CommandFailed, EnvError
from wheelmill.inputs.archs import ARCH_RECORD, ArchRecord
from wheelmill.inputs.recipes import TORCH
from wheelmill.inputs.variants import Family
from wheelmill.machine.envs import Env, venv_home
from wheelmill.machine.process import base_environment
from wheelmill.machine.toolchain import Toolkit
from wheelmill.output.report import WheelRecord
from wheelmill.planning.spec import CellPlan, RecipeSpec
from wheelmill.provenance.sbom import SBOM_FILE, sbom_bytes
from wheelmill.wheel.elf import ElfSummary
from wheelmill.wheel.wheelfile import inspect_wheel, read_wheel, rewrite_metadata, stamped_requires


def wheel_of(done: Done, recipe: str) -> Path:
    """The wheel of a recipe built before this one: the tested one (delivered, or found
    published for its build key), else the repaired one, while its install test runs beside
    this step (if that test fails, this recipe stops before anything of it is delivered)."""
    tested = done.find(WheelRecord, recipe)
    return Path(tested.path) if tested else done.get(Repaired, recipe).wheel


def available_memory() -> int:
    """MemAvailable from /proc/meminfo, in bytes (what new processes can get)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def max_jobs(memory: int, per_job: int, cores: int) -> int:
    """Parallel compile jobs that fit in memory and cores, at least one.

    >>> max_jobs(24 * 2**30, 3 * 2**30, 2), max_jobs(5 * 2**30, 3 * 2**30, 16), max_jobs(1, 2**30, 4)
    (2, 1, 1)
    """
    return max(1, min(cores, memory // per_job))


def nvcc_threads(memory: int, per_job: int, jobs: int, cores: int) -> int:
    """The archs one nvcc compiles at once (``--threads``): what memory and cores leave each
    of the ``jobs``. Without it nvcc compiles a file's archs one after another, one core
    busy while the others wait for the one .cu of an extension (measured here, a .cu for six
    archs: 85 s with one thread, 57 s with two on two cores).

    >>> gib = 2**30
    >>> (nvcc_threads(24 * gib, 3 * gib, 2, 2), nvcc_threads(5 * gib, 3 * gib, 1, 16),
    ...  nvcc_threads(128 * gib, 3 * gib, 16, 16))
    (2, 1, 2)
    """
    return max(1, min(cores, memory // (per_job * jobs)))


def gives_nvcc_threads(spec: RecipeSpec) -> bool:
    """Whether wheelmill chooses nvcc's ``--threads`` for ``spec``: in a CUDA cell, unless
    the recipe chooses its own."""
    return spec.family is Family.CUDA and not sets_nvcc_threads(spec.env)


def threads_given(spec: RecipeSpec, threads: int) -> int | None:
    """The ``--threads`` wheelmill gives nvcc in a build of ``spec``: none for one thread
    (nvcc's default), or where it chooses none."""
    return threads if threads > 1 and gives_nvcc_threads(spec) else None


def sets_nvcc_threads(variables: Mapping[str, str]) -> bool:
    """Whether a recipe chooses nvcc's threads itself (flash-attn's NVCC_THREADS, apex's
    ``--threads`` flag): wheelmill's choice must not override it.

    >>> (sets_nvcc_threads({"NVCC_THREADS": "2"}), sets_nvcc_threads({"NVCC_APPEND_FLAGS": "--threads 2"}),
    ...  sets_nvcc_threads({"FORCE_CUDA": "1"}))
    (True, True, False)
    """
    flags = " ".join(variables.get(key, "") for key in ("NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS")).split()
    return "NVCC_THREADS" in variables or any(
        flag in {"-t", "--threads"} or flag.startswith(("--threads=", "-t=")) for flag in flags
    )


def build(ctx: StepContext, spec: RecipeSpec) -> Outcome:
    env, toolkit = ctx.done.get(BuildEnv).env, ctx.done.get(CheckedEnv).toolkit
    _install_dependencies(ctx, spec)
    out = ctx.run.layout.build / spec.name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (ctx.run.layout.build / "tmp").mkdir(exist_ok=True)  # TMPDIR where the cache's server sees it
    source, stable = ctx.done.get(Fetched, spec.name).root, ctx.where.runner.stable_path
    values = {
        "python": str(stable(env.python)),
        "source": str(stable(source)),
        "dist": str(stable(out)),
        **spec.template_values(),
    }
    argv = [fill(part, values) for part in spec.command]
    memory, cores = available_memory(), os.cpu_count() or 1
    jobs = max_jobs(memory, spec.memory_per_job, cores)
    threads = threads_given(spec, nvcc_threads(memory, spec.memory_per_job, jobs, cores))
    cache, stopped, before = _zeroed_cache(ctx, spec, argv, values)
    environment = build_environment(
        spec,
        values,
        env=env,
        cell_root=ctx.run.layout.root,
        toolkit=toolkit,
        jobs=jobs,
        nvcc_threads=threads or 1,
        stable=stable,
        cache=cache,
    )
    given = f"MAX_JOBS={jobs}" + (f", nvcc --threads {threads}" if threads else "")
    ctx.log.note(f"{given} ({format_size(memory)} available, {cores} cores)")
    try:
        ctx.where.runner.run(argv, env=environment, log=ctx.log, cwd=stable(source), on_line=ctx.run.on_line)
    except CommandFailed as failed:
        raise _build_failure(spec, ctx.log.path, failed) from None
    wheels = sorted(out.glob("*.whl"))
    if len(wheels) != 1:
        raise BuildError(
            f"{spec.name}: the build made {len(wheels)} wheels in {out}, not one",
            fix="make the build command write exactly one wheel to {dist}",
        )
    stats = _counted(cache, ctx, before)
    made = Built(wheel=wheels[0], recipe=spec.name, max_jobs=jobs, nvcc_threads=threads, cache=stats)
    checks = [
        CheckResult.passed("wheel", f"{wheels[0].name} ({format_size(wheels[0].stat().st_size)}), {given}"),
        _hermetic(ctx),
    ]
    return Outcome(checks=[*checks, cache_check(cache, stopped=stopped, stats=stats)], made=(made,))


def _zeroed_cache(
    ctx: StepContext, spec: RecipeSpec, argv: Sequence[str], values: Mapping[str, str]
) -> tuple[CompilerCache, bool, CacheStats | None]:
    """The cell's compiler cache with its counters zeroed for this build, and its counts by
    tier then (sccache does not zero those); or none: True where the server answered when
    the cell started and no longer does, False where this build compiles without it by
    choice (nvcc flags sccache does not compile as nvcc does)."""
    cache = ctx.done.find(CompilerCache) or CompilerCache.off("no compiler-cache step ran")
    if not cache.active:
        return cache, False, None
    variables = {**spec.build_variables(), **{key: fill(value, values) for key, value in spec.env.items()}}
    why = uncached_nvcc(variables, argv) if spec.family is Family.CUDA else None
    if why is not None:
        ctx.log.note(f"compiling without the compiler cache: {why}")
        return CompilerCache.off(why), False, None
    refreshed = cache.server.refresh(ctx.log, seen=ctx.run.builds_before()) if cache.server else None
    problem = refreshed or zero_stats(cache, ctx.where.runner)
    if problem is not None:
        ctx.log.note(f"compiling without the compiler cache: {problem}")
        return CompilerCache.off(problem), True, None
    return cache, False, read_stats(cache, ctx.where.runner) if cache.chained else None


def _counted(cache: CompilerCache, ctx: StepContext, before: CacheStats | None) -> CacheStats | None:
    """What the server counted for this build, read-only marked where its shared tiers were;
    a chain located by its tiers (sccache says "Multi-level (3 levels)")."""
    stats = read_stats(cache, ctx.where.runner) if cache.active else None
    if stats is None:
        return None
    location = cache.location if cache.chained else stats.location
    return replace(stats.since(before), read_only=cache.read_only, location=location)


def _hermetic(ctx: StepContext) -> CheckResult:
    if ctx.where.runner.network:
        return CheckResult.warned(
            "hermetic",
            "built with the network: no network namespace here",
            "run as root, or where user namespaces are allowed",
        )
    return CheckResult.passed("hermetic", "built with no network: what it made is what it compiled")


def _build_failure(spec: RecipeSpec, log: Path, failed: CommandFailed) -> BuildError:
    """The first compiler error; or, where the build reached for the network it does not
    have (to download a prebuilt binary, say), that."""
    reached = first_match(log, failed.tail, _NETWORK)
    if reached is not None:
        return BuildError(
            f"{spec.name}: the build tried to reach the network, which a build step does not have: {reached}",
            fix="build from what fetch and the env provide: set the package's switch that forces a build from source, "
            "or add the files to the source",
        )
    return BuildError(
        f"{spec.name}: build failed (exit {failed.returncode}): {first_error(log, failed.tail)}",
        fix=f"read {failed.log}",
    )


def build_environment(
    spec: RecipeSpec,
    values: Mapping[str, str],
    *,
    env: Env,
    cell_root: Path,
    toolkit: Toolkit | None,
    jobs: int,
    nvcc_threads: int = 1,
    stable: Callable[[Path], Path] = lambda path: path,
    cache: CompilerCache | None = None,
) -> dict[str, str]:
    """The explicit environment of a build: env, toolkit and compiler cache on PATH, the
    cache's variables, the spec's (archs), the jobs and nvcc's threads (in
    ``NVCC_PREPEND_FLAGS``: a ``--threads`` of the build's own comes later and wins, and
    sccache runs its steps as many at once), the recipe's own variables; then, for
    CUDA, the nvidia-* wheels' headers and libraries, and the flags that keep build paths
    out of what is compiled. Paths of the cell are named as the build sees them
    (``stable``: in a container, the cell root's fixed mount)."""

    def seen(path: Path) -> Path:  # through the env's site link, as the build sees it
        return stable(via_site(env, path))

    if toolkit is not None:  # the nvidia-* wheels' nvcc lives in the env
        toolkit = replace(toolkit, root=seen(toolkit.root), compiler=seen(toolkit.compiler))
    extra = dict(toolkit.environment()) if toolkit else {}
    extra.update(cache.client_environment(stable(cell_root / "build" / "tmp")) if cache else {})
    extra.update(env.activation(stable))
    extra["PYTHONPATH"] = str(stable(env.site))  # torch (and its headers) from the site link
    extra.update(spec.build_variables())
    extra["MAX_JOBS"] = str(jobs)
    if threads := threads_given(spec, nvcc_threads):
        extra["NVCC_PREPEND_FLAGS"] = f"--threads {threads}"
    extra.update({key: fill(value, values) for key, value in spec.env.items()})
    extra.update(wheel_toolkit_paths(env, stable) if spec.family is Family.CUDA else {})
    prefixes = {stable(cell_root): "/wheelmill", **({toolkit.root: "/toolkit"} if toolkit else {})}
    # In a container (the cell root renamed) the image fixes where its Python is, so no map
    # is needed; and a map naming it (/opt/python/3.13) would differ between the Pythons of a
    # variant on every command line, which the compiler cache hashes. In this machine's view
    # of the cell the Python is under it, the same name for every Python.
    home, renamed = venv_home(env.root), stable(cell_root)
    base = home.parent if home else None  # the installation: its headers are compiled in
    prefixes.update({base: "/python"} if base and (renamed == cell_root or base.is_relative_to(renamed)) else {})
    names = nvcc_stable_names(toolkit, seed=spec.name, cached=cache is not None and cache.active)
    for key, flags in (*prefix_maps(prefixes).items(), ("NVCC_APPEND_FLAGS", names)):
        extra[key] = " ".join([extra[key], *flags] if extra.get(key) else flags)  # after what the recipe sets
    return base_environment(
        [stable(env.bin_dir), *([toolkit.bin_dir] if toolkit else []), *(cache.path() if cache else [])], extra
    )


def wheel_toolkit_paths(env: Env, stable: Callable[[Path], Path] = lambda path: path) -> dict[str, str]:
    """The CUDA libraries' headers and link libraries from the nvidia-* wheels in the env
    (cusparse.h, cublas_v2.h, libcublas.so): torch's headers include them (CUDAContext.h),
    an nvcc-only toolkit lacks them, and these are the very versions torch runs with. Named
    through the env's site link."""
    nvidia = [p / "nvidia" for p in env.site_packages if (p / "nvidia").is_dir()]
    includes = [str(stable(via_site(env, p))) for root in nvidia for p in sorted(root.glob("*/include"))]
    libraries = [str(stable(via_site(env, p))) for root in nvidia for p in sorted(root.glob("*/lib"))]
    return {key: ":".join(paths) for key, paths in (("CPATH", includes), ("LIBRARY_PATH", libraries)) if paths}


def via_site(env: Env, path: Path) -> Path:
    """A path under the env's site-packages named through its site link, which holds no
    Python version (``<env>/lib/python3.11/site-packages/nvidia`` as ``<env>/site/nvidia``).

    >>> env = Env(root=Path("/e"))
    >>> via_site(env, Path("/e/lib/python3.13/site-packages/nvidia/cu13")), via_site(env, Path("/usr/local/cuda"))
    (PosixPath('/e/site/nvidia/cu13'), PosixPath('/usr/local/cuda'))
    """
    under = path.relative_to(env.root).parts if path.is_relative_to(env.root) else ()
    if len(under) >= 3 and under[0] == "lib" and under[1].startswith("python") and under[2] == "site-packages":
        return env.site.joinpath(*under[3:])
    return path


def prefix_maps(prefixes: Mapping[Path, str]) -> dict[str, list[str]]:
    """Compiler flags that write these paths under fixed names into what is compiled (debug
    info, __FILE__), so the same source gives the same bytes whatever the output root, the
    clone's location or the machine's Python. Longest prefix first; nvcc passes them to its
    host compiler.

    >>> flags = prefix_maps({Path("/o/cpu-py311"): "/wheelmill", Path("/o"): "/x"})
    >>> flags["CFLAGS"]
    ['-ffile-prefix-map=/o/cpu-py311=/wheelmill', '-ffile-prefix-map=/o=/x']
    >>> flags["NVCC_APPEND_FLAGS"]
    ['-Xcompiler=-ffile-prefix-map=/o/cpu-py311=/wheelmill', '-Xcompiler=-ffile-prefix-map=/o=/x']
    """
    ordered = sorted(prefixes.items(), key=lambda item: len(str(item[0])), reverse=True)
    maps = [f"-ffile-prefix-map={path}={name}" for path, name in ordered]
    return {"CFLAGS": maps, "CXXFLAGS": maps, "NVCC_APPEND_FLAGS": [f"-Xcompiler={flag}" for flag in maps]}


def nvcc_stable_names(toolkit: Toolkit | None, *, seed: str, cached: bool) -> list[str]:
    """nvcc's flags that keep its process id out of the library's symbols.

    Each file's module id (in the names of its anonymous namespaces' symbols) ends in the
    process id of the nvcc that compiled it, unless ``--frandom-seed`` (CUDA 12.9 on) seeds
    it; the id starts with a hash of the source's path, so one seed for a whole build (the
    recipe's name, the same for every Python) still gives each file its own. Intermediate
    files are named after the process id too (``tmpxft_0000049d_...``), unless
    ``--objdir-as-tempdir`` (CUDA 12.1 on) names them after the object: not through the
    compiler cache, where sccache runs nvcc's steps under names of its own, and fatbinary
    would miss the cubin this flag puts beside the object.

    >>> cuda = Toolkit(family=Family.CUDA, root=Path("/t"), version="13.0", compiler=Path("/t/bin/nvcc"))
    >>> (nvcc_stable_names(cuda, seed="my-ops", cached=True),
    ...  nvcc_stable_names(replace(cuda, version="12.4"), seed="my-ops", cached=False))
    (['--frandom-seed=my-ops'], ['--objdir-as-tempdir'])
    """
    if toolkit is None or toolkit.family is not Family.CUDA:
        return []
    version = Version(toolkit.version)
    names = ["--objdir-as-tempdir"] if version >= Version("12.1") and not cached else []
    return [*names, f"--frandom-seed={seed}"] if version >= Version("12.9") else names


def fill(template: str, values: Mapping[str, str]) -> str:
    """A template of the recipe, filled in (the plan checked its placeholders)."""
    return template.format_map(values)


_COMPILER_ERROR = re.compile(r":\d+(:\d+)?: (fatal )?error\b|^error\b.*:|\berror: ")
# What a process says when it reaches for a network it does not have.
_NETWORK = re.compile(
    r"Network is unreachable|Temporary failure in name resolution|Name or service not known|Could not resolve host|"
    r"Failed to establish a new connection|Connection refused|No route to host|getaddrinfo failed|"
    r"\[Errno (101|111|-2|-3)\]"
)


def first_error(log: Path, tail: tuple[str, ...]) -> str:
    """The first compiler-style error of the build log: the cause, not pip's epilogue."""
    found = first_match(log, tail, _COMPILER_ERROR, skip="subprocess-exited-with-error")
    if found is not None:
        return found
    rest = [line.strip() for line in tail if line.strip()]
    return rest[-1][:240] if rest else "no output"


def first_match(log: Path, tail: tuple[str, ...], pattern: re.Pattern[str], *, skip: str | None = None) -> str | None:
    """The first line of the log's command output that matches ``pattern``."""
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        lines = list(tail)
    for line in lines:
        if not line.startswith("# ") and pattern.search(line) and (skip is None or skip not in line):
            return line.strip()[:240]
    return None


def _install_dependencies(ctx: StepContext, spec: RecipeSpec) -> None:
    if not spec.depends_on:
        return
    wheels = [str(wheel_of(ctx.done, dep)) for dep in spec.depends_on]
    sources = ctx.done.get(Sources).packages
    try:
        ctx.where.backend.install(ctx.done.get(BuildEnv).env, wheels, sources=sources, log=ctx.log, deps=False)
    except CommandFailed as failed:  # the env, not the compile: another exit code
        raise EnvError(
            f"{spec.name}: installing {', '.join(spec.depends_on)} into the build env: {failed.last_line()}",
            fix=f"read {failed.log}",
        ) from None


def stamp(ctx: StepContext, spec: RecipeSpec) -> Outcome:
    """The wheel as published: its version, exact pins and added requirements, its arch
    record, and its SBOM (PEP 770), written before its RECORD: the same inputs, the same bytes."""
    built = ctx.done.get(Built, spec.name).wheel
    info = read_wheel(built)
    version = spec.version.stamp(str(info.version))
    pins = expected_pins(ctx.done, spec, ctx.done.get(CheckedEnv).torch.dist_version)
    dependencies = {canonicalize_name(d) for d in spec.depends_on}
    add = [r for r in spec.run_requires if canonicalize_name(r) not in dependencies]
    record = inspect_wheel(built, lambda _root, elves: arch_record(spec, elves))
    out = ctx.run.layout.build / spec.name / "stamped"
    out.mkdir(parents=True, exist_ok=True)
    final = version or str(info.version)
    made = build_record(
        ctx, spec, project=info.name, version=final, requires=stamped_requires(info, version=final, pins=pins, add=add)
    )
    stamped = rewrite_metadata(
        built,
        out,
        version=version,
        pins=pins,
        add=add,
        dist_files={ARCH_RECORD: record.to_bytes(), SBOM_FILE: sbom_bytes(made.carried())},
    )
    changes = (
        ([f"version {info.version} -> {version}"] if version else []) + [f"{k}=={v}" for k, v in pins.items()] + add
    )
    changes.append(f"{ARCH_RECORD} {record.describe()}")
    changes.append(f"{SBOM_FILE} ({len(made.toolkit_packages) + 1 + bool(made.torch)} inputs by digest)")
    ctx.log.note(f"{built.name} -> {stamped.name}: {', '.join(changes)}")
    return Outcome(
        checks=[CheckResult.passed("metadata", f"{stamped.name}: " + ", ".join(changes))],
        made=(Stamped(wheel=stamped, record=made),),
    )


def arch_record(spec: RecipeSpec, elves: list[ElfSummary]) -> ArchRecord:
    """The arch record of a wheel of ``spec`` whose libraries are ``elves``: the spec's arch
    list where they carry device code (the post-build checks hold them to exactly that list).
    A wheel built once for every torch and Python names its ABI group (``cu130.sm90``),
    not the cell that happened to build it: every cell that takes it checks the same file."""
    built_for = spec.group_build.group if spec.group_build else spec.cell
    return ArchRecord.of_build(
        spec.family, spec.arch_list, built_for, device_code=carries_device_code(elves, spec.family)
    )


def expected_pins(done: Done, spec: RecipeSpec, torch_version: str) -> dict[str, str]:
    """What the wheel must pin exactly: the build's torch (the cell's own, where the cell
    built torch before it), and the sibling recipes it needs."""
    if TORCH in spec.depends_on:
        torch_version = str(read_wheel(wheel_of(done, TORCH)).version)
    pins = {"torch": torch_version} if spec.torch_pin else {}
    for sibling in spec.sibling_pins:
        pins[sibling] = str(read_wheel(wheel_of(done, sibling)).version)
    return pins


def describe_build(_plan: CellPlan, spec: RecipeSpec) -> str:
    parts = [" ".join(spec.command)]
    if spec.depends_on:
        parts.append(f"after installing {', '.join(spec.depends_on)}")
    if spec.arch_variable:
        parts.append(f"{spec.arch_variable}={spec.arch_list}")
    threads = ", nvcc --threads from what is left" if gives_nvcc_threads(spec) else ""
    parts.append(f"MAX_JOBS from free memory ({format_size(spec.memory_per_job)} a job) and cores{threads}")
    parts += [f"{k}={_fill_known(v, spec.template_values())}" for k, v in sorted(spec.env.items())]
    return "; ".join(parts)


def _fill_known(template: str, values: Mapping[str, str]) -> str:
    """A template with what the plan knows filled in ({arch_numbers}); paths stay named."""

    class Known(dict[str, str]):
        def __missing__(self, key: str) -> str:
            return "{" + key + "}"

    return template.format_map(Known(values))


def describe_stamp(_plan: CellPlan, spec: RecipeSpec) -> str:
    torch = "torch==<the torch built in this cell>" if TORCH in spec.depends_on else "torch==<the env's torch>"
    pins = ([torch] if spec.torch_pin else []) + [f"{d}==<as built>" for d in spec.run_requires]
    archs = (
        "cpu"
        if spec.family is Family.CPU
        else f"{spec.family.value} {spec.arch_list} (cpu if it carries no device code)"
    )
    return f"{spec.version.describe()}; Requires-Dist {', '.join(pins) or 'unchanged'}; {ARCH_RECORD} {archs}"
