"""Retries with exponential backoff and jitter, for network-bound work only.

A retry wraps one step's network operation, never a whole run. Only failures classified
as transient are retried; a compile error or a hash mismatch never is.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    attempts: int = 5
    base_delay: float = 1.0
    max_delay: float = 30.0
    factor: float = 2.0

    def delay(self, failures: int, rng: random.Random) -> float:
        """Backoff before the next attempt: half fixed, half random ("equal jitter").

        >>> p = RetryPolicy(base_delay=1.0, max_delay=30.0)
        >>> all(0.5 <= p.delay(1, random.Random(s)) <= 1.0 for s in range(20))
        True
        >>> all(15.0 <= p.delay(9, random.Random(s)) <= 30.0 for s in range(20))
        True
        """
        ceiling = min(self.max_delay, self.base_delay * self.factor ** (failures - 1))
        return ceiling / 2 + rng.uniform(0, ceiling / 2)


class TransientError(Exception):
    """Raised by the wrapped operation for a failure worth another attempt."""


def with_retries(
    operation: Callable[[int], T],
    *,
    policy: RetryPolicy,
    on_retry: Callable[[int, Exception, float], None],
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
) -> tuple[T, int]:
    """Run ``operation(attempt)`` until it succeeds; return its result and the attempts used.

    ``TransientError`` is retried up to ``policy.attempts`` in all, then re-raised; any other
    exception propagates at once.
    """
    rng = rng or random.Random()  # noqa: S311 - jitter, not cryptography
    attempt = 1
    while True:
        try:
            return operation(attempt), attempt
        except TransientError as exc:
            if attempt >= policy.attempts:
                raise
            pause = policy.delay(attempt, rng)
            on_retry(attempt, exc, pause)
            sleep(pause)
            attempt += 1
