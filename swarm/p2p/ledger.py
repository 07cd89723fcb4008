"""A ledger of verified contributions: what peers checked of each other's work, signed, and what of it counts.

A peer's own figures (its steps, its loss) are claims. What the ledger counts is what *other*
peers checked, of four kinds:
- `payloads`: a replica's sync payloads that another replica applied (the voters DeMo's sign
  vote kept, or the decoded set of an outer round: `Exchange.applied_set`, swarm/sync/exchange.py);
- `verified_step`: the newest step of a peer's checkpoints that passed another's spot check
  (a joiner's choice of its start checkpoint, swarm/checkpoints/choice.py);
- `answers`: its denoise answers that a generation client saw confirmed (swarm/serving/cross_check.py):
  in an open swarm only by the answer the client computed itself, since agreeing keys may all be one
  stranger's; where keys count, also by a replica under another key. A peer the client catches
  lying is attested for nothing by it (`Witness.caught`);
- `uptime_s`: the time between two `rpc_info` answers it gave another peer's pings
  (swarm/p2p/pings.py), at most `max_gap_s` apart, under the key of a record that names it.
A subject is the key of the peer's records (its fingerprint, `owner_fingerprint`), learnt from
the peer's own `rpc_info` answer, which libp2p authenticates, beside a record under that key.

A `Witness` counts what this process checked and signs it as one `Attestation` (records.py):
cumulative counters per subject, a time of issue and an expiry. A peer's announcer stores it
under `S.ledger` every announce period, under a subkey that carries its key (only it writes there).

A `Ledger` reads them and decides what counts:
- forged: the signature must be the subkey's key's, over a tag, the swarm and every field; an
  attestation altered, or copied under another key, is refused;
- expired: one past its `expires` is ignored; one issued in the future, or that claims to count
  more than `MAX_LIFETIME_S`, is refused;
- replayed: a `Ledger` keeps the newest attestation of each key; an older one (an earlier
  `issued`) is refused and changes nothing. Counters only grow, so an old one is worth no more;
- self-credit: a contribution whose subject is the attesting key, or whose peer is the
  attester's own peer, counts for nothing;
- members-only swarms: an attestation counts only with a valid proof of the attester's certificate;
- two keys: per kind, a key is credited the *second-largest* amount that the other keys attest:
  one key alone credits nothing, and one liar cannot raise anyone above what a second key says.
Two keys that lie together still credit whatever they like, and in an open swarm keys cost
nothing: the ledger shows checked work, it is no defence on its own (README: "Sybil peers").

What it is used for: `backed_keys`, the keys with any credit, whose checkpoints those who choose
one (swarm/checkpoints/choice.py `rank`) measure first, so that a flood of fresh keys cannot keep a
host with checked work unmeasured. A flooder that also runs two keys attesting its flood's work is
backed too, and ranked as before.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import msgpack
from hivemind.utils.crypto import RSAPrivateKey, RSAPublicKey

from swarm.p2p.directory import DHTUnavailable, Host, SwarmDirectory
from swarm.p2p.members import Membership, subkey_key_text
from swarm.p2p.records import MAX_COUNT, MAX_SUBJECTS, Attestation, Contribution, MemberProof, owner_fingerprint

logger = logging.getLogger(__name__)

TAG = "blockswarm attestation v1"
KINDS = ("verified_step", "payloads", "answers", "uptime_s")
LIFETIME_S = 3600  # an attestation counts this long after its last refresh (its attester may have left)
MAX_LIFETIME_S = 86400  # one claiming to count longer is refused
MAX_SKEW_S = 300  # clocks may differ this much: an attestation issued further in the future is refused
MAX_PEERS = 4096  # peers a witness counts, and attesting keys a ledger keeps
SHORT = 12  # hex digits of a fingerprint shown for an attesting key


def signed_bytes(swarm: str, attestation: Attestation) -> bytes:
    """What an attester signs: every field but the proof and the signature, after a tag and the swarm."""
    a = attestation
    rows = [[c.subject, c.peer_id, c.payloads, c.verified_step, c.answers, c.uptime_s] for c in a.contributions]
    return msgpack.packb([TAG, swarm, a.peer_id, a.issued, a.expires, rows], use_bin_type=True)


def sign(key: RSAPrivateKey, swarm: str, peer_id: str, contributions: list[Contribution], issued: int,
         lifetime_s: int = LIFETIME_S, proof: MemberProof | None = None) -> Attestation:  # fmt: skip
    """`key`'s attestation of `contributions`, issued at `issued` (unix seconds) by its peer `peer_id`."""
    unsigned = Attestation(peer_id=peer_id, issued=issued, expires=issued + lifetime_s,
                           contributions=tuple(contributions[:MAX_SUBJECTS]), membership=proof,
                           signature="A")  # fmt: skip
    return unsigned.model_copy(update={"signature": key.sign(signed_bytes(swarm, unsigned)).decode()})


@functools.lru_cache(maxsize=4096)
def _signed_by(key_text: str, swarm: str, attestation: Attestation) -> bool:
    """Whether the key `key_text` signed `attestation` (cached: the same one is read every poll)."""
    try:
        key = RSAPublicKey.from_bytes(key_text.encode())
    except Exception:  # cryptography raises several types on a key that does not parse
        return False
    return key.verify(signed_bytes(swarm, attestation), attestation.signature.encode())


@dataclass
class _Tally:
    """What a witness checked of one peer, and the key it answers under (None until known)."""

    owner: bytes | None = None
    payloads: int = 0
    verified_step: int = 0
    answers: int = 0
    uptime_s: float = 0.0
    last_answer: float | None = None  # monotonic time of its last rpc_info answer

    def contribution(self, peer_id: str) -> Contribution:
        counts = {k: min(int(getattr(self, k)), MAX_COUNT) for k in KINDS}
        return Contribution(subject=owner_fingerprint(self.owner), peer_id=peer_id, **counts)


class Witness:
    """What this process checked of other peers, counted per peer id, and its signed attestation.

    Shared by threads (the trainer's exchange, the pings on the p2p loop, the announcer): one lock.

    Args:
        key: the key this process signs its DHT records with; its attestations too.
        max_gap_s: two answers further apart than this credit no uptime (the peer may have been down).
        proof: in a members-only swarm, this peer's proof of membership, carried by its attestations.
    """

    def __init__(self, key: RSAPrivateKey, swarm: str, peer_id: str, max_gap_s: float,
                 proof: MemberProof | None = None):  # fmt: skip
        self.key, self.swarm, self.peer_id, self.max_gap_s, self.proof = key, swarm, peer_id, max_gap_s, proof
        self._tallies: dict[str, _Tally] = {}
        self._caught: set[str | bytes] = set()  # peer ids and keys shown here to lie (`caught`): never attested
        self._lock = threading.Lock()

    def _tally(self, peer_id: str, owner: bytes | None = None) -> _Tally | None:
        """The tally of `peer_id` (under `owner` from now on, if given); None for this peer itself, one
        caught lying, or past `MAX_PEERS` (call with the lock held)."""
        if peer_id in self._caught or owner in self._caught:
            return None
        tally = self._tallies.get(peer_id)
        if tally is None and peer_id != self.peer_id and len(self._tallies) < MAX_PEERS:
            tally = self._tallies[peer_id] = _Tally()
        if tally is not None and owner:
            tally.owner = owner
        return tally

    def accepted(self, peer_ids: list[str]) -> None:
        """This replica applied one payload of each of `peer_ids` (its own is not counted)."""
        with self._lock:
            for peer_id in peer_ids:
                if (tally := self._tally(peer_id)) is not None:
                    tally.payloads += 1

    def verified(self, peer_id: str, owner: bytes, step: int) -> None:
        """A checkpoint of step `step` that `peer_id` served (under `owner`) passed the spot check here."""
        with self._lock:
            if (tally := self._tally(peer_id, owner)) is not None:
                tally.verified_step = max(tally.verified_step, step)

    def agreed(self, peer_id: str, owner: bytes) -> None:
        """An answer of `peer_id` (under `owner`) was confirmed: by the answer computed here, or where
        keys count, by a replica under another key (swarm/serving/cross_check.py)."""
        with self._lock:
            if (tally := self._tally(peer_id, owner)) is not None:
                tally.answers += 1

    def caught(self, peer_id: str, owner: bytes) -> None:
        """`peer_id` (under `owner`) was shown here to lie: what was counted of it, or of any peer under
        its key, is dropped, and nothing more is (a witness that caught a key lying vouches for none of
        its work). Remembered for at most `MAX_PEERS` peers."""
        with self._lock:
            if len(self._caught) < 2 * MAX_PEERS:
                self._caught.update((peer_id, owner) if owner else (peer_id,))
            self._tallies = {p: t for p, t in self._tallies.items() if p != peer_id and (not owner or t.owner != owner)}

    def answered(self, peer_id: str, owner: bytes, now: float | None = None) -> None:
        """`peer_id` answered a ping under `owner`, the key of a record naming it: up since its last
        answer, if that was at most `max_gap_s` ago."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if (tally := self._tally(peer_id, owner)) is None:
                return
            if tally.last_answer is not None and now - tally.last_answer <= self.max_gap_s:
                tally.uptime_s += now - tally.last_answer
            tally.last_answer = now

    def attestation(self, now: float | None = None) -> Attestation | None:
        """The signed attestation of everything counted so far, of the peers whose key is known (the
        `MAX_SUBJECTS` with most to their credit); None when there is nothing to attest."""
        with self._lock:
            tallies = [(p, t) for p, t in self._tallies.items() if t.owner is not None and t.owner not in self._caught]
            known = [t.contribution(p) for p, t in tallies]
        merged: dict[str, Contribution] = {}
        for c in known:  # a key that ran several peers is one subject
            was = merged.get(c.subject)
            merged[c.subject] = c if was is None else _merge(was, c)
        ranked = sorted(merged.values(), key=lambda c: sum(getattr(c, k) for k in KINDS), reverse=True)
        ranked = [c for c in ranked if any(getattr(c, k) for k in KINDS)]
        if not ranked:
            return None
        issued = int(time.time() if now is None else now)
        return sign(self.key, self.swarm, self.peer_id, ranked, issued, proof=self.proof)


def _merge(a: Contribution, b: Contribution) -> Contribution:
    """Two peers' counts under one key: steps by the newest, the rest added (within the bound)."""
    added = {k: min(getattr(a, k) + getattr(b, k), MAX_COUNT) for k in ("payloads", "answers", "uptime_s")}
    return a.model_copy(update={**added, "verified_step": max(a.verified_step, b.verified_step)})


@dataclass(frozen=True)
class Credit:
    """What counts of one key's work: per kind the second-largest amount other keys attest, and those keys."""

    key: str  # the subject's fingerprint
    verified_step: int
    payloads: int
    answers: int
    uptime_s: int
    attesters: tuple[str, ...]  # fingerprints of the keys whose attestations of it count

    @property
    def earned(self) -> bool:
        """Whether any kind of work counts (two keys other than its own attest some)."""
        return any((self.verified_step, self.payloads, self.answers, self.uptime_s))

    def row(self, name: str) -> dict:
        """The row `swarm-status --contributions`, the health page and the CSV show."""
        return {"key": self.key, "name": name, "verified_steps": self.verified_step, "accepted_payloads": self.payloads,
                "agreed_answers": self.answers, "uptime_s": self.uptime_s,
                "attesters": [a[:SHORT] for a in self.attesters]}  # fmt: skip


@dataclass
class Ledger:
    """The attestations a reader believes, newest per key, and the credits they add up to."""

    swarm: str
    membership: Membership  # the swarm's terms (a directory's, kept current there)
    latest: dict[bytes, Attestation] = field(default_factory=dict)  # by the subkey it was written under
    refusals: dict[str, str] = field(default_factory=dict)  # the last reason each key was refused, by fingerprint

    def refusal(self, subkey: bytes, attestation: Attestation, now: float) -> str | None:
        """Why `attestation`, written under `subkey`, does not count now (None: it does)."""
        key_text = subkey_key_text(subkey)
        if key_text is None or not _signed_by(key_text, self.swarm, attestation):
            return "forged: not signed by the key it was written under"
        if attestation.issued > now + MAX_SKEW_S or attestation.expires - attestation.issued > MAX_LIFETIME_S:
            return "its times are out of bounds"
        if attestation.expires <= now:
            return "expired"
        if self.membership.members_only:
            refused = self.membership.refusal(attestation.membership, attestation.peer_id, subkey, now)
            if refused:
                return f"not a member: {refused}"
        kept = self.latest.get(subkey)
        if kept is not None and attestation.issued < kept.issued:
            return "replayed: older than one already read"
        return None

    def take(self, found: dict[bytes, Attestation], now: float | None = None) -> None:
        """Keep the attestations of `found` (by subkey) that count, in place of their keys' older ones."""
        now = time.time() if now is None else now
        for subkey, attestation in found.items():
            refused = self.refusal(subkey, attestation, now)
            if refused is None:
                self.latest[subkey] = attestation
            elif self.refusals.get(owner_fingerprint(subkey)) != refused:
                logger.info("ignoring the attestation of key %s: %s", owner_fingerprint(subkey)[:SHORT], refused)
            if refused is not None and len(self.refusals) < MAX_PEERS:
                self.refusals[owner_fingerprint(subkey)] = refused
        self.latest = {s: a for s, a in self.latest.items() if a.expires > now}
        while len(self.latest) > MAX_PEERS:  # the soonest to expire go first
            del self.latest[min(self.latest, key=lambda s: self.latest[s].expires)]

    def rows(self, hosts: Iterable[Host], now: float | None = None) -> list[dict]:
        """The credits as the leaderboard shows them, each key named by the public name of its record
        among `hosts` ("" for a key that hosts nothing now)."""
        names = {owner_fingerprint(h.owner): h.announcement.public_name for h in hosts if h.owner}
        return [credit.row(names.get(credit.key, "")) for credit in self.credits(now)]

    def credits(self, now: float | None = None) -> list[Credit]:
        """Each attested key's credit, most credited first (see the module docstring)."""
        now = time.time() if now is None else now
        attested: dict[str, dict[str, dict[str, int]]] = {}  # subject -> attester -> kind -> amount
        for subkey, attestation in self.latest.items():
            if attestation.expires <= now:
                continue
            attester = owner_fingerprint(subkey)
            for c in attestation.contributions:
                if c.subject == attester or c.peer_id == attestation.peer_id:
                    continue  # nobody credits itself
                amounts = attested.setdefault(c.subject, {}).setdefault(attester, dict.fromkeys(KINDS, 0))
                for kind in KINDS:
                    amounts[kind] = max(amounts[kind], getattr(c, kind))
        credits = [_credit(subject, by_attester) for subject, by_attester in attested.items()]
        return sorted(credits, key=lambda c: (c.verified_step + c.payloads + c.answers, c.uptime_s), reverse=True)


def _credit(subject: str, by_attester: dict[str, dict[str, int]]) -> Credit:
    """Per kind, the second-largest amount the attesters give `subject` (0 with fewer than two)."""
    counted = {}
    for kind in KINDS:
        amounts = sorted((a[kind] for a in by_attester.values()), reverse=True)
        counted[kind] = amounts[1] if len(amounts) >= 2 else 0
    attesters = tuple(sorted(a for a, amounts in by_attester.items() if any(amounts.values())))
    return Credit(subject, attesters=attesters, **counted)


def publish(directory: SwarmDirectory, witness: Witness, wait: bool = False) -> bool:
    """Store `witness`'s attestation, if it has checked anything (True if stored, or sent when not
    `wait`ing); DHTUnavailable if `wait`ing and the DHT does not answer in time."""
    attestation = witness.attestation()
    return attestation is not None and directory.attest(attestation, attestation.expires - time.time(), wait)


def backed_keys(directory: SwarmDirectory, now: float | None = None) -> frozenset[str]:
    """The fingerprints of the keys the swarm's ledger credits with some work (`Credit.earned`), read
    from the DHT now; none (logged) if it does not answer: candidates are then ranked as if none were."""
    ledger = Ledger(directory.swarm, directory.membership)
    try:
        ledger.take(directory.attestations(), now)
    except DHTUnavailable as error:
        logger.warning("the ledger was not read (%s): no host's checkpoint is measured first for its credit", error)
        return frozenset()
    return frozenset(credit.key for credit in ledger.credits(now) if credit.earned)
