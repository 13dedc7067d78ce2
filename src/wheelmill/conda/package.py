"""A wheel as a conda package: what conda users select by (a build string naming the variant,
the exact torch, ``python_abi``, ``__cuda`` and ``cuda-version`` for CUDA builds, a higher
build number for GPU builds), decided by pure functions; the files staged where conda puts
them; the archive written by py-rattler-build with a fixed timestamp, so the same wheel
gives the same bytes.
"""

from __future__ import annotations

import configparser
import datetime
import posixpath
import re
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from wheelmill.errors import InvalidWheel
from wheelmill.inputs.variants import AARCH64, X86_64, Family, Variant
from wheelmill.wheel.wheelfile import WheelInfo, read_wheel

# Solvers prefer the higher build number among equal versions: a GPU build wins wherever
# its ``__cuda`` requirement is met, the CPU build everywhere else (conda-forge's way).
GPU_BUILD_OFFSET = 100
PURE_BUILD = "py"  # the build string stem of a noarch python package
SUBDIR = "linux-64"
# conda's name of each machine's packages.
SUBDIRS = {X86_64: SUBDIR, AARCH64: "linux-aarch64"}


@dataclass(frozen=True, kw_only=True)
class CondaTarget:
    """What a wheel is repackaged for: the cell's variant and Python."""

    variant: str  # cuda130, cuda130-sm90, cpu
    python: str  # 3.11
    cuda: str | None = None  # the toolkit's major.minor, for a CUDA variant
    gpu: bool = False
    platform: str = X86_64  # the machine: x86_64 packages go to linux-64, aarch64 ones to linux-aarch64

    @classmethod
    def of(cls, variant: Variant, python: str) -> CondaTarget:
        cuda = variant.toolkit_short if variant.family is Family.CUDA else None
        gpu = variant.family is not Family.CPU
        return cls(variant=variant.name, python=python, cuda=cuda, gpu=gpu, platform=variant.platform)

    @property
    def subdir(self) -> str:
        return SUBDIRS[self.platform]

    @property
    def py_tag(self) -> str:
        return "py" + self.python.replace(".", "")

    @property
    def build_stem(self) -> str:
        """``cuda130_py311``: conda build strings allow no ``-``."""
        return f"{self.variant.replace('-', '_').replace('.', '_')}_{self.py_tag}"

    def markers(self) -> dict[str, str]:
        """The PEP 508 environment a requirement's marker is evaluated in: the cell's."""
        return {
            "python_version": self.python,
            "python_full_version": f"{self.python}.0",
            "implementation_name": "cpython",
            "platform_python_implementation": "CPython",
            "sys_platform": "linux",
            "platform_system": "Linux",
            "platform_machine": self.platform,
            "os_name": "posix",
            "extra": "",
        }


@dataclass(frozen=True, kw_only=True)
class CondaMeta:
    """A conda package's identity and dependencies (its ``info/index.json``)."""

    name: str
    version: str
    build: str
    build_number: int
    noarch: bool
    depends: tuple[str, ...]
    constrains: tuple[str, ...] = ()
    summary: str = ""
    license: str | None = None
    arch_subdir: str = SUBDIR  # where it goes unless noarch: its machine's subdir

    @property
    def subdir(self) -> str:
        return "noarch" if self.noarch else self.arch_subdir

    @property
    def filename(self) -> str:
        return f"{self.name}-{self.version}-{self.build}.conda"


def is_pure(info: WheelInfo) -> bool:
    """A wheel for every Python and platform (``py3-none-any``) whose dependencies are the
    same on every Python: one noarch package serves all. One that needs ``tomli`` below
    Python 3.11, say, is a package per Python: a noarch one would carry the dependencies of
    whichever Python it was made for first."""
    return all(tag.abi == "none" and tag.platform == "any" for tag in info.tags) and not any(
        req.marker is not None and _PYTHON_MARKER.search(str(req.marker)) for req in info.requirements()
    )


_PYTHON_MARKER = re.compile(r"\bpython_(full_)?version\b|\bimplementation_version\b")


def conda_meta(info: WheelInfo, target: CondaTarget, *, build_number: int | None = None) -> CondaMeta:
    """The package a wheel becomes for ``target``: pure wheels as noarch python packages,
    the rest per variant and Python, with a local label moved into the build string. Its
    build number is the wheel's build tag's (a rebuild of one version named apart gets a
    package of its own, which solvers prefer the same way), unless one is given."""
    version = info.version.public
    build_number = info.build_number if build_number is None else build_number
    depends = [spec for req in info.requirements() if (spec := conda_spec(req, target)) is not None]
    summary, license_ = (
        str(info.headers.get("Summary", "")),
        info.headers.get("License-Expression") or info.headers.get("License"),
    )
    if is_pure(info):
        python = f"python {info.requires_python}".strip() if info.requires_python else "python"
        return CondaMeta(
            name=info.name, version=version, build=f"{PURE_BUILD}_{build_number}", build_number=build_number,
            noarch=True, depends=(python, *depends), summary=summary, license=_short(license_),
        )  # fmt: skip
    number = build_number + (GPU_BUILD_OFFSET if target.gpu and info.version.local else 0)
    depends = [*python_depends(target), *depends]
    constrains: list[str] = []
    if target.cuda and info.version.local:
        major = target.cuda.split(".")[0]
        depends.append(f"__cuda >={target.cuda}")
        constrains.append(f"cuda-version >={target.cuda},<{int(major) + 1}")
    build = f"{target.build_stem}_{number}" if info.version.local else f"{target.py_tag}_{number}"
    return CondaMeta(
        name=info.name, version=version, build=build, build_number=number, noarch=False,
        depends=tuple(depends), constrains=tuple(constrains), summary=summary, license=_short(license_),
        arch_subdir=target.subdir,
    )  # fmt: skip


def python_depends(target: CondaTarget) -> tuple[str, ...]:
    """What ties a compiled package to one CPython: its minor version and its ABI.

    >>> python_depends(CondaTarget(variant="cpu", python="3.11"))
    ('python >=3.11,<3.12.0a0', 'python_abi 3.11.* *_cp311')
    """
    major, minor = target.python.split(".")
    tag = f"cp{major}{minor}"
    return (f"python >={target.python},<{major}.{int(minor) + 1}.0a0", f"python_abi {target.python}.* *_{tag}")


def conda_spec(req: Requirement, target: CondaTarget) -> str | None:
    """A ``Requires-Dist`` as a conda match spec, or None where its marker excludes the cell.
    An exact pin to a local version (``torch==2.14.1+cu130``) pins the same version built for
    the cell's variant.

    >>> t = CondaTarget(variant="cuda130", python="3.11", cuda="13.0", gpu=True)
    >>> conda_spec(Requirement("torch==2.14.1+cu130"), t)
    'torch ==2.14.1 cuda130_py311_*'
    >>> conda_spec(Requirement("numpy>=1.21,<3"), t)
    'numpy <3,>=1.21'
    >>> conda_spec(Requirement("pytest; extra == 'test'"), t) is None
    True
    """
    if req.marker is not None and not req.marker.evaluate(target.markers()):
        return None
    name = canonicalize_name(req.name)
    specs, local = [], False
    for spec in sorted(req.specifier, key=str):
        version = spec.version
        if spec.operator in ("==", "===") and "+" in version:
            version, local = Version(version).public, True
        operator = "==" if spec.operator == "===" else spec.operator
        specs.append(f"{operator}{version}")
    text = " ".join([name, ",".join(specs)]).strip()
    return f"{text} {target.build_stem}_*" if local else text


def _short(text: str | None) -> str | None:
    """A license field as conda shows it: one line (some wheels carry the whole text)."""
    if not text:
        return None
    first = text.strip().splitlines()[0].strip()
    return first[:120] if first else None


@dataclass(frozen=True)
class Staged:
    root: Path
    timestamp: datetime.datetime


def stage_wheel(info: WheelInfo, meta: CondaMeta, target: CondaTarget, dest: Path) -> Staged:
    """The wheel's files where conda installs them: ``site-packages/`` for a noarch package
    (the installer places it for the env's Python), else ``lib/pythonX.Y/site-packages``;
    ``.data/scripts`` to ``bin``, ``.data/data`` to the prefix. The dist-info stays, so pip
    sees the package, with ``INSTALLER`` saying conda put it there."""
    site = PurePosixPath("site-packages") if meta.noarch else PurePosixPath(f"lib/python{target.python}/site-packages")
    scripts = PurePosixPath("python-scripts") if meta.noarch else PurePosixPath("bin")
    data_dir = f"{info.dist_info.removesuffix('.dist-info')}.data/"
    newest = (1980, 1, 1, 0, 0, 0)
    made: set[Path] = set()
    with zipfile.ZipFile(info.path) as zf:
        for item in zf.infolist():
            if item.is_dir():
                continue
            newest = max(newest, item.date_time)
            where = _placed(item.filename, data_dir, site, scripts, target)
            if where is None:
                continue
            _check_inside(where, info.path)
            out = dest / where
            if out.parent not in made:  # torch's 15,000 files sit in some 1,200 directories
                out.parent.mkdir(parents=True, exist_ok=True)
                made.add(out.parent)
            with zf.open(item) as src, out.open("wb") as sink:
                shutil.copyfileobj(src, sink)
            if item.external_attr >> 16 & 0o111 or where.parent.name == scripts.name:
                out.chmod(0o755)
    (dest / site / info.dist_info / "INSTALLER").write_text("conda\n", encoding="utf-8")
    if not meta.noarch:  # a noarch package's would need the installer's link.json entry points
        for name, text in console_scripts(dest / site / info.dist_info / "entry_points.txt").items():
            (dest / "bin").mkdir(exist_ok=True)
            (dest / "bin" / name).write_text(text, encoding="utf-8")
            (dest / "bin" / name).chmod(0o755)
    return Staged(dest, datetime.datetime(*newest, tzinfo=datetime.UTC))


def console_scripts(entry_points: Path) -> dict[str, str]:
    """The ``bin/`` wrappers of a wheel's console scripts (pip writes them at install; a conda
    package carries them). They run the ``python`` first on PATH, the activated env's: no
    prefix in the file, so the package's bytes do not depend on where it was staged.

    >>> scratch = __import__("tempfile").TemporaryDirectory()
    >>> p = Path(scratch.name) / "entry_points.txt"
    >>> _ = p.write_text("[console_scripts]\\ntorchrun = torch.distributed.run:main\\n")
    >>> print(console_scripts(p)["torchrun"])
    #!/usr/bin/env python
    import sys
    from torch.distributed.run import main
    if __name__ == "__main__":
        sys.argv[0] = sys.argv[0].removesuffix(".exe")
        sys.exit(main())
    <BLANKLINE>
    >>> scratch.cleanup()
    """
    if not entry_points.is_file():
        return {}
    parser = configparser.ConfigParser(delimiters=("=",), interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # script names keep their case
    parser.read_string(entry_points.read_text(encoding="utf-8"))
    scripts = {}
    for name, target in parser.items("console_scripts") if parser.has_section("console_scripts") else []:
        module, _, attr = target.split("[")[0].strip().partition(":")
        top, _, rest = attr.partition(".")
        call = f"{top}.{rest}()" if rest else f"{top}()"
        scripts[name] = (
            f"#!/usr/bin/env python\nimport sys\nfrom {module} import {top}\n"
            f'if __name__ == "__main__":\n    sys.argv[0] = sys.argv[0].removesuffix(".exe")\n    sys.exit({call})\n'
        )
    return scripts


def _placed(
    name: str, data_dir: str, site: PurePosixPath, scripts: PurePosixPath, target: CondaTarget
) -> PurePosixPath | None:
    if not name.startswith(data_dir):
        return site / name
    kind, _, rest = name.removeprefix(data_dir).partition("/")
    places = {"purelib": site, "platlib": site, "scripts": scripts, "data": PurePosixPath(".")}
    if kind == "headers":
        return PurePosixPath(f"include/python{target.python}") / rest
    return places[kind] / rest if kind in places and rest else None


def _check_inside(where: PurePosixPath, wheel: Path) -> None:
    """By the name alone: the staging directory is new and holds only the regular files and
    directories written here, so no link in it leads out (resolving each of torch's 15,000
    paths on the disk took 5 s)."""
    normal = PurePosixPath(posixpath.normpath(where))
    if normal.is_absolute() or normal.parts[:1] == ("..",):
        raise InvalidWheel(f"{wheel}: member {where} points outside the package", fix="rebuild the wheel")


def package_wheel(
    wheel: Path,
    target: CondaTarget,
    out_dir: Path,
    work: Path,
    *,
    build_number: int | None = None,
    compression: int = 3,
) -> tuple[Path, CondaMeta]:
    """Write ``wheel`` as a ``.conda`` package into ``out_dir/<subdir>/``, staged under ``work``."""
    from rattler_build import assemble_package  # noqa: PLC0415 - a 30 MB native module: loaded when used

    info = read_wheel(wheel)
    meta = conda_meta(info, target, build_number=build_number)
    stage = work / f"{meta.name}-{meta.build}"
    if stage.exists():
        shutil.rmtree(stage)
    staged = stage_wheel(info, meta, target, stage)
    (out_dir / meta.subdir).mkdir(parents=True, exist_ok=True)
    made = assemble_package(
        name=meta.name, version=meta.version, target_platform=meta.subdir, build_string=meta.build,
        output_dir=out_dir / meta.subdir, files_dir=staged.root, depends=list(meta.depends),
        constrains=list(meta.constrains), build_number=meta.build_number,
        noarch="python" if meta.noarch else None, summary=meta.summary or None, license=meta.license,
        timestamp=staged.timestamp, compression_level=compression, compression_threads=1,
    )  # fmt: skip
    shutil.rmtree(stage)
    return Path(made.path), meta


def describe(meta: CondaMeta) -> str:
    return f"{meta.subdir}/{meta.filename} ({', '.join(meta.depends)})"
