"""Block checkpoints between peers: a peer's P2P service, and the calls a downloader makes to one host.

The service (`BlockServicer`) answers two calls (who the peer is, `rpc_info`, is
swarm/p2p/info.py's):
- `rpc_chunk_list` (unary): the checkpoint's size and the sha256 of each of its chunks
  (`ChunkListRequest` in, `ChunkListReply` out; chunks.py);
- `rpc_download` (a stream): a run of the checkpoint's chunks. The request's metadata is a
  `DownloadRequest` (which checkpoint, which chunks), the first response's a `DownloadHeader`
  (the file's size, or why not), and the later responses carry the run's bytes, one chunk each.
  Both ends read this stream themselves, in hivemind's framing but with a bound (framing.py):
  the host takes a request of at most `REQUEST_BYTES` (`BlockServicer._serve_download`), the
  downloader a reply of at most `REPLY_BYTES` (`DownloadReplies`); hivemind's own stream
  handler and reader would buffer a message of any length announced.
A downloader reads `STREAMS_PER_HOST` of these from one host at once (one stream moves at most
its libp2p window per round trip; in the lab of benchmarks/transfer.py, 8 streams fill a 100
Mbit/s link at 80 ms better than 4); each caller may hold `DOWNLOADS_PER_PEER` (twice that)
open at once, so that a stream that just ended, still counted here a moment, never makes the
next one wait as busy: enough to fill a long fat link, few enough that one caller cannot take
a host's uplink from the rest.

A downloader believes none of it: `ask_chunk_list` checks the list against the record (its size,
and its sha256, which the record names: `CheckpointInfo.chunks`), download.py every chunk against
the list and the whole against the record's sha256. Nor does it wait on a host without
end: the calls that ask again while a host answers "busy" (`ask_chunk_list`, `open_run`) take one
deadline across all their tries, so a host that answers "busy" just before each timeout costs one
timeout, not one per try (issue 57).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import torch
from google.protobuf.message import DecodeError
from hivemind.p2p import P2P, P2PContext, PeerID, ServicerBase
from hivemind.p2p.p2p_daemon_bindings.datastructures import StreamInfo
from hivemind.proto import runtime_pb2
from hivemind.proto.p2pd_pb2 import RPCError

from swarm.checkpoints.chunks import CHUNK_BYTES, MAX_CHUNKS, ChunkList, chunk_count, list_sha256
from swarm.checkpoints.framing import FramingError, read_frame
from swarm.checkpoints.store import CheckpointStore
from swarm.model.denoiser import ModelConfig, build_block
from swarm.p2p.directory import Host
from swarm.p2p.info import ask_info, owns_record
from swarm.p2p.limits import NOT_A_MEMBER, OPEN, Busy, CallerGate, PerPeerLimit
from swarm.p2p.messages import (
    ChunkListReply,
    ChunkListRequest,
    DownloadHeader,
    DownloadRequest,
    MessageError,
)
from swarm.p2p.records import CheckpointInfo

logger = logging.getLogger(__name__)

STREAMS_PER_HOST = 8  # chunk streams a downloader reads from one host at once
# chunk streams (and list requests) one peer may have open here at once: room for those just ended, still counted
# a moment
DOWNLOADS_PER_PEER = 2 * STREAMS_PER_HOST
FIRST_BYTE_TIMEOUT_S = 15.0
INACTIVITY_TIMEOUT_S = 15.0  # a stream that sends nothing for this long is given up, whatever its size
# a host gives up a caller that reads nothing for this long: a downloader leaves a host's first run
# unread until that host's key and chunk list are in (within FIRST_BYTE_TIMEOUT_S, busy tries included)
READER_PATIENCE_S = 4 * FIRST_BYTE_TIMEOUT_S
SLOWEST_RATE_BYTES_S = 128 * 1024  # a download slower than this on average (1 Mbit/s) is given up
HEADER_SLACK_BYTES = 256 * 1024  # a block file's safetensors header and metadata stay far below this
BUSY_RETRIES = 5  # a stream refused as busy is asked again this many times (a closed one frees its slot a moment later)
BUSY_WAIT_S = 0.2
BUSY_REPLY_S = 1.0  # a stream refused as busy is given this long to send its request and take the reply
REQUEST_BYTES = 1024  # the largest rpc_download request read: a DownloadRequest and its protobuf framing
REPLY_BYTES = CHUNK_BYTES + 1024  # the largest rpc_download reply read: a chunk and its protobuf framing
DOWNLOAD = "rpc_download"


class TransferError(Exception):
    """A download that failed or did not match its record: try another replica."""


class HostFailed(TransferError):
    """One host of a download failed or lied: drop it, fetch its chunks elsewhere."""


class BlockServicer(ServicerBase):
    """A peer's checkpoint handlers: `rpc_chunk_list` and `rpc_download` (see the module docstring)."""

    def __init__(self, block: int, store: CheckpointStore, gate: CallerGate = OPEN):
        """`gate`: who is answered at all (members only, in a members-only swarm: swarm/p2p/gate.py)."""
        self.block, self.store, self.gate = block, store, gate
        self.limit = PerPeerLimit(DOWNLOADS_PER_PEER)
        self._own_id: PeerID | None = None  # of the P2P instance it serves on

    async def rpc_chunk_list(
        self, request: runtime_pb2.ExpertRequest, context: P2PContext
    ) -> runtime_pb2.ExpertResponse:
        if not await self.gate.admits(context.remote_id):
            return runtime_pb2.ExpertResponse(metadata=ChunkListReply(error=NOT_A_MEMBER).encode())
        try:
            with self.limit.admit(context):
                asked = ChunkListRequest.decode(request.metadata)
                path = self._path(asked.block, asked.sha256)
                size = path.stat().st_size
                if chunk_count(size) > MAX_CHUNKS:
                    raise LookupError(f"a checkpoint of {size} bytes is more than a chunk list can describe")
                reply = ChunkListReply(size=size, hashes=self._chunk_list_of(path))
        except Busy as error:
            reply = ChunkListReply(error=str(error), busy=True)
        except (MessageError, LookupError, OSError) as error:
            reply = ChunkListReply(error=str(error))
        return runtime_pb2.ExpertResponse(metadata=reply.encode())

    async def add_p2p_handlers(self, p2p: P2P, wrapper: object | None = None, *, namespace: str | None = None,
                               balanced: bool = False) -> None:  # fmt: skip
        """`rpc_chunk_list` through hivemind; `rpc_download` as a stream of our own
        (`_serve_download`), whose request is read with a bound."""
        await super().add_p2p_handlers(p2p, wrapper, namespace=namespace, balanced=balanced)
        self._own_id = p2p.peer_id
        await p2p.add_binary_stream_handler(self._get_handle_name(namespace, DOWNLOAD), self._serve_download, balanced)

    async def _serve_download(
        self, stream: StreamInfo, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """One `rpc_download` stream, counted against its caller's limit from the moment it opens
        (a caller that opens streams and sends nothing holds slots too); past the limit it is
        answered busy at once; a caller the gate refuses is answered with that refusal."""
        context = P2PContext(handle_name=DOWNLOAD, local_id=self._own_id, remote_id=stream.peer_id)
        with contextlib.closing(writer):
            if not await self.gate.admits(stream.peer_id):
                await _refuse(reader, writer, DownloadHeader(error=NOT_A_MEMBER))
                return
            try:
                with self.limit.admit(context):
                    await self._serve_stream(context, reader, writer)
            except Busy as error:
                await _refuse(reader, writer, DownloadHeader(error=str(error), busy=True))

    async def _serve_stream(
        self, context: P2PContext, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Its request and the end-of-stream mark after it (taken only if each announces at most
        `REQUEST_BYTES` and comes in time: a stream closed with bytes unread is reset, and a reset
        can overtake the last replies), then the replies of `_download`, each sent in time, until
        they end or the caller closes the stream."""
        try:
            async with asyncio.timeout(FIRST_BYTE_TIMEOUT_S):
                error, body = await read_frame(reader, REQUEST_BYTES)
                ended, _ = await read_frame(reader, REQUEST_BYTES)
            if error or not ended:
                return
            request = runtime_pb2.ExpertRequest.FromString(body)
        except (TimeoutError, FramingError, DecodeError, asyncio.IncompleteReadError, ConnectionError) as failure:
            logger.debug("refused a download stream from %s: %s", context.remote_id, failure)
            return
        gone = asyncio.create_task(reader.read(1))  # the stream's end (or more bytes): the caller is done
        replying = asyncio.create_task(self._send_replies(request, context, writer))
        try:
            await asyncio.wait({gone, replying}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (gone, replying):
                task.cancel()
            ended = await asyncio.gather(gone, replying, return_exceptions=True)  # a reset stream fails both
            if isinstance(ended[1], Exception):
                logger.debug("a download stream to %s ended: %s", context.remote_id, ended[1])

    async def _send_replies(
        self, request: runtime_pb2.ExpertRequest, context: P2PContext, writer: asyncio.StreamWriter
    ) -> None:
        """The replies of `_download`, each sent within `READER_PATIENCE_S` (a caller that reads
        nothing for that long is given up; the download's generator is closed here, so its slot
        and file are let go at once)."""
        async with contextlib.aclosing(self._download(request, context)) as replies:
            async for reply in replies:
                await asyncio.wait_for(P2P.send_protobuf(reply, writer), READER_PATIENCE_S)

    async def _download(
        self, request: runtime_pb2.ExpertRequest, context: P2PContext
    ) -> AsyncIterator[runtime_pb2.ExpertResponse]:
        try:
            asked = DownloadRequest.decode(request.metadata)
            path = self._path(asked.block, asked.sha256)
        except (MessageError, LookupError) as error:
            yield _header(DownloadHeader(error=str(error)))
            return
        async for message in self._stream_run(path, asked.first_chunk, asked.chunks):
            yield message

    def _path(self, block: int, sha256: str) -> Path:
        path = self.store.find(sha256) if block == self.block else None
        if path is None:
            raise LookupError(f"no checkpoint of block {block} with sha256 {sha256[:12]}")
        return path

    def _chunk_list_of(self, path: Path) -> bytes:
        """The chunk list served for the file at `path`: the store's, hashed along with the record
        it wrote or read (a lying servicer forges it: swarm/lab/attacks.py)."""
        return self.store.chunk_list(path)

    async def _stream_run(self, path: Path, first: int, chunks: int) -> AsyncIterator[runtime_pb2.ExpertResponse]:
        """A header with the file's size, then chunks first..first+chunks-1 (as many as there are)."""
        with open(path, "rb") as f:  # an open file survives a later atomic replace
            size = f.seek(0, 2)
            if first >= chunk_count(size):
                yield _header(DownloadHeader(error=f"the checkpoint has no chunk {first}"))
                return
            yield _header(DownloadHeader(size=size))
            for index in range(first, min(first + chunks, chunk_count(size))):
                f.seek(index * CHUNK_BYTES)
                yield runtime_pb2.ExpertResponse(metadata=self._chunk(index, f.read(CHUNK_BYTES)))

    def _chunk(self, index: int, data: bytes) -> bytes:
        """The bytes sent for chunk `index` (a lying servicer changes them: swarm/lab/attacks.py)."""
        return data


def _header(header: DownloadHeader) -> runtime_pb2.ExpertResponse:
    return runtime_pb2.ExpertResponse(metadata=header.encode())


async def _refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, header: DownloadHeader) -> None:
    """A refusal (busy: a stream past its caller's limit; or not a member) as the stream's header,
    once its request and end-of-stream mark are read (within `BUSY_REPLY_S`, each at most
    `REQUEST_BYTES`): a stream closed with bytes unread is reset, and the reset could cut the
    caller off before it read why."""
    with contextlib.suppress(ConnectionError, TimeoutError, FramingError, asyncio.IncompleteReadError):
        async with asyncio.timeout(BUSY_REPLY_S):
            await read_frame(reader, REQUEST_BYTES)
            await read_frame(reader, REQUEST_BYTES)
            await P2P.send_protobuf(_header(header), writer)


async def check_owner(p2p: P2P, host: Host, timeout: float) -> None:
    """TransferError unless the peer named by a record holds the key the record was written
    under (libp2p authenticates the peer we reach, so a record cannot borrow another's id)."""
    if not owns_record(await ask_info(p2p, host.peer_id, timeout), host):
        raise TransferError(f"peer {host.peer_id} does not own the record that names it: an impostor wrote it")


def max_checkpoint_bytes(config: ModelConfig) -> int:
    """The most a block checkpoint of this config can weigh: its float32 tensors and a header.
    An announced size above it is a lie, and is never downloaded."""
    with torch.device("meta"):
        tensor_bytes = sum(t.numel() * 4 for t in build_block(config, 0).state_dict().values())
    return tensor_bytes + HEADER_SLACK_BYTES


async def ask_chunk_list(p2p: P2P, host: Host, info: CheckpointInfo, timeout: float) -> ChunkList:
    """The chunk list `host` reports for the checkpoint `info`, if it describes a file of the
    announced size and is the list the record names (its sha256 is `info.chunks`); HostFailed
    otherwise, and if no answer but "busy" came within `timeout` (one deadline for every try).
    A host that copies an honest record and answers first with a forged list is dropped here,
    before its list leads a download (issue 57)."""
    stub = BlockServicer.get_stub(p2p, PeerID.from_base58(host.peer_id))
    request = runtime_pb2.ExpertRequest(metadata=ChunkListRequest(block=host.block, sha256=info.sha256).encode())
    async with _busy_deadline(host, "chunk list", timeout):
        for attempt in range(BUSY_RETRIES + 1):  # busy: our last download's streams may still hold its slots
            reply = ChunkListReply.decode((await stub.rpc_chunk_list(request, timeout=timeout)).metadata)
            if not reply.busy:
                break
            await asyncio.sleep(BUSY_WAIT_S * (attempt + 1))
    if reply.error:
        raise HostFailed(f"peer {host.peer_id} refused: {reply.error}")
    if reply.size != info.size:
        more = "more" if reply.size > info.size else "fewer"
        raise HostFailed(f"peer {host.peer_id} lists {reply.size} bytes, {more} than the announced {info.size}")
    if list_sha256(reply.hashes) != info.chunks:
        raise HostFailed(f"peer {host.peer_id} reports a chunk list whose sha256 is not the one its record names")
    try:
        return ChunkList(reply.size, reply.hashes)
    except ValueError as error:
        raise HostFailed(f"peer {host.peer_id}: {error}") from None


@contextlib.asynccontextmanager
async def _busy_deadline(host: Host, what: str, seconds: float) -> AsyncIterator[None]:
    """One deadline for a call and the tries it makes again while `host` says busy: HostFailed past it.
    A fresh timeout per try would let a host that answers "busy" just before each one hold the
    caller for every try (issue 57: 6 tries of 15 s)."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        raise HostFailed(f"peer {host.peer_id} sent no {what} within {seconds:.0f}s (busy tries included)") from None


async def open_run(p2p: P2P, host: Host, request: DownloadRequest, size: int, timings: dict,
                   timeout: float = FIRST_BYTE_TIMEOUT_S) -> DownloadReplies:  # fmt: skip
    """The chunks `request` asks `host` for, a reply's bytes at a time, past its header (asked
    again while the host says busy, all within `timeout`); HostFailed if the host refuses, sends no
    header in time, or announces another size. `timings["header"]` gets the perf_counter of the
    first header."""
    async with _busy_deadline(host, "download header", timeout):
        for attempt in range(BUSY_RETRIES + 1):
            stream = await download_replies(p2p, host.peer_id, request)
            try:
                header = DownloadHeader.decode(await anext(stream))
            except BaseException:  # no header in time, or a malformed one: the stream is ours to close
                await stream.aclose()
                raise
            if not header.busy:
                break
            await stream.aclose()
            await asyncio.sleep(BUSY_WAIT_S * (attempt + 1))
    if header.error:
        await stream.aclose()
        raise HostFailed(f"peer {host.peer_id} refused: {header.error}")
    if header.size != size:
        await stream.aclose()
        raise HostFailed(f"peer {host.peer_id} sends {header.size} bytes, not the announced {size}")
    timings.setdefault("header", time.perf_counter())
    return stream


async def download_replies(p2p: P2P, peer_id: str, request: DownloadRequest) -> DownloadReplies:
    """Open an `rpc_download` stream to `peer_id` with `request` (as hivemind's client would:
    the request, then its end-of-stream mark): its replies' bytes, as they come (`DownloadReplies`)."""
    handle = BlockServicer._get_handle_name(None, DOWNLOAD)
    _, reader, writer = await p2p.call_binary_stream_handler(PeerID.from_base58(peer_id), handle)
    try:
        await P2P.send_protobuf(runtime_pb2.ExpertRequest(metadata=request.encode()), writer)
        await P2P.send_protobuf(P2P.END_OF_STREAM, writer)
    except BaseException:
        writer.close()
        raise
    return DownloadReplies(peer_id, reader, writer)


class DownloadReplies:
    """The replies on an open `rpc_download` stream, each read only if it announces at most
    `REPLY_BYTES` (HostFailed otherwise, and for an error reply or one that does not parse);
    it ends where the stream does, and `aclose()` closes the stream."""

    def __init__(self, peer_id: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.peer_id, self.reader, self.writer = peer_id, reader, writer

    def __aiter__(self) -> DownloadReplies:
        return self

    async def __anext__(self) -> bytes:
        try:
            error, body = await read_frame(self.reader, REPLY_BYTES)
            if error:
                raise HostFailed(f"peer {self.peer_id} failed: {RPCError.FromString(body).message[:200]}")
            return runtime_pb2.ExpertResponse.FromString(body).metadata
        except asyncio.IncompleteReadError:  # the stream ended (one cut mid-reply ends there too)
            raise StopAsyncIteration from None
        except FramingError as error:
            raise HostFailed(f"peer {self.peer_id} {error}") from None
        except DecodeError:
            raise HostFailed(f"peer {self.peer_id} sent a reply that does not parse") from None

    async def aclose(self) -> None:
        self.writer.close()
