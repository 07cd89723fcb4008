"""Lying peers, for the trust tests and `benchmarks/attacks.py`: each attack a user could mount
with the project's own code, or with a few lines around hivemind.

- a step liar: a `swarm-peer` whose checkpoint folder holds a garbage block (weights blown up)
  or a poisoned one (trained on shuffled bytes) stamped with a step of its choosing
  (`plant_checkpoint`);
- `HostileNode`: a real DHT node in this process under its own key, which announces what it
  likes and answers P2P calls with the servicers below:
  - `TricklingDownloads`: a checkpoint stream that announces a size and sends a byte now and then;
  - `WrongAnswers`: remote denoising that answers for the checkpoint it claims, wrongly;
  - `LyingSyncReplies`: sync replies that are garbage, off-schema, or claim a step far ahead;
  - `HostileReplica`: a DeMo replica that sends, each step, a payload made from an honest one:
    negated, at the largest values allowed, or random signs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import random
from pathlib import Path
from typing import AsyncIterator, Callable, Iterator

import msgpack
import torch
from hivemind.p2p import P2PContext
from hivemind.proto import runtime_pb2
from hivemind.utils.crypto import RSAPrivateKey

from swarm.model.checkpoint import save_block
from swarm.model.data import Corpus, load_corpus
from swarm.model.denoiser import Denoiser, ModelConfig, build_block
from swarm.model.train import TrainConfig, block_trainer
from swarm.p2p.directory import SwarmDirectory
from swarm.p2p.messages import DownloadHeader, PayloadReply, PayloadRequest, PeerInfo
from swarm.p2p.network import EventLoopThread, NetworkOptions, start_dht, stop_child
from swarm.p2p.records import BlockAnnouncement, CheckpointInfo
from swarm.p2p.transfer import BlockServicer
from swarm.serving.server import DenoiseServicer
from swarm.sync.decoupled_momentum import DeMoConfig, DeMoReplica, decode_payload, encode_payload
from swarm.sync.exchange import PayloadServicer, gather

STEP_LIE = 999_999


def garbage_block(config: ModelConfig, block: int, scale: float = 50.0) -> Denoiser:
    """A block of the right shapes whose weights are blown up: confidently wrong answers."""
    denoiser = build_block(config, block)
    with torch.no_grad():
        for param in denoiser.parameters():
            param.mul_(scale).add_(torch.randn_like(param))
    return denoiser


def shuffled_corpus(source: str | None, folder: Path) -> Corpus:
    """A corpus with the bytes of every paragraph of `source` shuffled: right statistics, no language."""
    corpus, rng = load_corpus(source), random.Random(0)
    paragraphs = []
    for stream in (corpus.train, corpus.validation):
        for paragraph in bytes(stream.tolist()).split(b"\n\n"):
            shuffled = bytearray(paragraph)
            rng.shuffle(shuffled)
            paragraphs.append(bytes(shuffled))
    path = folder / "shuffled.txt"
    path.write_bytes(b"\n\n".join(p for p in paragraphs if p))
    return load_corpus(str(path))


def poisoned_block(config: ModelConfig, block: int, source: str | None, folder: Path, steps: int) -> Denoiser:
    """A block trained as honestly as any on text whose bytes were shuffled: plausible, useless."""
    windows = shuffled_corpus(source, folder).windows("train", config.seq_len)
    trainer = block_trainer(config, block, windows, TrainConfig(steps=steps, batch_size=16, seed=7))
    for _ in range(steps):
        trainer.step()
    return trainer.module


def plant_checkpoint(folder: Path, denoiser: Denoiser, config: ModelConfig, block: int, step: int, swarm: str) -> Path:
    """Put a block into a peer's checkpoint folder as its newest checkpoint, stamped `step`."""
    path = Path(folder) / f"block_{block}_step_{step}.safetensors"
    save_block(path, denoiser, config, block, step, swarm)
    return path


class HostileNode:
    """A DHT node in this process, under a key of its own, with a P2P handle for its servicers."""

    def __init__(self, swarm: str, initial_peers: list[str]):
        self.swarm, self.key = swarm, RSAPrivateKey()
        self.dht = start_dht(swarm, NetworkOptions(initial_peers=list(initial_peers)), self.key)
        self.loop = EventLoopThread(name="hostile-loop")
        self.p2p = self.loop.run(self.dht.replicate_p2p(), 30)
        self.directory = SwarmDirectory(self.dht, swarm, self.key)
        self.peer_id = self.dht.peer_id.to_base58()

    def __enter__(self) -> "HostileNode":
        return self

    def __exit__(self, *exc) -> None:
        self.loop.close(self.p2p)
        stop_child(self.dht, self.dht.shutdown)

    def serve(self, *servicers) -> None:
        for servicer in servicers:
            self.loop.run(servicer.add_p2p_handlers(self.p2p), 30)

    def announce(self, block: int, lifetime_s: float = 600.0, **fields) -> None:
        """Write (signed, under its own key) an announcement for `block` with the given fields."""
        announcement = BlockAnnouncement(peer_id=self.peer_id, **{"state": "training", "step": 0, **fields})
        assert self.directory.announce(block, announcement, lifetime_s, wait=True), "the DHT refused the record"

    def info(self, block: int) -> PeerInfo:
        return PeerInfo(block=block, owner=self.directory.owner_subkey)


class _Impersonating:
    """Registers its handlers under the name of the service it imitates (hivemind names a
    handler after its class), so that clients reach it as they would an honest peer's."""

    imitates: type

    @classmethod
    def _get_handle_name(cls, namespace: str | None, method_name: str) -> str:
        return cls.imitates._get_handle_name(namespace, method_name)


class TricklingDownloads(_Impersonating, BlockServicer):
    """Answers every download with the header of a huge file and then one byte per `every_s`."""

    imitates = BlockServicer

    def __init__(self, block: int, info: Callable[[], PeerInfo], every_s: float = 1.0):
        super().__init__(block, store=None, info=info)
        self.every_s = every_s

    async def rpc_download(self, request: runtime_pb2.ExpertRequest, context: P2PContext) -> AsyncIterator:
        yield runtime_pb2.ExpertResponse(metadata=DownloadHeader(size=2**33).encode())
        while True:
            await asyncio.sleep(self.every_s)
            yield runtime_pb2.ExpertResponse(metadata=b"\0")


class WrongAnswers(_Impersonating, DenoiseServicer):
    """Serves a checkpoint it claims (an honest one's sha256) with other weights."""

    imitates = DenoiseServicer

    def __init__(self, config: ModelConfig, block: int, claimed_sha256: str):
        super().__init__(config, block)
        self.serve(garbage_block(config, block, scale=1.0), claimed_sha256)


class LyingSyncReplies(_Impersonating, PayloadServicer):
    """Answers sync polls in turn with garbage, off-schema maps, and a step far ahead."""

    imitates = PayloadServicer

    def __init__(self, block: int):
        super().__init__(block, deadline=5.0)
        self.replies = itertools.cycle([
            b"\xff\x00 not msgpack",
            msgpack.packb({"status": "ok", "payload": 12, "fingerprint": "text", "newest_step": "many"}),
            msgpack.packb(["a", "list"]),
            PayloadReply(status="gone", newest_step=10**12).encode(),
        ])  # fmt: skip

    async def rpc_payload(self, request: runtime_pb2.ExpertRequest, context: P2PContext) -> runtime_pb2.ExpertResponse:
        return runtime_pb2.ExpertResponse(metadata=next(self.replies))


class HostileReplica(_Impersonating, PayloadServicer):
    """A DeMo replica that, asked for step t, fetches an honest replica's step-t payload and sends
    it back perturbed (`mode`: "negated", "max-values" or "random-signs", as large as allowed; or
    "nan", which no honest check lets through)."""

    imitates = PayloadServicer
    MODES = ("negated", "max-values", "random-signs", "nan")

    def __init__(self, node: HostileNode, config: ModelConfig, block: int, de_mo: DeMoConfig, lr: float, mode: str):
        super().__init__(block, deadline=5.0)
        assert mode in self.MODES, mode
        self.node, self.mode = node, mode
        self.replica = DeMoReplica(build_block(config, block), de_mo, lr)
        self.rng = torch.Generator().manual_seed(0)

    async def _payload(self, request: runtime_pb2.ExpertRequest) -> PayloadReply:
        step = PayloadRequest.decode(request.metadata).step
        hosts = await asyncio.get_running_loop().run_in_executor(None, self.node.directory.hosts, self.block)
        honest = [h.peer_id for h in hosts if h.peer_id != self.node.peer_id]
        gathered = await gather(self.node.p2p, self.block, step, honest, self.deadline)
        if not gathered.payloads:
            return PayloadReply(status="not yet", newest_step=step)
        honest = decode_payload(next(iter(gathered.payloads.values())), self.replica)
        bits = self.replica.config.value_bits
        return PayloadReply(status="ok", payload=encode_payload(dict(self._perturbed(honest)), bits),
                            fingerprint=b"hostile!", newest_step=step)  # fmt: skip

    def _perturbed(self, payload: dict) -> Iterator:
        largest = 0.95 * (1.0 if self.replica.config.value_bits == 1 else self.replica.max_value)
        for name, sent in payload.items():
            values = sent.values.float()
            if self.mode == "negated":
                values = -values
            elif self.mode == "max-values":
                values = -values.sign() * largest
            elif self.mode == "nan":
                values = torch.full_like(values, float("nan"))
            else:
                values = (torch.randint(0, 2, values.shape, generator=self.rng) * 2 - 1).float() * values.abs().clamp(min=1e-8)
            yield name, dataclasses.replace(sent, values=values.to(sent.values.dtype))


def checkpoint_of(info: CheckpointInfo) -> dict:
    """The fields of a checkpoint record, to announce someone else's checkpoint as one's own."""
    return {"checkpoint": info, "step": info.step}
