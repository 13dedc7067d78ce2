"""No secret printed: one redaction (``wheelmill.errors.redact``) for the terminal, the error line,
the logs and the reports; a credential sent to one host never forwarded to another; key
material never quoted; a private key never written where a commit would take it."""

from __future__ import annotations

import io
import subprocess
import urllib.request
from http.client import HTTPMessage
from pathlib import Path

import pytest

from tests.conftest import CliRunner
from tests.sandbox import TAG, Sandbox, build, dist_info, repair_as_auditwheel_tags
from wheelmill import errors as redaction
from wheelmill.errors import FetchError
from wheelmill.machine.net import _CredentialsStayHome
from wheelmill.provenance.signing import new_signing_key
from wheelmill.terminal import make_console

PASSWORD = "served-secret-7781"  # noqa: S105 - a test's own credential, looked for everywhere
URL = f"http://fleet:{PASSWORD}@127.0.0.1:9/simple"


@pytest.fixture(autouse=True)
def forget(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a test makes the process remember is forgotten after it."""
    monkeypatch.setattr(redaction, "_known", set())


def test_a_url_s_password_a_token_as_its_user_and_an_authorization_header_are_masked() -> None:
    cloned = "https://ghp_0123456789abcdefghijklmn@git.example/r.git"
    text = f"GET {URL}/torch/ and {cloned}; Authorization: Basic Zm9vOmJhcg=="
    masked = redaction.redact(text)
    assert masked == (
        "GET http://fleet:***@127.0.0.1:9/simple/torch/ and https://***@git.example/r.git; Authorization: ***"
    )


def test_a_remembered_secret_is_masked_whole_and_line_by_line() -> None:
    pem = new_signing_key("ed25519").private_pem().decode()
    body = pem.splitlines()[1]
    redaction.remember([pem, "short"])
    assert body not in redaction.redact(f"key: {pem} and again {body}")
    assert redaction.redact("short stays") == "short stays", "a value under 8 characters is not masked alone"


def test_the_credential_variables_of_the_environment_are_masked_and_no_other() -> None:
    redaction.remember_environment({"AWS_SECRET_ACCESS_KEY": "aws-secret-0042", "WHEELMILL_OUTPUT": "/srv/wheels"})
    assert redaction.redact("/srv/wheels aws-secret-0042") == "/srv/wheels ***"


def test_the_error_line_the_terminal_and_a_report_mask_a_url_s_password(tmp_path: Path) -> None:
    error = FetchError(f"{URL}/torch/: HTTP 503", fix=f"check {URL}")
    assert PASSWORD not in error.one_line() and "http://fleet:***@127.0.0.1:9/simple/torch/" in error.one_line()
    stream = io.StringIO()
    make_console(stream).print(f"reusing from {URL}")
    assert stream.getvalue().strip() == "reusing from http://fleet:***@127.0.0.1:9/simple"
    data = redaction.redact_data({"served": [URL], URL: 1, "n": 2})
    masked = "http://fleet:***@127.0.0.1:9/simple"
    assert data == {"served": [masked], masked: 1, "n": 2}


@pytest.mark.parametrize(
    ("target", "kept"),
    [
        ("http://127.0.0.1:8080/files/torch.whl", True),
        ("http://127.0.0.1:8081/files/torch.whl", False),  # another port: another server
        ("https://127.0.0.1:8080/files/torch.whl", False),
        ("http://wheels.example/files/torch.whl", False),
    ],
)
def test_a_redirect_keeps_the_credential_on_its_own_host_alone(target: str, kept: bool) -> None:
    request = urllib.request.Request(
        "http://127.0.0.1:8080/simple/torch/", headers={"Authorization": "Basic Zm9vOmJhcg=="}
    )
    handler = _CredentialsStayHome()
    headers = HTTPMessage()
    new = handler.redirect_request(request, io.BytesIO(), 302, "Found", headers, target)
    assert new is not None and new.full_url == target
    assert new.has_header("Authorization") is kept


def test_key_material_in_another_form_is_never_quoted(cli: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    """DER in hex is too long a name for the file system: once that crashed, quoting the key."""
    material = "30" * 300
    monkeypatch.setenv("WHEELMILL_SIGNING_KEY", material)
    result = cli("verify", str(Path(__file__)))
    assert result.code == 3, result.err
    assert material[:40] not in result.out + result.err
    assert result.err.startswith("wheelmill: error: WHEELMILL_SIGNING_KEY: not a PEM private key"), result.err


def test_key_new_refuses_a_path_a_commit_would_take(cli: CliRunner, tmp_path: Path) -> None:
    repository = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repository)], check=True)
    refused = cli("key", "new", "--out", str(repository / "keys" / "team.pem"))
    assert refused.code == 2 and "a commit would publish the private key" in refused.err, refused.err
    assert not (repository / "keys" / "team.pem").exists()
    (repository / ".gitignore").write_text("/keys/*.pem\n")
    made = cli("key", "new", "--out", str(repository / "keys" / "team.pem"))
    assert made.code == 0, made.err
    assert (repository / "keys" / "team.pem").is_file() and (repository / "keys" / "team.pem.pub").is_file()


def test_a_signed_build_writes_no_credential_or_key_material_anywhere(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A served index given with a password, the signing key as a CI secret, a bucket's secret
    in the environment: the whole output root (logs, report, index, provenance) and everything
    printed hold none of them, and the served index is named where it was used, masked."""

    repair_as_auditwheel_tags(monkeypatch)
    sandbox = Sandbox(tmp_path / "repo")
    sandbox.recipe("a", dist_info("a", "1.0"), wheel=f"a-1.0-{TAG}.whl")
    pem = new_signing_key("ed25519").private_pem().decode()
    monkeypatch.setenv("WHEELMILL_SERVED_INDEX", URL)
    monkeypatch.setenv("WHEELMILL_SIGNING_KEY", pem)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "bucket-secret-5519")
    result = build(cli, monkeypatch, sandbox, "cpu")
    assert result.code == 0, (result.out + result.err)[-3000:]
    secrets = [PASSWORD, "bucket-secret-5519", *(line for line in pem.splitlines() if not line.startswith("-----"))]
    files = [path for path in sandbox.output.rglob("*") if path.is_file()]
    assert any(path.name.endswith(".intoto.jsonl") for path in files), "the build signed what it published"
    written = {path: path.read_bytes().decode("utf-8", "replace") for path in files}
    found = [(str(path), secret) for path, text in written.items() for secret in secrets if secret in text]
    printed = [secret for secret in secrets if secret in result.out + result.err]
    assert found == [] and printed == [], (found, printed)
    assert any("127.0.0.1:9/simple" in text for text in written.values()), "the served index was used and named"
