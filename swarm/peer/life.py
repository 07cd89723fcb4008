"""A swarm peer: joins, picks a block, starts from the freshest replica, trains, serves, announces.

`Peer.run()` is the whole life of `swarm-peer`:
1. join the DHT and read the swarm's model config (`S.model`);
2. pick a block (`auto`: the one with the fewest live hosts);
3. start from its own newest checkpoint, else the freshest verified replica's, else fresh;
4. serve its checkpoints over P2P and announce itself under `S.block.<b>`;
5. train with the core's block trainer, saving every `save_every` steps, until `max_steps`
   or a stop signal; from the moment it chose its block (step 2), a thread announces it
   every `announce_period` seconds (announcer.py);
6. on stop: save, announce that it is leaving, shut down.

Threads and processes, and who may touch the weights:
- the main thread joins, then trains: it alone reads and writes the block's live weights (the
  optimizer or sync step, a reconcile round, the start state), and at each save it hands the
  denoise service a copy of the checkpoint it is about to announce;
- the "announcer" thread stores the peer's record every announce period; it reads figures only,
  and starts a round of pings to its neighbours (swarm/p2p/pings.py) on the p2p loop;
- the "p2p-loop" thread runs an asyncio loop with the P2P services (info and checkpoint
  downloads, sync payloads, remote denoising) and the calls the main thread makes to other
  peers; a denoise request computes in the loop's worker threads on a copy of the announced
  checkpoint (never on the live weights), which `swap_in` replaces whole;
- child processes: hivemind's DHT (with its libp2p daemon) and, for `--sync dense` alone,
  hivemind's averager; the main thread hands gradients to the averager and takes its result
  itself.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from hivemind.p2p import ServicerBase
from hivemind.utils.crypto import RSAPrivateKey

from swarm import __version__
from swarm.checkpoints.choice import SpotCheck, choose_checkpoint
from swarm.checkpoints.store import CheckpointStore
from swarm.checkpoints.transfer import BlockServicer
from swarm.errors import SwarmError
from swarm.model.checkpoint import decode_block
from swarm.model.data import Windows, load_corpus
from swarm.model.denoiser import ModelConfig
from swarm.model.train import TrainConfig, Trainer, block_trainer, trainable
from swarm.model.units import TokenUnits
from swarm.p2p import reachability
from swarm.p2p.directory import DHTUnavailable, SwarmDirectory, least_hosted_block
from swarm.p2p.gate import MemberGate
from swarm.p2p.info import InfoServicer
from swarm.p2p.ledger import Witness, backed_keys
from swarm.p2p.limits import OPEN, CallerGate
from swarm.p2p.members import Credentials, load_credentials
from swarm.p2p.messages import PeerInfo
from swarm.p2p.network import EventLoopThread, load_or_create_key, start_dht, stop_child
from swarm.p2p.pings import NeighbourPings
from swarm.p2p.records import BlockAnnouncement, CheckpointInfo, MemberProof, PeerState, Reached
from swarm.p2p.tokenizer import TokenizerServicer, swarm_peer_ids, units_from_swarm
from swarm.p2p.work import stored_or_solved, work_path
from swarm.peer.announcer import RECORD_LIFETIME_PERIODS, Announcer
from swarm.peer.config import PeerConfig
from swarm.peer.memory import return_freed_memory
from swarm.serving.server import DenoiseServicer
from swarm.sync.dense import CountingAverager, block_averager
from swarm.sync.exchange import Exchange
from swarm.sync.modes import MODES, SyncInputs
from swarm.sync.reconcile import ReconcileRound
from swarm.sync.strategy import NoSync, SyncStrategy, train_step
from swarm.sync.transport import P2PTransport, PayloadServicer
from swarm.waiting import WaitStopped, wait_for

logger = logging.getLogger(__name__)

P2P_CALL_TIMEOUT_S = 30.0
JOIN_FETCH_TIMEOUT_S = 600.0  # choosing a start checkpoint: a few verified downloads and spot checks
RECONCILE_DEADLINE_S = 60.0  # a reconcile round: the others' checkpoints of its step announced and downloaded
LOSS_WINDOW = 20  # steps averaged into the announced loss
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
T = TypeVar("T")


@dataclass
class PeerHooks:
    """What a benchmark hands a peer besides its config (a production peer takes none).

    Args:
        servicers: more P2P services to run, made once the block is known (model config, block),
            e.g. a stage of the autoregressive pipeline for benchmarks/serve.py.
        sync_trace: gets each payload publish and each wait of the sync exchange (benchmarks/sync.py).
    """

    servicers: Callable[[ModelConfig, int], list[ServicerBase]] | None = None
    sync_trace: Callable[[dict], None] | None = None


def replica_trainer(
    config: ModelConfig, block: int, windows: Windows, train: TrainConfig, peer_id: str, device: str = "cpu"
) -> Trainer:
    """Block `block`'s trainer as the replica `peer_id` runs it: the block's start weights, and
    batches of its own (drawn from a stream seeded by its peer id)."""
    trainer = block_trainer(config, block, windows, train, device)
    trainer.generator.manual_seed(int(peer_id.encode().hex(), 16) % 2**63)
    return trainer


def _default_stop_signals() -> None:
    """In a child process just forked from a peer: stop signals do what they do by default."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


class StoppedWhileJoining(Exception):
    """A stop signal came while the peer was still joining: leave at once."""


class Peer:
    """One peer's life; `stop()` (or SIGINT/SIGTERM) ends it cleanly after the current step."""

    def __init__(self, config: PeerConfig, hooks: PeerHooks | None = None):
        self.config = config.checked()
        self.hooks = hooks or PeerHooks()
        self.stopping = threading.Event()
        # a member signs its records with its certified key; anyone else with a key of this run
        self.credentials: Credentials | None = None
        if self.config.member_key is not None:
            self.credentials = load_credentials(self.config.member_key, self.config.certificate)
        self.private_key = self.credentials.key if self.credentials else self._record_key()
        self.membership: MemberProof | None = None  # the proof it carries, once its peer id is known
        self.work_nonce: int | None = None  # where the swarm prices an identity: this one's work, once solved
        self.gate: CallerGate = OPEN  # who its services answer: members only, in a members-only swarm
        self.state: PeerState = "joining"
        self.reached: Reached = "direct"
        # made while joining, in this order (None until then)
        self.dht = self.loop = self.p2p = None
        self.peer_id = ""
        self.directory: SwarmDirectory | None = None
        self.model_config: ModelConfig | None = None
        self.block: int | None = None
        self.announcer: Announcer | None = None
        self.witness: Witness | None = None  # what it checked of others: the ledger's attestations
        self.store: CheckpointStore | None = None
        self.spot_check: SpotCheck | None = None
        self.trainer: Trainer | None = None
        self.denoise_service: DenoiseServicer | None = None
        self.checkpoint: CheckpointInfo | None = None
        self.checkpoint_time: float | None = None
        # the checkpoint it took from others when it joined, and the voices that vouched for it (its record's
        # `taken_from` while it announces that checkpoint: a voucher of its own only if two or more did)
        self.lineage: tuple[CheckpointInfo, tuple[str, ...]] | None = None
        # keeping the replicas in step (swarm/sync/)
        self.sync: SyncStrategy = NoSync()
        self.averager: CountingAverager | None = None  # a child process, for --sync dense
        self.reconcile: ReconcileRound | None = None  # rounds that bring drifted replicas back together

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        """SIGINT/SIGTERM stop it after the current step. Its child processes (the DHT, the averager)
        do not inherit that handler: a child told to stop by its own shutdown code stops."""
        os.register_at_fork(after_in_child=_default_stop_signals)
        for sig in STOP_SIGNALS:
            signal.signal(sig, lambda *_: self.stop())
        if self.config.low_memory and return_freed_memory():  # before the block's first tensor
            logger.info("low memory: activations recomputed, freed memory returned to the system")
        try:
            self._join()
            self._train_until_stopped()
        except (StoppedWhileJoining, WaitStopped):
            logger.info("stopped while joining")
        finally:
            self._leave()

    def info(self) -> PeerInfo:
        """What this peer hosts: answered to `rpc_info` (status, ping). `owner` is the key its
        records are signed with: a record naming this peer under another key is an impostor's."""
        return PeerInfo(block=self.block, owner=self.directory.owner_subkey, announcement=self.announcement(),
                        membership=self.membership)  # fmt: skip

    def announcement(self) -> BlockAnnouncement:
        """This peer's record as it stands: who it is, its state and checkpoint, its training and sync
        figures (what the announcer thread stores every period; it reads figures only, never weights)."""
        trainer, sync, reconcile = self.trainer, self.sync, self.reconcile
        recent = trainer.losses[-LOSS_WINDOW:] if trainer else []
        seconds = trainer.step_seconds[-LOSS_WINDOW:] if trainer else []
        joining = self.state == "joining"  # a joining record claims no progress
        pings = self.announcer.pings if self.announcer else None
        return BlockAnnouncement(
            peer_id=self.peer_id,
            state=self.state,
            step=trainer.step_count if trainer and not joining else 0,
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
            compute_utilisation=trainer.utilisation(sync.wait_seconds) if trainer else None,
            drift=reconcile.drift if reconcile else None,
            pings=pings.latest if pings else (),
            reached=self.reached,
            membership=self.membership,
            work_nonce=self.work_nonce,
            taken_from=self.lineage[1] if self.lineage and self.lineage[0] == self.checkpoint else (),
        )

    # joining

    def _join(self) -> None:
        """Join in phases; a stop signal ends the join between two phases, and inside every wait of
        one (the model record, the DHT's reads, the replicas), within a few seconds."""
        for phase in (self._enter_swarm, self._take_block, self._load_start_state, self._serve_block):
            phase()
            if self.stopping.is_set():
                raise StoppedWhileJoining()
        self.state = "training"
        self.announcer.announce(wait=True)
        self._wait_for_replicas()

    def _enter_swarm(self) -> None:
        """Start the DHT (reachable directly or through relays) and read the model it trains."""
        network = reachability.plan(self.config.network, self.config.reachability)  # before announcing anything
        self.dht = start_dht(self.config.swarm, network, self.private_key)
        self.peer_id = self.dht.peer_id.to_base58()
        if network.relayed:
            self.reached = "relayed"
            logger.info("behind NAT: reachable through %s", ", ".join(reachability.require_circuit(self.dht)))
        self.directory = SwarmDirectory(self.dht, self.config.swarm, self.private_key, self.config.creator,
                                        self.config.network.dht_timeout)  # fmt: skip
        logger.info("joined the DHT as %s; reading the model record of swarm %r", self.peer_id, self.config.swarm)
        self.model_config = self.directory.wait_for_model(self.config.join_timeout, stop=self.stopping)
        expected, found = self.config.expect_config_hash, self.model_config.hash()
        if expected and not found.startswith(expected.lower()):
            raise SwarmError(
                f"swarm {self.config.swarm!r} trains model config {found[:16]}, not the expected {expected[:16]}"
            )
        if self.credentials is not None:
            self.membership = self.credentials.proof(self.peer_id)
        if self.directory.membership.members_only:
            self._check_membership()
        if self.directory.work.required:
            self.work_nonce = self._identity_work()

    def _record_key(self) -> RSAPrivateKey:
        """The key its records are signed with: `--record-key`'s (made on first use), else a new one."""
        return load_or_create_key(self.config.record_key) if self.config.record_key else RSAPrivateKey()

    def _identity_work(self) -> int:
        """The nonce that prices this identity (key and peer id) in its swarm (swarm/p2p/work.py): kept
        beside its key, else solved now, minutes at a real swarm's price; a stop signal ends the search."""
        key_path = self.config.member_key or self.config.record_key
        if key_path is None or self.config.network.identity_path is None:
            logger.warning("swarm %r prices an identity: without --record-key and --identity this peer's work is "
                           "solved again every run", self.config.swarm)  # fmt: skip
        directory = self.directory
        nonce = stored_or_solved(work_path(key_path) if key_path else None, directory.work.terms, self.config.swarm,
                                 directory.fingerprint, self.peer_id, self.stopping)  # fmt: skip
        if nonce is None:
            raise StoppedWhileJoining()
        return nonce

    def _check_membership(self) -> None:
        """SwarmError unless this peer would count in its members-only swarm: a certificate the
        others accept, and a sync mode whose partners can be checked (hivemind's averager groups
        with any key that asks, so `--sync dense` is not offered there)."""
        swarm = self.config.swarm
        if self.membership is None:
            raise SwarmError(f"swarm {swarm!r} is members-only: join with --member-key and --certificate "
                             "(its creator issues them: swarm-bootstrap keygen, then swarm-bootstrap invite)")  # fmt: skip
        refused = self.directory.membership.refusal(self.membership, self.peer_id)
        if refused:
            raise SwarmError(f"swarm {swarm!r} is members-only and refuses this peer's certificate: {refused}")
        if MODES[self.config.sync].averages_gradients:
            raise SwarmError(f"--sync {self.config.sync} trusts every groupmate (hivemind's averager) and cannot "
                             f"check that they are members: members-only swarm {swarm!r} does not offer it")  # fmt: skip

    def _take_block(self) -> None:
        """Choose a block, announce it as taken (and keep announcing), and make its trainer."""
        self.block = self._choose_block(self.model_config)
        logger.info("peer %s hosts block %d of swarm %r", self.peer_id, self.block, self.config.swarm)
        period = self.config.announce_period
        self.witness = Witness(self.private_key, self.config.swarm, self.peer_id, RECORD_LIFETIME_PERIODS * period,
                               self.membership)  # fmt: skip
        self.announcer = Announcer(self.directory, self.block, self.peer_id, period, self.announcement, self.stopping,
                                   self.witness)  # fmt: skip
        self.announcer.announce(wait=True)  # as "joining": peers choosing a block now see this one taken
        self.announcer.start()
        # a checkpoint stays at least as long as a record that names it may live (and then some)
        self.store = CheckpointStore(Path(self.config.checkpoint_dir), self.model_config, self.block, self.config.swarm,
                                     min_age_s=4 * self.config.announce_period + P2P_CALL_TIMEOUT_S)  # fmt: skip
        self.loop = EventLoopThread()
        self.p2p = self.loop.run(self.dht.replicate_p2p(), P2P_CALL_TIMEOUT_S)
        # who it is, from now on: hosts it downloads its start checkpoint from ask (members-only swarms)
        self.loop.run(InfoServicer(self.info).add_p2p_handlers(self.p2p), P2P_CALL_TIMEOUT_S)
        self._serve_units()
        self.gate = MemberGate.over(self.directory.membership, self.p2p)
        corpus = load_corpus(self.config.data)
        windows = corpus.windows("train", self.model_config)
        self.spot_check = SpotCheck.from_corpus(corpus, self.model_config)
        self.trainer = replica_trainer(
            self.model_config, self.block, windows, self.config.train_config(), self.peer_id, self.config.device
        )
        self.denoise_service = DenoiseServicer(self.model_config, self.block, self.gate)

    def _serve_units(self) -> None:
        """The model's units, fetched from the swarm's peers if this machine lacks its tokenizer
        (checked against the config's hash), and served to the peers that ask next."""
        n_blocks, initial_peers = self.model_config.n_blocks, self.config.network.initial_peers
        units = units_from_swarm(self.model_config, self.loop, self.p2p,
                                 lambda: swarm_peer_ids(initial_peers, self.directory, n_blocks))  # fmt: skip
        if isinstance(units, TokenUnits):
            self.loop.run(TokenizerServicer(units).add_p2p_handlers(self.p2p), P2P_CALL_TIMEOUT_S)

    def _serve_block(self) -> None:
        """Serve the start weights and every P2P service, and start measuring the neighbours."""
        self.denoise_service.swap_in(self.trainer.module, self.checkpoint.sha256 if self.checkpoint else "")
        for servicer in self._servicers():
            self.loop.run(servicer.add_p2p_handlers(self.p2p), P2P_CALL_TIMEOUT_S)
        pings = NeighbourPings(self.directory, self.p2p, self.loop, self.peer_id, self.block, self.model_config.n_blocks,
                               witness=self.witness)  # fmt: skip
        self.announcer.ping_neighbours(pings)

    def _servicers(self) -> list[ServicerBase]:
        """Checkpoints, remote denoising, reachability, the sync's, and the hooks' (benchmarks); info
        is served from the moment the peer has a P2P handle (`_take_block`)."""
        servicers = [
            BlockServicer(self.block, self.store, self.gate),
            self.denoise_service,
            reachability.ReachabilityServicer(self.p2p, public=self.reached == "direct"),
        ]
        servicers += self._set_up_sync()
        if self.hooks.servicers is not None:
            servicers += self.hooks.servicers(self.model_config, self.block)
        return servicers

    def _set_up_sync(self) -> list[ServicerBase]:
        """The strategy of --sync (swarm/sync/modes.py), the averager for dense steps, the reconcile
        rounds, and the payload service for the modes that exchange payloads; returns the services to add."""
        mode, timeout = MODES[self.config.sync], 2 * self.config.sync_deadline
        if mode.averages_gradients:
            prefix = f"{self.config.swarm}_block{self.block}"  # hivemind: no dots in a prefix
            group = max(2, self.config.wait_for_replicas)
            self.averager = block_averager(
                self.dht, prefix, trainable(self.trainer.module), group, self.config.sync_deadline
            )
        if self.config.average_every:
            self.reconcile = ReconcileRound(self.p2p, self.loop, self.model_config, self.block, self.directory.owner_subkey,
                                            lambda: self.directory.hosts(self.block), RECONCILE_DEADLINE_S)  # fmt: skip
        payloads = None
        if mode.exchanges_payloads:
            payloads = PayloadServicer(self.block, self.config.sync_deadline, self.gate)
        exchange = self._exchange(payloads) if payloads is not None else None
        self.sync = mode.build(SyncInputs(self.trainer.module, self.config.lr, self.config.de_mo, self.config.outer,
                                          self.config.overlap_steps, timeout, exchange, self.averager))  # fmt: skip
        return [payloads] if payloads is not None else []

    def _exchange(self, payloads: PayloadServicer) -> Exchange:
        """The payload exchange with the block's other replicas; the trainer computes spare batches
        while it waits, with --spare-batch-size."""
        size = self.config.spare_batch_size
        spare_batch = functools.partial(self.trainer.spare_batch, size) if size else None
        transport = P2PTransport(payloads, self.p2p, self.loop)
        return Exchange(transport, self.peer_id, self.announcer.replica_ids, trace=self.hooks.sync_trace,
                        spare_batch=spare_batch, witness=self.witness)  # fmt: skip

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

        return wait_for(attempt, self.config.join_timeout, what, interval=1.0, stop=self.stopping)[0]

    def _wait_for_replicas(self) -> None:
        """Hold the first step until `wait_for_replicas` replicas are up, so they start in step."""
        deadline = time.monotonic() + self.config.join_timeout
        self.announcer.read_replicas()
        while len(self.announcer.replica_ids()) + 1 < self.config.wait_for_replicas and time.monotonic() < deadline:
            if self.stopping.wait(0.5):
                return
            self.announcer.read_replicas()

    def _choose_block(self, config: ModelConfig) -> int:
        if self.config.block == "auto":
            hosts = self._read_dht(lambda: self.directory.all_hosts(config.n_blocks), "the hosts of every block")
            return least_hosted_block(hosts)
        block = int(self.config.block)
        if block >= config.n_blocks:
            raise SwarmError(
                f"block index {block} is out of range: swarm {self.config.swarm!r} has blocks 0..{config.n_blocks - 1}"
            )
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
        coro = choose_checkpoint(self.p2p, others, self.model_config, self.block, self.spot_check, own,
                                 keys_count=self.directory.keys_count, backed=backed_keys(self.directory))  # fmt: skip
        try:
            choice = self.loop.run(coro, JOIN_FETCH_TIMEOUT_S, stop=self.stopping)
        except (SwarmError, TimeoutError) as error:
            logger.warning("block %d: %s; starting fresh", self.block, error)
            return
        for passed in choice.passed:  # its hosts served a checkpoint that passed the spot check here
            self.witness.verified(passed.host.peer_id, passed.host.owner, passed.candidate.checkpoint.step)
        denoiser, _ = decode_block(choice.data, self.model_config, self.block)
        self.trainer.module.load_state_dict(denoiser.state_dict())
        self.trainer.step_count = step = choice.step  # its stamp, unless no other key's makes it plausible
        self.checkpoint = choice.checkpoint
        if choice.host is not None:
            origin = f"replica {choice.host.peer_id} ({choice.host.announcement.public_name or 'unnamed'})"
            if step == choice.checkpoint.step:
                self.store.adopt(choice.data, choice.checkpoint)
            else:  # the weights, under the step it takes: it never vouches for a stamp it does not believe
                self.checkpoint = self.store.save(self.trainer.module, step)
            self.lineage = (self.checkpoint, choice.taken_from)
        else:
            origin = f"own checkpoint {self.store.path_for(choice.checkpoint.step)}"
        self.checkpoint_time = time.time()
        logger.info(
            "block %d: starting at step %d from %s (spot-check loss %.3f)", self.block, step, origin, choice.loss
        )

    # training

    def _train_until_stopped(self) -> None:
        self._train()  # the announcer has its own thread: a step that waits on other replicas must not let the record lapse
        if self.stopping.is_set():
            return
        self.state = "serving"  # done training (max steps): still serves its block until stopped
        self.announcer.announce(wait=True)
        logger.info("block %d: reached %d steps; serving until stopped", self.block, self.trainer.step_count)
        self.stopping.wait()

    def _train(self) -> None:
        """Step until stopped or `max_steps`, saving every `save_every` steps and at the end. Before
        each save the sync applies what it still has in flight (an overlapped strategy is an update
        behind): a checkpoint holds every update up to its step, and replicas that applied the
        same ones save the same bytes."""
        # the moment the first step starts (benchmarks/time_to_loss.py times each save from it)
        logger.info("block %d: training from step %d", self.block, self.trainer.step_count)
        while not self.stopping.is_set():
            if self.config.max_steps is not None and self.trainer.step_count >= self.config.max_steps:
                break
            train_step(self.trainer, self.sync)
            self._keep_replicas_together()
            if self.trainer.step_count % self.config.save_every == 0:
                self._settle()
                self._save()
        self._settle()
        self._save()

    def _settle(self) -> None:
        """Apply what the sync still has in flight; continue from the step it returns, if a
        majority of the replicas turned out to be ahead."""
        continue_from = self.sync.settle(self.trainer)
        if continue_from is not None:
            self.trainer.step_count = continue_from

    def _keep_replicas_together(self) -> None:
        """Every `average_every` steps, if the replicas may have drifted apart (always for dense and
        none; for the payload modes only when a replica applied other payloads than the rest):
        save and announce this step's checkpoint, then merge with the other replicas' checkpoints
        of the step (swarm/sync/reconcile.py)."""
        if self.reconcile is None or self.trainer.step_count % self.config.average_every != 0:
            return
        replicas = len(self.announcer.replica_ids())
        if not replicas or not self.sync.may_have_drifted():
            return
        self._settle()
        self._save()
        if self.checkpoint is None or self.checkpoint.step != self.trainer.step_count:
            return  # the disk refused this step's checkpoint: the next round tries again
        self.announcer.announce(wait=True)
        if self.reconcile.run(self.trainer.module, self.checkpoint, replicas) is not None:
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
                         self.block, self.trainer.step_count, error.strerror or error, kept)  # fmt: skip
            return
        self.denoise_service.swap_in(self.trainer.module, saved.sha256)  # before the record names it
        self.checkpoint, self.checkpoint_time = saved, time.time()
        logger.info("block %d: saved step %d (%s)", self.block, self.checkpoint.step, self.checkpoint.sha256[:12])

    # leaving

    def _leave(self) -> None:
        self.stopping.set()  # also ends the announcer when training stopped on an error
        if self.dht is None:
            return
        try:
            if self.announcer is not None:
                self.announcer.join()  # its last record must not land after "leaving"
            if self.trainer is not None:  # built after the block was chosen
                self._save()
                self.state = "leaving"
                self.announcer.announce(wait=True)
        except Exception as error:  # noqa: BLE001 (leaving must not hang or fail: the record expires anyway)
            logger.warning("could not announce leaving: %s", error)
        if self.averager is not None:
            stop_child(self.averager, self.averager.shutdown)
        if self.loop is not None:
            self.loop.close(self.p2p)
        stop_child(self.dht, self.dht.shutdown)
        logger.info("peer stopped")
