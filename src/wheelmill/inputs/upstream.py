"""What torch's upstream index has that the matrix lacks, pure: the index's PEP 691 project
page read into facts (a release, its local label, a Python, a platform), compared with a
``Matrix``, and the change to ``recipes/matrix.toml`` that would add what is missing.

Two kinds of finding (``Finding.kind``):

- ``newer-torch``: a final release of a label some variant builds, newer than every torch
  that variant builds; the change adds it to the variant's ``other-torch`` (a variant of
  its own per torch minor, ``cuda130-torch2.15``). Where a rule of ``other-torch`` makes that
  impossible (one release per minor, the parent's Pythons and platforms), the finding says
  why in ``blocked`` and the change leaves it out.
- ``new-label``: a label no variant has, of a toolkit newer than every variant of its
  family builds (``cu132`` after ``cu130``); the change adds a variant table modelled on the
  newest variant of the family (the nearest toolkit), with a comment that says what to check
  by hand (the toolkit's patch release, cudnn, nccl, the arch list). Labels of
  older toolkits are ones the matrix passed over or dropped, and a family the matrix builds
  none of is one it chose not to build: neither is reported.

Pre-releases and dev builds count only when asked for (``pre``); yanked files never (PEP 592).
The change is text, edited where it changes (comments and layout stay), as a unified diff.
"""

from __future__ import annotations

import fnmatch
import json
import textwrap
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from packaging.tags import Tag
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from wheelmill.errors import ConfigError, FetchError
from wheelmill.inputs.manylinux import normalize_platform, policies
from wheelmill.inputs.matrix import Matrix, torch_tag
from wheelmill.inputs.matrix_edits import add_other_torch, apply, insert_after, unified_diff
from wheelmill.inputs.variants import AARCH64, PLATFORMS, X86_64, Family, Variant

PROJECT = "torch"
Kind = Literal["newer-torch", "new-label"]


@dataclass(frozen=True, kw_only=True)
class UpstreamFile:
    """One wheel of torch upstream, for one Python and one Linux machine."""

    filename: str
    torch: Version  # its public version: 2.15.0
    label: str  # its local label: cu130, rocm6.4, cpu
    python: str  # 3.11
    platform: str  # x86_64, aarch64
    glibc: str | None  # the manylinux policy it needs (manylinux_2_28); None for a plain linux tag

    def as_dict(self) -> dict[str, Any]:
        return {
            "filename": self.filename,
            "torch": str(self.torch),
            "label": self.label,
            "python": self.python,
            "platform": self.platform,
            "glibc": self.glibc,
        }


@dataclass(frozen=True, kw_only=True)
class UpstreamRelease:
    """A torch release of one label upstream: the Pythons and machines it has wheels for."""

    torch: Version
    label: str
    wheels: frozenset[tuple[str, str]]  # (python, platform)
    glibc: tuple[tuple[str, str], ...] = ()  # (platform, the manylinux policy its wheels need at most)

    @property
    def pythons(self) -> tuple[str, ...]:
        return tuple(sorted({python for python, _ in self.wheels}, key=_python_key))

    @property
    def platforms(self) -> tuple[str, ...]:
        return tuple(p for p in PLATFORMS if any(platform == p for _, platform in self.wheels))

    def pythons_on(self, platform: str) -> tuple[str, ...]:
        return tuple(p for p in self.pythons if (p, platform) in self.wheels)

    def glibc_on(self, platform: str) -> str | None:
        return dict(self.glibc).get(platform)


@dataclass(frozen=True, kw_only=True)
class Finding:
    """A torch release upstream that no variant builds, and the variant that would."""

    kind: Kind
    release: UpstreamRelease
    variant: str  # newer-torch: the variant it extends; new-label: the new variant's name
    model: str | None = None  # new-label: the variant its table is modelled on
    blocked: str | None = None  # why the matrix cannot take it as it is: the change leaves it out

    @property
    def torch(self) -> str:
        return str(self.release.torch)

    @property
    def label(self) -> str:
        return self.release.label

    @property
    def family(self) -> Family:
        known = label_release(self.label)
        assert known is not None  # a finding is only made of a label of a known family
        return known[0]

    def as_dict(self) -> dict[str, Any]:
        """The finding as JSON: what a coverage page shows as wanted."""
        return {
            "kind": self.kind,
            "torch": self.torch,
            "label": self.label,
            "family": self.family.value,
            "variant": self.variant,
            "pythons": list(self.release.pythons),
            "platforms": list(self.release.platforms),
            "model": self.model,
            "blocked": self.blocked,
        }


# --- where upstream is ------------------------------------------------------------------


def default_root(template: str) -> str | None:
    """The index root of the matrix's torch index template: the part before its label, whose
    ``torch/`` page lists every label's files; None where the template names no label.

    >>> default_root("https://download.pytorch.org/whl/{label}")
    'https://download.pytorch.org/whl'
    """
    head, found, _ = template.partition("{label}")
    root = head.rstrip("/")
    return root if found and "://" in root else None


def project_page(url: str) -> str:
    """torch's project page at an index root (or the page itself, where given).

    >>> project_page("https://download.pytorch.org/whl"), project_page("http://127.0.0.1:8000/torch")
    ('https://download.pytorch.org/whl/torch/', 'http://127.0.0.1:8000/torch/')
    """
    base = url.rstrip("/")
    return f"{base}/" if base.rsplit("/", 1)[-1] == PROJECT else f"{base}/{PROJECT}/"


# --- the page, read into facts ----------------------------------------------------------


def upstream_files(page: Mapping[str, Any], *, url: str) -> tuple[UpstreamFile, ...]:
    """The torch wheels a PEP 691 project page lists, one fact per Python and Linux machine;
    what is no torch wheel with a local label (an sdist, a macOS wheel without one) is left
    out, and so is a yanked file (PEP 592: no release to build for)."""
    listed = page.get("files")
    if _api_major(page) != "1" or not isinstance(listed, list):
        raise FetchError(
            f"{url}: not a PEP 691 project page (version 1.x, with a list of files)",
            fix="point --url or WHEELMILL_UPSTREAM_INDEX at the root of an index that serves PEP 691 JSON",
        )
    if canonicalize_name(str(page.get("name", PROJECT))) != PROJECT:
        raise FetchError(f"{url}: the page of {page.get('name')!r}, not torch's", fix="give the index root as the URL")
    facts: list[UpstreamFile] = []
    for entry in listed:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("filename"), str):
            raise FetchError(
                f"{url}: a file without a filename: {str(entry)[:120]}", fix="check what serves that index"
            )
        if entry.get("yanked", False) in (False, None):
            facts += wheel_facts(entry["filename"])
    return tuple(facts)


def _api_major(page: Mapping[str, Any]) -> str | None:
    meta = page.get("meta")
    version = meta.get("api-version") if isinstance(meta, Mapping) else None
    return str(version).split(".")[0] if version is not None else None


def wheel_facts(filename: str) -> tuple[UpstreamFile, ...]:
    """A torch wheel's facts, a Python and machine each (CPython's own ABI, not the
    free-threaded one nor abi3; Linux x86_64 and aarch64, what wheelmill builds for).

    >>> (fact,) = wheel_facts("torch-2.9.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl")
    >>> fact.torch, fact.label, fact.python, fact.platform, fact.glibc
    (<Version('2.9.0')>, 'cu130', '3.11', 'x86_64', 'manylinux_2_28')
    """
    try:
        name, version, _, tags = parse_wheel_filename(filename)
    except (InvalidWheelFilename, InvalidVersion):
        return ()  # an sdist, or a file no installer takes for a wheel
    if name != PROJECT or not version.local:
        return ()
    facts = (_fact(filename, version, tag) for tag in sorted(tags, key=str))
    return tuple(fact for fact in facts if fact is not None)


def _fact(filename: str, version: Version, tag: Tag) -> UpstreamFile | None:
    machine = next((m for m in PLATFORMS if tag.platform.endswith(f"_{m}")), None)
    linux = tag.platform.startswith(("manylinux", "linux_"))
    if machine is None or not linux or not tag.interpreter.startswith("cp3") or tag.abi != tag.interpreter:
        return None
    policy = normalize_platform(tag.platform).removesuffix(f"_{machine}")
    return UpstreamFile(
        filename=filename,
        torch=Version(version.public),
        label=str(version.local),
        python=f"3.{tag.interpreter[3:]}",
        platform=machine,
        glibc=policy if policy.startswith("manylinux_") else None,
    )


def releases(files: Iterable[UpstreamFile], *, pre: bool = False) -> dict[str, tuple[UpstreamRelease, ...]]:
    """Each label's releases upstream, oldest first: final ones, and with ``pre`` the
    pre-releases and dev builds too."""
    grouped: dict[tuple[str, Version], list[UpstreamFile]] = {}
    for fact in files:
        if pre or not fact.torch.is_prerelease:
            grouped.setdefault((fact.label, fact.torch), []).append(fact)
    found: dict[str, list[UpstreamRelease]] = {}
    for (label, torch), facts in sorted(grouped.items(), key=lambda item: item[0][1]):
        found.setdefault(label, []).append(
            UpstreamRelease(
                torch=torch,
                label=label,
                wheels=frozenset((f.python, f.platform) for f in facts),
                glibc=_glibc(facts),
            )
        )
    return {label: tuple(each) for label, each in found.items()}


def _glibc(facts: Sequence[UpstreamFile]) -> tuple[tuple[str, str], ...]:
    """Each machine's most demanding manylinux policy among the wheels (what all of them run on)."""
    most: dict[str, str] = {}
    for fact in facts:
        if fact.glibc and _policy_key(fact.glibc) > _policy_key(most.get(fact.platform, "manylinux_0_0")):
            most[fact.platform] = fact.glibc
    return tuple(sorted(most.items()))


def label_release(label: str) -> tuple[Family, tuple[int, int] | None] | None:
    """A local label's family and toolkit release, in the matrix's forms of labels (cpu,
    cuNNN, rocmX.Y); None for any other (xpu, a ROCm label with a patch release).

    >>> label_release("cu130"), label_release("rocm6.4"), label_release("cpu"), label_release("xpu")
    ((<Family.CUDA: 'cuda'>, (13, 0)), (<Family.ROCM: 'rocm'>, (6, 4)), (<Family.CPU: 'cpu'>, None), None)
    """
    if label == "cpu":
        return Family.CPU, None
    digits = label.removeprefix("cu")
    if label.startswith("cu") and len(digits) == 3 and digits.isdigit():
        return Family.CUDA, (int(digits[:2]), int(digits[2]))
    parts = label.removeprefix("rocm").split(".")
    if label.startswith("rocm") and len(parts) == 2 and all(p.isdigit() for p in parts):
        return Family.ROCM, (int(parts[0]), int(parts[1]))
    return None


# --- what the matrix lacks --------------------------------------------------------------


def missing(matrix: Matrix, files: Iterable[UpstreamFile], *, pre: bool = False) -> tuple[Finding, ...]:
    """What upstream has that no variant builds: newer torch releases of the variants' labels,
    then labels of newer toolkits than any variant's."""
    upstream = releases(files, pre=pre)
    declared = [v for v in matrix.variants.values() if v.base_name == v.name]
    newer = [finding for v in declared for finding in _newer_torch(v, upstream.get(v.label, ()))]
    return (*newer, *_new_labels(matrix, declared, upstream))


def _newer_torch(variant: Variant, upstream: Sequence[UpstreamRelease]) -> list[Finding]:
    """The newest release of each torch minor above every torch the variant builds."""
    built = max(Version(t) for t in (variant.torch, *variant.other_torch))
    newest: dict[tuple[int, ...], UpstreamRelease] = {}
    for release in upstream:
        if release.torch > built:
            newest[release.torch.release[:2]] = release  # oldest first: the newest of a minor stays
    return [
        Finding(kind="newer-torch", release=r, variant=variant.name, blocked=_why_not_other_torch(variant, r))
        for r in newest.values()
    ]


def _why_not_other_torch(variant: Variant, release: UpstreamRelease) -> str | None:
    """What keeps ``other-torch`` from taking the release, or None."""
    torch, name = str(release.torch), variant.name
    unpinnable = _unpinnable(release.torch)
    if unpinnable:
        return unpinnable
    same = next((t for t in (variant.torch, *variant.other_torch) if torch_tag(t) == torch_tag(torch)), None)
    if same is not None:
        return (
            f"the same minor release as {name}'s torch {same} (other-torch takes one release a minor): "
            f'set torch = "{torch}" by hand and lock its cells again'
        )
    lacking = [f"{p} on {m}" for m in variant.platforms for p in variant.pythons if (p, m) not in release.wheels]
    if lacking:
        return (
            f"no wheel upstream for Python {', '.join(lacking)}, which {name} builds (a variant of another torch "
            f"takes its parent's Pythons and platforms): add it by hand, as a variant of its own"
        )
    return None


def _unpinnable(torch: Version) -> str | None:
    """Why a torch is no release the matrix can pin (X.Y.Z, or X.Y.Z with a pre-release), or None."""
    if torch.epoch or torch.post is not None or torch.dev is not None or len(torch.release) != 3:
        return f"{torch} is no release the matrix pins (X.Y.Z, or a pre-release such as X.Y.Zrc1)"
    return None


def _new_labels(
    matrix: Matrix, declared: Sequence[Variant], upstream: Mapping[str, Sequence[UpstreamRelease]]
) -> list[Finding]:
    labels = {v.label for v in declared}
    found = (_new_label(matrix, declared, each) for label, each in upstream.items() if label not in labels)
    return sorted((f for f in found if f is not None), key=lambda f: _label_key(f.label))


def _new_label(matrix: Matrix, declared: Sequence[Variant], upstream: Sequence[UpstreamRelease]) -> Finding | None:
    """The newest release of a label no variant has, where its toolkit is newer than every
    variant's of its family: a new variant, modelled on the newest of them."""
    release = upstream[-1]
    family, toolkit = label_release(release.label) or (None, None)
    kin = [v for v in declared if v.family is family and v.toolkit]
    if family is None or toolkit is None or not kin or toolkit <= max(_toolkit(v) for v in kin):
        return None
    return Finding(
        kind="new-label",
        release=release,
        variant=f"{family.value}{toolkit[0]}{toolkit[1]}",  # as the matrix names them: cuda132, rocm70
        model=max(kin, key=_toolkit).name,
        blocked=_why_not_new(matrix, release),
    )


def _why_not_new(matrix: Matrix, release: UpstreamRelease) -> str | None:
    """What keeps a new variant from building the release, or None."""
    if X86_64 not in release.platforms:
        return (
            f"upstream has no {X86_64} wheel of {release.torch}+{release.label}, and every variant builds for {X86_64}"
        )
    if not any(p in matrix.pythons for p in release.pythons_on(X86_64)):
        return (
            f"upstream's {release.torch}+{release.label} is for Python {', '.join(release.pythons)}, none of the "
            f"matrix's pythons: add one to the top-level pythons first"
        )
    return _unpinnable(release.torch)


def _toolkit(variant: Variant) -> tuple[int, int]:
    assert variant.toolkit is not None
    major, minor = variant.toolkit.split(".")[:2]
    return int(major), int(minor)


def _label_key(label: str) -> tuple[str, tuple[int, int]]:
    """Labels by family, then toolkit release."""
    family, toolkit = label_release(label) or (None, None)
    return (family.value if family else "", toolkit or (0, 0))


def _python_key(python: str) -> tuple[int, ...]:
    return tuple(int(part) for part in python.split("."))


def _policy_key(policy: str) -> tuple[int, ...]:
    return tuple(int(part) for part in policy.removeprefix("manylinux_").split("_"))


# --- the change to the matrix -----------------------------------------------------------

# The width of the comments written into the matrix, as its own are.
COMMENT_WIDTH = 92
# Above an other-torch a variant had none of: why it is there.
_OTHER_TORCH_COMMENT = "Newer torch releases upstream has, each in cells and a channel of its own."


def matrix_diff(
    matrix_text: str, findings: Iterable[Finding], matrix: Matrix, *, path: str = "recipes/matrix.toml"
) -> str:
    """The change that adds the findings (those not blocked) to the matrix, as a unified diff
    of ``path`` ("" where there is none), which ``patch -p1`` and ``git apply`` take."""
    return unified_diff(matrix_text, patched(matrix_text, findings, matrix), path=path)


def patched(matrix_text: str, findings: Iterable[Finding], matrix: Matrix) -> str:
    """The matrix's text with the findings (those not blocked) added, each where it belongs:
    a newer torch into its variant's ``other-torch``, a new label as a table after its model's."""
    taken = [f for f in findings if f.blocked is None]
    added: dict[str, list[str]] = {}
    for finding in taken:
        if finding.kind == "newer-torch":
            added.setdefault(finding.variant, []).append(finding.torch)
    tables = sorted((f for f in taken if f.kind == "new-label"), key=lambda f: _label_key(f.label))
    lines = matrix_text.splitlines()
    try:
        edits = [add_other_torch(lines, name, torches, comment=_OTHER_TORCH_COMMENT) for name, torches in added.items()]
        edits += [insert_after(lines, str(f.model), _variant_table(f, matrix)) for f in tables]
    except LookupError as exc:
        raise ConfigError(f"{matrix.path}: {exc}", fix="add what upstream has by hand") from None
    text = "\n".join(apply(lines, edits)) + ("\n" if matrix_text.endswith("\n") else "")
    _check_edit(text, added, tables, matrix)
    return text


def _check_edit(text: str, added: Mapping[str, Sequence[str]], tables: Sequence[Finding], matrix: Matrix) -> None:
    """The edited text says what the edit meant it to: a layout the edit does not know (an
    array it cannot read) fails here, never in a diff that applies to something else."""
    try:
        variants = tomllib.loads(text)["variants"]
    except (tomllib.TOMLDecodeError, KeyError):
        variants = {}
    for name, torches in added.items():
        before = list(matrix.variants[name].other_torch)
        if variants.get(name, {}).get("other-torch") != [*before, *torches]:
            raise ConfigError(
                f"{matrix.path}: variants.{name}.other-torch: cannot add {', '.join(torches)} in place",
                fix=f"add them by hand: other-torch = {json.dumps([*before, *torches])}",
            )
    for finding in tables:
        if variants.get(finding.variant, {}).get("torch") != finding.torch:
            raise ConfigError(
                f"{matrix.path}: cannot insert [variants.{finding.variant}] after variants.{finding.model}",
                fix=f"add a variant of {finding.label} by hand, modelled on {finding.model}",
            )


def _variant_table(finding: Finding, matrix: Matrix) -> list[str]:
    """A new label's variant table: its model's toolkit pins and arch list, upstream's torch,
    Pythons (those of the matrix) and glibc, under a comment that says what to check."""
    model, release = matrix.variants[str(finding.model)], finding.release
    family, toolkit = finding.family, _release_of(finding.label)
    pythons = [p for p in matrix.pythons if p in release.pythons_on(X86_64)]
    aarch64 = family is Family.CUDA and all(p in release.pythons_on(AARCH64) for p in pythons)
    glibc = _known_policy(release.glibc_on(X86_64), X86_64) or model.glibc
    values: list[tuple[str, object]] = [
        ("family", family.value),
        ("toolkit", f"{toolkit[0]}.{toolkit[1]}.0"),
        ("cudnn", model.cudnn),
        ("nccl", model.nccl),
        ("arch-list", model.arch_list),
        ("label", finding.label),
        ("torch", finding.torch),
        ("glibc", glibc),
        ("pythons", pythons),
        ("platforms", [X86_64, AARCH64] if aarch64 else None),
    ]
    lines = [*_table_comment(finding, model, matrix, pythons), f"[variants.{finding.variant}]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in values if value is not None]
    return lines + (_aarch64_table(finding, model, matrix, glibc) if aarch64 else [])


def _table_comment(finding: Finding, model: Variant, matrix: Matrix, pythons: Sequence[str]) -> list[str]:
    """What the table is, and what to check by hand before a build."""
    kind = "CUDA" if finding.family is Family.CUDA else "ROCm"
    toolkit = ".".join(map(str, _release_of(finding.label)))
    pins = ", cudnn and nccl (PyTorch's build of it pins them)" if finding.family is Family.CUDA else ""
    others = [p for p in finding.release.pythons_on(X86_64) if p not in pythons]
    text = " ".join(
        [
            f"{kind} {toolkit}: torch {finding.torch}+{finding.label} is upstream; `wheelmill matrix upstream` wrote",
            f"this variant after {model.name}. Check by hand: the toolkit's patch release{pins}, and the arch list",
            f"(what {kind} {toolkit} adds and drops).",
            *_not_copied(finding, model, matrix),
            *([f"Upstream has Python {', '.join(others)} too, which the top-level pythons lack."] if others else []),
        ]
    )
    return [f"# {line}" for line in textwrap.wrap(text, width=COMMENT_WIDTH - 2)]


def _not_copied(finding: Finding, model: Variant, matrix: Matrix) -> list[str]:
    """What the model has that the new table leaves to a person: its slim variants, its
    toolkit's wheels, its other torch releases, its GPU runners."""
    kept = [("slim", model.slim), ("toolkit-wheels", model.toolkit_wheels), ("other-torch", model.other_torch)]
    said = (
        [f"Not copied from {model.name}: {', '.join(key for key, value in kept if value)}."]
        if any(value for _, value in kept)
        else []
    )
    run = [glob for glob in matrix.gpu_runners if fnmatch.fnmatchcase(model.name, glob)]
    if run and not any(fnmatch.fnmatchcase(finding.variant, glob) for glob in matrix.gpu_runners):
        said.append(f"No ci.gpu-runners glob names it ({model.name}'s: {', '.join(run)}).")
    return said


def _aarch64_table(finding: Finding, model: Variant, matrix: Matrix, glibc: str) -> list[str]:
    """What differs on aarch64: the model twin's arch list, upstream's glibc there."""
    twin = matrix.variants.get(f"{model.name}-{AARCH64}")
    differs = {
        "arch-list": twin.arch_list if twin is not None and twin.arch_list != model.arch_list else None,
        "glibc": _known_policy(finding.release.glibc_on(AARCH64), AARCH64),
    }
    if differs["glibc"] == glibc:
        differs["glibc"] = None
    lines = [f"{key} = {json.dumps(value)}" for key, value in differs.items() if value is not None]
    return ["", f"[variants.{finding.variant}.{AARCH64}]", *lines] if lines else []


def _known_policy(policy: str | None, platform: str) -> str | None:
    """The policy where auditwheel knows it for the platform (what the matrix accepts), else None."""
    return policy if policy is not None and policy in policies(platform) else None


def _release_of(label: str) -> tuple[int, int]:
    _, toolkit = label_release(label) or (None, None)
    assert toolkit is not None  # a new label is a toolkit's
    return toolkit
