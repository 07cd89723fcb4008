"""Whether a host serves the checkpoint its record announces: the health page's check, once per
(peer, checkpoint), in the background.

A record's checkpoint (step, sha256, size, chunks) is a claim anyone can sign with a key of their own,
and a peer that answers `rpc_info` honestly may still announce a checkpoint it does not have.
The page believes the claim only once it has checked it (`CheckpointChecks._check`):
1. the announced size is at most what a block of this model weighs (`max_checkpoint_bytes`);
2. the host reports a chunk list for that block and sha256 describing a file of the announced
   size, the list whose sha256 the record names (`ask_chunk_list`): a host that does not hold the
   file refuses here;
3. a checkpoint of at most `whole_bytes` (16 MiB by default; a block of the default model weighs
   about 10 MB) is downloaded whole through the bounded, verified download (every chunk against
   the list, the whole against the sha256, and it loads as this block of this model at the
   announced step: swarm/checkpoints/download.py), then dropped: check "whole". A larger one has
   one chunk, picked at random, downloaded and checked against the list: check "chunk". That
   is weaker, and says so: a host that made up a file and a sha256 and serves that file under
   it passes; only "whole" checks the bytes against the sha256.

Checks run on the P2P event loop, `CHECKS_AT_ONCE` at a time, each within `CHECK_TIMEOUT_S`; a
poll never waits for one (a host still being checked is unverified: "not checked yet"), so a
peer that vanishes mid-check costs a task, never the page. A result is kept per (block, peer,
record key, checkpoint), the most recent `RESULTS_KEPT`; a failed check is tried again after
`RETRY_S` (a host may have been busy). Only hosts that answered `rpc_info` under their record's
key are checked, so an impostor's record cannot spoil the result kept for the peer it names.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import OrderedDict
from dataclasses import dataclass

from hivemind.p2p import P2P

from swarm.checkpoints.chunks import ChunkList
from swarm.checkpoints.download import download_verified
from swarm.checkpoints.transfer import (
    FIRST_BYTE_TIMEOUT_S,
    INACTIVITY_TIMEOUT_S,
    HostFailed,
    TransferError,
    ask_chunk_list,
    max_checkpoint_bytes,
    open_run,
)
from swarm.errors import SwarmError
from swarm.model.denoiser import ModelConfig
from swarm.p2p.directory import Host
from swarm.p2p.messages import DownloadRequest
from swarm.p2p.records import CheckpointInfo

logger = logging.getLogger(__name__)

WHOLE_BYTES = 16 * 2**20  # a checkpoint up to this size is downloaded whole; a larger one has one chunk checked
CHECK_TIMEOUT_S = 150.0  # one check, all its calls: the whole download of WHOLE_BYTES at 1 Mbit/s, and slack
CHECKS_AT_ONCE = 4  # checks running at once (the page's bandwidth: at most this many downloads)
CHECKS_QUEUED = 64  # checks started and not finished; more hosts wait for a later poll
RESULTS_KEPT = 1024  # results kept, the most recently shown
RETRY_S = 60.0  # a failed check is tried again after this long
REASON_CHARS = 200
Key = tuple[int, str, bytes, CheckpointInfo]  # block, peer id, the key its record is signed with, the checkpoint


@dataclass(frozen=True)
class Verdict:
    """What the page knows of a host's checkpoint: `check` ("whole" or "chunk") if it passed,
    else `reason`; `at` is when (time.monotonic)."""

    check: str | None
    reason: str | None
    at: float

    @property
    def verified(self) -> bool:
        return self.check is not None


NOT_CHECKED = Verdict(None, "not checked yet", 0.0)


def check_key(host: Host) -> Key:
    """What a check's result is kept under (not the voice a host counts as: that is
    swarm.checkpoints.download.key_of)."""
    assert host.announcement.checkpoint is not None, "only a host that announces a checkpoint is checked"
    return host.block, host.peer_id, host.owner, host.announcement.checkpoint


class CheckpointChecks:
    """The checks of hosts' checkpoints and their results (see the module docstring). Every
    method runs on the event loop that owns `p2p`."""

    def __init__(self, p2p: P2P, config: ModelConfig, whole_bytes: int = WHOLE_BYTES, timeout: float = CHECK_TIMEOUT_S):
        self.p2p, self.config, self.whole_bytes, self.timeout = p2p, config, whole_bytes, timeout
        self.max_bytes = max_checkpoint_bytes(config)
        self._results: OrderedDict[Key, Verdict] = OrderedDict()
        self._running: dict[Key, asyncio.Task] = {}
        self._slots: asyncio.Semaphore | None = None  # made on the loop, at the first check

    async def verdicts(self, hosts: list[Host]) -> dict[Key, Verdict]:
        """What is known of each host's checkpoint now; a check starts for each host not
        checked yet (or whose last check failed `RETRY_S` ago). Never waits for a check."""
        found, now = {}, time.monotonic()
        for host in hosts:
            key = check_key(host)
            verdict = self._results.get(key)
            if verdict is not None:
                self._results.move_to_end(key)
            if verdict is None or (not verdict.verified and now - verdict.at >= RETRY_S):
                self._start(key, host)
            found[key] = verdict or NOT_CHECKED
        return found

    def _start(self, key: Key, host: Host) -> None:
        if key in self._running or len(self._running) >= CHECKS_QUEUED:
            return
        if self._slots is None:
            self._slots = asyncio.Semaphore(CHECKS_AT_ONCE)
        task = asyncio.create_task(self._run(key, host))
        self._running[key] = task
        task.add_done_callback(lambda _: self._running.pop(key, None))

    async def _run(self, key: Key, host: Host) -> None:
        async with self._slots:
            try:
                async with asyncio.timeout(self.timeout):
                    verdict = Verdict(await self._check(host, key[3]), None, time.monotonic())
            except TimeoutError:
                verdict = Verdict(None, f"the check took longer than {self.timeout:.0f}s", time.monotonic())
            except Exception as error:  # noqa: BLE001 (the peer lied, refused, vanished, or spoke nonsense)
                verdict = Verdict(None, short_reason(error, host), time.monotonic())
        logger.info("block %d: peer %s's checkpoint %s: %s", host.block, host.peer_id, key[3].sha256[:12],
                    f"verified ({verdict.check})" if verdict.verified else f"unverified: {verdict.reason}")  # fmt: skip
        self._results[key] = verdict
        self._results.move_to_end(key)
        while len(self._results) > RESULTS_KEPT:
            self._results.popitem(last=False)

    async def _check(self, host: Host, info: CheckpointInfo) -> str:
        """How the checkpoint `host` announces was checked ("whole" or "chunk"); raises why not."""
        if info.size > self.max_bytes:
            raise HostFailed(f"announces {info.size} bytes, more than a block of this model weighs")
        chunk_list = await ask_chunk_list(self.p2p, host, info, FIRST_BYTE_TIMEOUT_S)
        if info.size <= self.whole_bytes:
            await download_verified(self.p2p, [host], self.config, host.block, show_progress=False)
            return "whole"
        await self._one_chunk(host, info, chunk_list)
        return "chunk"

    async def _one_chunk(self, host: Host, info: CheckpointInfo, chunk_list: ChunkList) -> None:
        """A chunk picked at random, downloaded and checked against `chunk_list`; HostFailed if it does not match."""
        index = random.randrange(chunk_list.count)
        request = DownloadRequest(block=host.block, sha256=info.sha256, first_chunk=index, chunks=1)
        stream = await open_run(self.p2p, host, request, info.size, {})
        try:
            chunk = await asyncio.wait_for(anext(stream), INACTIVITY_TIMEOUT_S)
        except StopAsyncIteration:
            raise HostFailed(f"sent no chunk {index}") from None
        finally:
            await stream.aclose()
        if not chunk_list.matches(index, chunk):
            raise HostFailed(f"sent a chunk {index} that does not match its chunk list")


def short_reason(error: Exception, host: Host) -> str:
    """Why a check failed, short and without the peer id (the page shows it beside)."""
    text = str(error)
    for named in (f"peer {host.peer_id} ", f"from {host.peer_id} ", f"from ['{host.peer_id}'] "):
        text = text.replace(named, "")
    if not isinstance(error, (TransferError, SwarmError)):  # a P2P error: its kind says what happened
        text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 1] + "…"
