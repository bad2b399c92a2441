"""Polling with a generous deadline, for tests (no timing asserts: only "eventually")."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    probe: Callable[[], T | None],
    *,
    timeout: float = 90.0,
    interval: float = 0.25,
    what: str | Callable[[], str] = "condition",
) -> T:
    """Call probe until it returns something truthy and return that; TimeoutError after timeout.

    Exceptions from probe count as "not yet" (the last one is chained onto the TimeoutError).
    `what` (or what() -- e.g. a dump of the pods) describes the wait in the error.
    """
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        try:
            value = probe()
        except Exception as e:
            last, value = e, None
        if value:
            return value
        if time.monotonic() > deadline:
            text = what() if callable(what) else what
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {text}") from last
        time.sleep(interval)
