"""Every record BlockSwarm puts on the DHT: one typed, validated class each, and their keys.

Keys (S is the swarm's name, without dots):
- `S.model`: a `ModelRecord`, the model config every peer must train, with its hash, under a
  subkey that carries the swarm creator's RSA public key (readers pin the creator by the
  key's fingerprint: see `owner_fingerprint`);
- `S.block.<b>`: one `BlockAnnouncement` per hosting peer, under a subkey that carries the
  peer's RSA public key;
- `S.revoked`: a `RevocationList`, the member certificates the creator revoked, under the
  creator's subkey (read only from there: see swarm/p2p/members.py);
- `S.ledger`: one `Attestation` per attesting key, under a subkey that carries that key: what
  it checked about other peers' work (swarm/p2p/ledger.py signs, checks and counts them).
hivemind's `RSASignatureValidator` lets only the holder of a subkey's key write under it.

`SwarmRecordValidator` makes DHT nodes refuse records under these keys that do not match
their schema or whose subkey carries no public key. Readers parse tolerantly as well: an
entry that does not parse is skipped, never fatal.
"""

from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path
from typing import Annotated, Literal

from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from swarm.errors import SwarmError
from swarm.model.denoiser import CONFIG_SCHEMA, MAX_BLOCKS

logger = logging.getLogger(__name__)

MAX_PINGS = 8  # round trips one announcement may carry
MAX_PING_S = 60.0
SWARM_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
PeerState = Literal["joining", "training", "serving", "leaving"]
Reached = Literal["direct", "relayed"]


def check_swarm_name(swarm: str) -> str:
    if not SWARM_NAME.match(swarm):
        raise SwarmError(f"swarm name {swarm!r} must be 1-64 letters, digits, '-' or '_' (no dots)")
    return swarm


def model_key(swarm: str) -> str:
    return f"{swarm}.model"


def block_key(swarm: str, block: int) -> str:
    return f"{swarm}.block.{block}"


def revoked_key(swarm: str) -> str:
    return f"{swarm}.revoked"


def ledger_key(swarm: str) -> str:
    return f"{swarm}.ledger"


class _Record(BaseModel):
    """Strict on types, tolerant of unknown fields (a newer peer may add some)."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class CheckpointInfo(_Record):
    """A checkpoint a peer can serve: the receiver checks size and sha256 before keeping a byte.

    `chunks` is the sha256 of the file's chunk list (swarm/checkpoints/chunks.py: a function of the
    file's bytes, so every honest host of one file names the same). A host's chunk list is checked
    against it as it comes in, so a key that copies an honest record cannot lead a download with a
    forged list; a record that names a forged one is a checkpoint of its own (another candidate).
    Required: a record without it would let a forger leave the list unchecked (issue 57)."""

    step: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(gt=0, le=2**34)
    chunks: str = Field(pattern=r"^[0-9a-f]{64}$")


class Ping(_Record):
    """One round trip a peer measured to another (rpc_info), like Petals' `next_pings`."""

    peer_id: str = Field(min_length=1, max_length=128)
    seconds: float = Field(ge=0, le=MAX_PING_S, allow_inf_nan=False)


MAX_KEY_CHARS = 1024  # an RSA public key in OpenSSH form (2048 bits: about 380 characters)
MAX_SIGNATURE_CHARS = 1024  # hivemind's base64 RSA-PSS signature (2048 bits: 344 characters)
MAX_REVOKED = 1024  # certificates one revocation list may name
CERTIFICATE_ID = r"^[0-9a-f]{32}$"


class MemberCertificate(_Record):
    """The creator's word that the holder of `member` (an RSA public key, OpenSSH form) belongs to
    swarm `swarm` as `name` until `expires` (unix seconds); `signature` is the creator key's over
    every other field (swarm/p2p/members.py says how, and checks it)."""

    swarm: str = Field(pattern=SWARM_NAME.pattern)
    name: str = Field(pattern=r"^[^\x00-\x1f\x7f]{1,64}$")
    member: str = Field(pattern=r"^ssh-rsa [A-Za-z0-9+/=]+$", max_length=MAX_KEY_CHARS)
    issued: int = Field(ge=0, lt=2**40)
    expires: int = Field(ge=0, lt=2**40)
    signature: str = Field(pattern=r"^[A-Za-z0-9+/=]+$", max_length=MAX_SIGNATURE_CHARS)


class MemberProof(_Record):
    """A certificate, and the certified key's signature over the peer id that carries it: a peer
    that copies another's certificate cannot sign its own peer id with that key."""

    certificate: MemberCertificate
    signature: str = Field(pattern=r"^[A-Za-z0-9+/=]+$", max_length=MAX_SIGNATURE_CHARS)


class RevocationList(_Record):
    """The ids (members.certificate_id) of the certificates the creator revoked."""

    # a tuple keeps the record hashable; lax only so that a list read back from msgpack is taken
    revoked: tuple[Annotated[str, Field(pattern=CERTIFICATE_ID, strict=True)], ...] = Field(
        default=(), max_length=MAX_REVOKED, strict=False
    )


MAX_TAKEN_FROM = 8  # keys one record may name as where its checkpoint came from
Fingerprint = Annotated[str, Field(pattern=r"^[0-9a-f]{32}$", strict=True)]  # an `owner_fingerprint`


class BlockAnnouncement(_Record):
    """What a peer says about the block it hosts, refreshed every announce period."""

    peer_id: str = Field(min_length=1, max_length=128)
    state: PeerState
    step: int = Field(ge=0)
    checkpoint: CheckpointInfo | None = None
    loss: float | None = None
    throughput: float = Field(default=0.0, ge=0)  # optimizer steps per second
    version: str = Field(default="", max_length=32)
    public_name: str = Field(default="", max_length=64)
    checkpoint_time: float | None = None  # unix time the checkpoint was saved
    sync_steps: int = Field(default=0, ge=0)  # steps (outer: rounds) exchanged with other replicas
    sync_bytes_sent: int = Field(default=0, ge=0)  # every byte sent to other replicas for sync, in all
    sync_bytes_received: int = Field(default=0, ge=0)  # bytes of the payload exchange received, in all
    sync_round_s: float | None = Field(default=None, ge=0)  # seconds the last exchange with the replicas took
    # time in forward, backward and optimizer (less waits on other replicas) / wall time since the first step
    compute_utilisation: float | None = Field(default=None, ge=0, le=1)
    drift: float | None = Field(default=None, ge=0)  # the largest change the last merge made to a weight (reconcile.py)
    # round trips to a few peers of this block and its neighbours (a tuple keeps the record hashable;
    # lax only so that a list read back from msgpack is taken: each Ping is strict)
    pings: tuple[Ping, ...] = Field(default=(), max_length=MAX_PINGS, strict=False)
    # "relayed": behind NAT, through circuit relays (a claim: callers measure, reachability.py)
    reached: Reached = "direct"
    membership: MemberProof | None = None  # in a members-only swarm: the certificate of the key that signed this record
    # where the creator prices identities: the nonce of this key's and this peer id's work (swarm/p2p/work.py)
    work_nonce: int | None = Field(default=None, ge=0, lt=2**63)
    # lineage: where this peer took the weights of `checkpoint` from, bit for bit, when it joined: the
    # voices (swarm/checkpoints/measure.py `voices`) that vouched for them then; () if it made them itself.
    # A host that took them from one voice alone counts as that voice, not as a voucher of its own
    taken_from: tuple[Fingerprint, ...] = Field(default=(), max_length=MAX_TAKEN_FROM, strict=False)


MAX_WORK_BITS = 40  # 2^40 scrypt tries: more would shut every joiner out
MAX_WORK_MEMORY = 64 * 2**20  # bytes one scrypt try may take (128 * r * n): every reader pays one per new record


class IdentityWork(_Record):
    """The price of an identity the creator sets (swarm/p2p/work.py): a peer's record counts only if
    scrypt (n = 2^log2_n, r, p = 1) of its swarm, key, peer id and nonce has `bits` leading zero bits."""

    bits: int = Field(ge=0, le=MAX_WORK_BITS)
    log2_n: int = Field(default=14, ge=1, le=20)
    r: int = Field(default=8, ge=1, le=32)

    @model_validator(mode="after")
    def _bounded_memory(self) -> IdentityWork:
        if 128 * self.r * 2**self.log2_n > MAX_WORK_MEMORY:
            raise ValueError(f"one scrypt try may take at most {MAX_WORK_MEMORY} bytes")
        return self


MAX_SUBJECTS = 64  # peers one attestation may credit
MAX_COUNT = 2**40  # any counter of an attestation (payloads, a step, answers, seconds of uptime)
Count = Annotated[int, Field(ge=0, le=MAX_COUNT, strict=True)]


class Contribution(_Record):
    """What one attester checked of one peer's work, cumulative since the attester started:
    `subject` is the fingerprint (`owner_fingerprint`) of the key of the peer's records."""

    subject: str = Field(pattern=r"^[0-9a-f]{32}$")
    peer_id: str = Field(min_length=1, max_length=128)
    payloads: Count = 0  # its sync payloads the attester applied
    verified_step: Count = 0  # the newest step of its checkpoints that passed the attester's spot check
    answers: Count = 0  # its denoise answers that another key's answer confirmed
    uptime_s: Count = 0  # seconds the attester saw it answer, ping after ping


class Attestation(_Record):
    """One key's signed, expiring word on what it checked about others (ledger.py); `signature`
    is that key's over every other field but `membership`."""

    peer_id: str = Field(min_length=1, max_length=128)  # the attester's own peer
    issued: Count  # unix seconds; a newer attestation of the same key replaces an older one
    expires: Count
    # a tuple keeps the record hashable; lax only so that a list read back from msgpack is taken
    contributions: tuple[Contribution, ...] = Field(default=(), max_length=MAX_SUBJECTS, strict=False)
    membership: MemberProof | None = None  # in a members-only swarm: the certificate of the attesting key
    signature: str = Field(pattern=r"^[A-Za-z0-9+/=]+$", max_length=MAX_SIGNATURE_CHARS)


def _model_config(config: dict) -> dict:
    """A model config's fields as written, once they pass the config's schema (strict types,
    ranges, no unknown field: `swarm.model.denoiser.CONFIG_SCHEMA`, what `--config` passes too)."""
    CONFIG_SCHEMA.model_validate(config)
    return config


class ModelRecord(_Record):
    """The model every peer of the swarm trains; peers compare `config_hash` before joining. A record
    whose config does not pass the config's schema is refused (by DHT nodes) and skipped (by readers)."""

    config: Annotated[dict, AfterValidator(_model_config)]  # as written: its hash is over these values
    config_hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    members_only: bool = False  # only keys with the creator's certificate count (swarm/p2p/members.py)
    identity_work: IdentityWork | None = None  # an open swarm's price of an identity (swarm/p2p/work.py)


def owner_fingerprint(subkey: bytes) -> str:
    """A short, unforgeable name for the key an entry was written under (128 bits of its sha256)."""
    return hashlib.sha256(subkey).hexdigest()[:32]


def read_model_file(path: Path, schema: type[BaseModel], what: str) -> BaseModel | None:
    """A file of ours (a revocation list, solved identity work) read through its schema: None if
    there is none yet, SwarmError naming `what` it should be if it does not parse."""
    if not path.exists():
        return None
    try:
        return schema.model_validate_json(path.read_bytes())
    except (OSError, ValidationError) as error:
        raise SwarmError(f"{path} is not {what}: {str(error).splitlines()[0]}") from None


def parse_record(schema: type[_Record], value: object, level: int = logging.DEBUG) -> _Record | None:
    """The record, or None if the value does not fit the schema (readers skip such entries); what
    did not fit is logged at `level`, on one line."""
    try:
        return schema.model_validate(value)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, p['loc']))}: {p['msg']}" for p in error.errors())
        logger.log(level, "skipping a %s that does not parse: %s", schema.__name__, problems)
        return None


class SwarmRecordValidator(RecordValidatorBase):
    """Rejects malformed records under one swarm's keys; other keys pass through untouched."""

    def __init__(self, swarm: str):
        self._schemas: dict[bytes, type[_Record]] = {DHTID.generate(source=model_key(swarm)).to_bytes(): ModelRecord}
        self._schemas[DHTID.generate(source=revoked_key(swarm)).to_bytes()] = RevocationList
        self._schemas[DHTID.generate(source=ledger_key(swarm)).to_bytes()] = Attestation
        for block in range(MAX_BLOCKS):
            self._schemas[DHTID.generate(source=block_key(swarm, block)).to_bytes()] = BlockAnnouncement

    def validate(self, record: DHTRecord) -> bool:
        schema = self._schemas.get(record.key)
        if schema is None:
            return True
        if not RSASignatureValidator._PUBLIC_KEY_RE.search(record.subkey or b""):
            return False  # an entry must be owned: its subkey carries the owner's public key
        try:
            value = DHTProtocol.serializer.loads(record.value)
        except Exception:  # msgpack raises several types on garbage
            return False
        return parse_record(schema, value) is not None

    @property
    def priority(self) -> int:
        return 5  # after the signature validator (10), which strips the signature first

    def merge_with(self, other: RecordValidatorBase) -> bool:
        return False
