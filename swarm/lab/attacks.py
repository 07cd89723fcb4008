"""Lying peers, for the trust tests and `benchmarks/attacks.py`: each attack a user could mount
with the project's own code, or with a few lines around hivemind.

- a step liar: a `swarm-peer` whose checkpoint folder holds a garbage block (weights blown up),
  a poisoned one (trained on shuffled bytes) or a degraded copy of an honest one
  (`degraded_block`: worse by a chosen margin, still plausible), maybe then tuned to the windows
  a spot check measures (`tuned_to`), stamped with a step of its choosing (`plant_checkpoint`);
  many distinct checkpoints made of one block for a flood of keys (`distinct_copies`);
  blocks that are not finite (`nan_weight_block`) or whose loss is not
  (`overflowing_block`), for a `HostileNode` to serve (`HostileNode.serve_checkpoint`);
- `HostileNode`: a real DHT node in this process under its own key (swarm/lab/hosting.py), which
  announces what it likes and answers P2P calls with the servicers below (`serving_nodes`: many of
  them, each under its own key, serving a checkpoint each; `sybil_nodes`: serving one checkpoint):
  - `TricklingDownloads`: checkpoint streams that announce a size and send a byte now and then;
  - `BusyJustInTime`: a key announcing another host's checkpoint that answers every chunk list and
    download "busy", just before the caller's timeout, so that it is asked again and again (issue 57);
  - `GiantReplies`: checkpoint streams whose reply announces a gigabyte and keeps coming;
  - `CorruptChunks`: a host of an honest checkpoint that changes a byte of every chunk it sends,
    with the honest chunk list or one forged to match what it sends;
  - `ForgedListThenTrickle`: a key announcing another host's checkpoint that answers its chunk list
    first, with a forged one, then sends that list's chunks just within the caller's patience (issue 57);
  - `WrongAnswers`: remote denoising that answers for the checkpoint it claims, wrongly;
  - `HonestThenWrong`: the same, once it has answered a few requests honestly (checks that stop
    after a replica's first answers miss it);
  - `LyingSyncReplies`: sync replies that are garbage, off-schema, or claim a step far ahead
    (`LyingSyncReplies.step_claims`: only the claim of step `STEP_CLAIM`);
  - `RefusedPayloads`: sync replies whose payload no replica can decode, with a fingerprint
    that says the replicas drifted apart, at once or just before the asker's deadline;
  - `JumpClaims`: sync replies that say "gone, the newest step is the one asked plus 1000" to
    every other poll, and junk in time to the others (refused, so from then on not waited for; its
    asks go on past each gather and bring the claims): with a second key doing the same, a majority
    ahead from the first claim on;
  - `HostileReplica`: a DeMo replica that trains like an honest one and sends, each step, its
    own update (under a fingerprint of its own, which tells the others they drifted), negated,
    at the largest values allowed against it, with random signs, or NaN;
  - `EmptyPayloads`: a key that answers each step at once with a DeMo payload naming no parameter
    (it decodes, and votes 0 everywhere);
  - `NegatedEcho`: a key that answers each step with the honest replicas' payload of that step,
    fetched from them, negated (two such keys outvoted a lone replica in a vote that counted keys);
  - `MergePoisoner`: a `HostileReplica` sending honest updates that, at the merge step the
    peers' `--average-every` sets, announces and serves a poisoned checkpoint of that step.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import dataclasses
import functools
import itertools
import random
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path

import msgpack
import torch
from hivemind.p2p import P2P, P2PContext
from hivemind.proto import runtime_pb2

from swarm.checkpoints.chunks import CHUNK_BYTES, HASH_BYTES, chunk_count, chunk_hashes, list_sha256
from swarm.checkpoints.spot_check import SpotCheck
from swarm.checkpoints.store import CheckpointStore
from swarm.checkpoints.transfer import FIRST_BYTE_TIMEOUT_S, INACTIVITY_TIMEOUT_S, BlockServicer
from swarm.lab.hosting import InProcessNode
from swarm.model.checkpoint import save_block
from swarm.model.data import Corpus, Windows, load_corpus
from swarm.model.denoiser import Denoiser, ModelConfig, build_block
from swarm.model.steps import Sampling
from swarm.model.train import TrainConfig, block_trainer
from swarm.p2p.info import InfoServicer
from swarm.p2p.limits import PerPeerLimit
from swarm.p2p.messages import ChunkListReply, DownloadHeader, PayloadReply, PayloadRequest
from swarm.p2p.records import BlockAnnouncement, CheckpointInfo
from swarm.serving.server import DenoiseServicer
from swarm.sync.decoupled_momentum import DeMoConfig, DeMoOptimizer, decode_payload, encode_payload
from swarm.sync.exchange import MAX_JUMP_STEPS
from swarm.sync.transport import PayloadServicer, gather

STEP_LIE = 999_999
STEP_CLAIM = 10**12  # the step a lying sync reply claims
LEAVING_RECORD_S = 7200.0  # longer than any record a stranger here writes (at most an hour)
POISON_AHEAD_STEPS = 3  # how many steps before the merge step a `MergePoisoner` announces its checkpoint


def garbage_block(config: ModelConfig, block: int, scale: float = 50.0) -> Denoiser:
    """A block of the right shapes whose weights are blown up: confidently wrong answers."""
    denoiser = build_block(config, block)
    with torch.no_grad():
        for param in denoiser.parameters():
            param.mul_(scale).add_(torch.randn_like(param))
    return denoiser


def nan_weight_block(config: ModelConfig, block: int) -> Denoiser:
    """A fresh block with one weight NaN (issue 26, item 5: once fetched and joined)."""
    denoiser = build_block(config, block)
    with torch.no_grad():
        next(denoiser.parameters()).view(-1)[7] = float("nan")
    return denoiser


def overflowing_block(config: ModelConfig, block: int) -> Denoiser:
    """A block with finite weights whose outputs overflow: its spot-check loss is NaN, which every
    `>` comparison lets through (issue 26, item 5)."""
    denoiser = build_block(config, block)
    with torch.no_grad():
        denoiser.norm_out.weight[0::2] = 3e38
        denoiser.norm_out.weight[1::2] = -3e38
    assert all(torch.isfinite(p).all() for p in denoiser.parameters())
    return denoiser


def shuffled_corpus(source: str | None, folder: Path) -> Corpus:
    """A corpus with the characters of every paragraph of `source` shuffled (characters, not bytes,
    so that it stays UTF-8): the right letter statistics, no language."""
    corpus, rng = load_corpus(source), random.Random(0)
    paragraphs = []
    for stream in (corpus.train, corpus.validation):
        for paragraph in stream.numpy().tobytes().decode("utf-8", errors="ignore").split("\n\n"):
            characters = list(paragraph)
            rng.shuffle(characters)
            paragraphs.append("".join(characters))
    path = folder / "shuffled.txt"
    path.write_text("\n\n".join(p for p in paragraphs if p.strip()), encoding="utf-8")
    return load_corpus(str(path))


def poisoned_block(config: ModelConfig, block: int, source: str | None, folder: Path, steps: int) -> Denoiser:
    """A block trained as honestly as any on text whose bytes were shuffled: plausible, useless."""
    windows = shuffled_corpus(source, folder).windows("train", config)
    trainer = block_trainer(config, block, windows, TrainConfig(steps=steps, batch_size=16, seed=7))
    for _ in range(steps):
        trainer.step()
    return trainer.module


def relative_noise(block: Denoiser, seed: int) -> list[torch.Tensor]:
    """One fixed draw of noise (per `seed`) for each weight of `block`, relative to its tensor's RMS."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(p.shape, generator=generator) * p.detach().pow(2).mean().sqrt() for p in block.parameters()]


def noisy_copy(block: Denoiser, noise: Sequence[torch.Tensor], scale: float) -> Denoiser:
    """A copy of `block` with `noise` (`relative_noise`) times `scale` added to its weights."""
    copied = copy.deepcopy(block)
    with torch.no_grad():
        for param, draw in zip(copied.parameters(), noise, strict=True):
            param.add_(draw, alpha=scale)
    return copied


def degraded_block(honest: Denoiser, loss_of: Callable[[Denoiser], float], worse_by: float, seed: int = 0) -> Denoiser:
    """A copy of `honest` with noise in every weight (relative to each tensor's RMS, one fixed draw),
    scaled by bisection so that its loss (`loss_of`: the spot check's, say; its windows are the
    public validation split) is at least `worse_by` nats per byte above the honest block's, and
    about that much. A checkpoint that looks like any other (finite weights, a loss between the
    honest one's and a uniform guess's, so it passes every check made of it alone) and is worse
    than the one it would replace: only a comparison with the honest candidate can refuse it."""
    noisy = functools.partial(noisy_copy, honest, relative_noise(honest, seed))
    target = loss_of(honest) + worse_by
    low, high = 0.0, 0.125
    while loss_of(noisy(high)) < target:
        low, high = high, 2 * high
        if high >= 1e3:  # an assert would vanish under python -O and the loop would never end
            raise ValueError(f"no noise scale makes the block {worse_by} nats per byte worse")
    for _ in range(10):  # the loss grows with the scale: bisect to within 1/1000 of `high`
        middle = (low + high) / 2
        low, high = (middle, high) if loss_of(noisy(middle)) < target else (low, middle)
    return noisy(high)


def distinct_copies(block: Denoiser, count: int, scale: float = 1e-3) -> list[Denoiser]:
    """`count` copies of `block`, each with noise of its own draw (`relative_noise`, seeds 1 to `count`:
    not `degraded_block`'s default draw) `scale` times each weight's RMS: other weights, so as many other
    checkpoints, that measure as `block` does within the spot check's noise. One block is all a stranger
    needs to flood a block's candidates with distinct checkpoints (issue 46), a key each."""
    return [noisy_copy(block, relative_noise(block, seed), scale) for seed in range(1, count + 1)]


def tuned_to(block: Denoiser, check: SpotCheck, config: ModelConfig, index: int, beat: float,
             keep_above: tuple[SpotCheck, float] | None = None, steps: int = 300, lr: float = 3e-3) -> Denoiser:
    """A copy of `block` tuned on the very windows and noise draws of `check` (`SpotCheck.objective`)
    until `check` scores it below `beat`, or `steps` run out: issue 46's stranger, who computed which
    windows a spot check measures. With `keep_above` (another check, of the stranger's own, and a
    loss), it keeps the block at least that bad there meanwhile: bad on text the check does not read."""
    tuned = copy.deepcopy(block).train()
    optimizer = torch.optim.Adam(tuned.parameters(), lr=lr)
    for _ in range(steps):
        bad_enough = keep_above is None or keep_above[0].measure(tuned, config, index) >= keep_above[1] - 0.01
        if bad_enough and check.measure(tuned, config, index) < beat:
            break
        optimizer.zero_grad(set_to_none=True)
        loss = check.objective(tuned, config, index)
        if keep_above is not None:  # aimed a little above, so that it stops near the loss asked
            loss = loss + torch.relu(keep_above[1] + 0.02 - keep_above[0].objective(tuned, config, index))
        loss.backward()
        optimizer.step()
    return tuned.eval()


def plant_checkpoint(folder: Path, denoiser: Denoiser, config: ModelConfig, block: int, step: int, swarm: str) -> Path:
    """Put a block into a peer's checkpoint folder as its newest checkpoint, stamped `step`."""
    path = Path(folder) / f"block_{block}_step_{step}.safetensors"
    save_block(path, denoiser, config, block, step, swarm)
    return path


class HostileNode(InProcessNode):
    """A DHT node in this process, under a key of its own, that announces what it likes."""

    def announce(self, block: int, lifetime_s: float = 600.0, **fields) -> None:
        """Write (signed, under its own key) an announcement for `block` with the given fields.

        Tries up to three times, as an honest peer's next announce period would: hivemind reports
        a store as refused when the last replica to answer did, even where others kept it (seen
        once in CI on a freshly joined node)."""
        announcement = BlockAnnouncement(peer_id=self.peer_id, **{"state": "training", "step": 0, **fields})
        stored = any(self.directory.announce(block, announcement, lifetime_s, wait=True) for _ in range(3))
        assert stored, "the DHT refused the record three times"

    def leave(self, block: int) -> None:
        """Mark its record of `block` as leaving, which readers skip, as an honest peer does when it
        stops: the liar of one scenario is not in the next one's way. The DHT keeps the entry that
        expires last, so this one outlives every record the lab's strangers write."""
        leaving = BlockAnnouncement(peer_id=self.peer_id, state="leaving", step=0)
        self.directory.announce(block, leaving, lifetime_s=LEAVING_RECORD_S, wait=True)

    def serve_checkpoint(self, store: CheckpointStore, info: CheckpointInfo, *servicers,
                         taken_from: tuple[str, ...] = ()) -> None:  # fmt: skip
        """Serve `store`'s checkpoints for download (and `rpc_info`, and `servicers`) and announce
        `info`, one of them, as the checkpoint it serves; `taken_from`: the lineage its record names
        (`BlockAnnouncement.taken_from`), as a joiner that adopted `info` from those voices announces."""
        self.serve(InfoServicer(lambda: self.info(store.block)), BlockServicer(store.block, store), *servicers)
        self.announce(store.block, state="serving", taken_from=taken_from, **checkpoint_of(info))


Served = tuple[CheckpointStore, CheckpointInfo, Denoiser]  # a checkpoint of a store, and its weights to denoise with


@contextlib.contextmanager
def serving_nodes(swarm: str, initial_peers: Sequence[str], served: Sequence[Served],
                  config: ModelConfig) -> Iterator[list[HostileNode]]:  # fmt: skip
    """A node for each (store, info, denoiser) of `served`, under a key (and peer id) of its own, that
    announces checkpoint `info` of `store` and serves it, for download and for denoising with
    `denoiser`. When the `with` ends, each record says its node left, so that the strangers are in
    no later scenario's way."""
    with contextlib.ExitStack() as stack:
        nodes = [stack.enter_context(HostileNode(swarm, initial_peers)) for _ in served]
        for node, (store, info, denoiser) in zip(nodes, served, strict=True):
            stack.callback(node.leave, store.block)  # before the node closes (the stack runs backwards)
            denoising = DenoiseServicer(config, store.block)
            denoising.swap_in(denoiser, info.sha256)
            node.serve_checkpoint(store, info, denoising)
        yield nodes


def sybil_nodes(swarm: str, initial_peers: Sequence[str], store: CheckpointStore, info: CheckpointInfo,
                denoiser: Denoiser, config: ModelConfig,
                keys: int) -> contextlib.AbstractContextManager[list[HostileNode]]:  # fmt: skip
    """`keys` nodes serving checkpoint `info` of `store` (`serving_nodes`), so that their answers
    agree: free identities vouching for one checkpoint (issue 27)."""
    return serving_nodes(swarm, initial_peers, [(store, info, denoiser)] * keys, config)


class Impersonating:
    """Registers its handlers under the name of the service it imitates (hivemind names a
    handler after its class), so that clients reach it as they would an honest peer's."""

    imitates: type

    @classmethod
    def _get_handle_name(cls, namespace: str | None, method_name: str) -> str:
        return cls.imitates._get_handle_name(namespace, method_name)


class BusyJustInTime(Impersonating, BlockServicer):
    """Issue 57's staller. Under a key of its own it announces an honest host's checkpoint (it owns its
    record, so it passes the owner check), and answers every chunk list and every download stream
    "busy", each `stall_s` after it was asked: by default just before the caller's first-byte timeout
    (`FIRST_BYTE_TIMEOUT_S`), so that a caller that asks again on busy with a fresh timeout each try
    asks again and again, and one that waits for every host's list waits for it. `asked` and
    `answered` count the calls of each kind ("chunk_list", "download") as they come and as they are
    answered."""

    imitates = BlockServicer

    def __init__(self, block: int, store: CheckpointStore | None = None, stall_s: float = FIRST_BYTE_TIMEOUT_S - 1.0):
        super().__init__(block, store)
        self.stall_s = stall_s
        self.limit = PerPeerLimit(0)  # past its stall, every call is answered busy
        self.asked: collections.Counter = collections.Counter()
        self.answered: collections.Counter = collections.Counter()

    async def rpc_chunk_list(self, request: runtime_pb2.ExpertRequest,
                             context: P2PContext) -> runtime_pb2.ExpertResponse:  # fmt: skip
        await self._stall("chunk_list")
        return await super().rpc_chunk_list(request, context)

    async def _serve_download(self, stream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._stall("download")
        except BaseException:  # stopped while it stalled: the stream is still its to close
            writer.close()
            raise
        await super()._serve_download(stream, reader, writer)

    async def _stall(self, call: str) -> None:
        self.asked[call] += 1
        await asyncio.sleep(self.stall_s)
        self.answered[call] += 1


class TricklingDownloads(Impersonating, BlockServicer):
    """Lists a file of `size` bytes (a huge one by default) for any checkpoint it is asked for, and
    answers every download with its header and then a chunk's reply, one byte per `every_s`.
    The list it reports is `hashes` (another host's, copied: anyone may ask a host for its list),
    all zeros by default; a record names its sha256 (`chunks`) for the list to pass, so that what a
    downloader meets is the trickle. `asked` counts the chunk lists and download streams it was asked for."""

    imitates = BlockServicer

    def __init__(self, block: int, every_s: float = 1.0, size: int = 2**33, hashes: bytes | None = None):
        super().__init__(block, store=None)
        self.every_s, self.size = every_s, size
        self.hashes = bytes(HASH_BYTES * chunk_count(size)) if hashes is None else hashes
        self.asked = 0

    @property
    def chunks(self) -> str:
        """The sha256 of the list it reports: what its record names (`CheckpointInfo.chunks`)."""
        return list_sha256(self.hashes)

    async def rpc_chunk_list(
        self, request: runtime_pb2.ExpertRequest, context: P2PContext
    ) -> runtime_pb2.ExpertResponse:
        self.asked += 1
        return runtime_pb2.ExpertResponse(metadata=ChunkListReply(size=self.size, hashes=self.hashes).encode())

    async def _send_replies(
        self, request: runtime_pb2.ExpertRequest, context: P2PContext, writer: asyncio.StreamWriter
    ) -> None:
        self.asked += 1
        await P2P.send_protobuf(runtime_pb2.ExpertResponse(metadata=DownloadHeader(size=self.size).encode()), writer)
        chunk = runtime_pb2.ExpertResponse(metadata=bytes(CHUNK_BYTES)).SerializeToString()
        # a chunk's reply, a byte at a time
        writer.write(P2P.MESSAGE_MARKER + len(chunk).to_bytes(P2P.HEADER_LEN, P2P.BYTEORDER))
        for byte in chunk:
            await asyncio.sleep(self.every_s)
            writer.write(bytes([byte]))
            await writer.drain()


class GiantReplies(Impersonating, BlockServicer):
    """Lists and owns its checkpoints honestly, but answers every download with a reply that
    announces `length` bytes (hivemind's framing, written raw) and then sends `sends` bytes of it
    and holds the stream open: a reader that believes the announced length buffers all it gets."""

    imitates = BlockServicer

    def __init__(self, block: int, store: CheckpointStore, length: int = 2**30,
                 sends: int = 16 * 2**20):  # fmt: skip
        super().__init__(block, store)
        self.length, self.sends = length, sends

    async def _serve_download(self, _, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(P2P.MESSAGE_MARKER + self.length.to_bytes(P2P.HEADER_LEN, P2P.BYTEORDER))
            for _ in range(self.sends // CHUNK_BYTES):
                writer.write(bytes(CHUNK_BYTES))
                await writer.drain()
            await reader.read()  # until the reader gives up and closes the stream
        except ConnectionError:  # it did
            pass
        finally:
            writer.close()


class CorruptChunks(Impersonating, BlockServicer):
    """Serves the checkpoints in its store (honest ones, which its record may vouch for) with the
    first byte of every chunk flipped. Its chunk list is the honest one, or with `forge_list` the
    list of the bytes it sends, so that each chunk matches the list it gave: then the sha256 of the
    list its record names gives it away (`CheckpointInfo.chunks`), or, under a record that names the
    forged list, the sha256 of the whole."""

    imitates = BlockServicer

    def __init__(self, block: int, store: CheckpointStore, forge_list: bool = False):
        super().__init__(block, store)
        self.forge_list = forge_list
        self.sent = 0  # chunks it sent: what a downloader let it cost

    def _chunk(self, index: int, data: bytes) -> bytes:
        self.sent += 1
        return bytes([data[0] ^ 0xFF]) + data[1:]

    def _chunk_list_of(self, path: Path) -> bytes:
        if not self.forge_list:
            return super()._chunk_list_of(path)
        data = bytearray(path.read_bytes())
        data[::CHUNK_BYTES] = bytes(b ^ 0xFF for b in data[::CHUNK_BYTES])  # what _chunk sends
        return chunk_hashes(bytes(data))


class ForgedListThenTrickle(CorruptChunks):
    """Issue 57's forged first list. Under a key of its own it announces an honest host's checkpoint
    (the honest record, copied: it owns its record, so it passes the owner check), answers its chunk
    list at once with a forged one (`CorruptChunks` with `forge_list`: each chunk it sends matches
    it), and sends each stream's chunks one per `every_s`, by default just within the caller's
    inactivity timeout: a download that follows its list is held until its deadline, and the sha256
    of the whole refuses the result only then. `sent` counts the chunks it sent."""

    def __init__(self, block: int, store: CheckpointStore, every_s: float = INACTIVITY_TIMEOUT_S - 1.0):
        super().__init__(block, store, forge_list=True)
        self.every_s = every_s

    async def _stream_run(self, path: Path, first: int, chunks: int) -> AsyncIterator[runtime_pb2.ExpertResponse]:
        async with contextlib.aclosing(super()._stream_run(path, first, chunks)) as replies:
            async for reply in replies:  # the header at once, then a wait before each chunk is read
                yield reply
                await asyncio.sleep(self.every_s)


class WrongAnswers(Impersonating, DenoiseServicer):
    """Serves a checkpoint it claims (an honest one's sha256) with other weights."""

    imitates = DenoiseServicer

    def __init__(self, config: ModelConfig, block: int, claimed_sha256: str):
        super().__init__(config, block)
        self.swap_in(garbage_block(config, block, scale=1.0), claimed_sha256)


class HonestThenWrong(Impersonating, DenoiseServicer):
    """Serves a checkpoint it claims with its true weights (`weights`, those of `claimed_sha256`)
    for its first `honest` answers, then with other weights."""

    imitates = DenoiseServicer

    def __init__(self, config: ModelConfig, block: int, weights: Denoiser, claimed_sha256: str, honest: int):
        super().__init__(config, block)
        self.swap_in(weights, claimed_sha256)
        self.wrong = garbage_block(config, block, scale=1.0).eval()
        self.honest, self.answered = honest, 0

    def _run(self, denoiser: Denoiser, prefix: torch.Tensor, state: torch.Tensor, schedule: torch.Tensor,
             seed: int, sampling: Sampling) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        self.answered += 1
        if self.answered > self.honest:
            denoiser = self.wrong
        return super()._run(denoiser, prefix, state, schedule, seed, sampling)


class LyingSyncReplies(Impersonating, PayloadServicer):
    """Answers sync polls in turn with `replies`: by default garbage, off-schema maps, and a step
    far ahead (`STEP_CLAIM`)."""

    imitates = PayloadServicer
    STEP_CLAIM_REPLY = PayloadReply(status="gone", newest_step=STEP_CLAIM).encode()

    def __init__(self, block: int, replies: Sequence[bytes] = ()):
        super().__init__(block, deadline=5.0)
        self.replies = itertools.cycle(replies or [
            b"\xff\x00 not msgpack",
            msgpack.packb({"status": "ok", "payload": 12, "fingerprint": "text", "newest_step": "many"}),
            msgpack.packb(["a", "list"]),
            self.STEP_CLAIM_REPLY,
        ])  # fmt: skip

    @classmethod
    def step_claims(cls, block: int) -> LyingSyncReplies:
        """One that answers every poll with the claim of step `STEP_CLAIM` (issue 26, item 3)."""
        return cls(block, [cls.STEP_CLAIM_REPLY])

    async def rpc_payload(self, request: runtime_pb2.ExpertRequest, context: P2PContext) -> runtime_pb2.ExpertResponse:
        return runtime_pb2.ExpertResponse(metadata=next(self.replies))


class RefusedPayloads(Impersonating, PayloadServicer):
    """Answers every poll with a well-formed reply for the step asked, whose payload no replica can
    decode, under a fingerprint unlike any honest replica's. Were the fingerprint of a refused
    payload believed, the replicas would think they had drifted apart (issue 26, item 2). With
    `delay_s` it answers that late: just before an asker's deadline, junk that came in time kept
    its key waited for in full on every step (issue 57)."""

    imitates = PayloadServicer

    def __init__(self, block: int, delay_s: float = 0.0):
        super().__init__(block, deadline=5.0)
        self.delay_s = delay_s

    async def _payload(self, request: runtime_pb2.ExpertRequest) -> PayloadReply:
        step = PayloadRequest.decode(request.metadata).step
        await asyncio.sleep(self.delay_s)
        return PayloadReply(status="ok", payload=b"\x93 not a payload", fingerprint=b"drifted!", newest_step=step)


class JumpClaims(Impersonating, PayloadServicer):
    """Answers every poll for an odd step t with "gone, the newest step is t + `ahead`" (`MAX_JUMP_STEPS`:
    the most one jump takes), and for an even one with a payload (junk, refused when decoded: from then
    on it is not waited for, swarm/sync/transport.py, and its "gone" answers come through the asks that
    go on past each gather, and stand until the replica nears the step they name). Two such keys are
    a majority of a lone replica's fellows every other step: before its jumps had a budget over its
    life, they moved its step 1000 a step (issue 57)."""

    imitates = PayloadServicer

    def __init__(self, block: int, ahead: int = MAX_JUMP_STEPS):
        super().__init__(block, deadline=5.0)
        self.ahead = ahead

    async def _payload(self, request: runtime_pb2.ExpertRequest) -> PayloadReply:
        step = PayloadRequest.decode(request.metadata).step
        if step % 2 == 0:
            return PayloadReply(status="ok", payload=b"junk", fingerprint=b"\0" * 8, newest_step=step)
        return PayloadReply(status="gone", newest_step=step + self.ahead)


class HostileReplica(Impersonating, PayloadServicer):
    """A replica that trains as an honest one does (its own batches, its own DeMo momentum, the
    gathered updates applied) but sends, each step, its own update perturbed (`mode`): as it is
    ("honest"), negated, at the largest values allowed against its own direction, or with random
    signs; or NaN, which no honest check lets through. Its fingerprint is its own, so replicas
    that accept its payloads see that they drifted apart (and merge at the next round). It
    answers step t once it has computed it."""

    imitates = PayloadServicer
    MODES = ("honest", "negated", "max-values", "random-signs", "nan")
    KEEP = 8  # steps answered for late askers

    def __init__(self, node: HostileNode, config: ModelConfig, block: int, de_mo: DeMoConfig, lr: float,
                 mode: str, windows: Windows):  # fmt: skip
        super().__init__(block, deadline=5.0)
        assert mode in self.MODES, mode
        self.node, self.mode = node, mode
        self.trainer = block_trainer(config, block, windows, TrainConfig(lr=lr, steps=100_000, batch_size=16, seed=11))
        self.optimizer = DeMoOptimizer(self.trainer.module, de_mo, lr)
        self.rng = torch.Generator().manual_seed(0)
        self.sent: dict[int, bytes] = {}
        self._stepping = asyncio.Lock()

    async def _payload(self, request: runtime_pb2.ExpertRequest) -> PayloadReply:
        step = PayloadRequest.decode(request.metadata).step
        async with self._stepping:
            if step not in self.sent:
                await self._take_step(step)
        return PayloadReply(status="ok", payload=self.sent[step], fingerprint=b"hostile!", newest_step=step)

    async def _take_step(self, step: int) -> None:
        """Compute its own update of `step`, keep the perturbed one to send, then learn from the
        honest replicas' updates of that step and its own true one, as an honest replica would."""
        loop = asyncio.get_running_loop()
        own = await loop.run_in_executor(None, self._own_payload, step)
        self.sent[step] = encode_payload(dict(self._perturbed(own)), self.optimizer.config.value_bits)
        for old in [s for s in self.sent if s <= step - self.KEEP]:
            del self.sent[old]
        hosts = await loop.run_in_executor(None, self.node.directory.hosts, self.block)
        others = [h.peer_id for h in hosts if h.peer_id != self.node.peer_id]
        gathered = await gather(self.node.p2p, self.block, step, others, self.deadline)
        honest = [(peer_id, decode_payload(data, self.optimizer))
                  for peer_id, data in sorted(gathered.payloads.items())]
        await loop.run_in_executor(None, self.optimizer.apply, [*honest, (self.node.peer_id, own)], self.node.peer_id)

    def _own_payload(self, step: int) -> dict:
        trainer = self.trainer
        window = trainer.windows.sample(trainer.config.batch_size, trainer.generator)
        trainer.optimizer.zero_grad(set_to_none=True)
        trainer.loss_fn(window, trainer.generator).backward()
        torch.nn.utils.clip_grad_norm_(trainer.module.parameters(), trainer.config.grad_clip)
        return self.optimizer.make_payload(trainer.config.lr_at(step))

    def _perturbed(self, payload: dict) -> Iterator:
        largest = 0.95 * (1.0 if self.optimizer.config.value_bits == 1 else self.optimizer.max_value)
        for name, sent in payload.items():
            values = sent.values.float()
            if self.mode == "honest":
                pass
            elif self.mode == "negated":
                values = -values
            elif self.mode == "max-values":
                values = -values.sign() * largest
            elif self.mode == "nan":
                values = torch.full_like(values, float("nan"))
            else:
                signs = torch.randint(0, 2, values.shape, generator=self.rng) * 2 - 1
                values = signs.float() * values.abs().clamp(min=1e-8)
            yield name, dataclasses.replace(sent, values=values.to(sent.values.dtype))


class EmptyPayloads(Impersonating, PayloadServicer):
    """Answers every poll at once with a DeMo payload that names no parameter: it decodes, and a
    voter that sent nothing for a parameter votes 0 there. Two such keys beside a lone honest
    replica were a majority of its vote, whose median was then 0: it moved by weight decay alone
    (issue 57). Costs the keys nothing: no training, no fetch."""

    imitates = PayloadServicer

    def __init__(self, block: int, value_bits: int = DeMoConfig.value_bits):
        super().__init__(block, deadline=5.0)
        self.empty = encode_payload({}, value_bits)

    async def _payload(self, request: runtime_pb2.ExpertRequest) -> PayloadReply:
        step = PayloadRequest.decode(request.metadata).step
        return PayloadReply(status="ok", payload=self.empty, fingerprint=b"\0" * 8, newest_step=step)


class NegatedEcho(Impersonating, PayloadServicer):
    """Asked for step t, fetches the step-t payload of the block's other replicas but `fellows` (the
    stranger's other keys: `rpc_payload` serves anyone) and answers with the first one's values
    negated, under that replica's own fingerprint (so nothing looks drifted). Two such keys beside a
    lone honest replica contradict it two to one: a vote that counted keys left the honest one out
    and stepped it on their negation, up its loss, every step (issue 57). `answered`: the steps it
    answered with a payload."""

    imitates = PayloadServicer

    def __init__(self, node: HostileNode, config: ModelConfig, block: int, de_mo: DeMoConfig, lr: float,
                 fellows: Sequence[str]):  # fmt: skip
        super().__init__(block, deadline=5.0)
        self.node, self.fellows = node, set(fellows)
        self.optimizer = DeMoOptimizer(build_block(config, block), de_mo, lr)  # its shapes: to decode and encode
        self.answered: list[int] = []

    async def _payload(self, request: runtime_pb2.ExpertRequest) -> PayloadReply:
        step = PayloadRequest.decode(request.metadata).step
        hosts = await asyncio.get_running_loop().run_in_executor(None, self.node.directory.hosts, self.block)
        honest = sorted(h.peer_id for h in hosts if h.peer_id != self.node.peer_id and h.peer_id not in self.fellows)
        gathered = await gather(self.node.p2p, self.block, step, honest, self.deadline / 2)
        if not gathered.payloads:
            return PayloadReply(status="not yet", newest_step=step - 1)
        echoed = min(gathered.payloads)
        payload = decode_payload(gathered.payloads[echoed], self.optimizer)
        negated = {name: dataclasses.replace(sent, values=-sent.values) for name, sent in payload.items()}
        self.answered.append(step)
        return PayloadReply(status="ok", payload=encode_payload(negated, self.optimizer.config.value_bits),
                            fingerprint=gathered.fingerprints.get(echoed, b""), newest_step=step)  # fmt: skip


class MergePoisoner(HostileReplica):
    """A replica that sends its honest updates (under a fingerprint of its own, so the honest
    replicas see that they drifted and merge at the next round) and, a few steps before
    `merge_step` (a multiple of the peers' `--average-every`, which every stranger can read off
    `swarm-peer --help`), announces the checkpoint `poison` stamped with that step and serves it
    from `store`: the voice a merge would take if it believed one (issue 26, item 1). Serve it
    beside an info service and `BlockServicer(block, store)`."""

    def __init__(self, node: HostileNode, config: ModelConfig, block: int, de_mo: DeMoConfig, lr: float,
                 windows: Windows, store: CheckpointStore, poison: Denoiser, merge_step: int):  # fmt: skip
        super().__init__(node, config, block, de_mo, lr, "honest", windows)
        self.store, self.poison, self.merge_step = store, poison, merge_step
        self.poisoned: CheckpointInfo | None = None  # the checkpoint it announced, once it did

    async def _take_step(self, step: int) -> None:
        await super()._take_step(step)
        if self.poisoned is None and step >= self.merge_step - POISON_AHEAD_STEPS:
            await asyncio.get_running_loop().run_in_executor(None, self._announce_poison)

    def _announce_poison(self) -> None:
        self.poisoned = self.store.save(self.poison, self.merge_step)
        self.node.announce(self.block, lifetime_s=3600, **checkpoint_of(self.poisoned))


def checkpoint_of(info: CheckpointInfo) -> dict:
    """The fields of a checkpoint record, to announce someone else's checkpoint as one's own."""
    return {"checkpoint": info, "step": info.step}
