"""Masked (absorbing-state) diffusion over bytes: the mask partition, the loss and the sampler.

The vocabulary is the 256 bytes plus MASK_ID. At noise level t in (0, 1] (the mask rate) each
target byte is hidden with probability t, independently. The training distribution of t is
uniform on (0, 1], cut into B slices of equal mass: block b owns t in [1 - (b+1)/B, 1 - b/B]
(`config.block_slice(b)`: t is its own mass fraction), so block 0 sees the most masked spans
and the last block the nearly clean ones.

Each slice is widened by `block_overlap` of mass on each side (0.05 by default, the gaussian
family's figure). Why about that much: the optimal prediction for a masked byte does not
depend on t at all (masking is independent of the text), so what a block really learns is
"spans with about a share t of bytes hidden", and a span's realised share scatters around t
by sqrt(t (1 - t) / G), about 0.06 to 0.09 at G = 32 in mid range. A block therefore already
meets spans from its neighbours' side of every edge; a widening of the same order makes its
own t-conditioning and its loss cover its edges as densely as its middle, while one much
wider would spend its budget on its neighbours' slices. Not measured here.

Generation starts with every target byte hidden. Block b takes K steps down its own (not
widened) slice: going from t to s, each hidden byte's value is drawn from the block's logits at
t with a temperature, and some of them are revealed; revealed bytes stay as they are. Which ones
is the sampler's `reveal` order (swarm/model/steps.py `Sampling`):
- "random", the ancestral step: each hidden byte with probability (t - s) / t, so that after the
  step a byte is still hidden with probability s, exactly the training marginal;
- "confident": as many as leave round(G s) hidden, the training path's count at s (`kept_hidden`),
  the ones whose drawn value the block gives the highest probability (the order of MaskGIT and
  of LLaDA's low-confidence remasking). The hidden share follows the training path; which bytes
  are hidden no longer does, and that is the point: a block's guess at a byte is best once the
  bytes it is surest of are shown. (Until stop 53 the count was round(hidden (t - s) / t) a step,
  which rounds to nothing at small steps: at 8 steps a block, G = 8 and B = 4 the first two
  blocks revealed nothing and the last wrote half the span at once.)
- "leftmost": the same number, the earliest hidden bytes of the span, so that a span is
  written from the prefix onwards (semi-autoregressive, as LLaDA's block-wise sampling is). Its
  reveals do not depend on what is drawn, so the likelihood of what it writes at temperature 1
  is exact (`MaskedFamily.leftmost_nll`): the model's bits per byte.
Whichever order, the path never leaves the noise levels the blocks were trained on, and the last
block's slice ends at t = 0, where every hidden byte is revealed. Every draw of a block comes
from a generator seeded with the seed it is given, and the confident ranking is made on the CPU
with ties broken by position, so a remote peer that receives the same (prefix, ids, schedule,
seed, sampling) writes the same bytes.
"""

from __future__ import annotations

import math
from itertools import pairwise

import torch
import torch.nn.functional as F

from swarm.model.denoiser import Denoiser, ModelConfig, over_prefix
from swarm.model.steps import BlockRunner, LossFn, Sampling, pick_bytes

SEED_BOUND = 2**62  # per-block seeds are drawn below this


def hide(
    target: torch.Tensor, t: torch.Tensor, draws: torch.Tensor, mask_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask): target units (N, G) with `mask_id` where draws (N, G, uniform) fall below t (N,)."""
    mask = draws < t[:, None]
    return target.masked_fill(mask, mask_id), mask


def at_least_one_hidden(draws: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Training draws (N, G) under which every window hides at least one unit: a window whose draws
    all fall at or above its t (N,) hides its unit of the smallest draw.

    Why: a window that hides nothing teaches nothing, yet costs a whole pass. In the lowest
    block's slice (t up to about 0.3, G = 8) that was a third of the batch. The sampler never asks a
    block with nothing hidden, so the loss is taken where it is used. Measured (a scratch A/B, the
    default config's last block, 1000 steps, 256 validation windows, its share of the exact bits per
    byte, two seeds): 0.6042 and 0.6021 as drawn, 0.5978 and 0.5980 with at least one hidden."""
    nothing = (draws >= t[:, None]).all(dim=1).nonzero().squeeze(1)
    forced = draws.clone()
    forced[nothing, draws[nothing].argmin(dim=1)] = 0.0  # below any t, which is above 0
    return forced


def masked_ce(
    denoiser: Denoiser, window: torch.Tensor, t: torch.Tensor, draws: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ce, mask): the denoiser's cross-entropy (N, G) at every hidden position (0 elsewhere)."""
    prefix, target = window[:, : denoiser.config.prefix_len], window[:, denoiser.config.prefix_len :]
    ids, mask = hide(target, t, draws, denoiser.config.mask_id)
    logits = denoiser(prefix, ids, t)
    ce = F.cross_entropy(logits.transpose(1, 2), target, reduction="none")
    return ce * mask, mask


def masked_loss(denoiser: Denoiser, window: torch.Tensor, t: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """The training loss: the mean over windows of each window's mean CE on its hidden bytes.

    Why not MDLM's 1/t weight (sum of CE over hidden bytes / (t G)): both have the same
    expectation at each t (E[hidden count] = t G), but the 1/t form makes a window at t = 0.01
    that happens to hide one byte weigh 3 times its share and, as t -> 0, without bound: its
    variance grows like 1 / (t G), and the lowest block's slice reaches t = 0. Dividing by the
    realised count keeps every term at most the largest CE. Windows with nothing hidden carry no
    information and are left out (training draws leave none: `at_least_one_hidden`). The bound
    (`MaskedFamily.block_elbo`) keeps the exact 1/t form, where a fixed grid and many windows tame it.
    """
    ce, mask = masked_ce(denoiser, window, t, draws)
    counts = mask.sum(dim=1)
    per_window = ce.sum(dim=1) / counts.clamp(min=1)
    return per_window.sum() / (counts > 0).sum().clamp(min=1)


@torch.no_grad()
def unmask_steps(
    denoiser: Denoiser, prefix: torch.Tensor, ids: torch.Tensor, ts: torch.Tensor, seed: int, sampling: Sampling
) -> tuple[torch.Tensor, torch.Tensor]:
    """One block's K steps along `ts` (K + 1 decreasing mask rates): what a peer runs.

    All draws (which bytes to reveal, and their values) come from a CPU generator seeded with
    `seed`, a fixed number of them per step that takes one, so the same inputs give the same bytes
    anywhere, whatever device the block is on. In confident and leftmost order a step whose count
    shows nothing in any row is skipped: no pass through the block, no draw (at G = 8, four blocks
    and 4 steps a block, half the steps). The steps run on the block's device, in its dtype;
    returns (ids, logits each newly revealed byte was drawn from, zeros where none was) on the
    device `ids` came on, the logits in the block's dtype. With the config's `prefix_cache` the
    prefix is encoded once for the K steps (`over_prefix`).
    """
    weight, home = next(denoiser.parameters()), ids.device
    generator = torch.Generator().manual_seed(seed)
    prefix, ids = prefix.to(weight.device), ids.to(weight.device)
    drawn_from = torch.zeros(*ids.shape, denoiser.config.vocab_size, device=weight.device, dtype=weight.dtype)
    step = over_prefix(denoiser, prefix, len(ts) - 1)
    for t, s in pairwise(ts):
        hidden = ids == denoiser.config.mask_id
        if sampling.reveal != "random":
            count = (hidden.sum(dim=1).cpu() - kept_hidden(float(s), ids.shape[1])).clamp(min=0)
            if not count.any():
                continue
        logits = step(ids, t.expand(len(ids)).to(weight.device))
        draws = torch.rand(ids.shape, generator=generator, device=generator.device)
        picked = pick_bytes(logits, sampling.temperature, generator)
        if sampling.reveal == "random":
            reveal = hidden & (draws < (t - s) / t).to(weight.device)
        else:
            priority = leftmost_priority(ids.shape[1]) if sampling.reveal == "leftmost" else confidence(logits, picked)
            reveal = first_in_order(hidden, priority, count)
        ids = torch.where(reveal, picked, ids)
        drawn_from = torch.where(reveal[..., None], logits, drawn_from)
    return ids.to(home), drawn_from.to(home)


def kept_hidden(s: float, units: int) -> int:
    """How many of a span's `units` a confident or leftmost step down to mask rate s leaves hidden:
    round(units s), the training path's count at s, whatever earlier steps rounded to."""
    return math.floor(s * units + 0.5)


def leftmost_priority(units: int) -> torch.Tensor:
    """The leftmost order's priority: the earliest position first (made on the CPU, where the ranking is)."""
    return -torch.arange(units, dtype=torch.float32, device="cpu")


def confidence(logits: torch.Tensor, picked: torch.Tensor) -> torch.Tensor:
    """The confident order's priority: the log-probability of each position's picked unit."""
    return logits.float().log_softmax(dim=-1).gather(-1, picked[..., None]).squeeze(-1)


def first_in_order(hidden: torch.Tensor, priority: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """A step's reveal mask: in each row, `count` (N,) of its hidden positions, those of the highest
    `priority` (N, G), or (G,) for every row alike.

    Ranked on the CPU in float32 with a stable sort (ties go to the earlier position), so a
    block on a GPU and a replica on a CPU reveal the same positions unless their numbers differ
    by more than rounding would change the order.
    """
    priority = priority.float().cpu().expand(hidden.shape).masked_fill(~hidden.cpu(), -torch.inf)
    rank = priority.argsort(dim=1, descending=True, stable=True).argsort(dim=1)
    return (hidden.cpu() & (rank < count[:, None])).to(hidden.device)


class MaskedFamily:
    """The masked family behind the interface of swarm/model/families.py."""

    name = "masked"

    def __init__(self, config: ModelConfig):
        self.config = config

    def sample(self, n: int, block: int | None, generator: torch.Generator, stratified: bool = False) -> torch.Tensor:
        """n training mask rates in (lo, hi] of a block's widened slice (of (0, 1] if block is None).

        `stratified`: one uniform draw u, and the rates at (u + i / n) mod 1 of the slice, a batch
        spread evenly over it (the low-discrepancy sampler of Kingma et al.'s VDM, used by MDLM): the
        same distribution for each rate, less variance in a batch's mean loss."""
        lo, hi = (0.0, 1.0) if block is None else self.config.block_slice(block, widened=True)
        if stratified:
            u = torch.rand(1, generator=generator, device=generator.device)
            spread = (u + torch.arange(n, device=generator.device) / n) % 1.0
        else:
            spread = torch.rand(n, generator=generator, device=generator.device)
        return hi - (hi - lo) * spread

    def grid(self, block: int, points: int) -> torch.Tensor:
        """Midpoints of `points` equal sub-slices of a block's own slice: a midpoint quadrature."""
        lo, hi = self.config.block_slice(block)
        return lo + (hi - lo) * (torch.arange(points, dtype=torch.float32) + 0.5) / points

    def schedule(self, block: int, steps: int) -> torch.Tensor:
        """K + 1 mask rates, evenly from the top of a block's slice to its bottom: K ancestral steps."""
        lo, hi = self.config.block_slice(block)
        return torch.linspace(hi, lo, steps + 1)

    def training_loss(self, denoiser: Denoiser, block: int | None, stratified: bool = False) -> LossFn:
        """The loss of one block on its widened slice of t (of the end-to-end model on all of it);
        `stratified` spreads each batch's rates evenly over the slice (`sample`)."""
        device = next(denoiser.parameters()).device

        def loss(window: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
            t = self.sample(len(window), block, generator, stratified)
            draws = torch.rand(len(window), self.config.gen_len, generator=generator, device=generator.device)
            return masked_loss(denoiser, window, t.to(device), at_least_one_hidden(draws, t).to(device))

        return loss

    @torch.no_grad()
    def _grid_ce(self, denoiser: Denoiser, block: int, windows: torch.Tensor, points: int, seed: int):
        """[(t, summed CE over hidden bytes, hidden count)] at each grid point of the block, fixed draws
        (drawn on the CPU, so that every device scores the same hidden bytes)."""
        device = next(denoiser.parameters()).device
        draws = torch.rand(len(windows), self.config.gen_len, generator=torch.Generator().manual_seed(seed))
        windows, draws, rows = windows.to(device), draws.to(device), []
        for t in self.grid(block, points).to(device):
            ce, mask = masked_ce(denoiser, windows, t.expand(len(windows)), draws)
            rows.append((float(t), float(ce.sum()), int(mask.sum())))
        return rows

    def block_loss(self, denoiser: Denoiser, block: int, windows: torch.Tensor, points: int, seed: int) -> float:
        """Cross-entropy on the hidden bytes (nats per byte), averaged over the block's grid of mask rates."""
        rows = self._grid_ce(denoiser, block, windows, points, seed)
        return sum(ce / max(1, count) for _, ce, count in rows) / len(rows)

    def block_elbo(self, denoiser: Denoiser, block: int, windows: torch.Tensor, points: int, seed: int) -> float:
        """Block `block`'s share of the variational bound on -log p(target), in nats per byte.

        For absorbing-state diffusion with mask rate t (MDLM, Sahoo et al.) the bound is
        integral over t in (0, 1] of E[sum of CE over the hidden bytes] / t dt, per byte / G;
        there is no prior term (at t = 1 every byte is hidden, as generation starts) and no
        reconstruction term (at t = 0 none is). Each block integrates over its own slice of t
        by the midpoint rule.
        """
        lo, hi = self.config.block_slice(block)
        per_byte = len(windows) * self.config.gen_len
        rows = self._grid_ce(denoiser, block, windows, points, seed)
        return (hi - lo) * sum(ce / (t * per_byte) for t, ce, _ in rows) / len(rows)

    def leftmost_plan(self, steps_per_block: int) -> list[tuple[int, torch.Tensor, int, int]]:
        """Where the leftmost sampler reveals each unit of a span that starts all hidden: a
        (block, t, first, stop) for each step that shows units [first, stop), drawn from the
        block's logits at mask rate t. Every span follows the same plan: leftmost reveals do not
        depend on what is drawn."""
        units = hidden = self.config.gen_len
        plan = []
        for block in range(self.config.n_blocks):
            for t, s in pairwise(self.schedule(block, steps_per_block)):
                kept = min(hidden, kept_hidden(float(s), units))
                if kept < hidden:
                    plan.append((block, t, units - hidden, units - kept))
                hidden = kept
        return plan

    @torch.no_grad()
    def leftmost_nll(self, denoiser: Denoiser, block: int, windows: torch.Tensor, steps_per_block: int) -> torch.Tensor:
        """Block `block`'s share of -log p(target) under the leftmost sampler at temperature 1, in
        nats, for each window (N,): the cross-entropy of each unit the block reveals, at the step that reveals
        it, with the units before it shown as they truly are.

        Exact, not a bound: that sampler's reveals do not depend on its draws, so the probability
        that it writes the target is the product of these terms over the blocks (units shown at
        one step are drawn independently). An arithmetic coder driven by the same steps would
        compress the text to this many nats.
        """
        device, config = next(denoiser.parameters()).device, self.config
        windows = windows.to(device)
        prefix, target = windows[:, : config.prefix_len], windows[:, config.prefix_len :]
        nats = torch.zeros(len(windows))
        for owner, t, first, stop in self.leftmost_plan(steps_per_block):
            if owner == block:
                ids = target.clone()
                ids[:, first:] = config.mask_id
                logits = denoiser(prefix, ids, t.expand(len(windows)).to(device))[:, first:stop]
                ce = F.cross_entropy(logits.float().transpose(1, 2), target[:, first:stop], reduction="none")
                nats += ce.sum(dim=1).cpu()
        return nats

    def run_steps(self, denoiser: Denoiser, prefix: torch.Tensor, ids: torch.Tensor, ts: torch.Tensor,
                  seed: int, sampling: Sampling) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        return unmask_steps(denoiser, prefix, ids, ts, seed, sampling)

    @torch.no_grad()
    def generate_span(self, run_block: BlockRunner, prefix: torch.Tensor, steps_per_block: int,
                      generator: torch.Generator,
                      sampling: Sampling = Sampling()) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """One pass through the B blocks: G bytes for each prefix (N, P), from all hidden to none.

        Returns (bytes, logits each byte was drawn from; zeros for a block whose runner returned
        none). Each block's seed is drawn here from
        `generator`, wherever the blocks run.
        """
        config = self.config
        ids = torch.full((len(prefix), config.gen_len), config.mask_id, dtype=torch.long)
        drawn_from = torch.zeros(len(prefix), config.gen_len, config.vocab_size)
        for block in range(config.n_blocks):
            seed = int(torch.randint(SEED_BOUND, (1,), generator=generator))
            new_ids, new_logits = run_block(block, prefix, ids, self.schedule(block, steps_per_block), seed, sampling)
            if new_logits is not None:  # a remote runner asks the last block's alone
                revealed = (ids == config.mask_id) & (new_ids != config.mask_id)
                drawn_from = torch.where(revealed[..., None], new_logits, drawn_from)
            ids = new_ids
        if (ids == config.mask_id).any():
            raise ValueError("the last block left units hidden")
        return ids, drawn_from

    def check_state(self, ids: torch.Tensor, n: int) -> None:
        """ValueError unless ids is a span state a peer may be asked to unmask."""
        shape = (n, self.config.gen_len)
        if ids.dtype != torch.int64 or ids.shape != shape:
            raise ValueError(f"ids must be int64 of shape {shape}")
        if ids.min() < 0 or ids.max() > self.config.mask_id:
            raise ValueError(f"ids must be units (0..{self.config.vocab_size - 1}) or the mask ({self.config.mask_id})")

    def check_answer(self, ids: torch.Tensor, ts: torch.Tensor, answer: torch.Tensor) -> None:
        """ValueError unless `answer` (a peer's reply to unmasking `ids` along `ts`) keeps every
        byte that was already revealed, and hides nothing when the schedule ends at t = 0."""
        revealed = ids != self.config.mask_id
        if not torch.equal(answer[revealed], ids[revealed]):
            raise ValueError("the answer rewrote bytes that were already revealed")
        if float(ts[-1]) == 0.0 and (answer == self.config.mask_id).any():
            raise ValueError("the answer left bytes hidden at the end of the last slice")

    def check_schedule(self, ts: torch.Tensor) -> None:
        if not torch.isfinite(ts).all() or ts[0] > 1 or (ts < 0).any() or (ts[1:] >= ts[:-1]).any():
            raise ValueError("mask rates must be finite, in [0, 1] and decreasing")
