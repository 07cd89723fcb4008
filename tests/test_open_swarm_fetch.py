"""A fetch in an open swarm, where keys are free (issue 57's first hole): no download waits on a
stranger where one host suffices, a stranger's "busy" costs one deadline, a stranger's forged chunk
list is refused as it comes in, and no candidate that verifies is dropped in favour of one that was
merely faster.

Hosts are real DHT nodes (each its own process and libp2p daemon) driven from this process
(`swarm.lab.hosting.CheckpointHost`); a client joins them as `swarm-fetch` would and chooses at the
defaults (`choose_checkpoint`, keys_count false: a key costs nothing here).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random

import pytest
from hivemind.p2p import P2PContext
from hivemind.proto import runtime_pb2
from swarm_helpers import HOSTS_SWARM, client_of, wait_for

from swarm.checkpoints.choice import Candidate, Measured, SpotCheck, believable, choose_checkpoint, uniform_ce
from swarm.checkpoints.chunks import CHUNK_BYTES
from swarm.checkpoints.download import download
from swarm.checkpoints.store import CheckpointStore
from swarm.checkpoints.transfer import (
    FIRST_BYTE_TIMEOUT_S,
    BlockServicer,
    HostFailed,
    ask_chunk_list,
    open_run,
)
from swarm.lab.attacks import BusyJustInTime, ForgedListThenTrickle, Impersonating, degraded_block
from swarm.model.checkpoint import encode_block
from swarm.model.denoiser import Denoiser
from swarm.model.train import TrainConfig, block_trainer, train
from swarm.p2p.messages import DownloadRequest

SAVE = 10  # steps between saves: the poisoner announces one save ahead of the honest host
LATE_S = FIRST_BYTE_TIMEOUT_S - 2.0  # a late chunk list, still within the first-byte timeout
FORGED_FIRST_S = 2.0  # how much later than a forger's the honest host's chunk list comes in
PAYLOAD = random.Random(0).randbytes(24 * CHUNK_BYTES)  # a checkpoint's bytes, for downloads alone


@pytest.fixture
def honest_block(tiny_config, tiny_windows) -> Denoiser:
    trainer = block_trainer(tiny_config, 0, tiny_windows, TrainConfig(steps=60, warmup_steps=5))
    train(trainer, 60)
    return trainer.module


def honest_beside_poison(start, config, honest: Denoiser, check: SpotCheck, servicer=BlockServicer):
    """A lone honest host (through `servicer`) of `honest` at step `SAVE`, and a poisoner serving at
    full speed, one save ahead, `honest` made 3 tolerances worse on `check` (`degraded_block`): the
    nodes, and their two checkpoints. The poison is plausible alone (asserted): only a comparison with
    the honest candidate refuses it."""
    poison = degraded_block(honest, lambda d: check.measure(d, config, 0), 3 * check.tolerance)
    host, poisoner = start("honest", servicer), start("poisoner")
    good = host.put(encode_block(honest, config, 0, SAVE, HOSTS_SWARM), SAVE)
    ahead = poisoner.put(encode_block(poison, config, 0, 2 * SAVE, HOSTS_SWARM), 2 * SAVE)
    alone = Measured(Candidate(ahead, (), plausible=True), b"", poisoner.host(ahead), check.measure(poison, config, 0))
    assert believable([alone], check.tolerance, uniform_ce(config)), alone
    return host, poisoner, good, ahead


def test_a_stranger_stalling_its_chunk_list_holds_no_download_and_a_faster_poison_replaces_nothing(
    start, tiny_config, tiny_windows, honest_block
):
    """Issue 57, at the defaults: H is the lone honest host; S, a free key, announces H's checkpoint
    under its own key and answers its chunk list "busy" just before the timeout (`BusyJustInTime`);
    P, a free key, serves a poison one save ahead at full speed. H's download takes H's list as it
    comes and does not wait for S's: it is over before S has answered once. Both candidates are
    measured, and the choice is H's checkpoint."""
    check = SpotCheck(tiny_windows.fixed(64), seed=1)
    honest, poisoner, good, ahead = honest_beside_poison(start, tiny_config, honest_block, check)
    staller = start("staller", BusyJustInTime)
    hosts = [honest.host(good), staller.host(good), poisoner.host(ahead)]
    with client_of(honest, staller, poisoner) as client:
        choice = client.run(choose_checkpoint(client.p2p, hosts, tiny_config, 0, check), 120)
        answered = staller.servicer.answered["chunk_list"]
    wait_for(lambda: staller.servicer.asked["chunk_list"] >= 1, 10, "S asked for its chunk list")
    measured = {m.candidate.checkpoint: m for m in choice.measured}
    assert set(measured) == {good, ahead}, choice.measured  # neither dropped: the poison was measured beside H
    assert staller.peer_id in {h.peer_id for h in measured[good].candidate.hosts}  # S stood beside H
    assert answered == 0, answered  # asked, and not waited for
    assert choice.checkpoint == good and choice.host.peer_id == honest.peer_id, choice.measured


class LateLists(Impersonating, BlockServicer):
    """An honest host that answers its chunk lists `late_s` late (one loaded, or hashing a large file),
    then serves at full speed."""

    imitates = BlockServicer

    def __init__(self, block: int, store: CheckpointStore, late_s: float = LATE_S):
        super().__init__(block, store)
        self.late_s = late_s

    async def rpc_chunk_list(self, request: runtime_pb2.ExpertRequest,
                             context: P2PContext) -> runtime_pb2.ExpertResponse:  # fmt: skip
        await asyncio.sleep(self.late_s)
        return await super().rpc_chunk_list(request, context)


def test_a_forged_chunk_list_answered_first_is_refused_at_once_and_the_honest_list_is_fetched(start):
    """Issue 57: F, a free key, copies the lone honest host H's record (the same step, sha256, size and
    chunk list), answers its chunk list first with a forged one, then sends that list's chunks just
    within the inactivity timeout (`ForgedListThenTrickle`); H's list comes in `FORGED_FIRST_S` later.
    F's list is not the one the record names: F is dropped as it comes in, before it sent a chunk, and
    the download takes H's list. (Followed, F's list held the download to its deadline, where the
    sha256 of the whole would have refused it.)"""
    honest = start("honest", functools.partial(LateLists, late_s=FORGED_FIRST_S))
    forger = start("forger", ForgedListThenTrickle)
    info = honest.put(PAYLOAD, SAVE)
    assert forger.put(PAYLOAD, SAVE) == info  # it holds the honest file: its record is the honest one
    with client_of(honest, forger) as client:
        got = client.run(download(client.p2p, [forger.host(info), honest.host(info)], show_progress=False), 120)
    assert got.data == PAYLOAD and set(got.served) == {honest.peer_id}, got.served
    assert "chunk list whose sha256 is not the one its record names" in got.dropped.get(forger.peer_id, ""), got.dropped
    assert forger.servicer.sent == 0  # its first run, asked along with its list, was given up before a chunk came


def test_a_candidate_whose_list_came_late_and_that_then_delivers_is_not_dropped_for_a_faster_poison(
    start, tiny_config, tiny_windows, honest_block, caplog
):
    """H, the lone honest host, answers its chunk list late (within the first-byte timeout), then
    serves at full speed; P's poison one save ahead is in long before. H's download is judged by the
    bytes it verifies once its list is in, not by the time it took: the choice is H's checkpoint.
    (Judged by its time, it was dropped as slow, and the poison measured alone passed.)"""
    caplog.set_level(logging.WARNING, logger="swarm")
    check = SpotCheck(tiny_windows.fixed(64), seed=1)
    honest, poisoner, good, ahead = honest_beside_poison(start, tiny_config, honest_block, check, LateLists)
    with client_of(honest, poisoner) as client:
        choice = client.run(choose_checkpoint(client.p2p, [honest.host(good), poisoner.host(ahead)], tiny_config, 0,
                                              check), 120)  # fmt: skip
    assert choice.checkpoint == good, choice.measured
    assert {m.candidate.checkpoint for m in choice.measured} == {good, ahead}, choice.measured
    assert "its download was slow" not in caplog.text


@pytest.mark.parametrize("call", ["chunk_list", "download"])
def test_a_host_answering_busy_just_before_each_timeout_costs_one_deadline_not_one_per_try(start, call):
    """`ask_chunk_list` and `open_run` ask again while a host says busy, within one deadline for all
    their tries: a host that answers busy just before each timeout is asked twice, not
    `BUSY_RETRIES` + 1 times, and the call fails at the deadline."""
    deadline = 3.0
    staller = start("staller", lambda block, store: BusyJustInTime(block, stall_s=deadline - 1.0))
    info = staller.put(bytes(1000), 5)
    host = staller.host(info)
    with client_of(staller) as client:

        async def ask() -> None:
            if call == "chunk_list":
                await ask_chunk_list(client.p2p, host, info, deadline)
            else:
                request = DownloadRequest(block=0, sha256=info.sha256)
                await open_run(client.p2p, host, request, info.size, {}, timeout=deadline)

        with pytest.raises(HostFailed, match=f"within {deadline:.0f}s \\(busy tries included\\)"):
            client.run(ask(), 60)
        asked = staller.servicer.asked[call]
    assert 1 <= asked <= 2, asked  # a fresh timeout per try asked it BUSY_RETRIES + 1 times
