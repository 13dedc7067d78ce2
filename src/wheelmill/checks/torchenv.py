"""Is the torch in the env the variant's build? Never a silent CPU torch in a CUDA cell.

Nightly and mirrored indexes sometimes hand out a CPU build under a CUDA version (or the
other way round); extensions then build without device code or fail at import on GPUs.
The truth is what torch says of itself (``torch.version.cuda`` / ``.hip`` and the local
label of ``torch.__version__``), not the file name it came from.
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from wheelmill.checks import CheckResult
from wheelmill.inputs.variants import Family, Variant
from wheelmill.machine.probes import TorchInfo


def acceptable_labels(variant: Variant) -> set[str | None]:
    """Local labels the located torch may carry before it is installed."""
    return {variant.label, None} if variant.torch_on_pypi else {variant.label}


def judge_located(version: str, variant: Variant) -> CheckResult:
    """The torch a source offers, judged by its version alone (before installing it)."""
    name = "torch-source"
    try:
        parsed = Version(version)
    except InvalidVersion:
        return CheckResult.failed(name, f"the sources offer torch {version!r}, not a version", "fix the index")
    if parsed.public != variant.torch or parsed.local not in acceptable_labels(variant):
        return CheckResult.failed(
            name,
            f"the sources offer torch {version}, not {variant.torch}+{variant.label}",
            "point WHEELMILL_TORCH_INDEX (or the package sources) at an index with the variant's torch build",
        )
    return CheckResult.passed(name, f"torch {version}")


def judge_torch(info: TorchInfo, variant: Variant) -> list[CheckResult]:
    return [_version(info, variant), _runtime(info, variant), _abi(info)]


def _version(info: TorchInfo, variant: Variant) -> CheckResult:
    name = "torch-version"
    public = Version(info.version).public
    if public != variant.torch:
        return CheckResult.failed(
            name,
            f"torch {info.version} is installed, the variant pins {variant.torch}",
            "fix the lock or the variant's torch pin",
        )
    return CheckResult.passed(name, f"torch {info.version} (distribution {info.dist_version})")


def _runtime(info: TorchInfo, variant: Variant) -> CheckResult:
    name = "torch-variant"
    local = Version(info.version).local
    built_for = f"CUDA {info.cuda}" if info.cuda else f"ROCm {info.hip}" if info.hip else "CPU"
    problem = None
    match variant.family:
        case Family.CPU:
            if info.cuda or info.hip:
                problem = f"a {built_for} torch in a CPU cell"
        case Family.CUDA:
            if not info.cuda:
                problem = f"a {built_for} torch in a CUDA {variant.toolkit_short} cell"
            elif info.cuda != variant.toolkit_short:
                problem = f"torch built for CUDA {info.cuda} in a CUDA {variant.toolkit_short} cell"
        case Family.ROCM:
            if not info.hip or not info.hip.startswith(f"{variant.toolkit_short}."):
                problem = f"a {built_for} torch in a ROCm {variant.toolkit_short} cell"
    if problem is None and local not in (variant.label, None):
        problem = f"torch {info.version} carries label +{local}, not +{variant.label}"
    if problem:
        return CheckResult.failed(
            name,
            problem,
            f"install torch {variant.torch}+{variant.label}: check the torch index and WHEELMILL_TORCH_INDEX",
        )
    return CheckResult.passed(name, f"{built_for} build, label +{local or variant.label}")


def _abi(info: TorchInfo) -> CheckResult:
    value = "1" if info.cxx11_abi else "0"
    return CheckResult.passed("cxx11-abi", f"_GLIBCXX_USE_CXX11_ABI={value} (extensions must match)")
