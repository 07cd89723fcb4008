"""Checkpoint transfer over real hivemind P2P on 127.0.0.1, and tolerant reading of records.

Hosts are real DHT nodes (each its own process and libp2p daemon) driven from this process
(`swarm.lab.hosting.CheckpointHost`); a client joins them as `swarm-fetch` would.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import random

import hivemind
import pytest
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord
from hivemind.p2p import P2P
from hivemind.proto import runtime_pb2
from hivemind.utils import get_dht_time
from swarm_helpers import client_of

from swarm.checkpoints.chunks import CHUNK_BYTES, MAX_COPIES, ChunkList, ChunkPlan, Run, chunk_hashes, list_sha256
from swarm.checkpoints.download import STREAM_RETRIES, _Whole, download, download_verified
from swarm.checkpoints.transfer import (
    DOWNLOAD,
    DOWNLOADS_PER_PEER,
    BlockServicer,
    TransferError,
    download_replies,
    max_checkpoint_bytes,
)
from swarm.errors import SwarmError
from swarm.lab.attacks import CorruptChunks, GiantReplies, Impersonating, TricklingDownloads
from swarm.lab.hosting import CheckpointHost
from swarm.model.checkpoint import encode_block
from swarm.model.denoiser import ModelConfig, build_block
from swarm.p2p.directory import Host, SwarmDirectory
from swarm.p2p.messages import DownloadHeader, DownloadRequest, PayloadReply, PayloadRequest
from swarm.p2p.records import BlockAnnouncement, CheckpointInfo, SwarmRecordValidator, block_key
from swarm.sync.transport import POLLS_PER_PEER, PayloadServicer

PAYLOAD = random.Random(0).randbytes(24 * CHUNK_BYTES)  # a run of 2 chunks for each of 12 streams


def fetch(nodes: list[CheckpointHost], info: CheckpointInfo, **options):
    """The payload downloaded from `nodes`, all announcing `info`."""
    with client_of(*nodes) as client:
        hosts = [node.host(info) for node in nodes]
        return client.run(download(client.p2p, hosts, show_progress=False, **options), 120)


def messages(caplog) -> str:
    return " ".join(r.getMessage() for r in caplog.records)


async def fetch_verified(p2p: P2P, hosts: list[Host], config: ModelConfig, block: int) -> tuple[bytes, Host]:
    """The first checkpoint among `hosts`, each asked alone in the given order, that downloads and
    verifies through the production path (`download_verified`); each refusal is logged."""
    for host in hosts:
        try:
            downloaded, _ = await download_verified(p2p, [host], config, block, show_progress=False)
            return downloaded.data, host
        except (TransferError, SwarmError) as error:
            logging.getLogger(__name__).warning("block %d: %s; trying the next replica", block, error)
    raise SwarmError(f"block {block}: no replica served a checkpoint that verifies ({len(hosts)} tried)")


def test_a_checkpoint_comes_from_every_host_that_vouches_for_it(start):
    nodes = [start(f"h{i}") for i in range(3)]
    info = [node.put(PAYLOAD, 5) for node in nodes][0]
    got = fetch(nodes, info)
    assert got.data == PAYLOAD
    assert set(got.served) == {node.peer_id for node in nodes}, got.served  # each host served a share
    assert not got.dropped, got.dropped


def test_a_host_serving_corrupt_chunks_is_named_dropped_and_the_rest_comes_from_the_others(start, caplog):
    corrupt, *honest = start("corrupt", CorruptChunks), start("h0"), start("h1")
    info = [node.put(PAYLOAD, 5) for node in (corrupt, *honest)][0]
    got = fetch([corrupt, *honest], info)
    assert got.data == PAYLOAD
    reason = got.dropped[corrupt.peer_id]
    assert "sent chunk" in reason and "does not match" in reason, got.dropped
    assert corrupt.peer_id in messages(caplog)  # named where the operator looks
    assert set(got.served) == {node.peer_id for node in honest}
    assert corrupt.servicer.sent <= 2  # one run of its first stream: the others waited for a chunk that verifies


def test_a_reply_announced_longer_than_a_chunk_is_not_read_and_its_host_is_dropped(start):
    giant, honest = start("giant", GiantReplies), start("honest")
    info = giant.put(PAYLOAD, 5)
    honest.put(PAYLOAD, 5)
    got = fetch([giant, honest], info, inactivity_timeout=5)
    assert got.data == PAYLOAD and got.served == {honest.peer_id: len(PAYLOAD)}
    reason = got.dropped.get(giant.peer_id, "not dropped")
    # before reading it: not a timeout, nor after 16 MiB
    assert f"announced a message of {2**30} bytes" in reason, reason


def test_a_download_request_announced_longer_than_a_request_is_not_read(start):
    node = start("host")
    with client_of(node) as client:

        async def giant_request() -> bytes:
            handle = BlockServicer._get_handle_name(None, DOWNLOAD)
            _, reader, writer = await client.p2p.call_binary_stream_handler(node.dht.peer_id, handle)
            try:
                writer.write(P2P.MESSAGE_MARKER + (2**30).to_bytes(P2P.HEADER_LEN, P2P.BYTEORDER) + bytes(1024))
                await writer.drain()
                return await asyncio.wait_for(reader.read(), 10)  # a reader that believed it would wait for the rest
            except ConnectionError:
                return b""
            finally:
                writer.close()

        assert client.run(giant_request(), 30) == b""  # the host closed the stream at once


def test_a_stream_counts_against_its_callers_limit_from_the_moment_it_opens(start):
    """Streams that send nothing hold their caller's slots: the next request is answered busy
    (counted only once a request was read, any number of silent streams could be held)."""
    node = start("host")
    info = node.put(PAYLOAD, 5)
    with client_of(node) as client:

        async def silent_then_asked() -> DownloadHeader:
            handle = BlockServicer._get_handle_name(None, DOWNLOAD)
            silent = [await client.p2p.call_binary_stream_handler(node.dht.peer_id, handle)
                      for _ in range(DOWNLOADS_PER_PEER)]
            try:
                async with asyncio.timeout(10):  # until the host has taken every silent stream (in any order)
                    while sum(node.servicer.limit.in_flight.values()) < DOWNLOADS_PER_PEER:
                        await asyncio.sleep(0.05)
                replies = await download_replies(client.p2p, node.peer_id, DownloadRequest(block=0, sha256=info.sha256))
                try:
                    return DownloadHeader.decode(await asyncio.wait_for(anext(replies), 10))
                finally:
                    await replies.aclose()
            finally:
                for _, _, writer in silent:
                    writer.close()

        header = client.run(silent_then_asked(), 60)
    assert header.busy and header.size == 0, header


def test_a_forged_chunk_list_cannot_make_bad_bytes_pass(start):
    forgers = [start(f"f{i}", functools.partial(CorruptChunks, forge_list=True)) for i in range(2)]
    honest = start("h0")
    info = [node.put(PAYLOAD, 5) for node in (*forgers, honest)][0]
    # under the honest record, a forger's list is not the one the record names: it is refused as it comes in
    got = fetch([*forgers, honest], info)
    assert got.data == PAYLOAD and set(got.served) == {honest.peer_id}, got.served
    assert set(got.dropped) <= {f.peer_id for f in forgers}, got.dropped
    assert all("chunk list whose sha256 is not the one its record names" in why for why in got.dropped.values())
    # under a record naming its forged list (a checkpoint of its own), its chunks match that list; the whole does not
    forged_list = forgers[0].servicer._chunk_list_of(forgers[0].store.find(info.sha256))
    forged = info.model_copy(update={"chunks": list_sha256(forged_list)})
    with pytest.raises(TransferError, match="does not match its announced sha256"):
        fetch(forgers[:1], forged)


def test_a_chunk_plan_hands_out_long_runs_first_then_halves_and_last_chunks():
    plan = ChunkPlan(count=16, streams=4)
    runs = [plan.claim(stream) for stream in "abcdef"]
    assert [(r.next, r.end) for r in runs] == [(0, 4), (4, 7), (7, 10), (10, 12), (12, 13), (13, 14)]
    plan.release("f")  # its stream stopped before fetching: chunk 13 is free again
    assert (plan.claim("f").next, plan.runs["f"].end) == (13, 14)
    assert (plan.claim("g").next, plan.runs["g"].end) == (14, 15) and plan.claim("h").next == 15
    stolen = plan.claim("i")  # nothing is unclaimed: the back half of the longest run
    assert (stolen.next, stolen.end, plan.runs["a"].end) == (2, 4, 2)
    for stream, run in list(plan.runs.items()):
        for index in range(run.next, run.end - 1):
            plan.received(stream, index)  # every run down to its last chunk
    copies = [plan.claim(f"copy{n}") for n in range(len(plan.runs) * MAX_COPIES)]
    assert all(copy is not None and copy.left == 1 for copy in copies[: len(copies) // 2])
    assert copies[-1] is None  # no chunk is fetched by more than MAX_COPIES streams at once
    for stream, run in list(plan.runs.items()):
        if run.left:
            plan.received(stream, run.next)
    assert plan.complete


def test_chunks_put_together_in_any_order_give_the_file_and_give_each_chunk_back():
    data = PAYLOAD[: 5 * CHUNK_BYTES + 1000]  # a short last chunk
    chunk = {i: data[i * CHUNK_BYTES : (i + 1) * CHUNK_BYTES] for i in range(6)}
    whole = _Whole(ChunkList(len(data), chunk_hashes(data)))
    for index in (3, 0, 5, 1):
        whole.add(index, chunk[index], f"peer{index % 2}")
    assert not whole.complete
    # what a next list starts from
    assert {i: c.data for i, c in whole.chunks().items()} == {i: chunk[i] for i in (0, 1, 3, 5)}
    for index in (4, 2):
        whole.add(index, chunk[index], "peer2")
    assert whole.complete and whole.data() == data
    assert whole.sha256() == hashlib.sha256(data).hexdigest()
    assert whole.sources == {3: "peer1", 0: "peer0", 5: "peer1", 1: "peer1", 4: "peer2", 2: "peer2"}
    assert {i: c.data for i, c in whole.chunks().items()} == chunk


def test_a_first_run_can_be_assigned_and_a_stream_never_steals_from_its_own_host():
    plan = ChunkPlan(count=8, streams=2)
    plan.assign("early", Run(4, 6))  # asked along with the chunk list, before the plan
    assert (plan.claim("a").next, plan.runs["a"].end) == (0, 3)  # the unclaimed chunks around it
    assert [(r.next, r.end) for r in (plan.claim("b"), plan.claim("c"))] == [(3, 4), (6, 7)]
    assert plan.claim("d").next == 7
    # nothing unclaimed, and never from its own host's
    assert plan.claim("e", own={"a", "b", "c", "d", "early"}) is None
    assert plan.claim("e") is not None  # an idle stream steals from another host's


class CutStreams(Impersonating, BlockServicer):
    """Ends each of its first `cuts` streams of more than one chunk after `keep` replies (its
    header is the first), as a network may cut a stream: honest bytes, too few."""

    imitates = BlockServicer

    def __init__(self, *args, cuts: int, keep: int):
        super().__init__(*args)
        self.cuts, self.keep = cuts, keep

    async def _stream_run(self, path, first, chunks):
        cut, sent = chunks > 1 and self.cuts > 0, 0
        self.cuts -= cut
        async for message in super()._stream_run(path, first, chunks):
            if cut and sent == self.keep:
                return
            yield message
            sent += 1


@pytest.mark.parametrize(("keep", "failure"), [(2, "bytes asked"), (0, "before its header")])
def test_a_host_whose_streams_end_early_is_asked_again_a_few_times_then_dropped(start, keep, failure):
    cut = start(f"cut{keep}", functools.partial(CutStreams, cuts=STREAM_RETRIES, keep=keep))
    info = cut.put(PAYLOAD, 5)
    got = fetch([cut], info)
    assert got.data == PAYLOAD and not got.dropped, got.dropped
    cutting = start(f"cutting{keep}", functools.partial(CutStreams, cuts=10**6, keep=keep))
    info = cutting.put(PAYLOAD, 5)
    with pytest.raises(TransferError, match=failure):
        fetch([cutting], info)


def test_fetch_moves_past_lying_and_vanished_replicas_to_one_that_verifies(start, tiny_config, caplog):
    tampered = start("tampered")
    tampered_info = tampered.store.save(build_block(tiny_config, 0), 9)
    path = tampered.store.path_for(9)
    data = bytearray(path.read_bytes())
    data[-10:] = bytes(10)  # same size, other bytes: the announced sha256 no longer holds
    path.write_bytes(bytes(data))
    short = start("short")
    short_info = short.store.save(build_block(tiny_config, 0), 8)
    gone = start("gone")
    gone_info = gone.store.save(build_block(tiny_config, 0), 7)
    good = start("good")
    good_info = good.store.save(build_block(tiny_config, 0), 5)
    unservable = good_info.model_copy(update={"sha256": "0" * 64, "step": 10})  # a hash it cannot serve
    impostor = Host(0, good.host(good_info).announcement, get_dht_time() + 60, owner=b"someone else's key")
    hosts = [
        good.host(unservable),
        impostor,  # a record naming the good peer, written under another key
        tampered.host(tampered_info),
        short.host(short_info.model_copy(update={"size": short_info.size - 100})),  # holds more than announced
        gone.host(gone_info),
        good.host(good_info),
    ]
    gone.close()
    with client_of(tampered, short, good) as client:
        received, chosen = client.run(fetch_verified(client.p2p, hosts, tiny_config, 0), 120)
        with pytest.raises(SwarmError, match="no replica"):
            client.run(fetch_verified(client.p2p, hosts[:-1], tiny_config, 0), 120)
    assert chosen.peer_id == good.peer_id
    assert received == good.store.path_for(5).read_bytes()
    logged = messages(caplog)
    assert "does not match its sha256 in the chunk list" in logged  # the tampered bytes: its list is its record's
    assert "more than the announced" in logged
    assert "no checkpoint of block 0 with sha256 000000000000" in logged
    assert "does not own the record that names it" in logged


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


def test_nodes_refuse_a_block_record_without_its_owners_key_or_off_its_schema():
    """What every node's validator refuses, so that no reader ever holds it (readers skip it too:
    the test above; test_swarm stores such records on a real DHT)."""
    validator = SwarmRecordValidator("nodes")
    key = DHTID.generate(source=block_key("nodes", 0)).to_bytes()
    owned = RSASignatureValidator(hivemind.utils.crypto.RSAPrivateKey()).local_public_key

    def record(subkey: bytes, value: object) -> DHTRecord:
        return DHTRecord(key, subkey, DHTProtocol.serializer.dumps(value), get_dht_time() + 60)

    good = BlockAnnouncement(peer_id="p", state="training", step=1).model_dump()
    assert validator.validate(record(owned, good))
    assert not validator.validate(record(b"no key in this subkey", good))
    assert not validator.validate(record(owned, {"peer_id": "x", "state": "hacking", "step": -1}))
    # a checkpoint without the sha256 of its chunk list: optional, a forger would leave it out (issue 57)
    serving = {"peer_id": "p", "state": "serving", "step": 3, "checkpoint": {"step": 3, "sha256": "cd" * 32, "size": 9}}
    assert not validator.validate(record(owned, serving))
    serving["checkpoint"]["chunks"] = "ab" * 32
    assert validator.validate(record(owned, serving))


def test_a_stream_that_goes_quiet_is_given_up_whatever_its_size(start, tiny_config):
    """The record announces a plausible size; the host lists it, sends a header and then nothing."""
    size = max_checkpoint_bytes(tiny_config)
    quiet = start("quiet", lambda block, store: TricklingDownloads(block, every_s=3600, size=size))
    info = CheckpointInfo(step=3, sha256="cd" * 32, size=size, chunks=quiet.servicer.chunks)
    with pytest.raises(TransferError, match="sent nothing for 1s"):
        fetch([quiet], info, inactivity_timeout=1.0)


def test_a_checkpoint_announced_heavier_than_a_block_is_refused_before_anyone_is_asked(tiny_config):
    """The bound inside the download, for callers that do not rank hosts first (merge rounds,
    the health page); `rank`'s own bound is tested in test_choice. No P2P: nothing may be asked."""
    info = CheckpointInfo(step=3, sha256="cd" * 32, size=max_checkpoint_bytes(tiny_config) + 1, chunks="cd" * 32)
    heavy = Host(0, BlockAnnouncement(peer_id="heavy", state="serving", step=3, checkpoint=info), get_dht_time() + 60)
    with pytest.raises(TransferError, match="more than a block of this model weighs"):
        asyncio.run(download_verified(None, [heavy], tiny_config, 0, show_progress=False))


def test_a_checkpoint_of_another_block_or_model_is_refused_though_its_hash_matches(start, tiny_config, caplog):
    other_model = ModelConfig(**{**tiny_config.to_dict(), "codebook_seed": 1})
    wrong = {"block": encode_block(build_block(tiny_config, 1), tiny_config, 1, 5),
             "model": encode_block(build_block(other_model, 0), other_model, 0, 5)}  # fmt: skip
    nodes = [start(name) for name in wrong]
    # records tell the truth about these bytes
    hosts = [node.host(node.put(data, 5)) for node, data in zip(nodes, wrong.values())]
    with client_of(*nodes) as client:
        with pytest.raises(SwarmError, match="no replica"):
            client.run(fetch_verified(client.p2p, hosts, tiny_config, 0), 60)
    logged = messages(caplog)
    assert "holds block 1, not block 0" in logged and "different model config" in logged


def test_one_peer_may_hold_only_a_few_downloads_and_sync_polls_at_once(start):
    node = start("busy")
    big = node.put(bytes(64 * 1024**2), 6)  # large enough that a stream stays open while unread
    node.serve(PayloadServicer(block=0, deadline=3.0))
    with client_of(node) as client:
        request = DownloadRequest(block=0, sha256=big.sha256)

        async def open_streams(count: int) -> list[DownloadHeader]:
            streams = [await download_replies(client.p2p, node.peer_id, request) for _ in range(count)]
            headers = [DownloadHeader.decode(await anext(s)) for s in streams]
            for stream in streams:
                await stream.aclose()
            return headers

        headers = client.run(open_streams(DOWNLOADS_PER_PEER + 1), 60)
        busy = ["busy" in h.error and h.busy for h in headers]
        assert any(busy) and not all(busy), headers  # one stream too many is turned away at once

        polls = PayloadServicer.get_stub(client.p2p, node.dht.peer_id)
        poll = runtime_pb2.ExpertRequest(metadata=PayloadRequest(block=0, step=5).encode())

        async def poll_at_once(count: int) -> list[str]:
            replies = await asyncio.gather(*(polls.rpc_payload(poll, timeout=30) for _ in range(count)))
            return sorted(PayloadReply.decode(r.metadata).status for r in replies)

        assert client.run(poll_at_once(POLLS_PER_PEER + 1), 60) == ["busy", *["not yet"] * POLLS_PER_PEER]
