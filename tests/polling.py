"""The one poll-until-deadline loop of the tests: wait for a condition instead of sleeping blindly."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    check: Callable[[], T],
    timeout: float,
    interval: float = 0.1,
    *,
    what: str = "the condition",
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Call `check` until it returns something truthy, and return that; fail after `timeout` seconds.

    Exceptions of the types in `ignore` count as "not yet" (a server still starting refuses
    connections); any other exception propagates at once, so a check can end the wait early by
    raising (a process that died will never become ready). `check` runs at least once, and once
    more after the deadline, so a slow machine that overshoots the deadline still sees a late success.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        past_deadline = time.monotonic() >= deadline
        try:
            value = check()
        except ignore as error:
            last = error
        else:
            if value:
                return value
            last = value
        if past_deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what} (last: {last!r})")
        time.sleep(interval)
