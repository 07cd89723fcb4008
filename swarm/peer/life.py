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

Steps 1 to 4 are the join: its phases each make one record of what they built (parts.py), and
the running peer reads them from `Joined`, where none is missing. A stop or a failure mid-join
leaves from wherever it got to: the records made so far say what to save and announce, and what
it started (the DHT, the loop, the averager) is stopped, last made first.

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

from hivemind.p2p import P2P, ServicerBase
from hivemind.utils.crypto import RSAPrivateKey

from swarm import __version__
from swarm.checkpoints.choice import Choice, SpotCheck, choose_checkpoint
from swarm.checkpoints.spot_check import private_seed
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
from swarm.p2p.limits import CallerGate
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
from swarm.peer.parts import Claimed, Entered, Joined, Joining, Replica, Synced, Wired
from swarm.serving.server import DenoiseServicer
from swarm.sync.dense import block_averager
from swarm.sync.descent import DescentProbe
from swarm.sync.exchange import Exchange, allowance_for
from swarm.sync.modes import MODES, SyncInputs
from swarm.sync.reconcile import ReconcileRound
from swarm.sync.strategy import train_step
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
    """One peer's life; `stop()` (or SIGINT/SIGTERM) ends it cleanly after the current step.

    Its parts are made by the join and held in `parts` (swarm/peer/parts.py): a `Joining` of the
    records made so far, then the `Joined` record the running peer reads (`joined`). What changes
    while it runs (state, checkpoint, lineage) is its own.
    """

    def __init__(self, config: PeerConfig, hooks: PeerHooks | None = None):
        self.config = config.checked()
        self.hooks = hooks or PeerHooks()
        self.stopping = threading.Event()
        # a member signs its records with its certified key; anyone else with a key of this run
        self.credentials: Credentials | None = None
        if self.config.member_key is not None:
            self.credentials = load_credentials(self.config.member_key, self.config.certificate)
        self.private_key = self.credentials.key if self.credentials else self._record_key()
        self.state: PeerState = "joining"
        self.parts: Joining | Joined = Joining()
        # what the join started (child processes, the loop), stopped last made first when it leaves
        self._closers: list[Callable[[], None]] = []
        self.checkpoint: CheckpointInfo | None = None
        self.checkpoint_time: float | None = None
        # the checkpoint it took from others when it joined, and the voices that vouched for it (its record's
        # `taken_from` while it announces that checkpoint: a voucher of its own only if two or more did)
        self.lineage: tuple[CheckpointInfo, tuple[str, ...]] | None = None

    @property
    def joined(self) -> Joined:
        """Its parts, once joined (the training loop's)."""
        assert isinstance(self.parts, Joined), "the peer has not joined yet"
        return self.parts

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
        """What this peer hosts: answered to `rpc_info` (status, ping; served from `_open_p2p` on). `owner`
        is the key its records are signed with: a record naming this peer under another key is an impostor's."""
        entered, claimed = self.parts.entered, self.parts.claimed
        return PeerInfo(block=claimed.block, owner=entered.directory.owner_subkey, announcement=self.announcement(),
                        membership=entered.membership)  # fmt: skip

    def announcement(self) -> BlockAnnouncement:
        """This peer's record as it stands: who it is, its state and checkpoint, its training and sync
        figures (what the announcer thread stores every period; it reads figures only, never weights).
        While it joins, from the parts made so far (announced from `_take_block` on)."""
        parts = self.parts
        entered, synced = parts.entered, parts.synced or Synced.not_yet()
        trainer, sync, reconcile = parts.replica.trainer if parts.replica else None, synced.sync, synced.reconcile
        recent = trainer.losses[-LOSS_WINDOW:] if trainer else []
        seconds = trainer.step_seconds[-LOSS_WINDOW:] if trainer else []
        joining = self.state == "joining"  # a joining record claims no progress
        pings = parts.claimed.announcer.pings if parts.claimed else None
        return BlockAnnouncement(
            peer_id=entered.peer_id,
            state=self.state,
            step=trainer.step_count if trainer and not joining else 0,
            checkpoint=None if joining else self.checkpoint,  # one it may not serve yet
            loss=sum(recent) / len(recent) if recent else None,
            throughput=len(seconds) / sum(seconds) if seconds else 0.0,
            version=__version__,
            public_name=self.config.public_name,
            checkpoint_time=self.checkpoint_time,
            sync_steps=sync.steps,
            sync_bytes_sent=sync.bytes_sent + (synced.averager.bytes_sent if synced.averager is not None else 0),
            sync_bytes_received=sync.bytes_received,
            sync_round_s=sync.round_seconds,
            compute_utilisation=trainer.utilisation(sync.wait_seconds) if trainer else None,
            drift=reconcile.drift if reconcile else None,
            pings=pings.latest if pings else (),
            reached=entered.reached,
            membership=entered.membership,
            work_nonce=entered.work_nonce,
            taken_from=self.lineage[1] if self.lineage and self.lineage[0] == self.checkpoint else (),
        )

    # joining

    def _join(self) -> Joined:
        """Join in phases, each made of the records of those before (swarm/peer/parts.py), each record
        kept in `parts` as it is made; a stop signal ends the join between two phases, and inside
        every wait of one (the model record, the DHT's reads, the replicas), within a few seconds."""
        self.parts = parts = Joining()
        parts.entered = entered = self._enter_swarm()
        self._stop_if_told()
        parts.claimed = claimed = self._take_block(entered)
        parts.wired = wired = self._open_p2p(entered)
        parts.replica = replica = self._make_replica(entered, claimed.block, wired.gate)
        self._stop_if_told()
        self._load_start_state(entered, claimed, wired, replica)
        self._stop_if_told()
        replica.denoise_service.swap_in(replica.trainer.module, self.checkpoint.sha256 if self.checkpoint else "")
        parts.synced = self._set_up_sync(entered, claimed, wired, replica)
        self.parts = joined = parts.joined()
        self._serve_block(joined)
        self._stop_if_told()
        self.state = "training"
        claimed.announcer.announce(wait=True)
        self._wait_for_replicas(claimed.announcer)
        return joined

    def _stop_if_told(self) -> None:
        if self.stopping.is_set():
            raise StoppedWhileJoining()

    def _enter_swarm(self) -> Entered:
        """Start the DHT (reachable directly or through relays), read the model it trains, and show
        what this identity needs to count there (a member's certificate, the work that prices it)."""
        network = reachability.plan(self.config.network, self.config.reachability)  # before announcing anything
        dht = start_dht(self.config.swarm, network, self.private_key)
        self._closers.append(functools.partial(stop_child, dht, dht.shutdown))
        peer_id = dht.peer_id.to_base58()
        if network.relayed:
            logger.info("behind NAT: reachable through %s", ", ".join(reachability.require_circuit(dht)))
        directory = SwarmDirectory(dht, self.config.swarm, self.private_key, self.config.creator,
                                   self.config.network.dht_timeout)  # fmt: skip
        logger.info("joined the DHT as %s; reading the model record of swarm %r", peer_id, self.config.swarm)
        model_config = self._model_config(directory)
        membership = self.credentials.proof(peer_id) if self.credentials is not None else None
        if directory.membership.members_only:
            self._check_membership(directory, membership, peer_id)
        work_nonce = self._identity_work(directory, peer_id) if directory.work.required else None
        reached: Reached = "relayed" if network.relayed else "direct"
        return Entered(dht, peer_id, directory, model_config, reached, membership, work_nonce)

    def _model_config(self, directory: SwarmDirectory) -> ModelConfig:
        """The swarm's model config, once its record is found; SwarmError if it is not the one expected."""
        model_config = directory.wait_for_model(self.config.join_timeout, stop=self.stopping)
        expected, found = self.config.expect_config_hash, model_config.hash()
        if expected and not found.startswith(expected.lower()):
            raise SwarmError(
                f"swarm {self.config.swarm!r} trains model config {found[:16]}, not the expected {expected[:16]}"
            )
        return model_config

    def _record_key(self) -> RSAPrivateKey:
        """The key its records are signed with: `--record-key`'s (made on first use), else a new one."""
        return load_or_create_key(self.config.record_key) if self.config.record_key else RSAPrivateKey()

    def _identity_work(self, directory: SwarmDirectory, peer_id: str) -> int:
        """The nonce that prices this identity (key and peer id) in its swarm (swarm/p2p/work.py): kept
        beside its key, else solved now, minutes at a real swarm's price; a stop signal ends the search."""
        key_path = self.config.member_key or self.config.record_key
        if key_path is None or self.config.network.identity_path is None:
            logger.warning("swarm %r prices an identity: without --record-key and --identity this peer's work is "
                           "solved again every run", self.config.swarm)  # fmt: skip
        nonce = stored_or_solved(work_path(key_path) if key_path else None, directory.work.terms, self.config.swarm,
                                 directory.fingerprint, peer_id, self.stopping)  # fmt: skip
        if nonce is None:
            raise StoppedWhileJoining()
        return nonce

    def _check_membership(self, directory: SwarmDirectory, membership: MemberProof | None, peer_id: str) -> None:
        """SwarmError unless this peer would count in its members-only swarm: a certificate the
        others accept, and a sync mode whose partners can be checked (hivemind's averager groups
        with any key that asks, so `--sync dense` is not offered there)."""
        swarm = self.config.swarm
        if membership is None:
            raise SwarmError(f"swarm {swarm!r} is members-only: join with --member-key and --certificate (its "
                             "creator issues them: swarm-bootstrap keygen, then swarm-bootstrap invite)")  # fmt: skip
        refused = directory.membership.refusal(membership, peer_id)
        if refused:
            raise SwarmError(f"swarm {swarm!r} is members-only and refuses this peer's certificate: {refused}")
        if MODES[self.config.sync].averages_gradients:
            raise SwarmError(f"--sync {self.config.sync} trusts every groupmate (hivemind's averager) and cannot check "
                             f"that they are members: members-only swarm {swarm!r} does not offer it")  # fmt: skip

    def _take_block(self, entered: Entered) -> Claimed:
        """Choose a block and announce it as taken; from then on a thread keeps announcing it."""
        block = self._choose_block(entered)
        logger.info("peer %s hosts block %d of swarm %r", entered.peer_id, block, self.config.swarm)
        period = self.config.announce_period
        witness = Witness(self.private_key, self.config.swarm, entered.peer_id, RECORD_LIFETIME_PERIODS * period,
                          entered.membership)  # fmt: skip
        announcer = Announcer(entered.directory, block, entered.peer_id, period, self.announcement, self.stopping,
                              witness)  # fmt: skip
        announcer.announce(wait=True)  # as "joining": peers choosing a block now see this one taken
        announcer.start()
        return Claimed(block, witness, announcer)

    def _open_p2p(self, entered: Entered) -> Wired:
        """The P2P handle on a loop of its own, answering who this peer is from now on (hosts it
        downloads its start checkpoint from ask, in members-only swarms) and the model's units."""
        loop = EventLoopThread()
        try:
            p2p = loop.run(entered.dht.replicate_p2p(), P2P_CALL_TIMEOUT_S)
        except BaseException:
            loop.close()
            raise
        self._closers.append(functools.partial(loop.close, p2p))
        loop.run(InfoServicer(self.info).add_p2p_handlers(p2p), P2P_CALL_TIMEOUT_S)
        self._serve_units(entered, loop, p2p)
        return Wired(loop, p2p, MemberGate.over(entered.directory.membership, p2p))

    def _serve_units(self, entered: Entered, loop: EventLoopThread, p2p: P2P) -> None:
        """The model's units, fetched from the swarm's peers if this machine lacks its tokenizer
        (checked against the config's hash), and served to the peers that ask next."""
        model_config, initial_peers = entered.model_config, self.config.network.initial_peers
        peer_ids = functools.partial(swarm_peer_ids, initial_peers, entered.directory, model_config.n_blocks)
        units = units_from_swarm(model_config, loop, p2p, peer_ids)
        if isinstance(units, TokenUnits):
            loop.run(TokenizerServicer(units).add_p2p_handlers(p2p), P2P_CALL_TIMEOUT_S)

    def _make_replica(self, entered: Entered, block: int, gate: CallerGate) -> Replica:
        """The block's checkpoint store, its trainer (fresh weights until `_load_start_state`), the
        spot check of others' checkpoints, and the denoise service."""
        model_config = entered.model_config
        # a checkpoint stays at least as long as a record that names it may live (and then some)
        store = CheckpointStore(Path(self.config.checkpoint_dir), model_config, block, self.config.swarm,
                                min_age_s=4 * self.config.announce_period + P2P_CALL_TIMEOUT_S)  # fmt: skip
        corpus = load_corpus(self.config.data)
        windows = corpus.windows("train", model_config)
        spot_check = SpotCheck.from_corpus(corpus, model_config)
        trainer = replica_trainer(
            model_config, block, windows, self.config.train_config(), entered.peer_id, self.config.device
        )
        return Replica(store, spot_check, trainer, DenoiseServicer(model_config, block, gate))

    def _serve_block(self, joined: Joined) -> None:
        """Serve every P2P service (the start weights are in the denoise service already), and start
        measuring the neighbours."""
        loop, p2p = joined.wired.loop, joined.wired.p2p
        for servicer in self._servicers(joined):
            loop.run(servicer.add_p2p_handlers(p2p), P2P_CALL_TIMEOUT_S)
        entered, block = joined.entered, joined.claimed.block
        pings = NeighbourPings(entered.directory, p2p, loop, entered.peer_id, block, entered.model_config.n_blocks,
                               witness=joined.claimed.witness)  # fmt: skip
        joined.claimed.announcer.ping_neighbours(pings)

    def _servicers(self, joined: Joined) -> list[ServicerBase]:
        """Checkpoints, remote denoising, reachability, the sync's, and the hooks' (benchmarks); info
        is served from the moment the peer has a P2P handle (`_open_p2p`)."""
        block, gate = joined.claimed.block, joined.wired.gate
        servicers = [
            BlockServicer(block, joined.replica.store, gate),
            joined.replica.denoise_service,
            reachability.ReachabilityServicer(joined.wired.p2p, public=joined.entered.reached == "direct"),
        ]
        if joined.synced.payloads is not None:
            servicers.append(joined.synced.payloads)
        if self.hooks.servicers is not None:
            servicers += self.hooks.servicers(joined.entered.model_config, block)
        return servicers

    def _set_up_sync(self, entered: Entered, claimed: Claimed, wired: Wired, replica: Replica) -> Synced:
        """The strategy of --sync (swarm/sync/modes.py), the averager for dense steps, the reconcile
        rounds, and the payload service for the modes that exchange payloads (served by `_serve_block`)."""
        mode, timeout, block = MODES[self.config.sync], 2 * self.config.sync_deadline, claimed.block
        averager = None
        if mode.averages_gradients:
            prefix = f"{self.config.swarm}_block{block}"  # hivemind: no dots in a prefix
            group = max(2, self.config.wait_for_replicas)
            averager = block_averager(entered.dht, prefix, trainable(replica.trainer.module), group,
                                      self.config.sync_deadline)  # fmt: skip
            self._closers.append(functools.partial(stop_child, averager, averager.shutdown))
        payloads, exchange = None, None
        if mode.exchanges_payloads:
            payloads = PayloadServicer(block, self.config.sync_deadline, wired.gate)
            exchange = self._exchange(payloads, entered.peer_id, claimed, wired, replica.trainer)
        reconcile = None
        if self.config.average_every:
            directory = entered.directory
            reconcile = ReconcileRound(wired.p2p, wired.loop, entered.model_config, block, directory.owner_subkey,
                                       lambda: directory.hosts(block), RECONCILE_DEADLINE_S, replica.spot_check,
                                       lambda: directory.keys_count, self.stopping,
                                       voters=(lambda: exchange.voters) if exchange else None)  # fmt: skip
        probe = DescentProbe(replica.trainer.module, replica.spot_check.windows["validation"], block,
                             private_seed()) if mode.outer_rounds else None  # fmt: skip
        sync = mode.build(SyncInputs(replica.trainer.module, self.config.lr, self.config.de_mo, self.config.outer,
                                     self.config.overlap_steps, timeout, exchange, averager, probe))  # fmt: skip
        return Synced(sync, averager, reconcile, payloads)

    def _exchange(self, payloads: PayloadServicer, peer_id: str, claimed: Claimed, wired: Wired,
                  trainer: Trainer) -> Exchange:  # fmt: skip
        """The payload exchange with the block's other replicas; the trainer computes spare batches
        while it waits, with --spare-batch-size. What the others' step claims may move its step
        follows the length of its schedule (exchange.py `allowance_for`)."""
        size = self.config.spare_batch_size
        spare_batch = functools.partial(trainer.spare_batch, size) if size else None
        transport = P2PTransport(payloads, wired.p2p, wired.loop)
        return Exchange(transport, peer_id, claimed.announcer.replica_ids, trace=self.hooks.sync_trace,
                        spare_batch=spare_batch, witness=claimed.witness,
                        jump_allowance=allowance_for(trainer.config.steps))  # fmt: skip

    def _read_dht(self, read: Callable[[], T], what: str) -> T:
        """A DHT read needed to join, retried while the DHT is slow, up to the join timeout."""

        def attempt() -> tuple[T] | None:
            self._stop_if_told()
            try:
                return (read(),)
            except DHTUnavailable as error:
                logger.warning("%s; trying again", error)
                return None

        return wait_for(attempt, self.config.join_timeout, what, interval=1.0, stop=self.stopping)[0]

    def _wait_for_replicas(self, announcer: Announcer) -> None:
        """Hold the first step until `wait_for_replicas` replicas are up, so they start in step."""
        deadline = time.monotonic() + self.config.join_timeout
        announcer.read_replicas()
        while announcer.replicas_started() + 1 < self.config.wait_for_replicas:
            if time.monotonic() >= deadline:
                logger.warning("block %d: %d of %d replicas up after %.0fs; training without waiting longer",
                               announcer.block, announcer.replicas_started() + 1, self.config.wait_for_replicas,
                               self.config.join_timeout)  # fmt: skip
                return
            if self.stopping.wait(0.5):
                return
            announcer.read_replicas()

    def _choose_block(self, entered: Entered) -> int:
        n_blocks = entered.model_config.n_blocks
        if self.config.block == "auto":
            hosts = self._read_dht(lambda: entered.directory.all_hosts(n_blocks), "the hosts of every block")
            return least_hosted_block(hosts)
        block = int(self.config.block)
        if block >= n_blocks:
            raise SwarmError(
                f"block index {block} is out of range: swarm {self.config.swarm!r} has blocks 0..{n_blocks - 1}"
            )
        return block

    def _load_start_state(self, entered: Entered, claimed: Claimed, wired: Wired, replica: Replica) -> None:
        """Start from the checkpoint chosen on evidence (swarm/checkpoints/choice.py): the one the
        replicas agree on that passes the spot check, unless its own newest is as fresh; else
        fresh weights."""
        block, directory, store = claimed.block, entered.directory, replica.store
        own = store.latest()
        own = (own[0].read_bytes(), own[1]) if own else None
        hosts = self._read_dht(lambda: directory.hosts(block), f"the hosts of block {block}")
        others = [h for h in hosts if h.peer_id != entered.peer_id and h.announcement.checkpoint is not None]
        if not others and own is None:
            logger.info("block %d: no checkpoint anywhere, starting fresh", block)
            return
        coro = choose_checkpoint(wired.p2p, others, entered.model_config, block, replica.spot_check, own,
                                 keys_count=directory.keys_count, backed=backed_keys(directory))  # fmt: skip
        try:
            choice = wired.loop.run(coro, JOIN_FETCH_TIMEOUT_S, stop=self.stopping)
        except (SwarmError, TimeoutError) as error:
            logger.warning("block %d: %s; starting fresh", block, error)
            return
        for passed in choice.passed:  # its hosts served a checkpoint that passed the spot check here
            claimed.witness.verified(passed.host.peer_id, passed.host.owner, passed.candidate.checkpoint.step)
        self._start_from(choice, entered.model_config, replica)

    def _start_from(self, choice: Choice, model_config: ModelConfig, replica: Replica) -> None:
        """Load the chosen checkpoint into the trainer, at the step it believes, and keep its lineage."""
        trainer, store = replica.trainer, replica.store
        denoiser, _ = decode_block(choice.data, model_config, store.block)
        trainer.module.load_state_dict(denoiser.state_dict())
        trainer.step_count = step = choice.step  # its stamp, unless no other key's makes it plausible
        self.checkpoint = choice.checkpoint
        if choice.host is not None:
            origin = f"replica {choice.host.peer_id} ({choice.host.announcement.public_name or 'unnamed'})"
            if step == choice.checkpoint.step:
                store.adopt(choice.data, choice.checkpoint)
            else:  # the weights, under the step it takes: it never vouches for a stamp it does not believe
                self.checkpoint = store.save(trainer.module, step)
            self.lineage = (self.checkpoint, choice.taken_from)
            store.keep_lineage(self.checkpoint, choice.taken_from)
        else:
            origin = f"own checkpoint {store.path_for(choice.checkpoint.step)}"
            if (voices := store.lineage_of(choice.checkpoint)) is not None:  # adopted before a restart: not its own
                self.lineage = (choice.checkpoint, voices)
        self.checkpoint_time = time.time()
        logger.info(
            "block %d: starting at step %d from %s (spot-check loss %.3f)", store.block, step, origin, choice.loss
        )

    # training

    def _train_until_stopped(self) -> None:
        # the announcer has its own thread: a step that waits on other replicas must not let the record lapse
        trained = self._train()
        if self.stopping.is_set():
            return
        joined = self.joined
        self.state = "serving"  # done training (max steps): still serves its block until stopped
        joined.claimed.announcer.announce(wait=True)
        logger.info("block %d: trained %d steps, to step %d; serving until stopped", joined.claimed.block, trained,
                    joined.replica.trainer.step_count)  # fmt: skip
        self.stopping.wait()

    def _train(self) -> int:
        """Step until stopped or `max_steps`, saving every `save_every` steps and at the end; returns
        the steps trained. `max_steps` is where the step it started at plus the steps it trained
        reach: a jump (swarm/sync/exchange.py) moves the step counter, and so the schedule, but never
        ends a run, whatever the replicas that report a step ahead claim. Before each save the sync
        applies what it still has in flight (an overlapped strategy is an update behind): a
        checkpoint holds every update up to its step, and replicas that applied the same ones save
        the same bytes."""
        replica, sync = self.joined.replica, self.joined.synced.sync
        trainer = replica.trainer
        started, trained = trainer.step_count, 0
        # the moment the first step starts (benchmarks/time_to_loss.py times each save from it)
        logger.info("block %d: training from step %d", self.joined.claimed.block, trainer.step_count)
        while not self.stopping.is_set():
            if self.config.max_steps is not None and started + trained >= self.config.max_steps:
                break
            train_step(trainer, sync)
            trained += 1
            self._keep_replicas_together()
            if trainer.step_count % self.config.save_every == 0:
                self._settle()
                self._save(replica)
        self._settle()
        self._save(replica)
        return trained

    def _settle(self) -> None:
        """Apply what the sync still has in flight; continue from the step it returns, if a
        majority of the replicas turned out to be ahead."""
        trainer = self.joined.replica.trainer
        continue_from = self.joined.synced.sync.settle(trainer)
        if continue_from is not None:
            trainer.step_count = continue_from

    def _keep_replicas_together(self) -> None:
        """Every `average_every` steps, if a round is due (reconcile.py `ReconcileRound.due`: in an open
        swarm always; where keys count, if the replicas may have drifted apart: always for dense and
        none, for the payload modes only when a replica applied other payloads than the rest): save
        and announce this step's checkpoint, then merge with the other replicas' checkpoints of the
        step that measure as well as this one (swarm/sync/reconcile.py)."""
        joined = self.joined
        trainer, sync, reconcile = joined.replica.trainer, joined.synced.sync, joined.synced.reconcile
        if reconcile is None or trainer.step_count % self.config.average_every != 0:
            return
        replicas = len(joined.claimed.announcer.replica_ids())
        if not replicas or not reconcile.due(sync.may_have_drifted):
            return
        self._settle()
        self._save(joined.replica)
        if self.checkpoint is None or self.checkpoint.step != trainer.step_count:
            return  # the disk refused this step's checkpoint: the next round tries again
        joined.claimed.announcer.announce(wait=True)
        # the record just announced: its lineage says whose voice this checkpoint is (reconcile.py `weigh`)
        if reconcile.run(trainer.module, self.announcement(), replicas) is not None:
            sync.averaged(trainer.step_count)

    def _settle_to_leave(self, replica: Replica) -> None:
        """Before the last save, apply what the sync still has in flight, as every save does (after
        `_train`, nothing is; after an error in it, an overlapped strategy may hold steps ahead).
        Failing here (the exchange may be what failed) leaves the weights as settle left them."""
        synced = self.parts.synced
        if synced is None:
            return
        try:
            synced.sync.settle(replica.trainer)
        except Exception as error:  # noqa: BLE001 (leaving must not fail: the save still runs)
            logger.warning("could not apply the updates in flight before leaving: %s", error)

    def _save(self, replica: Replica) -> None:
        """Save and serve a new checkpoint; if the disk refuses (full, read-only), keep serving
        the last good one and go on training: the next save tries again."""
        trainer, store = replica.trainer, replica.store
        if self.checkpoint is not None and self.checkpoint.step == trainer.step_count:
            return
        try:
            saved = store.save(trainer.module, trainer.step_count)
        except OSError as error:
            kept = f"step {self.checkpoint.step}" if self.checkpoint else "none"
            logger.error("block %d: could not save step %d (%s); last good checkpoint kept: %s",
                         store.block, trainer.step_count, error.strerror or error, kept)  # fmt: skip
            return
        replica.denoise_service.swap_in(trainer.module, saved.sha256)  # before the record names it
        self.checkpoint, self.checkpoint_time = saved, time.time()
        logger.info("block %d: saved step %d (%s)", store.block, self.checkpoint.step, self.checkpoint.sha256[:12])

    # leaving

    def _leave(self) -> None:
        """Leave from wherever the join got to: with a block taken, a last record says "leaving" (after
        a save, once it has a trainer); then what the join started stops, last made first."""
        self.stopping.set()  # also ends the announcer when training stopped on an error
        claimed, replica = self.parts.claimed, self.parts.replica
        try:
            if claimed is not None:
                claimed.announcer.join()  # its last record must not land after "leaving"
            if claimed is not None and replica is not None:
                self._settle_to_leave(replica)
                self._save(replica)
                self.state = "leaving"
                claimed.announcer.announce(wait=True)
        except Exception as error:  # noqa: BLE001 (leaving must not hang or fail: the record expires anyway)
            logger.warning("could not announce leaving: %s", error)
        for close in reversed(self._closers):  # the averager, the loop and its P2P handle, the DHT
            close()
        if self._closers:
            logger.info("peer stopped")
