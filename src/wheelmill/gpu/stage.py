"""The GPU stage, run: on a GPU machine that has no compiler, no container engine and no
source tree, the cell's wheels from its channel are installed as a user would, ``wheelmill
doctor`` judges them against the visible GPUs, and each recipe's GPU check runs; the
report says, per wheel, doctor's prediction and what the kernels did.

    find the GPUs          nvidia-smi / rocminfo (doctor's own query); none: stop, exit 22
    verify the wheels      where the team's keys are configured, each wheel under test held to
                           its signed provenance before anything is installed; a failure: stop,
                           its line on stderr, the first one's exit code (26: another key)
    make the env           a venv with the cell's torch from the channel alone, or one over a
                           given interpreter that has the torch (its packages taken as given,
                           but for the projects under test: their channel files go first)
    check torch            the cell's torch, and the GPUs it sees (none: no kernel runs)
    install the wheels     each recipe's wheel of the channel, its requirements from there too;
                           then each is checked to be what the env imports (its RECORD's files)
    doctor                 each wheel's arch record against the GPUs
    per wheel              its import probe, then its GPU check (``[checks] gpu-smoke``)
    judge                  ``wheelmill.checks.gpu.judge_wheel``; the report, the table

The env is removed afterwards, whatever happened; the report and the log stay.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from wheelmill.checks import Verdict
from wheelmill.checks.gpu import (
    GpuOutcome,
    Ran,
    judge_check,
    judge_wheel,
    no_kernel_image,
    not_the_channels_file,
    worst,
)
from wheelmill.checks.tally import tally
from wheelmill.checks.torchenv import judge_located
from wheelmill.errors import (
    CommandFailed,
    EnvError,
    FetchError,
    GpuCheckError,
    GpuUnproven,
    GpuVerdictMismatch,
    IntegrityError,
    NoGpuError,
    PrecheckError,
    WheelmillError,
)
from wheelmill.gpu.report import CheckRun, GpuReport, WheelResult
from wheelmill.images import doctor
from wheelmill.machine.envs import uv_environment
from wheelmill.machine.net import download, sha256_of
from wheelmill.machine.package_sources import PackageSources
from wheelmill.machine.probes import IMPORTS, parse
from wheelmill.machine.process import HostRunner, StepLog, base_environment
from wheelmill.machine.tools import uv_bin
from wheelmill.planning.gpu_stage import GpuStagePlan, WheelUnderTest
from wheelmill.provenance.signing import TrustedKey
from wheelmill.releases.attested import Source
from wheelmill.releases.preinstall import Checked, verify_before_install

# What a GPU check needs of the caller's environment besides base_environment's: which GPUs.
GPU_VARIABLES = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "LD_LIBRARY_PATH")
# What the env's torch says of itself and the GPUs it sees: one JSON line.
TORCH_PROBE = r"""
import json, torch
cuda = torch.cuda.is_available()
devices = []
for i in range(torch.cuda.device_count() if cuda else 0):
    major, minor = torch.cuda.get_device_capability(i)
    devices.append("GPU %d (%s, %d.%d)" % (i, torch.cuda.get_device_name(i), major, minor))
print(json.dumps({"version": torch.__version__, "devices": devices}))
"""
# The distributions an interpreter has: taken as given in an env over it, never installed again
# (but for the projects under test, whose channel files are installed before its own).
LISTING = (
    "import importlib.metadata as m, json; "
    "print(json.dumps(sorted({d.metadata['Name'] for d in m.distributions() if d.metadata['Name']})))"
)
# Where the env finds each named distribution (its directory on the path), as JSON.
LOCATING = (
    "import importlib.metadata as m, json, sys\n"
    "found = {}\n"
    "for name in sys.argv[1:]:\n"
    "    try:\n"
    "        found[name] = str(m.distribution(name).locate_file(''))\n"
    "    except m.PackageNotFoundError:\n"
    "        found[name] = None\n"
    "print(json.dumps(found))\n"
)


@dataclass(frozen=True, kw_only=True)
class StageInputs:
    plan: GpuStagePlan
    index: str  # the index root (a directory) or a served index's base URL
    channel_url: str  # the channel's simple pages, as uv reads them
    recipes_dir: Path
    sources: Mapping[str, str | None]  # each recipe's path source, where it has one
    python: Path | None  # an interpreter that has the cell's torch; None: a fresh env
    fresh_python: Path | None  # the cell's Python for a fresh env
    capability: str | None  # declared GPUs (doctor's --capability), where nvidia-smi gives none
    test_requires: tuple[str, ...]  # what the GPU checks run with (pytest); not under test
    test_sources: PackageSources | None  # where they come from: the channel, then this machine's sources
    runner: str | None  # the CI runner label (the GPU kind) this runs on, where told
    work: Path  # the stage's scratch directory (removed after)
    provenance: Source  # the channel's pages, files and provenance, read as a verifier reads them
    trusted: tuple[TrustedKey, ...] = ()  # the team's keys; none: the wheels are not verified
    required: bool = False  # WHEELMILL_SIGNATURES=required: with no key, nothing is installed


@dataclass(frozen=True, kw_only=True)
class _Env:
    """Where the wheels are installed and run: a fresh venv, or a directory of their own on
    the path of a given interpreter (which is never changed)."""

    python: Path
    path: tuple[Path, ...]  # PATH's first directories: the env's scripts
    site: Path  # where the wheels under test are installed
    pythonpath: Path | None  # the directory put before the given interpreter's own
    described: str


class GpuStage:
    """One run of the stage; ``say`` prints a line of progress."""

    def __init__(
        self,
        inputs: StageInputs,
        *,
        log: StepLog,
        say: Callable[[str], None],
        complain: Callable[[str], None] | None = None,
    ) -> None:
        """``complain``: where each provenance failure's line goes (default ``say``)."""
        self.inputs = inputs
        self.log = log
        self.say = say
        self.complain = complain or say
        self.runner = HostRunner()
        self.started = time.monotonic()
        self.failure: WheelmillError | None = None  # what stopped the stage before it judged the wheels
        self.checked: Checked | None = None  # what was held to its provenance, once it was
        self.refused = False  # a wheel did not verify: each failure was complained of, nothing installed

    def run(self) -> GpuReport:
        """The stage's report, whatever happened: where an error stopped it (an env that
        cannot be made, another torch), the report says so and ``failure`` holds the error."""
        gpus = self._gpus()
        if not gpus.found:
            why = "; ".join(gpus.notes) or "none found"
            return self._report(
                gpus, None, (), status=GpuOutcome.NO_GPU, error=f"no GPU visible ({why})", code=NoGpuError.exit_code
            )
        checked = self._verify()
        if checked.code:
            self.refused = True
            first = checked.failures[0].line
            return self._report(gpus, None, (), status=GpuOutcome.STOPPED, error=first, code=checked.code)
        shutil.rmtree(self.inputs.work, ignore_errors=True)
        self.inputs.work.mkdir(parents=True)
        try:
            return self._on(gpus)
        except WheelmillError as exc:
            self.failure = exc
            return self._report(gpus, None, (), status=GpuOutcome.STOPPED, error=exc.one_line(), code=exc.exit_code)
        finally:
            shutil.rmtree(self.inputs.work, ignore_errors=True)

    def _on(self, gpus: doctor.Gpus) -> GpuReport:
        labels = ", ".join(g.label for g in gpus.found)
        self.say(f"GPUs: {labels}")
        env = self._env()
        torch = self._torch(env)
        self.say(f"env: {env.described}; torch {torch['version']} sees {len(torch['devices'])} GPU(s)")
        files = self._fetch()
        self._install(env, files)
        installed = self._installed(env, files)
        verdicts = self._doctor(env, gpus)
        results = [
            self._wheel(env, wheel, verdicts, installed=installed[wheel.recipe], sees_gpu=bool(torch["devices"]))
            for wheel in self.inputs.plan.wheels
        ]
        # Where torch sees no GPU nothing was proven, whatever the wheels' own outcomes.
        status = worst([*(r.outcome for r in results), *([] if torch["devices"] else [GpuOutcome.NOT_RUN])])
        code, error = _ending(status, results, gpus=labels, torch=torch)
        return self._report(gpus, torch, results, status=status, error=error, code=code, env=env)

    def _verify(self) -> Checked:
        """The wheels under test held to their provenance before anything is installed, where
        the team's keys are configured; one line says what was verified, or that nothing was."""
        self.checked = verify_before_install(
            self.inputs.provenance,
            [wheel.filename for wheel in self.inputs.plan.wheels],
            trusted=self.inputs.trusted,
            required=self.inputs.required,
            on_failure=self.complain,
        )
        self.say(self.checked.line())
        return self.checked

    def _gpus(self) -> doctor.Gpus:
        """The GPUs, as doctor finds them (a declared capability stands in where the tool
        cannot say one); the query's notes where it found none."""
        if self.inputs.capability:
            try:
                return doctor.declared(self.inputs.capability, "--capability")
            except doctor.Problem as exc:
                raise PrecheckError(f"test-gpu: {exc.message}", fix=exc.fix) from None
        return doctor.visible()

    def _env(self) -> _Env:
        given = self.inputs.python
        if given is not None:
            site = self.inputs.work / "site"
            return _Env(
                python=given,
                path=(site / "bin", given.parent),
                site=site,
                pythonpath=site,
                described=f"over {given} (its packages as given, the wheels on its path)",
            )
        base = self.inputs.fresh_python
        assert base is not None, "the command finds the cell's Python where none is given"
        root = self.inputs.work / "env"
        self._uv(
            [uv_bin(), "venv", "--no-config", "--quiet", "--python", str(base), str(root)],
            what=f"make an env of {base}",
        )
        env = _Env(
            python=root / "bin" / "python",
            path=(root / "bin",),
            site=next(root.glob("lib/python*/site-packages")),
            pythonpath=None,
            described=f"fresh, {base}, from the channel alone",
        )
        torch = self.inputs.plan.cell.variant.torch_requirement
        self.say(f"installing {torch} from {self.inputs.channel_url} alone")
        self._uv(self._install_argv(env, [torch]), what=f"install {torch} from the channel")
        return env

    def _torch(self, env: _Env) -> dict[str, Any]:
        """The env's torch, which must be the cell's; the GPUs it sees."""
        torch: dict[str, Any] = self._result(
            self._python(env, ["-c", TORCH_PROBE], what="import torch"), probe="torch's probe"
        )
        judged = judge_located(str(torch["version"]), self.inputs.plan.cell.variant)
        if judged.verdict is not Verdict.PASS:
            variant = self.inputs.plan.cell.variant
            raise PrecheckError(
                f"test-gpu: the env's torch is {torch['version']}, not the cell's {variant.torch}+{variant.label}",
                fix="give --python an interpreter with the cell's torch, or leave --python out: the env is made "
                "from the channel",
            )
        return torch

    def _fetch(self) -> list[Path]:
        """Each wheel under test as a file here: the index root's own file, or downloaded
        and checked against its listing's sha256."""
        files = []
        for wheel in self.inputs.plan.wheels:
            if wheel.url.startswith("file:"):
                local = Path(urllib.parse.unquote(urllib.parse.urlsplit(wheel.url).path))
                if wheel.sha256 is not None and sha256_of(local) != wheel.sha256:
                    raise IntegrityError(
                        f"test-gpu: {local}: its bytes are not the ones its listing names",
                        fix="run `wheelmill index verify`; restore the channel from the index's storage",
                    )
                files.append(local)
                continue
            if wheel.sha256 is None:
                raise FetchError(
                    f"test-gpu: {wheel.url}: listed without a sha256",
                    fix="serve the channel's pages as wheelmill writes them",
                )
            files.append(download(wheel.url, self.inputs.work / "wheels" / wheel.filename, sha256=wheel.sha256))
        return files

    def _install(self, env: _Env, files: Sequence[Path]) -> None:
        """The wheels, and what they require, from the channel alone; then what the GPU checks
        run with (pytest), which is not under test: from the channel or this machine's package
        sources, nothing installed before changing. Over a given interpreter, what it has is
        taken as given (its torch above all), never installed again."""
        if not files:
            return
        given: list[str] = []
        if env.pythonpath is not None:
            names = json.loads(self._python(env, ["-c", LISTING], what="list the interpreter's packages", alone=True))
            # Its own copy of a project under test (an older build, in a runtime image) is no
            # stand-in for the channel's file: that one is installed, first on the path.
            tested = {canonicalize_name(wheel.recipe) for wheel in self.inputs.plan.wheels}
            excludes = self.inputs.work / "given.txt"
            kept = [name for name in names if canonicalize_name(name) not in tested]
            excludes.write_text("".join(f"{name}\n" for name in kept), encoding="utf-8")
            given = ["--target", str(env.pythonpath), "--excludes", str(excludes)]
        self.say(f"installing {len(files)} wheel(s) of channel {self.inputs.plan.channel}")
        self._uv([*self._install_argv(env, [str(f) for f in files]), *given], what="install the channel's wheels")
        sources = self.inputs.test_sources
        if not self.inputs.test_requires or sources is None:
            return
        installed = self.inputs.work / "installed.txt"
        freeze = [uv_bin(), "pip", "freeze", "--no-config", "--python", str(env.python)]
        freeze += ["--path", str(env.pythonpath)] if env.pythonpath is not None else []
        pins = [line for line in self._uv(freeze, what="list the env").splitlines() if "==" in line]  # not uv's notes
        installed.write_text("".join(f"{pin}\n" for pin in pins), encoding="utf-8")
        argv = [uv_bin(), "pip", "install", "--no-config", "--python", str(env.python), *sources.uv_args()]
        argv += ["--constraint", str(installed), *given, *self.inputs.test_requires]
        self.say(f"installing the GPU checks' {', '.join(self.inputs.test_requires)} ({sources.describe()})")
        self._uv(argv, what=f"install the GPU checks' {', '.join(self.inputs.test_requires)}")

    def _installed(self, env: _Env, files: Sequence[Path]) -> dict[str, str | None]:
        """Each wheel under test, and why the env does not import the channel's file where it
        does not (None where it does): the env must find the project in the wheels' own
        directory, and every file of the wheel's RECORD there, with its hash."""
        wheels = self.inputs.plan.wheels
        names = [wheel.recipe for wheel in wheels]
        said = self._python(env, ["-c", LOCATING, *names], what="locate the installed wheels")
        located: dict[str, str | None] = self._result(said, probe="the wheels' locating probe")
        problems = {}
        for wheel, file in zip(wheels, files, strict=True):
            problems[wheel.recipe] = not_the_channels_file(wheel.recipe, file, located.get(wheel.recipe), env.site)
            if problems[wheel.recipe]:
                self.log.note(f"{wheel.recipe}: {problems[wheel.recipe]}")
        return problems

    def _result(self, said: str, *, probe: str) -> Any:
        """The JSON line a probe printed last; an ``EnvError`` where it printed none."""
        try:
            return json.loads(said.splitlines()[-1])
        except (ValueError, IndexError):
            raise EnvError(f"test-gpu: {probe} said no result: {said[-200:]!r}", fix=f"read {self.log.path}") from None

    def _install_argv(self, env: _Env, what: Sequence[str]) -> list[str]:
        return [
            uv_bin(),
            "pip",
            "install",
            "--no-config",
            "--python",
            str(env.python),
            "--index-url",
            self.inputs.channel_url,
            *what,
        ]

    def _doctor(self, env: _Env, gpus: doctor.Gpus) -> dict[str, doctor.Finding]:
        """doctor's verdict on each wheel the env has, by project name."""
        found = doctor.report(gpus, doctor.installed([str(env.site)]), list_all=True)
        for finding in found.findings:
            self.log.note(f"doctor: {finding.line()}")
        return {canonicalize_name(f.name): f for f in found.findings}

    def _wheel(
        self,
        env: _Env,
        wheel: WheelUnderTest,
        verdicts: Mapping[str, doctor.Finding],
        *,
        installed: str | None,
        sees_gpu: bool,
    ) -> WheelResult:
        finding = verdicts.get(canonicalize_name(wheel.recipe))
        status = finding.status if finding else doctor.UNKNOWN_STATUS
        detail = finding.detail if finding else "not among the installed distributions"
        runs = [self._import(env, wheel)]
        check = None
        if runs[0].result is GpuOutcome.PASSED and wheel.gpu_smoke is not None:
            runs.append(self._check(env, wheel) if sees_gpu else _not_run("torch sees no GPU"))
            check = runs[-1].result
        record = finding.record if finding is not None else None
        ran = Ran(
            installed=installed,
            record=record.family if record is not None else None,
            record_problem=detail,
            sees_gpu=sees_gpu,
            imported=runs[0].result is GpuOutcome.PASSED,
            check=check,
            no_kernel_image=any(no_kernel_image([run.detail]) for run in runs if run.result is GpuOutcome.FAILED),
        )
        outcome, why = judge_wheel(status, ran)
        self.say(f"{wheel.recipe}: {outcome.value}: {why}")
        return WheelResult(
            recipe=wheel.recipe,
            filename=wheel.filename,
            sha256=wheel.sha256,
            doctor=status,
            doctor_detail=detail,
            runs=tuple(runs),
            outcome=outcome,
            why=why,
        )

    def _import(self, env: _Env, wheel: WheelUnderTest) -> CheckRun:
        """Its modules imported and its operators found, on the GPU machine."""
        if not wheel.imports and not wheel.torch_ops:
            return CheckRun(name="import", result=GpuOutcome.PASSED, seconds=0.0, detail="the recipe names no module")
        request = json.dumps({"imports": list(wheel.imports), "ops": list(wheel.torch_ops), "then": None})
        started = time.monotonic()
        try:
            said = self._python(env, ["-c", IMPORTS, request], what=f"import {wheel.recipe}")
        except EnvError as exc:
            return CheckRun(
                name="import", result=GpuOutcome.FAILED, seconds=time.monotonic() - started, detail=exc.message
            )
        results = parse(said) or []
        wrong = [r for r in results if not r["ok"]]
        detail = "; ".join(f"{r['name']}: {r['detail']}" for r in wrong) or f"{len(results)} checks passed"
        result = GpuOutcome.FAILED if wrong or not results else GpuOutcome.PASSED
        return CheckRun(name="import", result=result, seconds=time.monotonic() - started, detail=detail[:400])

    def _check(self, env: _Env, wheel: WheelUnderTest) -> CheckRun:
        """The recipe's GPU check, from an empty directory; skipped tests are counted apart."""
        plan = self.inputs.plan
        argv = wheel.command(
            str(env.python), str(self.inputs.recipes_dir), self.inputs.sources.get(wheel.recipe), plan.template_values()
        )
        assert argv is not None, "run only where the recipe has a GPU check"
        self.say(f"{wheel.recipe}: {' '.join(argv)}")
        lines: list[str] = []
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="gpu-check-", dir=self.inputs.work) as cwd:
            try:
                self.runner.run(argv, env=self._environment(env), log=self.log, cwd=Path(cwd), on_line=lines.append)
                failed = None
            except CommandFailed as exc:
                failed = exc
        seconds = time.monotonic() - started
        counted = tally([line.rstrip() for line in lines])
        result = judge_check(counted, exit_ok=failed is None)
        if result is GpuOutcome.FAILED:
            # The kernel's own error where the output has one, so the judge can tell a missing
            # kernel image from any other failure.
            detail = _error_of(lines, prefer=no_kernel_image)
        elif result is GpuOutcome.SKIPPED:
            detail = counted.describe() if counted is not None else "no test ran"
        else:
            said = [line.strip() for line in lines if line.strip()]
            detail = (said[-1] if said else "passed")[:300]
        return CheckRun(name="gpu-smoke", result=result, seconds=seconds, detail=detail, tally=counted)

    def _python(self, env: _Env, args: Sequence[str], *, what: str, alone: bool = False) -> str:
        """What the env's Python printed (``alone``: without the wheels' directory); an
        ``EnvError`` saying what failed."""
        environment = self._environment(env)
        if alone:
            environment.pop("PYTHONPATH", None)
        with tempfile.TemporaryDirectory(prefix="gpu-probe-", dir=self.inputs.work) as cwd:
            try:
                done = self.runner.run(
                    [str(env.python), *args], env=environment, log=self.log, cwd=Path(cwd), keep_output=True
                )
            except CommandFailed as failed:
                raise EnvError(f"{what}: {failed.last_line()}", fix=f"read {self.log.path}") from None
        return done.output

    def _uv(self, argv: Sequence[str], *, what: str) -> str:
        """What uv printed; an ``EnvError`` saying what it could not do."""
        try:
            return self.runner.run(argv, env=uv_environment(), log=self.log, keep_output=True).output
        except CommandFailed as failed:
            raise EnvError(f"test-gpu: cannot {what}: {failed.last_line()}", fix=f"read {self.log.path}") from None

    def _environment(self, env: _Env) -> dict[str, str]:
        kept = {key: os.environ[key] for key in GPU_VARIABLES if key in os.environ}
        if env.pythonpath is not None:
            kept["PYTHONPATH"] = str(env.pythonpath)
        return base_environment(list(env.path), kept)

    def _report(
        self,
        gpus: doctor.Gpus,
        torch: Mapping[str, Any] | None,
        results: Sequence[WheelResult],
        *,
        status: GpuOutcome,
        error: str | None,
        code: int,
        env: _Env | None = None,
    ) -> GpuReport:
        plan = self.inputs.plan
        return GpuReport(
            cell=plan.cell.id,
            channel=plan.channel,
            index=self.inputs.index,
            env=env.described if env else "not made",
            python=plan.cell.python,
            runner=self.inputs.runner,
            torch=str(torch["version"]) if torch else None,
            gpus=tuple(g.label for g in gpus.found),
            torch_gpus=tuple(torch["devices"]) if torch else (),
            notes=tuple(gpus.notes),
            wheels=tuple(results),
            missing=plan.missing,
            status=status,
            exit_code=code,
            error=error,
            seconds=time.monotonic() - self.started,
            provenance=self.checked.record() if self.checked is not None else None,
        )


def _ending(
    status: GpuOutcome, results: Sequence[WheelResult], *, gpus: str, torch: Mapping[str, Any]
) -> tuple[int, str | None]:
    """The stage's exit code and error line, from its worst outcome: 0 for a pass alone."""

    def of(outcome: GpuOutcome) -> str:
        return " | ".join(r.side_by_side() for r in results if r.outcome is outcome)

    match status:
        case GpuOutcome.MISMATCH:
            return GpuVerdictMismatch.exit_code, f"doctor's verdict and the kernels disagree on {of(status)}"
        case GpuOutcome.FAILED:
            count = sum(1 for r in results if r.outcome is status)
            return GpuCheckError.exit_code, f"{count} wheel(s) failed on {gpus}: {of(status)}"
        case GpuOutcome.NOT_RUN:
            said = f"nvidia-smi lists {gpus}, but torch {torch['version']} sees no GPU: no kernel ran"
            return NoGpuError.exit_code, said
        case GpuOutcome.SKIPPED | GpuOutcome.IMPORT_ONLY:
            unproven = [r for r in results if r.outcome in (GpuOutcome.SKIPPED, GpuOutcome.IMPORT_ONLY)]
            said = " | ".join(f"{r.recipe} ({r.filename}): {r.outcome.value}: {r.why}" for r in unproven)
            return GpuUnproven.exit_code, f"proved nothing of {len(unproven)} wheel(s): {said}"
        case GpuOutcome.PASSED:
            return 0, None
        case _:
            raise AssertionError(f"a judged stage is never {status}")


def _not_run(why: str) -> CheckRun:
    return CheckRun(name="gpu-smoke", result=GpuOutcome.NOT_RUN, seconds=0.0, detail=why)


def _error_of(lines: Sequence[str], *, prefer: Callable[[Sequence[str]], bool]) -> str:
    """The line that says most of a failure: one ``prefer`` picks (a missing kernel image),
    else the last error the output names (``RuntimeError: ...``), else its last line."""
    said = [line.strip() for line in lines if line.strip()]
    preferred = [line for line in said if prefer([line])]
    errors = [line for line in said if "Error" in line.split(":", 1)[0] or line.lower().startswith("error")]
    return ((preferred or errors or said or ["(no output)"])[-1])[:300]


def channel_location(index: str, channel: str) -> str:
    """Where uv reads a channel: a served index's channel URL, or the index root's pages as
    a file URL."""
    if "://" in index:
        return f"{index.rstrip('/')}/{channel}/simple/"
    return (Path(index).resolve() / channel / "simple").as_uri() + "/"
