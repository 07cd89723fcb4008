"""The spot check: a block's loss measured here, on windows and noise draws nobody else can know.

What a host announces about its checkpoint's quality is a claim; the spot check is the evidence.
A stranger that knows which windows are measured can tune a bad block to them (issue 46: a block
1 nat per byte worse on other text, fine-tuned on the 32 fixed validation windows of the old
check until it scored better than the honest one). So every `SpotCheck` draws its own:
- windows from both splits of the swarm's text, validation and train (`SOURCES`), at seeds drawn
  from the operating system's randomness (`secrets`) when it is made; and, with `--eval-text`,
  windows of a text of the user's own, which no host has ever seen;
- noise draws (each window's noise level, spread evenly over the block's training slice, and
  which units are masked or what Gaussian noise is added) from another private seed. The
  measure is the block's training objective on those windows (`Family.training_loss`), so it is
  comparable with the training loss hosts announce.
One `SpotCheck` measures every candidate of a choice with the same windows and draws (the
comparison is paired); an explicit `seed` makes it deterministic, for tests.

The figure it reports (`Losses.score`) is the *worst* of its sources' mean losses: a block tuned
on the validation split (all of it, now that it cannot know which windows) gains nothing where it
stays bad on the training split or on the user's text. A block much better on held-out text than
on the training text it was meant to learn from has seen the held-out text: `suspicion` names it.

How many windows (`SPOT_CHECK_WINDOWS`, per source): measured by benchmarks/spot_check_noise.py
on the built-in config (8192 BPE units; block 3, the least masked, trained 300 and 350 steps: two
checkpoints a save apart at the peer's default, early in training, where they differ most;
benchmarks/results/spot_check_noise/). Over 30 checks, each with its own private seeds, the
standard error of the score difference between the two was 0.042, 0.026, 0.016, 0.012 and 0.012
nats per unit at 32, 64, 128, 256 and 512 windows per source (0.014 and 0.015 for each source
alone at 256; the true difference was 0.046). At 256 it is an eighth of the tolerance (0.1), so an
honest checkpoint is not refused by chance beside another; past 256 it barely shrank in this
measurement (why is not known). `NOISE` (0.045, three standard errors
of one source) is how close two checkpoints must measure to "measure as well". One measurement at
256 windows per source took 1.1 s of one core there (1.9 s under heavier load from other runs).
"""

from __future__ import annotations

import hashlib
import logging
import math
import secrets
import time
from dataclasses import dataclass, field

import torch

from swarm.model.data import Corpus, Windows, load_corpus, load_text_units
from swarm.model.denoiser import Denoiser, ModelConfig
from swarm.model.families import family_of

logger = logging.getLogger(__name__)

SOURCES = ("validation", "train")  # the splits every spot check draws windows from
EVAL_TEXT = "eval-text"  # the source name of the user's own text
SPOT_CHECK_WINDOWS = 256  # per source: the standard error of a difference is then ~1/50 of the tolerance
BATCH = 64  # windows measured at once (bounded memory)
NOISE = 0.045  # nats per unit: two measured checkpoints closer than this "measure as well" (3 standard errors)
SUSPICION = 0.1  # nats per unit a block may score better on held-out text than on its training text


def private_seed() -> int:
    """A seed nobody else can know or compute: 63 bits from the operating system's randomness."""
    return secrets.randbits(63)


@dataclass(frozen=True)
class Losses:
    """A block's mean loss on each source of a spot check (nats per unit)."""

    by_source: dict[str, float]

    @property
    def score(self) -> float:
        """The worst source's loss (NaN if any is: a NaN must fail every comparison made with it)."""
        values = list(self.by_source.values())
        if not values:
            return float("nan")
        return float("nan") if any(math.isnan(v) for v in values) else max(values)


@dataclass
class SpotCheck:
    """Measures a block's loss on windows of each source, at private noise draws.

    Args:
        windows: source name -> (count, seq_len) windows; a tensor alone is one "validation" source.
        tolerance: nats per unit a kept candidate may lose to the best measured one.
        seed: of the noise draws; None (the default) draws a private one.
    """

    windows: dict[str, torch.Tensor] | torch.Tensor
    tolerance: float = 0.1
    seed: int | None = None
    seconds: float = 0.0  # time spent measuring, in all (the defence's cost)
    measured: int = field(default=0)  # blocks measured

    def __post_init__(self) -> None:
        if isinstance(self.windows, torch.Tensor):
            self.windows = {"validation": self.windows}
        if self.seed is None:
            self.seed = private_seed()

    @classmethod
    def from_source(cls, source: str | None, config: ModelConfig, seed: int | None = None,
                    eval_text: str | None = None) -> SpotCheck:  # fmt: skip
        """Private windows of a text source (None: the built-in corpus), the swarm's training text, and of
        `eval_text` (a file or folder of the user's own), if given."""
        extra = load_text_units(eval_text, config.units()) if eval_text is not None else None
        return cls.from_corpus(load_corpus(source), config, seed=seed, eval_text=extra)

    @classmethod
    def from_corpus(cls, corpus: Corpus, config: ModelConfig, count: int = SPOT_CHECK_WINDOWS, seed: int | None = None,
                    eval_text: torch.Tensor | None = None) -> SpotCheck:  # fmt: skip
        """`count` windows of each split of `corpus` (and of the units `eval_text`), drawn at private
        seeds, or at seeds derived from `seed` (tests)."""
        seeds = _seeds(seed)
        windows = {split: corpus.windows(split, config).fixed(count, seed=next(seeds)) for split in SOURCES}
        if eval_text is not None:
            windows[EVAL_TEXT] = Windows(eval_text, config.seq_len).fixed(count, seed=next(seeds))
        return cls(windows, seed=next(seeds))

    @torch.no_grad()
    def losses(self, denoiser: Denoiser, config: ModelConfig, block: int) -> Losses:
        """The block's mean training loss on each source's windows, at this check's noise draws."""
        started = time.perf_counter()
        was_training, family = denoiser.training, family_of(config)
        denoiser.eval()
        try:
            loss_fn = family.training_loss(denoiser, block, stratified=True)
            by_source = {name: float(_mean_loss(loss_fn, windows, self.seed + i)) for i, (name, windows) in
                         enumerate(sorted(self.windows.items()))}  # fmt: skip
        finally:
            denoiser.train(was_training)
        self.seconds += time.perf_counter() - started
        self.measured += 1
        return Losses(by_source)

    def objective(self, denoiser: Denoiser, config: ModelConfig, block: int) -> torch.Tensor:
        """The mean of the sources' losses as `losses` computes them (the same windows and draws), with
        gradients: what a stranger who knew this check's seeds would tune a block on (`tuned_to`)."""
        loss_fn = family_of(config).training_loss(denoiser, block, stratified=True)
        sources = sorted(self.windows.items())
        return sum(_mean_loss(loss_fn, windows, self.seed + i) for i, (_, windows) in enumerate(sources)) / len(sources)

    def measure(self, denoiser: Denoiser, config: ModelConfig, block: int) -> float:
        """The block's score: its worst source's loss (`Losses.score`)."""
        return self.losses(denoiser, config, block).score


def _seeds(seed: int | None):
    """Seeds for the windows of each source and for the noise: private, or derived from `seed`."""
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    while True:
        yield private_seed() if generator is None else int(torch.randint(0, 2**62, (1,), generator=generator))


def _mean_loss(loss_fn, windows: torch.Tensor, seed: int) -> torch.Tensor:
    """The mean over `windows` of the loss, a batch at a time, each batch's draws from its own seed."""
    total = torch.zeros(())
    for i, batch in enumerate(torch.split(windows, BATCH)):
        generator = torch.Generator().manual_seed((seed * 1_000_003 + i) % 2**63)
        total = total + loss_fn(batch, generator) * len(batch)
    return total / max(1, len(windows))


def suspicion(losses: Losses) -> str | None:
    """Why a block's losses look tuned to the check rather than learnt, or None: a block learns from
    the training split, so no honest one scores much better on held-out validation text than on it."""
    by_source = losses.by_source
    if "train" in by_source and "validation" in by_source:
        gap = by_source["train"] - by_source["validation"]
        if gap > SUSPICION:
            return f"it scores {gap:.3f} nats better on held-out text than on the training text"
    return None


def weights_hash(denoiser: Denoiser) -> str:
    """The sha256 of a block's decoded tensors (names, dtypes, shapes, values): one for checkpoints
    whose weights are bit for bit the same, whatever step or metadata their files carry."""
    digest = hashlib.sha256()
    for name, tensor in sorted(denoiser.state_dict().items()):
        tensor = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()
