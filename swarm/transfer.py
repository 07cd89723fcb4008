"""Block checkpoints between peers: a peer's local store, its P2P service, and the download.

The service streams a checkpoint file in chunks (hivemind messages are capped at 4 MiB),
reusing hivemind's `ExpertUID` / `ExpertResponse` protobufs so that no protocol of ours
needs compiling: the request's uid is "<block>:<sha256>"; the first response carries a
msgpack header ({"ok": true, "size": n} or {"ok": false, "error": "..."}) in `metadata`,
and each later response one chunk of the file's bytes.

The receiver never trusts the sender: it stops reading past the announced size, and
checks size and sha256 against the DHT record before a byte is kept.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from pathlib import Path
from typing import AsyncIterator, Callable

from hivemind.p2p import P2P, PeerID
from hivemind.p2p import P2PContext, ServicerBase
from hivemind.proto import runtime_pb2
from hivemind.utils import MSGPackSerializer
from tqdm import tqdm

from swarm.checkpoint import decode_block, save_block, write_atomic
from swarm.directory import Host
from swarm.errors import SwarmError
from swarm.limits import Busy, PerPeerLimit
from swarm.model import Denoiser, ModelConfig
from swarm.records import CheckpointInfo

logger = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20
DOWNLOADS_PER_PEER = 2  # checkpoint streams one peer may have open here at once
FIRST_BYTE_TIMEOUT_S = 15.0
SLOWEST_RATE_BYTES_S = 128 * 1024  # a download slower than this (1 Mbit/s) is given up


class TransferError(Exception):
    """A download that failed or did not match its record: try another replica."""


class CheckpointStore:
    """A peer's checkpoints of its block: `block_<b>_step_<n>.safetensors`, the newest `keep` kept,
    and older ones too while they are younger than `min_age_s`.

    Keeping older files lets a peer still serve a checkpoint its record named a moment before
    it saved the next ones (a fast peer may save several within one announce period).
    """

    def __init__(
        self, folder: Path, config: ModelConfig, block: int, swarm: str, keep: int = 2, min_age_s: float = 0.0
    ):
        self.folder, self.config, self.block, self.swarm, self.keep = Path(folder), config, block, swarm, keep
        self.min_age_s = min_age_s
        self.folder.mkdir(parents=True, exist_ok=True)
        self._infos: dict[Path, CheckpointInfo] = {}
        for stale in self.folder.glob(f".block_{block}_step_*.tmp"):  # a save that a crash cut short
            stale.unlink(missing_ok=True)

    def _pattern(self) -> re.Pattern:
        return re.compile(rf"^block_{self.block}_step_(\d+)\.safetensors$")

    def _files(self) -> list[tuple[int, Path]]:
        pattern = self._pattern()
        found = [(int(m.group(1)), p) for p in self.folder.iterdir() if (m := pattern.match(p.name))]
        return sorted(found)

    def path_for(self, step: int) -> Path:
        return self.folder / f"block_{self.block}_step_{step}.safetensors"

    def save(self, denoiser: Denoiser, step: int) -> CheckpointInfo:
        written = save_block(self.path_for(step), denoiser, self.config, self.block, step, self.swarm)
        info = CheckpointInfo(step=step, sha256=written.sha256, size=written.size)
        self._infos[self.path_for(step)] = info
        self._prune()
        return info

    def adopt(self, data: bytes, info: CheckpointInfo) -> Path:
        """Keep a verified checkpoint that came from another peer."""
        path = self.path_for(info.step)
        write_atomic(path, data)
        self._infos[path] = info
        self._prune()
        return path

    def _prune(self) -> None:
        now = time.time()
        for _, old in self._files()[: -self.keep]:
            if now - old.stat().st_mtime >= self.min_age_s:  # announced a moment ago? others may be fetching it
                old.unlink(missing_ok=True)
                self._infos.pop(old, None)

    def info(self, path: Path) -> CheckpointInfo:
        if path not in self._infos:
            data = path.read_bytes()
            step = int(self._pattern().match(path.name).group(1))
            self._infos[path] = CheckpointInfo(step=step, sha256=hashlib.sha256(data).hexdigest(), size=len(data))
        return self._infos[path]

    def latest(self) -> tuple[Path, CheckpointInfo] | None:
        files = self._files()
        return (files[-1][1], self.info(files[-1][1])) if files else None

    def find(self, sha256: str) -> Path | None:
        for _, path in reversed(self._files()):
            if self.info(path).sha256 == sha256:
                return path
        return None


class BlockServicer(ServicerBase):
    """A peer's P2P handlers: `rpc_info` (what it hosts; also the ping) and `rpc_download`."""

    def __init__(self, block: int, store: CheckpointStore, info: Callable[[], dict]):
        self.block, self.store, self._info = block, store, info
        self.limit = PerPeerLimit(DOWNLOADS_PER_PEER)

    async def rpc_info(self, request: runtime_pb2.ExpertUID, context: P2PContext) -> runtime_pb2.ExpertInfo:
        return runtime_pb2.ExpertInfo(serialized_info=MSGPackSerializer.dumps(self._info()))

    async def rpc_download(
        self, request: runtime_pb2.ExpertUID, context: P2PContext
    ) -> AsyncIterator[runtime_pb2.ExpertResponse]:
        block, _, sha256 = request.uid.partition(":")
        path = self.store.find(sha256) if block == str(self.block) else None
        if path is None:
            yield _header({"ok": False, "error": f"no checkpoint of block {block} with sha256 {sha256[:12]}"})
            return
        try:
            with self.limit.admit(context):
                async for message in _stream_file(path):
                    yield message
        except Busy as error:
            yield _header({"ok": False, "error": str(error)})


async def _stream_file(path: Path) -> AsyncIterator[runtime_pb2.ExpertResponse]:
    """A header with the size, then the file in chunks."""
    with open(path, "rb") as f:  # an open file survives a later atomic replace
        size = f.seek(0, 2)
        f.seek(0)
        yield _header({"ok": True, "size": size})
        while chunk := f.read(CHUNK_BYTES):
            yield runtime_pb2.ExpertResponse(metadata=chunk)


def _header(content: dict) -> runtime_pb2.ExpertResponse:
    return runtime_pb2.ExpertResponse(metadata=MSGPackSerializer.dumps(content))


async def download(p2p: P2P, host: Host, show_progress: bool = True, timings: dict | None = None) -> bytes:
    """The checkpoint a host announced, verified against its record; TransferError otherwise."""
    info = host.announcement.checkpoint
    if info is None:
        raise TransferError(f"peer {host.peer_id} announces no checkpoint")
    stub = BlockServicer.get_stub(p2p, PeerID.from_base58(host.peer_id))
    try:
        async with asyncio.timeout(FIRST_BYTE_TIMEOUT_S + info.size / SLOWEST_RATE_BYTES_S):
            await check_owner(p2p, host, FIRST_BYTE_TIMEOUT_S)
            stream = await asyncio.wait_for(
                stub.rpc_download(runtime_pb2.ExpertUID(uid=f"{host.block}:{info.sha256}")), FIRST_BYTE_TIMEOUT_S
            )
            data = await _receive(stream, info, host, show_progress, timings if timings is not None else {})
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
    stub = BlockServicer.get_stub(p2p, PeerID.from_base58(host.peer_id))
    reply = await stub.rpc_info(runtime_pb2.ExpertUID(uid="owner"), timeout=timeout)
    if not owns_record(MSGPackSerializer.loads(reply.serialized_info), host):
        raise TransferError(f"peer {host.peer_id} does not own the record that names it: an impostor wrote it")


def owns_record(info: object, host: Host) -> bool:
    """Whether a peer's rpc_info answer shows the key `host`'s record was written under (a Host
    made locally, without an owner, is taken as is)."""
    return not host.owner or (isinstance(info, dict) and info.get("owner") == host.owner)


async def _receive(stream, info: CheckpointInfo, host: Host, show_progress: bool, timings: dict) -> bytes:
    """The announced bytes after the header; `timings` gets the perf_counter of the header."""
    header = MSGPackSerializer.loads((await anext(stream)).metadata)
    timings["header"] = time.perf_counter()
    if not isinstance(header, dict) or not header.get("ok"):
        raise TransferError(f"peer {host.peer_id} refused: {header.get('error') if isinstance(header, dict) else header}")
    received = bytearray()
    with tqdm(total=info.size, unit="B", unit_scale=True, desc=f"block {host.block}", disable=not show_progress) as bar:
        async for message in stream:
            received += message.metadata
            bar.update(len(message.metadata))
            if len(received) > info.size:
                raise TransferError(f"peer {host.peer_id} sent more than the announced {info.size} bytes")
    if len(received) != info.size:
        raise TransferError(f"peer {host.peer_id} sent {len(received)} bytes, announced {info.size}")
    return bytes(received)


async def fetch_verified(
    p2p: P2P, hosts: list[Host], config: ModelConfig, block: int, show_progress: bool = True
) -> tuple[bytes, Host]:
    """The first checkpoint among `hosts` (in the given order) that downloads and verifies."""
    for host in hosts:
        try:
            data = await download(p2p, host, show_progress)
            decode_block(data, config, block)  # right model, right block, tensors that load
            return data, host
        except (TransferError, SwarmError) as error:
            logger.warning("block %d: %s; trying the next replica", block, error)
    raise SwarmError(f"block {block}: no replica served a checkpoint that verifies ({len(hosts)} tried)")
