"""The price of an identity in an open swarm: memory-hard work bound to a key and a peer id.

Every trust decision counts keys or peer ids (the replicas a sync step gathers from and votes
with, the hosts that vouch for a checkpoint, the majority behind a step jump, the witnesses of a
cross-check), and both cost nothing to make. A members-only swarm answers that with certificates
(members.py); an open one, with work, as S/Kademlia's crypto puzzles do: the creator's signed model
record (`ModelRecord.identity_work`, so nobody else can lower it) asks for `bits` leading zero
bits of

    scrypt(msgpack([WORK_TAG, swarm, owner fingerprint, peer id, nonce]), salt=WORK_TAG, n=2^log2_n, r)

and a peer's record (`BlockAnnouncement.work_nonce`) counts only if its nonce meets it. The
fingerprint is that of the key the record is signed under (records.owner_fingerprint of its
subkey) and the peer id the one the record names, which libp2p authenticates on every call: work
done for one key, peer id or swarm is worth nothing for another, so each identity a Sybil wants
costs it 2^bits tries on average. scrypt is memory-hard (128 * r * n bytes per try: 16 MiB at the
defaults), so a GPU or an ASIC gains less over an honest CPU than on sha256.

A reader pays one try per (key, peer id, nonce) it has not judged yet: results, good and bad,
are kept (`CACHE_SIZE`, least recently used dropped first), and one read of the records checks at
most `MAX_CHECKS_PER_READ` new ones, picked at random; the rest wait for later reads. So a flood
of records with bad nonces costs each read a bounded amount of CPU, at the price of delaying an
honest newcomer's record among them by a few reads.

A peer solves once per key, peer id and swarm, and keeps the nonce in a file beside its key
(`stored_or_solved`): a restart with the same key and identity re-checks it with one try.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import msgpack
from pydantic import BaseModel, ConfigDict, Field
from tqdm import tqdm

from swarm.files import write_atomic
from swarm.p2p.records import MAX_WORK_MEMORY, IdentityWork, owner_fingerprint, read_model_file

logger = logging.getLogger(__name__)

WORK_TAG = "blockswarm identity work v1"
RECOMMENDED_BITS = 12  # about 4 minutes of one core at the default scrypt cost (benchmarks/identity_cost.py)
CACHE_SIZE = 4096  # judged (key, peer id, nonce) kept
MAX_CHECKS_PER_READ = 4  # new nonces one read of a block's records checks (one scrypt try each)
MAX_SOLVED_KEPT = 64  # solutions one work file keeps (swarms x peer ids of one key)
NOT_CHECKED_YET = "its identity work is not checked yet (more new records than one read checks)"


def work_digest(terms: IdentityWork, swarm: str, fingerprint: str, peer_id: str, nonce: int) -> bytes:
    """One scrypt try: 32 bytes that depend on every part of the identity and on the nonce."""
    password = msgpack.packb([WORK_TAG, swarm, fingerprint, peer_id, nonce], use_bin_type=True)
    return hashlib.scrypt(password, salt=WORK_TAG.encode(), n=2**terms.log2_n, r=terms.r, p=1,
                          maxmem=2 * MAX_WORK_MEMORY, dklen=32)  # fmt: skip


def leading_zero_bits(digest: bytes) -> int:
    return 8 * len(digest) - int.from_bytes(digest, "big").bit_length()


def meets(terms: IdentityWork, swarm: str, fingerprint: str, peer_id: str, nonce: int) -> bool:
    """Whether `nonce` is work enough for this identity."""
    return leading_zero_bits(work_digest(terms, swarm, fingerprint, peer_id, nonce)) >= terms.bits


def solve(terms: IdentityWork, swarm: str, fingerprint: str, peer_id: str,
          stopping: threading.Event | None = None, show_progress: bool = True) -> int | None:  # fmt: skip
    """The first nonce from 0 up that meets `terms` for this identity (None if `stopping` is set first).
    2^bits tries on average; progress on a bar, start and end in the log."""
    expected = 2**terms.bits
    logger.info("solving the swarm's identity work: %d bits, about %d scrypt tries (16 MiB each at the defaults) "
                "on one core, once for this key and peer id", terms.bits, expected)  # fmt: skip
    began, nonce = time.monotonic(), 0
    with tqdm(total=expected, desc="identity work", unit="try", mininterval=2.0, disable=not show_progress) as bar:
        while not meets(terms, swarm, fingerprint, peer_id, nonce):
            if stopping is not None and stopping.is_set():
                return None
            nonce += 1
            bar.update(1)
    logger.info("identity work solved in %d tries, %.1f s", nonce + 1, time.monotonic() - began)
    return nonce


class WorkCheck:
    """One swarm's price of an identity, as its creator's model record states it, and the judged nonces.

    No terms (a reader that has not read the model record, or a swarm created without
    `--identity-work`) or 0 bits: every record counts. Shared by threads: the cache under a lock,
    the terms replaced whole."""

    def __init__(self, swarm: str):
        self.swarm = swarm
        self.terms: IdentityWork | None = None
        self._judged: OrderedDict[tuple, bool] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def required(self) -> bool:
        return self.terms is not None and self.terms.bits > 0

    def refusals(self, claims: list[tuple[bytes, str, int | None]]) -> list[str | None]:
        """For each record's (subkey it is signed under, peer id it names, nonce), why it does not count
        (None: it does). At most `MAX_CHECKS_PER_READ` new nonces are checked, at random; the others
        are refused this time (`NOT_CHECKED_YET`) and have their chance at the next read."""
        terms = self.terms
        if terms is None or terms.bits == 0:
            return [None] * len(claims)
        keys = [(terms, owner_fingerprint(owner), peer_id, nonce) for owner, peer_id, nonce in claims]
        with self._lock:
            known = {key: self._judged[key] for key in keys if key in self._judged}
        new = [key for key in dict.fromkeys(keys) if key not in known and key[3] is not None]
        for key in random.sample(new, min(len(new), MAX_CHECKS_PER_READ)):
            known[key] = meets(terms, self.swarm, *key[1:])
            self._remember(key, known[key])
        return [self._refusal(key, known.get(key)) for key in keys]

    def _remember(self, key: tuple, good: bool) -> None:
        with self._lock:
            self._judged[key] = good
            self._judged.move_to_end(key)
            while len(self._judged) > CACHE_SIZE:
                self._judged.popitem(last=False)

    @staticmethod
    def _refusal(key: tuple, good: bool | None) -> str | None:
        if key[3] is None:
            return "no identity work"
        if good is None:
            return NOT_CHECKED_YET
        return None if good else f"its identity work does not meet {key[0].bits} bits"


class _Solved(BaseModel):
    """One solution a work file keeps: whose, for which swarm and scrypt cost, and its nonce."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    swarm: str
    fingerprint: str
    peer_id: str
    log2_n: int
    r: int
    nonce: int = Field(ge=0, lt=2**63)


class _WorkFile(BaseModel):
    model_config = ConfigDict(extra="ignore")
    solved: list[_Solved] = Field(default_factory=list, max_length=MAX_SOLVED_KEPT)


def work_path(key_path: str | Path) -> Path:
    """Where a key's solved work is kept: beside it."""
    key_path = Path(key_path)
    return key_path.with_name(key_path.name + ".work")


def stored_or_solved(path: Path | None, terms: IdentityWork, swarm: str, fingerprint: str, peer_id: str,
                     stopping: threading.Event | None = None,
                     solver: Callable[..., int | None] = solve) -> int | None:  # fmt: skip
    """This identity's nonce: the one kept in `path` if it still meets `terms` (one try to check),
    else a new one from `solver`, kept there (None: no file, solved every run). None if stopped."""
    kept = _read(path) if path is not None else _WorkFile()
    for solved in kept.solved:
        same = (solved.swarm, solved.fingerprint, solved.peer_id, solved.log2_n, solved.r)
        ours = same == (swarm, fingerprint, peer_id, terms.log2_n, terms.r)
        if ours and meets(terms, swarm, fingerprint, peer_id, solved.nonce):
            logger.info("identity work for peer %s read from %s", peer_id, path)
            return solved.nonce
    nonce = solver(terms, swarm, fingerprint, peer_id, stopping)
    if nonce is not None and path is not None:
        entry = _Solved(swarm=swarm, fingerprint=fingerprint, peer_id=peer_id, log2_n=terms.log2_n, r=terms.r,
                        nonce=nonce)  # fmt: skip
        kept.solved = [*kept.solved, entry][-MAX_SOLVED_KEPT:]
        try:
            write_atomic(path, kept.model_dump_json(indent=2).encode() + b"\n", mode=0o600)
        except OSError as error:
            logger.warning("identity work not kept in %s (%s): it will be solved again next run", path, error.strerror)
    return nonce


def _read(path: Path) -> _WorkFile:
    return read_model_file(path, _WorkFile, "a file of solved identity work") or _WorkFile()
