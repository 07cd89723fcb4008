"""Headless Chromium for the health page's test and its screenshot: Debian's `chromium`, driven by Playwright.

Playwright for Python drives the system's browser through `executable_path`; it never fetches
one of its own (`playwright install` needs a download, which machines here cannot make). Both
are optional (`.ci/browser-setup` installs the browser, the `test` extra Playwright):
`missing()` says why they cannot be used here, for a test to skip with.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
# headless on a machine with no display, no GPU, no network but 127.0.0.1, running as root
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--no-first-run", "--disable-sync"]  # fmt: skip
LAUNCH_TIMEOUT_MS = 60_000


def missing() -> str | None:
    """Why a headless Chromium cannot be driven here, or None if it can."""
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} is not installed (as root: bash .ci/browser-setup)"
    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed (pip install -e '.[test]')"
    return None


@contextmanager
def headless_chromium() -> Iterator[Any]:
    """A Playwright `Browser` on the system's Chromium, closed on exit."""
    from playwright.sync_api import sync_playwright  # optional: only the test and the screenshot need it

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS, timeout=LAUNCH_TIMEOUT_MS)
        try:
            yield browser
        finally:
            browser.close()
