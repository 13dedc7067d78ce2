"""The coverage page: a release's coverage (``Coverage.as_dict()``) as a static site of four
files beside the index's channels, ``<index>/coverage/``, written through the index's storage
on a tree and a bucket alike:

    index.html     a table per recipe (a row per variant, a column per Python), the failed
                   cells, and what is wanted: all of it readable without JavaScript
    coverage.json  the data: the coverage, with what installers asked for and did not find
                   (``wants``), the torch releases upstream that the matrix lacks
                   (``upstream``) and the served index's URL (``index_url``)
    finder.js      the finder: a package, torch, accelerator, Python and platform picked (the
                   URL's query, so an answer is a link), and the exact pip and uv lines, or why
                   no file exists and how often it was asked for
    coverage.css

Nothing is loaded from anywhere else (no CDN, no web font): the page reads the same on an
index with no way out. Each string of the data is escaped where it is written into the
HTML, and finder.js writes data only as text.
"""

from __future__ import annotations

import html
import json
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from wheelmill.errors import IndexWriteError
from wheelmill.index.channels import COVERAGE_DIR, COVERAGE_FILES
from wheelmill.index.storage import Headers, Storage

ASSETS = Path(__file__).parent / "page"  # finder.js and coverage.css, as they are served
CACHE_CONTROL = "max-age=60"  # the page is written again after each stage of a release
REWRITE_TRIES = 5
SCHEMA_PATH = "src/wheelmill/releases/schema/coverage.schema.json"  # as the page names it to a reader

Data = Mapping[str, Any]

# Each mark in words, and what it means (the legend; the terminal's, in words).
MARKS = {
    "built": "built by the cell's own job; its file is in the cell's channel",
    "served": "its ABI group's one build, made by another cell's job, listed in this channel too",
    "failed": "the cell's build failed: its step, its error's first line and its log's end",
    "planned": "the release plans it, and nothing is recorded for it yet",
    "opt-in": "built only where named (wheelmill build --recipe), never by a release",
    "absent": "not in the matrix: the recipe does not apply, or the variant has no such Python",
}
SHOWN = {"absent": "\N{EN DASH}"}  # how a mark reads in a cell, where not as its own word
# A spot's GPU stage is its files' worst outcome on any runner, worst first (passed where none).
WORST_FIRST = ("failed", "mismatch", "not-run", "skipped", "no-gpu", "stopped", "import-only", "not-covered")
GPU_WORDS = {"not-run": "not run", "not-covered": "no runner", "no-gpu": "no GPU"}
LOG_END = "its log's end"
CELL_ERROR = 90  # characters of a failure's error line in a table's cell (its title has it whole)


def worst_outcome(outcomes: Iterable[str]) -> str | None:
    """The worst of a spot's GPU outcomes; None where it has none (a CPU cell's).

    >>> worst_outcome([]), worst_outcome(["passed"]), worst_outcome(["passed", "not-run", "failed"])
    (None, 'passed', 'failed')
    """
    found = set(outcomes)
    if not found:
        return None
    return next((worst for worst in WORST_FIRST if worst in found), "passed")


def page_data(
    coverage: Data, *, wants: Sequence[Data] = (), upstream: Sequence[Data] = (), index_url: str | None = None
) -> dict[str, Any]:
    """coverage.json: the coverage, the wants the most asked first, the upstream releases."""
    ranked = sorted(wants, key=lambda w: (-int(w["count"]), w["project"], w["channel"], w["python"]))
    return {
        **coverage,
        "wants": [dict(w) for w in ranked],
        "upstream": [dict(u) for u in upstream],
        "index_url": index_url.rstrip("/") if index_url else None,
    }


def render_page(
    coverage: Data, *, wants: Sequence[Data] = (), upstream: Sequence[Data] = (), index_url: str | None = None
) -> dict[str, bytes]:
    """The page's four files by name."""
    data = page_data(coverage, wants=wants, upstream=upstream, index_url=index_url)
    return {
        "coverage.json": (json.dumps(data, indent=1) + "\n").encode(),
        "finder.js": (ASSETS / "finder.js").read_bytes(),
        "coverage.css": (ASSETS / "coverage.css").read_bytes(),
        "index.html": page_html(data).encode(),
    }


def write_page(storage: Storage, files: Mapping[str, bytes]) -> str:
    """Each file over the one there; index.html last, so that what it loads is there first.
    Where the page is: ``<location>/coverage/``."""
    for name in sorted(files, key=lambda name: name == "index.html"):
        headers = Headers(content_type=COVERAGE_FILES[name], cache_control=CACHE_CONTROL)
        _rewrite(storage, f"{COVERAGE_DIR}/{name}", files[name], headers)
    return f"{storage.location.rstrip('/')}/{COVERAGE_DIR}/"


def _rewrite(storage: Storage, key: str, data: bytes, headers: Headers) -> None:
    """The object is ``data`` now, whatever was there: created, or compare-and-swapped
    against what was read (another writer of the page in between: read again)."""
    for _ in range(REWRITE_TRIES):
        now = storage.get(key)
        if now is not None and now.data == data:
            return
        if now is None and storage.create(key, data, headers=headers):
            return
        if now is not None and storage.swap(key, data, version=now.version, headers=headers):
            return
    raise IndexWriteError(
        f"{storage.location}: {key} changed under each of {REWRITE_TRIES} tries", fix="write the page again"
    )


# --- index.html -------------------------------------------------------------------------


def page_html(data: Data) -> str:
    title = f"Coverage of {data['track']}/{data['version']}"
    body = [_header(data), _finder(), _legend(), _recipes(data), _failures(data), _wanted(data), _footer()]
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{_text(title)}</title>\n"
        '<link rel="icon" href="data:,">\n'  # no request for a favicon the index does not have
        '<link rel="stylesheet" href="coverage.css">\n<script src="finder.js" defer></script>\n'
        "</head>\n<body>\n<main>\n" + "\n".join(body) + "\n</main>\n</body>\n</html>\n"
    )


def _text(value: object) -> str:
    return html.escape(str(value), quote=True)


def _header(data: Data) -> str:
    counts = ", ".join(f"{n} {mark}" for mark, n in data["counts"].items() if n) or "nothing recorded"
    return (
        f"<header>\n<h1>Which wheel exists: {_text(data['track'])}/{_text(data['version'])}</h1>\n"
        f'<p class="summary">At commit <code>{_text(str(data["commit"])[:12])}</code>: {_text(counts)}.</p>\n'
        "</header>"
    )


def _finder() -> str:
    """The finder's form, shown once finder.js has read the data; its options are the data's."""
    labels = (("recipe", "package"), ("torch", "torch"), ("accelerator", "accelerator"), ("python", "Python"))
    picks = "".join(
        f'<label>{label} <select name="{name}"></select></label>\n'
        for name, label in (*labels, ("platform", "platform"))
    )
    return (
        '<section id="finder" hidden>\n<h2>Find a wheel</h2>\n'
        f'<form id="picks" class="picks">\n{picks}</form>\n'
        '<div id="answer" aria-live="polite"></div>\n</section>\n'
        '<noscript><p class="note">The finder needs JavaScript; the tables below say the same.</p></noscript>'
    )


def _legend() -> str:
    marks = "".join(f"<dt>{_text(SHOWN.get(m, m))}</dt><dd>{_text(said)}</dd>\n" for m, said in MARKS.items())
    gpu = (
        "<dt>GPU …</dt><dd>under a CUDA or ROCm file: its GPU stage, the worst on any runner its cell needs "
        "(passed, failed, import-only, not run, no runner); hover a cell for each runner</dd>\n"
    )
    return f'<section id="legend">\n<h2>Legend</h2>\n<dl class="legend">\n{marks}{gpu}</dl>\n</section>'


# --- the tables -------------------------------------------------------------------------


def _recipes(data: Data) -> str:
    """A table per recipe with a spot anywhere but opt-in or absent; a line for each other."""
    lines = _lines(data)
    tables, opt_in = [], []
    for recipe in data["recipes"]:
        rows = lines.get(recipe, [])
        spots = [s for _variant, row in rows for s in row]
        if all(s["mark"] in ("opt-in", "absent") for s in spots):
            cells = sum(s["mark"] == "opt-in" for s in spots)
            opt_in.append(f"<li>{_text(recipe)}: opt-in, in {cells} cells of {len(rows)} variants; none built</li>")
        else:
            tables.append(_table(recipe, data["pythons"], rows))
    only = f'<h3>Opt-in only</h3>\n<ul class="opt-in">\n{"".join(opt_in)}\n</ul>' if opt_in else ""
    return '<section id="recipes">\n<h2>Per recipe</h2>\n' + "\n".join(tables) + f"\n{only}\n</section>"


def _lines(data: Data) -> dict[str, list[tuple[Data, list[Data]]]]:
    """For each recipe, the variants where it has a spot that is not absent, with that
    variant's spots in the order of the Pythons (``coverage.by_recipe``, read from the JSON)."""
    index = {(s["recipe"], s["variant"], s["python"]): s for s in data["spots"]}
    lines: dict[str, list[tuple[Data, list[Data]]]] = {}
    for recipe in data["recipes"]:
        for variant in data["variants"]:
            row = [index[recipe, variant["name"], python] for python in data["pythons"]]
            if any(s["mark"] != "absent" for s in row):
                lines.setdefault(recipe, []).append((variant, row))
    return lines


def _table(recipe: str, pythons: Sequence[str], rows: Sequence[tuple[Data, Sequence[Data]]]) -> str:
    head = "".join(f'<th scope="col">{_text(p)}</th>' for p in ("variant", "torch", "accelerator", "platform"))
    head += "".join(f'<th scope="col" class="python">{_text(p)}</th>' for p in pythons)
    body = "".join(
        f'<tr><th scope="row">{_text(v["name"])}</th><td>{_text(v["torch"])}</td><td>{_text(v["accelerator"])}</td>'
        f"<td>{_text(v['platform'])}</td>" + "".join(_cell(s) for s in spots) + "</tr>\n"
        for v, spots in rows
    )
    return (
        f'<section class="recipe" id="recipe-{_text(recipe)}">\n<h3>{_text(recipe)}</h3>\n'
        f'<div class="scroll">\n<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}</tbody>\n</table>\n</div>\n'
        "</section>"
    )


def _cell(spot: Data) -> str:
    mark = spot["mark"]
    shown = f'<span class="mark">{_text(SHOWN.get(mark, mark))}</span>'
    extra = _CELL_EXTRAS[mark](spot) if mark in _CELL_EXTRAS else ""
    return f'<td class="spot {_text(mark)}" title="{_text(_title(spot))}">{shown}{extra}</td>'


def _title(spot: Data) -> str:
    """What a cell says when pointed at: its files and each runner's GPU stage, its failure,
    or why nothing is there."""
    mark = spot["mark"]
    if mark in ("built", "served"):
        files = "; ".join(f["filename"] for f in spot["files"])
        runners = ", ".join(f"{r or 'GPU'}: {o}" for f in spot["files"] for r, o in sorted(f["gpu"].items()))
        return f"{mark}: {files}" + (f"; GPU stage on {runners}" if runners else "")
    if mark == "failed" and spot["failure"]:
        return f"failed: {_failure_words(spot['failure'])}"
    return f"{mark}: {spot['why']}" if spot["why"] else mark


def _gpu_extra(spot: Data) -> str:
    worst = worst_outcome(o for f in spot["files"] for o in f["gpu"].values())
    if worst is None:
        return ""
    return f'<span class="gpu gpu-{_text(worst)}">GPU {_text(GPU_WORDS.get(worst, worst))}</span>'


def _failure_extra(spot: Data) -> str:
    failure = spot["failure"] or {}
    error = str(failure.get("error", ""))
    short = error if len(error) <= CELL_ERROR else error[: CELL_ERROR - 1] + "…"
    said = f'<span class="why">{_text(failure.get("step", ""))}: {_text(short)}</span>'
    return said + _log_link(failure, LOG_END)


_CELL_EXTRAS: dict[str, Callable[[Data], str]] = {
    "built": _gpu_extra,
    "served": _gpu_extra,
    "failed": _failure_extra,
}


def _failure_words(failure: Data) -> str:
    step = f"{failure['step']} ({failure['recipe']})" if failure.get("recipe") else failure["step"]
    return f"{step}, exit {failure['exit_code']}: {failure['error']}"


def _log_link(failure: Data, words: str) -> str:
    """A link to the failure's log's end: its key is relative to the index's root, one up."""
    log = failure.get("log")
    if not log:
        return ""
    return f' <a class="log" href="../{_text(urllib.parse.quote(str(log)))}">{_text(words)}</a>'


def _failures(data: Data) -> str:
    """Each failed cell once (a cell's failure marks every recipe it was to build)."""
    seen: dict[str, Data] = {}
    for spot in data["spots"]:
        if spot["mark"] == "failed" and spot["failure"]:
            seen.setdefault(spot["cell"], spot["failure"])
    if not seen:
        return ""
    items = "".join(
        f"<li><code>{_text(cell)}</code>: {_text(_failure_words(failure))}{_log_link(failure, LOG_END)}"
        + (f' <span class="run">(run: {_text(failure["run"])})</span>' if failure.get("run") else "")
        + "</li>\n"
        for cell, failure in seen.items()
    )
    return f'<section id="failed">\n<h2>Failed cells: {len(seen)}</h2>\n<ul>\n{items}</ul>\n</section>'


# --- what is wanted ---------------------------------------------------------------------


def _wanted(data: Data) -> str:
    return f'<section id="wanted">\n<h2>Wanted</h2>\n{_wants(data["wants"])}\n{_upstream(data["upstream"])}\n</section>'


def _wants(wants: Sequence[Data]) -> str:
    title = "<h3>Asked for and not found, the most asked first</h3>\n"
    if not wants:
        return title + '<p class="note">No want recorded: no installer asked for what the index lacks.</p>'
    columns = ("times", "project", "Python", "implementation", "platform", "channel", "why not")
    keys = ("count", "project", "python", "implementation", "platform", "channel", "reason")
    return title + _plain_table("wants", columns, ([w.get(k, "") for k in keys] for w in wants))


def _upstream(upstream: Sequence[Data]) -> str:
    title = "<h3>Torch releases upstream that the matrix lacks</h3>\n"
    if not upstream:
        return title + '<p class="note">None known: the matrix has every torch release upstream it could take.</p>'
    columns = ("torch", "label", "family", "what it would be", "Pythons", "platforms")
    rows = (
        [
            u.get("torch", ""),
            u.get("label", ""),
            u.get("family", ""),
            _upstream_kind(u),
            ", ".join(u.get("pythons", [])),
            ", ".join(u.get("platforms", [])),
        ]
        for u in upstream
    )
    return title + _plain_table("upstream", columns, rows)


def _upstream_kind(found: Data) -> str:
    kind, variant = str(found.get("kind", "")), found.get("variant", "")
    said = {"newer-torch": f"a newer torch for {variant}", "new-label": f"a new variant, {variant}"}.get(kind, kind)
    return f"{said} (blocked: {found['blocked']})" if found.get("blocked") else said


def _plain_table(name: str, columns: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    head = "".join(f'<th scope="col">{_text(c)}</th>' for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_text(v)}</td>" for v in row) + "</tr>\n" for row in rows)
    return (
        f'<div class="scroll">\n<table class="{name}">\n<thead><tr>{head}</tr></thead>\n'
        f"<tbody>\n{body}</tbody>\n</table>\n</div>"
    )


def _footer() -> str:
    return (
        '<footer>\n<p>The data: <a href="coverage.json">coverage.json</a>, held to '
        f"<code>{_text(SCHEMA_PATH)}</code> in wheelmill's repository.</p>\n</footer>"
    )
