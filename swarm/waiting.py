"""Waiting for a condition with a deadline: how commands, the lab, benchmarks and tests wait on a swarm."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from swarm.errors import SwarmError

T = TypeVar("T")


class WaitTimeout(SwarmError):
    """The condition did not hold within the time given."""


class WaitStopped(Exception):
    """The wait was told to stop (a stop signal): not an error, the caller leaves."""


def wait_for(
    condition: Callable[[], T], timeout: float, what: str, interval: float = 0.5, stop: threading.Event | None = None
) -> T:
    """Call `condition()` every `interval` seconds until it returns something truthy, and return
    that; WaitTimeout naming `what` after `timeout` seconds. `condition` may raise to give up early.
    With `stop`, WaitStopped as soon as it is set (a peer told to stop while it waits to join leaves
    at once, not when the deadline comes)."""
    deadline = time.monotonic() + timeout
    pause = stop.wait if stop is not None else time.sleep
    while True:
        if stop is not None and stop.is_set():
            raise WaitStopped(f"stopped while waiting for {what}")
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}")
        pause(min(interval, max(0.0, deadline - time.monotonic())))
