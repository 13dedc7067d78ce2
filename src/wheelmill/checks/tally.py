"""What a test command's output says it ran: pytest's last line, or unittest's ``Ran N
tests`` and verdict, count what passed, failed and was skipped. A run that skipped tests
proved less than one that passed them all, so the install test and the GPU stage count
skips apart from passes and never call them a pass; an expected failure (pytest's
``xfailed``) proved nothing either and counts as a skip, and a run of no test at all is
complete in nothing (``Tally.complete``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

# pytest's summary: "1 passed, 8 skipped in 2.31s", "=== 2 failed, 1 passed, 1 error in 3s ===".
_SUMMARY = re.compile(r"\b\d+ (?:passed|failed|skipped|errors?|xfailed|xpassed|deselected)\b.* in [\d.]+\s*s")
_COUNT = re.compile(r"\b(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)\b")
# unittest: "Ran 3 tests in 0.001s", then "OK (skipped=2)" or "FAILED (failures=1, errors=1)"
_RAN = re.compile(r"^Ran (\d+) tests? in [\d.]+s$")
_VERDICT = re.compile(r"^(OK|FAILED)(?: \((.*)\))?$")
# pytest -rs: "SKIPPED [8] tests/test_ops.py:17: no CUDA device"
_SKIP_REASON = re.compile(r"^SKIPPED \[\d+\] [^:]+:\d+: (.+)$")


@dataclass(frozen=True, kw_only=True)
class Tally:
    """What one test run counted."""

    passed: int = 0
    failed: int = 0
    skipped: int = 0
    reasons: tuple[str, ...] = ()  # why tests were skipped, where the output says (pytest -rs)

    @property
    def ran(self) -> int:
        return self.passed + self.failed

    @property
    def complete(self) -> bool:
        """Every test ran and passed, and there was at least one: a pass, and nothing less."""
        return self.passed > 0 and not self.failed and not self.skipped

    def describe(self) -> str:
        """``1 passed, 8 skipped (no CUDA device)``."""
        parts = [f"{n} {word}" for n, word in ((self.passed, "passed"), (self.failed, "failed")) if n]
        if self.skipped:
            why = f" ({'; '.join(self.reasons)})" if self.reasons else ""
            parts.append(f"{self.skipped} skipped{why}")
        return ", ".join(parts) or "no tests ran"


def tally(lines: Sequence[str]) -> Tally | None:
    """The counts of the last pytest summary line in ``lines``; None where there is none
    (a command that is not pytest says only its exit status).

    >>> tally(["....s", "1 passed, 8 skipped in 2.31s"]).describe()
    '1 passed, 8 skipped'
    >>> tally(["SKIPPED [8] tests/test_ops.py:17: no CUDA device", "= 1 passed, 8 skipped in 2.3s ="]).describe()
    '1 passed, 8 skipped (no CUDA device)'
    >>> tally(["2 failed, 1 passed, 1 error in 3.00s"]).failed, tally(["all good"])
    (3, None)
    >>> tally(["3 passed, 1 xfailed, 1 xpassed in 1.0s"]).describe()
    '4 passed, 1 skipped'
    """
    summary = next((line for line in reversed(lines) if _SUMMARY.search(line)), None)
    if summary is None:
        return _unittest(lines)
    counts: dict[str, int] = {}
    for number, word in _COUNT.findall(summary):
        key = {"error": "failed", "errors": "failed", "xpassed": "passed", "xfailed": "skipped"}.get(word, word)
        counts[key] = counts.get(key, 0) + int(number)
    reasons = tuple(dict.fromkeys(m.group(1).strip()[:120] for m in map(_SKIP_REASON.match, lines) if m))
    return Tally(
        passed=counts.get("passed", 0),
        failed=counts.get("failed", 0),
        skipped=counts.get("skipped", 0),
        reasons=reasons,
    )


def _unittest(lines: Sequence[str]) -> Tally | None:
    """unittest's counts: ``Ran N tests`` includes the skipped and failed ones.

    >>> _unittest(["Ran 3 tests in 0.001s", "", "OK (skipped=2)"]).describe()
    '1 passed, 2 skipped'
    >>> _unittest(["Ran 2 tests in 0.1s", "FAILED (failures=1, errors=1)"]).describe()
    '2 failed'
    >>> _unittest(["Ran 0 tests in 0.000s", "OK"]).complete
    False
    >>> _unittest(["Ran 2 tests in 0.1s", "OK (expected failures=1)"]).describe()
    '1 passed, 1 skipped'
    """
    stripped = [line.strip() for line in lines]
    ran_at = next((i for i in range(len(stripped) - 1, -1, -1) if _RAN.match(stripped[i])), None)
    if ran_at is None:
        return None
    verdict = next((m for m in map(_VERDICT.match, stripped[ran_at + 1 :]) if m), None)
    if verdict is None:
        return None
    counts = {
        key.strip(): int(value)
        for key, _, value in (part.partition("=") for part in (verdict.group(2) or "").split(","))
        if value
    }
    ran = int(_RAN.match(stripped[ran_at]).group(1))  # type: ignore[union-attr]
    failed = counts.get("failures", 0) + counts.get("errors", 0) + counts.get("unexpected successes", 0)
    skipped = counts.get("skipped", 0) + counts.get("expected failures", 0)
    return Tally(passed=ran - failed - skipped, failed=failed, skipped=skipped)
