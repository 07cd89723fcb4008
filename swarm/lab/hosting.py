"""Nodes driven from this process: a real DHT node (its own process and libp2p daemon, started by
`start_dht`) under a key of its own, with a P2P handle here for its services, on 127.0.0.1 or on
a host of a `NetLab`. Many of them fit a small machine where as many `swarm-peer` processes
(each with torch and a model) would not.

- `InProcessNode`: the node, its key, its directory, the services it serves;
- `CheckpointHost`: a node serving checkpoint files of one block from a folder, through
  `BlockServicer` or one of the lying servicers of attacks.py. The transfer tests and
  `benchmarks/transfer.py` share it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path

from hivemind.utils import get_dht_time
from hivemind.utils.crypto import RSAPrivateKey

from swarm.checkpoints.store import CheckpointStore, describe
from swarm.checkpoints.transfer import BlockServicer
from swarm.lab.netlab import Node
from swarm.model.denoiser import ModelConfig
from swarm.p2p.directory import Host, SwarmDirectory
from swarm.p2p.info import InfoServicer
from swarm.p2p.messages import PeerInfo
from swarm.p2p.network import EventLoopThread, NetworkOptions, start_dht, stop_child, visible_maddrs
from swarm.p2p.records import BlockAnnouncement, CheckpointInfo

P2P_START_TIMEOUT_S = 30.0
HOST_RECORD_S = 600.0  # how long the records `CheckpointHost.host` makes stay live
FILES_KEPT = 8  # checkpoints a host keeps (a benchmark serves several sizes)


class InProcessNode:
    """A DHT node in this process, under a key of its own, with a P2P handle for its servicers;
    on `where` (a lab host) if given, else on 127.0.0.1. A context manager: closing stops it."""

    def __init__(self, swarm: str, initial_peers: Sequence[str] = (), where: Node | None = None,
                 key: RSAPrivateKey | None = None):  # fmt: skip
        """`key`: the key its records are signed with (a member's, say); a new one by default."""
        self.swarm, self.key = swarm, key or RSAPrivateKey()
        address = where.address if where is not None else "127.0.0.1"
        network = NetworkOptions(initial_peers=list(initial_peers), host_maddrs=[f"/ip4/{address}/tcp/0"])
        with where.inside() if where is not None else contextlib.nullcontext():
            self.dht = start_dht(swarm, network, self.key)
        self.loop = EventLoopThread(name="node-loop")
        self.p2p = self.loop.run(self.dht.replicate_p2p(), P2P_START_TIMEOUT_S)
        self.directory = SwarmDirectory(self.dht, swarm, self.key)
        self.peer_id = self.dht.peer_id.to_base58()
        self._closed = False

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.loop.close(self.p2p)
            stop_child(self.dht, self.dht.shutdown)

    @property
    def maddrs(self) -> list[str]:
        return visible_maddrs(self.dht)

    def serve(self, *servicers) -> None:
        for servicer in servicers:
            self.loop.run(servicer.add_p2p_handlers(self.p2p), P2P_START_TIMEOUT_S)

    def info(self, block: int) -> PeerInfo:
        return PeerInfo(block=block, owner=self.directory.owner_subkey)


class CheckpointHost(InProcessNode):
    """A node that serves the checkpoint files of `block` in `folder` through `servicer` (called
    as `servicer(block, store)`: BlockServicer, or a lying one), and answers `rpc_info`."""

    def __init__(self, folder: Path, swarm: str, block: int = 0,
                 servicer: Callable[..., BlockServicer] = BlockServicer, initial_peers: Sequence[str] = (),
                 where: Node | None = None, config: ModelConfig | None = None):  # fmt: skip
        super().__init__(swarm, initial_peers, where)
        self.block = block
        self.store = CheckpointStore(Path(folder), config or ModelConfig(), block, swarm, keep=FILES_KEPT)
        self.servicer = servicer(block, self.store)
        self.serve(InfoServicer(lambda: self.info(block)), self.servicer)

    def put(self, data: bytes, step: int) -> CheckpointInfo:
        """Keep `data` as this host's checkpoint of `step` (any bytes: a benchmark serves large ones)."""
        info = describe(step, data).info
        self.store.adopt(data, info)
        return info

    def host(self, info: CheckpointInfo) -> Host:
        """The record a downloader would read for this host announcing `info` (signed by its key)."""
        announcement = BlockAnnouncement(peer_id=self.peer_id, state="serving", step=info.step, checkpoint=info)
        return Host(self.block, announcement, get_dht_time() + HOST_RECORD_S, self.directory.owner_subkey)
