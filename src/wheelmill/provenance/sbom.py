"""The PEP 770 SBOM inside every wheel: a CycloneDX 1.6 JSON document made from the build's
record (``record.BuildRecord``), so that it lists exactly what the signed provenance names.

The file is ``<name>-<version>.dist-info/sboms/wheelmill.cdx.json`` (``SBOM_FILE``); auditwheel
writes ``sboms/auditwheel.cdx.json`` beside it for the libraries it grafts, and that one is kept.

The same record gives the same bytes on every machine, because the wheel's RECORD hashes them:
the serial number is a uuid5 of the whole record; the timestamp is the zip
epoch every build uses (SOURCE_DATE_EPOCH, 1980-01-01); the only tool named is wheelmill with
its version (the library names none of its own); the library keeps components, hashes and
properties in sorted sets; every bom-ref is set here (the library fills a missing or repeated
one with a random value); and the JSON is written again with sorted keys.

How the record is told:

- ``metadata.component`` is the wheel (``pkg:pypi/<name>@<version>``), with the properties
  ``wheelmill:recipe``, ``wheelmill:cell`` and, where the record has one, ``wheelmill:build-key``
  (a wheel's SBOM is written from ``BuildRecord.carried``, which has none).
- Every other component says which part of the record it is in ``wheelmill:input`` (``torch``,
  ``toolkit-package``, ``toolkit``, ``compiler``, ``python``, ``builder``, ``source``, ``lock``,
  ``requirement``) and its role in ``wheelmill:role``: ``build`` (used to build, not shipped;
  scope ``excluded``), ``runtime`` (the wheel requires it; scope ``required``) or, for a locked
  package the wheel's Requires-Dist also names (torch, most often), the one value
  ``build,runtime`` on its one component (scope ``required``).
- Each Requires-Dist line is kept whole in a property ``wheelmill:requirement:<i>`` (``i``: its
  place in the list) on the component of the package it names; the toolkit's packages keep
  their place in ``wheelmill:order``, the source's patches theirs in ``wheelmill:patch:<i>``
  (properties, not ``pedigree.patches``: a CycloneDX patch has no place for a digest).
- The wheel depends on its runtime components (the ``dependencies`` graph).

So ``read_record`` gives the record back, with one exception: a locked package's digests come
back sorted (CycloneDX keeps hashes as a set); ``sbom_differences`` compares them as sets.
"""

from __future__ import annotations

import json
import re
import uuid
import warnings
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from functools import cache
from typing import TYPE_CHECKING, Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

import wheelmill
from wheelmill.errors import SbomError
from wheelmill.machine.process import DEFAULT_SOURCE_DATE_EPOCH
from wheelmill.provenance.record import BuilderRecord, BuildRecord, Locked, SourceRecord

if TYPE_CHECKING:
    from cyclonedx.model.component import Component
    from cyclonedx.validation.json import JsonStrictValidator
    from packageurl import PackageURL

# The CycloneDX library (and the JSON schema validator under it) loads where an SBOM is
# written or validated, not with every command that imports this module: it is a tenth of
# the command line's start.

SBOM_FILE = "sboms/wheelmill.cdx.json"
LOCK_FILE = "build-env.lock"

BUILD = "build"
RUNTIME = "runtime"
BOTH = "build,runtime"

_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://wheelmill/sbom")
_TIMESTAMP = datetime.fromtimestamp(int(DEFAULT_SOURCE_DATE_EPOCH), UTC)
_IMAGE_ID = re.compile(r"sha256:([0-9a-f]{64})")
_VERSION = re.compile(r"\d+(?:\.\d+)+")
_COMPILERS = ("g++", "gcc", "c++", "clang++", "clang", "icpx", "nvcc")
_WHEEL_REF = "wheel"


# -- writing ---------------------------------------------------------------------------------


def sbom_bytes(record: BuildRecord) -> bytes:
    """The SBOM of the wheel ``record`` describes: UTF-8 JSON, the same bytes for the same record."""
    from cyclonedx.model.bom import Bom, BomMetaData  # noqa: PLC0415 - see the note above
    from cyclonedx.model.component import ComponentScope, ComponentType  # noqa: PLC0415
    from cyclonedx.model.tool import ToolRepository  # noqa: PLC0415
    from cyclonedx.output.json import JsonV1Dot6  # noqa: PLC0415

    components = _components(record)
    refs = [c.bom_ref.value for c in components]
    if twice := sorted({r for r in refs if refs.count(r) > 1 and r is not None}):
        raise SbomError(f"{record.project} names {', '.join(twice)} twice among its inputs; fix: its build env's lock")
    wheel = _wheel(record)
    bom = Bom(
        serial_number=uuid.uuid5(_NAMESPACE, json.dumps(record.as_dict(), sort_keys=True)),
        metadata=BomMetaData(
            timestamp=_TIMESTAMP,
            tools=ToolRepository(
                components=[_component("wheelmill", wheelmill.__version__, type=ComponentType.APPLICATION)]
            ),
            component=wheel,
        ),
        components=components,
    )
    bom.register_dependency(wheel, [c for c in components if c.scope is ComponentScope.REQUIRED])
    with warnings.catch_warnings():
        # The library warns when the wheel depends on nothing; a wheel with no Requires-Dist does.
        warnings.filterwarnings("ignore", "The Component this BOM is describing", UserWarning)
        text = JsonV1Dot6(bom).output_as_string()
    # The outputter writes keys in the order its model declares them; sorting them makes the
    # bytes depend on the document alone, not on that order.
    return (json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def _wheel(record: BuildRecord) -> Component:
    return _component(
        record.project,
        record.version,
        ref=_WHEEL_REF,
        purl=_purl(record.project, record.version),
        properties={
            "recipe": record.recipe,
            "cell": record.cell,
            **({"build-key": record.build_key} if record.build_key else {}),
        },
    )


def _components(record: BuildRecord) -> list[Component]:
    from cyclonedx.model.component import ComponentType  # noqa: PLC0415

    requires = _requirements(record.requires)
    locked_names = {p.name for p in _locked(record)}
    return [
        *([] if record.torch is None else [_locked_package(record.torch, "torch", {}, requires)]),
        *(
            _locked_package(p, "toolkit-package", {"order": str(i)}, requires)
            for i, p in enumerate(record.toolkit_packages)
        ),
        *(_requirement(i, line, name) for i, (line, name) in enumerate(requires) if name not in locked_names),
        *([] if record.toolkit is None else [_toolkit(record.toolkit)]),
        *([] if record.compiler is None else [_compiler(record.compiler)]),
        _input("python", "cpython", record.python, type=ComponentType.APPLICATION),
        _builder(record.builder),
        _source(record.recipe, record.source),
        _input("lock", LOCK_FILE, None, type=ComponentType.FILE, hashes=[record.lock_sha256]),
    ]


def _locked(record: BuildRecord) -> tuple[Locked, ...]:
    return (*([] if record.torch is None else [record.torch]), *record.toolkit_packages)


def _requirements(requires: Iterable[str]) -> list[tuple[str, str]]:
    """Each Requires-Dist line with the canonical name of the package it names."""
    try:
        return [(line, canonicalize_name(Requirement(line).name)) for line in requires]
    except InvalidRequirement as err:
        raise SbomError(f"a Requires-Dist line is not a requirement: {err}; fix: the recipe's metadata") from None


def _locked_package(package: Locked, kind: str, order: Mapping[str, str], requires: list[tuple[str, str]]) -> Component:
    lines = {f"requirement:{i}": line for i, (line, name) in enumerate(requires) if name == package.name}
    return _input(
        kind,
        package.name,
        package.version,
        ref=f"locked:{package.name}",
        role=BOTH if lines else BUILD,
        purl=_purl(package.name, package.version),
        hashes=package.sha256,
        properties={**order, **lines},
    )


def _requirement(place: int, line: str, name: str) -> Component:
    specifier = str(Requirement(line).specifier)
    return _input(
        "requirement",
        name,
        None,
        ref=f"requirement:{place}",
        role=RUNTIME,
        purl=_purl(name, None),
        properties={f"requirement:{place}": line, **({"specifier": specifier} if specifier else {})},
    )


def _toolkit(toolkit: str) -> Component:
    from cyclonedx.model.component import ComponentType  # noqa: PLC0415

    name, _, version = toolkit.partition(" ")
    return _input("toolkit", name, version or None, type=ComponentType.FRAMEWORK, properties={"toolkit": toolkit})


def _compiler(compiler: str) -> Component:
    """The compiler as named and versioned in its own words (``g++ (Debian 12.2.0-14) 12.2.0``)."""
    from cyclonedx.model.component import ComponentType  # noqa: PLC0415

    words = compiler.split()
    name = next((w for w in words if w in _COMPILERS), words[0] if words else compiler)
    version = next((w for w in words if _VERSION.fullmatch(w)), None)
    return _input("compiler", name, version, type=ComponentType.APPLICATION, properties={"compiler": compiler})


def _builder(builder: BuilderRecord) -> Component:
    from cyclonedx.model.component import ComponentType  # noqa: PLC0415

    if builder.image_id is None:
        description = "built on the host, in no builder image"
        return _input("builder", builder.tag, None, type=ComponentType.PLATFORM, description=description)
    digest = _IMAGE_ID.fullmatch(builder.image_id)
    return _input(
        "builder",
        builder.tag,
        None if digest else builder.image_id,
        type=ComponentType.CONTAINER,
        hashes=[digest[1]] if digest else [],
        properties={} if builder.base is None else {"builder:base": builder.base},
    )


def _source(recipe: str, source: SourceRecord) -> Component:
    from cyclonedx.model import ExternalReference, ExternalReferenceType, XsUri  # noqa: PLC0415

    match source.kind:
        case "sdist" | "url" | "git" if source.url is not None:
            kinds = {
                "sdist": ExternalReferenceType.SOURCE_DISTRIBUTION,
                "url": ExternalReferenceType.DISTRIBUTION,
                "git": ExternalReferenceType.VCS,
            }
            references = [ExternalReference(type=kinds[source.kind], url=XsUri(source.url))]
        case _:
            references = []
    tree = source.kind == "path" and source.sha256 is not None
    properties = {
        "source:kind": source.kind,
        **({"source:commit": source.commit} if source.commit is not None else {}),
        **({"source:tree-sha256": source.sha256} if tree and source.sha256 is not None else {}),
        **{f"patch:{i}": digest for i, digest in enumerate(source.patches)},
    }
    return _input(
        "source",
        recipe,
        source.commit,
        hashes=[] if tree or source.sha256 is None else [source.sha256],
        external_references=references,
        properties=properties,
    )


def _input(
    kind: str,
    name: str,
    version: str | None,
    *,
    ref: str | None = None,
    role: str = BUILD,
    properties: Mapping[str, str] | None = None,
    **fields: Any,
) -> Component:
    """One input of the build: its place in the record (``wheelmill:input``) and its role."""
    from cyclonedx.model.component import ComponentScope  # noqa: PLC0415

    scope = ComponentScope.EXCLUDED if role == BUILD else ComponentScope.REQUIRED
    named = {"input": kind, "role": role, **(properties or {})}
    return _component(name, version, ref=ref or kind, scope=scope, properties=named, **fields)


def _component(
    name: str,
    version: str | None,
    *,
    ref: str | None = None,
    hashes: Iterable[str] = (),
    properties: Mapping[str, str] | None = None,
    **fields: Any,
) -> Component:
    from cyclonedx.model import HashAlgorithm, HashType, Property  # noqa: PLC0415
    from cyclonedx.model.component import Component  # noqa: PLC0415

    return Component(
        name=name,
        version=version,
        bom_ref=ref,
        hashes=[HashType(alg=HashAlgorithm.SHA_256, content=digest) for digest in hashes],
        properties=[Property(name=f"wheelmill:{key}", value=value) for key, value in (properties or {}).items()],
        **fields,
    )


def _purl(name: str, version: str | None) -> PackageURL:
    """A PyPI package URL; its version keeps a local label (``+`` is written ``%2B``)."""
    from packageurl import PackageURL  # noqa: PLC0415

    return PackageURL(type="pypi", name=name, version=version)


# -- validating ------------------------------------------------------------------------------


def validate_sbom(data: bytes) -> list[str]:
    """What makes ``data`` no CycloneDX 1.6 JSON document, one line each; empty where it is one.

    The schemas the library's validator needs come with the library: it reads no network.
    """
    try:
        errors = _validator().validate_str(data.decode(), all_errors=True)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        return [f"not JSON: {err}"]
    return [f"{e.data.json_path}: {e.data.message}" for e in errors or ()]


@cache
def _validator() -> JsonStrictValidator:
    # One validator: loading and compiling the schema is most of the time a check takes.
    from cyclonedx.schema import SchemaVersion  # noqa: PLC0415
    from cyclonedx.validation.json import JsonStrictValidator  # noqa: PLC0415

    return JsonStrictValidator(SchemaVersion.V1_6)


# -- reading ---------------------------------------------------------------------------------


def read_record(data: bytes) -> BuildRecord:
    """The build record an SBOM this module wrote tells; SbomError where it is none."""
    document = _load(data)
    try:
        return _record(document)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as err:
        raise SbomError(f"the SBOM does not tell a wheelmill build ({err!r}); fix: rebuild the wheel") from None


def sbom_differences(data: bytes, record: BuildRecord) -> list[str]:
    """Each field where the SBOM and ``record`` disagree, one line each; empty: they agree."""
    told = read_record(data)
    return [
        f"{label}: sbom says {_say(a)}, provenance {_say(b)}"
        for label, read in _FIELDS
        if (a := read(told)) != (b := read(record))
    ]


def _say(value: object) -> str:
    """A field's value in a line: a tuple of plain values as a comma list, nothing as ``none``."""
    if value is None or value == ():
        return "none"
    if isinstance(value, tuple) and all(isinstance(v, str) for v in value):
        return ", ".join(value)
    return str(value)


def _load(data: bytes) -> dict[str, Any]:
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise SbomError(f"the SBOM is not JSON: {err}; fix: rebuild the wheel") from None
    if not isinstance(document, dict) or document.get("bomFormat") != "CycloneDX":
        raise SbomError("the SBOM is not a CycloneDX document; fix: rebuild the wheel")
    return document


def _record(document: Mapping[str, Any]) -> BuildRecord:
    wheel = document["metadata"]["component"]
    told = _properties(wheel)
    inputs = _inputs(document.get("components", []))
    toolkit_packages = sorted(inputs.get("toolkit-package", []), key=lambda c: int(_properties(c)["order"]))
    torch = inputs.get("torch", [])
    return BuildRecord(
        project=wheel["name"],
        version=wheel["version"],
        recipe=told["recipe"],
        cell=told["cell"],
        build_key=told.get("build-key", ""),
        python=_one(inputs, "python")["version"],
        compiler=_properties(inputs["compiler"][0])["compiler"] if "compiler" in inputs else None,
        toolkit=_properties(inputs["toolkit"][0])["toolkit"] if "toolkit" in inputs else None,
        torch=_read_locked(torch[0]) if torch else None,
        toolkit_packages=tuple(_read_locked(c) for c in toolkit_packages),
        builder=_read_builder(_one(inputs, "builder")),
        source=_read_source(_one(inputs, "source")),
        lock_sha256=_sha256s(_one(inputs, "lock"))[0],
        requires=_read_requires(document.get("components", [])),
    )


def _inputs(components: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """The components by the part of the record they tell (``wheelmill:input``)."""
    found: dict[str, list[Mapping[str, Any]]] = {}
    for component in components:
        kind = _properties(component).get("input")
        if kind is not None:
            found.setdefault(kind, []).append(component)
    return found


def _one(inputs: Mapping[str, list[Mapping[str, Any]]], kind: str) -> Mapping[str, Any]:
    (component,) = inputs[kind]
    return component


def _properties(component: Mapping[str, Any]) -> dict[str, str]:
    prefix = "wheelmill:"
    return {
        p["name"].removeprefix(prefix): p.get("value", "")
        for p in component.get("properties", [])
        if p["name"].startswith(prefix)
    }


def _sha256s(component: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(h["content"] for h in component.get("hashes", []) if h["alg"] == "SHA-256")


def _read_locked(component: Mapping[str, Any]) -> Locked:
    return Locked(name=component["name"], version=component["version"], sha256=_sha256s(component))


def _read_builder(component: Mapping[str, Any]) -> BuilderRecord:
    digests = _sha256s(component)
    image_id = f"sha256:{digests[0]}" if digests else component.get("version")
    return BuilderRecord(tag=component["name"], image_id=image_id, base=_properties(component).get("builder:base"))


def _read_source(component: Mapping[str, Any]) -> SourceRecord:
    told = _properties(component)
    urls = [r["url"] for r in component.get("externalReferences", [])]
    digests = _sha256s(component)
    patches = sorted((int(k.removeprefix("patch:")), v) for k, v in told.items() if k.startswith("patch:"))
    return SourceRecord(
        kind=told["source:kind"],
        url=urls[0] if urls else None,
        sha256=told.get("source:tree-sha256", digests[0] if digests else None),
        commit=told.get("source:commit"),
        patches=tuple(digest for _, digest in patches),
    )


def _read_requires(components: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    lines = [
        (int(key.removeprefix("requirement:")), line)
        for component in components
        for key, line in _properties(component).items()
        if key.startswith("requirement:")
    ]
    return tuple(line for _, line in sorted(lines))


def _digests(package: Locked | None) -> tuple[str, ...] | None:
    return None if package is None else tuple(sorted(package.sha256))


def _source_url(record: BuildRecord) -> str | None:
    # The library writes a URL as CycloneDX's schema wants it (a space as %20, ...).
    from cyclonedx.model import XsUri  # noqa: PLC0415

    return None if record.source.url is None else str(XsUri(record.source.url))


_FIELDS: tuple[tuple[str, Callable[[BuildRecord], object]], ...] = (
    ("project", lambda r: r.project),
    ("version", lambda r: r.version),
    ("recipe", lambda r: r.recipe),
    ("cell", lambda r: r.cell),
    ("build key", lambda r: r.build_key),
    ("python", lambda r: r.python),
    ("compiler", lambda r: r.compiler),
    ("toolkit", lambda r: r.toolkit),
    ("torch version", lambda r: None if r.torch is None else r.torch.version),
    ("torch sha256", lambda r: _digests(r.torch)),
    ("toolkit packages", lambda r: tuple((p.name, p.version, _digests(p)) for p in r.toolkit_packages)),
    ("builder tag", lambda r: r.builder.tag),
    ("builder image id", lambda r: r.builder.image_id),
    ("builder base", lambda r: r.builder.base),
    ("source kind", lambda r: r.source.kind),
    ("source url", _source_url),
    ("source sha256", lambda r: r.source.sha256),
    ("source commit", lambda r: r.source.commit),
    ("source patches", lambda r: r.source.patches),
    ("lock sha256", lambda r: r.lock_sha256),
    ("requires", lambda r: r.requires),
)
