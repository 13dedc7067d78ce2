"""``wheelmill matrix upstream``: the torch releases and labels upstream has that the matrix
lacks, and the change to ``recipes/matrix.toml`` that adds them. Registered under ``matrix``
by the build group; the reading is here, what it means is ``wheelmill.inputs.upstream``'s.

It reads one page, torch's on the index root (``<root>/torch/``, PEP 691 JSON or PEP 503
HTML, as PyTorch's own index serves it), not the
per-label indexes (``<root>/<label>/torch/``): the root's page lists the files of every label,
so one request sees a label no variant names yet, which no per-label page could show.
It exits 0 whether or not it finds something: a finding is a report, not a failure.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from wheelmill.cli.basics import load_inputs
from wheelmill.errors import ConfigError, FetchError, UsageError
from wheelmill.settings import Settings

# What a command does loads when it runs, never to parse a command line or print its help.
if TYPE_CHECKING:
    from wheelmill.inputs.matrix import Matrix
    from wheelmill.inputs.upstream import (
        Finding,
        UpstreamFile,
    )


URL_FIX = "check the network, or give an index root that answers with --url or WHEELMILL_UPSTREAM_INDEX"
PAGE_FIX = "give --url or WHEELMILL_UPSTREAM_INDEX the root of an index that serves torch's page (PEP 691 or 503)"


def register_upstream(matrix: argparse.ArgumentParser) -> None:
    """``upstream`` under ``matrix``, which keeps its own options (``wheelmill matrix --json``)."""
    actions = matrix.add_subparsers(dest="action", parser_class=type(matrix))
    upstream = actions.add_parser(
        "upstream",
        help="the torch releases and CUDA/ROCm labels upstream has that the matrix lacks, and the change",
        description="Read torch's page on its upstream index (PEP 691 JSON or PEP 503 HTML), report the torch "
        "releases and labels no variant builds and the change to matrix.toml that adds them. "
        "Exits 0 whether or not it finds any.",
    )
    upstream.add_argument(
        "--url",
        metavar="URL",
        help="the index root to read torch's page from (<URL>/torch/) (default: $WHEELMILL_UPSTREAM_INDEX, "
        "else the matrix's [torch] index without its {label})",
    )
    form = upstream.add_mutually_exclusive_group()
    form.add_argument(
        "--json",
        dest="upstream_json",
        action="store_true",
        help='the findings and the diff as JSON: {"url", "pre", "findings": [...], "diff"}',
    )
    form.add_argument(
        "--diff", action="store_true", help="only the change, a unified diff of matrix.toml for patch -p1 or git apply"
    )
    upstream.add_argument(
        "--pre", action="store_true", help="count pre-releases and dev builds too (default: final releases only)"
    )
    upstream.set_defaults(func=cmd_upstream)


def cmd_upstream(args: argparse.Namespace, settings: Settings, _console: Console) -> int:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.inputs.upstream import matrix_diff  # noqa: PLC0415

    _refuse_matrix_options(args)
    matrix, _ = load_inputs(settings)
    url, findings = upstream_findings(matrix, settings, url=args.url, pre=args.pre)
    text = matrix.path.read_text(encoding="utf-8")
    diff = matrix_diff(text, findings, matrix, path=f"{settings.recipes.resolve().name}/{matrix.path.name}")
    if args.diff:
        print(diff, end="")
    elif args.upstream_json:
        shape = {"url": url, "pre": args.pre, "findings": [f.as_dict() for f in findings], "diff": diff}
        print(json.dumps(shape, indent=2))
    else:
        print(report(findings, url=url, pre=args.pre), end="")
    return 0


def upstream_findings(
    matrix: Matrix, settings: Settings, *, url: str | None = None, pre: bool = False
) -> tuple[str, tuple[Finding, ...]]:
    """torch's page upstream (``url``, else the setting, else the matrix's torch index) and
    what the matrix lacks of it, each finding whose change would not load marked blocked."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.inputs.upstream import PROJECT, missing  # noqa: PLC0415

    page, auth = _page(url or settings.upstream_index or _default_root(matrix))
    files = _read_files(page.removesuffix(f"{PROJECT}/"), page, auth, settings)
    text = matrix.path.read_text(encoding="utf-8")
    return page, _loadable(missing(matrix, files, pre=pre), matrix, text)


def _page(root: str) -> tuple[str, tuple[str, str] | None]:
    """torch's page at the root, and the credential its URL carries (sent as Basic auth, and
    never printed: the URL shown is the one without it)."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.inputs.upstream import project_page  # noqa: PLC0415
    from wheelmill.machine.net import split_credentials  # noqa: PLC0415

    url, username, password = split_credentials(project_page(root))
    return url, (username or "", password or "") if username or password else None


def _refuse_matrix_options(args: argparse.Namespace) -> None:
    """``matrix``'s own options before ``upstream`` are no options of it: refused, not ignored."""
    given = [
        option
        for option, value in (
            ("--json", args.json),
            ("--markdown", args.markdown),
            ("--changed-files", args.changed_files),
        )
        if value
    ] + ([] if args.slim else ["--no-slim"])
    if given:
        raise UsageError(
            f"matrix upstream: {', '.join(given)} is an option of `wheelmill matrix`, not of `matrix upstream`",
            fix="give upstream's options after the word: wheelmill matrix upstream --json (or --diff, --pre, --url)",
        )


def _default_root(matrix: Matrix) -> str:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.inputs.upstream import default_root  # noqa: PLC0415

    root = default_root(matrix.torch_index)
    if root is None:
        raise ConfigError(
            f"{matrix.path}: torch.index ({matrix.torch_index}) names no {{label}}, so no index root follows from it",
            fix="give the root of torch's index with --url or WHEELMILL_UPSTREAM_INDEX",
        )
    return root


def _read_files(root: str, url: str, auth: tuple[str, str] | None, settings: Settings) -> tuple[UpstreamFile, ...]:
    """torch's files on its page at ``root``, PEP 691 JSON or PEP 503 HTML (PyTorch's own
    index serves HTML), retried where the index does not answer; yanked ones left out (PEP
    592: no release to build for). An error that says what to do where it cannot be read."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.inputs.upstream import PROJECT, wheel_facts  # noqa: PLC0415
    from wheelmill.machine.net import project_files  # noqa: PLC0415
    from wheelmill.retry import TransientError, with_retries  # noqa: PLC0415

    def said(attempt: int, exc: Exception, pause: float) -> None:
        print(f"{exc} (attempt {attempt}); again in {pause:.0f}s", file=sys.stderr, flush=True)

    try:
        listed, _ = with_retries(
            lambda _attempt: project_files(root, PROJECT, auth=auth), policy=settings.retry, on_retry=said
        )
    except TransientError as exc:
        raise FetchError(f"matrix upstream: cannot read torch's page upstream: {exc}", fix=URL_FIX) from None
    except FetchError as exc:
        raise FetchError(f"matrix upstream: {exc.message}", fix=PAGE_FIX) from None
    if not listed:
        raise FetchError(f"matrix upstream: {url}: no torch page there (HTTP 404, or no file listed)", fix=PAGE_FIX)
    return tuple(fact for file in listed if not file.yanked for fact in wheel_facts(file.filename))


def _loadable(findings: Sequence[Finding], matrix: Matrix, text: str) -> tuple[Finding, ...]:
    """The findings, each whose change would leave a matrix that does not load left out of
    the change (``blocked``, with what loading said): the diff never breaks the matrix."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.inputs.upstream import patched  # noqa: PLC0415

    kept = []
    with tempfile.TemporaryDirectory(prefix="wheelmill-upstream-") as scratch:
        for finding in findings:
            problem = None if finding.blocked else _load_problem(patched(text, [finding], matrix), Path(scratch))
            kept.append(replace(finding, blocked=f"the change would not load: {problem}") if problem else finding)
    return tuple(kept)


def _load_problem(text: str, scratch: Path) -> str | None:
    """What loading the matrix ``text`` says is wrong with it, or None."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.inputs.matrix import load_matrix  # noqa: PLC0415

    trial = scratch / "matrix.toml"
    trial.write_text(text, encoding="utf-8")
    try:
        load_matrix(trial)
    except ConfigError as exc:
        return exc.message.replace(f"{trial}: ", "")
    return None


def report(findings: Sequence[Finding], *, url: str, pre: bool = False) -> str:
    """What ``wheelmill matrix upstream`` prints: each finding, what upstream has of it, and
    what the change does with it."""
    which = "releases, pre-releases and dev builds" if pre else "final releases"
    lines = [f"upstream: {url} ({which})"]
    if not findings:
        return "\n".join([*lines, "nothing to add: the matrix builds every torch and label it would take"]) + "\n"
    for finding in findings:
        lines.append(f"{finding.kind:<12} {finding.torch + '+' + finding.label:<16} {_does(finding)}")
        platforms = ", ".join(finding.release.platforms)
        lines.append(f"{'':<29} upstream has Python {', '.join(finding.release.pythons)} on {platforms}")
    taken = sum(1 for f in findings if f.blocked is None)
    lines.append(
        f"{len(findings)} found, {taken} in the change to the matrix (`wheelmill matrix upstream --diff` prints it)"
    )
    return "\n".join(lines) + "\n"


def _does(finding: Finding) -> str:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.inputs.matrix import torch_tag  # noqa: PLC0415

    if finding.blocked is not None:
        return f"{finding.variant}: left out of the change: {finding.blocked}"
    if finding.kind == "newer-torch":
        tag = torch_tag(finding.torch)
        return (
            f"{finding.variant}: into its other-torch (variant {finding.variant}-{tag}, channel {finding.label}-{tag})"
        )
    return f"{finding.variant}: a new variant modelled on {finding.model} (channel {finding.label}); check its pins"
