"""The health page's web server: the page, its script and style, and `GET /api/v1/state`.

Built on aiohttp: a well-kept asyncio HTTP server (3.x, on PyPI since 2014), so the web
server, the poll loop and hivemind's own asyncio world live in one kind of code, with no
WSGI bridge and no extra thread per request; it serves a few static files and one JSON
route, which is all the page needs (no template engine: the page fills itself in from the
JSON, so no peer's string is ever pasted into HTML by the server).

Every response carries a Content-Security-Policy that allows scripts from this server's own
files only: even if a peer's string ever reached the page as markup, no inline script or
event handler in it would run. The page itself writes peer strings as text nodes only.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from swarm.errors import SwarmError
from swarm.health.state import SwarmMonitor

logger = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
PAGES = {"/": "index.html", "/health.js": "health.js", "/health.css": "health.css"}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@dataclass
class Board:
    """The latest state, replaced whole by each poll (the app is frozen once it runs)."""

    state: dict


BOARD = web.AppKey("board", Board)


def build_app(board: Board) -> web.Application:
    """The page and the API, serving whatever state `board` holds."""
    app = web.Application(middlewares=[_security_headers])
    app[BOARD] = board
    for route, name in PAGES.items():
        app.router.add_get(route, _static_file(STATIC / name))
    app.router.add_get("/api/v1/state", _state)
    return app


@web.middleware
async def _security_headers(request: web.Request, handler) -> web.StreamResponse:
    response = await handler(request)
    response.headers.update(SECURITY_HEADERS)
    return response


def _static_file(path: Path) -> Callable:
    async def handler(request: web.Request) -> web.FileResponse:
        return web.FileResponse(path)

    return handler


async def _state(request: web.Request) -> web.Response:
    # allow_nan=False: the monitor turns every non-finite number into null; a miss fails loudly here
    body = json.dumps(request.app[BOARD].state, allow_nan=False)
    return web.Response(text=body, content_type="application/json")


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: any free one); SwarmError if it cannot be had."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family)
    except OSError as error:
        raise SwarmError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None


def serve(monitor: SwarmMonitor, sock: socket.socket, poll_period: float, on_ready: Callable[[str], None]) -> None:
    """Serve the page on `sock` and poll the swarm every `poll_period` seconds until SIGINT or
    SIGTERM; `on_ready` gets the page's address once the first state is in."""
    asyncio.run(_serve(monitor, sock, poll_period, on_ready))


async def _serve(
    monitor: SwarmMonitor, sock: socket.socket, poll_period: float, on_ready: Callable[[str], None]
) -> None:
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    board = Board({"status": "starting", "errors": []})
    await _poll_once(board, monitor, poll_period)
    runner = web.AppRunner(build_app(board), access_log=None)
    await runner.setup()
    try:
        await web.SockSite(runner, sock).start()
        host, port = sock.getsockname()[:2]
        on_ready(f"http://{f'[{host}]' if ':' in host else host}:{port}/")
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), poll_period)
            except TimeoutError:
                await _poll_once(board, monitor, poll_period)
    finally:
        await runner.cleanup()
    logger.info("health page stopped")


async def _poll_once(board: Board, monitor: SwarmMonitor, poll_period: float) -> None:
    """One new state (the DHT reads block, so they run in a worker thread); on a failure the
    last state's tables stay, under status "unknown" and the error."""
    try:
        state = await asyncio.to_thread(monitor.collect)
    except Exception as error:  # a poll must never end the server: say it on the page, try again
        logger.warning("polling the swarm failed: %s", error)
        failed = f"polling the swarm failed: {type(error).__name__}: {error}"
        state = {**board.state, "status": "unknown", "errors": [failed]}
    board.state = {**state, "poll_period_s": poll_period}
