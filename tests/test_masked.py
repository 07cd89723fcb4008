"""The masked family: equal slices of the mask rate, a sampler that stays on the training path
in every reveal order, seeded draws, and a bound whose ends are known exactly."""

import math

import msgpack
import pytest
import torch
from torch import nn

from swarm.model.denoiser import ModelConfig, build_block
from swarm.model.evaluate import elbo_bits_per_byte
from swarm.model.families import family_of, generate_span, local_runner
from swarm.model.masked import MaskedFamily, at_least_one_hidden, unmask_steps
from swarm.model.steps import REVEAL_ORDERS, Sampling
from swarm.p2p.messages import DenoiseRequest, MessageError

MASK_ID = 256  # the mask unit of the tests' byte models (ModelConfig.mask_id)


class Recorder(nn.Module):
    """A denoiser with fixed random logits that records, at each call, the level it is asked at
    and the share of the span still hidden."""

    def __init__(self, config, answer: torch.Tensor | None = None):
        super().__init__()
        self.config, self.answer, self.calls = config, answer, []
        self.weight = nn.Parameter(torch.zeros(1))  # a block computes where its weights are, in their dtype

    def forward(self, prefix, ids, t):
        self.calls.append((float(t[0]), float((ids == MASK_ID).float().mean())))
        if self.answer is None:
            return torch.zeros(len(ids), self.config.gen_len, 256)
        return nn.functional.one_hot(self.answer, 256).float().expand(len(ids), -1, -1) * 50.0


@pytest.fixture
def masked_config(tiny_config):
    return ModelConfig(**{**tiny_config.to_dict(), "family": "masked", "gen_len": 32, "n_blocks": 4, "n_layers": 4})


@pytest.mark.parametrize("n_blocks", [1, 2, 4])
def test_blocks_split_the_mask_rate_into_equal_slices_block_0_the_most_masked(n_blocks):
    config = ModelConfig(n_layers=4, n_blocks=n_blocks, family="masked")
    slices = [config.block_slice(b) for b in range(n_blocks)]
    assert slices[0][1] == 1.0 and slices[-1][0] == 0.0
    for lo, hi in slices:
        assert hi - lo == pytest.approx(1 / n_blocks)
    for upper, lower in zip(slices, slices[1:]):
        assert upper[0] == pytest.approx(lower[1])
    family = MaskedFamily(config)
    for block in range(n_blocks):  # training rates fall in the block's widened slice
        lo, hi = config.block_slice(block, widened=True)
        t = family.sample(2000, block, torch.Generator().manual_seed(block))
        assert lo <= float(t.min()) and float(t.max()) <= hi and hi - lo > 1 / n_blocks or n_blocks == 1


@pytest.mark.parametrize("reveal", REVEAL_ORDERS)
@pytest.mark.parametrize("gen_len, steps", [(32, 4), (8, 8)])
def test_the_sampler_path_stays_where_the_blocks_were_trained(masked_config, reveal, gen_len, steps):
    """Each block is asked only at mask rates of its own training slice, and the span it is given
    has about that share of its bytes hidden (within half a unit, and the random order's scatter):
    the training marginal, at every step, in every reveal order. Also with more steps a block than
    the span has units a block, where a per-step count rounded on its own reveals nothing (and
    confident and leftmost order skip the steps that show nothing)."""
    config = ModelConfig(**{**masked_config.to_dict(), "gen_len": gen_len})
    recorders = [Recorder(config) for _ in range(config.n_blocks)]
    prefix = torch.zeros(256, config.prefix_len, dtype=torch.long)
    generated, _ = generate_span(local_runner(lambda b: recorders[b], config), config, prefix, steps,
                                 torch.Generator().manual_seed(0), Sampling(1.0, reveal))  # fmt: skip
    assert not (generated == MASK_ID).any()
    revealing = [owner for owner, *_ in MaskedFamily(config).leftmost_plan(steps)]  # steps that show a unit
    for block, recorder in enumerate(recorders):
        lo, hi = config.block_slice(block, widened=True)
        # random order passes through the block at every step; the others skip a step that shows nothing
        assert len(recorder.calls) == (steps if reveal == "random" else revealing.count(block))
        for t, hidden_share in recorder.calls:
            assert lo <= t <= hi, (block, t)
            assert hidden_share == pytest.approx(t, abs=0.5 / gen_len + 0.015), (block, t, hidden_share)


def test_revealed_bytes_stay_and_the_oracle_answer_is_written(masked_config):
    answer = torch.randint(0, 256, (masked_config.gen_len,), generator=torch.Generator().manual_seed(3))
    oracles = [Recorder(masked_config, answer) for _ in range(masked_config.n_blocks)]
    prefix = torch.zeros(3, masked_config.prefix_len, dtype=torch.long)
    generated, drawn_from = generate_span(local_runner(lambda b: oracles[b], masked_config), masked_config, prefix, 2,
                                          torch.Generator().manual_seed(0))  # fmt: skip
    assert (generated == answer).all()
    assert (drawn_from.argmax(dim=-1) == answer).all()  # every byte has the logits it was drawn from


@pytest.mark.parametrize("reveal", REVEAL_ORDERS)
def test_the_same_seed_writes_the_same_bytes_and_temperature_varies_them(masked_config, reveal):
    torch.manual_seed(0)
    blocks = [build_block(masked_config, b).eval() for b in range(masked_config.n_blocks)]
    run_block = local_runner(lambda b: blocks[b], masked_config)
    prefix = torch.randint(0, 256, (4, masked_config.prefix_len))

    def run(seed: int, temperature: float) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed)
        return generate_span(run_block, masked_config, prefix, 2, generator, Sampling(temperature, reveal))[0]

    assert torch.equal(run(5, 1.0), run(5, 1.0))
    hot = torch.stack([run(seed, 5.0) for seed in range(3)])
    assert not (hot == hot[0]).all()


class Ranked(Recorder):
    """A denoiser sure of `answer` at every position, surer the later the position."""

    def forward(self, prefix, ids, t):
        self.calls.append((float(t[0]), float((ids == MASK_ID).float().mean())))
        sureness = torch.arange(1, self.config.gen_len + 1, dtype=torch.float32)[:, None] / self.config.gen_len
        return nn.functional.one_hot(self.answer, 256).float() * sureness * 4.0


def test_a_confident_step_reveals_the_bytes_the_block_is_surest_of_and_a_random_one_does_not(masked_config):
    """From all hidden, one step from t = 1 to s = 0.5 reveals half the span: under argmax draws and confident
    order exactly the later half (where this block is surest), under leftmost order the earlier
    half, under random order a draw."""
    g = masked_config.gen_len
    answer = torch.randint(0, 256, (g,), generator=torch.Generator().manual_seed(4))
    block, prefix = Ranked(masked_config, answer), torch.zeros(2, masked_config.prefix_len, dtype=torch.long)
    hidden, ts = torch.full((2, g), MASK_ID), torch.tensor([1.0, 0.5])
    shown = {reveal: unmask_steps(block, prefix, hidden, ts, 3, Sampling(temperature=0.0, reveal=reveal))[0] != MASK_ID
             for reveal in REVEAL_ORDERS}  # fmt: skip
    later_half = torch.arange(g) >= g // 2
    assert (shown["confident"] == later_half).all()
    assert (shown["leftmost"] == ~later_half).all()
    assert not (shown["random"] == later_half).all() and not (shown["random"] == ~later_half).all()


@pytest.mark.parametrize("bad", [dict(temperature=-1.0), dict(temperature=math.nan), dict(temperature=1e9),
                                 dict(reveal="loudest")])  # fmt: skip
def test_sampling_settings_out_of_bounds_are_refused_here_and_on_the_wire(bad):
    with pytest.raises(ValueError):
        Sampling(**bad)
    with pytest.raises(MessageError):
        DenoiseRequest.decode(msgpack.packb({"block": 0, "temperature": 0.0, "reveal": "confident", **bad}))


@pytest.mark.parametrize("family", ["masked", "gaussian"])
def test_the_bound_of_a_model_that_knows_the_answer_is_near_zero(family, tiny_config):
    """What is left is the gaussian prior term (|T[y]|^2 / 2 sigma_max^2, about 0.1 bit here)."""
    config = ModelConfig(**{**tiny_config.to_dict(), "family": family})
    windows = torch.randint(0, 256, (64, config.seq_len), generator=torch.Generator().manual_seed(1))  # one batch
    knower = Recorder(config, answer=None)
    knower.forward = lambda prefix, state, level: (
        nn.functional.one_hot(windows[:, config.prefix_len :], 256).float() * 60.0
    )
    assert elbo_bits_per_byte(lambda b: knower, config, windows)["overall"] < 0.2


def test_the_masked_bound_of_a_uniform_guess_is_eight_bits_per_byte(masked_config):
    """Uniform logits cost ln 256 at every hidden byte: the bound integrates to exactly 8 bits."""
    windows = torch.randint(0, 256, (1024, masked_config.seq_len), generator=torch.Generator().manual_seed(2))
    bound = elbo_bits_per_byte(lambda b: Recorder(masked_config), masked_config, windows)
    assert bound["overall"] == pytest.approx(8.0, rel=0.03)
    assert all(share == pytest.approx(2.0, rel=0.05) for share in bound["per_block"])
    assert math.isfinite(family_of(masked_config).block_loss(Recorder(masked_config), 0, windows, 3, 0))


def test_an_answer_that_rewrites_revealed_bytes_or_leaves_bytes_hidden_at_the_end_is_refused(masked_config):
    """What a client checks of a peer's reply, beyond its shape: revealed bytes stay as sent,
    and the last block's slice, which ends at t = 0, leaves nothing hidden."""
    family = MaskedFamily(masked_config)
    ids = torch.full((2, masked_config.gen_len), MASK_ID)
    ids[:, :4] = 65
    last = family.schedule(masked_config.n_blocks - 1, 2)
    honest = ids.masked_fill(ids == MASK_ID, 66)
    family.check_answer(ids, last, honest)
    rewritten = honest.clone()
    rewritten[0, 0] = 67
    with pytest.raises(ValueError, match="rewrote"):
        family.check_answer(ids, last, rewritten)
    with pytest.raises(ValueError, match="left bytes hidden"):
        family.check_answer(ids, last, ids)
    family.check_answer(ids, family.schedule(0, 2), ids)  # the first block may leave bytes hidden


def test_stratified_rates_spread_a_batch_evenly_over_the_slice_and_keep_each_rate_uniform(tiny_config):
    family = MaskedFamily(tiny_config)
    lo, hi = tiny_config.block_slice(1, widened=True)
    rates = family.sample(64, 1, torch.Generator().manual_seed(0), stratified=True)
    gaps = rates.sort().values.diff()
    assert torch.allclose(gaps, torch.full_like(gaps, (hi - lo) / 64), atol=1e-5)  # one rate in each 64th
    assert rates.min() > lo - 1e-6 and rates.max() <= hi + 1e-6
    firsts = torch.stack([family.sample(8, 1, torch.Generator().manual_seed(s), stratified=True)[0]
                          for s in range(4000)])
    assert abs(float(firsts.mean()) - (lo + hi) / 2) < 0.01 * (hi - lo) * 3  # each rate alone: uniform on the slice
    independent = family.sample(64, 1, torch.Generator().manual_seed(0))
    assert independent.sort().values.diff().std() > 3 * gaps.std()  # independent draws bunch up


def random_blocks(config: ModelConfig) -> list[nn.Module]:
    """Blocks with every weight drawn at random: unlike fresh ones (whose noise conditioning starts
    at zero), their logits depend on the mask rate they are asked at."""
    torch.manual_seed(0)
    blocks = [build_block(config, b).eval() for b in range(config.n_blocks)]
    for parameter in (p for block in blocks for p in block.parameters()):
        nn.init.normal_(parameter, std=0.3)
    return blocks


@pytest.mark.parametrize("steps", [1, 2, 8])
def test_the_leftmost_likelihood_is_the_probability_the_sampler_writes_the_span(masked_config, steps):
    """What the leftmost sampler writes at temperature 1, scored by `leftmost_nll` with the same
    steps, costs exactly the cross-entropy of the logits each unit was drawn from."""
    family, blocks = MaskedFamily(masked_config), random_blocks(masked_config)
    prefix = torch.randint(0, 256, (6, masked_config.prefix_len), generator=torch.Generator().manual_seed(1))
    written, drawn_from = generate_span(local_runner(lambda b: blocks[b], masked_config), masked_config, prefix,
                                        steps, torch.Generator().manual_seed(2), Sampling(1.0, "leftmost"))  # fmt: skip
    drawn_nats = nn.functional.cross_entropy(drawn_from.transpose(1, 2), written, reduction="none").sum(dim=1)
    windows = torch.cat([prefix, written], dim=1)
    scored = sum(family.leftmost_nll(blocks[b], b, windows, steps) for b in range(masked_config.n_blocks))
    assert torch.allclose(scored, drawn_nats, rtol=1e-5)


def test_the_leftmost_likelihood_sums_to_one_over_every_span(tiny_config):
    """An exact likelihood, not a bound: over all 65536 two-byte spans after one prefix, the
    probabilities it gives add up to 1 (a bound's would add up to less, a wrong step's to anything)."""
    config = ModelConfig(**{**tiny_config.to_dict(), "family": "masked", "gen_len": 2, "prefix_len": 4})
    family, blocks = MaskedFamily(config), random_blocks(config)
    spans = torch.cartesian_prod(torch.arange(256), torch.arange(256))
    windows = torch.cat([torch.tensor([[7, 8, 9, 10]]).expand(len(spans), -1), spans], dim=1)
    nats = sum(family.leftmost_nll(blocks[b], b, windows, 2) for b in range(config.n_blocks))
    assert float(torch.exp(-nats.double()).sum()) == pytest.approx(1.0, abs=1e-4)


def test_every_training_window_hides_at_least_one_unit_and_only_empty_ones_change():
    generator = torch.Generator().manual_seed(0)
    draws, t = torch.rand(64, 8, generator=generator), torch.rand(64, generator=generator) * 0.2
    forced = at_least_one_hidden(draws, t)
    hidden, was = forced < t[:, None], draws < t[:, None]
    assert hidden.any(dim=1).all() and not was.any(dim=1).all()  # some windows hid nothing before
    assert torch.equal(forced[was.any(dim=1)], draws[was.any(dim=1)])  # the others are as drawn
    empty = ~was.any(dim=1)
    assert torch.equal(hidden[empty].sum(dim=1), torch.ones(int(empty.sum()), dtype=torch.long))
    assert torch.equal(hidden[empty].int().argmax(dim=1), draws[empty].argmin(dim=1))  # the nearest to hiding


def test_the_lowest_block_learns_from_every_window_it_is_given(masked_config):
    """A one-window batch in the lowest block's slice, at many seeds: each one's loss is a real loss
    (with windows that hide nothing, a batch of one often scored 0 and taught nothing)."""
    config = ModelConfig(**{**masked_config.to_dict(), "gen_len": 4, "block_overlap": 0.0})
    block = config.n_blocks - 1
    denoiser = build_block(config, block)
    loss = MaskedFamily(config).training_loss(denoiser, block)
    window = torch.randint(0, 256, (1, config.seq_len), generator=torch.Generator().manual_seed(1))
    losses = [float(loss(window, torch.Generator().manual_seed(seed))) for seed in range(40)]
    assert min(losses) > 0
