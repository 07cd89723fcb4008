"""Reading and writing one swarm's records on the DHT: the model, and who hosts which block."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

from hivemind import DHT
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.utils import get_dht_time
from hivemind.utils.crypto import RSAPrivateKey

from swarm.errors import SwarmError
from swarm.model.denoiser import ModelConfig
from swarm.p2p.records import BlockAnnouncement, ModelRecord, block_key, model_key, parse_record
from swarm.waiting import WaitTimeout, wait_for

logger = logging.getLogger(__name__)

DHT_CALL_TIMEOUT_S = 20.0


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
    """The records of swarm `swarm` on a running DHT, as typed objects."""

    def __init__(self, dht: DHT, swarm: str, private_key: RSAPrivateKey | None = None):
        self.dht, self.swarm = dht, swarm
        # the subkey that carries this process's public key: only this process can write under it
        self.owner_subkey = RSASignatureValidator(private_key).local_public_key

    def publish_model(self, config: ModelConfig, lifetime_s: float) -> bool:
        record = ModelRecord(config=config.to_dict(), config_hash=config.hash())
        return self._store(model_key(self.swarm), record.model_dump(), None, lifetime_s)

    def read_model(self) -> ModelConfig | None:
        found = self.dht.get(model_key(self.swarm), latest=True, return_future=True).result(DHT_CALL_TIMEOUT_S)
        record = parse_record(ModelRecord, found.value) if found is not None else None
        if record is None:
            return None
        config = ModelConfig.from_dict(record.config)
        if config.hash() != record.config_hash:
            logger.warning("ignoring %s: its config does not match its hash", model_key(self.swarm))
            return None
        return config

    def wait_for_model(self, timeout_s: float) -> ModelConfig:
        """The swarm's model config, or SwarmError if nobody has published one within the timeout."""
        try:
            return wait_for(self.read_model, timeout_s, "the model config", interval=1.0)
        except WaitTimeout:
            raise SwarmError(
                f"no model config found for swarm {self.swarm!r}: is the name right, "
                "and was the swarm created (swarm-bootstrap --new-swarm)?"
            ) from None

    def announce(self, block: int, announcement: BlockAnnouncement, lifetime_s: float, wait: bool = False) -> bool:
        """Store this peer's entry for a block, signed; expires after `lifetime_s` unless refreshed."""
        return self._store(block_key(self.swarm, block), announcement.model_dump(), self.owner_subkey, lifetime_s, wait)

    def _store(self, key: str, value: dict, subkey: bytes | None, lifetime_s: float, wait: bool = True) -> bool:
        future = self.dht.store(key, value, get_dht_time() + lifetime_s, subkey=subkey, return_future=True)
        if not wait:
            return True
        return bool(future.result(DHT_CALL_TIMEOUT_S))

    def hosts(self, block: int) -> list[Host]:
        """Live, well-formed entries for a block (a record that does not parse is skipped)."""
        found = self.dht.get(block_key(self.swarm, block), latest=True, return_future=True).result(DHT_CALL_TIMEOUT_S)
        if found is None or not isinstance(found.value, dict):
            return []
        hosts = []
        for subkey, entry in found.value.items():
            announcement = parse_record(BlockAnnouncement, getattr(entry, "value", None))
            if announcement is not None and announcement.state != "leaving" and isinstance(subkey, bytes):
                hosts.append(Host(block, announcement, entry.expiration_time, subkey))
        return hosts

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


def freshest_first(hosts: list[Host], rng: random.Random | None = None) -> list[Host]:
    """Hosts that can serve a checkpoint, newest checkpoint first (ties in random order)."""
    serving = [h for h in hosts if h.announcement.checkpoint is not None]
    (rng or random).shuffle(serving)
    return sorted(serving, key=lambda h: h.announcement.checkpoint.step, reverse=True)
