"""What `swarm-peer` is told: `PeerConfig`, whose defaults are the command line's defaults.

peers/main.py reads every default from a `PeerConfig()` (and the sync settings' own configs),
so a default is written once, here. The sync modes and their facts come from
swarm/sync/modes.py. Hooks that only benchmarks hand a peer (an extra service, a trace of the
exchange) are not settings: see `PeerHooks` in life.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from swarm.errors import SwarmError
from swarm.model.train import DENOISER_LR, TrainConfig, checked_device
from swarm.p2p.network import NetworkOptions
from swarm.p2p.reachability import REACHABILITY_CHOICES
from swarm.p2p.records import check_swarm_name
from swarm.sync.decoupled_momentum import DeMoConfig
from swarm.sync.exchange import MAX_STEPS_IN_FLIGHT
from swarm.sync.modes import MODES, payload_modes
from swarm.sync.pseudo_gradient import OuterConfig


@dataclass
class PeerConfig:
    """Everything `swarm-peer` is told; the defaults suit the built-in demo on one machine."""

    swarm: str = "demo"
    block: str = "auto"  # "auto" or a block index
    checkpoint_dir: str = "peer-checkpoints"
    data: str | None = None  # text source; None: the built-in corpus
    device: str = "cpu"  # torch device of the trainer, the sync's tensors and the denoise service
    # stop where the step it started at plus the steps it trained reach this, jumps not counted (None: until stopped)
    max_steps: int | None = None
    schedule_steps: int | None = None  # the learning-rate schedule's length (None: --max-steps); then its floor
    save_every: int = 50
    announce_period: float = 10.0
    public_name: str = ""
    batch_size: int = 32
    lr: float = DENOISER_LR
    low_memory: bool = False  # activations recomputed, freed memory returned to the system: less memory, more time
    join_timeout: float = 30.0
    sync: str = "demo"  # a mode of swarm/sync/modes.py's table
    sync_deadline: float = 5.0  # seconds a step waits for the other replicas
    overlap_steps: int = 1  # demo-overlap: how many steps late each step's gathered set is applied
    spare_batch_size: int = 0  # windows per spare batch computed while waiting for other replicas (0: wait idle)
    wait_for_replicas: int = 1  # start once this many replicas (itself included) are seen; also the group size
    # merge with the other replicas' checkpoints every this many steps (0: never; reconcile.py)
    average_every: int = 100
    expect_config_hash: str | None = None  # refuse a swarm whose model config hash differs (a prefix will do)
    creator: str | None = None  # fingerprint of the swarm creator's key: the only model record believed
    member_key: str | None = None  # members-only swarms: the key file the certificate names (signs its records)
    # members-only swarms: the creator's certificate for that key (swarm-bootstrap invite)
    certificate: str | None = None
    record_key: str | None = None  # the key file its records are signed with, made on first use (None: new each run)
    de_mo: DeMoConfig = field(default_factory=DeMoConfig)  # the DeMo optimizer's settings (--sync demo, demo-overlap)
    outer: OuterConfig = field(default_factory=OuterConfig)  # the outer step's settings (--sync outer, outer-overlap)
    network: NetworkOptions = field(default_factory=NetworkOptions)
    reachability: str = "auto"  # "auto": ask the initial peers to dial back; "direct"; "relayed" (behind NAT)

    def train_config(self) -> TrainConfig:
        """The trainer's settings this peer was given (its schedule spans --schedule-steps, else
        --max-steps, else a long run; past its end the rate stays at the floor)."""
        return TrainConfig(steps=self.schedule_steps or self.max_steps or 100_000, batch_size=self.batch_size,
                           lr=self.lr, checkpoint_activations=self.low_memory)  # fmt: skip

    def checked(self) -> PeerConfig:
        """This config, or a SwarmError naming the first option that is out of bounds."""
        check_swarm_name(self.swarm)
        if self.block != "auto" and not self.block.isdigit():
            raise SwarmError(f"--block must be 'auto' or a block index, not {self.block!r}")
        if self.announce_period <= 0 or self.save_every <= 0:
            raise SwarmError("--announce-period and --save-every must be positive")
        if self.average_every < 0:
            raise SwarmError("--average-every must be 0 (never) or a number of steps")
        if self.reachability not in REACHABILITY_CHOICES:
            raise SwarmError(
                f"--reachability must be one of {', '.join(REACHABILITY_CHOICES)}, not {self.reachability!r}"
            )
        checked_device(self.device)
        if (self.member_key is None) != (self.certificate is None):
            raise SwarmError("--member-key and --certificate go together: the key, and the certificate that names it")
        self._check_sync()
        return self

    def _check_sync(self) -> None:
        if self.sync not in MODES:
            raise SwarmError(f"--sync must be one of {', '.join(MODES)}, not {self.sync!r}")
        if MODES[self.sync].outer_rounds and self.save_every % self.outer.steps != 0:
            raise SwarmError("--save-every must be a multiple of --outer-steps: replicas hold the same weights "
                             "only at the end of an outer round")  # fmt: skip
        if not 1 <= self.overlap_steps <= MAX_STEPS_IN_FLIGHT:
            raise SwarmError(f"--overlap-steps must be from 1 to {MAX_STEPS_IN_FLIGHT}")
        if not 0 <= self.spare_batch_size <= self.batch_size:
            raise SwarmError("--spare-batch-size must be from 0 (wait idle) to --batch-size")
        if self.spare_batch_size and not MODES[self.sync].exchanges_payloads:
            raise SwarmError(f"--spare-batch-size needs a payload exchange: --sync {' or '.join(payload_modes())}")
