"""Sharing compiled modules between envs: only where both hold the same source."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import py_compile
import subprocess
import sys
from pathlib import Path

from wheelmill.bytecode import recorded_sources, share_bytecode


def install(site: Path, dist: str, files: dict[str, str]) -> None:
    """A distribution in ``site`` as an installer leaves it: its files and a RECORD with their hashes."""
    rows = []
    for name, text in files.items():
        path = site / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        rows.append(f"{name},sha256={digest},{len(text)}")
    info = site / f"{dist}-1.0.dist-info"
    info.mkdir()
    (info / "RECORD").write_text("\n".join([*rows, f"{info.name}/RECORD,,", "../../bin/tool,sha256=x,1"]) + "\n")


def compiled(site: Path, name: str) -> Path:
    return Path(importlib.util.cache_from_source(str(site / name)))


def test_compiled_modules_are_linked_only_where_the_target_holds_the_same_source(tmp_path: Path) -> None:
    build, test = tmp_path / "build", tmp_path / "test"
    same = {"pkg/__init__.py": "X = 1\n", "pkg/sub/mod.py": "Y = 2\n"}
    install(build, "pkg", {**same, "pkg/changed.py": "Z = 'old'\n"})
    install(build, "other", {"other.py": "W = 0\n"})  # not in the test env
    install(test, "pkg", {**same, "pkg/changed.py": "Z = 'new'\n"})
    for name in [*same, "pkg/changed.py", "other.py"]:
        py_compile.compile(str(build / name), cfile=str(compiled(build, name)))

    assert set(recorded_sources(test)) == {*same, "pkg/changed.py"}  # the script outside site-packages is left out
    assert share_bytecode(build, test) == 2
    for name in same:
        assert compiled(test, name).samefile(compiled(build, name))
    assert not compiled(test, "pkg/changed.py").exists()  # a different source compiles its own
    assert not (test / "__pycache__").exists() and not (test / "other.py").exists()
    assert share_bytecode(build, test) == 0  # linked already

    # The interpreter takes the linked file and imports the test env's own sources.
    script = "import sys; sys.path.insert(0, sys.argv[1]); import pkg, pkg.changed, pkg.sub.mod; print(pkg.X, pkg.changed.Z, pkg.sub.mod.Y)"
    out = subprocess.run([sys.executable, "-c", script, str(test)], capture_output=True, text=True, check=True, env={"PYTHONDONTWRITEBYTECODE": "1"})
    assert out.stdout.split() == ["1", "new", "2"]


def test_an_unreadable_record_or_cache_shares_nothing(tmp_path: Path) -> None:
    build, test = tmp_path / "build", tmp_path / "test"
    install(build, "pkg", {"pkg/__init__.py": "X = 1\n"})
    install(test, "pkg", {"pkg/__init__.py": "X = 1\n"})
    assert share_bytecode(build, test) == 0  # nothing compiled in the build env
    (test / "pkg-1.0.dist-info" / "RECORD").write_bytes(b"\xff\xfe")
    py_compile.compile(str(build / "pkg/__init__.py"), cfile=str(compiled(build, "pkg/__init__.py")))
    assert share_bytecode(build, test) == 0
