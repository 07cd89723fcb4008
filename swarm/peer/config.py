"""What `swarm-peer` is told: `PeerConfig`, whose fields are the command line's options.

A field that is an option says so beside its default (`option(...)`, swarm/schema.py): its help
and its bounds or choices. swarm-peer's options, their environment variables, `checked()`'s
bounds and docs/peer-options.md are made from these fields and those of the sync settings'
own configs (`DeMoConfig`, `OuterConfig`), so each is written once, here or there. The sync
modes and their facts come from swarm/sync/modes.py. Hooks that only benchmarks hand a peer
(an extra service, a trace of the exchange) are not settings: see `PeerHooks` in life.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from swarm.errors import SwarmError
from swarm.model.train import DENOISER_LR, TrainConfig, checked_device
from swarm.p2p.network import NetworkOptions
from swarm.p2p.reachability import REACHABILITY_CHOICES
from swarm.p2p.records import check_swarm_name
from swarm.schema import check_options, option
from swarm.sync.decoupled_momentum import DeMoConfig
from swarm.sync.exchange import MAX_STEPS_IN_FLIGHT
from swarm.sync.modes import MODES, modes_help, payload_modes
from swarm.sync.pseudo_gradient import OuterConfig

PAYLOAD_MODES = ", ".join(payload_modes())


@dataclass
class PeerConfig:
    """Everything `swarm-peer` is told; the defaults suit the built-in demo on one machine. The fields
    are in the order of `swarm-peer --help`."""

    # the join line and a member's credentials: options every swarm command shares (swarm/cli/options.py)
    swarm: str = "demo"
    creator: str | None = None  # fingerprint of the swarm creator's key: the only model record believed
    member_key: str | None = None  # members-only swarms: the key file the certificate names (signs its records)
    # members-only swarms: the creator's certificate for that key (swarm-bootstrap invite)
    certificate: str | None = None
    record_key: str | None = field(default=None, metadata=option(  # None: a new key each run
        "RSA key file the peer signs its records with (made on first use). Where the swarm prices an identity, the "
        "solved work is kept beside it: with --identity, it is solved once, not every run."))
    block: str = field(default="auto", metadata=option("'auto' (the least hosted block) or an index."))
    checkpoint_dir: str = field(default="peer-checkpoints", metadata=option(
        "Folder of the block's checkpoints: it starts from its newest, and saves and serves them there."))
    data: str | None = field(default=None, metadata=option(
        "Text file, folder or dataset name (default: built-in corpus)."))
    # also the device of the sync's tensors and of the denoise service
    device: str = field(default="cpu", metadata=option(
        "Torch device to train and serve the block on: cpu, cuda, cuda:1, mps."))
    max_steps: int | None = field(default=None, metadata=option(
        "Stop training at this step, then keep serving until stopped: the step it started from plus the steps it "
        "trained (a jump to the other replicas' step never ends a run).", min=1))
    schedule_steps: int | None = field(default=None, metadata=option(
        "Steps the learning rate's warm-up and cosine decay span (default: --max-steps); past them it stays at its "
        "floor.", min=1))
    save_every: int = field(default=50, metadata=option(
        "Steps between two checkpoints (each is announced, and served to replicas and swarm-fetch).", min=1))
    announce_period: float = field(default=10.0, metadata=option(
        "Seconds between two of its records in the DHT (a record lives a few periods).", min=0.5))
    public_name: str = field(default="", metadata=option("A name others see in swarm-status."))
    batch_size: int = field(default=32, metadata=option("Windows of text per training step.", min=1))
    lr: float = field(default=DENOISER_LR, metadata=option(
        "Peak learning rate of the block's own optimizer.", min=0, min_open=True))
    low_memory: bool = field(default=False, metadata=option(
        "Use less memory for more time: each layer's activations are recomputed in the backward pass instead of "
        "kept (the same gradients), and freed tensors' memory goes back to the system at once (figures: "
        "benchmarks/README.md, 'Cost as a block grows')."))
    sync: str = field(default="demo", metadata=option(modes_help(), choices=lambda: tuple(MODES)))  # read when asked
    sync_deadline: float = field(default=5.0, metadata=option(
        "Seconds a step waits for the other replicas.", min=0.1))
    overlap_steps: int = field(default=1, metadata=option(
        "demo-overlap: apply each step's gathered set this many steps late (more time for the exchange, a staler "
        "update).", min=1, max=MAX_STEPS_IN_FLIGHT))
    spare_batch_size: int = field(default=0, metadata=option(
        f"{PAYLOAD_MODES}: while the other replicas' payloads are not all in, compute spare batches of this many "
        "windows instead of waiting; the next step averages them in (0: wait idle). At most --batch-size.", min=0))
    wait_for_replicas: int = field(default=1, metadata=option(
        "Start training once this many replicas of the block (itself included) are up; averaging groups hold up "
        "to this many.", min=1))
    average_every: int = field(default=100, metadata=option(  # reconcile.py
        "Every this many steps, replicas that may have drifted apart merge their checkpoints of that step into a "
        "coordinate-wise median weighted by the keys behind each (at least 3 keys, else nothing changes); 0: never.",
        min=0))
    de_mo: DeMoConfig = field(default_factory=DeMoConfig)  # the DeMo optimizer's settings (--sync demo, demo-overlap)
    outer: OuterConfig = field(default_factory=OuterConfig)  # the outer step's settings (--sync outer, outer-overlap)
    reachability: str = field(default="auto", metadata=option(
        "auto: ask the initial peers to dial back, and behind NAT (nobody can) be reached through their relays, in "
        "DHT client mode; direct or relayed: skip the check.", choices=REACHABILITY_CHOICES))
    expect_config_hash: str | None = field(default=None, metadata=option(  # a prefix of the hash will do
        "Refuse to join unless the swarm's model config hash starts with this (see swarm-status)."))
    join_timeout: float = 30.0
    network: NetworkOptions = field(default_factory=NetworkOptions)  # swarm/cli/options.py's options

    def train_config(self) -> TrainConfig:
        """The trainer's settings this peer was given (its schedule spans --schedule-steps, else
        --max-steps, else a long run; past its end the rate stays at the floor)."""
        return TrainConfig(steps=self.schedule_steps or self.max_steps or 100_000, batch_size=self.batch_size,
                           lr=self.lr, checkpoint_activations=self.low_memory)  # fmt: skip

    def checked(self) -> PeerConfig:
        """This config, or a SwarmError naming the first option that is out of bounds."""
        check_swarm_name(self.swarm)
        check_options(self)  # every option's bounds and choices, those of --help
        if self.block != "auto" and not self.block.isdigit():
            raise SwarmError(f"--block must be 'auto' or a block index, not {self.block!r}")
        checked_device(self.device)
        if (self.member_key is None) != (self.certificate is None):
            raise SwarmError("--member-key and --certificate go together: the key, and the certificate that names it")
        self._check_sync()
        return self

    def _check_sync(self) -> None:
        """What the sync options must be together (one option's own bounds are `check_options`')."""
        if MODES[self.sync].outer_rounds and self.save_every % self.outer.steps != 0:
            raise SwarmError("--save-every must be a multiple of --outer-steps: replicas hold the same weights "
                             "only at the end of an outer round")  # fmt: skip
        if not 0 <= self.spare_batch_size <= self.batch_size:
            raise SwarmError("--spare-batch-size must be from 0 (wait idle) to --batch-size")
        if self.spare_batch_size and not MODES[self.sync].exchanges_payloads:
            raise SwarmError(f"--spare-batch-size needs a payload exchange: --sync {' or '.join(payload_modes())}")
