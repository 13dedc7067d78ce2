"""Post-build checks, repair, and post-repair checks: the wheel is inspected as built (its
symbols, device code and metadata), repaired by auditwheel with torch and the GPU runtime
excluded, and inspected again as shipped (platform tag, bundled libraries, size)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from wheelmill.archs import CudaArchs, RocmArchs
from wheelmill.checks import CheckResult, Verdict, summarize_failures
from wheelmill.checks.contents import judge_bundled, judge_label, judge_pins, judge_size
from wheelmill.checks.device import find_cuobjdump, judge_cuda, judge_rocm, scan_cuda, scan_rocm
from wheelmill.checks.elf import ElfSummary, LibraryFinder, summarize, system_lib_dirs
from wheelmill.checks.platform import judge_baseline, judge_platform
from wheelmill.checks.symbols import interpreter_libraries, judge_required, judge_undefined, unresolved_symbols
from wheelmill.containers.images import BaseKind
from wheelmill.context import CellRun, TorchInfo
from wheelmill.errors import CheckError, PrecheckError, RepairError
from wheelmill.matrix import Family
from wheelmill.plan import arch_list
from wheelmill.recipes import ResolvedRecipe
from wheelmill.runner import CommandFailed, StepLog, base_environment
from wheelmill.steps.build import expected_pins
from wheelmill.wheelfile import extract_binaries, read_wheel


def inspect_wheel(wheel: Path, judge: Callable[[Path, list[ElfSummary]], list[CheckResult]]) -> list[CheckResult]:
    """Unpack the wheel's ELF files into a temporary directory and judge them there."""
    with tempfile.TemporaryDirectory(prefix="wheelmill-inspect-") as tmp:
        root = Path(tmp)
        elves = [summarize(p) for p in extract_binaries(wheel, root)]
        return judge(root, elves)


def post_build_checks(run: CellRun, recipe: ResolvedRecipe, log: StepLog) -> list[CheckResult]:
    _env, torch = run.need_env()
    wheel = run.stamped[recipe.name]
    info = read_wheel(wheel)
    label = run.plan.cell.variant.label if recipe.local_label else None

    def judge(root: Path, elves: list[ElfSummary]) -> list[CheckResult]:
        where = run.runner.host_path
        system = [where(d) for d in system_lib_dirs(run.runner.capture(["ldconfig", "-p"]).stdout)]
        finder = LibraryFinder(_search_dirs(run, torch, elves), system, translate=where)
        report = unresolved_symbols(elves, root=root, finder=finder, interpreter=interpreter_libraries(where(run.need_python()), finder))
        results = [judge_undefined(report), judge_required(elves, recipe.symbols), _device(run, recipe, root, elves)]
        return [*results, judge_pins(info, expected_pins(run, recipe, torch.dist_version)), judge_label(info, label)]

    return _verdict(run, recipe, wheel, inspect_wheel(wheel, judge), log)


def _search_dirs(run: CellRun, torch: TorchInfo, elves: Sequence[ElfSummary]) -> list[Path]:
    """Where the loader will find libraries at run time: beside the wheel's own files, in
    torch, in the nvidia-* wheels, and (for a toolkit-only runtime) in the toolkit."""
    dirs = list(dict.fromkeys(e.path.parent for e in elves))
    dirs.append(torch.lib_dir)
    dirs += sorted(torch.site_packages.glob("nvidia/*/lib")) + sorted(torch.site_packages.glob("nvidia/*/lib64"))
    if run.toolkit:
        dirs += [run.runner.host_path(run.toolkit.root / "lib64"), run.runner.host_path(run.toolkit.root / "lib")]
    return dirs


def _device(run: CellRun, recipe: ResolvedRecipe, root: Path, elves: list[ElfSummary]) -> CheckResult:
    cell = run.plan.cell
    archs = arch_list(cell, recipe)
    required = bool(recipe.device_code)
    match cell.variant.family:
        case Family.CPU:
            return CheckResult.skipped("device-code", "CPU cell")
        case Family.CUDA:
            cuobjdump = find_cuobjdump(run.runner.host_path(run.toolkit.bin_dir) if run.toolkit else None)
            if cuobjdump is None:
                raise PrecheckError(
                    "cuobjdump not found in the toolkit, the nvidia-cuda-cuobjdump wheel or PATH",
                    fix="pip install nvidia-cuda-cuobjdump (wheelmill's setup does)",
                )
            return judge_cuda(scan_cuda(elves, root, cuobjdump), CudaArchs.parse(archs or ""), required=required)
        case Family.ROCM:
            return judge_rocm(scan_rocm(elves, root), RocmArchs.parse(archs or ""), required=required)


def _verdict(run: CellRun, recipe: ResolvedRecipe, wheel: Path, results: list[CheckResult], log: StepLog) -> list[CheckResult]:
    for result in results:
        log.note(f"{result.name}: {result.verdict}: {result.detail}")
    if any(r.verdict is Verdict.FAIL for r in results):
        run.layout.rejected.mkdir(parents=True, exist_ok=True)
        kept = run.layout.rejected / wheel.name
        shutil.copyfile(wheel, kept)
        what, fix = summarize_failures(results)
        raise CheckError(f"{recipe.name}: {what} (wheel kept in {kept})", fix=fix)
    return results


def repair(run: CellRun, recipe: ResolvedRecipe, log: StepLog) -> list[CheckResult]:
    env, torch = run.need_env()
    wheel = run.stamped[recipe.name]
    out = run.layout.build / recipe.name / "repaired"
    if out.exists():
        shutil.rmtree(out)
    excludes = [*run.matrix.excludes_for(run.plan.cell.variant), *recipe.repair_exclude]
    argv = [str(env.python), "-m", "auditwheel", "repair", "-w", str(out)]
    argv += [arg for pattern in excludes for arg in ("--exclude", pattern)]
    # auditwheel finds what it may graft on the loader path; torch's own libraries are
    # found there too but excluded, so they are never copied in.
    environment = base_environment([env.bin_dir], {"LD_LIBRARY_PATH": str(torch.lib_dir)})
    try:
        run.runner.run([*argv, str(wheel)], env=environment, log=log, on_line=run.on_line)
    except CommandFailed as failed:
        raise RepairError(f"{recipe.name}: auditwheel repair failed: {failed.last_line()}", fix=f"read {failed.log}") from None
    wheels = sorted(out.glob("*.whl"))
    if len(wheels) != 1:
        raise RepairError(f"{recipe.name}: auditwheel wrote {len(wheels)} wheels", fix=f"read {log.path}")
    run.repaired[recipe.name] = wheels[0]
    tags = ", ".join(sorted(read_wheel(wheels[0]).platforms))
    return [CheckResult.passed("auditwheel", f"{wheels[0].name}: {tags}, {len(excludes)} libraries excluded")]


def _stand_in(run: CellRun) -> str | None:
    """What the cell is built on instead of the variant's own base, if anything."""
    image = run.plan.image
    if image is None:
        return "this machine's glibc, not in a container"
    if image.base.kind is BaseKind.BOOTSTRAP:
        return f"the bootstrapped Debian {image.base.suite} base, not the manylinux one"
    return None


def post_repair_checks(run: CellRun, recipe: ResolvedRecipe, log: StepLog) -> list[CheckResult]:
    wheel = run.repaired[recipe.name]
    info = read_wheel(wheel)
    variant = run.plan.cell.variant
    forbidden = [*run.matrix.forbid, *run.matrix.excludes_for(variant), *recipe.repair_exclude]
    limit = recipe.max_wheel_size or run.matrix.max_wheel_size

    def judge(_root: Path, elves: list[ElfSummary]) -> list[CheckResult]:
        return [
            judge_platform(elves, info.platforms),
            judge_baseline(info.platforms, variant.glibc, fallback=_stand_in(run)),
            judge_bundled(elves, forbidden),
            judge_size(wheel.stat().st_size, limit),
        ]

    return _verdict(run, recipe, wheel, inspect_wheel(wheel, judge), log)
