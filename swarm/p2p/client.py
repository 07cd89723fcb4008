"""A process that joins a swarm to ask it things: the commands, the benchmarks and the tests.

`SwarmClient` is a DHT node in client mode (it asks, it does not store others' records), the
swarm's directory on it, and an event loop thread with a P2P handle for calls to peers. Given a
member's credentials (`--member-key`, `--certificate`), it answers `rpc_info` with its proof of
membership, which the peers of a members-only swarm ask before they serve it (gate.py).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Awaitable
from typing import Any

from hivemind.utils.crypto import RSAPrivateKey

from swarm.errors import SwarmError
from swarm.model.denoiser import ModelConfig
from swarm.p2p.directory import SwarmDirectory
from swarm.p2p.info import InfoServicer
from swarm.p2p.ledger import Witness
from swarm.p2p.members import Credentials
from swarm.p2p.messages import PeerInfo
from swarm.p2p.network import EventLoopThread, NetworkOptions, start_dht, stop_child
from swarm.p2p.tokenizer import swarm_peer_ids, units_from_swarm

P2P_START_TIMEOUT_S = 30.0


class SwarmClient:
    """Joins swarm `swarm` as a client on entering, leaves it on exit (a context manager)."""

    def __init__(self, swarm: str, network: NetworkOptions, creator: str | None = None,
                 credentials: Credentials | None = None):  # fmt: skip
        self.swarm, self.creator, self.credentials = swarm, creator, credentials
        self.network = dataclasses.replace(network, client_mode=True)

    def __enter__(self) -> SwarmClient:
        key = self.credentials.key if self.credentials else None
        self.dht = start_dht(self.swarm, self.network, key)
        try:
            self.directory = SwarmDirectory(self.dht, self.swarm, key, self.creator, self.network.dht_timeout)
            self.loop = EventLoopThread()
            self.p2p = self.loop.run(self.dht.replicate_p2p(), P2P_START_TIMEOUT_S)
            if self.credentials is not None:
                proof = self.credentials.proof(self.dht.peer_id.to_base58())
                info = PeerInfo(owner=self.directory.owner_subkey, membership=proof)
                self.loop.run(InfoServicer(lambda: info).add_p2p_handlers(self.p2p), P2P_START_TIMEOUT_S)
        except BaseException:
            stop_child(self.dht, self.dht.shutdown)
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.loop.close(self.p2p)
        stop_child(self.dht, self.dht.shutdown)

    def wait_for_model(self, timeout_s: float) -> ModelConfig:
        """The swarm's model config (directory.wait_for_model), with its units at hand: a tokenizer this
        machine lacks is fetched from the swarm's peers and checked against the config's hash."""
        config = self.directory.wait_for_model(timeout_s)
        peer_ids = functools.partial(swarm_peer_ids, self.network.initial_peers, self.directory, config.n_blocks)
        units_from_swarm(config, self.loop, self.p2p, peer_ids)
        return config

    def witness(self) -> Witness:
        """A witness of what this client checks of the peers (swarm/p2p/ledger.py), signing with the
        key its DHT records are signed with (a member's, else hivemind's key of this process)."""
        key = self.credentials.key if self.credentials else RSAPrivateKey.process_wide()
        peer_id = self.dht.peer_id.to_base58()
        proof = self.credentials.proof(peer_id) if self.credentials else None
        return Witness(key, self.swarm, peer_id, max_gap_s=0.0, proof=proof)

    def run(self, coro: Awaitable[Any], timeout: float) -> Any:
        """Run a P2P coroutine on the client's loop and wait for it; SwarmError past `timeout`."""
        try:
            return self.loop.run(coro, timeout)
        except TimeoutError:
            raise SwarmError(f"a call to the swarm did not finish within {timeout:.0f}s") from None
