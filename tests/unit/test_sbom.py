"""The SBOM in every wheel: the same record gives the same bytes and any other record other
bytes; a CPU and a CUDA build's SBOMs are valid CycloneDX 1.6, checked with no network; the
record comes back from the SBOM, and a disagreement with the provenance is named by field."""

from __future__ import annotations

import json
import socket
from dataclasses import replace
from typing import Any

import pytest

from wheelmill import __version__
from wheelmill.errors import SbomError
from wheelmill.provenance import sbom
from wheelmill.provenance.record import BuilderRecord, BuildRecord, Locked, SourceRecord
from wheelmill.provenance.sbom import read_record, sbom_bytes, sbom_differences, validate_sbom

CPU = BuildRecord(
    project="torch-scatter",
    version="2.1.2+cpu",
    recipe="torch-scatter",
    cell="cp312-cpu-torch2.14",
    build_key="a" * 64,
    python="3.12.7",
    compiler="g++ (Debian 12.2.0-14) 12.2.0",
    toolkit=None,
    torch=Locked(name="torch", version="2.14.1+cpu", sha256=("b" * 64,)),
    toolkit_packages=(),
    builder=BuilderRecord(tag="host", image_id=None, base=None),
    source=SourceRecord(
        kind="sdist",
        url="https://files.example.org/torch_scatter-2.1.2.tar.gz",
        sha256="c" * 64,
        commit=None,
    ),
    lock_sha256="d" * 64,
    requires=("torch==2.14.1+cpu",),
)

CUDA = BuildRecord(
    project="flash-attn",
    version="2.8.3+cu130torch2.14",
    recipe="flash-attn",
    cell="cp312-cu130-torch2.14",
    build_key="1" * 64,
    python="3.12.7",
    compiler="g++ (GCC) 13.3.1 20240611 (Red Hat 13.3.1-2)",
    toolkit="cuda 13.0",
    torch=Locked(name="torch", version="2.14.1+cu130", sha256=("2" * 64, "3" * 64)),
    toolkit_packages=(
        Locked(name="nvidia-cuda-runtime", version="13.0.96", sha256=("4" * 64,)),
        Locked(name="nvidia-cublas", version="13.1.0.3", sha256=("5" * 64,)),
    ),
    builder=BuilderRecord(
        tag="wheelmill-builder:cu130-1f2e3d",
        image_id="sha256:" + "6" * 64,
        base="quay.io/pypa/manylinux_2_28_x86_64:2026.11.01-1",
    ),
    source=SourceRecord(
        kind="git",
        url="https://github.com/Dao-AILab/flash-attention.git",
        sha256=None,
        commit="7" * 40,
        patches=("8" * 64, "9" * 64),
    ),
    lock_sha256="e" * 64,
    requires=("torch==2.14.1+cu130", "einops", "numpy>=1.24; python_version >= '3.10'"),
)


def document(record: BuildRecord) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(sbom_bytes(record))
    return loaded


def component(doc: dict[str, Any], ref: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [c for c in doc["components"] if c["bom-ref"] == ref]
    assert len(found) == 1
    return found[0]


def properties(item: dict[str, Any]) -> dict[str, str]:
    return {p["name"]: p["value"] for p in item["properties"]}


def edited(record: BuildRecord, edit: Any) -> bytes:
    doc = document(record)
    edit(doc)
    return json.dumps(doc).encode()


# -- the same bytes ------------------------------------------------------------------------


@pytest.mark.parametrize("record", [CPU, CUDA], ids=["cpu", "cuda"])
def test_the_same_record_gives_the_same_bytes(record: BuildRecord) -> None:
    assert sbom_bytes(record) == sbom_bytes(replace(record))


@pytest.mark.parametrize(
    "change",
    [
        {"lock_sha256": "0" * 64},
        {"build_key": "0" * 64},
        {"torch": Locked(name="torch", version="2.14.1+cu130", sha256=("0" * 64,))},
        {"requires": ("torch==2.14.1+cu130",)},
        {"source": replace(CUDA.source, patches=("9" * 64, "8" * 64))},
    ],
    ids=["lock", "build-key", "torch", "requires", "patch-order"],
)
def test_another_record_gives_other_bytes(change: dict[str, Any]) -> None:
    assert sbom_bytes(replace(CUDA, **change)) != sbom_bytes(CUDA)


def test_nothing_of_the_time_or_machine_is_written() -> None:
    # The serial number is the record's (another record, another number), the time the zip
    # epoch, the only tool wheelmill.
    doc = document(CUDA)
    assert doc["serialNumber"] == document(replace(CUDA))["serialNumber"]
    assert doc["serialNumber"] != document(replace(CUDA, lock_sha256="0" * 64))["serialNumber"]
    assert doc["serialNumber"].startswith("urn:uuid:")
    assert doc["metadata"]["timestamp"] == "1980-01-01T00:00:00+00:00"
    wheelmill = {"name": "wheelmill", "type": "application", "version": __version__}
    assert doc["metadata"]["tools"] == {"components": [wheelmill]}


def test_keys_are_sorted_and_components_in_a_stable_order() -> None:
    data = sbom_bytes(CUDA)
    assert data == (json.dumps(json.loads(data), indent=2, sort_keys=True) + "\n").encode()
    reordered = replace(CUDA, toolkit_packages=CUDA.toolkit_packages[::-1])
    refs = [c["bom-ref"] for c in document(reordered)["components"]]
    assert refs == [c["bom-ref"] for c in document(CUDA)["components"]]


# -- what it says --------------------------------------------------------------------------


def test_the_wheel_depends_on_what_it_requires_at_run_time() -> None:
    doc = document(CUDA)
    wheel = doc["metadata"]["component"]
    assert wheel["purl"] == "pkg:pypi/flash-attn@2.8.3%2Bcu130torch2.14"
    assert properties(wheel)["wheelmill:build-key"] == CUDA.build_key
    (graph,) = [d for d in doc["dependencies"] if d["ref"] == wheel["bom-ref"]]
    assert graph["dependsOn"] == ["locked:torch", "requirement:1", "requirement:2"]


def test_roles_and_scopes() -> None:
    doc = document(CUDA)
    torch = component(doc, "locked:torch")
    assert torch["purl"] == "pkg:pypi/torch@2.14.1%2Bcu130"
    assert (torch["scope"], properties(torch)["wheelmill:role"]) == ("required", "build,runtime")
    nvidia = component(doc, "locked:nvidia-cublas")
    assert (nvidia["scope"], properties(nvidia)["wheelmill:role"]) == ("excluded", "build")
    numpy = component(doc, "requirement:2")
    assert "hashes" not in numpy
    assert properties(numpy)["wheelmill:specifier"] == ">=1.24"
    assert (numpy["scope"], properties(numpy)["wheelmill:role"]) == ("required", "runtime")
    unpinned = document(replace(CUDA, requires=()))
    assert properties(component(unpinned, "locked:torch"))["wheelmill:role"] == "build"


def test_toolkit_compiler_builder_and_source() -> None:
    doc = document(CUDA)
    assert (component(doc, "toolkit")["name"], component(doc, "toolkit")["version"]) == ("cuda", "13.0")
    assert (component(doc, "compiler")["name"], component(doc, "compiler")["version"]) == ("g++", "13.3.1")
    builder = component(doc, "builder")
    assert (builder["type"], builder["hashes"][0]["content"]) == ("container", "6" * 64)
    source = component(doc, "source")
    assert source["externalReferences"] == [{"type": "vcs", "url": CUDA.source.url}]
    assert properties(source)["wheelmill:patch:1"] == "9" * 64
    cpu = document(CPU)
    assert component(cpu, "builder")["type"] == "platform"
    assert "hashes" not in component(cpu, "builder")
    assert component(cpu, "source")["externalReferences"][0]["type"] == "source-distribution"
    assert "toolkit" not in {c["bom-ref"] for c in cpu["components"]}


def test_a_path_source_keeps_its_tree_hash_as_a_property() -> None:
    record = replace(CPU, source=SourceRecord(kind="path", url=None, sha256="f" * 64, commit=None))
    source = component(document(record), "source")
    assert "hashes" not in source
    assert properties(source)["wheelmill:source:tree-sha256"] == "f" * 64
    assert read_record(sbom_bytes(record)) == record


# -- valid CycloneDX -----------------------------------------------------------------------


@pytest.mark.parametrize("record", [CPU, CUDA], ids=["cpu", "cuda"])
def test_the_sbom_is_valid_cyclonedx(record: BuildRecord) -> None:
    assert validate_sbom(sbom_bytes(record)) == []


def test_the_schema_check_needs_no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object) -> None:
        raise AssertionError("the schema check reached for the network")

    sbom._validator.cache_clear()
    monkeypatch.setattr(socket.socket, "connect", refuse)
    assert validate_sbom(sbom_bytes(CUDA)) == []


def test_an_invalid_document_is_caught() -> None:
    def bad_hash(doc: dict[str, Any]) -> None:
        component(doc, "locked:torch")["hashes"][0]["content"] = "not-a-digest"

    errors = validate_sbom(edited(CUDA, bad_hash))
    assert errors
    assert any("not-a-digest" in e for e in errors)
    assert validate_sbom(b"{") == [validate_sbom(b"{")[0]]
    assert validate_sbom(b"{")[0].startswith("not JSON")


# -- read back -----------------------------------------------------------------------------


@pytest.mark.parametrize("record", [CPU, CUDA], ids=["cpu", "cuda"])
def test_the_record_comes_back(record: BuildRecord) -> None:
    assert read_record(sbom_bytes(record)) == record
    assert sbom_differences(sbom_bytes(record), record) == []


def test_a_bare_image_id_comes_back() -> None:
    record = replace(CUDA, builder=BuilderRecord(tag="t", image_id="6" * 64, base=None))
    assert read_record(sbom_bytes(record)) == record


def test_digests_are_compared_as_a_set() -> None:
    assert CUDA.torch is not None
    reordered = replace(CUDA, torch=replace(CUDA.torch, sha256=("3" * 64, "2" * 64)))
    assert sbom_differences(sbom_bytes(reordered), CUDA) == []


@pytest.mark.parametrize(
    ("change", "line"),
    [
        (
            {"torch": Locked(name="torch", version="2.14.1+cu130", sha256=("0" * 64,))},
            f"torch sha256: sbom says {'0' * 64}, provenance {'2' * 64}, {'3' * 64}",
        ),
        ({"lock_sha256": "0" * 64}, f"lock sha256: sbom says {'0' * 64}, provenance {'e' * 64}"),
        ({"build_key": "0" * 64}, f"build key: sbom says {'0' * 64}, provenance {'1' * 64}"),
    ],
    ids=["torch", "lock", "build-key"],
)
def test_a_disagreement_is_named(change: dict[str, Any], line: str) -> None:
    assert sbom_differences(sbom_bytes(replace(CUDA, **change)), CUDA) == [line]


def test_an_edited_hash_is_a_disagreement() -> None:
    def edit(doc: dict[str, Any]) -> None:
        component(doc, "lock")["hashes"][0]["content"] = "0" * 64

    assert sbom_differences(edited(CUDA, edit), CUDA) == [f"lock sha256: sbom says {'0' * 64}, provenance {'e' * 64}"]


def drop_properties(doc: dict[str, Any]) -> None:
    del doc["metadata"]["component"]["properties"]


def drop_builder(doc: dict[str, Any]) -> None:
    doc["components"] = [c for c in doc["components"] if c["bom-ref"] != "builder"]


@pytest.mark.parametrize(
    "data",
    [
        b"not json",
        b"\xff",
        b"[]",
        b'{"bomFormat": "SPDX"}',
        b'{"bomFormat": "CycloneDX"}',
        edited(CUDA, drop_properties),
        edited(CUDA, drop_builder),
    ],
    ids=["text", "bytes", "list", "other-format", "empty", "no-properties", "no-builder"],
)
def test_malformed_input_is_one_error(data: bytes) -> None:
    with pytest.raises(SbomError) as caught:
        read_record(data)
    assert "\n" not in str(caught.value)
    with pytest.raises(SbomError):
        sbom_differences(data, CUDA)


def test_a_bad_requirement_is_an_error() -> None:
    with pytest.raises(SbomError, match="Requires-Dist"):
        sbom_bytes(replace(CPU, requires=("torch ==== 2",)))


def test_a_url_the_library_escapes_is_no_disagreement() -> None:
    # CycloneDX's URLs have no spaces: the library writes one as %20.
    record = replace(CPU, source=replace(CPU.source, url="https://files.example.org/a b.tar.gz"))
    assert read_record(sbom_bytes(record)).source.url == "https://files.example.org/a%20b.tar.gz"
    assert sbom_differences(sbom_bytes(record), record) == []


def test_a_package_locked_twice_is_an_error() -> None:
    # Two components with one bom-ref would have the library give one a random one.
    with pytest.raises(SbomError, match="locked:nvidia-cublas"):
        sbom_bytes(replace(CUDA, toolkit_packages=CUDA.toolkit_packages * 2))


def test_the_sbom_a_wheel_carries_has_no_build_key_and_no_path_tree_hash() -> None:
    """Inputs that change no byte a build makes (wheelmill's own code, a test file of a path
    source) change the key and the tree hash, never the wheel: its SBOM names neither."""
    path = replace(CPU, source=SourceRecord(kind="path", url=None, sha256="f" * 64, commit=None))
    carried = path.carried()
    assert (carried.build_key, carried.source.sha256) == ("", None)
    assert sbom_bytes(carried) == sbom_bytes(
        replace(path, build_key="0" * 64, source=replace(path.source, sha256="1" * 64)).carried()
    )
    text = sbom_bytes(carried).decode()
    assert "build-key" not in text and "f" * 64 not in text
    assert read_record(sbom_bytes(carried)) == carried
    assert sbom_differences(sbom_bytes(carried), carried) == []
    assert CUDA.carried().source == CUDA.source, "a git commit or an sdist's sha256 stays"
