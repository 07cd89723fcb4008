"""Setting up how a peer keeps in step with its block's other replicas (`Synced`, parts.py).

Its own module because this is where a peer's settings meet swarm/sync/: the strategy of
--sync (swarm/sync/modes.py), hivemind's averager for dense steps, the payload exchange and its
service, the outer rounds' held-out probe (swarm/sync/descent.py), and the reconcile rounds; the
training loop (training.py) only steps and settles them.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

from swarm.checkpoints.spot_check import private_seed
from swarm.model.train import Trainer, trainable
from swarm.p2p.network import stop_child
from swarm.peer.config import PeerConfig
from swarm.peer.parts import Claimed, Entered, Replica, Synced, Wired
from swarm.sync.dense import block_averager
from swarm.sync.descent import DescentProbe
from swarm.sync.exchange import Exchange, allowance_for
from swarm.sync.modes import MODES, SyncInputs
from swarm.sync.reconcile import ReconcileRound
from swarm.sync.transport import P2PTransport, PayloadServicer

RECONCILE_DEADLINE_S = 60.0  # a reconcile round: the others' checkpoints of its step announced and downloaded
# gets each payload publish and each wait of the sync exchange (`PeerHooks.sync_trace`, life.py)
SyncTrace = Callable[[dict], None]


def set_up_sync(
    config: PeerConfig,
    entered: Entered,
    claimed: Claimed,
    wired: Wired,
    replica: Replica,
    trace: SyncTrace | None,
    stopping: threading.Event,
    closers: list[Callable[[], None]],
) -> Synced:
    """The strategy of --sync, the averager for dense steps (stopped by `closers`), the reconcile
    rounds (ended by `stopping`), and the payload service for the modes that exchange payloads
    (served by `serve_block`, services.py)."""
    mode, timeout, block = MODES[config.sync], 2 * config.sync_deadline, claimed.block
    averager = None
    if mode.averages_gradients:
        prefix = f"{config.swarm}_block{block}"  # hivemind: no dots in a prefix
        group = max(2, config.wait_for_replicas)
        averager = block_averager(entered.dht, prefix, trainable(replica.trainer.module), group,
                                  config.sync_deadline)  # fmt: skip
        closers.append(functools.partial(stop_child, averager, averager.shutdown))
    payloads, exchange = None, None
    if mode.exchanges_payloads:
        payloads = PayloadServicer(block, config.sync_deadline, wired.gate)
        exchange = _exchange(config, payloads, entered.peer_id, claimed, wired, replica.trainer, trace)
    reconcile = None
    if config.average_every:
        directory = entered.directory
        reconcile = ReconcileRound(wired.p2p, wired.loop, entered.model_config, block, directory.owner_subkey,
                                   lambda: directory.hosts(block), RECONCILE_DEADLINE_S, replica.spot_check,
                                   lambda: directory.keys_count, stopping,
                                   voters=(lambda: exchange.voters) if exchange else None)  # fmt: skip
    probe = DescentProbe(replica.trainer.module, replica.spot_check.windows["validation"], block,
                         private_seed()) if mode.outer_rounds else None  # fmt: skip
    sync = mode.build(SyncInputs(replica.trainer.module, config.lr, config.de_mo, config.outer,
                                 config.overlap_steps, timeout, exchange, averager, probe))  # fmt: skip
    return Synced(sync, averager, reconcile, payloads)


def _exchange(
    config: PeerConfig,
    payloads: PayloadServicer,
    peer_id: str,
    claimed: Claimed,
    wired: Wired,
    trainer: Trainer,
    trace: SyncTrace | None,
) -> Exchange:
    """The payload exchange with the block's other replicas; the trainer computes spare batches
    while it waits, with --spare-batch-size. What the others' step claims may move its step
    follows the length of its schedule (exchange.py `allowance_for`)."""
    size = config.spare_batch_size
    spare_batch = functools.partial(trainer.spare_batch, size) if size else None
    transport = P2PTransport(payloads, wired.p2p, wired.loop)
    return Exchange(transport, peer_id, claimed.announcer.replica_ids, trace=trace, spare_batch=spare_batch,
                    witness=claimed.witness, jump_allowance=allowance_for(trainer.config.steps))  # fmt: skip
