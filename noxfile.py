"""wheelmill's sessions: ``build-<cell>`` for each cell of recipes/matrix.toml (listed
below), and for each cell ``image-<cell>-runtime``, ``image-<cell>-devel`` (its images) and,
for a GPU cell, ``test-gpu-<cell>`` (its GPU stage, on a GPU machine), which ``nox -l -s
NAME`` lists; plus ``lint``, ``tests`` and ``benchmarks``. Each is one call into the package.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import nox

from wheelmill.cli import main
from wheelmill.inputs.matrix import load_matrix
from wheelmill.inputs.variants import Family

nox.options.default_venv_backend = "none"  # the pinned tools of .venv; builds make their own envs
nox.options.sessions = ["lint", "tests"]

ROOT = Path(__file__).parent


def _wheelmill(session: nox.Session, *args: str) -> None:
    """Run wheelmill in-process, keeping its exit code (nox would turn it into 1)."""
    session.log("wheelmill " + " ".join(args))
    code = main(list(args))
    if code:
        session.log(f"wheelmill exited with {code}")
        sys.exit(code)


def _build_session(cell_id: str) -> None:
    def build(session: nox.Session) -> None:
        _wheelmill(session, "build", "--cell", cell_id, *session.posargs)

    build.__doc__ = "Every recipe, built and tested (-- --recipe NAME)."
    nox.session(name=f"build-{cell_id}", python=False)(build)


def _image_session(cell_id: str, edition: str) -> None:
    def image(session: nox.Session) -> None:
        _wheelmill(session, "image", "build", "--cell", cell_id, "--edition", edition, "--extras", *session.posargs)

    image.__doc__ = (
        f"The {edition} image of {cell_id} and its extras image, from its channel, smoke-tested "
        "(-- --push REGISTRY to push)."
    )
    nox.session(name=f"image-{cell_id}-{edition}", python=False)(image)


def _gpu_session(cell_id: str) -> None:
    def test_gpu(session: nox.Session) -> None:
        _wheelmill(session, "test-gpu", "--cell", cell_id, *session.posargs)

    test_gpu.__doc__ = (
        f"On a GPU machine: the GPU stage of {cell_id}, from its channel (-- --python PATH, -- --index-url URL)."
    )
    nox.session(name=f"test-gpu-{cell_id}", python=False)(test_gpu)


def _listing_all() -> bool:
    """Whether this is a plain ``nox -l``, which lists the build sessions and leaves out each
    cell's image and GPU sessions (three times as many lines; the docstring names them)."""
    words = sys.argv[1:]
    listing = any(word in ("-l", "--list", "--list-sessions") for word in words)
    chosen = any(word.startswith(("-s", "--session", "-e", "-k", "-t", "--tags")) for word in words)
    return listing and not chosen


for _cell in load_matrix(ROOT / "recipes" / "matrix.toml").cells:
    _build_session(_cell.id)
    if _listing_all():
        continue
    for _edition in ("runtime", "devel"):
        _image_session(_cell.id, _edition)
    if _cell.variant.family is not Family.CPU:
        _gpu_session(_cell.id)


# Two workers on any machine: more would hold several cells' envs (GBs each) at once.
WORKERS = ("--numprocesses=2", "--dist=loadgroup")


@nox.session(python=False)
def tests(session: nox.Session) -> None:
    """Unit and integration tests (-- -m "not integration" for the unit tests alone), on two
    workers (-- -n 0 for one process); the slowest twenty are listed at the end, where the
    suite's time goes. The smokes of the benchmarks that measure only are the benchmarks
    session's."""
    session.run(sys.executable, "-m", "pytest", "--durations=20", "-m", "not benchmark", *WORKERS, *session.posargs)


@nox.session(python=False)
def benchmarks(session: nox.Session) -> None:
    """The smoke runs of the benchmarks that measure only (docs/benchmarks.md): after a change
    to one of them, or to what it reads (reports, the CLI's lines)."""
    session.run(sys.executable, "-m", "pytest", "--durations=20", "-m", "benchmark", *WORKERS, *session.posargs)


@nox.session(python=False)
def lint(session: nox.Session) -> None:
    """ruff (lint and format check), mypy --strict, hadolint on every container definition,
    actionlint on every workflow, the docs' pictures held to their Graphviz sources, the docs
    site built with mkdocs --strict (a broken link, anchor or nav entry fails; the site goes to
    a temporary directory), validation of every recipe, and a check of every committed lock
    against its inputs."""
    session.run(sys.executable, "-m", "ruff", "check", ".")
    session.run(sys.executable, "-m", "ruff", "format", "--check", ".")
    session.run(sys.executable, "-m", "mypy")
    session.run(
        str(Path(sys.executable).parent / "hadolint"), *map(str, sorted(ROOT.glob("containers/*/Containerfile")))
    )
    # -shellcheck= and -pyflakes= empty: the same verdict whether or not those happen to be installed.
    session.run(
        str(Path(sys.executable).parent / "actionlint"),
        "-shellcheck=",
        "-pyflakes=",
        *map(str, sorted(ROOT.glob(".github/workflows/*.yml"))),
    )
    session.run(str(ROOT / "scripts" / "pictures"), "--check", external=True)  # each SVG its source's drawing
    with tempfile.TemporaryDirectory(prefix="wheelmill-site-") as site:
        mkdocs = str(Path(sys.executable).parent / "mkdocs")
        build = ["build", "--strict", "--quiet", "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", site]
        # NO_MKDOCS_2_WARNING: Material's banner about its own end of life, on every build otherwise.
        session.run(mkdocs, *build, env={"NO_MKDOCS_2_WARNING": "1"})
    _wheelmill(session, "validate")
    _wheelmill(session, "lock", "--check", "--cell", "*")
