"""The bytecode store: compiled modules kept and lent only for sources of the same sha256."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import py_compile
import subprocess
import sys
from pathlib import Path

from wheelmill.building.bytecode import BytecodeStore, recorded_sources


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


def compile_all(site: Path, *names: str) -> None:
    """As an import leaves them: timestamp files, current for their sources."""
    for name in names:
        py_compile.compile(
            str(site / name),
            cfile=str(compiled(site, name)),
            invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP,
        )


def site(root: Path) -> Path:
    """A site-packages of this interpreter's version, whose tag the store files under."""
    return root / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def test_bytecode_kept_from_one_env_is_lent_to_another_with_the_same_sources_and_used_as_is(tmp_path: Path) -> None:
    store, build, test = BytecodeStore(tmp_path / "store"), site(tmp_path / "build"), site(tmp_path / "test")
    same = {"pkg/__init__.py": "X = 1\n", "pkg/sub/mod.py": "Y = 2\n", "top.py": "T = 3\n"}
    install(build, "pkg", {**same, "pkg/changed.py": "Z = 'old'\n"})
    install(build, "other", {"other.py": "W = 0\n"})  # not in the test env
    install(test, "pkg", {**same, "pkg/changed.py": "Z = 'new'\n"})
    for name in [*same, "pkg/changed.py"]:
        os.utime(test / name, (1_000_000_000, 1_000_000_000))  # installed at another time
    compile_all(build, *same, "pkg/changed.py", "other.py")

    assert set(recorded_sources(test)) == {*same, "pkg/changed.py"}  # the script outside site-packages is left out
    assert store.keep(build) == 5
    assert store.keep(build) == 0  # kept already
    assert store.lend(test) == 3
    assert not compiled(test, "pkg/changed.py").exists()  # a different source compiles its own
    assert not (test / "other.py").exists() and not compiled(test, "other.py").exists()
    assert store.lend(test) == 0  # compiled there already

    # The interpreter takes each lent file as current (it would rewrite a stale one) and
    # imports the test env's own sources.
    before = {name: compiled(test, name).read_bytes() for name in same}
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import pkg, pkg.changed, pkg.sub.mod, top; "
        "print(pkg.X, pkg.changed.Z, pkg.sub.mod.Y, top.T)"
    )
    out = subprocess.run([sys.executable, "-c", script, str(test)], capture_output=True, text=True, check=True, env={})
    assert out.stdout.split() == ["1", "new", "2", "3"]
    assert {name: compiled(test, name).read_bytes() for name in same} == before
    assert compiled(test, "pkg/changed.py").exists()  # compiled on import, as without the store


def test_a_source_changed_since_its_install_is_neither_kept_nor_lent(tmp_path: Path) -> None:
    store, edited, clean, target = (
        BytecodeStore(tmp_path / "store"),
        site(tmp_path / "a"),
        site(tmp_path / "b"),
        site(tmp_path / "c"),
    )
    for root in (edited, clean, target):
        install(root, "pkg", {"pkg/__init__.py": "X = 1\n"})
    (edited / "pkg/__init__.py").write_text("X = 9\n")  # its RECORD still says X = 1
    compile_all(edited, "pkg/__init__.py")
    assert store.keep(edited) == 0
    compile_all(clean, "pkg/__init__.py")
    os.utime(clean / "pkg/__init__.py", (1_000_000_000, 1_000_000_000))  # its compiled file is stale now
    assert store.keep(clean) == 0
    compile_all(clean, "pkg/__init__.py")
    assert store.keep(clean) == 1
    (target / "pkg/__init__.py").write_text("X = 8\n")
    assert store.lend(target) == 0


def test_an_unreadable_record_keeps_and_lends_nothing(tmp_path: Path) -> None:
    store, build, test = BytecodeStore(tmp_path / "store"), site(tmp_path / "build"), site(tmp_path / "test")
    install(build, "pkg", {"pkg/__init__.py": "X = 1\n"})
    install(test, "pkg", {"pkg/__init__.py": "X = 1\n"})
    assert store.keep(build) == 0  # nothing compiled in the build env
    compile_all(build, "pkg/__init__.py")
    record = build / "pkg-1.0.dist-info" / "RECORD"
    record.write_text(record.read_text().replace("sha256=", "sha256=../../"))  # not a file name in the store
    assert store.keep(build) == 0
    record.write_bytes(b"\xff\xfe")
    assert store.keep(build) == 0
    assert not (tmp_path / "store").exists()
