"""The training loop shared by a block, the end-to-end baseline and the autoregressive baseline.

A `Trainer` owns one module, its AdamW state and its own random stream, and `step()` runs
one update. `block_trainer(config, b, ...)` builds block b alone: its weights and optimizer
state are the only ones in memory, and no gradient from any other block can reach it.
The peer program takes the same steps one at a time, with its sync strategy's update in the
middle (`compute_gradients`, the update, `end_step`); `train()` runs plain AdamW steps for a set
number of steps with a progress bar. A replica whose update would otherwise sit waiting for the
other replicas can compute spare batches meanwhile (`spare_batch`): their gradients join the
next step's, which then averages over more windows.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from tqdm import tqdm

from swarm.errors import SwarmError
from swarm.model.autoregressive import ByteTransformer, next_byte_loss
from swarm.model.data import Windows
from swarm.model.denoiser import Denoiser, ModelConfig, build_block, build_end_to_end, set_activation_checkpointing
from swarm.model.families import family_of
from swarm.model.steps import LossFn

logger = logging.getLogger(__name__)


DENOISER_LR = 5e-4
# measured as below, on the autoregressive baseline: bits per byte 2.99/2.72/2.51 after
# 100/200/300 steps at 2e-3, 3.12 after 100 at 5e-4 (that run was stopped there)
AUTOREGRESSIVE_LR = 2e-3


def default_lr(kind: str) -> float:
    """The peak learning rate of a model kind ("autoregressive", or a denoiser: a block or end to end).

    Each kind has its own, the best of those measured for it: a denoiser learns from far fewer
    targets per step than the autoregressive model (only the hidden bytes of the span, against
    every byte of the window), so its gradients are noisier and it needs a smaller rate.
    Measured on 2 cores (the default config's last block, batch 32, 128 validation windows, its
    share of the bound in bits per byte after 100/200/300/400 steps): at 2e-3, the old shared
    rate, 1.14/1.14/1.15/1.14 and its loss rising again by step 500 (1.19 at 800: it never left
    the unigram level, the cause of the long run's bits per byte rising after ~400 steps); at
    1e-3, 1.13/1.10/1.09/0.98; at 5e-4, 1.14/1.03/0.95/0.90, and 0.82 at 800; at 2.5e-4,
    1.14/1.06/0.94/0.90 (no better). The autoregressive rate: see AUTOREGRESSIVE_LR's measurement.
    """
    return AUTOREGRESSIVE_LR if kind == "autoregressive" else DENOISER_LR


@dataclass
class TrainConfig:
    """Optimizer and schedule; the same budget (steps, batch) for blocks and baselines so that they
    compare, at each kind's own learning rate (`default_lr`)."""

    steps: int = 300  # length of the cosine schedule (training may go on at its floor)
    batch_size: int = 32
    lr: float = DENOISER_LR
    warmup_steps: int = 30
    min_lr_fraction: float = 0.1  # the schedule's floor, as a fraction of lr
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0
    # recompute each transformer layer's activations in the backward pass instead of keeping them:
    # less memory, more time, the same gradients (`set_activation_checkpointing`)
    checkpoint_activations: bool = False
    # each batch's noise levels spread evenly over the slice (masked.py `sample`): measured at equal CPU
    # time (benchmarks/lr_sweep.py), the built-in model's bits per byte 2.590 against 2.597 drawn independently
    stratified_noise: bool = True

    def lr_at(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        progress = min(1.0, (step - self.warmup_steps) / max(1, self.steps - self.warmup_steps))
        cosine = 0.5 * (1 + math.cos(math.pi * progress))
        return self.lr * (self.min_lr_fraction + (1 - self.min_lr_fraction) * cosine)


@dataclass(frozen=True)
class OpenStep:
    """A step whose gradients are computed (in the module's `.grad`) and whose update is still to
    come: its loss, and the clock at its start and where its compute began."""

    loss: torch.Tensor
    started: float
    computing: float


@dataclass
class Trainer:
    """One module, its optimizer and its data. `step()` is one plain AdamW update. A peer whose
    replicas sync takes the same step in three parts, so that no other room writes the trainer:
    `compute_gradients()`, then its sync strategy's update (which may call `optimizer_step()`),
    then `end_step()`, which lands a jump ahead that the update returned."""

    module: nn.Module
    loss_fn: LossFn
    windows: Windows
    config: TrainConfig
    step_count: int = 0
    losses: list[float] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    # seconds in forward, backward and update, in all (a sync update's waits on other replicas
    # included: the strategy knows those), and the clock at the first step's start and last step's end
    compute_seconds: float = 0.0
    first_step_at: float | None = None
    last_step_at: float | None = None
    # spare batches waiting for the next step: the sum of their gradients, each times its window
    # count, and the windows they hold
    spare_gradients: list[torch.Tensor] | None = None
    spare_windows: int = 0

    def __post_init__(self) -> None:
        self.optimizer = torch.optim.AdamW(
            self.module.parameters(), lr=self.config.lr, weight_decay=self.config.weight_decay
        )
        self.generator = torch.Generator().manual_seed(self.config.seed)  # CPU: the same draws on any device
        self.device = next(self.module.parameters()).device

    def step(self) -> float:
        """One step with the plain AdamW update; returns its loss."""
        open_step = self.compute_gradients()
        self.optimizer_step()
        return self.end_step(open_step)

    def compute_gradients(self) -> OpenStep:
        """This step's forward and backward pass at its learning rate: the gradients of one batch,
        with the spare batches taken since the last step averaged in, clipped, in `.grad`."""
        started = time.perf_counter()
        if self.first_step_at is None:
            self.first_step_at = started
        self._train_mode()
        for group in self.optimizer.param_groups:
            group["lr"] = self.config.lr_at(self.step_count)
        window = self.windows.sample(self.config.batch_size, self.generator).to(self.device)
        computing = time.perf_counter()
        loss = self.loss_fn(window, self.generator)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self._add_spare_gradients()
        nn.utils.clip_grad_norm_(self.module.parameters(), self.config.grad_clip)
        return OpenStep(loss, started, computing)

    def optimizer_step(self) -> None:
        """AdamW on the gradients computed: the update of a step (a sync strategy may take its own instead)."""
        self.optimizer.step()

    def end_step(self, open_step: OpenStep, continue_from: int | None = None) -> float:
        """Close a step after its update: count it, or continue from `continue_from` (the step a
        majority of the replicas is at, as the sync update found); record its loss and time."""
        self.last_step_at = time.perf_counter()
        self.compute_seconds += self.last_step_at - open_step.computing
        self.step_count = self.step_count + 1 if continue_from is None else continue_from
        self.losses.append(open_step.loss.item())
        self.step_seconds.append(time.perf_counter() - open_step.started)
        return self.losses[-1]

    def spare_batch(self, windows: int) -> int:
        """Compute the gradient of one more batch of `windows` windows for the next step (called
        while the update waits for other replicas: time that would otherwise be idle); returns
        the windows taken. The weights and this step's gradients are left as they are."""
        self._train_mode()
        params = trainable(self.module)
        window = self.windows.sample(windows, self.generator).to(self.device)
        grads = torch.autograd.grad(self.loss_fn(window, self.generator), params, allow_unused=True)
        if self.spare_gradients is None:
            self.spare_gradients = [torch.zeros_like(p) for p in params]
        for spare, grad in zip(self.spare_gradients, grads):
            if grad is not None:
                spare.add_(grad, alpha=windows)
        self.spare_windows += windows
        return windows

    def _train_mode(self) -> None:
        """The module in training mode, its layers keeping or recomputing their activations as the
        config says now (read at each pass, so that a benchmark can time both on one trainer)."""
        self.module.train()
        set_activation_checkpointing(self.module, self.config.checkpoint_activations)

    def _add_spare_gradients(self) -> None:
        """Make this step's gradient the mean over its batch and the spare batches taken since the last step."""
        if self.spare_gradients is None:
            return
        batch, total = self.config.batch_size, self.config.batch_size + self.spare_windows
        for param, spare in zip(trainable(self.module), self.spare_gradients):
            if param.grad is not None:
                param.grad.mul_(batch).add_(spare).div_(total)
        self.spare_gradients, self.spare_windows = None, 0

    def utilisation(self, waited: float) -> float | None:
        """Time computing (forward, backward, update less `waited`, what the update spent waiting
        on others) over wall time since the first step began; None before a step."""
        if self.first_step_at is None or self.last_step_at is None or self.last_step_at <= self.first_step_at:
            return None
        return min(1.0, max(0.0, (self.compute_seconds - waited) / (self.last_step_at - self.first_step_at)))


def trainable(module: nn.Module) -> list[nn.Parameter]:
    """The parameters a step trains, in a fixed order: what spare gradients and an averager of
    the block (swarm/sync/dense.py) hold a tensor for, one each."""
    return [p for p in module.parameters() if p.requires_grad]


def diffusion_loss_fn(denoiser: Denoiser, block: int | None, stratified: bool = False) -> LossFn:
    """The loss of one block on its widened slice of noise (of the end-to-end model on all of it), in its family."""
    return family_of(denoiser.config).training_loss(denoiser, block, stratified)


def checked_device(name: str) -> torch.device:
    """The torch device `name` (--device), or SwarmError (one line) if this machine has none such:
    a peer told to train on a GPU it lacks says so before it joins, not at its first step."""
    try:
        device = torch.device(name)
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as error:  # a bad name; torch built without it; no such device here
        raise SwarmError(f"--device {name}: not available here ({str(error).splitlines()[0]})") from None
    return device


def _built_on_cpu(build: Callable[[], nn.Module], seed: int, device: str) -> nn.Module:
    """A fresh module drawn on the CPU from `seed`, then moved to `device`: every replica starts
    from the same weights, whatever device it trains on (a GPU's random stream is another)."""
    torch.manual_seed(seed)
    with torch.device("cpu"):
        return build().to(device)


def block_trainer(
    config: ModelConfig, block: int, windows: Windows, train_config: TrainConfig, device: str = "cpu"
) -> Trainer:
    """A trainer that holds block `block` and nothing of any other block."""
    denoiser = _built_on_cpu(lambda: build_block(config, block), train_config.seed * 1000 + block, device)
    loss_fn = diffusion_loss_fn(denoiser, block, train_config.stratified_noise)
    return Trainer(denoiser, loss_fn, windows, _seeded(train_config, block))


def end_to_end_trainer(
    config: ModelConfig, windows: Windows, train_config: TrainConfig, device: str = "cpu"
) -> Trainer:
    denoiser = _built_on_cpu(lambda: build_end_to_end(config), train_config.seed, device)
    return Trainer(denoiser, diffusion_loss_fn(denoiser, None, train_config.stratified_noise), windows, train_config)


def autoregressive_trainer(
    config: ModelConfig, windows: Windows, train_config: TrainConfig, device: str = "cpu"
) -> Trainer:
    model = _built_on_cpu(lambda: ByteTransformer(config), train_config.seed, device)
    return Trainer(model, lambda window, _generator: next_byte_loss(model, window), windows, train_config)


def _seeded(train_config: TrainConfig, block: int) -> TrainConfig:
    """Each block draws its own data and noise, so blocks trained apart see different batches."""
    return TrainConfig(**{**train_config.__dict__, "seed": train_config.seed * 1000 + block})


def train(
    trainer: Trainer,
    steps: int,
    description: str = "training",
    on_step: Callable[[Trainer], None] | None = None,
) -> Trainer:
    """Run `steps` updates with a progress bar; `on_step` runs after each (evaluation, checkpoints)."""
    with tqdm(range(steps), desc=description, unit="step", mininterval=2.0) as bar:
        for _ in bar:
            loss = trainer.step()
            bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
            if on_step is not None:
                on_step(trainer)
    logger.info("%s: %d steps, last loss %.4f", description, trainer.step_count, trainer.losses[-1])
    return trainer
