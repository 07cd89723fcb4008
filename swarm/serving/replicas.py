"""Which replica a generation client asks for each block, and which peers it asks nothing for a while.

For each block `Replicas` takes the first checkpoint, in the order of
`swarm.checkpoints.choice.rank` (plausibility, agreement among hosts, then freshness), that the
client may use (vetting.py: one measured here, or one that hosts under two keys or more serve
where keys cost something; in an open swarm every checkpoint of the block is measured first, as a
fetch does: `SwarmDirectory.keys_count`), and among its hosts the one with the lowest measured
round trip (pings are cached, and those a choice needs are sent at once: k keys whose peers never
answer cost one `ping_timeout`, not k), hosts behind NAT last (they are reached by asking them to dial
back: `swarm.p2p.reachability.ensure_direct`). The choice is kept while its host is not banned,
so that a generation reads the directory only when a host fails.

A peer that fails (a timeout, a refusal, a ping unanswered) or is outvoted (where keys count) is
banned for `ban_seconds`, twice that at its next failure, and so on up to `MAX_BAN_S`, and pinged
again before it is next asked; one shown to lie by the client's own computation, for good. A later,
shorter ban never ends a longer one. The ban doubles because a failure is what a stranger chooses:
a key that answers pings fast and lets every request time out was chosen again each minute and
cost a request its whole deadline each time (issue 57); now it costs a timeout per doubling, about
six in its first hour. An honest host that fails now and then is asked less often, never banned
for good. A record whose peer does not
answer a ping (it left; its record outlives it) is no voice for `heard_all` until it answers again.

Witnesses (cross_check.py says what they are for) are found here anew for each request, among the
hosts that announced the checkpoint when it was chosen: a replica that was banned a while (one
failure, which a stranger can cause) or missed a ping is a witness again once its ban ends. Where
keys count, one witness is asked (`witness`), the fastest; in an open swarm, one replica under
each other key of the checkpoint (`voice`), so that speed, which a stranger picks, decides nothing,
and the client knows whether every key was heard (`heard_all`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from hivemind.p2p import P2P

from swarm.checkpoints.choice import rank
from swarm.checkpoints.download import key_of
from swarm.errors import SwarmError
from swarm.model.denoiser import ModelConfig
from swarm.p2p.directory import Host, SwarmDirectory
from swarm.p2p.info import owns_record
from swarm.p2p.messages import PeerInfo
from swarm.p2p.network import EventLoopThread
from swarm.p2p.pings import timed_info
from swarm.p2p.reachability import ensure_direct
from swarm.p2p.records import CheckpointInfo
from swarm.serving.cross_check import CrossCheckStats
from swarm.serving.vetting import Vetting

logger = logging.getLogger(__name__)

MAX_BAN_S = 3600.0  # the longest ban for a while: a peer that keeps failing is asked once an hour


@dataclass(frozen=True)
class Chosen:
    """The replica a runner asks for a block, and those of the same checkpoint that can confirm it."""

    checkpoint: CheckpointInfo
    host: Host
    hosts: list[Host]  # every host of the checkpoint that answered when it was chosen (its file comes from them)
    announcing: list[Host]  # every host that announced it then, banned or not: witnesses are picked among them


@dataclass
class Replicas:
    """One client's choice of replica for each block, with the bans and the round trips it rests on."""

    directory: SwarmDirectory
    p2p: P2P
    loop: EventLoopThread
    config: ModelConfig
    vetting: Vetting  # which checkpoints may be used: measured here, or agreed on
    checks: CrossCheckStats  # where the cost of measuring checkpoints is counted
    ping_timeout: float = 5.0
    ban_seconds: float = 60.0  # for a peer that fails or is outvoted; one shown here to lie is banned for good
    rtt: dict[tuple[str, bytes], float] = field(default_factory=dict)  # (peer id, record owner): seconds
    unreachable: set[tuple[str, bytes]] = field(default_factory=set)  # whose last ping here went unanswered
    recheck: set[tuple[str, bytes]] = field(default_factory=set)  # failed a request since their last ping
    banned_until: dict[str, float] = field(default_factory=dict)  # peer id: monotonic time (inf: for good)
    failures: dict[str, int] = field(default_factory=dict)  # peer id: the bans for a while it earned here
    chosen: dict[int, Chosen] = field(default_factory=dict)  # per block, while its host is not banned

    def choose(self, block: int) -> Chosen:
        """The replica to ask for `block` now: the one chosen before while its host is not banned
        (no directory read on this hot path), else a new choice (measuring checkpoints first where
        `_pick` must)."""
        if self.needs_choice(block):
            self.chosen[block] = self._pick(block)
        return self.chosen[block]

    def needs_choice(self, block: int) -> bool:
        """Whether `choose` must choose anew: nothing chosen for `block`, or its host banned."""
        chosen = self.chosen.get(block)
        return chosen is None or self.banned(chosen.host.peer_id)

    def forget(self, block: int) -> None:
        """Drop the choice for `block`: its answer could not be used, so the next request chooses again."""
        self.chosen.pop(block, None)

    def until_a_ban_ends(self, block: int) -> float:
        """Seconds until the first host of `block` whose ban is for a while may be asked again,
        where every host that announces a checkpoint of it is banned; 0 otherwise."""
        now = time.monotonic()
        bans = [self.banned_until.get(h.peer_id, 0.0) for h in self.directory.hosts(block) if h.announcement.checkpoint]
        if not bans or min(bans) <= now:
            return 0.0
        return min((until - now for until in bans if math.isfinite(until)), default=0.0)

    def witness(self, chosen: Chosen, asked: tuple[str, ...] = ()) -> Host | None:
        """The fastest replica of the chosen checkpoint that answers now, under a key other than
        the chosen host's and those of the replicas `asked`. Looked up at each request, not once
        when the checkpoint was chosen: a witness banned for a while then (one failure, which a
        stranger can cause) must count again once its ban ends, or the chosen host's answers would
        go unconfirmed until it is itself banned. Replicas that answered a ping before come first:
        a record whose peer is gone is pinged (up to `ping_timeout`) only when no other is left."""
        keys = {key_of(chosen.host)} | {key_of(h) for h in chosen.announcing if h.peer_id in asked}
        live = [h for h in chosen.announcing if key_of(h) not in keys and not self.banned(h.peer_id)]
        known = [h for h in live if self.rtt.get((h.peer_id, h.owner), math.inf) < math.inf]
        return min(known or self._answering(live), key=self.round_trip, default=None)

    def voice(self, chosen: Chosen, at_most: int) -> list[Host]:
        """One replica of the chosen checkpoint under each key other than the chosen host's, not
        banned and answering a ping, fastest first, at most `at_most` of them: in an open swarm
        every one is asked (cross_check.py), where a count of the fastest would be the stranger's pick."""
        live = self._live_others(chosen)
        timed = list(zip(self.round_trips(live), live, strict=True))  # each pinged once at most (cached)
        by_key: dict[bytes, Host] = {}
        for _, host in sorted((t for t in timed if t[0] < math.inf), key=lambda t: t[0]):
            by_key.setdefault(key_of(host), host)
        return list(by_key.values())[:at_most]

    def heard_all(self, chosen: Chosen, answered: Iterable[str]) -> bool:
        """Whether a replica under every key that announced the chosen checkpoint (but those banned for
        good, and records whose peer does not answer pings: `_voices`) is among the peers that
        `answered`: one busy, failed, banned for a while or past the bound of `voice` leaves the others'
        agreement unwitnessed by it."""
        answered = set(answered)
        heard = {key_of(h) for h in chosen.announcing if h.peer_id in answered} | {key_of(chosen.host)}
        return self._voices(chosen) <= heard

    def others_announce(self, chosen: Chosen) -> bool:
        """Whether a key other than the chosen host's announced its checkpoint, not counting peers
        banned for good or gone (`_voices`): those will never confirm anything, so they leave the host alone."""
        return bool(self._voices(chosen) - {key_of(chosen.host)})

    def _voices(self, chosen: Chosen) -> set[bytes]:
        """The keys that announced the chosen checkpoint, but those of peers banned for good and those
        no peer of which answers here: a record whose peer left (or does not own it) is no voice, while
        one busy or failing a moment ago is (a stranger can cause that, not its peer's silence to pings)."""
        return {key_of(h) for h in chosen.announcing if self.banned_until.get(h.peer_id, 0.0) < math.inf
                and self._may_answer(h)}  # fmt: skip

    def _may_answer(self, host: Host) -> bool:
        """Whether `host`'s peer answered its last ping here and owns its record, or was not pinged yet."""
        key = host.peer_id, host.owner
        return key not in self.unreachable and self.rtt.get(key, 0.0) < math.inf

    def _live_others(self, chosen: Chosen) -> list[Host]:
        """Hosts of the chosen checkpoint under another key than the chosen host's, not banned."""
        return [h for h in chosen.announcing if key_of(h) != key_of(chosen.host) and not self.banned(h.peer_id)]

    def ban(self, host: Host, why: str, seconds: float | None = None) -> None:
        """Ask `host`'s peer nothing for `seconds` (by default `ban_seconds`, doubled for each ban it
        earned before, at most `MAX_BAN_S`), or longer if it is banned longer already: a failure
        after a proven lie must not end the lie's ban."""
        if seconds is None:
            earned = self.failures.get(host.peer_id, 0)
            self.failures[host.peer_id] = earned + 1
            seconds = min(MAX_BAN_S, self.ban_seconds * 2.0 ** min(earned, 32))
        logger.warning("block %d on %s %s; banning it for %s", host.block, host.peer_id, why,
                       f"{seconds:.0f}s" if math.isfinite(seconds) else "good")  # fmt: skip
        until = time.monotonic() + seconds
        self.banned_until[host.peer_id] = max(self.banned_until.get(host.peer_id, 0.0), until)
        if math.isfinite(seconds):  # pinged again before it is next asked (`round_trip`)
            self.recheck.add((host.peer_id, host.owner))
        if (chosen := self.chosen.get(host.block)) is not None and chosen.host.peer_id == host.peer_id:
            del self.chosen[host.block]

    def banned(self, peer_id: str) -> bool:
        return self.banned_until.get(peer_id, 0.0) > time.monotonic()

    def round_trip(self, host: Host) -> float:
        """Seconds of one P2P ping (rpc_info) to a host (`round_trips`)."""
        return self.round_trips([host])[0]

    def round_trips(self, hosts: Iterable[Host]) -> list[float]:
        """Seconds of one P2P ping (rpc_info) to each host, measured once and cached, and again after it
        failed a request; inf if it fails (the peer is then banned for a while, and `unreachable`) or if
        the peer does not own the host's record. Those not cached are pinged all at once: a stranger's
        silent keys cost one `ping_timeout` together, not one each in turn (issue 57)."""
        hosts = list(hosts)
        todo: dict[tuple[str, bytes], Host] = {}  # an impostor's record names the same peer under another key
        for host in hosts:
            key = host.peer_id, host.owner
            if key in self.recheck:  # gone, or only busy a moment ago?
                self.recheck.discard(key)
                self.rtt.pop(key, None)
            if key not in self.rtt:
                todo.setdefault(key, host)
        if todo:
            answers = self.loop.run(self._reach_all([h.peer_id for h in todo.values()]), 2 * self.ping_timeout + 1)
            for host, (rtt, info) in zip(todo.values(), answers, strict=True):
                self._note(host, rtt, info)
        return [self.rtt.get((h.peer_id, h.owner), math.inf) for h in hosts]

    async def _reach_all(self, peer_ids: list[str]) -> list[tuple[float, PeerInfo | None]]:
        return await asyncio.gather(*(self._reach(peer_id) for peer_id in peer_ids))

    async def _reach(self, peer_id: str) -> tuple[float, PeerInfo | None]:
        """One ping over the route requests will take: direct, or behind NAT once it dialed us back."""
        await ensure_direct(self.p2p, peer_id, self.ping_timeout)
        return await self._ask_info(peer_id)

    def _note(self, host: Host, rtt: float, info: PeerInfo | None) -> None:
        """A host's ping: cached as its round trip; unanswered, it is banned a while and `unreachable`."""
        key = host.peer_id, host.owner
        if info is None:
            self.unreachable.add(key)
            self.ban(host, "did not answer a ping")
            return
        self.unreachable.discard(key)
        if not owns_record(info, host):
            logger.warning("peer %s does not own a record that names it for block %d: ignored", host.peer_id,
                           host.block)  # fmt: skip
            rtt = float("inf")
        self.rtt[key] = rtt

    def ping(self, peer_id: str) -> float:
        """Seconds of one P2P round trip (rpc_info) to a peer; inf if it does not answer in time."""
        return self.loop.run(self._ask_info(peer_id), self.ping_timeout + 1)[0]

    async def _ask_info(self, peer_id: str) -> tuple[float, PeerInfo | None]:
        return await timed_info(self.p2p, peer_id, self.ping_timeout)

    def _pick(self, block: int) -> Chosen:
        """The first checkpoint in rank order that may be used; one not measured yet that needs to
        be is measured on the way (with the next ones: `Vetting.measure`). In an open swarm
        (`SwarmDirectory.keys_count` false) every one is measured first, and the first in rank order
        that `believable` keeps beside all the others is used, as swarm-fetch chooses (so a liar
        gains at most the spot check's `tolerance`)."""
        announced = [h for h in self.directory.hosts(block) if h.announcement.checkpoint]
        hosts = [h for h in announced if not self.banned(h.peer_id)]
        if not hosts:
            raise SwarmError(f"no live peer serves block {block}")
        if not (keys_count := self.directory.keys_count):
            self._measure_every_checkpoint(block, hosts)
            return self._best_measured(block, hosts, announced)
        while True:
            for candidate in rank(hosts, self.config):
                answering = self._answering(candidate.hosts)
                if self.vetting.usable(candidate, answering, keys_count):
                    same = [h for h in announced if h.announcement.checkpoint == candidate.checkpoint]
                    return Chosen(candidate.checkpoint, self._nearest(answering), answering, same)
                if answering and not self.vetting.known(candidate.checkpoint):
                    break  # not measured yet, and not agreed on
            else:
                raise SwarmError(f"block {block}: no live peer serves a checkpoint that two keys serve or that "
                                 "passes a measurement")  # fmt: skip
            self._measure(block, self._answering(hosts))

    def _best_measured(self, block: int, hosts: list[Host], announced: list[Host]) -> Chosen:
        """Where keys are free: the best checkpoint measured here (`Vetting.ordered`: the loss decides,
        not the stamp) that a host answers for; its witnesses are every host of the same weights,
        under any stamp (replicas of one set of weights answer alike)."""
        candidates = {c.checkpoint: c for c in rank(hosts, self.config)}
        for checkpoint in self.vetting.ordered(block, list(candidates)):
            infos = {m.candidate.checkpoint for m in checkpoint.stamps}
            same = [h for h in announced if h.announcement.checkpoint in infos]
            for measured in sorted(checkpoint.stamps, key=lambda m: m is not checkpoint.stamp):
                if answering := self._answering(candidates[measured.candidate.checkpoint].hosts):
                    return Chosen(measured.candidate.checkpoint, self._nearest(answering), answering, same)
        raise SwarmError(f"block {block}: no live peer serves a checkpoint that passes a measurement")

    def _nearest(self, answering: list[Host]) -> Host:
        """The host of `answering` with the lowest round trip; behind NAT only if no direct one answers."""
        return min(answering, key=lambda h: (h.announcement.reached == "relayed", self.round_trip(h)))

    def _measure_every_checkpoint(self, block: int, hosts: list[Host]) -> None:
        """Measure each checkpoint that answering `hosts` serve and that was not measured yet, a
        few at a time, best-ranked first. Each round settles one or more, so there are at most as
        many rounds as hosts (a bound, should a flood of checkpoints push measured ones out of what
        `Vetting` remembers)."""
        answering = self._answering(hosts)
        for _ in answering:
            if all(self.vetting.known(c.checkpoint) for c in rank(answering, self.config)):
                return
            self._measure(block, answering)

    def _measure(self, block: int, answering: list[Host]) -> None:
        """`Vetting.measure`, its cost counted in `checks`."""
        started = time.perf_counter()
        self.checks.checkpoints_measured += self.vetting.measure(block, answering)
        self.checks.measuring_seconds += time.perf_counter() - started

    def _answering(self, hosts: list[Host] | tuple[Host, ...]) -> list[Host]:
        """Those of `hosts` that answer a ping (`round_trips`: all at once) and own their record."""
        return [h for h, rtt in zip(hosts, self.round_trips(hosts), strict=True) if rtt < math.inf]
