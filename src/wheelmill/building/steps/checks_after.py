"""Post-build checks, repair, and post-repair checks: the wheel is inspected as built (its
symbols, device code and metadata), repaired by auditwheel with torch and the GPU runtime
excluded, and inspected again as shipped (platform tag, bundled libraries, size, and the
GPU arch record the stamp step wrote, which repair must keep; and the ABI its libraries keep
to, against what its tag and its recipe promise)."""

from __future__ import annotations

import functools
import platform
import shutil
from collections.abc import Sequence
from pathlib import Path

from wheelmill.building.context import Outcome, StepContext
from wheelmill.building.products import BuildEnv, BuildKeys, CheckedEnv, Repaired, ShippedAbi, Stamped, Toolchain
from wheelmill.building.steps.build import arch_record, expected_pins
from wheelmill.checks import CheckResult, require
from wheelmill.checks.abi import describe as describe_abi
from wheelmill.checks.abi import judge_abi, judge_abi_group, judge_cuda_runtime
from wheelmill.checks.contents import judge_arch_record, judge_bundled, judge_label, judge_pins, judge_size
from wheelmill.checks.device import find_cuobjdump, judge_cuda, judge_rocm, scan_cuda, scan_rocm
from wheelmill.checks.platform import Baseline, judge_baseline, judge_machine, judge_platform
from wheelmill.checks.symbols import interpreter_libraries, judge_required, judge_undefined, unresolved_symbols
from wheelmill.config import format_size
from wheelmill.errors import CheckError, CommandFailed, PrecheckError, RepairError
from wheelmill.inputs.archs import CudaArchs, RocmArchs
from wheelmill.inputs.manylinux import manylinux_of
from wheelmill.inputs.variants import Family
from wheelmill.machine.builder_images import BaseKind
from wheelmill.machine.net import sha256_of
from wheelmill.machine.probes import TorchInfo
from wheelmill.machine.process import Runner, base_environment
from wheelmill.machine.toolchain import Toolkit
from wheelmill.planning.spec import CellPlan, RecipeSpec
from wheelmill.wheel.abi import WheelAbi, abi_of
from wheelmill.wheel.buildtags import build_tag
from wheelmill.wheel.elf import ElfSummary, LibraryFinder, system_lib_dirs
from wheelmill.wheel.wheelfile import WheelInfo, inspect_wheel, read_wheel, rewrite_metadata


def post_build_checks(ctx: StepContext, spec: RecipeSpec) -> Outcome:
    checked, runner = ctx.done.get(CheckedEnv), ctx.where.runner
    wheel = ctx.done.get(Stamped, spec.name).wheel
    info = read_wheel(wheel)
    python = ctx.done.get(Toolchain).python
    pins = expected_pins(ctx.done, spec, checked.torch.dist_version)

    def judge(root: Path, elves: list[ElfSummary]) -> list[CheckResult]:
        where = runner.host_path
        system = [where(d) for d in system_lib_dirs(runner.capture(["ldconfig", "-p"]).stdout)]
        finder = LibraryFinder(_search_dirs(runner, checked.torch, checked.toolkit, elves), system, translate=where)
        report = unresolved_symbols(
            elves, root=root, finder=finder, interpreter=interpreter_libraries(where(python), finder)
        )
        results = [
            judge_machine(elves, ctx.run.plan.cell.variant.platform, root=root),
            judge_undefined(report),
            judge_required(elves, spec.symbols),
            _device(runner, checked.toolkit, spec, root, elves),
        ]
        return [*results, judge_pins(info, pins), judge_label(info, spec.version.label)]

    return Outcome(checks=_verdict(ctx, spec, wheel, inspect_wheel(wheel, judge)))


def _search_dirs(runner: Runner, torch: TorchInfo, toolkit: Toolkit | None, elves: Sequence[ElfSummary]) -> list[Path]:
    """Where the loader will find libraries at run time: beside the wheel's own files, in
    torch, in the nvidia-* wheels, and (for a toolkit-only runtime) in the toolkit."""
    dirs = list(dict.fromkeys(e.path.parent for e in elves))
    dirs.append(torch.lib_dir)
    dirs += sorted(torch.site_packages.glob("nvidia/*/lib")) + sorted(torch.site_packages.glob("nvidia/*/lib64"))
    if toolkit:
        dirs += [runner.host_path(toolkit.root / "lib64"), runner.host_path(toolkit.root / "lib")]
    return dirs


def _device(
    runner: Runner, toolkit: Toolkit | None, spec: RecipeSpec, root: Path, elves: list[ElfSummary]
) -> CheckResult:
    required = bool(spec.device_code)
    match spec.archs:
        case None:
            return CheckResult.skipped("device-code", "CPU cell")
        case CudaArchs():
            cuobjdump = find_cuobjdump(runner.host_path(toolkit.bin_dir) if toolkit else None)
            if cuobjdump is None:
                raise PrecheckError(
                    "cuobjdump not found in the toolkit, the nvidia-cuda-cuobjdump wheel or PATH",
                    fix="pip install nvidia-cuda-cuobjdump (wheelmill's setup does)",
                )
            return judge_cuda(scan_cuda(elves, root, cuobjdump), spec.archs, required=required)
        case RocmArchs():
            return judge_rocm(scan_rocm(elves, root), spec.archs, required=required)


def _verdict(ctx: StepContext, spec: RecipeSpec, wheel: Path, results: list[CheckResult]) -> Sequence[CheckResult]:
    """Every verdict logged; a failure keeps the wheel in rejected/ and fails the step."""
    layout = ctx.run.layout

    def reject(what: str, fix: str) -> CheckError:
        layout.rejected.mkdir(parents=True, exist_ok=True)
        kept = layout.rejected / wheel.name
        shutil.copyfile(wheel, kept)
        return CheckError(f"{spec.name}: {what} (wheel kept in {kept})", fix=fix)

    return require(results, ctx.log, failure=reject)


def repair(ctx: StepContext, spec: RecipeSpec) -> Outcome:
    env, torch = ctx.done.get(BuildEnv).env, ctx.done.get(CheckedEnv).torch
    wheel = ctx.done.get(Stamped, spec.name).wheel
    out = ctx.run.layout.build / spec.name / "repaired"
    if out.exists():
        shutil.rmtree(out)
    argv = [str(env.python), "-m", "auditwheel", "repair", "-w", str(out)]
    argv += [arg for pattern in spec.repair_excludes for arg in ("--exclude", pattern)]
    # auditwheel finds what it may graft on the loader path; torch's own libraries are
    # found there too but excluded, so they are never copied in.
    environment = base_environment([env.bin_dir], {"LD_LIBRARY_PATH": str(torch.lib_dir)})
    try:
        ctx.where.runner.run([*argv, str(wheel)], env=environment, log=ctx.log, on_line=ctx.run.on_line)
    except CommandFailed as failed:
        raise RepairError(
            f"{spec.name}: auditwheel repair failed: {failed.last_line()}", fix=f"read {failed.log}"
        ) from None
    wheels = sorted(out.glob("*.whl"))
    if len(wheels) != 1:
        raise RepairError(f"{spec.name}: auditwheel wrote {len(wheels)} wheels", fix=f"read {ctx.log.path}")
    tags = ", ".join(sorted(read_wheel(wheels[0]).platforms))
    check = CheckResult.passed(
        "auditwheel", f"{wheels[0].name}: {tags}, {len(spec.repair_excludes)} libraries excluded"
    )
    wheel, named = named_apart(ctx, spec, wheels[0])
    return Outcome(checks=[check, *named], made=(Repaired(wheel=wheel),))


def named_apart(ctx: StepContext, spec: RecipeSpec, wheel: Path) -> tuple[Path, list[CheckResult]]:
    """The repaired wheel under the name its channel leaves it (``wheelmill.wheel.buildtags``):
    given a build tag, in place of the plain one, where the channel lists this version's name
    from another build; a check saying so."""
    keys = ctx.done.get(BuildKeys)
    scratch = wheel.parent.parent / "tagged"

    @functools.cache
    def given(tag: str | None) -> Path:
        """The wheel with ``tag`` (None: as repaired), written once."""
        return wheel if tag is None else rewrite_metadata(wheel, scratch / tag, version=None, pins={}, build_tag=tag)

    @functools.cache
    def digest(tag: str | None) -> str:
        return sha256_of(given(tag))

    tag = build_tag(wheel.name, key=keys.keys[spec.name].digest, taken=keys.taken, digest=digest)
    if tag is None:
        shutil.rmtree(scratch, ignore_errors=True)
        return wheel, []
    tagged = wheel.with_name(given(tag).name)
    given(tag).replace(tagged)
    wheel.unlink()
    shutil.rmtree(scratch, ignore_errors=True)
    said = f"{tagged.name}: build tag {tag}, as channel {keys.channel} lists this version from another build"
    return tagged, [CheckResult.passed("build-tag", said)]


def host_glibc() -> str:
    """This machine's glibc (``2.36``): what a cell built without a container links against."""
    name, version = platform.libc_ver()
    return version if name == "glibc" and version else "0.0"


_PINS = "containers/pins.toml"
_SHOWN = "docs/matrix.md's table then promises its glibc"


def baseline_of(plan: CellPlan) -> Baseline:
    """The baseline a cell's wheels are held to: the glibc of the base its builder image is
    made FROM (the one docs/matrix.md shows for the variant and that kind of base), or of this
    machine where it builds without a container."""
    image = plan.image
    if image is None:
        glibc = host_glibc()
        return Baseline(
            tag=manylinux_of(glibc),
            built_on=f"this machine (glibc {glibc}, no container)",
            newer="build the cell on a machine with a newer glibc",
        )
    base, variant = image.base, plan.cell.variant
    if base.kind is BaseKind.BOOTSTRAP:
        entry = "-".join(part for part in (variant.base_name, variant.platform_tag) if part)
        arch = "" if variant.platform_tag is None else f" for {variant.platform}"
        return Baseline(
            tag=base.baseline,
            built_on=f"the bootstrapped Debian {base.suite} base{arch}",
            newer=f"give {entry} a newer suite under [bootstrap.suites] in {_PINS} ({_SHOWN})",
        )
    return Baseline(
        tag=base.baseline,
        built_on=f"the registry base {base.reference}",
        newer=f"pin a base of a newer glibc under [bases] in {_PINS}, with its glibc ({_SHOWN})",
    )


def post_repair_checks(ctx: StepContext, spec: RecipeSpec) -> Outcome:
    wheel, torch = ctx.done.get(Repaired, spec.name).wheel, ctx.done.get(CheckedEnv).torch
    info = read_wheel(wheel)
    baseline = baseline_of(ctx.run.plan)

    def judge(root: Path, elves: list[ElfSummary]) -> tuple[list[CheckResult], WheelAbi]:
        abi = abi_of(root, elves)
        return [
            judge_platform(elves, info.platforms),
            judge_baseline(info.platforms, elves, baseline),
            judge_bundled(elves, spec.forbidden),
            judge_size(wheel.stat().st_size, spec.max_wheel_size),
            judge_arch_record(info, arch_record(spec, elves)),  # as shipped: repair must have kept it
            judge_abi(abi, info.tags, spec.abi, recipe_file=str(spec.file)),
            judge_cuda_runtime(elves, root, torch.cuda),
            *([_abi_group(ctx, info, abi)] if spec.group_build else []),
        ], abi

    results, abi = inspect_wheel(wheel, judge)
    return Outcome(checks=_verdict(ctx, spec, wheel, results), made=(ShippedAbi(text=abi.listed),))


def _abi_group(ctx: StepContext, info: WheelInfo, abi: WheelAbi) -> CheckResult:
    cell = ctx.run.plan.cell
    return judge_abi_group(info.tags, info.requires_dist, abi, python=cell.python, torch=cell.variant.torch)


def describe_post_build(_plan: CellPlan, spec: RecipeSpec) -> str:
    parts = ["undefined symbols resolve"]
    presence = "required" if spec.device_code else "if any"
    match spec.family:
        case Family.CUDA:
            parts.append(f"SASS/PTX == {spec.arch_list} ({presence})")
        case Family.ROCM:
            parts.append(f"code objects == {spec.arch_list} ({presence})")
        case Family.CPU:
            pass
    if spec.symbols:
        parts.append(f"exports {', '.join(spec.symbols)}")
    if spec.torch_pin:
        parts.append("Requires-Dist torch pinned exactly")
    if spec.version.label:
        parts.append(f"version label +{spec.version.label}")
    return "; ".join(parts)


def describe_repair(_plan: CellPlan, spec: RecipeSpec) -> str:
    return f"auditwheel repair, {len(spec.repair_excludes)} torch/runtime libraries excluded"


def describe_post_repair(plan: CellPlan, spec: RecipeSpec) -> str:
    bundled = f"nothing bundled from: {', '.join(spec.forbid)} or the excludes"
    # this machine's glibc is known when the step runs; a printed plan is the same everywhere
    baseline = "this machine's glibc" if plan.image is None else baseline_of(plan).tag
    return (
        f"manylinux tag vs GLIBC/GLIBCXX; baseline {baseline}; {bundled}; "
        f"size <= {format_size(spec.max_wheel_size)}; gpu-archs.json as stamped; {describe_abi(spec.abi)}; "
        "CUDA runtimes of its torch's major"
        + (
            "; for every Python and torch of its group: abi3 (or no Python), this cell's Python and torch in its range "
            "(its libraries' stable shims and its Requires-Dist)"
            if spec.group_build
            else ""
        )
    )
