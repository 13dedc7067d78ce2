"""The coverage page without a browser: its four files from the release of tests/unit/
test_coverage.py (cells built, served, failed and planned), what installers asked for and the
torch releases upstream the matrix lacks; everything from the data escaped, nothing loaded
from elsewhere, the tables there without JavaScript, the data held to its schema; written over
the one there on a tree and a bucket; and served by ``index serve``, with nothing else of the
release records. (tests/integration/test_coverage_page.py opens it in a real browser.)"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.conftest import CliRunner
from tests.unit import test_coverage
from tests.unit.test_serve import ask
from wheelmill.cli.coverage import GPU_SYMBOLS, SYMBOLS
from wheelmill.index.channels import COVERAGE_FILES, is_channel_name
from wheelmill.index.roots import Index
from wheelmill.index.serve import LOG_TYPE, IndexServer, make_server
from wheelmill.index.storage import Storage
from wheelmill.inputs.matrix import load_matrix
from wheelmill.inputs.recipes import load_recipes
from wheelmill.inputs.versions import Track
from wheelmill.releases.coverage import COVERAGE_SCHEMA_PATH, Coverage, Mark, coverage, release_of
from wheelmill.releases.coverage_page import MARKS, page_data, page_html, render_page, write_page
from wheelmill.releases.records import FailedBuild, Manifest, record_failure

ROOT = Path(__file__).resolve().parent.parent.parent
HEAD = test_coverage.HEAD
released = test_coverage.released  # the fixture: an rc with cells built, served, failed and planned
HOSTILE = '<script>alert("x")</script>'

# What installers asked for and did not find (`wheelmill wants`), the most asked last here: the
# page ranks them. example-cuda-ops on the cpu channel is a spot not in the matrix.
WANTS: tuple[dict[str, Any], ...] = (
    {
        "channel": "test/cu130",
        "project": "example-cpp-ops",
        "python": "3.12",
        "implementation": "CPython",
        "platform": "manylinux_2_36_x86_64",
        "reason": "no compatible file",
        "count": 2,
        "installers": {"pip": 2},
    },
    {
        "channel": "test/cpu",
        "project": "example-cuda-ops",
        "python": "3.12",
        "implementation": "CPython",
        "platform": "manylinux_2_36_x86_64",
        "reason": "no such project",
        "count": 7,
        "installers": {"uv": 5, "pip": 2},
    },
)
UPSTREAM: tuple[dict[str, Any], ...] = (
    {
        "kind": "new-label",
        "torch": "2.15.0",
        "label": "cu132",
        "family": "cuda",
        "variant": "cuda132",
        "pythons": ["3.10", "3.11", "3.12", "3.13", "3.14"],
        "platforms": ["x86_64", "aarch64"],
        "model": "cuda130",
        "blocked": None,
    },
)


def covered(index: Index) -> Coverage:
    matrix, recipes = load_matrix(ROOT / "recipes" / "matrix.toml"), load_recipes(ROOT / "recipes")
    return coverage(matrix, recipes, release_of(index.storage, Track.TEST, None))


class Links(HTMLParser):
    """Every src and href of a page, each element's attributes by id, and the text of each
    table cell with its class and title."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.ids: dict[str, dict[str, str | None]] = {}
        self.tables = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        self.urls += [value or "" for name, value in attrs if name in ("src", "href")]
        if found.get("id"):
            self.ids[str(found["id"])] = found
        self.tables += tag == "table"


def parsed(page: str) -> Links:
    links = Links()
    links.feed(page)
    return links


def test_the_page_has_a_table_per_recipe_and_reads_without_javascript(released: Index) -> None:
    files = render_page(covered(released).as_dict(), wants=WANTS, upstream=UPSTREAM)
    assert set(files) == set(COVERAGE_FILES)
    page = files["index.html"].decode()
    links = parsed(page)
    # The finder waits for finder.js; the tables, the failures and the wanted need nothing.
    assert "hidden" in links.ids["finder"] and "<noscript>" in page
    assert {"recipe-example-cpp-ops", "recipe-torchsort", "recipes", "failed", "wanted", "legend"} <= set(links.ids)
    cpu = re.search(r'<tr><th scope="row">cpu</th>(.*?)</tr>', page[page.index('id="recipe-example-cpp-ops"') :])
    assert cpu is not None
    cells = re.findall(r'<td class="spot ([a-z-]+)" title="([^"]*)"><span class="mark">([^<]*)</span>', cpu.group(1))
    # cpu has no 3.9; 3.11 built (its file in the title); the other Pythons planned
    assert [(mark, shown) for mark, _title, shown in cells] == [
        ("absent", "\N{EN DASH}"),
        ("planned", "planned"),
        ("built", "built"),
        ("planned", "planned"),
        ("planned", "planned"),
    ]
    assert "example_cpp_ops-2.4.0rc1+cpu-cp311-cp311-linux_x86_64.whl" in cells[2][1]
    # The failed cell: its step and error line, and a link to its log's end one up from coverage/.
    failed = re.search(r'<td class="spot failed".*?</td>', page[page.index('id="recipe-torchsort"') :])
    assert failed is not None and "build: nvcc fatal: unsupported gpu" in failed.group(0)
    assert re.search(r'href="\.\./releases/test/2\.4\.0rc1/failed/cuda130-py312/[0-9a-f-]+\.log"', failed.group(0))
    assert "flash-attn: opt-in, in " in page and "; none built</li>" in page, "like the terminal's line"
    assert page.index("example-cuda-ops</td>") < page.index("example-cpp-ops</td>"), "the most asked first"
    assert "cu132" in page and "a new variant, cuda132" in page


def test_everything_from_the_data_is_escaped(released: Index) -> None:
    data = covered(released).as_dict()
    failed = next(s for s in data["spots"] if s["mark"] == "failed")
    failed["failure"]["error"] = HOSTILE
    failed["failure"]["log"] = 'releases/x"><script>y</script>.log'
    first = data["recipes"][0]
    data["recipes"][0] = HOSTILE
    for spot in data["spots"]:
        spot["recipe"] = HOSTILE if spot["recipe"] == first else spot["recipe"]
    wants = [{**WANTS[0], "project": HOSTILE, "platform": "'onmouseover='x"}]
    upstream = [{**UPSTREAM[0], "label": '"><img src=x onerror=alert(1)>'}]
    page = page_html(page_data(data, wants=wants, upstream=upstream))
    assert "<script>" not in page.replace('<script src="finder.js" defer></script>', "")
    assert "<img" not in page and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert "'onmouseover='" not in page and "&#x27;onmouseover=&#x27;x" in page
    assert parsed(page).urls.count("finder.js") == 1


def test_nothing_is_loaded_from_elsewhere_and_data_is_written_as_text(released: Index) -> None:
    files = render_page(
        covered(released).as_dict(), wants=WANTS, upstream=UPSTREAM, index_url="https://wheels.example/"
    )
    urls = parsed(files["index.html"].decode()).urls
    assert urls and not [u for u in urls if re.match(r"(?i)^(https?:)?//", u)], urls
    assert sorted(u for u in urls if not u.startswith("../releases/")) == sorted(
        ["data:,", "coverage.css", "finder.js", "coverage.json"]
    )
    assert "http" not in files["index.html"].decode().lower(), "the index's URL is in the data only"
    css = files["coverage.css"].decode()
    assert not re.search(r"url\(|@import|@font-face|https?:", css)
    script = files["finder.js"].decode()
    assert not re.search(r"https?://|innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(", script)
    assert "textContent" in script


def test_the_json_has_the_coverage_the_wants_ranked_upstream_and_the_index_url(released: Index) -> None:
    found = covered(released).as_dict()
    files = render_page(found, wants=WANTS, upstream=UPSTREAM, index_url="https://wheels.example/")
    data = json.loads(files["coverage.json"])
    assert set(data) == {*found, "wants", "upstream", "index_url"}
    assert data["index_url"] == "https://wheels.example"
    assert [w["count"] for w in data["wants"]] == [7, 2] and data["upstream"] == list(UPSTREAM)
    jsonschema.validate(data, json.loads(COVERAGE_SCHEMA_PATH.read_text()))
    assert json.loads(render_page(found)["coverage.json"])["index_url"] is None, "the page's parent, found in JS"


def test_the_page_is_written_over_the_one_there(storage: Storage) -> None:
    """On a tree and a bucket alike: each file over the one there, and ``coverage`` is no channel."""
    first = {name: f"first {name}".encode() for name in COVERAGE_FILES}
    assert write_page(storage, first) == f"{storage.location.rstrip('/')}/coverage/"
    write_page(storage, {**first, "index.html": b"second"})
    stored = {name: storage.get(f"coverage/{name}") for name in COVERAGE_FILES}
    assert {name: found.data if found else None for name, found in stored.items()} == {**first, "index.html": b"second"}
    assert not is_channel_name("coverage") and not is_channel_name("test/coverage")


def test_coverage_page_writes_it_beside_the_channels_and_says_where_in_one_line(
    released: Index, cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WHEELMILL_INDEX_ROOT", str(released.tree))
    monkeypatch.setenv("WHEELMILL_SERVED_INDEX", "https://wheels.example/")
    shown = cli("coverage", "--page")
    assert shown.code == 0, shown.err
    assert shown.out.splitlines() == [
        f"coverage page of test/2.4.0rc1: {released.tree}/coverage/, served at https://wheels.example/coverage/"
    ]
    assert released.tree is not None
    data = json.loads((released.tree / "coverage" / "coverage.json").read_text())
    assert data["index_url"] == "https://wheels.example" and data["wants"] == [] and data["upstream"] == []
    assert Index(tree=released.tree).channel_names() == ["test/cpu", "test/cu130", "test/cu130-torch2.12"]


@pytest.fixture
def serving(released: Index) -> Iterator[IndexServer]:
    assert released.tree is not None
    write_page(released.storage, render_page(covered(released).as_dict(), wants=WANTS))
    served = make_server(released.tree, "127.0.0.1", 0)
    thread = threading.Thread(target=served.serve_forever, daemon=True)
    thread.start()
    yield served
    served.shutdown()
    served.server_close()
    thread.join(timeout=10)


def test_index_serve_serves_the_page_and_the_logs_ends_and_nothing_else_of_the_records(
    released: Index, serving: IndexServer
) -> None:
    for name, content_type in {**COVERAGE_FILES, "": COVERAGE_FILES["index.html"]}.items():
        status, headers, body = ask(serving, f"/coverage/{name}")
        assert (status, headers["content-type"]) == (200, content_type), name
        assert body == (released.storage.get(f"coverage/{name or 'index.html'}") or pytest.fail(name)).data
    status, headers, _ = ask(serving, "/coverage")
    assert (status, headers["location"]) == (301, "/coverage/")
    (log,) = [key for key in released.storage.keys_under("releases/") if key.endswith(".log")]
    status, headers, body = ask(serving, f"/{log}")
    assert (status, headers["content-type"], body) == (
        200,
        "text/plain; charset=utf-8",
        b"...\nnvcc fatal: unsupported gpu\n",
    )
    record = log.removesuffix(".log") + ".json"
    for hidden in (f"/{record}", "/releases/test/2.4.0rc1/release.json", "/coverage/other.html", "/releases/"):
        assert ask(serving, hidden)[0] == 404, hidden
    assert ask(serving, "/releases/elsewhere/2.4.0rc1/failed/cuda130-py312/x.log")[0] == 404


# --- docs/coverage.md, kept true -------------------------------------------------------

STAMP = re.compile(r"\d{20}-\d+-[0-9a-f]{8}")  # a record's stamp: when and where it was made


def docs_section(marker: str) -> str:
    text = (ROOT / "docs" / "coverage.md").read_text()
    return text[text.index(f"<!-- {marker}:start") : text.index(f"<!-- {marker}:end")]


def test_the_docs_grid_is_what_coverage_prints(
    released: Index, cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    command, *shown = docs_section("grid").split("```")[1].strip().splitlines()
    assert command == "$ COLUMNS=100 wheelmill coverage --recipe example-stable-ops"
    monkeypatch.setenv("WHEELMILL_INDEX_ROOT", str(released.tree))
    monkeypatch.setenv("COLUMNS", "100")
    printed = cli(*command.split()[3:])
    assert printed.code == 0, printed.err
    assert [STAMP.sub("<stamp>", line.rstrip()) for line in printed.out.splitlines()] == [
        STAMP.sub("<stamp>", line) for line in shown
    ]


def test_the_docs_legend_is_the_grids_and_the_pages() -> None:
    rows = re.findall(r"^\| (`.`|\(blank\)) \| `([a-z-]+)` \| (.+) \|$", docs_section("legend"), flags=re.MULTILINE)
    assert {mark: symbol.strip("`") for symbol, mark, _said in rows} == {
        mark: symbol if symbol != " " else "(blank)" for mark, (symbol, _style) in SYMBOLS.items()
    }
    assert [mark for _symbol, mark, _said in rows] == list(MARKS)
    text = (ROOT / "docs" / "coverage.md").read_text()
    assert all(f"`{symbol}`" in text for symbol in GPU_SYMBOLS.values())


def test_the_docs_name_every_field_of_the_schema() -> None:
    schema = json.loads(COVERAGE_SCHEMA_PATH.read_text())
    fields = set(schema["properties"]) | {key for found in schema["$defs"].values() for key in found["properties"]}
    text = (ROOT / "docs" / "coverage.md").read_text()
    section = text[text.index("## JSON") : text.index("## A failed build's record")]
    assert [field for field in sorted(fields) if f"`{field}`" not in section] == []
    assert "`src/wheelmill/releases/schema/coverage.schema.json`" in section
    assert (ROOT / "src/wheelmill/releases/schema/coverage.schema.json").is_file()


def test_the_docs_table_of_what_is_served_is_index_serves() -> None:
    rows = dict(re.findall(r"^\| (.+) \| `([^`]+)` \|$", docs_section("served"), flags=re.MULTILINE))
    served = {urls: kind for urls, kind in rows.items() if urls.startswith("`/coverage/")}
    assert {f"`/coverage/{name}`": kind for name, kind in COVERAGE_FILES.items() if name != "index.html"} == {
        urls: kind for urls, kind in served.items() if "," not in urls
    }
    assert rows["`/coverage/`, `/coverage/index.html`"] == COVERAGE_FILES["index.html"]
    assert rows["`/releases/<track>/<version>/failed/<cell>/<stamp>.log`"] == LOG_TYPE


def test_a_cells_published_files_count_over_its_recorded_failure(released: Index) -> None:
    """docs/coverage.md, "A failed build's record": a failure recorded for a cell whose files
    are published (a retried job that failed, then built) leaves its spots built."""
    head = Manifest(version="2.4.0rc1", track=Track.TEST, commit=HEAD, tag="v2.4.0-rc1", files=(), gpu_runners={})
    failed = FailedBuild(cell="cpu-py311", step="build", recipe=None, error="a failure before", exit_code=10)
    record_failure(released.storage, head, failed, b"log")
    assert covered(released).spot("example-cpp-ops", "cpu", "3.11").mark is Mark.BUILT
