"""Downloading one checkpoint from the hosts that vouch for it, each chunk checked on arrival.

The hosts of one checkpoint (the same step, sha256, size and chunk list in their records: a
`Candidate` of choice.py) serve it together, like BitTorrent's or iroh-blobs' many-source
downloads; and as there, no host is waited for where another suffices, since chunk hashes make
any host's bytes checkable (issue 57: a stranger that answered its chunk list "busy" just before
each timeout held every download that waited for all the lists):
1. Every host is asked at once for the key its record is signed with (`rpc_info`: a record
   cannot borrow another peer's id) and for its chunk list (chunks.py), and, meanwhile, for a
   first run of chunks (the size is announced, so the chunks are known before their hashes):
   the bytes flow one round trip sooner, and wait for that host's list to be checked. A host
   that has not answered both within `FIRST_BYTE_TIMEOUT_S` (busy tries included: transfer.py)
   is dropped.
2. A host's list is checked as it comes in against the sha256 its record names
   (`CheckpointInfo.chunks`, in transfer.py `ask_chunk_list`): a host that reports another is
   dropped at once, and its first run given up. So every host of a download reports the one list:
   the fetch starts with the first that comes in from a host that owns its record, and the others
   join as theirs come in (`_Lists`); if every host in the fetch is dropped, the hosts still to
   answer go on from the chunks received. A host whose list has not come in is never waited for
   while the fetch has a host. (Issue 57: a key that copied an honest record, answered first with
   a forged list and then sent that list's chunks slowly, each within `inactivity_timeout`, led the
   download until its deadline, the honest host's list waiting; a record that names a forged list
   is a checkpoint of its own, another candidate.)
3. Each host streams runs of chunks (`ChunkPlan` says which) over up to `STREAMS_PER_HOST`
   streams: one at first, the others once it has sent a chunk that verifies, so a lying host
   costs about one chunk. Every chunk is checked against the list as it arrives.
4. A host that sends a chunk the list does not hash to or a reply that is not one chunk (one
   announced longer is not even read: transfer.py), refuses, or sends nothing for
   `inactivity_timeout` is dropped (logged with its peer id, and kept in `Downloaded.dropped`);
   the chunks it had not sent go to the others. A stream that ends before its run (a network
   may cut one) is asked again, `STREAM_RETRIES` times per host, before its host is dropped.
5. The whole is checked against the record's sha256 (hashed and put together as its chunks come
   in, in order: `_Whole`). If it does not match, the record names the list of another file than
   its sha256: every host that reported the list lied, and is dropped, and the download fails.
The whole gives up (TransferError) when no host is left, or when it takes longer than the
announced size allows at `SLOWEST_RATE_BYTES_S` (callers bound that size first). A caller may
follow its pace (`Progress`: when its first list came in, and the bytes verified since), as
measure.py does to tell a slow download from one that waited for a list.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import logging
import math
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from hivemind.p2p import P2P
from tqdm import tqdm

from swarm.checkpoints.chunks import CHUNK_BYTES, ChunkList, ChunkPlan, Run, chunk_count
from swarm.checkpoints.transfer import (
    FIRST_BYTE_TIMEOUT_S,
    INACTIVITY_TIMEOUT_S,
    SLOWEST_RATE_BYTES_S,
    STREAMS_PER_HOST,
    HostFailed,
    TransferError,
    ask_chunk_list,
    check_owner,
    max_checkpoint_bytes,
    open_run,
)
from swarm.model.checkpoint import decode_block
from swarm.model.denoiser import Denoiser, ModelConfig
from swarm.p2p.directory import Host
from swarm.p2p.messages import DownloadRequest
from swarm.p2p.reachability import ensure_direct
from swarm.p2p.records import CheckpointInfo

logger = logging.getLogger(__name__)

STREAM_RETRIES = 2  # streams of one host that may end early (then asked again) before it is dropped


def key_of(host: Host) -> bytes:
    """The key behind a host's record: one key is one voice, whatever peer ids it names."""
    return host.owner or host.peer_id.encode()


def independent(hosts: Sequence[Host]) -> int:
    """Independent hosts among `hosts`: distinct keys (one key is one vote, whatever peer id it names)."""
    return len({key_of(h) for h in hosts})


@dataclass
class Downloaded:
    """A downloaded checkpoint, and who served it: its bytes per peer id, and the hosts dropped
    on the way with the reason."""

    data: bytes
    hosts: dict[str, Host]
    served: Counter = field(default_factory=Counter)
    dropped: dict[str, str] = field(default_factory=dict)

    @property
    def host(self) -> Host:
        """The host that served the most of it."""
        return self.hosts[self.served.most_common(1)[0][0]]

    def drop(self, host: Host, reason: str) -> None:
        if host.peer_id not in self.dropped:
            self.dropped[host.peer_id] = reason
            logger.warning("block %d: dropped a host: %s", host.block, reason)


@dataclass
class Progress:
    """How far a download has come, for a caller that judges its pace (measure.py): the event loop's
    time when its first chunk list came in (None before), and the bytes of the list in use received
    and verified so far."""

    listed_at: float | None = None
    verified: int = 0


async def download(
    p2p: P2P,
    hosts: Sequence[Host],
    show_progress: bool = True,
    timings: dict | None = None,
    inactivity_timeout: float = INACTIVITY_TIMEOUT_S,
    progress: Progress | None = None,
) -> Downloaded:
    """The checkpoint that `hosts` (all announcing the same one) vouch for, from as many of them as
    answer, verified (see the module docstring); TransferError if none serves it.
    `timings["header"]` gets the perf_counter of the first stream's header; `progress`, if given,
    follows the download."""
    info = _one_checkpoint(hosts)
    report = Downloaded(b"", {h.peer_id: h for h in hosts})
    fetch = _Options(timings if timings is not None else {}, inactivity_timeout, progress or Progress())
    try:
        async with asyncio.timeout(FIRST_BYTE_TIMEOUT_S + info.size / SLOWEST_RATE_BYTES_S):
            with tqdm(total=info.size, unit="B", unit_scale=True, desc=f"block {hosts[0].block}",
                      disable=not show_progress) as bar:
                report.data = await _download(p2p, hosts, info, report, fetch, bar)
    except TimeoutError:
        raise TransferError(f"the download of {info.sha256[:12]} from {len(hosts)} host(s) timed out") from None
    return report


def _one_checkpoint(hosts: Sequence[Host]) -> CheckpointInfo:
    checkpoints = {h.announcement.checkpoint for h in hosts}
    if len(checkpoints) != 1:
        raise ValueError("a download takes hosts that announce one and the same checkpoint")
    if (info := checkpoints.pop()) is None:
        raise TransferError(f"peer {hosts[0].peer_id} announces no checkpoint")
    return info


@dataclass
class _Options:
    timings: dict
    inactivity_timeout: float
    progress: Progress


async def _download(p2p: P2P, hosts: Sequence[Host], info: CheckpointInfo, report: Downloaded, options: _Options,
                    bar: tqdm) -> bytes:  # fmt: skip
    """Every host asked at once; the fetch goes on with the hosts as `_Lists` hands them out, until
    the whole matches the record's sha256. The hosts still to answer when it does are not waited for."""
    lists = _Lists(p2p, info, report, options, pending=len(hosts))
    asks = [asyncio.create_task(lists.ask(host, run)) for host, run in zip(hosts, _first_runs(info.size, len(hosts)))]
    try:
        return await _download_lists(lists, bar)
    finally:
        for ask in asks:
            ask.cancel()
        await asyncio.gather(*asks, return_exceptions=True)
        for opened in lists.early.values():
            await _discard(opened)


async def _download_lists(lists: _Lists, bar: tqdm) -> bytes:
    """A fetch with the hosts whose list is in, and, if every one of them is dropped, another with
    the hosts that answer later, from the chunks received; until the whole matches the record's sha256."""
    info, report = lists.info, lists.report
    have: dict[int, _Chunk] = {}  # what the fetches before brought, for the next one
    while (picked := await lists.next()) is not None:
        chunk_list, hosts = picked
        bar.reset()
        bar.update(sum(len(chunk.data) for chunk in have.values()))
        fetch = _Fetch(lists.p2p, info, chunk_list, have, report, lists.options, bar)
        await lists.start(fetch, hosts)
        whole = await fetch.run()
        if whole.complete and whole.sha256() == info.sha256:
            for index, source in whole.sources.items():
                report.served[source] += chunk_list.length(index)
            return whole.data()
        if whole.complete:
            lists.refute(fetch)
            break
        have = whole.chunks()  # every host of this fetch was dropped
    reasons = "; ".join(report.dropped.values()) or "no host answered"
    raise TransferError(f"no host served the checkpoint {info.sha256[:12]} verified: {reasons}")


class _Lists:
    """The hosts as their chunk lists come in, and the fetch in use (the module docstring's 2): every
    list that passes `ask_chunk_list` is the one the record names, so a host whose list is in joins
    the fetch in use, or, while there is none, waits for the next."""

    def __init__(self, p2p: P2P, info: CheckpointInfo, report: Downloaded, options: _Options, pending: int):
        self.p2p, self.info, self.report, self.options = p2p, info, report, options
        self.early: dict[str, _Opened] = {}  # each host's first run, asked along with its list, not yet read
        self.chunk_list: ChunkList | None = None  # the record's, once a host reported it
        self.waiting: list[Host] = []  # hosts whose list is in, in no fetch yet
        self.fetch: _Fetch | None = None  # the fetch in use
        self.pending = pending  # hosts still to answer
        self._changed = asyncio.Event()

    async def ask(self, host: Host, first_run: Run) -> None:
        """Ask `host` for its key and its list (and for `first_run` meanwhile), and place it once they
        are in: in the fetch in use, waiting, or dropped."""

        def ask_first_run() -> None:
            key = (host.peer_id, 0)
            self.early[host.peer_id] = _open(self.p2p, host, self.info, key, first_run, self.options.timings)

        chunk_list = None
        try:
            chunk_list = await _chunk_list(self.p2p, host, self.info, self.report, ask_first_run)
        finally:
            self.pending -= 1
        if chunk_list is None:  # dropped: its first run is never read
            unread = self.early.pop(host.peer_id, None)
        else:
            unread = self._place(host, chunk_list)
        self._changed.set()
        if unread is not None:
            await _discard(unread)

    def _place(self, host: Host, chunk_list: ChunkList) -> _Opened | None:
        """`host` joins the fetch in use, or waits for the next; its first run if it will not be read,
        to be given up."""
        assert self.chunk_list in (None, chunk_list), "ask_chunk_list passes only the list the record names"
        self.chunk_list = chunk_list
        if self.fetch is not None and self.fetch.open:
            return self.fetch.join(host, self.early.pop(host.peer_id, None))
        self.waiting.append(host)
        return None  # its first run is read when the next fetch starts

    async def next(self) -> tuple[ChunkList, list[Host]] | None:
        """The list and the hosts for the next fetch: those whose list is in, or, while none is, the
        next to answer; None once every host has answered or failed and none is left."""
        while not self.waiting:
            if not self.pending:
                return None
            self._changed.clear()
            await self._changed.wait()
        hosts, self.waiting = self.waiting, []
        return self.chunk_list, hosts

    async def start(self, fetch: _Fetch, hosts: list[Host]) -> None:
        """`fetch` is the fetch in use, with `hosts`."""
        self.fetch = fetch
        for host in hosts:
            if (unread := fetch.join(host, self.early.pop(host.peer_id, None))) is not None:
                await _discard(unread)

    def refute(self, fetch: _Fetch) -> None:
        """The whole of the record's list did not match its sha256: every host that reports that list lied."""
        for host in [*fetch.joined.values(), *self.waiting]:
            self.report.drop(host, _lied(host))
        self.waiting = []


def _lied(host: Host) -> str:
    return (f"the checkpoint from {host.peer_id} does not match its announced sha256 (its record names the chunk "
            f"list of another file)")  # fmt: skip


def _first_runs(size: int, hosts: int) -> list[Run]:
    """The first run of each host, asked before any chunk list is in: as many chunks as a first
    run of the plan (1/n of them, n the streams of all hosts), host i's from i/hosts of the file."""
    count = chunk_count(size)
    length = max(1, math.ceil(count / (hosts * STREAMS_PER_HOST)))
    starts = [i * count // hosts for i in range(hosts)] + [count]
    return [Run(starts[i], max(starts[i] + 1, min(starts[i] + length, starts[i + 1]))) for i in range(hosts)]


async def _chunk_list(p2p: P2P, host: Host, info: CheckpointInfo, report: Downloaded,
                      ask_first_run: Callable[[], None]) -> ChunkList | None:  # fmt: skip
    """The host's chunk list, if it owns its record and its list fits the record; else None
    (dropped). Its first run is asked meanwhile (`ask_first_run`): its chunks wait for the
    list, and are checked against it as any."""
    await ensure_direct(p2p, host.peer_id)  # a host behind NAT dials us back: a relay cuts streams at 128 KiB
    ask_first_run()
    answers = await asyncio.gather(check_owner(p2p, host, FIRST_BYTE_TIMEOUT_S),
                                   ask_chunk_list(p2p, host, info, FIRST_BYTE_TIMEOUT_S),
                                   return_exceptions=True)  # fmt: skip
    for error in answers:
        if isinstance(error, TransferError):
            report.drop(host, str(error))
            return None
        if isinstance(error, BaseException):  # the peer vanished, timed out, or spoke nonsense
            report.drop(host, f"peer {host.peer_id} failed: {type(error).__name__}: {error}")
            return None
    return answers[1]


class _EndedEarly(HostFailed):
    """A host's stream ended before the run it was asked for: asked again a few times, then dropped."""


class _Opened(NamedTuple):
    """A run asked of a host: its key in the plan, the run, the bytes asked, and the task opening
    its stream (it returns the stream past its header)."""

    key: Hashable
    run: Run
    asked: int
    task: asyncio.Task


class _Chunk(NamedTuple):
    """A chunk that matched the chunk list, and the peer id of the host it came from."""

    data: bytes | memoryview
    source: str


class _Whole:
    """The chunks of one chunk list put together as they come: each chunk that extends the
    prefix received so far is hashed into the whole's sha256 and appended to one buffer, and
    only the chunks that came ahead of the prefix wait apart. So a download holds its bytes
    once, not once in chunks and again joined, and its end hashes and copies only the chunks
    still ahead of the prefix: `io.BytesIO.getvalue()` hands its buffer over (CPython). The
    streams of one host fetch runs spread over the file, so the prefix lags: in one traced
    download of 125 MB from one host, the longest any chunk's arrival took to put together was
    72-75 ms, where joining every chunk at the end took 92-100 ms."""

    def __init__(self, chunk_list: ChunkList):
        self.chunk_list = chunk_list
        self.sources: dict[int, str] = {}  # every chunk in: the peer id of its host
        self._ahead: dict[int, bytes | memoryview] = {}  # chunks in, past the prefix
        self._prefix = io.BytesIO()
        self._sha256 = hashlib.sha256()
        self._assembled = 0  # chunks 0.._assembled-1 are in the prefix

    def __contains__(self, index: int) -> bool:
        return index in self.sources

    @property
    def complete(self) -> bool:
        return self._assembled == self.chunk_list.count

    def add(self, index: int, chunk: bytes | memoryview, source: str) -> None:
        """Chunk `index`, matched against the list, from the host `source` (the first copy of it)."""
        assert index not in self.sources, f"chunk {index} added twice"
        self.sources[index] = source
        self._ahead[index] = chunk
        while (chunk := self._ahead.pop(self._assembled, None)) is not None:
            self._sha256.update(chunk)
            self._prefix.write(chunk)
            self._assembled += 1

    def sha256(self) -> str:
        assert self.complete, "the sha256 of an incomplete download"
        return self._sha256.hexdigest()

    def data(self) -> bytes:
        return self._prefix.getvalue()

    def chunks(self) -> dict[int, _Chunk]:
        """Every chunk in, with its bytes (views of this buffer, not copies): what the next chunk
        list starts from."""
        prefix = memoryview(self._prefix.getvalue())

        def data(index: int) -> bytes | memoryview:
            if index in self._ahead:
                return self._ahead[index]
            return prefix[index * CHUNK_BYTES : index * CHUNK_BYTES + self.chunk_list.length(index)]

        return {index: _Chunk(data(index), source) for index, source in self.sources.items()}


class _Fetch:
    """One pass over one chunk list: the hosts that report it (`join`) stream their runs at once."""

    def __init__(self, p2p: P2P, info: CheckpointInfo, chunk_list: ChunkList, have: dict[int, _Chunk],
                 report: Downloaded, options: _Options, bar: tqdm):  # fmt: skip
        self.p2p, self.info, self.chunk_list = p2p, info, chunk_list
        self.report, self.options, self.bar = report, options, bar
        self.whole = _Whole(chunk_list)
        for index, chunk in sorted(have.items()):
            self.whole.add(index, chunk.data, chunk.source)
        progress = options.progress
        progress.verified = sum(len(chunk.data) for chunk in have.values())
        if progress.listed_at is None:
            progress.listed_at = asyncio.get_running_loop().time()
        self.plan = ChunkPlan(chunk_list.count, STREAMS_PER_HOST, set(have))
        self.joined: dict[str, Host] = {}  # every host that joined
        self.live: dict[str, Host] = {}  # those not dropped
        self.proven: dict[str, asyncio.Event] = {}  # a host sent a chunk that verifies
        self.early: dict[str, _Opened] = {}  # first runs asked along with the lists, not yet read
        self.retries: Counter = Counter()  # streams of a host that ended early and were asked again
        self.keys: dict[str, set] = {}  # the plan's keys of each host's streams
        self.tasks: dict[str, list[asyncio.Task]] = {}
        self.running = 0  # streams not yet ended
        self.finished = asyncio.Event()
        if self.plan.complete:
            self.finished.set()
        self._changed = asyncio.Event()

    @property
    def open(self) -> bool:
        """Whether a host may still join: the pass is not over."""
        return not self.finished.is_set()

    def join(self, host: Host, opened: _Opened | None) -> _Opened | None:
        """`host`, which reports this list, streams from now on. Its first run, asked along with its
        list (`opened`), is read if no chunk of it is in or claimed yet; else it is returned, to be
        given up."""
        peer_id = host.peer_id
        self.joined[peer_id] = self.live[peer_id] = host
        self.proven[peer_id] = asyncio.Event()
        self.keys[peer_id] = {(peer_id, n) for n in range(STREAMS_PER_HOST)}
        if opened is not None and self.plan.unclaimed(opened.run):
            self.plan.assign(opened.key, opened.run)
            self.early[peer_id], opened = opened, None
        self.plan.streams = len(self.live) * STREAMS_PER_HOST
        self.running += STREAMS_PER_HOST
        self.tasks[peer_id] = [asyncio.create_task(self._stream(host, n)) for n in range(STREAMS_PER_HOST)]
        return opened

    async def run(self) -> _Whole:
        """`whole` once every chunk is in, or every host that joined is dropped; no host joins after."""
        try:
            await self.finished.wait()
        finally:
            self.finished.set()
            streams = [task for tasks in self.tasks.values() for task in tasks]
            for task in streams:
                task.cancel()
            await asyncio.gather(*streams, return_exceptions=True)
            for opened in self.early.values():  # first runs of hosts dropped before their streams began
                await _discard(opened)
        return self.whole

    async def _stream(self, host: Host, n: int) -> None:
        """One stream's life: claim a run, fetch it, again, until nothing is missing."""
        key = (host.peer_id, n)
        opened = self.early.pop(host.peer_id, None) if n == 0 else None  # a run asked and not yet read
        try:
            if n:
                await self.proven[host.peer_id].wait()
            while not self.plan.complete:
                if opened is None:
                    if (run := self.plan.claim(key, own=self.keys[host.peer_id])) is None:
                        await self._next_change()
                        continue
                    opened = _open(self.p2p, host, self.info, key, run, self.options.timings)
                current, opened = opened, None
                try:
                    await self._fetch(host, current)
                except _EndedEarly as failure:  # an honest host's stream ends early now and then
                    self.retries[host.peer_id] += 1
                    if self.retries[host.peer_id] > STREAM_RETRIES:
                        raise HostFailed(f"{failure} ({STREAM_RETRIES} times before)") from None
                    logger.info("block %d: %s; asking it again", host.block, failure)
                finally:
                    self.plan.release(current.key)
                    self._notify()
        except HostFailed as failure:
            self._drop(host, str(failure))
        except Exception as error:  # the peer vanished, or spoke nonsense
            self._drop(host, f"peer {host.peer_id} failed: {type(error).__name__}: {error}")
        finally:
            if opened is not None:
                await _discard(opened)
                self.plan.release(opened.key)
            self.running -= 1
            if not self.running:
                self.finished.set()

    async def _fetch(self, host: Host, current: _Opened) -> None:
        """Stream chunks run.next..run.end-1 of `current` from `host` (the run may shrink meanwhile)."""
        run, asked = current.run, current.asked
        try:
            stream = await current.task
        except StopAsyncIteration:  # seen under load from honest hosts: asked again like any early end
            raise _EndedEarly(f"peer {host.peer_id} ended a stream before its header") from None
        try:
            received, index = 0, run.next
            while index < run.end:
                try:
                    chunk = await asyncio.wait_for(anext(stream), self.options.inactivity_timeout)
                except StopAsyncIteration:
                    raise _EndedEarly(f"peer {host.peer_id} sent {received} of the {asked} bytes asked") from None
                except TimeoutError:
                    silent_s = self.options.inactivity_timeout
                    raise HostFailed(f"peer {host.peer_id} sent nothing for {silent_s:.0f}s") from None
                if len(chunk) != self.chunk_list.length(index):  # a reply is a chunk
                    raise HostFailed(f"peer {host.peer_id} sent {len(chunk)} bytes for chunk {index} "
                                     f"of {self.chunk_list.length(index)}")  # fmt: skip
                self._accept(host, current.key, index, chunk)
                received += len(chunk)
                index += 1
        finally:
            await _close(stream)

    def _accept(self, host: Host, key: Hashable, index: int, chunk: bytes) -> None:
        if not self.chunk_list.matches(index, chunk):
            raise HostFailed(
                f"peer {host.peer_id} sent chunk {index}, which does not match its sha256 in the chunk list"
            )
        if index not in self.whole:
            self.whole.add(index, chunk, host.peer_id)
            self.options.progress.verified += len(chunk)
            self.bar.update(len(chunk))
        self.plan.received(key, index)
        self.proven[host.peer_id].set()
        if self.plan.complete:
            self.finished.set()
        self._notify()

    def _drop(self, host: Host, reason: str) -> None:
        """Stop every stream of `host`; its runs go back to the plan for the other hosts."""
        self.report.drop(host, reason)
        if self.live.pop(host.peer_id, None) is None:
            return
        for task in self.tasks[host.peer_id]:
            if task is not asyncio.current_task():
                task.cancel()
        self.plan.streams = max(1, len(self.live) * STREAMS_PER_HOST)
        self._notify()

    async def _next_change(self) -> None:
        await self._changed.wait()

    def _notify(self) -> None:
        """Wake the streams waiting for work (a run came free, or a chunk came in)."""
        self._changed.set()
        self._changed = asyncio.Event()


def _open(p2p: P2P, host: Host, info: CheckpointInfo, key: Hashable, run: Run, timings: dict) -> _Opened:
    """Ask `host` for `run` (claimed under `key`); the stream opens in a task meanwhile."""
    request = DownloadRequest(block=host.block, sha256=info.sha256, first_chunk=run.next, chunks=run.left)
    asked = min(run.end * CHUNK_BYTES, info.size) - run.next * CHUNK_BYTES
    return _Opened(key, run, asked, asyncio.create_task(open_run(p2p, host, request, info.size, timings)))


async def _discard(opened: _Opened) -> None:
    """Give up a run asked and not read (its host dropped, or the download over); the plan
    that held it releases it apart."""
    opened.task.cancel()
    stream = (await asyncio.gather(opened.task, return_exceptions=True))[0]
    if not isinstance(stream, BaseException):
        await _close(stream)


async def _close(stream) -> None:
    try:
        await stream.aclose()
    except Exception as error:  # closing a broken stream must not hide why it broke
        logger.debug("closing a download stream: %s", error)


async def download_verified(
    p2p: P2P, hosts: Sequence[Host], config: ModelConfig, block: int, show_progress: bool = True,
    progress: Progress | None = None,
) -> tuple[Downloaded, Denoiser]:
    """The checkpoint that `hosts` vouch for, from those that answer (see `download`; `progress`
    follows it), if it is what their records say and loads as `block` of `config`: (the download,
    the block); TransferError or SwarmError otherwise."""
    info = _one_checkpoint(hosts)
    if info.size > max_checkpoint_bytes(config):
        raise TransferError(
            f"peer {hosts[0].peer_id} announces {info.size} bytes, more than a block of this model weighs"
        )
    downloaded = await download(p2p, hosts, show_progress, progress=progress)
    denoiser, step = decode_block(downloaded.data, config, block)  # right model, right block, tensors that load
    if step != info.step:
        raise TransferError(
            f"the checkpoint from {sorted(downloaded.served)} holds step {step}, its record says {info.step}"
        )
    return downloaded, denoiser

