"""What the docs say of the code, kept true: the module map names every module of the
package and nothing else, the exit-code table is the error family's, the section on
slim channels names what the matrix and the noxfile make, and the ``wheelmill doctor``
example is what doctor prints. The README stays short, and every page of docs/ is in
mkdocs.yml's nav."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

import nox
import pytest
import yaml
from packaging.tags import parse_tag

from tests.conftest import CliRunner
from tests.elves import summary
from tests.wheels import install
from wheelmill import errors
from wheelmill.building.plan import ContainerSetup, Options, plan_cell
from wheelmill.building.steps import REGISTRY, CellStep
from wheelmill.building.steps.checks_after import baseline_of
from wheelmill.building.steps.keys import unpublished_reason
from wheelmill.checks import Verdict
from wheelmill.checks import gpu as gpu_checks
from wheelmill.checks.abi import judge_abi, judge_abi_group, judge_cuda_runtime
from wheelmill.checks.platform import judge_baseline
from wheelmill.cli import main
from wheelmill.inputs.archs import ArchRecord, arch_tag
from wheelmill.inputs.matrix import load_matrix
from wheelmill.inputs.recipes import AbiPromise, GitSource, SdistSource, load_recipes
from wheelmill.inputs.variants import Family
from wheelmill.machine.pins import load_pins
from wheelmill.planning.buildkey import build_keys
from wheelmill.planning.spec import StepKind
from wheelmill.settings import Settings
from wheelmill.wheel.abi import WheelAbi, classify

ROOT = Path(__file__).resolve().parent.parent.parent
DOCS = ROOT / "docs"


def section(page: str, start: str, end: str | None = None) -> str:
    """The text of docs/``page`` from ``start`` up to ``end`` (the page's end without one)."""
    text = (DOCS / page).read_text()
    return text[text.index(start) : text.index(end) if end is not None else len(text)]


def test_the_module_map_matches_the_tree() -> None:
    table = section("reference/modules.md", "<!-- modules:start", "<!-- modules:end")
    mapped = re.findall(r"^\| `([^`]+\.py)` \| \S.* \|$", table, flags=re.MULTILINE)
    package = ROOT / "src" / "wheelmill"
    tree = sorted(str(p.relative_to(package)) for p in package.rglob("*.py"))
    assert sorted(mapped) == tree
    assert len(mapped) == len(set(mapped)), "each module once"


def test_the_exit_code_table_is_the_error_family() -> None:
    table = section("reference/exit-codes.md", "# Exit codes")
    documented = {int(code) for code in re.findall(r"^\| (\d+) \|", table, flags=re.MULTILINE)}
    family = {
        cls.exit_code
        for cls in vars(errors).values()
        if isinstance(cls, type) and issubclass(cls, errors.WheelmillError) and cls is not errors.WheelmillError
    }
    assert documented == family


def test_the_troubleshooting_page_has_a_section_for_every_exit_code() -> None:
    """Keyed by exit code: each of the table's codes is a heading (``## 9: ...`` or a range,
    ``## 21 to 25: ...``), in order; and each log it names is a step's."""
    table = section("reference/exit-codes.md", "# Exit codes")
    documented = [int(code) for code in re.findall(r"^\| (\d+) \|", table, flags=re.MULTILINE)]
    page = section("troubleshooting.md", "# Troubleshooting")
    headed: list[int] = []
    for first, last in re.findall(r"^## (\d+)(?: to (\d+))?:", page, flags=re.MULTILINE):
        headed += range(int(first), int(last or first) + 1)
    assert headed == documented
    steps = {kind.value for kind in StepKind}
    named = re.findall(r"`logs/\*-(?:<recipe>-)?([a-z-]+)\.log`", page)
    assert named and set(named) <= steps, set(named) - steps


def test_the_slim_section_names_what_the_matrix_makes() -> None:
    text = section("matrix.md", "## Slim channels", "## Other torch releases")
    matrix = load_matrix(ROOT / "recipes" / "matrix.toml")
    slim, parent = matrix.variants["cuda130-sm90"], matrix.variants["cuda130"]
    assert f'slim = ["{slim.arch_list}"]' in text and f'arch-list = "{parent.arch_list}"' in text
    assert 'slim = ["gfx942"]' in text and matrix.variants["rocm64-gfx942"].slim_of == "rocm64"
    derived = re.findall(r"`([0-9]+\.[0-9]+[af]?|gfx[0-9a-f]+)`\s+→\s+`([a-z0-9]+)-([a-z0-9]+)`", text)
    assert len(derived) == 4
    for arch, variant, tag in derived:
        assert variant in matrix.variants and arch_tag(arch) == tag, (arch, variant, tag)
    assert f"TORCH_CUDA_ARCH_LIST={slim.arch_list}, into channel {slim.channel}" in text
    assert f"| channel | `{parent.channel}` | `{slim.channel}` " in text
    assert f"`0.1.10+{parent.wheel_label}` | `0.1.10+{slim.wheel_label}`" in text
    assert f"`{slim.torch_requirement}`, from the `{slim.label}` torch index" in text
    (url,) = re.findall(r"--index-url (\S+/simple/)", text)
    assert url.endswith(f"/{slim.channel}/simple/")


def test_the_slim_sections_commands_do_what_it_says(capsys: pytest.CaptureFixture[str]) -> None:
    text = section("matrix.md", "## Slim channels", "## Other torch releases")
    recipes = str(ROOT / "recipes")
    assert (
        main(["--recipes", recipes, "index", "config", "--channel", "cu130-sm90", "--url", "https://wheels.internal"])
        == 0
    )
    (url,) = re.findall(r"--index-url (\S+/simple/)", text)
    assert f"index-url = {url}\n" in capsys.readouterr().out
    assert main(["--recipes", recipes, "matrix"]) == 0
    table = capsys.readouterr().out
    assert re.search(r"\n cuda130-sm90 +13\.0\.2 +2\.14\.1\+cu130 +9\.0 ", table)  # its one arch
    assert re.search(r"\n cuda130-sm90 +cu130-sm90 ", table)  # its own channel
    assert main(["--recipes", recipes, "plan", "--cell", "cuda130-sm90-py311", "--engine", "none"]) == 0
    assert "TORCH_CUDA_ARCH_LIST=9.0;" in capsys.readouterr().out and "wheelmill plan --cell cuda130-sm90-py311" in text


def test_the_other_torch_section_names_what_the_matrix_makes(capsys: pytest.CaptureFixture[str]) -> None:
    text = section("matrix.md", "## Other torch releases")
    matrix = load_matrix(ROOT / "recipes" / "matrix.toml")
    parent, other = matrix.variants["cuda130"], matrix.variants["cuda130-torch2.12"]
    assert f'torch = "{parent.torch}"' in text and f'other-torch = ["{other.torch}"]' in text
    assert "`cuda130-sm90-torch2.12`" in text and "cuda130-sm90-torch2.12" in matrix.variants
    assert f"against torch=={other.torch}, into channel {other.channel}" in text
    assert f"| torch | `{parent.torch_requirement}` | `{other.torch_requirement}` |" in text
    assert f"| channel | `{parent.channel}` | `{other.channel}` " in text
    assert f"`0.1.10+{parent.wheel_label}` | `0.1.10+{other.wheel_label}` |" in text
    lock = matrix.cell("cuda130-torch2.12-py311").lock_id
    assert f"`locks/{matrix.cell('cuda130-py311').lock_id}.txt` | its own, `locks/{lock}.txt` |" in text
    (url,) = re.findall(r"--index-url (\S+/simple/)", text)
    assert url.endswith(f"/{other.channel}/simple/")
    recipes = str(ROOT / "recipes")
    assert main(["--recipes", recipes, "plan", "--cell", "cuda130-torch2.12-py311", "--engine", "none"]) == 0
    plan = capsys.readouterr().out
    assert "torch==2.12.0 locatable" in plan and f"channel {other.channel}" in plan
    assert main(["--recipes", recipes, "matrix", "--json", "--no-slim"]) == 0
    assert '"cell":"cuda130-torch2.12-py311"' in capsys.readouterr().out, "a pull request may build it"


def test_the_noxfile_makes_a_session_for_every_cell_slim_ones_included() -> None:
    spec = importlib.util.spec_from_file_location("noxfile_under_test", ROOT / "noxfile.py")
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    sessions = set(nox.registry.get())
    cells = load_matrix(ROOT / "recipes" / "matrix.toml").cells
    assert {f"build-{c.id}" for c in cells} <= sessions
    named = re.findall(r"nox -s (build-[a-z0-9.-]*[a-z0-9])", section("matrix.md", "## Slim channels"))
    assert named == ["build-cuda130-sm90-py311", "build-cuda130-py311", "build-cuda130-torch2.12-py311"]
    assert set(named) <= sessions


def test_the_recipe_table_says_what_the_recipes_do() -> None:
    """Each row of "The recipes teams build": the recipe exists, is opt-in, its source kind
    and the variants whose cells it applies to are what the row says."""
    recipes = load_recipes(ROOT / "recipes")
    matrix = load_matrix(ROOT / "recipes" / "matrix.toml")
    table = section("recipes.md", "## The recipes teams build", "Git sources name their upstream")
    rows = re.findall(r"^\| ([a-z-]+) \| ([^|]+) \| ([^|]+) \| ", table, flags=re.MULTILINE)
    named = {name for name, _, _ in rows if name != "recipe"}
    assert named == {name for name, recipe in recipes.items() if recipe.opt_in}
    for name, source, cells in rows:
        if name == "recipe":
            continue
        recipe = recipes[name]
        kind = {GitSource: "git", SdistSource: "sdist"}[type(recipe.source)]
        assert source.startswith(kind), (name, source)
        variants = {
            cell.variant.name
            for cell in matrix.cells
            if recipe.applies_to(cell) and cell.variant.base_name == cell.variant.name
        }
        assert variants == {v.strip() for v in cells.split(",")}, name
    assert "`USE_SYSTEM_UCC=1` does nothing without `USE_UCC=1`" in table


def test_the_doctor_example_is_what_doctor_prints(
    cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cu130 channel's wheels, installed: what the docs show, run."""
    monkeypatch.delenv("WHEELMILL_GPU_CAPABILITY", raising=False)
    site = tmp_path / "site"
    cell = "cuda130-py311"
    install(
        site,
        "example-cuda-ops",
        "0.1.0+cu130",
        gpu_archs=ArchRecord(family=Family.CUDA, arch_list="7.5;8.0;8.6;9.0;10.0;12.0+PTX", cell=cell).to_bytes(),
    )
    install(
        site,
        "example-cpp-ops",
        "0.1.0+cu130",
        gpu_archs=ArchRecord(family=Family.CPU, arch_list=None, cell=cell).to_bytes(),
    )
    install(
        site,
        "torchsort",
        "0.1.10+cu130",
        gpu_archs=ArchRecord(family=Family.CUDA, arch_list="8.0;9.0", cell=cell).to_bytes(),
    )
    install(site, "torch", "2.14.1+cu130")
    install(site, "filelock", "3.20.0")
    example = section("design/gpu-archs.md", "<!-- doctor:start", "<!-- doctor:end")
    (command, *shown) = example.split("```")[1].strip().splitlines()
    assert command == "$ wheelmill doctor --capability 12.0"
    result = cli("doctor", "--path", str(site), "--capability", "12.0")
    assert result.code == 21
    assert shown == (result.out + result.err).splitlines()


def test_the_build_key_section_names_every_part_of_the_key_and_the_steps_it_spares(cli: CliRunner) -> None:
    text = section("design/reproducibility.md", "## Nothing built twice")
    parts = re.findall(r"^\| `([a-z]+)` \| \S.* \|$", text, flags=re.MULTILINE)
    matrix = load_matrix(ROOT / "recipes" / "matrix.toml")
    plan = plan_cell(matrix, load_recipes(ROOT / "recipes"), matrix.cell("cpu-py311"), [], Settings())
    assert sorted(parts) == sorted(build_keys(plan, {})["example-cpp-ops"].inputs)
    # The steps it names, in its words: the image, the container, the toolchain and env checks,
    # the env, the compiler cache, the closure, mirror and channel checks.
    spared = {str(d.kind) for d in REGISTRY if isinstance(d, CellStep) and d.for_builds}
    kinds = (
        "prepare-image",
        "prepare-container",
        "toolchain-checks",
        "env-checks",
        "prepare-env",
        "compiler-cache",
        "closure",
        "mirror",
        "channel-checks",
    )
    assert spared == set(kinds)
    words = (
        "the image, the container, the toolchain and env checks, the env, the compiler cache, "
        "and the closure, mirror and channel checks"
    )
    assert words in " ".join(text.split())
    assert "nox -s build-cpu-py311 -- --rebuild" in text
    assert (
        "--rebuild: built even where channel cpu lists it"
        in cli("plan", "--cell", "cpu-py311", "--engine", "none", "--rebuild").out
    )
    assert "nox -s build-cpu-py311 -- --rebuild torchsort" in text
    one = cli("plan", "--cell", "cpu-py311", "--engine", "none", "--rebuild", "torchsort")
    assert "--rebuild torchsort: built even where channel cpu lists it, the rest looked up there" in one.out
    unknown = cli(
        "plan", "--cell", "cpu-py311", "--engine", "none", "--recipe", "example-cpp-ops", "--rebuild", "torchsort"
    )
    assert unknown.code == 4 and "not a recipe of this build" in unknown.err and "exit 4" in text


def test_every_setting_wheelmill_reads_is_in_the_settings_page() -> None:
    read = set(re.findall(r'"(WHEELMILL_[A-Z_]+)"', (ROOT / "src" / "wheelmill" / "settings.py").read_text()))
    assert "WHEELMILL_CONDA_CHANNELS" in read
    missing = sorted(name for name in read if name not in (DOCS / "reference" / "settings.md").read_text())
    assert not missing, f"docs/reference/settings.md does not say what these do: {missing}"


def test_the_readme_is_short_and_keeps_its_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150, "the README stays short: reference and notes go to docs/"
    assert "scripts/setup && .venv/bin/nox -s build-cpu-py311" in readme
    assert "scripts/setup --system && .venv/bin/nox -s lint tests" in readme


def _nav_pages(entry: object) -> list[str]:
    """Every page a nav entry names: a path, a {title: path}, or a {title: [entries]}."""
    if isinstance(entry, str):
        return [entry]
    if isinstance(entry, list):
        return [page for item in entry for page in _nav_pages(item)]
    assert isinstance(entry, dict), entry
    return [page for value in entry.values() for page in _nav_pages(value)]


def test_every_docs_page_is_in_the_nav_and_every_nav_entry_exists() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["docs_dir"] == "docs"
    nav = _nav_pages(config["nav"])
    assert len(nav) == len(set(nav)), "each page once"
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert sorted(set(nav) - pages) == [], "nav entries without a page"
    assert sorted(pages - set(nav)) == [], "pages missing from the nav"
    assert "design/layers.md" in nav


def test_the_plans_choices_line_is_the_golden_plans() -> None:
    """docs/reference/settings.md shows the line `wheelmill plan` prints for the CPU cell."""
    shown = section("reference/settings.md", "prints them on its third line").split("```")[1].strip()
    golden = (ROOT / "tests" / "golden" / "plan-cpu-py311.txt").read_text().splitlines()
    assert shown == golden[2] and shown.startswith("choices: ")


def test_the_abi_pages_error_line_is_the_checks_own() -> None:
    text = section("design/abi.md", "# ABI")
    (line,) = [row.strip() for row in text.splitlines() if row.strip().startswith("wheelmill: error: example-cpp")]
    name = "example_cpp_ops/_C.cpython-311-x86_64-linux-gnu.so"
    symbols = frozenset({"_ZNK2at10TensorBase21__dispatch_contiguousEN3c1012MemoryFormatE"})
    library = summary(Path("/x") / name, undefined=symbols)
    abi = WheelAbi(libraries=(classify(library, name),))
    tags = frozenset(parse_tag("cp311-cp311-manylinux_2_28_x86_64"))
    result = judge_abi(abi, tags, AbiPromise.STABLE, recipe_file="recipes/example-cpp-ops.toml")
    assert line.startswith(
        f"wheelmill: error: example-cpp-ops/post-repair-checks: example-cpp-ops: abi: {result.detail}"
    )
    assert line.endswith(f"fix: abi: {result.fix}")
    assert 'abi = "stable"' in text and "`_abi`" in text and "`data-abi`" in text


def test_the_matrix_pages_glibc_lines_are_the_checks_own() -> None:
    """The failure and the pass docs/matrix.md shows are what the glibc-baseline check says of
    a cpu-py311 wheel built on its bootstrapped base."""
    text = section("matrix.md", "## The glibc a cell's wheels promise", "## Slim channels")
    matrix = load_matrix(ROOT / "recipes" / "matrix.toml")
    pins = load_pins(ROOT / "containers" / "pins.toml")
    setup = ContainerSetup(pins=pins, directory=ROOT / "containers", base_policy="bootstrap")
    plan = plan_cell(matrix, {}, matrix.cell("cpu-py311"), [], Settings(), Options(engine="podman", containers=setup))
    baseline = baseline_of(plan)
    needy = summary(Path("/x/thing/_C.so"), version_needs=(("libc.so.6", "GLIBC_2.34"),))
    failed = judge_baseline(frozenset({"manylinux_2_34_x86_64"}), [needy], baseline)
    (line,) = [row.strip() for row in text.splitlines() if row.strip().startswith("wheelmill: error:")]
    assert line.startswith(f"wheelmill: error: thing/post-repair-checks: thing: glibc-baseline: {failed.detail} (")
    assert line.endswith(f"; fix: glibc-baseline: {failed.fix}")
    passed = judge_baseline(frozenset({"manylinux_2_28_x86_64"}), [], baseline)
    assert passed.verdict is Verdict.PASS and f"({passed.detail})" in " ".join(text.split()).replace("`", "")


def test_the_abi_pages_cuda_major_example_is_the_checks_own() -> None:
    text = section("design/abi.md", "- **The CUDA major.**", "## The stable example")
    library = summary(Path("/x/ops/_C.abi3.so"), needed=("libcudart.so.13",))
    result = judge_cuda_runtime([library], Path("/x"), "12.8")
    assert f"`{result.detail}`" in " ".join(text.split())


def test_the_abi_pages_group_build_line_is_what_the_plan_prints(cli: CliRunner) -> None:
    """The `group build:` line docs/design/abi.md shows, for the command it names, and the order
    of that run: the cell of the oldest torch first, whichever the command lists first."""
    text = section("design/abi.md", "## One build for a group")
    (shown,) = [row for row in text.splitlines() if row.startswith("group build: ")]
    command = re.search(r"for `(--cell [^`]+)`, the line of `([^`]+)`", " ".join(text.split()))
    assert command is not None
    result = cli("--recipes", str(ROOT / "recipes"), "plan", *command.group(1).split(), "--engine", "none")
    assert result.code == 0, result.err
    plans = result.out.split("plan for ")[1:]
    assert [p.split(":")[0] for p in plans] == ["cuda130-sm90-torch2.12-py311", command.group(2)]
    assert " ".join(shown.split()) in " ".join(plans[1].split()), "the line, as the terminal wraps it"


def test_the_abi_pages_abi_group_error_line_is_the_checks_own() -> None:
    """A library calling a shim torch 2.13 added, taken by a cell of torch 2.12: the line the
    page shows is the `abi-group` check's."""
    text = section("design/abi.md", "## One build for a group")
    (line,) = [row.strip() for row in text.splitlines() if row.strip().startswith("wheelmill: error:")]
    name = "example_stable_ops/_C.abi3.so"
    library = summary(Path("/x") / name, undefined=("aoti_torch_cpu_grid_sampler_3d", "PyModule_Create2"))
    abi = WheelAbi(libraries=(classify(library, name),))
    tags = frozenset(parse_tag("cp310-abi3-manylinux_2_28_x86_64"))
    result = judge_abi_group(tags, ["torch>=2.10"], abi, python="3.11", torch="2.12.0")
    prefix = "wheelmill: error: example-stable-ops/post-repair-checks: example-stable-ops: abi-group:"
    assert line.startswith(f"{prefix} {result.detail} (wheel kept in ...); fix: abi-group: {result.fix}")
    assert line.endswith(f"fix: abi-group: {result.fix}")


def test_the_group_sections_skip_line_is_the_build_keys_steps_own() -> None:
    """What a cell of a newer torch says where no channel has the one build, as the page quotes it."""
    text = " ".join(section("design/abi.md", "- **No cell of the oldest torch.**", "- **No `TORCH").split())
    matrix = load_matrix(ROOT / "recipes" / "matrix.toml")
    recipes = load_recipes(ROOT / "recipes")
    cell_plan = plan_cell(matrix, recipes, matrix.cell("cuda130-py311"), ["example-stable-ops"], Settings())
    said = unpublished_reason(cell_plan.recipe("example-stable-ops"), cell_plan)
    shown = said.split("): ")[0] + "): ..."
    assert f"saying `{shown}`" in text
    assert "`facts.unpublished`" in text


def test_the_group_section_says_no_recipe_must_set_torch_target_version() -> None:
    """wheelmill sets no TORCH_TARGET_VERSION and builds against the oldest torch; the
    example sets it to 2.10, below cuda130's oldest torch, as the page says."""
    text = " ".join(section("design/abi.md", "## One build for a group").split())
    assert "wheelmill neither sets `TORCH_TARGET_VERSION` nor requires a recipe to" in text
    assert "the example targets 2.10, below cuda130's 2.12" in text
    matrix = load_matrix(ROOT / "recipes" / "matrix.toml")
    recipes = load_recipes(ROOT / "recipes")
    cell_plan = plan_cell(matrix, recipes, matrix.cell("cuda130-py311"), ["example-stable-ops"], Settings())
    spec = cell_plan.recipe("example-stable-ops")
    assert spec.group_build is not None and spec.group_build.torch == "2.12.0" == min(
        matrix.variants["cuda130"].other_torch
    )
    assert not any("TORCH_TARGET_VERSION" in key or "TORCH_TARGET_VERSION" in value for key, value in spec.env.items())
    assert "TORCH_TARGET_VERSION" not in spec.build_variables()
    setup = (ROOT / "extensions" / "stable-ops" / "setup.py").read_text()
    assert 'TORCH_TARGET = "0x020A000000000000"  # torch 2.10' in setup


def test_the_gpu_stages_judging_table_is_the_codes() -> None:
    """docs/gpu-stage.md's table of outcomes and ``wheelmill.checks.gpu``'s, which its unit
    tests take a row a case, say the same rows."""

    def row(doctor: str, what: str, outcome: str) -> tuple[str, str, str]:
        return doctor.strip(), what.strip().replace("`", ""), re.split(r"[ ,:(]", outcome.strip())[0].strip("`")

    text = section("gpu-stage.md", "<!-- judging:start", "<!-- judging:end")
    documented = {row(*cells.split(" | ")) for cells in re.findall(r"^\s*\| (.+) \|$", text, flags=re.MULTILINE)[1:]}
    table = gpu_checks.__doc__.split("outcome\n", 1)[1].split("\n\n", 1)[0]
    coded = {row(*re.split(r"\s{2,}", line.strip())) for line in table.splitlines() if re.match(r"^ {4}\S", line)}
    assert documented == coded
    assert len(coded) == 13


def test_every_picture_is_shown_and_every_shown_picture_is_drawn_from_a_source() -> None:
    """docs/pictures/NAME.svg, drawn from NAME.dot (scripts/pictures; the lint session fails a
    stale one), each shown on some page, and no page shows a picture that is not there."""
    pictures = DOCS / "pictures"
    drawn = {svg.name for svg in pictures.glob("*.svg")}
    assert drawn and drawn == {dot.with_suffix(".svg").name for dot in pictures.glob("*.dot")}
    shown: set[str] = set()
    for page in DOCS.rglob("*.md"):
        for target in re.findall(r"!\[[^\]]+\]\(([^)]+)\)", page.read_text()):
            assert (page.parent / target).resolve().is_file(), f"{page}: {target} is not there"
            shown.add(Path(target).name)
    assert drawn <= shown, f"pictures no page shows: {sorted(drawn - shown)}"


# --- the site: code that fits the page, and a button that copies it -------------------------

CODE_WIDTH = 80  # the columns a code block of the site shows without scrolling
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
OUTPUT = "<!-- output -->"  # on the line right above a fence: the block is a program's output


@dataclass(frozen=True)
class CodeBlock:
    start: int  # the line number of its opening fence
    output: bool  # right under OUTPUT
    lines: tuple[str, ...]  # its text, the fence's indent taken off


def code_blocks(text: str) -> list[CodeBlock]:
    """The fenced code blocks of the Markdown ``text``, a fence inside a longer one as text."""
    blocks: list[CodeBlock] = []
    lines = text.splitlines()
    opened: re.Match[str] | None = None
    start = 0
    body: list[str] = []
    for number, line in enumerate(lines, start=1):
        fence = FENCE.match(line)
        if opened is None:
            if fence is not None:
                opened, start, body = fence, number, []
            continue
        if fence is not None and fence["fence"].startswith(opened["fence"]) and not fence["info"].strip():
            output = start > 1 and lines[start - 2].strip() == OUTPUT
            blocks.append(CodeBlock(start=start, output=output, lines=tuple(body)))
            opened = None
            continue
        indent = opened["indent"]
        body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
    assert opened is None, f"the code block of line {start} is never closed"
    return blocks


def long_code_lines(text: str) -> list[tuple[int, int]]:
    """The line number and width of each line of a fenced code block of the Markdown ``text``
    wider than CODE_WIDTH. A block whose opening fence is right under the line
    ``<!-- output -->`` is exempt: what a program prints, shown as it prints it (a test
    compares most of them with the program's output)."""
    return [
        (block.start + offset, len(line))
        for block in code_blocks(text)
        if not block.output
        for offset, line in enumerate(block.lines, start=1)
        if len(line) > CODE_WIDTH
    ]


def test_every_line_of_every_code_block_fits_80_columns() -> None:
    """Commands are broken with ``\\`` and their comments put on a line above; a program's
    output is shown as printed, under ``<!-- output -->`` (and nothing else is under one)."""
    wide = []
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text()
        wide += [f"{page.relative_to(DOCS)}:{n}: {width} columns" for n, width in long_code_lines(text)]
        lines = text.splitlines()
        marked = [n for n, line in enumerate(lines) if line.strip() == OUTPUT]
        assert all(FENCE.match(lines[n + 1]) for n in marked), f"{page}: {OUTPUT} not right above a code block"
    assert not wide, f"code lines wider than {CODE_WIDTH} columns: {wide}"


def test_the_width_rule_finds_a_long_line_and_spares_only_marked_output() -> None:
    long = "x" * (CODE_WIDTH + 1)
    text = "\n".join(
        [
            "```",  # 1
            "x" * CODE_WIDTH,
            "```",
            "- an item:",
            "",
            "    ```sh",  # 6: indented in a list, the indent is not the line's
            f"    {'y' * CODE_WIDTH}",
            f"    {long}",  # 8
            "    ```",
            OUTPUT,
            "~~~~",
            long,  # 12: output, shown as printed
            "~~~~",
            "````",
            "```",
            long,  # 16: a fence inside a longer one is the block's text
            "````",
        ]
    )
    assert long_code_lines(text) == [(8, CODE_WIDTH + 1), (16, CODE_WIDTH + 1)]
    assert long_code_lines(text.replace(OUTPUT, "<!-- other -->")) == [(8, 81), (12, 81), (16, 81)]


def test_every_code_block_of_every_page_is_fenced() -> None:
    """Markdown's other code block, indented four spaces, escapes the width rule: each
    ``<pre>`` of a page, rendered with the site's extensions, is one of its fenced blocks."""
    import markdown  # type: ignore[import-untyped]  # noqa: PLC0415 - mkdocs' own, only here

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    named = [next(iter(e)) if isinstance(e, dict) else e for e in config["markdown_extensions"]]
    options = {name: value for e in config["markdown_extensions"] if isinstance(e, dict) for name, value in e.items()}
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text()
        rendered = markdown.markdown(text, extensions=named, extension_configs=options)
        assert rendered.count("<pre") == len(code_blocks(text)), f"{page.relative_to(DOCS)}: a code block not fenced"


def test_every_code_block_of_the_site_has_a_copy_button() -> None:
    """Material's own button (its bundled script, nothing fetched from elsewhere)."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert "content.code.copy" in config["theme"]["features"]
    assert config["theme"]["font"] is False, "no web fonts fetched"
