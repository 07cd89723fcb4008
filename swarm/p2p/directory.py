"""Reading and writing one swarm's records on the DHT: the model, and who hosts which block.

Every DHT call has a deadline. A call that misses it raises `DHTUnavailable` (a SwarmError):
a command turns it into one line, and a long-running peer or bootstrap skips that round and
tries again, never dies of it.

The model record belongs to the swarm's creator: it is written under a subkey carrying the
creator's public key, so only the creator can write it, and a directory given the creator's
fingerprint (`creator`, from the line `swarm-bootstrap --new-swarm` prints) reads only that
entry, whatever others write beside it.

The model record also says whether the swarm is members-only. The directory keeps the creator's
terms, and the revocations the creator published (`S.revoked`, `read_revocations`), in its
`membership` (members.py): in a members-only swarm, a host record counts only if it carries a
valid proof of membership for the key that signed it; others are skipped like records that do
not parse. Every reader of hosts (fetch, joiners, the sync's replica list, serving, the health
page) goes through `census`, so none of them counts a non-member.

The model record may also price an identity (`identity_work`, work.py): then a host record counts
only if its nonce is work enough for the key that signed it and the peer id it names, and
`census` skips the others as it skips non-members.
"""

from __future__ import annotations

import logging
import random
import threading
from dataclasses import dataclass

from hivemind import DHT
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.utils import get_dht_time
from hivemind.utils.crypto import RSAPrivateKey

from swarm.errors import SwarmError
from swarm.model.denoiser import ModelConfig
from swarm.p2p.members import Membership, subkey_key_text
from swarm.p2p.network import DHT_CALL_TIMEOUT_S, RECORD_COPIES
from swarm.p2p.records import (
    Attestation,
    BlockAnnouncement,
    IdentityWork,
    ModelRecord,
    RevocationList,
    block_key,
    ledger_key,
    model_key,
    owner_fingerprint,
    parse_record,
    revoked_key,
)
from swarm.p2p.work import NOT_CHECKED_YET, WorkCheck
from swarm.waiting import WaitTimeout, wait_for

logger = logging.getLogger(__name__)

MAX_LOGGED_KEYS = 1024  # keys whose refused records are logged (once each)


class DHTUnavailable(SwarmError):
    """A DHT call did not finish in time or failed: skip this round, or tell the user."""


@dataclass(frozen=True)
class Host:
    """One peer's live entry for a block."""

    block: int
    announcement: BlockAnnouncement
    expires_at: float
    owner: bytes = b""  # the public key of the subkey it was written under; the peer must hold it

    @property
    def peer_id(self) -> str:
        return self.announcement.peer_id


class SwarmDirectory:
    """The records of swarm `swarm` on a running DHT, as typed objects.

    Args:
        private_key: the key this process signs its records with (None: the process-wide key,
            as the DHT's own signature validator uses).
        creator: the fingerprint of the swarm creator's key; the model record is read only from
            that key's entry. None: there must be only one model record.
        call_timeout: seconds any one DHT call may take.
    """

    def __init__(
        self,
        dht: DHT,
        swarm: str,
        private_key: RSAPrivateKey | None = None,
        creator: str | None = None,
        call_timeout: float = DHT_CALL_TIMEOUT_S,
    ):
        self.dht, self.swarm, self.creator, self.call_timeout = dht, swarm, creator, call_timeout
        # the subkey that carries this process's public key: only this process can write under it
        self.owner_subkey = RSASignatureValidator(private_key).local_public_key
        self._competitors_seen: set[str] = set()
        self._non_members_seen: set[bytes] = set()
        self.membership = Membership(swarm)  # open until the creator's model record says otherwise
        self.work = WorkCheck(swarm)  # identities free until the creator's model record prices them
        self._unworked_seen: set[bytes] = set()
        # hivemind's DHT hands each call to its process through one pipe with no lock of its own,
        # and a peer calls from several threads (training, announcer, pings)
        self._submitting = threading.Lock()

    @property
    def fingerprint(self) -> str:
        """The fingerprint of this process's key: what a join line pins when this process creates a swarm."""
        return owner_fingerprint(self.owner_subkey)

    @property
    def keys_count(self) -> bool:
        """Whether the number of keys that vouch for a record is evidence: only where a key costs
        something, in a swarm whose creator's model record makes it members-only (members.py) or
        prices an identity with work (work.py). In an open swarm at the defaults a key costs nothing:
        one stranger can make twenty, and have them vouch for one degraded checkpoint (outranking its
        lone honest host in `rank`) or each announce a different one (filling the candidates a fetch
        measures): issue 27, the Sybil row of benchmarks/attacks.py. There, those who choose a
        checkpoint measure every one first (`swarm.checkpoints.choice.choose_checkpoint`,
        `swarm.serving.replicas.Replicas`). A directory that has not read the model record takes
        the swarm as open: its readers measure more, never less."""
        return self.membership.members_only or self.work.required

    def publish_model(self, config: ModelConfig, lifetime_s: float, members_only: bool = False,
                      identity_work: IdentityWork | None = None) -> bool:  # fmt: skip
        """Store the model record under this process's key (the creator's)."""
        record = ModelRecord(config=config.to_dict(), config_hash=config.hash(), members_only=members_only,
                             identity_work=identity_work)  # fmt: skip
        return self._store(model_key(self.swarm), record.model_dump(), self.owner_subkey, lifetime_s)

    def publish_revocations(self, revocations: RevocationList, lifetime_s: float) -> bool:
        """Store the list of revoked certificates under this process's key (the creator's)."""
        return self._store(revoked_key(self.swarm), revocations.model_dump(), self.owner_subkey, lifetime_s)

    def read_revocations(self) -> None:
        """Take the creator's list of revoked certificates into `membership` (the list known stays if
        the creator's entry is not found; DHTUnavailable if the DHT does not answer in time)."""
        if self.membership.creator_key is None:
            return
        entries = self._entries(revoked_key(self.swarm))
        for subkey, entry in entries.items():
            if subkey_key_text(subkey) == self.membership.creator_key:
                revocations = parse_record(RevocationList, getattr(entry, "value", None))
                if revocations is not None:
                    self.membership.set_revoked(revocations)

    def read_model(self) -> ModelConfig | None:
        """The creator's model config; None if there is none yet (or the DHT did not answer in time)."""
        try:
            entries = self._entries(model_key(self.swarm))
        except DHTUnavailable as error:
            logger.warning("%s", error)
            return None
        configs, terms = {}, {}
        work_terms: dict[str, IdentityWork | None] = {}
        for subkey, entry in entries.items():
            # a warning, as for a config that fails below: a peer waits on this record, and should say why
            record = parse_record(ModelRecord, getattr(entry, "value", None), logging.WARNING)
            config = self._valid_model(record) if record is not None else None
            if config is not None:
                configs[owner_fingerprint(subkey)] = config
                terms[owner_fingerprint(subkey)] = subkey, record.members_only
                work_terms[owner_fingerprint(subkey)] = record.identity_work
        chosen = self._the_creators(configs)
        if chosen is not None:
            if self.creator is None and len(terms) > 1 and any(members_only for _, members_only in terms.values()):
                raise SwarmError(f"{len(terms)} keys wrote the model record of members-only swarm {self.swarm!r}: "
                                 "join with the --creator that swarm-bootstrap printed")  # fmt: skip
            if self.creator is None and len(set(work_terms.values())) > 1:
                raise SwarmError(f"{len(work_terms)} keys wrote the model record of swarm {self.swarm!r} with "
                                 "different prices of an identity: join with the --creator that swarm-bootstrap "
                                 "printed")  # fmt: skip
            creator = self.creator or next(iter(configs))
            self._take_terms(*terms[creator])
            self._take_work_terms(work_terms[creator])
        return chosen

    def _take_terms(self, creator_subkey: bytes, members_only: bool) -> None:
        """The creator's terms into `membership`, and in a members-only swarm its revocations."""
        if members_only and not self.membership.members_only:
            logger.info("swarm %r is members-only: records and requests of keys without a valid certificate "
                        "are ignored", self.swarm)  # fmt: skip
        self.membership.set_terms(creator_subkey, members_only)
        if members_only:
            try:
                self.read_revocations()
            except DHTUnavailable as error:
                logger.warning("revocations not read: %s", error)

    def _take_work_terms(self, terms: IdentityWork | None) -> None:
        """The creator's price of an identity into `work` (its own record's: nobody else can lower it)."""
        if terms is not None and terms.bits and terms != self.work.terms:
            logger.info("swarm %r prices an identity at %d bits of scrypt work: records without it are ignored",
                        self.swarm, terms.bits)  # fmt: skip
        self.work.terms = terms

    def _valid_model(self, record: ModelRecord) -> ModelConfig | None:
        try:
            config = ModelConfig.from_dict(record.config)
        except SwarmError as error:
            logger.warning("ignoring a model record of swarm %r: %s", self.swarm, error)
            return None
        if config.hash() != record.config_hash:
            logger.warning("ignoring a model record of swarm %r: its config does not match its hash", self.swarm)
            return None
        return config

    def _the_creators(self, configs: dict[str, ModelConfig]) -> ModelConfig | None:
        """The config the creator wrote (or the only one, if no creator is pinned); logs competitors once."""
        if self.creator is None:
            if len({c.hash() for c in configs.values()}) > 1:
                raise SwarmError(f"{len(configs)} model records compete for swarm {self.swarm!r}: "
                                 "join with the --creator that swarm-bootstrap printed")  # fmt: skip
            return next(iter(configs.values()), None)
        for fingerprint in configs.keys() - {self.creator} - self._competitors_seen:
            self._competitors_seen.add(fingerprint)
            logger.warning("ignoring a competing model record of swarm %r written by key %s (the creator is %s)",
                           self.swarm, fingerprint[:16], self.creator[:16])  # fmt: skip
        return configs.get(self.creator)

    def wait_for_model(self, timeout_s: float, stop: threading.Event | None = None) -> ModelConfig:
        """The swarm's model config, or SwarmError if nobody has published one within the timeout;
        WaitStopped as soon as `stop` is set."""
        try:
            return wait_for(self.read_model, timeout_s, "the model config", interval=1.0, stop=stop)
        except WaitTimeout:
            creator = f" by creator {self.creator[:16]}" if self.creator else ""
            raise SwarmError(
                f"no model config found for swarm {self.swarm!r}{creator}: is the join line right, "
                "and was the swarm created (swarm-bootstrap --new-swarm)?"
            ) from None

    def announce(self, block: int, announcement: BlockAnnouncement, lifetime_s: float, wait: bool = False) -> bool:
        """Store this peer's entry for a block, signed; expires after `lifetime_s` unless refreshed."""
        return self._store(block_key(self.swarm, block), announcement.model_dump(), self.owner_subkey, lifetime_s, wait)

    def attest(self, attestation: Attestation, lifetime_s: float, wait: bool = False) -> bool:
        """Store this process's attestation (swarm/p2p/ledger.py) under its key, in place of its last."""
        return self._store(ledger_key(self.swarm), attestation.model_dump(), self.owner_subkey, lifetime_s, wait)

    def attestations(self) -> dict[bytes, Attestation]:
        """Every live attestation that parses, by the subkey it was written under (ledger.py checks
        the rest); DHTUnavailable if the DHT does not answer in time."""
        found = {}
        for subkey, entry in self._entries(ledger_key(self.swarm)).items():
            attestation = parse_record(Attestation, getattr(entry, "value", None))
            if attestation is not None:
                found[subkey] = attestation
        return found

    def _store(self, key: str, value: dict, subkey: bytes, lifetime_s: float, wait: bool = True) -> bool:
        with self._submitting:
            future = self.dht.store(key, value, get_dht_time() + lifetime_s, subkey=subkey, return_future=True)
        if not wait:
            return True
        return bool(self._result(future, f"storing {key}"))

    def _entries(self, key: str) -> dict:
        """The entries (ValueWithExpiration) stored under `key`, by subkey; entries under no
        subkey are nobody's and skipped.

        A lookup asks the nodes that hold the record, all of them, and no more: with latest=True
        the search does not stop at the first answer that carries the record (one node's copy may
        lack an entry, or an entry's newest version, that another copy has), it merges every
        answer's entries, newest of each subkey, until it has visited the `beam_size` nearest
        nodes it can find. hivemind's default beam is the bucket size (20), four times the
        RECORD_COPIES nodes a store writes to; a beam of RECORD_COPIES still reaches every
        copy (the writers found those same nearest nodes) and saves the round trips spent on
        nodes that hold no copy. Its RECORD_COPIES workers ask the nearest nodes known all at
        once, so where the reader already knows them the lookup takes one round trip."""
        with self._submitting:
            future = self.dht.get(key, latest=True, beam_size=RECORD_COPIES, num_workers=RECORD_COPIES,
                                  return_future=True)  # fmt: skip
        found = self._result(future, f"reading {key}")
        if found is None or not isinstance(found.value, dict):
            return {}
        return {k: v for k, v in found.value.items() if isinstance(k, bytes)}

    def _result(self, future, what: str):
        try:
            return future.result(self.call_timeout)
        except Exception as error:  # a timeout, or the DHT process gone
            future.cancel()
            raise DHTUnavailable(f"{what} on the DHT failed ({type(error).__name__}) "
                                 f"within {self.call_timeout:.0f}s") from None

    def hosts(self, block: int) -> list[Host]:
        """Live, well-formed entries for a block (a record that does not parse is skipped)."""
        return self.census(block)[0]

    def census(self, block: int) -> tuple[list[Host], int]:
        """Live, well-formed entries for a block, and how many entries were skipped for not parsing
        or, in a members-only swarm, for want of a valid certificate (the health page shows that
        count: a reader never fails on them)."""
        hosts, skipped = [], 0
        for subkey, entry in self._entries(block_key(self.swarm, block)).items():
            announcement = parse_record(BlockAnnouncement, getattr(entry, "value", None))
            if announcement is None or not self._counts(announcement, subkey):
                skipped += 1
            elif announcement.state != "leaving":
                hosts.append(Host(block, announcement, entry.expiration_time, subkey))
        return self._worked(hosts, skipped)

    def _worked(self, hosts: list[Host], skipped: int) -> tuple[list[Host], int]:
        """The hosts whose identity work holds, where the swarm asks for it, and the skipped count with
        the others added (each key refused is logged once; one not checked yet is not)."""
        refusals = self.work.refusals([(h.owner, h.peer_id, h.announcement.work_nonce) for h in hosts])
        for host, refused in zip(hosts, refusals):
            if refused and refused != NOT_CHECKED_YET and host.owner not in self._unworked_seen \
                    and len(self._unworked_seen) < MAX_LOGGED_KEYS:  # fmt: skip
                self._unworked_seen.add(host.owner)
                logger.warning("ignoring the records of key %s (peer %s): %s",
                               owner_fingerprint(host.owner)[:16], host.peer_id, refused)  # fmt: skip
        return [h for h, refused in zip(hosts, refusals) if refused is None], skipped + sum(map(bool, refusals))

    def _counts(self, announcement: BlockAnnouncement, subkey: bytes) -> bool:
        """Whether a record counts: always in an open swarm; in a members-only one, if its proof of
        membership holds for its key and the peer it names (each key refused is logged once)."""
        if not self.membership.members_only:
            return True
        refused = self.membership.refusal(announcement.membership, announcement.peer_id, subkey)
        if refused and subkey not in self._non_members_seen and len(self._non_members_seen) < MAX_LOGGED_KEYS:
            self._non_members_seen.add(subkey)
            logger.warning("ignoring the records of key %s (peer %s): %s",
                           owner_fingerprint(subkey)[:16], announcement.peer_id, refused)  # fmt: skip
        return refused is None

    def all_hosts(self, n_blocks: int) -> dict[int, list[Host]]:
        return {block: self.hosts(block) for block in range(n_blocks)}

    def every_block_served(self, n_blocks: int) -> bool:
        """True when every block has a peer that finished training and serves (state 'serving')."""
        hosts = self.all_hosts(n_blocks)
        return all(any(h.announcement.state == "serving" for h in hs) for hs in hosts.values())


def least_hosted_block(hosts_by_block: dict[int, list[Host]], rng: random.Random | None = None) -> int:
    """The block with the fewest live hosts; ties broken at random."""
    fewest = min(len(hosts) for hosts in hosts_by_block.values())
    candidates = [block for block, hosts in hosts_by_block.items() if len(hosts) == fewest]
    return (rng or random).choice(candidates)

