"""What wheelmill asks of a level-2 env: programs run inside it (passed with ``-c`` so they
work wherever the env is, this machine or a container), each printing one marked JSON
line, and what torch says of itself in its installed files."""

from __future__ import annotations

import ast
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from wheelmill.errors import EnvError
from wheelmill.machine.envs import site_packages

MARK = "WHEELMILL_PROBE "


@dataclass(frozen=True, kw_only=True)
class TorchInfo:
    """What the torch in an env says about itself."""

    version: str  # torch.__version__, e.g. 2.14.1+cu130
    dist_version: str  # the installed distribution's version, e.g. 2.14.1
    cuda: str | None
    hip: str | None
    cxx11_abi: bool
    lib_dir: Path
    site_packages: Path

    def facts(self) -> dict[str, Any]:
        return {"torch": {"version": self.version, "cuda": self.cuda, "hip": self.hip, "cxx11_abi": self.cxx11_abi}}


# Imports the wheel's modules and looks up its torch operators. ``ns::op@Key`` also asks
# the dispatcher whether a kernel is registered for that key (CUDA kernels can be checked
# on a machine without a GPU this way). Where every check passed, it then runs the smoke
# command that ``joined`` says it can (``then``): its exit status is the interpreter's.
IMPORTS = r"""
import importlib, json, sys, traceback
spec = json.loads(sys.argv[1])
results = []
import torch
for module in spec["imports"]:
    try:
        importlib.import_module(module)
        results.append({"name": "import " + module, "ok": True, "detail": "imported"})
    except Exception as exc:
        results.append({"name": "import " + module, "ok": False, "detail": "%s: %s" % (type(exc).__name__, exc)})
for op in spec["ops"]:
    qualified, _, key = op.partition("@")
    namespace, _, name = qualified.partition("::")
    try:
        packet = getattr(getattr(torch.ops, namespace), name.split(".")[0])
        schemas = [str(s) for s in torch._C._jit_get_schemas_for_operator(namespace + "::" + name.split(".")[0])]
        detail = "registered: " + "; ".join(schemas)
        ok = True
        if key:
            ok = torch._C._dispatch_has_kernel_for_dispatch_key(qualified, key)
            detail = ("a %s kernel is registered" % key) if ok else ("no %s kernel is registered" % key)
        results.append({"name": "torch.ops " + op, "ok": ok, "detail": detail})
    except Exception as exc:
        results.append({"name": "torch.ops " + op, "ok": False, "detail": "%s: %s" % (type(exc).__name__, exc)})
print("WHEELMILL_PROBE " + json.dumps(results), flush=True)
then = spec.get("then")
if then and all(r["ok"] for r in results):
    # The smoke command, as its own interpreter would run it (see ``joined``).
    import os, runpy, types
    kind, target, rest = then["kind"], then["target"], then["args"]
    if kind == "-m":
        sys.argv = [target, *rest]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    elif kind == "-c":
        sys.argv = ["-c", *rest]
        main = sys.modules["__main__"] = types.ModuleType("__main__")
        exec(compile(target, "<string>", "exec"), main.__dict__)
    else:
        sys.argv = [target, *rest]
        sys.path[0] = os.path.dirname(os.path.abspath(target))
        runpy.run_path(target, run_name="__main__")
"""


def joined(argv: Sequence[str], python: str) -> dict[str, Any] | None:
    """How the import probe's interpreter runs a smoke command after its checks, instead of a
    second interpreter importing torch again (seconds of CPU a recipe): a command that runs
    ``python`` on ``-c CODE``, ``-m MODULE`` or a script, with its arguments. None for any
    other: another program, or interpreter options (``-X``, ``-W``, ``-I``: its own
    interpreter).

    >>> joined(["/env/bin/python", "-m", "pytest", "-q", "tests"], "/env/bin/python")
    {'kind': '-m', 'target': 'pytest', 'args': ['-q', 'tests']}
    >>> joined(["/env/bin/python", "-X", "dev", "-c", "pass"], "/env/bin/python") is None
    True
    """
    if len(argv) < 2 or argv[0] != python:
        return None
    flag, *rest = argv[1:]
    if flag in {"-c", "-m"}:
        return {"kind": flag, "target": rest[0], "args": rest[1:]} if rest else None
    return None if flag.startswith("-") else {"kind": "script", "target": flag, "args": rest}


def parse(output: str) -> list[dict[str, Any]] | None:
    """The probe's result: its last marked line, or None where it printed none that reads as
    one (an import that ended the interpreter, or printed a marked line of its own)."""
    for line in reversed(output.splitlines()):
        if line.startswith(MARK):
            try:
                data = json.loads(line[len(MARK) :])
            except ValueError:
                return None
            return (
                data
                if isinstance(data, list)
                and all(isinstance(d, dict) and {"name", "ok", "detail"} <= d.keys() for d in data)
                else None
            )
    return None


def read_torch(env_root: Path) -> TorchInfo:
    """torch's own answer to "which build are you?", read from its installed files.

    ``torch/version.py`` is the module ``torch.version`` (``__version__``, ``cuda``, ``hip``),
    written when torch was built; reading it costs milliseconds where ``import torch`` costs
    seconds. The C++ ABI shows in libc10's symbol names (``std::__cxx11::basic_string``).
    """
    found = [p / "torch" / "version.py" for p in site_packages(env_root) if (p / "torch" / "version.py").is_file()]
    if not found:
        raise EnvError(f"{env_root}: torch is not installed in the env", fix="check the lock: it must contain torch")
    package = found[0].parent
    values = _assignments(found[0])
    dist = sorted(package.parent.glob("torch-*.dist-info/METADATA"))
    metadata = dist[0].read_text(encoding="utf-8", errors="replace").splitlines() if dist else []
    dist_version = next((line.split(":", 1)[1].strip() for line in metadata if line.startswith("Version:")), "")
    try:
        Version(str(values.get("__version__")))
    except InvalidVersion:
        raise EnvError(
            f"{found[0]}: __version__ is {values.get('__version__')!r}, not a version",
            fix="the env's torch is damaged or not torch: check the lock",
        ) from None
    return TorchInfo(
        version=str(values.get("__version__", "")),
        dist_version=dist_version or str(values.get("__version__", "")),
        cuda=_optional(values.get("cuda")),
        hip=_optional(values.get("hip")),
        cxx11_abi=_uses_cxx11_abi(package / "lib" / "libc10.so"),
        lib_dir=package / "lib",
        site_packages=package.parent,
    )


def _assignments(path: Path) -> dict[str, object]:
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError, OSError) as exc:
        raise EnvError(
            f"{path}: cannot be read as Python ({exc})", fix="the env's torch is damaged or not torch: check the lock"
        ) from None
    values: dict[str, object] = {}
    for node in tree.body:
        target = (
            node.targets[0]
            if isinstance(node, ast.Assign)
            else node.target
            if isinstance(node, ast.AnnAssign)
            else None
        )
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
            values[target.id] = value.value
    return values


def _optional(value: object) -> str | None:
    return str(value) if value is not None else None


def _uses_cxx11_abi(libc10: Path) -> bool:
    try:
        return b"St7__cxx11" in libc10.read_bytes()
    except OSError:
        return False
