"""Waiting for a condition with a deadline: how commands, the lab, benchmarks and tests wait on a swarm."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

from swarm.errors import SwarmError

T = TypeVar("T")


class WaitTimeout(SwarmError):
    """The condition did not hold within the time given."""


def wait_for(condition: Callable[[], T], timeout: float, what: str, interval: float = 0.5) -> T:
    """Call `condition()` every `interval` seconds until it returns something truthy, and return
    that; WaitTimeout naming `what` after `timeout` seconds. `condition` may raise to give up early."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
