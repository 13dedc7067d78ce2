"""Checks: before a build (is this machine and env right for the cell?) and after it
(is this wheel right?). Each check returns a ``CheckResult``; a step fails when any of its
checks fails, and the report keeps every verdict."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from wheelmill.errors import WheelmillError
from wheelmill.machine.process import StepLog


class Verdict(StrEnum):
    PASS = "pass"  # noqa: S105 - a verdict, not a password
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    name: str
    verdict: Verdict
    detail: str
    fix: str | None = None

    @classmethod
    def passed(cls, name: str, detail: str) -> CheckResult:
        return cls(name=name, verdict=Verdict.PASS, detail=detail)

    @classmethod
    def failed(cls, name: str, detail: str, fix: str) -> CheckResult:
        return cls(name=name, verdict=Verdict.FAIL, detail=detail, fix=fix)

    @classmethod
    def skipped(cls, name: str, detail: str) -> CheckResult:
        return cls(name=name, verdict=Verdict.SKIP, detail=detail)

    @classmethod
    def warned(cls, name: str, detail: str, fix: str) -> CheckResult:
        return cls(name=name, verdict=Verdict.WARN, detail=detail, fix=fix)

    def as_dict(self) -> dict[str, str | None]:
        return {"name": self.name, "verdict": self.verdict.value, "detail": self.detail, "fix": self.fix}


def failures(results: Iterable[CheckResult]) -> list[CheckResult]:
    return [r for r in results if r.verdict is Verdict.FAIL]


def summarize_failures(results: Iterable[CheckResult]) -> tuple[str, str]:
    """One line of what failed and one of how to fix it, for the step's error."""
    failed = failures(results)
    what = "; ".join(f"{r.name}: {r.detail}" for r in failed)
    fix = "; ".join(f"{r.name}: {r.fix}" for r in failed if r.fix)
    return what, fix


def require(
    results: Sequence[CheckResult], log: StepLog, *, failure: Callable[[str, str], WheelmillError]
) -> Sequence[CheckResult]:
    """Log every verdict; when any failed, raise ``failure(what, fix)``: all checks ran
    first, so every failure is reported at once."""
    for result in results:
        log.note(f"{result.name}: {result.verdict}: {result.detail}")
    if failures(results):
        raise failure(*summarize_failures(results))
    return results
