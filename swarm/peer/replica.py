"""This peer's replica of its block: what the join makes to train and serve it (`Replica`, parts.py).

Its own module because the replica's trainer is also what benchmarks and tests rebuild outside a
peer (`replica_trainer`): the same start weights and the same batches as a peer of that id.
"""

from __future__ import annotations

from pathlib import Path

from swarm.checkpoints.choice import SpotCheck
from swarm.checkpoints.store import CheckpointStore
from swarm.model.data import Windows, load_corpus
from swarm.model.denoiser import ModelConfig
from swarm.model.train import TrainConfig, Trainer, block_trainer
from swarm.p2p.limits import CallerGate
from swarm.peer.config import PeerConfig
from swarm.peer.parts import Entered, Replica
from swarm.peer.services import P2P_CALL_TIMEOUT_S
from swarm.serving.server import DenoiseServicer


def replica_trainer(
    config: ModelConfig, block: int, windows: Windows, train: TrainConfig, peer_id: str, device: str = "cpu"
) -> Trainer:
    """Block `block`'s trainer as the replica `peer_id` runs it: the block's start weights, and
    batches of its own (drawn from a stream seeded by its peer id)."""
    trainer = block_trainer(config, block, windows, train, device)
    trainer.generator.manual_seed(int(peer_id.encode().hex(), 16) % 2**63)
    return trainer


def make_replica(config: PeerConfig, entered: Entered, block: int, gate: CallerGate) -> Replica:
    """The block's checkpoint store, its trainer (fresh weights until the start state is loaded,
    start.py), the spot check of others' checkpoints, and the denoise service."""
    model_config = entered.model_config
    # a checkpoint stays at least as long as a record that names it may live (and then some)
    store = CheckpointStore(Path(config.checkpoint_dir), model_config, block, config.swarm,
                            min_age_s=4 * config.announce_period + P2P_CALL_TIMEOUT_S)  # fmt: skip
    corpus = load_corpus(config.data)
    windows = corpus.windows("train", model_config)
    spot_check = SpotCheck.from_corpus(corpus, model_config)
    trainer = replica_trainer(model_config, block, windows, config.train_config(), entered.peer_id, config.device)
    return Replica(store, spot_check, trainer, DenoiseServicer(model_config, block, gate))
