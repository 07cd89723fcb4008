"""A swarm peer: joins, picks a block, starts from the freshest replica, trains, serves, announces.

`Peer.run()` is the whole life of `swarm-peer`:
1. join the DHT and read the swarm's model config (`S.model`);
2. pick a block (`auto`: the one with the fewest live hosts);
3. start from its own newest checkpoint, else the freshest verified replica's, else fresh;
4. serve its checkpoints over P2P and announce itself under `S.block.<b>`;
5. train with the core's block trainer, saving every `save_every` steps, until `max_steps`
   or a stop signal; from the moment it chose its block (step 2), a thread announces it
   every `announce_period` seconds;
6. on stop: save, announce that it is leaving, shut down.

Threads and processes, and who may touch the weights:
- the main thread joins, then trains: it alone reads and writes the block's live weights (the
  optimizer or sync step, a parameter-averaging round, the start state), and at each save it
  hands the denoise service a copy of the checkpoint it is about to announce;
- the "announcer" thread stores the peer's record every announce period; it reads figures only,
  and starts a round of pings to its neighbours (swarm/p2p/pings.py) on the p2p loop;
- the "p2p-loop" thread runs an asyncio loop with the P2P services (info and checkpoint
  downloads, sync payloads, remote denoising) and the calls the main thread makes to other
  peers; a denoise request computes in the loop's worker threads on a copy of the announced
  checkpoint (never on the live weights), which `serve` replaces whole;
- child processes: hivemind's DHT (with its libp2p daemon) and, for dense sync and parameter
  rounds, hivemind's averager; the main thread hands tensors to the averager and copies
  its result into the weights itself.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TypeVar

import torch
from hivemind.utils.crypto import RSAPrivateKey

from swarm import __version__
from swarm.checkpoints.choice import SpotCheck, choose_checkpoint
from swarm.checkpoints.store import CheckpointStore
from swarm.checkpoints.transfer import BlockServicer
from swarm.errors import SwarmError
from swarm.model.autoregressive import ByteTransformer
from swarm.model.checkpoint import decode_block
from swarm.model.data import ByteWindows, load_corpus
from swarm.model.denoiser import ModelConfig
from swarm.model.train import TrainConfig, Trainer, block_trainer, trainable
from swarm.p2p import reachability
from swarm.p2p.directory import DHTUnavailable, SwarmDirectory, least_hosted_block
from swarm.p2p.info import InfoServicer
from swarm.p2p.messages import PeerInfo
from swarm.p2p.network import EventLoopThread, NetworkOptions, start_dht, stop_child
from swarm.p2p.pings import NeighbourPings
from swarm.p2p.records import BlockAnnouncement, CheckpointInfo, PeerState, Reached, check_swarm_name
from swarm.serving.ar_pipeline import StageServicer
from swarm.serving.server import DenoiseServicer
from swarm.sync.decoupled_momentum import DeMoConfig, DeMoReplica
from swarm.sync.dense import DenseSync, ParameterAveraging, block_averager
from swarm.sync.exchange import MAX_STEPS_IN_FLIGHT, Exchange, PayloadServicer, json_lines
from swarm.sync.lockstep import DeMoSync
from swarm.sync.outer import OuterOverlapSync, OuterSync
from swarm.sync.overlap import DeMoOverlapSync
from swarm.sync.pseudo_gradient import OuterConfig, OuterReplica
from swarm.sync.strategy import NoSync, SyncStrategy
from swarm.waiting import wait_for

logger = logging.getLogger(__name__)

P2P_CALL_TIMEOUT_S = 30.0
JOIN_FETCH_TIMEOUT_S = 600.0  # choosing a start checkpoint: a few verified downloads and spot checks
DHT_STORE_TIMEOUT_S = 20.0
LOSS_WINDOW = 20  # steps averaged into the announced loss
T = TypeVar("T")


@dataclass
class PeerConfig:
    """Everything `swarm-peer` is told; the defaults suit the built-in demo on one machine."""

    swarm: str = "demo"
    block: str = "auto"  # "auto" or a block index
    checkpoint_dir: str = "peer-checkpoints"
    data: str | None = None  # text source; None: the built-in corpus
    device: str = "cpu"
    max_steps: int | None = None  # stop after this many steps (None: until stopped)
    save_every: int = 50
    announce_period: float = 10.0
    public_name: str = ""
    batch_size: int = 32
    lr: float = 2e-3
    join_timeout: float = 30.0
    serve_ar_stage: bool = False  # also serve a stage of the autoregressive pipeline (serving benchmark)
    # "demo": DeMo exchange in lockstep; "demo-overlap": DeMo, exchange overlapped with the next step;
    # "outer": H local steps, then a compressed pseudo-gradient; "outer-overlap": the same, its exchange overlapped
    # with the next round's steps; "dense": all-reduce of full gradients; "none": alone
    sync: str = "demo"
    sync_deadline: float = 5.0  # seconds a step waits for the other replicas
    overlap_steps: int = 1  # demo-overlap: how many steps late each step's gathered set is applied
    spare_batch_size: int = 0  # windows per spare batch computed while waiting for other replicas (0: wait idle)
    sync_trace: str | None = None  # a file that gets each payload publish and wait (JSON lines), for benchmarks
    wait_for_replicas: int = 1  # start once this many replicas (itself included) are seen; also the group size
    average_every: int = 100  # average parameters with the other replicas every this many steps (0: never)
    expect_config_hash: str | None = None  # refuse a swarm whose model config hash differs (a prefix will do)
    creator: str | None = None  # fingerprint of the swarm creator's key: the only model record believed
    de_mo: DeMoConfig = field(default_factory=DeMoConfig)  # the DeMo optimizer's settings (--sync demo, demo-overlap)
    outer: OuterConfig = field(default_factory=OuterConfig)  # the outer step's settings (--sync outer)
    network: NetworkOptions = field(default_factory=NetworkOptions)
    reachability: str = "auto"  # "auto": ask the initial peers to dial back; "direct"; "relayed" (behind NAT)

    def checked(self) -> "PeerConfig":
        check_swarm_name(self.swarm)
        if self.block != "auto" and not self.block.isdigit():
            raise SwarmError(f"--block must be 'auto' or a block index, not {self.block!r}")
        if self.announce_period <= 0 or self.save_every <= 0:
            raise SwarmError("--announce-period and --save-every must be positive")
        if self.sync not in SYNC_MODES:
            raise SwarmError(f"--sync must be one of {', '.join(SYNC_MODES)}, not {self.sync!r}")
        if self.sync in OUTER_MODES and self.save_every % self.outer.steps != 0:
            raise SwarmError("--save-every must be a multiple of --outer-steps: replicas hold the same weights "
                             "only at the end of an outer round")
        if not 1 <= self.overlap_steps <= MAX_STEPS_IN_FLIGHT:
            raise SwarmError(f"--overlap-steps must be from 1 to {MAX_STEPS_IN_FLIGHT}")
        if not 0 <= self.spare_batch_size <= self.batch_size:
            raise SwarmError("--spare-batch-size must be from 0 (wait idle) to --batch-size")
        if self.spare_batch_size and self.sync not in ("demo", "demo-overlap", *OUTER_MODES):
            raise SwarmError("--spare-batch-size needs a payload exchange: --sync demo, demo-overlap, outer or outer-overlap")
        if self.average_every < 0:
            raise SwarmError("--average-every must be 0 (never) or a number of steps")
        if self.reachability not in ("auto", "direct", "relayed"):
            raise SwarmError(f"--reachability must be 'auto', 'direct' or 'relayed', not {self.reachability!r}")
        return self


def replica_trainer(
    config: ModelConfig, block: int, windows: ByteWindows, train: TrainConfig, peer_id: str, device: str = "cpu"
) -> Trainer:
    """Block `block`'s trainer as the replica `peer_id` runs it: the block's start weights, and
    batches of its own (drawn from a stream seeded by its peer id)."""
    trainer = block_trainer(config, block, windows, train, device)
    trainer.generator.manual_seed(int(peer_id.encode().hex(), 16) % 2**63)
    return trainer


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
OUTER_MODES = ("outer", "outer-overlap")
SYNC_MODES = ("demo", "demo-overlap", *OUTER_MODES, "dense", "none")


def _default_stop_signals() -> None:
    """In a child process just forked from a peer: stop signals do what they do by default."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


class StoppedWhileJoining(Exception):
    """A stop signal came while the peer was still joining: leave at once."""


class Peer:
    """One peer's life; `stop()` (or SIGINT/SIGTERM) ends it cleanly after the current step."""

    def __init__(self, config: PeerConfig):
        self.config = config.checked()
        self.stopping = threading.Event()
        self.private_key = RSAPrivateKey()
        self.dht = self.loop = self.p2p = None
        self.block: int | None = None
        self.trainer: Trainer | None = None
        self.sync: SyncStrategy = NoSync()
        self.checkpoint: CheckpointInfo | None = None
        self.checkpoint_time: float | None = None
        self.state: PeerState = "joining"
        self.reached: Reached = "direct"
        self._replica_ids: list[str] = []  # read from the DHT by the announcer thread, never by the trainer's
        self.announcer: threading.Thread | None = None
        self._announcing = threading.Lock()  # held while a record is built and stored
        self.averager = None  # hivemind's averager (a child process), for --sync dense and parameter rounds
        self.parameter_averaging: ParameterAveraging | None = None
        self.pings: NeighbourPings | None = None  # round trips to neighbours, measured in the background

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        """SIGINT/SIGTERM stop it after the current step. Its child processes (the DHT, the averager)
        do not inherit that handler: a child told to stop by its own shutdown code stops."""
        os.register_at_fork(after_in_child=_default_stop_signals)
        for sig in STOP_SIGNALS:
            signal.signal(sig, lambda *_: self.stop())
        try:
            self._join()
            self._train_until_stopped()
        except StoppedWhileJoining:
            logger.info("stopped while joining")
        finally:
            self._leave()

    def _join(self) -> None:
        network = reachability.plan(self.config.network, self.config.reachability)  # before announcing anything
        self.dht = start_dht(self.config.swarm, network, self.private_key)
        self.peer_id = self.dht.peer_id.to_base58()
        if network.relayed:
            self.reached = "relayed"
            logger.info("behind NAT: reachable through %s", ", ".join(reachability.require_circuit(self.dht)))
        self.directory = SwarmDirectory(self.dht, self.config.swarm, self.private_key, self.config.creator,
                                        self.config.network.dht_timeout)  # fmt: skip
        self.model_config = self.directory.wait_for_model(self.config.join_timeout)
        expected, found = self.config.expect_config_hash, self.model_config.hash()
        if expected and not found.startswith(expected.lower()):
            raise SwarmError(f"swarm {self.config.swarm!r} trains model config {found[:16]}, not the expected {expected[:16]}")
        self.block = self._choose_block(self.model_config)
        logger.info("peer %s hosts block %d of swarm %r", self.peer_id, self.block, self.config.swarm)
        self._announce(wait=True)  # as "joining": peers choosing a block now see this one taken
        # from here on the record is kept alive: a join that loads, checks or fetches for longer
        # than the record lives must not vanish from the other replicas' lists (they would train
        # on without this one's payloads) nor leave its block looking free to the next joiner
        self.announcer = threading.Thread(target=self._announce_periodically, name="announcer", daemon=True)
        self.announcer.start()
        # a checkpoint stays at least as long as a record that names it may live (and then some)
        self.store = CheckpointStore(Path(self.config.checkpoint_dir), self.model_config, self.block, self.config.swarm,
                                     min_age_s=4 * self.config.announce_period + P2P_CALL_TIMEOUT_S)
        self.loop = EventLoopThread()
        self.p2p = self.loop.run(self.dht.replicate_p2p(), P2P_CALL_TIMEOUT_S)
        corpus = load_corpus(self.config.data)
        windows = corpus.windows("train", self.model_config.seq_len)
        self.spot_check = SpotCheck.from_corpus(corpus, self.model_config)
        train_config = TrainConfig(
            steps=self.config.max_steps or 100_000, batch_size=self.config.batch_size, lr=self.config.lr
        )
        self.trainer = replica_trainer(self.model_config, self.block, windows, train_config, self.peer_id, self.config.device)
        self.denoise_service = DenoiseServicer(self.model_config, self.block)
        self._load_start_state()
        self.denoise_service.serve(self.trainer.module, self.checkpoint.sha256 if self.checkpoint else "")
        for servicer in self._servicers():
            self.loop.run(servicer.add_p2p_handlers(self.p2p), P2P_CALL_TIMEOUT_S)
        self.pings = NeighbourPings(self.directory, self.p2p, self.loop, self.peer_id, self.block, self.model_config.n_blocks)
        self.state = "training"
        self._announce(wait=True)
        self._wait_for_replicas()

    def _servicers(self) -> list:
        """Checkpoints and info, remote denoising, and (for benchmarks) an autoregressive stage."""
        module = self.trainer.module
        servicers = [
            InfoServicer(self.info),
            BlockServicer(self.block, self.store),
            self.denoise_service,
            reachability.ReachabilityServicer(self.p2p, public=self.reached == "direct"),
        ]
        servicers += self._set_up_sync(module)
        if self.config.serve_ar_stage:
            torch.manual_seed(0)  # every peer holds a stage of the same (untrained) model
            ar_model = ByteTransformer(self.model_config)
            servicers.append(StageServicer(ar_model, self.block, self.model_config.n_blocks))
        return servicers

    def _set_up_sync(self, module: torch.nn.Module) -> list:
        """The sync strategy for --sync (the trainer's update), the averager for dense steps and
        parameter rounds, and the payload service (DeMo); returns the services to add."""
        timeout = 2 * self.config.sync_deadline
        if self.config.sync == "dense" or self.config.average_every:
            prefix = f"{self.config.swarm}_block{self.block}"  # hivemind: no dots in a prefix
            group = max(2, self.config.wait_for_replicas)
            self.averager = block_averager(self.dht, prefix, trainable(module), group, self.config.sync_deadline)
        if self.config.average_every:
            self.parameter_averaging = ParameterAveraging(self.trainer, self.averager, self.config.average_every, timeout)
        if self.config.sync == "dense":
            self.sync = DenseSync(self.trainer, self.averager, timeout)
        if self.config.sync not in ("demo", "demo-overlap", *OUTER_MODES):
            self.trainer.update = self.sync.update
            return []
        payloads = PayloadServicer(self.block, self.config.sync_deadline)
        exchange = Exchange(payloads, self.p2p, self.loop, self.peer_id, self.replica_ids,
                            trace=json_lines(self.config.sync_trace) if self.config.sync_trace else None,
                            spare_batch_size=self.config.spare_batch_size)  # fmt: skip
        if self.config.sync in OUTER_MODES:
            overlapped = self.config.sync == "outer-overlap"
            self.sync = (OuterOverlapSync if overlapped else OuterSync)(OuterReplica(module, self.config.outer, self.config.lr), exchange)
        else:
            replica = DeMoReplica(module, self.config.de_mo, self.config.lr)
            if self.config.sync == "demo-overlap":
                self.sync = DeMoOverlapSync(replica, exchange, late_steps=self.config.overlap_steps)
            else:
                self.sync = DeMoSync(replica, exchange)
        self.trainer.update = self.sync.update
        return [payloads]

    def replica_ids(self) -> list[str]:
        """The other peers training this block (joining ones are not asked before they train), as
        last read (a DHT read takes a round trip or more: the trainer's thread never waits for one)."""
        return self._replica_ids

    def _read_replicas(self) -> None:
        """Read the other replicas of the block from the DHT (once per announce period, by the announcer)."""
        try:
            hosts = self.directory.hosts(self.block)
        except DHTUnavailable as error:  # a slow DHT: keep the replicas we knew, ask again next period
            logger.warning("block %d: %s; keeping the %d replicas known", self.block, error, len(self._replica_ids))
            return
        self._replica_ids = sorted(
            h.peer_id for h in hosts if h.peer_id != self.peer_id and h.announcement.state == "training"
        )  # a joining one has no payloads to give yet: asking it would hold every step up to the deadline

    def _read_dht(self, read: Callable[[], T], what: str) -> T:
        """A DHT read needed to join, retried while the DHT is slow, up to the join timeout."""

        def attempt() -> tuple[T] | None:
            if self.stopping.is_set():
                raise StoppedWhileJoining()
            try:
                return (read(),)
            except DHTUnavailable as error:
                logger.warning("%s; trying again", error)
                return None

        return wait_for(attempt, self.config.join_timeout, what, interval=1.0)[0]

    def _wait_for_replicas(self) -> None:
        """Hold the first step until `wait_for_replicas` replicas are up, so they start in step."""
        deadline = time.monotonic() + self.config.join_timeout
        self._read_replicas()
        while len(self.replica_ids()) + 1 < self.config.wait_for_replicas and time.monotonic() < deadline:
            if self.stopping.wait(0.5):
                return
            self._read_replicas()

    def _choose_block(self, config: ModelConfig) -> int:
        if self.config.block == "auto":
            return least_hosted_block(self._read_dht(lambda: self.directory.all_hosts(config.n_blocks), "the hosts of every block"))
        block = int(self.config.block)
        if block >= config.n_blocks:
            raise SwarmError(f"block index {block} is out of range: swarm {self.config.swarm!r} has blocks 0..{config.n_blocks - 1}")
        return block

    def _load_start_state(self) -> None:
        """Start from the checkpoint chosen on evidence (swarm/checkpoints/choice.py): the one the
        replicas agree on that passes the spot check, unless its own newest is as fresh; else
        fresh weights."""
        own = self.store.latest()
        own = (own[0].read_bytes(), own[1]) if own else None
        hosts = self._read_dht(lambda: self.directory.hosts(self.block), f"the hosts of block {self.block}")
        others = [h for h in hosts if h.peer_id != self.peer_id and h.announcement.checkpoint is not None]
        if not others and own is None:
            logger.info("block %d: no checkpoint anywhere, starting fresh", self.block)
            return
        coro = choose_checkpoint(self.p2p, others, self.model_config, self.block, self.spot_check, own)
        try:
            choice = self.loop.run(coro, JOIN_FETCH_TIMEOUT_S)
        except (SwarmError, TimeoutError) as error:
            logger.warning("block %d: %s; starting fresh", self.block, error)
            return
        if choice.host is not None:
            self.store.adopt(choice.data, choice.checkpoint)
            origin = f"replica {choice.host.peer_id} ({choice.host.announcement.public_name or 'unnamed'})"
        else:
            origin = f"own checkpoint {self.store.path_for(choice.checkpoint.step)}"
        self.checkpoint = choice.checkpoint
        denoiser, step = decode_block(choice.data, self.model_config, self.block)
        self.trainer.module.load_state_dict(denoiser.state_dict())
        self.trainer.step_count = step
        self.checkpoint_time = time.time()
        logger.info("block %d: starting at step %d from %s (spot-check loss %.3f)", self.block, step, origin, choice.loss)

    def _train_until_stopped(self) -> None:
        self._train()  # the announcer has its own thread: a step that waits on other replicas must not let the record lapse
        if self.stopping.is_set():
            return
        self.state = "serving"  # done training (max steps): still serves its block until stopped
        self._announce(wait=True)
        logger.info("block %d: reached %d steps; serving until stopped", self.block, self.trainer.step_count)
        self.stopping.wait()

    def _train(self) -> None:
        """Step until stopped or `max_steps`, saving every `save_every` steps and at the end. Before
        each save the sync applies what it still has in flight (an overlapped strategy is an update
        behind): a checkpoint holds every update up to its step, and replicas that applied the
        same ones save the same bytes."""
        while not self.stopping.is_set():
            if self.config.max_steps is not None and self.trainer.step_count >= self.config.max_steps:
                break
            self.trainer.step()
            self._keep_replicas_together()
            if self.trainer.step_count % self.config.save_every == 0:
                self.sync.finish(self.trainer)
                self._save()
        self.sync.finish(self.trainer)
        self._save()

    def _announce_periodically(self) -> None:
        while not self.stopping.wait(self.config.announce_period):
            try:
                self._read_replicas()  # first: a failed announcement must not keep the replica list stale
                self._announce()
                if self.pings is not None:  # made once the block is being served
                    self.pings.start_round()  # in the background: its figures go into the next announcement
            except Exception as error:  # a DHT hiccup: the next period tries again
                logger.warning("block %d: announcing failed: %s", self.block, error)

    def _keep_replicas_together(self) -> None:
        """Average parameters with the other replicas at the round's step: always for dense and
        none; for DeMo only when a replica applied other payloads than the rest."""
        if self.parameter_averaging is None or not self.replica_ids():
            return
        if self.parameter_averaging.after_step(self.sync.may_have_drifted()):
            self.sync.averaged(self.trainer.step_count)

    def _save(self) -> None:
        """Save and serve a new checkpoint; if the disk refuses (full, read-only), keep serving
        the last good one and go on training: the next save tries again."""
        if self.checkpoint is not None and self.checkpoint.step == self.trainer.step_count:
            return
        try:
            saved = self.store.save(self.trainer.module, self.trainer.step_count)
        except OSError as error:
            kept = f"step {self.checkpoint.step}" if self.checkpoint else "none"
            logger.error("block %d: could not save step %d (%s); last good checkpoint kept: %s",
                         self.block, self.trainer.step_count, error.strerror or error, kept)
            return
        self.denoise_service.serve(self.trainer.module, saved.sha256)  # before the record names it
        self.checkpoint, self.checkpoint_time = saved, time.time()
        logger.info("block %d: saved step %d (%s)", self.block, self.checkpoint.step, self.checkpoint.sha256[:12])

    def _announcement(self) -> BlockAnnouncement:
        recent = self.trainer.losses[-LOSS_WINDOW:] if self.trainer else []
        seconds = self.trainer.step_seconds[-LOSS_WINDOW:] if self.trainer else []
        sync, averaging = self.sync, self.parameter_averaging
        joining = self.state == "joining"  # a joining record claims no progress
        return BlockAnnouncement(
            peer_id=self.peer_id,
            state=self.state,
            step=self.trainer.step_count if self.trainer and not joining else 0,
            checkpoint=None if joining else self.checkpoint,  # one it may not serve yet
            loss=sum(recent) / len(recent) if recent else None,
            throughput=len(seconds) / sum(seconds) if seconds else 0.0,
            version=__version__,
            public_name=self.config.public_name,
            checkpoint_time=self.checkpoint_time,
            sync_steps=sync.steps,
            sync_bytes_sent=sync.bytes_sent + (self.averager.bytes_sent if self.averager is not None else 0),
            sync_bytes_received=sync.bytes_received,
            sync_round_s=sync.round_seconds,
            compute_utilisation=self.trainer.utilisation(sync.wait_seconds) if self.trainer else None,
            drift=averaging.drift if averaging else None,
            pings=self.pings.latest if self.pings else (),
            reached=self.reached,
        )

    def _announce(self, wait: bool = False) -> None:
        """Store this peer's record. One at a time, so that a record built before a change of
        state (the announcer's) never expires later than the one built after it (the main
        thread's): the later expiration is the one the DHT keeps."""
        lifetime = 3 * self.config.announce_period
        try:
            with self._announcing:
                ok = self.directory.announce(self.block, self._announcement(), lifetime, wait=wait)
        except DHTUnavailable as error:  # the next announcement tries again; the record lives 3 periods
            logger.warning("block %d: %s", self.block, error)
            return
        if wait and not ok:
            logger.warning("block %d: announcement was not stored by any DHT node", self.block)

    def info(self) -> PeerInfo:
        """What this peer hosts: answered to `rpc_info` (status, ping). `owner` is the key its
        records are signed with: a record naming this peer under another key is an impostor's."""
        return PeerInfo(block=self.block, owner=self.directory.owner_subkey, announcement=self._announcement())

    def _leave(self) -> None:
        self.stopping.set()  # also ends the announcer when training stopped on an error
        if self.dht is None:
            return
        try:
            if self.announcer is not None:
                self.announcer.join(DHT_STORE_TIMEOUT_S)  # its last record must not land after "leaving"
            if self.trainer is not None:  # built after the block was chosen
                self._save()
                self.state = "leaving"
                self._announce(wait=True)
        except Exception as error:  # leaving must not hang or fail: the record expires anyway
            logger.warning("could not announce leaving: %s", error)
        if self.averager is not None:
            stop_child(self.averager, self.averager.shutdown)
        if self.loop is not None:
            self.loop.close(self.p2p)
        stop_child(self.dht, self.dht.shutdown)
        logger.info("peer stopped")
