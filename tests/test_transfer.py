"""Checkpoint transfer over real hivemind P2P on 127.0.0.1, and tolerant reading of records."""

from __future__ import annotations

import asyncio

import hivemind
import pytest
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.proto import runtime_pb2
from hivemind.utils import get_dht_time

from swarm.errors import SwarmError
from swarm.lab.attacks import TricklingDownloads
from swarm.model.checkpoint import encode_block
from swarm.model.denoiser import ModelConfig, build_block
from swarm.p2p.client import SwarmClient
from swarm.p2p.directory import Host, SwarmDirectory
from swarm.p2p.messages import DownloadHeader, DownloadRequest, PayloadReply, PayloadRequest, PeerInfo
from swarm.p2p.network import EventLoopThread, NetworkOptions, start_dht
from swarm.p2p.records import BlockAnnouncement, CheckpointInfo, block_key
from swarm.p2p.store import CheckpointStore
from swarm.p2p.transfer import (
    DOWNLOADS_PER_PEER,
    BlockServicer,
    TransferError,
    download,
    fetch_verified,
    max_checkpoint_bytes,
)
from swarm.sync.exchange import POLLS_PER_PEER, PayloadServicer


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


def test_a_stream_that_goes_quiet_is_given_up_whatever_its_size(tmp_path, tiny_config, loop):
    """The record announces a plausible size; the host sends a header and then nothing."""
    quiet = start_dht("transfer", NetworkOptions())
    loop.run(TricklingDownloads(0, lambda: PeerInfo(block=0, owner=b""), every_s=3600).add_p2p_handlers(loop.p2p(quiet)), 30)
    info = CheckpointInfo(step=3, sha256="cd" * 32, size=max_checkpoint_bytes(tiny_config))
    try:
        with SwarmClient("transfer", NetworkOptions(initial_peers=[str(m) for m in quiet.get_visible_maddrs()])) as client:
            with pytest.raises(TransferError, match="sent nothing for 1s"):
                client.run(download(client.p2p, host(quiet, info), show_progress=False, inactivity_timeout=1.0), 60)
    finally:
        quiet.shutdown()


def test_a_checkpoint_of_another_block_or_model_is_refused_though_its_hash_matches(tmp_path, tiny_config, loop, caplog):
    other_model = ModelConfig(**{**tiny_config.to_dict(), "codebook_seed": 1})
    wrong = {"block": encode_block(build_block(tiny_config, 1), tiny_config, 1, 5),
             "model": encode_block(build_block(other_model, 0), other_model, 0, 5)}  # fmt: skip
    hosts, dhts = [], []
    for name, data in wrong.items():
        dht, store, _ = serve(loop, tmp_path, name, tiny_config, 4)
        store.path_for(5).write_bytes(data)  # its record tells the truth about these bytes
        hosts.append(host(dht, store.info(store.path_for(5))))
        dhts.append(dht)
    try:
        live = [str(m) for dht in dhts for m in dht.get_visible_maddrs()]
        with SwarmClient("transfer", NetworkOptions(initial_peers=live)) as client:
            with pytest.raises(SwarmError, match="no replica"):
                client.run(fetch_verified(client.p2p, hosts, tiny_config, 0, show_progress=False), 60)
        messages = " ".join(r.getMessage() for r in caplog.records)
        assert "holds block 1, not block 0" in messages and "different model config" in messages
    finally:
        for dht in dhts:
            dht.shutdown()


def test_one_peer_may_hold_only_a_few_downloads_and_sync_polls_at_once(tmp_path, tiny_config, loop):
    dht, store, _ = serve(loop, tmp_path, "busy", tiny_config, 4)
    store.path_for(6).write_bytes(bytes(64 * 1024**2))  # large enough that a stream stays open while unread
    big = store.info(store.path_for(6))
    payloads = PayloadServicer(block=0, deadline=3.0)
    loop.run(payloads.add_p2p_handlers(loop.handles[-1]), 30)
    try:
        with SwarmClient("transfer", NetworkOptions(initial_peers=[str(m) for m in dht.get_visible_maddrs()])) as client:
            blocks = BlockServicer.get_stub(client.p2p, dht.peer_id)
            request = runtime_pb2.ExpertRequest(metadata=DownloadRequest(block=0, sha256=big.sha256).encode())

            async def open_streams(count: int) -> list[DownloadHeader]:
                streams = [await blocks.rpc_download(request) for _ in range(count)]
                return [DownloadHeader.decode((await anext(s)).metadata) for s in streams]

            headers = client.run(open_streams(DOWNLOADS_PER_PEER + 1), 60)
            busy = ["busy" in h.error for h in headers]
            assert any(busy) and not all(busy), headers  # one stream too many is turned away at once

            polls = PayloadServicer.get_stub(client.p2p, dht.peer_id)
            poll = runtime_pb2.ExpertRequest(metadata=PayloadRequest(block=0, step=5).encode())

            async def poll_at_once(count: int) -> list[str]:
                replies = await asyncio.gather(*(polls.rpc_payload(poll, timeout=30) for _ in range(count)))
                return sorted(PayloadReply.decode(r.metadata).status for r in replies)

            assert client.run(poll_at_once(POLLS_PER_PEER + 1), 60) == ["busy", "not yet", "not yet"]
    finally:
        dht.shutdown()
