"""What a package index says is held to what it may say: a file's name is a name and no path,
and a page nested past reason is an error of its own, never a crash."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wheelmill.errors import FetchError
from wheelmill.machine.net import _parse_html, _parse_json, fetch_bytes, file_name, linked

PAGE = "http://127.0.0.1:9/simple/demo/"


@pytest.mark.parametrize("name", ["../x.whl", "a/../../x.whl", "x\\y.whl", "..", ".", "", " x.whl", "x\0.whl"])
def test_a_listed_name_that_is_a_path_is_refused(name: str) -> None:
    with pytest.raises(FetchError, match="which is no file name"):
        file_name(name, PAGE)


def test_a_json_page_listing_a_path_as_a_file_name_is_refused() -> None:
    files = [{"filename": "demo-1.0-0/../../../x-py3-none-any.whl", "url": "x.whl", "hashes": {}}]
    with pytest.raises(FetchError, match="which is no file name"):
        _parse_json(json.dumps({"files": files}), PAGE)


def test_an_html_link_whose_name_decodes_to_a_path_is_refused_and_a_folder_s_link_skipped() -> None:
    with pytest.raises(FetchError, match="which is no file name"):
        _parse_html('<a href="..%2F..%2Fx-1.0-py3-none-any.whl">x</a>', PAGE)
    found = _parse_html('<a href="../">../</a><a href="demo-1.0-py3-none-any.whl#sha256=ab">d</a>', PAGE)
    assert [f.filename for f in found] == ["demo-1.0-py3-none-any.whl"]


def test_a_page_nested_past_reason_is_a_fetch_error() -> None:
    deep = '{"files": ' + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(FetchError, match="not a PEP 691 project page"):
        _parse_json(deep, PAGE)


@pytest.mark.parametrize(
    "href",
    ["file:///dev/zero", "http://127.0.0.1:10/blobs/x.whl", "https://127.0.0.1:9/blobs/x.whl", "//evil.example/x"],
)
def test_a_link_off_the_index_s_own_host_is_refused(href: str) -> None:
    with pytest.raises(FetchError, match="not on the index's own host; refused"):
        linked(PAGE, href, what="x.whl")


def test_a_link_on_the_index_s_own_host_resolves_against_its_page() -> None:
    assert linked(PAGE, "../../blobs/x.whl", what="x.whl") == "http://127.0.0.1:9/blobs/x.whl"


def test_a_small_file_read_whole_stops_at_its_limit(tmp_path: Path) -> None:
    big = tmp_path / "x.whl.intoto.jsonl"
    big.write_bytes(b"{}" * (1 << 20))
    assert fetch_bytes(big.as_uri(), limit=2 << 20) == b"{}" * (1 << 20)
    with pytest.raises(FetchError, match="more than 1 MiB; not read further"):
        fetch_bytes(big.as_uri(), limit=1 << 20)
