"""Checkpoint transfer over real hivemind P2P on 127.0.0.1, and tolerant reading of records."""

from __future__ import annotations

import hivemind
import pytest
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.utils import get_dht_time

from swarm.errors import SwarmError
from swarm.model.denoiser import build_block
from swarm.p2p.client import SwarmClient
from swarm.p2p.directory import Host, SwarmDirectory
from swarm.p2p.messages import PeerInfo
from swarm.p2p.network import EventLoopThread, NetworkOptions, start_dht
from swarm.p2p.records import BlockAnnouncement, CheckpointInfo, block_key
from swarm.p2p.store import CheckpointStore
from swarm.p2p.transfer import BlockServicer, fetch_verified


class Loop(EventLoopThread):
    """An event loop thread that shuts down, when closed, the P2P handles made through it."""

    def __init__(self):
        super().__init__()
        self.handles = []

    def p2p(self, dht):
        self.handles.append(self.run(dht.replicate_p2p(), 30))
        return self.handles[-1]


@pytest.fixture
def loop():
    loop = Loop()
    yield loop
    loop.close(*loop.handles)


def serve(loop, tmp_path, name, config, step):
    """A real DHT node whose P2P handle serves a checkpoint store holding block 0 at `step`."""
    dht = start_dht("transfer", NetworkOptions())
    store = CheckpointStore(tmp_path / name, config, block=0, swarm="transfer")
    info = store.save(build_block(config, 0), step)
    p2p = loop.p2p(dht)
    owner = RSASignatureValidator().local_public_key  # this process's key: it signs nothing here
    loop.run(BlockServicer(0, store, lambda: PeerInfo(block=0, owner=owner)).add_p2p_handlers(p2p), 30)
    return dht, store, info


def host(dht, info: CheckpointInfo) -> Host:
    announcement = BlockAnnouncement(peer_id=dht.peer_id.to_base58(), state="training", step=info.step, checkpoint=info)
    return Host(block=0, announcement=announcement, expires_at=get_dht_time() + 60)


def test_fetch_moves_past_lying_and_vanished_replicas_to_one_that_verifies(tmp_path, tiny_config, loop, caplog):
    tampered_dht, tampered_store, tampered_info = serve(loop, tmp_path, "tampered", tiny_config, 9)
    path = tampered_store.path_for(9)
    data = bytearray(path.read_bytes())
    data[-10:] = bytes(10)  # same size, other bytes: the announced sha256 no longer holds
    path.write_bytes(bytes(data))
    short_dht, _, short_info = serve(loop, tmp_path, "short", tiny_config, 8)
    gone_dht, _, gone_info = serve(loop, tmp_path, "gone", tiny_config, 7)
    good_dht, good_store, good_info = serve(loop, tmp_path, "good", tiny_config, 5)
    unservable = good_info.model_copy(update={"sha256": "0" * 64, "step": 10})  # a hash it cannot serve
    impostor = Host(0, host(good_dht, good_info).announcement, get_dht_time() + 60, owner=b"someone else's key")
    hosts = [
        host(good_dht, unservable),
        impostor,  # a record naming the good peer, written under another key
        host(tampered_dht, tampered_info),
        host(short_dht, short_info.model_copy(update={"size": short_info.size - 100})),  # sends more than announced
        host(gone_dht, gone_info),
        host(good_dht, good_info),
    ]
    gone_dht.shutdown()
    live = [str(m) for dht in (tampered_dht, short_dht, good_dht) for m in dht.get_visible_maddrs()]
    try:
        with SwarmClient("transfer", NetworkOptions(initial_peers=live)) as client:
            received, chosen = client.run(fetch_verified(client.p2p, hosts, tiny_config, 0, show_progress=False), 120)
            with pytest.raises(SwarmError, match="no replica"):
                client.run(fetch_verified(client.p2p, hosts[:-1], tiny_config, 0, show_progress=False), 120)
        assert chosen.peer_id == good_dht.peer_id.to_base58()
        assert received == good_store.path_for(5).read_bytes()
        messages = " ".join(r.getMessage() for r in caplog.records)
        assert "does not match its announced sha256" in messages
        assert "more than the announced" in messages
        assert "no checkpoint of block 0 with sha256 000000000000" in messages
        assert "does not own the record that names it" in messages
    finally:
        for dht in (tampered_dht, short_dht, good_dht):
            dht.shutdown()


def test_readers_skip_entries_that_break_the_schema():
    """A node without our validator holds a malformed entry: the reader keeps the good one."""
    key = hivemind.utils.crypto.RSAPrivateKey()
    signer = RSASignatureValidator(key)
    dht = hivemind.DHT(start=True, record_validators=[signer])
    try:
        good = BlockAnnouncement(peer_id="good", state="training", step=3).model_dump()
        expiration = get_dht_time() + 60
        assert dht.store(block_key("readers", 0), good, expiration, subkey=signer.local_public_key)
        assert dht.store(block_key("readers", 0), {"state": 42}, expiration, subkey=b"somebody")
        assert dht.store(block_key("readers", 0), b"junk", expiration, subkey=b"somebody-else")
        hosts = SwarmDirectory(dht, "readers", key).hosts(0)
        assert [h.announcement.peer_id for h in hosts] == ["good"]
    finally:
        dht.shutdown()
