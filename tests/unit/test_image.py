"""``wheelmill image build|manifest --push REGISTRY``: a malformed registry is a bad command
line (exit 2, one line naming the value), refused as the arguments are read: before the
inputs are loaded, a channel read or an engine asked, and with nothing written."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import CliRunner
from wheelmill.cli import image
from wheelmill.errors import ConfigError, UsageError, WheelmillError
from wheelmill.machine.builder_images import Sharing
from wheelmill.machine.registry import is_registry
from wheelmill.settings import SharedWrites

ROOT = Path(__file__).resolve().parent.parent.parent
BAD = [
    "http://not a registry!!",
    "https://ghcr.io/my-org",  # a scheme
    "ghcr.io/My-Org",  # upper case: no reference may have it
    "ghcr.io/my org",
    "wheelmill",  # the engines would push to Docker Hub's wheelmill/ namespace
    "/wheelmill",
    "ghcr.io:/x",
    "",
]


class Reached(WheelmillError):
    """Raised where the command would start its work: the test's marker that it got there."""

    exit_code = 99


@pytest.fixture
def work_spied(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What the commands reached of their work: loading the inputs, or finding an engine."""
    reached: list[str] = []

    def mark(what: str) -> Callable[..., None]:
        def spy(*_args: object, **_kwargs: object) -> None:
            reached.append(what)
            raise Reached(f"reached {what}")

        return spy

    monkeypatch.setattr(image, "load_inputs", mark("load_inputs"))
    monkeypatch.setattr("wheelmill.machine.engine.detect", mark("detect"))  # where the command takes it from
    return reached


def build(registry: str) -> list[str]:
    return ["--recipes", str(ROOT / "recipes"), "image", "build", "--cell", "cpu-py311", "--edition", "runtime",
            "--push", registry]  # fmt: skip


def manifest(registry: str) -> list[str]:
    return ["--recipes", str(ROOT / "recipes"), "image", "manifest", "--cell", "cpu-py311", "--push", registry]


@pytest.mark.parametrize("command", [build, manifest])
@pytest.mark.parametrize("registry", BAD)
def test_a_malformed_registry_is_a_usage_error_before_any_work(
    cli: CliRunner, work_spied: list[str], tmp_path: Path, command: Callable[[str], list[str]], registry: str
) -> None:
    done = cli(*command(registry))
    assert done.code == UsageError.exit_code == 2, done.err
    assert done.err == (
        f"wheelmill: error: --push {registry!r}: not a registry (host[:port][/path], lower case, no scheme); "
        "fix: give one like ghcr.io/my-org/wheelmill or 127.0.0.1:5000/wheelmill\n"
    )
    assert "Traceback" not in done.out
    assert work_spied == []
    assert list(tmp_path.iterdir()) == [], "nothing written: not even the output root"


@pytest.mark.parametrize("registry", ["127.0.0.1:5000/wheelmill", "ghcr.io/my-org/wheelmill/", "localhost/team"])
def test_a_well_formed_registry_lets_the_command_go_on_to_its_work(
    cli: CliRunner, work_spied: list[str], registry: str
) -> None:
    done = cli(*build(registry))
    assert (done.code, work_spied) == (Reached.exit_code, ["load_inputs"]), done.err


def test_the_image_registry_setting_is_checked_by_the_same_rule() -> None:
    """WHEELMILL_IMAGE_REGISTRY (``Sharing.of``) and ``--push`` share one grammar."""
    for value in BAD[:-1]:
        assert not is_registry(value)
        with pytest.raises(ConfigError, match="WHEELMILL_IMAGE_REGISTRY"):
            Sharing.of(value, SharedWrites.READ_WRITE)
