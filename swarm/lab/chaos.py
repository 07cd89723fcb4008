"""Churn on a local swarm: kill a random peer every few seconds, start another in its place, and
watch that nothing is lost. Used by `benchmarks/chaos.py` and, briefly, by the test suite.

The monkey kills only a peer whose block has another replica up (joined and announced: we test
recovery from churn, not a swarm we emptied ourselves), with SIGKILL or SIGTERM at random. Half the
replacements restart in the victim's folder (resuming from its own checkpoint), half start
fresh in a new folder (starting from the freshest replica's checkpoint). Throughout it samples,
every second, which blocks have a live host (a peer that answers a ping), the newest step of
each block, and (unless `fetch_every_s` is None) runs `swarm-fetch` every so often. At the end
every checkpoint file left on disk must decode.
"""

from __future__ import annotations

import logging
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from swarm.checkpoints.choice import SpotCheck, choose_checkpoint
from swarm.lab.launch import STOP_TIMEOUT_S, LocalSwarm, Started
from swarm.model.checkpoint import decode_block
from swarm.model.denoiser import ModelConfig
from swarm.p2p.directory import SwarmDirectory
from swarm.p2p.ledger import backed_keys
from swarm.serving.remote import RemoteBlocks
from swarm.waiting import wait_for

logger = logging.getLogger(__name__)

FETCH_TIMEOUT_S = 180.0


@dataclass
class ChaosConfig:
    duration_s: float = 60.0
    kill_every_s: float = 5.0
    fetch_every_s: float | None = 15.0  # between the starts of two fetches (or at once, if one took longer); None: none
    min_fetches: int = 0  # the churn goes on past duration_s until this many fetches have finished, up to 3x duration_s
    peers_per_block: int = 2
    peer_extra: list[str] = field(default_factory=list)  # swarm-peer options of every peer
    seed: int = 0


@dataclass
class Running:
    handle: Started
    block: int


class ChaosMonkey:
    """Runs the peers of a local swarm and the churn; `report()` holds the figures."""

    def __init__(self, local: LocalSwarm, runner: RemoteBlocks, config: ChaosConfig):
        self.local, self.runner, self.config = local, runner, config
        self.directory: SwarmDirectory = runner.directory
        self.model: ModelConfig = runner.config
        self.rng = random.Random(config.seed)
        self.running: list[Running] = []
        self.names = 0
        self.figures = {"killed_sigkill": 0, "killed_sigterm": 0, "restarted_in_place": 0, "started_fresh": 0,
                        "hangs": 0, "samples": 0, "samples_with_a_block_down": 0, "steps_lost": 0,
                        "fetches_tried": 0, "fetches_succeeded": 0, "fetches_failed_naming_a_block": 0,
                        "fetches_failed_otherwise": 0, "torn_checkpoints": 0, "checkpoints_checked": 0}  # fmt: skip
        self.first_steps: dict[int, int] = {}
        self.last_steps: dict[int, int] = {}

    def start_peers(self, timeout: float = 180.0) -> None:
        """Start `peers_per_block` peers per block and wait until all are training."""
        for block in range(self.model.n_blocks):
            for _ in range(self.config.peers_per_block):
                self._start(block, name=None)

        def all_working() -> bool:
            hosts = self.directory.all_hosts(self.model.n_blocks)
            working = [sum(h.announcement.state in ("training", "serving") for h in hs) for hs in hosts.values()]
            return min(working) >= self.config.peers_per_block

        wait_for(all_working, timeout, f"{self.config.peers_per_block} peers per block training", interval=1.0)

    def _start(self, block: int, name: str | None) -> None:
        if name is None:
            self.names += 1
            name = f"b{block}p{self.names}"
        handle = self.local.start_peer(name, str(block), self.config.peer_extra)
        self.running.append(Running(handle, block))

    def run(self) -> dict:
        """The chaos period: kills, restarts, fetches and samples, for `duration_s` seconds, and
        longer while fewer than `min_fetches` fetches have finished (a fetch on two busy cores can
        take most of a minute, and a period without one would check nothing about fetching)."""
        fetches = threading.Thread(target=self._fetch_now_and_then, daemon=True)
        self._started = time.monotonic()
        self._stop_fetching = threading.Event()
        fetches.start()
        next_kill = self._started + self.config.kill_every_s
        while not self._chaos_over():
            self._sample()
            if time.monotonic() >= next_kill:
                self._kill_and_replace()
                next_kill = time.monotonic() + self.config.kill_every_s
            time.sleep(1.0)
        if self._fetches_finished() < self.config.min_fetches:
            logger.warning("the chaos period ends with %d of %d fetches finished", self._fetches_finished(),
                           self.config.min_fetches)
        self._stop_fetching.set()
        fetches.join(FETCH_TIMEOUT_S + 10)
        return self.figures

    def _chaos_over(self) -> bool:
        elapsed = time.monotonic() - self._started
        if elapsed >= 3 * self.config.duration_s:
            return True
        return elapsed >= self.config.duration_s and self._fetches_finished() >= self.config.min_fetches

    def _fetches_finished(self) -> int:
        f = self.figures
        return f["fetches_succeeded"] + f["fetches_failed_naming_a_block"] + f["fetches_failed_otherwise"]

    def _sample(self) -> None:
        hosts = self.directory.all_hosts(self.model.n_blocks)
        down = [b for b, hs in hosts.items() if not any(self.runner.ping(h.peer_id) < float("inf") for h in hs)]
        self.figures["samples"] += 1
        if down:
            self.figures["samples_with_a_block_down"] += 1
            logger.warning("blocks %s have no live host", down)
        for block, hs in hosts.items():
            if hs:
                step = max(h.announcement.step for h in hs)
                self.first_steps.setdefault(block, step)
                self.last_steps[block] = max(self.last_steps.get(block, 0), step)

    def _kill_and_replace(self) -> None:
        alive = [r for r in self.running if r.handle.process.poll() is None]
        announced = {h.announcement.public_name for hs in self.directory.all_hosts(self.model.n_blocks).values()
                     for h in hs if h.announcement.state in ("training", "serving")}  # fmt: skip
        up = [r for r in alive if r.handle.name in announced]  # joined and working, not still starting
        per_block = {b: sum(r.block == b for r in up) for b in range(self.model.n_blocks)}
        victims = [r for r in up if per_block[r.block] >= 2]
        if not victims:
            return
        victim = self.rng.choice(victims)
        self._count_lost_steps(victim)
        sig = self.rng.choice([signal.SIGKILL, signal.SIGTERM])
        self.figures["killed_sigkill" if sig == signal.SIGKILL else "killed_sigterm"] += 1
        stopped = time.monotonic()
        self.local.stop(victim.handle, sig)
        if sig == signal.SIGTERM and time.monotonic() - stopped >= STOP_TIMEOUT_S:
            self.figures["hangs"] += 1  # it did not exit on SIGTERM and had to be killed
        self.running.remove(victim)
        logger.info("killed %s (block %d) with %s", victim.handle.name, victim.block, sig.name)
        in_place = self.rng.random() < 0.5
        self.figures["restarted_in_place" if in_place else "started_fresh"] += 1
        self._start(victim.block, victim.handle.name if in_place else None)

    def _count_lost_steps(self, victim: Running) -> None:
        """Steps the victim took since its last checkpoint, by its last record: at most lost."""
        for host in self.directory.hosts(victim.block):
            a = host.announcement
            if a.public_name == victim.handle.name and a.checkpoint is not None:
                self.figures["steps_lost"] += max(0, a.step - a.checkpoint.step)

    def _fetch_now_and_then(self) -> None:
        if self.config.fetch_every_s is None:
            return
        count, next_start = 0, time.monotonic() + self.config.fetch_every_s
        while not self._stop_fetching.wait(max(0.0, next_start - time.monotonic())) and not self._chaos_over():
            count += 1
            next_start = time.monotonic() + self.config.fetch_every_s
            self.figures["fetches_tried"] += 1
            try:
                result = self.local.run("swarm-fetch", "--out", f"chaos-fetch-{count}", timeout=FETCH_TIMEOUT_S)
            except Exception:  # noqa: BLE001 (subprocess.TimeoutExpired: a fetch that hung)
                self.figures["hangs"] += 1
                continue
            if result.returncode == 0:
                self.figures["fetches_succeeded"] += 1
            elif "block" in result.stderr and "Traceback" not in result.stderr:
                self.figures["fetches_failed_naming_a_block"] += 1
            else:
                self.figures["fetches_failed_otherwise"] += 1
                logger.warning("swarm-fetch failed: %s", result.stderr[-500:])

    def check_checkpoints(self) -> None:
        """Every checkpoint file any peer left must decode as its block (none torn)."""
        for path in Path(self.local.workdir).glob("b*p*/block_*_step_*.safetensors"):
            block = int(path.name.split("_")[1])
            try:
                data = path.read_bytes()
            except FileNotFoundError:  # pruned by its running peer since the listing
                continue
            self.figures["checkpoints_checked"] += 1
            try:
                decode_block(data, self.model, block)
            except Exception as error:  # noqa: BLE001 (whatever it raises, the file is torn)
                self.figures["torn_checkpoints"] += 1
                logger.error("torn checkpoint %s: %s", path, error)

    def blocks_lost(self) -> list[int]:
        """Blocks of which no live replica now serves a checkpoint that verifies and passes the
        spot check (chosen as swarm-fetch chooses)."""
        lost, spot_check = [], SpotCheck.from_source(self.local.data, self.model)
        backed = backed_keys(self.directory)
        for block in range(self.model.n_blocks):
            hosts = self.directory.hosts(block)
            coro = choose_checkpoint(self.runner.p2p, hosts, self.model, block, spot_check,
                                     keys_count=self.directory.keys_count, show_progress=False,
                                     backed=backed)  # fmt: skip
            try:
                self.runner.loop.run(coro, FETCH_TIMEOUT_S)
            except Exception as error:  # noqa: BLE001 (whatever it raises, nobody serves the block)
                logger.error("block %d is lost: %s", block, error)
                lost.append(block)
        return lost

    def report(self) -> dict:
        blocks = range(self.model.n_blocks)
        return {
            **self.figures,
            "blocks_lost": self.blocks_lost(),
            "first_step_per_block": [self.first_steps.get(b) for b in blocks],
            "last_step_per_block": [self.last_steps.get(b) for b in blocks],
            "fetch_success_rate": self.figures["fetches_succeeded"] / max(1, self.figures["fetches_tried"]),
        }
