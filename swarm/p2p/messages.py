"""Every message one peer sends another over P2P: one typed, bounded class each.

The envelopes are hivemind's runtime protobufs (`ExpertRequest`, `ExpertResponse`,
`ExpertInfo`), so that no protocol of ours needs compiling; what we put in their `metadata`
bytes is one of the messages below, msgpack-encoded. Tensors (denoise requests and
replies) ride in the envelope's own tensor list and are checked by the service that reads
them.

A message from another peer is read only through `Message.decode`, which raises
`MessageError` for anything that is not exactly that message: garbage bytes, a wrong type,
a value out of bounds, a string or byte string that is too long. Unknown fields are
ignored (a newer peer may add some). Like the DHT records (records.py), these are strict
on types: a string is not an int and a float is not a step.
"""

from __future__ import annotations

from typing import Annotated, Literal, TypeVar

import msgpack
from hivemind.proto import runtime_pb2
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from swarm.model.steps import DEFAULT_REVEAL, MAX_TEMPERATURE, Reveal, Sampling
from swarm.model.units import MAX_TOKENIZER_BYTES
from swarm.p2p.records import MAX_BLOCKS, BlockAnnouncement, MemberProof

MAX_MESSAGE_BYTES = 4 * 1024**2  # hivemind's own cap on one message
MAX_PAYLOAD_BYTES = 3 * 1024**2  # a DeMo payload of the largest block we serve is far below this
MAX_ERROR_CHARS = 300
MAX_STEP = 2**53  # steps are counted in int64 on both sides; anything near this is a lie
HASH_BYTES = 32  # sha256: one entry of a checkpoint's chunk list
MAX_CHUNKS = 32768  # chunks a checkpoint may have: 2 GiB at 64 KiB, far above any block; its list then stays at 1 MiB

M = TypeVar("M", bound="Message")


class MessageError(ValueError):
    """Bytes from a peer that are not the message they should be."""


class Message(BaseModel):
    """Strict on types, tolerant of unknown fields; frozen once parsed."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    def encode(self) -> bytes:
        return msgpack.packb(self.model_dump(), use_bin_type=True)

    @classmethod
    def decode(cls: type[M], data: bytes) -> M:
        """The message in `data`; MessageError if it is anything else."""
        if not isinstance(data, bytes) or len(data) > MAX_MESSAGE_BYTES:
            raise MessageError(f"{cls.__name__}: not bytes, or over {MAX_MESSAGE_BYTES} bytes")
        try:
            value = msgpack.unpackb(data, raw=False)
        except Exception:  # msgpack raises several types on garbage
            raise MessageError(f"{cls.__name__}: not msgpack") from None
        if not isinstance(value, dict):
            raise MessageError(f"{cls.__name__}: not a map")
        try:
            return cls.model_validate(value)
        except ValidationError as error:
            first = error.errors()[0]
            raise MessageError(f"{cls.__name__}: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None


BlockIndex = Annotated[int, Field(ge=0, lt=MAX_BLOCKS)]
Step = Annotated[int, Field(ge=0, le=MAX_STEP)]
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class PeerInfo(Message):
    """Reply to `rpc_info` (also the ping): what a peer hosts, and the key its records are
    signed with, so that a record naming this peer under another key is known for an impostor's;
    in a members-only swarm, the proof that a certified key vouches for this peer id (gate.py)."""

    block: BlockIndex | None = None
    owner: bytes = Field(max_length=1024)
    announcement: BlockAnnouncement | None = None
    membership: MemberProof | None = None  # in a members-only swarm: proof that its key is certified (members.py)


class DownloadRequest(Message):
    """Ask a host for `chunks` chunks, from `first_chunk` on, of the checkpoint of `block` whose
    bytes hash to `sha256` (by default all of it; see chunks.py)."""

    block: BlockIndex
    sha256: Sha256
    first_chunk: int = Field(default=0, ge=0, lt=MAX_CHUNKS)
    chunks: int = Field(default=MAX_CHUNKS, ge=1, le=MAX_CHUNKS)


class DownloadHeader(Message):
    """The first message of a download stream: the size of the whole file, or why not (`busy`:
    the asker has as many downloads open here as it may; ask again in a moment)."""

    size: int = Field(default=0, ge=0, le=2**34)
    error: str = Field(default="", max_length=MAX_ERROR_CHARS)
    busy: bool = False


class ChunkListRequest(Message):
    """Ask a host for the chunk list of the checkpoint of `block` whose bytes hash to `sha256`."""

    block: BlockIndex
    sha256: Sha256


class ChunkListReply(Message):
    """A host's chunk list: the file's size and the sha256 of each chunk (a claim: see
    download.py for why it is believed), or why not."""

    size: int = Field(default=0, ge=0, le=2**34)
    hashes: bytes = Field(default=b"", max_length=MAX_CHUNKS * HASH_BYTES)
    error: str = Field(default="", max_length=MAX_ERROR_CHARS)
    busy: bool = False


class TokenizerRequest(Message):
    """Ask a peer for the tokenizer.json whose bytes hash to `sha256` (the model record's `tokenizer`)."""

    sha256: Sha256


class TokenizerReply(Message):
    """The tokenizer file asked for (a claim until it hashes right: units.add_tokenizer), or why not."""

    data: bytes = Field(default=b"", max_length=MAX_TOKENIZER_BYTES)
    error: str = Field(default="", max_length=MAX_ERROR_CHARS)


class PayloadRequest(Message):
    """Ask a replica of `block` for its DeMo payload of `step` (a long poll)."""

    block: BlockIndex
    step: Step


PayloadStatus = Literal["ok", "not yet", "gone", "busy", "wrong block", "not a member"]


class PayloadReply(Message):
    """A replica's payload of a step ("ok", with the fingerprint of what it applied the step
    before), or why not; `newest_step` is the newest step it has a payload for (a claim)."""

    status: PayloadStatus
    payload: bytes = Field(default=b"", max_length=MAX_PAYLOAD_BYTES)
    fingerprint: bytes = Field(default=b"", max_length=32)
    newest_step: int = Field(default=-1, ge=-1, le=MAX_STEP)


class DenoiseRequest(Message):
    """What goes beside the tensors (prefix, state, schedule) of a remote denoising request.

    `seed`, `temperature` and `reveal` are the block's own draws and how it makes them (the
    masked family's reveals and bytes; the gaussian family's steps draw nothing): replicas of
    one checkpoint given the same request give the same answer, which is what a cross-check
    compares."""

    block: BlockIndex
    logits: bool = False  # also return the logits (gaussian: the last step's; masked: each revealed byte's)
    checkpoint: str = Field(default="", pattern=r"^([0-9a-f]{64})?$")  # sha256 of the checkpoint to run ("": any)
    seed: int = Field(default=0, ge=0, lt=2**63)
    temperature: float = Field(default=0.0, ge=0.0, le=MAX_TEMPERATURE, allow_inf_nan=False)
    reveal: Reveal = DEFAULT_REVEAL

    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.reveal)


class StageRequest(Message):
    """What goes beside the input tensor of an autoregressive pipeline stage."""

    stage: BlockIndex


class DialBackRequest(Message):
    """Ask a peer on the public side to dial the asker back on these ports of the address it sees
    the request come from (see swarm/p2p/reachability.py)."""

    ports: list[Annotated[int, Field(ge=1, le=65535)]] = Field(min_length=1, max_length=4)


DialBackStatus = Literal["reachable", "unreachable", "cannot tell"]


class DialBackReply(Message):
    """Whether a libp2p listener answered at the asker's address (`address`: what was dialed)."""

    status: DialBackStatus
    address: str = Field(default="", max_length=64)
    error: str = Field(default="", max_length=MAX_ERROR_CHARS)


class DialMeRequest(Message):
    """Ask a peer reached only through a relay to open a direct connection back to the asker."""


class DialMeReply(Message):
    """"dialing": it will dial once the asker closes the relayed connection; "direct": it already
    has a direct connection to the asker; "busy": it is dialing the asker already."""

    status: Literal["dialing", "direct", "busy"]


class ErrorReply(Message):
    """A refusal, in place of a reply's tensors."""

    error: str = Field(max_length=MAX_ERROR_CHARS)


def error_reply(error: object) -> runtime_pb2.ExpertResponse:
    """A refusal as a response envelope (the text cut to what the message allows)."""
    return runtime_pb2.ExpertResponse(metadata=ErrorReply(error=str(error)[:MAX_ERROR_CHARS]).encode())


def refusal(response: runtime_pb2.ExpertResponse) -> str | None:
    """The error of a response that carries one, else None; MessageError if its metadata is garbage."""
    return ErrorReply.decode(response.metadata).error if response.metadata else None
