"""A screenshot of the health page over a running demo swarm (the README shows it).

Runs `swarm-demo` (a bootstrap node and one peer per block, training on the built-in corpus),
reads the health page's address the demo prints, waits until the page's API says every block
is healthy and each block's loss has a few points, takes a full-page screenshot in headless
Chromium (Debian's, driven by Playwright: see swarm/health/browser.py), then lets the demo
finish. Writes `health.png` and the state it showed (`state.json`); prints a JSON summary.
With `--replicas N` (N > 1) the demo runs N DeMo replicas per block, which attest each other's
work, and the page is shot once every peer is credited accepted payloads by two other keys; the
leaderboard alone is then written to `leaderboard.png` (swarm/p2p/ledger.py).

    python benchmarks/health_page.py --steps 20
    python benchmarks/health_page.py --steps 60 --replicas 3 --config small.json
"""

from __future__ import annotations

import argparse
import json
import logging
import select
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from swarm.cli.console import setup_logging
from swarm.files import write_atomic
from swarm.health import browser
from swarm.lab.launch import command_path
from swarm.waiting import wait_for

logger = logging.getLogger("benchmarks.health_page")

HTTP_TIMEOUT_S = 10.0


def page_address(demo: subprocess.Popen, timeout: float) -> str:
    """The address in the demo's "swarm health page: URL" line."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and demo.poll() is None:
        if select.select([demo.stdout], [], [], 1.0)[0]:
            line = demo.stdout.readline()
            if line.startswith("swarm health page: "):
                return line.split(": ", 1)[1].strip()
    raise SystemExit(f"swarm-demo printed no health page address within {timeout:.0f}s")


def state(url: str) -> dict:
    with urllib.request.urlopen(f"{url}api/v1/state", timeout=HTTP_TIMEOUT_S) as response:
        return json.load(response)


def ready(url: str, points: int, replicas: int) -> dict | None:
    """The state once every block is healthy and has `points` loss points, and, with replicas, every
    peer is credited accepted payloads; else None."""
    now = state(url)
    history = now.get("loss_history", {})
    longest = [max((len(s["points"]) for s in history.get(str(b), [])), default=0)
               for b in range(now.get("n_blocks", 1))]
    enough = min(longest) >= points
    paid = sum(c["accepted_payloads"] > 0 for c in now.get("contributions", []))
    credited = paid >= now.get("n_blocks", 1) * replicas if replicas > 1 else True
    return now if now.get("status") == "healthy" and enough and credited else None


def screenshot(url: str, path: Path, leaderboard: Path | None = None) -> None:
    """The whole page into `path`; its leaderboard's section alone into `leaderboard`, if given."""
    from playwright.sync_api import expect  # optional, like the browser itself

    with browser.headless_chromium() as chromium:
        page = chromium.new_page(viewport={"width": 1500, "height": 900})
        page.goto(url, timeout=30_000)
        expect(page.locator("#model-status")).to_have_text("healthy", timeout=30_000)
        expect(page.locator("figure[data-block] polyline").first).to_be_visible()
        page.screenshot(path=str(path), full_page=True)
        if leaderboard is not None:
            expect(page.locator("#leaderboard tbody tr").first).to_be_visible()
            page.locator("section", has=page.locator("#leaderboard")).screenshot(path=str(leaderboard))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="steps each demo peer trains")
    parser.add_argument("--points", type=int, default=4, help="loss points per block before the screenshot")
    parser.add_argument("--replicas", type=int, default=1, help="peers per block (more than one: a leaderboard)")
    parser.add_argument("--config", default=None, help="model config JSON for the demo (default: the built-in one)")
    parser.add_argument("--timeout", type=float, default=1200.0)
    parser.add_argument("--out", default="benchmarks/results/health")
    args = parser.parse_args()
    setup_logging()
    if browser.missing():
        raise SystemExit(f"cannot take the screenshot: {browser.missing()}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="health-page-") as workdir:
        config = ["--config", str(Path(args.config).resolve())] if args.config else []
        command = [command_path("swarm-demo"), "--steps", str(args.steps), "--workdir", workdir,
                   "--replicas", str(args.replicas), *config]  # fmt: skip
        demo = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        try:
            url = page_address(demo, 120)
            shown = wait_for(lambda: ready(url, args.points, args.replicas), args.timeout, "every block healthy", 2.0)
            screenshot(url, out / "health.png", out / "leaderboard.png" if args.replicas > 1 else None)
            write_atomic(out / "state.json", json.dumps(shown, indent=2).encode())
            demo.communicate(timeout=args.timeout)
        finally:
            if demo.poll() is None:  # SIGINT: the demo stops every process it started
                demo.send_signal(signal.SIGINT)
                demo.wait(60)
    summary = {"url": url, "screenshot": str(out / "health.png"), "status": shown["status"], "blocks": shown["blocks"],
               "hosts": len(shown["hosts"]), "pings": len(shown["pings"]), "demo_exit": demo.returncode}  # fmt: skip
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
