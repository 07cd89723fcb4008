"""Bringing a block's drifted replicas back together, without trusting any one of them.

Replicas that applied the same payloads hold the same weights and announce the same sha256
for a checkpoint of the same step. When they may have drifted (a missed payload, a refused
one, a restart), each saves its checkpoint at the round's step, reads the others' checkpoints
of that step (downloaded and verified like any other: size, sha256, finite weights), and
takes the *weighted coordinate-wise median* of the distinct checkpoints, each weighted by the
lineage voices that vouch for it, its own included, as checkpoint choice counts them
(swarm/checkpoints/measure.py `vouchers_among`): a host whose record says it took its checkpoint
from one key alone is that key's voice, and no group counts more voices than it has keys, so a
replica that adopted a stranger's block and serves it bit for bit adds no voice to the
stranger's word (issue 46):
- a checkpoint vouched for by a strict majority of the voices is the median exactly, bit for
  bit: honest replicas that agree outvote any minority, which moves nothing at all;
- otherwise every coordinate lands between values that honest replicas hold, as long as
  fewer than half the voices lie: a minority cannot move a weight outside the honest range;
- with fewer than `MIN_VOICES` voices (two replicas), nobody can tell the liar from the honest
  one: the replica keeps its own weights and says so.
Every replica that reads the same checkpoints computes the same median (the groups are taken
in sha256 order), so replicas that drifted become identical again.

This replaces hivemind's averager for these rounds: a groupmate there picks its own weight,
the part it reduces comes back as whatever it sends, and it may announce a message of any
length. Here every byte arrives through the bounded, verified checkpoint download.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from hivemind.p2p import P2P

from swarm.checkpoints.download import download_verified
from swarm.checkpoints.measure import vouchers_among
from swarm.checkpoints.transfer import TransferError
from swarm.errors import SwarmError
from swarm.model.denoiser import ModelConfig
from swarm.p2p.directory import DHTUnavailable, Host
from swarm.p2p.network import EventLoopThread
from swarm.p2p.records import BlockAnnouncement, CheckpointInfo

logger = logging.getLogger(__name__)

MIN_VOICES = 3  # independent voices needed before a replica lets the others change its weights
POLL_S = 1.0  # how often the replicas' records are read while waiting for their checkpoints


@dataclass(frozen=True)
class Voice:
    """One distinct checkpoint of the round: its sha256, its tensors, and the independent voices that vouch for
    it (`weigh`)."""

    sha256: str
    tensors: dict[str, torch.Tensor]
    vouchers: int


def weighted_median(stacked: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The coordinate-wise weighted median of `stacked` (groups x ...) with one weight per group:
    at each coordinate, the smallest value whose cumulative weight reaches half of the total."""
    values, order = stacked.sort(dim=0)
    cumulative = weights.to(stacked.device)[order].cumsum(dim=0)
    first = (cumulative * 2 >= weights.sum()).to(torch.int8).argmax(dim=0, keepdim=True)
    return values.gather(0, first).squeeze(0)


def median_of(voices: list[Voice]) -> dict[str, torch.Tensor] | None:
    """The weighted coordinate-wise median of the voices' tensors (module docstring), or None
    when fewer than `MIN_VOICES` vouchers speak. A voice of a strict majority is returned as it is."""
    vouchers = sum(v.vouchers for v in voices)
    if vouchers < MIN_VOICES:
        return None
    voices = sorted(voices, key=lambda v: v.sha256)
    leader = max(voices, key=lambda v: v.vouchers)
    if 2 * leader.vouchers > vouchers:
        return {name: tensor.clone() for name, tensor in leader.tensors.items()}
    weights = torch.tensor([float(v.vouchers) for v in voices], device="cpu")
    return {name: weighted_median(torch.stack([v.tensors[name] for v in voices]), weights) for name in voices[0].tensors}


def weigh(own: Host, others: dict[CheckpointInfo, list[Host]]) -> dict[CheckpointInfo, int]:
    """Each checkpoint's weight in the round: the voices that vouch for it (`vouchers_among`), never more
    than its distinct keys. `own` is this replica's record, counted in one group with the hosts that
    agree with it: apart, a host that took its checkpoint from this replica's key would count as a
    second voice of that key, and a replica that took its own weights from one key alone would vouch
    for them beside that key."""
    checkpoint = own.announcement.checkpoint
    weights = {c: vouchers_among(hosts) for c, hosts in others.items() if c != checkpoint}
    weights[checkpoint] = vouchers_among([own, *others.get(checkpoint, [])])
    return weights


@dataclass
class ReconcileRound:
    """One replica's side of the rounds: at a round's step, gather the other replicas'
    checkpoints of that step and take the median (module docstring).

    Args:
        hosts: reads the block's hosts from the DHT now (the replica's own record included).
        own_key: the key this replica's records are signed with.
        deadline: how long a round waits for the others' checkpoints of its step, downloads included.
        stop: set when the peer is told to stop: a round ends at once, the weights kept (a round
            that waited out its deadline for a killed replica's checkpoint held a stopping peer
            past the 15 s a supervisor gives it before SIGKILL: tests/test_chaos.py saw it).
    """

    p2p: P2P
    loop: EventLoopThread
    config: ModelConfig
    block: int
    own_key: bytes
    hosts: Callable[[], list[Host]]
    deadline: float
    stop: threading.Event = field(default_factory=threading.Event)
    drift: float | None = None  # the largest change the last merge made to a weight

    def run(self, module: torch.nn.Module, own: BlockAnnouncement, replicas: int) -> bool | None:
        """Merge `module` with the others' checkpoints of its step, waiting for up to `replicas` other
        replicas. `own` is the record this replica announced for the step: its checkpoint is `module`'s,
        and its lineage says whose voice that is (`weigh`). True if the weights changed, False if they
        were the median already, None if too few voices spoke to judge (weights kept)."""
        started, checkpoint = time.monotonic(), own.checkpoint
        if checkpoint is None:
            raise SwarmError("a merge round runs on a checkpoint this replica announced; its record holds none")
        groups = self._checkpoints_of(checkpoint, replicas, started + self.deadline / 2)
        if self.stop.is_set():
            logger.info("step %d: stopping: the merge round ends, weights kept", checkpoint.step)
            return None
        weights = weigh(Host(self.block, own, math.inf, owner=self.own_key), groups)
        if sum(weights.values()) < MIN_VOICES:  # nothing to download: no median could come of it
            logger.info("step %d: %d voices hold checkpoints of this step (%d needed to judge): weights kept",
                        checkpoint.step, sum(weights.values()), MIN_VOICES)  # fmt: skip
            return None
        voices = [Voice(checkpoint.sha256, _tensors(module), weights.pop(checkpoint))]
        for other, weight in weights.items():
            if self.stop.is_set():
                break  # the voices gathered so far still decide, or too few of them keep the weights
            if (tensors := self._download(groups[other], started + self.deadline, module)) is not None:
                voices.append(Voice(other.sha256, tensors, weight))
        merged = median_of(voices)
        if merged is None:  # downloads failed: fewer voices than announced
            logger.info("step %d: only %d voices' checkpoints arrived (%d needed to judge): weights kept",
                        checkpoint.step, sum(v.vouchers for v in voices), MIN_VOICES)  # fmt: skip
            return None
        return self._adopt(module, merged, checkpoint.step)

    def _checkpoints_of(self, own: CheckpointInfo, replicas: int, give_up_at: float) -> dict[CheckpointInfo, list[Host]]:
        """The other hosts' checkpoints of `own.step`, by checkpoint, once `replicas` hosts
        announce one, the time is up or the peer is stopping."""
        groups: dict[CheckpointInfo, list[Host]] = {}
        while True:
            try:
                hosts = [h for h in self.hosts() if h.owner != self.own_key]
            except DHTUnavailable as error:
                logger.warning("step %d: %s", own.step, error)
                hosts = []
            groups = {}
            for host in hosts:
                checkpoint = host.announcement.checkpoint
                if checkpoint is not None and checkpoint.step == own.step:
                    groups.setdefault(checkpoint, []).append(host)
            if sum(map(len, groups.values())) >= replicas or time.monotonic() + POLL_S > give_up_at:
                return groups
            if self.stop.wait(POLL_S):
                return groups

    def _download(
        self, hosts: list[Host], give_up_at: float, like: torch.nn.Module
    ) -> dict[str, torch.Tensor] | None:
        """The tensors of the checkpoint `hosts` vouch for, verified (size, sha256, finite
        weights of this block), on the device and in the dtype of `like`'s weights (the median is
        taken beside them); None if it does not come in time or does not verify."""
        try:
            left = max(1.0, give_up_at - time.monotonic())
            _, denoiser = self.loop.run(download_verified(self.p2p, hosts, self.config, self.block, False), left)
        except (TransferError, SwarmError, TimeoutError) as error:
            logger.warning("block %d: a replica's checkpoint is left out of the round: %s", self.block, error)
            return None
        return _tensors(denoiser.to(next(like.parameters())))

    def _adopt(self, module: torch.nn.Module, merged: dict[str, torch.Tensor], step: int) -> bool:
        with torch.no_grad():
            state = module.state_dict()
            self.drift = max(((merged[name] - state[name]).abs().max().item() for name in state), default=0.0)
            module.load_state_dict(merged)
        logger.info("step %d: merged the replicas' checkpoints; the largest change to a weight was %.3g", step, self.drift)
        return self.drift > 0


def _tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in module.state_dict().items()}
