"""The repository's git state, read from git itself: what release versions are decided from
(``wheelmill.inputs.versions``, which is pure)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from wheelmill.errors import ReleaseError
from wheelmill.inputs.versions import GitState
from wheelmill.machine.process import capture


def read_state(repo: Path) -> GitState:
    """HEAD, its commit date, cleanliness and the tags merged into HEAD, from git itself."""

    def git(*args: str) -> str:
        done = capture(["git", "-C", str(repo), *args])
        if done.returncode != 0:
            why = done.stderr.strip() or f"exit {done.returncode}"
            raise ReleaseError(f"git {' '.join(args)} in {repo}: {why}", fix="run from a git clone of the repository")
        return done.stdout

    commit = git("rev-parse", "HEAD").strip()
    committed = datetime.fromtimestamp(int(git("log", "-1", "--format=%ct", "HEAD").strip()), tz=UTC)
    # Untracked files count: a build of a path recipe would pick them up.
    dirty = bool(git("status", "--porcelain", "--untracked-files=normal").strip())
    tags = {}
    for line in git(
        "for-each-ref", "--merged", "HEAD", "--format=%(refname:short) %(objectname) %(*objectname)", "refs/tags"
    ).splitlines():
        name, obj, *peeled = line.split()
        tags[name] = peeled[0] if peeled else obj  # an annotated tag points at its commit through the tag object
    return GitState(commit=commit, committed=committed, dirty=dirty, tags=tags)


def would_be_committed(path: Path) -> Path | None:
    """The root of the git work tree ``path`` would be added to by ``git add -A``: inside one,
    and not ignored by it. None outside any work tree, for an ignored path, or without git."""
    folder = next(parent for parent in path.absolute().parents if parent.is_dir())  # it may not exist yet
    top = capture(["git", "-C", str(folder), "rev-parse", "--show-toplevel"])
    if top.returncode != 0 or not top.stdout.strip():
        return None
    ignored = capture(["git", "-C", str(folder), "check-ignore", "--quiet", "--no-index", str(path.resolve())])
    return Path(top.stdout.strip()) if ignored.returncode == 1 else None


def recipes_problem(recipes: Path) -> str | None:
    """Why the recipes directory is not the commit's (None: it is): its ``matrix.toml`` is
    not tracked by git (a folder outside the repository, or one git ignores), or it holds
    files git ignores, which no commit carries and a clean tree does not show."""
    tracked = capture(["git", "-C", str(recipes), "ls-files", "--error-unmatch", "matrix.toml"])
    if tracked.returncode != 0:
        return f"{recipes}/matrix.toml is not tracked by git (a folder outside the repository, or one it ignores)"
    ignored = capture(["git", "-C", str(recipes), "ls-files", "--others", "--ignored", "--exclude-standard", "."])
    found = ignored.stdout.split()
    if found:
        return f"{recipes} holds files git ignores, which no commit carries: {', '.join(found[:5])}"
    return None
