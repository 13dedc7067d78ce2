"""An example or two at the foot of every command's ``--help``: the command line as a user
types it, and what it does. One table, so that a unit test runs each line through the parser
(an example that stopped parsing fails it) and holds every command to having one."""

from __future__ import annotations

import argparse

from wheelmill.cli.basics import commands

HEADING = "examples:"

# Each command's examples: (the command line, what it does). A line may start with settings
# (NAME=value) as a shell takes them; the test parses what follows `wheelmill`.
EXAMPLES: dict[str, tuple[tuple[str, str], ...]] = {
    "matrix": (
        ("wheelmill matrix", "every cell: variant, torch, Python, platform, base"),
        ("wheelmill matrix --json --changed-files changed.txt", "CI: the cells the changed paths affect"),
    ),
    "matrix upstream": (
        ("wheelmill matrix upstream", "the torch releases and labels upstream has that no variant builds"),
        (
            "wheelmill matrix upstream --diff",
            "only the change that adds them: a diff of recipes/matrix.toml for git apply",
        ),
        ("wheelmill matrix upstream --json --url https://mirror.example/whl", "a mirror's, as JSON"),
    ),
    "validate": (
        ("wheelmill validate", "the matrix and every recipe read and checked; nothing built"),
        ("WHEELMILL_RECIPES=../team-recipes wheelmill validate", "a team's own recipes and matrix"),
    ),
    "plan": (
        ("wheelmill plan --cell cuda130-py311 --recipe torchsort", "what a build would do, and why"),
        ("wheelmill plan --cell 'cuda130-py31*' --engine none", "every Python of a variant, on this machine"),
    ),
    "build": (
        ("wheelmill build --cell cpu-py311", "every recipe of the cell, tested and published"),
        ("wheelmill build --cell cuda130-py311 --recipe torchsort --no-publish", "one recipe, kept out of the index"),
    ),
    "mirror": (
        ("wheelmill mirror --cell cpu-py311", "the cell's runtime closure (torch, ...) into its channel"),
        ("wheelmill mirror --cell 'cuda130-py3*'", "the closures of several built cells"),
    ),
    "lock": (
        ("wheelmill lock --cell cuda130-py311", "resolve the cell's build env and commit locks/cuda130-py311.txt"),
        ("wheelmill lock --check --cell '*'", "CI: every committed lock still matches its inputs"),
    ),
    "publish": (
        ("wheelmill publish --channel cu130 dist/*.whl", "wheels built elsewhere, verified, into a channel"),
        ("wheelmill publish --to https://pypi.internal/legacy/ dist/*.whl", "uploaded to another index"),
    ),
    "yank": (
        (
            "wheelmill yank --channel cu130 torchsort 0.1.10+cu130 --reason 'wrong kernels on sm_90'",
            "installers skip it unless pinned",
        ),
        ("wheelmill yank --channel test/cu130 torchsort 0.1.10+cu130 --reason 'rc only'", "in a track's channel"),
    ),
    "unyank": (
        ("wheelmill unyank --channel cu130 torchsort 0.1.10+cu130", "offered again"),
        ("wheelmill unyank --channel test/cu130 torchsort 0.1.10+cu130", "in a track's channel"),
    ),
    "index serve": (
        ("wheelmill index serve --port 8000", "the index over HTTP on 127.0.0.1, read-only"),
        ("wheelmill index serve --host 0.0.0.0 --port 8000", "to the machine's network (a team's box)"),
    ),
    "index config": (
        ("wheelmill index config --channel cu130 --url https://wheels.example.com", "pip's, uv's and env settings"),
        ("wheelmill index config --channel cu130 --form uv", "uv's pyproject settings alone"),
    ),
    "index verify": (
        ("wheelmill index verify", "every page lists what is stored; nothing stored is unlisted"),
        ("wheelmill index verify --channel cu130 --hashes", "every file hashed against its page too"),
    ),
    "index render": (
        ("wheelmill index render --channel cu130", "a channel's pages written again from its entries"),
        ("wheelmill index render", "every channel's pages"),
    ),
    "index sweep": (
        ("wheelmill index sweep --grace 7", "a weekly job: what no channel has listed for a week goes"),
        ("WHEELMILL_INDEX_ROOT=s3://wheels/index wheelmill index sweep", "a bucket's, a week's grace"),
    ),
    "index list": (
        ("wheelmill index list --channel cu130", "its projects and their versions"),
        ("wheelmill index list --channel test/cu130", "a track's channel: what an rc published"),
    ),
    "wants": (
        ("wheelmill wants --log /var/log/nginx/wheelmill-wants.log", "what installers asked for that no channel had"),
        (
            "wheelmill wants --log s3://logs-bucket/nginx/ --channel cu130 --top 10 --json",
            "a bucket's logs, one channel's ten most asked, as JSON",
        ),
    ),
    "index migrate": (
        ("WHEELMILL_INDEX_ROOT=/srv/index wheelmill index migrate", "an earlier layout's tree, as objects, once"),
        ("wheelmill index migrate", "the output root's index (wheels/index)"),
    ),
    "conda seed": (
        ("wheelmill conda seed --cell cpu-py311", "the cell's CPython, torch and wheels as conda packages"),
        ("wheelmill conda seed --cell cuda130-py311 --build-env", "also what the cell's conda build env needs"),
    ),
    "conda package": (
        ("wheelmill conda package --cell cpu-py311 wheels/cpu-py311/dist/*.whl", "wheels as conda packages"),
        ("wheelmill conda package --cell cpu-py311 --channel /srv/conda/cpu dist/*.whl", "into a channel elsewhere"),
    ),
    "conda solve": (
        ("wheelmill conda solve example-cpp-ops --cuda 13.0", "what a CUDA 13.0 driver's machine gets"),
        ("wheelmill conda solve 'example-cpp-ops>=0.1' --channel /srv/conda/cpu", "from a channel at a path"),
    ),
    "conda lock": (
        ("wheelmill conda lock --cell cpu-py311 --check", "the committed conda lock matches its inputs"),
        ("wheelmill conda lock --cell cpu-py311", "resolve and write the cell's conda lock"),
    ),
    "conda create": (
        ("wheelmill conda create /tmp/env example-cpp-ops torchsort", "an env from the local channels"),
        ("wheelmill conda create /tmp/env --lock locks/conda/cpu-py311.lock", "the env a lock names, exactly"),
    ),
    "conda index": (
        ("wheelmill conda index", "each conda channel's repodata.json written again"),
        ("WHEELMILL_INDEX_ROOT=/srv/index wheelmill conda index", "another index's conda channels"),
    ),
    "image build": (
        ("wheelmill image build --cell cpu-py311 --edition runtime", "the runtime image, smoke-tested"),
        (
            "wheelmill image build --cell cuda130-py311 --edition devel --extras --push registry.example.com/ml",
            "devel and extras images, pushed",
        ),
    ),
    "image manifest": (
        (
            "wheelmill image manifest --cell cpu-py311 --cell cpu-aarch64-py311 --push registry.example.com/ml",
            "one tag for both platforms",
        ),
        (
            "wheelmill image manifest --cell cuda130-py311 --cell cuda130-aarch64-py311 --push reg.example/ml",
            "a CUDA cell's two platforms",
        ),
    ),
    "release": (
        ("wheelmill release --tag v2.4.0-rc1 --dry-run", "an rc's cells, channels and versions; nothing run"),
        ("wheelmill release --nightly --json", "CI: the nightly's version, track and cells' matrix"),
    ),
    "release publish": (
        ("wheelmill release publish --tag v2.4.0-rc1", "an rc's cell into the test track, recorded"),
        ("wheelmill release publish --nightly", "HEAD's nightly into the nightly track"),
    ),
    "release promote": (
        ("wheelmill release promote --from test --to release 2.4.0", "the rc of HEAD's commit, without a build"),
        ("wheelmill release promote --from test --to release 2.4.0 --wait 3600", "CI: waits for the GPU stages"),
    ),
    "release record-gpu": (
        ("wheelmill release record-gpu --track test 2.4.0rc1 gpu-report.json", "a GPU stage's signed report"),
        (
            "wheelmill release record-gpu --track test 2.4.0rc1 gpu-reports/*/gpu-report.json",
            "every runner's reports at once",
        ),
    ),
    "release record-failure": (
        (
            "wheelmill release record-failure --tag v2.4.0-rc1 --cell cuda130-py311",
            "CI, after a failed build: its step, error and log's end into the rc's record",
        ),
        (
            "wheelmill release record-failure --nightly --version 2.4.1.dev20261202093015 --cell cpu-py311",
            "a nightly's failed cell",
        ),
    ),
    "coverage": (
        ("wheelmill coverage", "the test track's newest release: each recipe, variant and Python"),
        ("wheelmill coverage --track release 2.4.0 --recipe flash-attn", "one recipe of a final release"),
        ("wheelmill coverage --json", "the same as JSON, held to its schema (docs/coverage.md)"),
        ("wheelmill coverage --page", "the same as the index's coverage page, at <index>/coverage/"),
    ),
    "release list": (
        ("wheelmill release list", "every release recorded, newest first: cells, failures, GPU stages"),
        ("wheelmill release list --track test --json", "the release candidates, for a script"),
    ),
    "release show": (
        ("wheelmill release show --track test 2.4.0rc1", "a release's record: cells, files, GPU"),
        ("wheelmill release show --track release 2.4.0 --json", "a final release's record as JSON"),
    ),
    "release prune": (
        ("wheelmill release prune --track nightly --keep 14", "the 14 newest nightlies stay"),
        ("wheelmill release prune --track test --keep 5", "the 5 newest release candidates stay"),
    ),
    "doctor": (
        ("wheelmill doctor", "this Python's GPU wheels against the visible GPUs"),
        ("wheelmill doctor --capability 9.0 --path dist/", "a folder of wheels against an H100"),
    ),
    "test-gpu": (
        ("wheelmill test-gpu --cell cuda130-py311", "the local channel's wheels on this GPU"),
        ("wheelmill test-gpu --cell cuda130-py311 --track test --release 2.4.0rc1", "the files an rc names"),
    ),
    "key new": (
        ("wheelmill key new --out ~/.config/wheelmill/signing.pem", "a private key; its .pub beside it"),
        ("wheelmill key new --out keys/gpu.pem --type ecdsa-p256", "an ECDSA P-256 key, for a KMS without ed25519"),
    ),
    "key id": (
        ("wheelmill key id keys/team.pub", "the key id that statements signed with it name"),
        ("wheelmill key id ~/.config/wheelmill/signing.pem", "a private key's id (its .pub's is the same)"),
    ),
    "verify": (
        ("wheelmill verify dist/torchsort-0.1.10+cpu-cp311-cp311-manylinux_2_31_x86_64.whl", "one file"),
        ("wheelmill verify --channel cu130", "every file of a local channel"),
        ("wheelmill verify https://wheels.example.com/cu130/simple/", "a served channel, as installers read it"),
    ),
}


class _Formatter(argparse.HelpFormatter):
    """argparse's own, but the examples keep their lines."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith(HEADING):
            return "\n".join(indent + line for line in text.splitlines())
        return super()._fill_text(text, width, indent)


def epilog(command: str) -> str:
    """The examples' block of ``command`` (``index serve``): each line, then what it does."""
    lines = [HEADING]
    for line, does in EXAMPLES[command]:
        lines += [f"  {line}", f"      {does}"]
    return "\n".join(lines)


def add_examples(parser: argparse.ArgumentParser) -> None:
    """Every command below ``parser`` with a table entry gets its examples."""
    for words, _said, command in commands(parser):
        if words in EXAMPLES:
            command.epilog, command.formatter_class = epilog(words), _Formatter
