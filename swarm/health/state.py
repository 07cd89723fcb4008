"""What the health page shows: one swarm's state, from its records, one ping of each host, and a
check of each host's checkpoint.

Every poll reads each block's entries from the DHT (through the same schema as every reader:
an entry that does not parse is counted as skipped, never shown, never fatal) and asks every
host for its `rpc_info`, all at once and each within a timeout.

A host is *verified* when the page has checked the checkpoint it announces, by this definition:
its record is live (not expired, not "leaving"), it announces a checkpoint, the peer the record
names answered our `rpc_info` within the timeout, for the block the record is under, from the
key the record was signed with (an impostor's record naming another peer's id fails here), and
the page has checked that checkpoint on that host (checks.py: downloaded whole and verified
against its sha256, or, past 16 MiB, its chunk list and one chunk). A host that answers
`rpc_info` but has not passed the check (not checked yet, or failed) is *unverified*, with the
reason. A block is healthy when at least one of its hosts is verified; the model is healthy when
every block is.

The state also carries the leaderboard of verified contributions (`contributions`): each key's
work that two other keys attest, read from `S.ledger` and counted by swarm/p2p/ledger.py.

Whatever a peer wrote is data: numbers that are not finite become null (a NaN would make the
JSON unreadable), strings are passed on as they are and the page shows them as text only.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from hivemind.p2p import P2P
from hivemind.utils import get_dht_time

from swarm.health.checks import WHOLE_BYTES, CheckpointChecks, Verdict, check_key
from swarm.model.denoiser import ModelConfig
from swarm.p2p.directory import DHTUnavailable, Host, SwarmDirectory
from swarm.p2p.info import owns_record
from swarm.p2p.ledger import Ledger
from swarm.p2p.messages import PeerInfo
from swarm.p2p.pings import PING_TIMEOUT_S, ask_all

logger = logging.getLogger(__name__)

HISTORY_POINTS = 300  # loss points kept per peer (the newest)
MAX_SERIES = 64  # peers whose loss is kept; the longest silent is dropped first
Answer = tuple[float, PeerInfo | None]


def finite(value: float | None) -> float | None:
    """The number, or None if it is missing, NaN or infinite."""
    return value if value is not None and math.isfinite(value) else None


def problem(host: Host, answer: Answer | None) -> str | None:
    """Why a host's record is not believed from its `rpc_info` answer (see the module
    docstring); None if it is, and its checkpoint is worth checking."""
    info = answer[1] if answer else None
    if info is None:
        return "does not answer"
    if not owns_record(info, host):
        return "answers under another key than its record's"
    if info.block != host.block:
        return f"answers that it hosts block {info.block}"
    if host.announcement.checkpoint is None:
        return "announces no checkpoint yet"
    return None


@dataclass
class LossHistory:
    """Each peer's announced loss against time, since the monitor started (bounded)."""

    series: dict[tuple[int, str], dict] = field(default_factory=dict)

    def add(self, host: Host, now: float) -> None:
        a, key = host.announcement, (host.block, host.peer_id)
        loss = finite(a.loss)
        if loss is None:
            return
        entry = self.series.setdefault(key, {"peer_id": a.peer_id, "public_name": a.public_name, "points": []})
        points = entry["points"]
        if points and points[-1][1] == a.step:
            return  # the same announcement again: nothing new to plot
        entry["public_name"], entry["seen"] = a.public_name, now
        points.append([now, a.step, loss])
        del points[:-HISTORY_POINTS]
        if len(self.series) > MAX_SERIES:
            del self.series[min(self.series, key=lambda k: self.series[k]["seen"])]

    def as_json(self) -> dict[str, list[dict]]:
        by_block: dict[str, list[dict]] = {}
        for (block, _), entry in sorted(self.series.items()):
            by_block.setdefault(str(block), []).append({k: entry[k] for k in ("peer_id", "public_name", "points")})
        return by_block


class SwarmMonitor:
    """Collects the state of one swarm, poll after poll (see the module docstring).

    Args:
        run: runs a P2P coroutine on the event loop that owns `p2p`, with a timeout (SwarmClient.run).
        whole_bytes: a checkpoint up to this size is downloaded whole to check it (checks.py).
    """

    def __init__(self, directory: SwarmDirectory, p2p: P2P, run: Callable[[Awaitable, float], Any],
                 config: ModelConfig, ping_timeout: float = PING_TIMEOUT_S,
                 whole_bytes: int = WHOLE_BYTES):  # fmt: skip
        self.directory, self.p2p, self.run, self.config = directory, p2p, run, config
        self.ping_timeout = ping_timeout
        self.history = LossHistory()
        self.checks = CheckpointChecks(p2p, config, whole_bytes)
        self.ledger = Ledger(directory.swarm, directory.membership)  # the attestations believed, poll after poll

    def collect(self) -> dict:
        """The swarm's state now, as the JSON the API serves (README: "The health page")."""
        now, errors = time.time(), []
        hosts, skipped = [], {}
        for block in range(self.config.n_blocks):
            try:
                found, skipped[block] = self.directory.census(block)
            except DHTUnavailable as error:  # shown, and the block counts as broken until a read succeeds
                found, skipped[block] = [], 0
                errors.append(str(error))
            hosts += found
        answers = self.run(ask_all(self.p2p, [h.peer_id for h in hosts], self.ping_timeout), self.ping_timeout + 5)
        whys = [problem(h, answers.get(h.peer_id)) for h in hosts]
        believed = [h for h, why in zip(hosts, whys) if why is None]
        checked = self.run(self.checks.verdicts(believed), self.ping_timeout + 5)  # never waits for a check
        verdicts = [Verdict(None, why, 0.0) if why else checked[check_key(h)] for h, why in zip(hosts, whys)]
        rows = [self._row(h, answers.get(h.peer_id), verdict, now) for h, verdict in zip(hosts, verdicts)]
        for host in hosts:
            self.history.add(host, now)
        return {**self._verdict(rows, skipped), "updated_at": now, "errors": errors, "hosts": rows,
                "pings": announced_pings(hosts), "loss_history": self.history.as_json(),
                "contributions": self._contributions(hosts, errors)}  # fmt: skip

    def _contributions(self, hosts: list[Host], errors: list[str]) -> list[dict]:
        """The leaderboard of verified contributions (swarm/p2p/ledger.py): the attestations read now,
        beside those kept from earlier polls (a failed read is shown, and keeps those)."""
        try:
            self.ledger.take(self.directory.attestations())
        except DHTUnavailable as error:
            errors.append(str(error))
        return self.ledger.rows(hosts)

    def _verdict(self, rows: list[dict], skipped: dict[int, int]) -> dict:
        """The model's status, and each block's."""
        blocks = []
        for block in range(self.config.n_blocks):
            mine = [r for r in rows if r["block"] == block]
            verified = sum(r["verified"] for r in mine)
            blocks.append({"block": block, "healthy": verified > 0, "hosts": len(mine), "verified": verified,
                           "skipped": skipped[block]})  # fmt: skip
        missing = [b["block"] for b in blocks if not b["healthy"]]
        return {"swarm": self.directory.swarm, "config_hash": self.config.hash(), "n_blocks": self.config.n_blocks,
                "status": "broken" if missing else "healthy", "missing_blocks": missing, "blocks": blocks}  # fmt: skip

    @staticmethod
    def _row(host: Host, answer: Answer | None, verdict: Verdict, now: float) -> dict:
        """One host's row; `verdict`: how its checkpoint was checked, or why it is not verified."""
        a = host.announcement
        checkpoint_time = finite(a.checkpoint_time)
        # fmt: off
        return {
            "block": host.block, "peer_id": a.peer_id, "public_name": a.public_name, "state": a.state,
            "step": a.step, "loss": finite(a.loss), "throughput": finite(a.throughput),
            "checkpoint_step": a.checkpoint.step if a.checkpoint else None,
            "checkpoint_age_s": now - checkpoint_time if checkpoint_time is not None else None,
            "reached": a.reached,  # "relayed": behind NAT, through circuit relays
            "sync_bytes_sent": a.sync_bytes_sent, "sync_bytes_received": a.sync_bytes_received,
            "drift": finite(a.drift), "version": a.version, "rtt_s": finite(answer[0]) if answer else None,
            "verified": verdict.verified, "check": verdict.check, "problem": verdict.reason,
            "expires_in_s": finite(host.expires_at - get_dht_time()),
        }
        # fmt: on


def announced_pings(hosts: list[Host]) -> list[dict]:
    """The round trips hosts announced to other hosts: the entries of the round-trip matrix."""
    known = {h.peer_id for h in hosts}
    found = {(h.peer_id, p.peer_id): p.seconds for h in hosts for p in h.announcement.pings if p.peer_id in known}
    return [{"from": a, "to": b, "seconds": s} for (a, b), s in sorted(found.items())]
