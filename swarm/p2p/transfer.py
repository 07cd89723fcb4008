"""Block checkpoints between peers: a peer's P2P service (`rpc_info`, `rpc_download`) and the download.

The service streams a checkpoint file in chunks (hivemind messages are capped at 4 MiB): the
request's metadata is a `DownloadRequest`, the first response's metadata a `DownloadHeader`
(the size, or why not), and each later response carries one chunk of the file's bytes.

The receiver never trusts the sender: it stops reading past the announced size, and
checks size and sha256 against the DHT record before a byte is kept.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from pathlib import Path
from typing import AsyncIterator, Callable

import torch
from hivemind.p2p import P2P, P2PContext, PeerID, ServicerBase
from hivemind.proto import runtime_pb2
from tqdm import tqdm

from swarm.errors import SwarmError
from swarm.model.checkpoint import decode_block
from swarm.model.denoiser import Denoiser, ModelConfig, build_block
from swarm.p2p.directory import Host
from swarm.p2p.limits import Busy, PerPeerLimit
from swarm.p2p.messages import DownloadHeader, DownloadRequest, MessageError, PeerInfo
from swarm.p2p.records import CheckpointInfo
from swarm.p2p.store import CheckpointStore

logger = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20
DOWNLOADS_PER_PEER = 2  # checkpoint streams one peer may have open here at once
FIRST_BYTE_TIMEOUT_S = 15.0
INACTIVITY_TIMEOUT_S = 15.0  # a stream that sends nothing for this long is given up, whatever its size
SLOWEST_RATE_BYTES_S = 128 * 1024  # a download slower than this on average (1 Mbit/s) is given up
HEADER_SLACK_BYTES = 256 * 1024  # a block file's safetensors header and metadata stay far below this


class TransferError(Exception):
    """A download that failed or did not match its record: try another replica."""


class BlockServicer(ServicerBase):
    """A peer's P2P handlers: `rpc_info` (what it hosts; also the ping) and `rpc_download`."""

    def __init__(self, block: int, store: CheckpointStore, info: Callable[[], PeerInfo]):
        self.block, self.store, self._info = block, store, info
        self.limit = PerPeerLimit(DOWNLOADS_PER_PEER)

    async def rpc_info(self, request: runtime_pb2.ExpertUID, context: P2PContext) -> runtime_pb2.ExpertInfo:
        return runtime_pb2.ExpertInfo(serialized_info=self._info().encode())

    async def rpc_download(
        self, request: runtime_pb2.ExpertRequest, context: P2PContext
    ) -> AsyncIterator[runtime_pb2.ExpertResponse]:
        try:
            asked = DownloadRequest.decode(request.metadata)
        except MessageError as error:
            yield _header(DownloadHeader(error=str(error)))
            return
        path = self.store.find(asked.sha256) if asked.block == self.block else None
        if path is None:
            yield _header(DownloadHeader(error=f"no checkpoint of block {asked.block} with sha256 {asked.sha256[:12]}"))
            return
        try:
            with self.limit.admit(context):
                async for message in _stream_file(path):
                    yield message
        except Busy as error:
            yield _header(DownloadHeader(error=str(error)))


async def _stream_file(path: Path) -> AsyncIterator[runtime_pb2.ExpertResponse]:
    """A header with the size, then the file in chunks."""
    with open(path, "rb") as f:  # an open file survives a later atomic replace
        size = f.seek(0, 2)
        f.seek(0)
        yield _header(DownloadHeader(size=size))
        while chunk := f.read(CHUNK_BYTES):
            yield runtime_pb2.ExpertResponse(metadata=chunk)


def _header(header: DownloadHeader) -> runtime_pb2.ExpertResponse:
    return runtime_pb2.ExpertResponse(metadata=header.encode())


async def ask_info(p2p: P2P, peer_id: str, timeout: float) -> PeerInfo:
    """A peer's `rpc_info` answer; raises (MessageError, TimeoutError, a P2P error) if there is none."""
    stub = BlockServicer.get_stub(p2p, PeerID.from_base58(peer_id))
    reply = await stub.rpc_info(runtime_pb2.ExpertUID(uid="info"), timeout=timeout)
    return PeerInfo.decode(reply.serialized_info)


def max_checkpoint_bytes(config: ModelConfig) -> int:
    """The most a block checkpoint of this config can weigh: its float32 tensors and a header.
    An announced size above it is a lie, and is never downloaded."""
    with torch.device("meta"):
        tensor_bytes = sum(t.numel() * 4 for t in build_block(config, 0).state_dict().values())
    return tensor_bytes + HEADER_SLACK_BYTES


async def download(
    p2p: P2P, host: Host, show_progress: bool = True, timings: dict | None = None, inactivity_timeout: float = INACTIVITY_TIMEOUT_S
) -> bytes:
    """The checkpoint a host announced, verified against its record; TransferError otherwise.

    Gives up when no byte comes for `inactivity_timeout` seconds, and when the whole takes
    longer than the announced size allows at the slowest rate we accept (callers bound the
    announced size first: see `max_checkpoint_bytes`)."""
    info = host.announcement.checkpoint
    if info is None:
        raise TransferError(f"peer {host.peer_id} announces no checkpoint")
    stub = BlockServicer.get_stub(p2p, PeerID.from_base58(host.peer_id))
    request = runtime_pb2.ExpertRequest(metadata=DownloadRequest(block=host.block, sha256=info.sha256).encode())
    try:
        async with asyncio.timeout(FIRST_BYTE_TIMEOUT_S + info.size / SLOWEST_RATE_BYTES_S):
            await check_owner(p2p, host, FIRST_BYTE_TIMEOUT_S)
            stream = await asyncio.wait_for(stub.rpc_download(request), FIRST_BYTE_TIMEOUT_S)
            data = await _receive(stream, info, host, show_progress, timings if timings is not None else {}, inactivity_timeout)
    except TimeoutError:
        raise TransferError(f"download from {host.peer_id} timed out") from None
    except TransferError:
        raise
    except Exception as error:  # the peer vanished, refused, or spoke nonsense
        raise TransferError(f"download from {host.peer_id} failed: {type(error).__name__}: {error}") from None
    if hashlib.sha256(data).hexdigest() != info.sha256:
        raise TransferError(f"checkpoint from {host.peer_id} does not match its announced sha256")
    return data


async def check_owner(p2p: P2P, host: Host, timeout: float) -> None:
    """TransferError unless the peer named by a record holds the key the record was written
    under (libp2p authenticates the peer we reach, so a record cannot borrow another's id)."""
    if not owns_record(await ask_info(p2p, host.peer_id, timeout), host):
        raise TransferError(f"peer {host.peer_id} does not own the record that names it: an impostor wrote it")


def owns_record(info: PeerInfo, host: Host) -> bool:
    """Whether a peer's rpc_info answer shows the key `host`'s record was written under (a Host
    made locally, without an owner, is taken as is)."""
    return not host.owner or info.owner == host.owner


async def _receive(
    stream, info: CheckpointInfo, host: Host, show_progress: bool, timings: dict, inactivity_timeout: float
) -> bytes:
    """The announced bytes after the header; `timings` gets the perf_counter of the header."""
    header = DownloadHeader.decode((await anext(stream)).metadata)
    timings["header"] = time.perf_counter()
    if header.error:
        raise TransferError(f"peer {host.peer_id} refused: {header.error}")
    received = bytearray()
    with tqdm(total=info.size, unit="B", unit_scale=True, desc=f"block {host.block}", disable=not show_progress) as bar:
        while True:
            try:
                message = await asyncio.wait_for(anext(stream), inactivity_timeout)
            except StopAsyncIteration:
                break
            except TimeoutError:
                raise TransferError(f"peer {host.peer_id} sent nothing for {inactivity_timeout:.0f}s") from None
            received += message.metadata
            bar.update(len(message.metadata))
            if len(received) > info.size:
                raise TransferError(f"peer {host.peer_id} sent more than the announced {info.size} bytes")
    if len(received) != info.size:
        raise TransferError(f"peer {host.peer_id} sent {len(received)} bytes, announced {info.size}")
    return bytes(received)


async def download_verified(
    p2p: P2P, host: Host, config: ModelConfig, block: int, show_progress: bool = True
) -> tuple[bytes, Denoiser]:
    """A host's checkpoint that is what its record says and loads as `block` of `config`:
    (its bytes, the block); TransferError or SwarmError otherwise."""
    info = host.announcement.checkpoint
    if info is not None and info.size > max_checkpoint_bytes(config):
        raise TransferError(f"peer {host.peer_id} announces {info.size} bytes, more than a block of this model weighs")
    data = await download(p2p, host, show_progress)
    denoiser, step = decode_block(data, config, block)  # right model, right block, tensors that load
    if step != info.step:
        raise TransferError(f"checkpoint from {host.peer_id} holds step {step}, its record says {info.step}")
    return data, denoiser


async def fetch_verified(
    p2p: P2P, hosts: list[Host], config: ModelConfig, block: int, show_progress: bool = True
) -> tuple[bytes, Host]:
    """The first checkpoint among `hosts` (in the given order) that downloads and verifies."""
    for host in hosts:
        try:
            data, _ = await download_verified(p2p, host, config, block, show_progress)
            return data, host
        except (TransferError, SwarmError) as error:
            logger.warning("block %d: %s; trying the next replica", block, error)
    raise SwarmError(f"block {block}: no replica served a checkpoint that verifies ({len(hosts)} tried)")
