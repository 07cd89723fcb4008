"""The decoders of another peer's bytes, as fuzz targets: what each takes, what it may raise, and
what it must give back (tests/test_fuzz.py, benchmarks/fuzz.py; the P2P handlers are in
fuzz_peers.py).

The property every one of them must have: given any bytes, it returns a value within its bounds
(`Decoder.check`: finite, of the right shape, sizes within the bound) or raises its documented
error type (`Decoder.refuses`), never another exception, and in bounded time. `judge` says which:
`ACCEPTED`, `REFUSED`, or what went wrong (an exception of another type, a value out of bounds:
each one a bug). `decoders(config)` builds every target for a model config, each with a valid
sample that it accepts and, for a msgpack message, the sample's fields for value mutations
(mutations.py):
- `message.<Name>`: every message of swarm/p2p/messages.py (`Message.decode`, MessageError);
- `record.<Name>`: every DHT record (records.py) as a DHT node and a reader take it: the value's
  bytes through `SwarmRecordValidator`, then `parse_record`, then what the directory does with it
  (a model record's config, members.py's check of a proof, work.py's check of a nonce, ledger.py's
  of an attestation);
- `checkpoint.*`: a block checkpoint's bytes (`decode_block`, SwarmError), a stream frame
  (`read_frame`, FramingError or the stream's end), a chunk list as a downloader reads it
  (`ChunkListReply` then `ChunkList`, MessageError or ValueError);
- `serving.*`: a denoise request as the server reads it and a reply as the client does (wire.py);
- `sync.*`: a DeMo payload (decoupled_momentum.py) and an outer payload of each compression
  (pseudo_gradient.py), PayloadError. Dense sync has no decoder of ours: it is hivemind's
  all-reduce, which trusts its groupmates (dense.py says so).
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgpack
import torch
from google.protobuf.message import DecodeError
from google.protobuf.message import Message as Protobuf
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord
from hivemind.p2p import P2P
from hivemind.proto import runtime_pb2
from hivemind.utils.crypto import RSAPrivateKey
from pydantic import BaseModel

from swarm.checkpoints.chunks import CHUNK_BYTES, HASH_BYTES, MAX_CHUNKS, ChunkList
from swarm.checkpoints.framing import FramingError, read_frame
from swarm.checkpoints.transfer import REQUEST_BYTES
from swarm.errors import SwarmError
from swarm.lab.mutations import Mutator, packed
from swarm.model.checkpoint import decode_block, encode_block, read_block_metadata
from swarm.model.denoiser import ModelConfig, build_block
from swarm.model.families import family_of
from swarm.model.steps import Sampling
from swarm.p2p import messages as m
from swarm.p2p.ledger import Ledger, sign
from swarm.p2p.members import Membership, issue, prove
from swarm.p2p.records import (
    Attestation,
    BlockAnnouncement,
    CheckpointInfo,
    Contribution,
    IdentityWork,
    ModelRecord,
    RevocationList,
    SwarmRecordValidator,
    block_key,
    ledger_key,
    model_key,
    owner_fingerprint,
    parse_record,
    revoked_key,
)
from swarm.p2p.work import WorkCheck
from swarm.serving.wire import RequestError, check_request, decode_reply, decode_request, encode_reply, encode_request
from swarm.sync.compression import PayloadError
from swarm.sync.decoupled_momentum import DeMoConfig, DeMoOptimizer, decode_payload, encode_payload
from swarm.sync.pseudo_gradient import COMPRESSIONS, OuterConfig, OuterOptimizer

ACCEPTED, REFUSED = "accepted", "refused"
SWARM = "fuzz"
SHA = "ab" * 32
LR = 2e-3
SLOW_S = 10.0  # a decode that takes longer is counted as a hang: every decoder here is bounded far below it
CHEAP_WORK = IdentityWork(bits=2, log2_n=1, r=1)  # a price whose check costs microseconds: the checks, not scrypt


class OutOfBounds(AssertionError):
    """A decoder accepted its input and gave back a value outside its bounds."""


class NotStored(Exception):
    """A DHT value that the swarm's validator refuses: no DHT node stores it, no reader sees it."""


@dataclass(frozen=True)
class Decoder:
    """One decoder of a peer's bytes (module docstring): `decode(data)` returns the value or raises."""

    name: str
    sample: bytes  # a valid input: it is accepted
    decode: Callable[[bytes], object]
    refuses: tuple[type[BaseException], ...]  # its documented error types
    check: Callable[[object], None] = lambda value: None  # OutOfBounds if an accepted value breaks its bounds
    fields: dict | None = None  # the sample's fields, for value mutations (mutations.py)
    pack: Callable[[object], bytes] = packed  # fields (mutated) as the decoder's bytes
    envelope: Protobuf | None = None  # the sample as a hivemind envelope, for tensor mutations


def mutated(decoder: Decoder, mutator: Mutator) -> tuple[str, bytes]:
    """A mutation of the decoder's sample (mutations.py): of its envelope, its fields or its bytes."""
    level = mutator.rng.random()
    if decoder.envelope is not None and level < 0.7:
        return mutator.of_envelope(decoder.envelope)
    if decoder.fields is not None and level < 0.7:
        return mutator.of_message(decoder.fields, decoder.pack)
    return mutator.of_bytes(decoder.sample)


def judge(decoder: Decoder, data: bytes) -> str:
    """ACCEPTED, REFUSED, or what went wrong: "raised <type>: ...", "out of bounds: ...", "slow: ..."."""
    began = time.monotonic()
    try:
        decoder.check(decoder.decode(data))
        verdict = ACCEPTED
    except decoder.refuses:
        verdict = REFUSED
    except OutOfBounds as error:
        verdict = f"out of bounds: {error}"
    except Exception as error:  # noqa: BLE001 (the bug looked for: any other exception)
        verdict = f"raised {type(error).__name__}: {str(error)[:200]}"
    seconds = time.monotonic() - began
    return f"slow: {seconds:.1f}s ({verdict})" if seconds > SLOW_S else verdict


def bounded(condition: bool, what: str) -> None:
    if not condition:
        raise OutOfBounds(what)


def finite(tensor: torch.Tensor) -> bool:
    return bool(torch.isfinite(tensor).all())


# --- messages and records ------------------------------------------------------------------------


def message_samples(announcement: BlockAnnouncement) -> list[m.Message]:
    """A valid instance of every message of messages.py (tests check that none is missing)."""
    return [
        m.PeerInfo(block=0, owner=b"[owner:ssh-rsa AAAA]", announcement=announcement),
        m.DownloadRequest(block=0, sha256=SHA, first_chunk=1, chunks=2), m.DownloadHeader(size=100),
        m.ChunkListRequest(block=1, sha256=SHA), m.ChunkListReply(size=CHUNK_BYTES, hashes=bytes(HASH_BYTES)),
        m.TokenizerRequest(sha256=SHA), m.TokenizerReply(data=b"{}"), m.PayloadRequest(block=0, step=7),
        m.PayloadReply(status="ok", payload=b"\x81", fingerprint=bytes(8), newest_step=7),
        m.DenoiseRequest(block=1, logits=True, checkpoint=SHA, seed=3, temperature=0.5, reveal="random"),
        m.StageRequest(stage=1), m.DialBackRequest(ports=[4001, 4002]),
        m.DialBackReply(status="reachable", address="1.2.3.4:5"),
        m.DialMeRequest(), m.DialMeReply(status="direct"), m.ErrorReply(error="busy"),
    ]  # fmt: skip


def message_decoder(sample: m.Message) -> Decoder:
    kind = type(sample)

    def stable(value: object) -> None:  # what was accepted is a message of its kind, and says the same again
        bounded(type(value) is kind and kind.decode(value.encode()).encode() == value.encode(), "not stable")

    return Decoder(f"message.{kind.__name__}", sample.encode(), kind.decode, (m.MessageError,), stable,
                   sample.model_dump())  # fmt: skip


@dataclass
class _Swarm:
    """The keys and terms the record decoders read under: a creator, a member, a cheap identity price."""

    creator: RSAPrivateKey = field(default_factory=RSAPrivateKey)
    member: RSAPrivateKey = field(default_factory=RSAPrivateKey)

    def subkey(self, key: RSAPrivateKey) -> bytes:
        return RSASignatureValidator(key).local_public_key

    def membership(self) -> Membership:
        membership = Membership(SWARM)
        membership.set_terms(self.subkey(self.creator), members_only=True)
        return membership


def record_samples(config: ModelConfig, keys: _Swarm) -> dict[str, tuple[str, BaseModel]]:
    """A valid instance of every DHT record, under the DHT key it is stored at."""
    certificate = issue(keys.creator, SWARM, "fuzzer", keys.member.get_public_key(), 1.0)
    proof = prove(keys.member, certificate, "12D3KooWfuzz")
    checkpoint = CheckpointInfo(step=9, sha256=SHA, size=1000, chunks=SHA)
    announcement = BlockAnnouncement(peer_id="12D3KooWfuzz", state="serving", step=9, membership=proof, work_nonce=1,
                                     checkpoint=checkpoint, loss=2.5)  # fmt: skip
    contribution = Contribution(subject=owner_fingerprint(b"other"), peer_id="12D3KooWother", payloads=3, uptime_s=60)
    attestation = sign(keys.member, SWARM, "12D3KooWfuzz", [contribution], int(time.time()), proof=proof)
    model = ModelRecord(config=config.to_dict(), config_hash=config.hash(), identity_work=CHEAP_WORK)
    return {"BlockAnnouncement": (block_key(SWARM, 0), announcement), "ModelRecord": (model_key(SWARM), model),
            "RevocationList": (revoked_key(SWARM), RevocationList(revoked=("0" * 32,))),
            "Attestation": (ledger_key(SWARM), attestation)}  # fmt: skip


def _read_on(keys: _Swarm) -> Callable[[BaseModel], None]:
    """What a reader does with a record that parsed (directory.py, members.py, work.py, ledger.py)."""
    membership, work, subkey = keys.membership(), WorkCheck(SWARM), keys.subkey(keys.member)
    work.terms = CHEAP_WORK

    def read(record: BaseModel) -> None:
        if isinstance(record, BlockAnnouncement):
            membership.admits_record(record, subkey)
            work.refusals([(subkey, record.peer_id, record.work_nonce)])
        elif isinstance(record, Attestation):
            Ledger(SWARM, membership).take({subkey: record})
        elif isinstance(record, ModelRecord):
            ModelConfig.from_dict(dict(record.config)).hash()
        elif isinstance(record, RevocationList):
            membership.set_revoked(record)

    return read


def record_decoder(name: str, key: str, sample: BaseModel, keys: _Swarm) -> Decoder:
    """A DHT value's bytes as a node stores them (the validator) and a reader reads them."""
    validator, schema, subkey = SwarmRecordValidator(SWARM), type(sample), keys.subkey(keys.member)
    key_bytes, read = DHTID.generate(source=key).to_bytes(), _read_on(keys)

    def decode(data: bytes) -> BaseModel | None:
        if not validator.validate(DHTRecord(key_bytes, subkey, data, time.time() + 60)):
            raise NotStored(key)
        record = parse_record(schema, DHTProtocol.serializer.loads(data))
        bounded(record is not None, "the validator took a value the reader cannot parse")
        read(record)
        return record

    fields = sample.model_dump()
    return Decoder(f"record.{name}", DHTProtocol.serializer.dumps(fields), decode, (NotStored, SwarmError),
                   fields=fields, pack=DHTProtocol.serializer.dumps)  # fmt: skip


# --- checkpoints ---------------------------------------------------------------------------------


def checkpoint_decoders(config: ModelConfig) -> list[Decoder]:
    block = encode_block(build_block(config, 0), config, 0, 5, SWARM)

    def whole_block(value: object) -> None:
        denoiser, step = value
        bounded(0 <= step <= m.MAX_STEP, f"step {step}")
        bounded(all(finite(p) for p in denoiser.state_dict().values()), "a weight is not finite")

    request = runtime_pb2.ExpertRequest(metadata=m.DownloadRequest(block=0, sha256=SHA).encode()).SerializeToString()
    frame = P2P.MESSAGE_MARKER + len(request).to_bytes(P2P.HEADER_LEN, P2P.BYTEORDER) + request
    listed = m.ChunkListReply(size=3 * CHUNK_BYTES, hashes=bytes(3 * HASH_BYTES))

    def chunk_list(data: bytes) -> ChunkList:
        reply = m.ChunkListReply.decode(data)
        return ChunkList(reply.size, reply.hashes)

    return [
        Decoder("checkpoint.decode_block", block, lambda data: decode_block(data, config, 0), (SwarmError,),
                whole_block, read_block_metadata(block), functools.partial(with_metadata, block)),
        Decoder("checkpoint.read_frame", frame, lambda data: asyncio.run(_frame(data)),
                (FramingError, asyncio.IncompleteReadError),
                lambda v: bounded(len(v[1]) <= REQUEST_BYTES, "frame size")),
        Decoder("checkpoint.chunk_list", listed.encode(), chunk_list, (m.MessageError, ValueError),
                lambda v: bounded(v.count <= MAX_CHUNKS and len(v.hashes) == HASH_BYTES * v.count, "chunk list size"),
                listed.model_dump()),
    ]  # fmt: skip


def with_metadata(data: bytes, metadata: object) -> bytes:
    """A safetensors file's bytes with its header's metadata replaced (its tensors kept where they were)."""
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + length])
    text = json.dumps({**header, "__metadata__": metadata}).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + data[8 + length :]


async def _frame(data: bytes) -> tuple[bool, bytes]:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return await read_frame(reader, REQUEST_BYTES)


# --- serving -------------------------------------------------------------------------------------


def serving_decoders(config: ModelConfig) -> list[Decoder]:
    """A denoise request as the server reads it (decode, then check), and a reply as the client does."""
    family, block = family_of(config), config.n_blocks - 1
    prefix = torch.zeros(2, config.prefix_len, dtype=torch.long)
    state = torch.full((2, config.gen_len), config.mask_id, dtype=torch.long)
    schedule = family.schedule(block, 2)
    request = encode_request(m.DenoiseRequest(block=block, logits=True), prefix, state, schedule)
    with torch.no_grad():
        reply = encode_reply(
            *family.run_steps(build_block(config, block).eval(), prefix, state, schedule, 0, Sampling())
        )

    def read_request(data: bytes) -> tuple:
        _, tensors = decode_request(runtime_pb2.ExpertRequest.FromString(data))
        return check_request(family, config, tensors)

    def read_reply(data: bytes) -> tuple:
        return decode_reply(family, config, runtime_pb2.ExpertResponse.FromString(data), state, schedule, True)

    def finite_request(value: tuple) -> None:
        bounded(value[0].shape[1] == config.prefix_len and finite(value[2]), "prefix or schedule")

    def finite_reply(value: tuple) -> None:
        bounded(value[1].shape == (*state.shape, config.vocab_size) and finite(value[1]), "logits")

    return [
        Decoder("serving.denoise_request", request.SerializeToString(), read_request,
                (DecodeError, RequestError, m.MessageError), finite_request, envelope=request),
        Decoder("serving.denoise_reply", reply.SerializeToString(), read_reply, (DecodeError, SwarmError), finite_reply,
                envelope=reply),
    ]  # fmt: skip


# --- sync ----------------------------------------------------------------------------------------


def sync_decoders(config: ModelConfig) -> list[Decoder]:
    """A DeMo payload and an outer payload of each compression, from a replica of block 0."""
    torch.manual_seed(0)
    module = build_block(config, 0)
    demo = DeMoOptimizer(module, DeMoConfig(), LR)
    for param in module.parameters():
        param.grad = torch.randn_like(param) * 1e-3
    demo_sample = encode_payload(demo.make_payload(LR), demo.config.value_bits)

    def demo_bounds(payload: dict) -> None:
        for name, sent in payload.items():
            tiles, tile = demo.tiles[name]
            bounded(sent.indices.shape[0] == tiles and int(sent.indices.max()) < math.prod(tile), f"{name}: indices")
            bounded(finite(sent.values) and float(sent.values.float().abs().max()) <= demo.max_value, f"{name}: values")

    decoders = [Decoder("sync.demo", demo_sample, lambda data: decode_payload(data, demo), (PayloadError,), demo_bounds,
                        msgpack.unpackb(demo_sample))]  # fmt: skip
    for compression in COMPRESSIONS:
        decoders.append(_outer_decoder(build_block(config, 0), compression))
    return decoders


def _outer_decoder(module: torch.nn.Module, compression: str) -> Decoder:
    outer = OuterOptimizer(module, OuterConfig(compression=compression), LR)
    with torch.no_grad():
        for param in module.parameters():
            param.add_(torch.randn_like(param) * 1e-4)
    sample = outer.make_payload()

    def outer_bounds(changes: dict) -> None:
        for name, change in changes.items():
            bounded(change.shape == outer.params[name].shape, f"{name}: shape")
            bounded(finite(change) and float(change.abs().max()) <= outer.max_change, f"{name}: change")

    return Decoder(
        f"sync.outer_{compression}", sample, outer.decode, (PayloadError,), outer_bounds, msgpack.unpackb(sample)
    )


def decoders(config: ModelConfig) -> list[Decoder]:
    """Every decoder of another peer's bytes (module docstring), for `config`'s model."""
    keys = _Swarm()
    records = record_samples(config, keys)
    found = [message_decoder(sample) for sample in message_samples(records["BlockAnnouncement"][1])]
    found += [record_decoder(name, key, sample, keys) for name, (key, sample) in records.items()]
    return found + checkpoint_decoders(config) + serving_decoders(config) + sync_decoders(config)
