"""One replica's DeMo update: momentum, the payload it shares, and the step on what it gathered.

Per parameter: m = beta * m + lr * grad; the top-k DCT coefficients of m per tile are taken
out of m (error feedback) and shared. The momentum is kept as its tiles' DCT coefficients (the
DCT is linear, so beta * M + lr * DCT(grad) is the DCT of the update): taking out what is sent
is zeroing it, with no inverse transform on the sending side. The replica then decodes the payloads of every replica
that arrived in time (its own included) and combines them coordinate by coordinate into what a
majority vouches for (`majority_mean`, evidence.py: their mean, clipped into the range a strict
majority of them spans, so a minority cannot push a coordinate past what an honest replica sent,
and wherever a majority moves it one way it goes that way). Each voter's update is scaled to an
RMS of 1 per parameter before (`unit_values`), so a payload's values, however large, weigh one
voice. Each parameter's combined update is scaled to an RMS of 1 again, but by at most
1 / `STEP_RMS_FLOOR` (4x), and the step is p -= rate * (update + weight_decay * p), the rate
following the trainer's schedule (peak `step_lr`). The step keeps the shape of the update. The
floor bounds what a sender can gain by making the combined update small on most of a parameter
and leaving it on a tile it picks (of two senders, agreeing with us on one tile alone): that
tile's coordinates move at most 4x as far as the combined update (itself bounded by what honest
replicas sent) says. Two independent unit updates' agreeing minimum has an RMS of about 0.43,
and honest replicas agree more, so the floor does not bind them.

Why not DeMo's own sign step (p -= lr * sign of the combined update, as the paper does, and as
this module did until issue 47): on the token model (8192-token vocabulary, a one-layer block)
the sign step stalls at the loss of the token frequencies, about 7.15 nats, where AdamW goes on
down: every coordinate moves by the full rate every step, the tiny ones that the top-k's inverse
spreads over a whole tile as much as those the gradient asks for. Measured in one process (one
replica, batch 128, block 1 of benchmarks/sync.py's small model, validation loss after 300 /
600 steps): AdamW 6.975 / 6.647; sign step 7.161 at 300 (no better with momentum decay 0.9 or
0.99, with the embeddings or the norms and biases left to AdamW, or with every coefficient sent);
this step at a peak rate of 2x the denoiser's AdamW rate, 7.058 / 6.638.

Where the others' payloads disagree with each other, a third decides; so a payload that a
strict majority of the others contradict on the sign of the DCT coefficients they both sent
(an update negated or sent against its own direction) leaves the vote
(`DeMoOptimizer.trusted`: judged on the counts of the last ~10 steps), and the honest ones'
disagreements are settled between them. Replicas that gathered the same sets compute the same update.
This replica's own payload is judged as the others' are, and a vote of three or more that keeps
no more than `kept_at` of its own update (of its sizes, or in its direction) is set aside for its
own update alone (evidence.py `keeps_own`): in an open swarm two free keys are a majority beside a
lone replica, and payloads that decode to nothing, or its own negated, froze or reversed it (issue 57).

Two senders (a block with two replicas, or one replica and a stranger) cannot outvote each
other, so the rule there is unanimity, by the smaller of the two (`agreeing_minimum`), and the
evidence decides whether the other counts
(issue 26, item 4). A coordinate moves only where both agree, so the other can never
move a weight in a direction this replica's own update does not (where this replica is silent
the other is too, by the rule), and the two compute the same step. Once the record shows the
other contradicting (the same test as above: `min_shared` coefficients shared, at most
`contradicted_at` of them agreed), it leaves the vote and this replica steps on its own update
alone: a negated stranger cannot freeze it. A stranger that shares no nonzero coefficient with
us (all-zero values, no parameter at all) never fills that record, yet under unanimity it would
stop every coordinate; so a second record, the one outer steps of two keep (evidence.py,
`kept_share`), counts the share of the larger of the two updates (sizes summed) that their
agreeing minimum keeps, and once its mean over the steps remembered (`kept_decay`) is at most
`kept_at` the other leaves as well. What a stranger that knows both can still do is slow it: a
payload whose coefficients avoid ours decodes to an update orthogonal to ours, whose agreeing
minimum with ours keeps about 0.29 of it by size (the floor then scales the step back up, by at
most 4x). Two honest replicas share coefficients and agree on 70% or more of them (`trusted`),
and their steps keep more of the larger update (`kept_at` is 0.1), so they keep each other and
stay identical.

Payloads cross the network as bytes (`encode_payload` / `decode_payload`); a payload that does
not fit this replica's parameters, or holds NaN, Inf, out-of-range or repeated indices or values larger
than honest ones can be (`max_value_per_lr` learning rates; honest coefficients of
lr * momentum stay near 1e-7..1e-5 at lr 2e-3 once training settles), is refused with
PayloadError and not applied. A payload decoded from bytes lands on its replica's device.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from swarm.model.train import DENOISER_LR
from swarm.schema import option
from swarm.sync.compression import (
    Compressed,
    PayloadError,
    add_tiles_,
    batches,
    check_fully_read,
    idct_of_kept,
    index_bits,
    keep_per_tile,
    pack_message,
    read_bits,
    shares_transform,
    take_top_k,
    tile_coefficients,
    tiling,
    to_bits,
    unpack_message,
    working_dtype,
)
from swarm.sync.evidence import Evidence, Record, agreeing_minimum, kept_of_own, kept_share, majority_mean

Payload = dict[str, Compressed]
DECODE_CHUNK = 1 << 20  # values of all voters' decoded tiles combined at a time (`_majorities`): 4 MB in float32,
# and a few times that while `majority_mean` sorts them
STEP_RMS_FLOOR = 0.25  # a parameter's combined update is scaled up at most 1 / this (module docstring)


@dataclass
class DeMoConfig:
    """DeMo settings; the defaults follow the study in DESIGN.md (top-k 8, bfloat16). The step's
    peak rate is twice the denoiser's AdamW rate (swarm/model/train.py's DENOISER_LR): measured
    in the module docstring's setting, 600 steps, one replica: 6.638 against 6.742 at 1x."""

    # the fields with an `option` are swarm-peer's options of that name (swarm/schema.py)
    # coefficients kept per 64 x 64 tile (scaled with the tile's size)
    top_k: int = field(default=8, metadata=option("DeMo: kept per 64x64 tile.", min=1))
    value_bits: int = field(default=16, metadata=option("DeMo: bfloat16 values or 1-bit signs.", choices=(16, 1)))
    # not the paper's 0.999: docs/decisions.md, "Momentum decay 0.95"
    momentum_decay: float = field(default=0.95, metadata=option(
        "DeMo: how much of its local momentum a replica keeps each step.", min=0, max=1, max_open=True))
    step_lr: float = field(default=2 * DENOISER_LR, metadata=option(
        "DeMo: the step's peak rate (the RMS of each parameter's step; it follows the --lr schedule).",
        name="--demo-lr", min=0, min_open=True))
    weight_decay: float = 0.01
    # the largest coefficient accepted, in units of the peak learning rate: a step adds at most
    # lr x (clipped gradient norm 1) to a coefficient, and top-k takes out the large ones every step
    # (seen here: up to 1.3 lr early in training for a tiny block, 0.23 lr for the default one)
    max_value_per_lr: float = 10.0
    # a payload leaves the vote when a strict majority of the others contradict it: share at
    # least `min_shared` sent coefficients with it and agree on the sign of at most this fraction
    min_shared: int = 8
    contradicted_at: float = 0.5
    evidence_decay: float = 0.9  # each step the counts of the steps before weigh this much less (~10 steps remembered)
    # of two senders, the other also leaves when the step keeps at most this share of the larger
    # of the two updates (sizes summed), on the mean of the steps remembered (`kept_share`)
    kept_at: float = 0.1
    kept_decay: float = 0.5  # each step the shares of the steps before weigh this much less


class DeMoOptimizer:
    """One replica's DeMo optimizer (it takes the place of AdamW): a momentum buffer per parameter,
    the payload made from it, the step on the gathered ones, and the evidence on who votes."""

    def __init__(self, module: nn.Module, config: DeMoConfig, lr: float):
        """`lr`: the peak learning rate the momentum is scaled with (it bounds honest values)."""
        self.config = config
        self.peak_lr = lr
        self.rate = config.step_lr  # the step's rate: `step_lr` times the schedule's share of the peak now
        self.max_value = config.max_value_per_lr * lr
        self.params = dict(module.named_parameters())
        self.names = list(self.params)  # a parameter's position is its name on the wire
        # per pair of senders: coefficients they agreed on and shared, decayed (see `trusted`)
        self.evidence = Evidence(config.min_shared, config.contradicted_at, config.evidence_decay)
        # of two senders: the share of the larger update the step keeps (`kept_share`), one step is evidence enough
        self.kept = Evidence(1.0, config.kept_at, config.kept_decay)
        self.tiles = {name: tiling(p.shape) for name, p in self.params.items()}  # (number of tiles, tile shape)
        # each parameter's momentum as its tiles' DCT coefficients (n_tiles, rows * cols)
        self.momentum = {name: torch.zeros(n_tiles, math.prod(tile), dtype=working_dtype(self.params[name].dtype),
                                           device=self.params[name].device)
                         for name, (n_tiles, tile) in self.tiles.items()}  # fmt: skip
        # where each tile of a parameter starts among all of the block's values, as laid out for `trusted`
        self.tile_starts, start = {}, 0
        for name, param in self.params.items():
            n_tiles, tile = self.tiles[name]
            self.tile_starts[name] = (start + math.prod(tile) * torch.arange(n_tiles, device=param.device))[:, None]
            start += param.numel()

    @torch.no_grad()
    def make_payload(self, lr: float) -> Payload:
        """Fold this step's gradients, at the schedule's `lr` of this step, into the momentum and
        take out what is shared; the steps from now on follow the schedule there."""
        self.rate = self.config.step_lr * lr / self.peak_lr
        payload = {}
        for position, (name, param) in enumerate(self.params.items()):
            if param.grad is not None:
                momentum = self.momentum[name].mul_(self.config.momentum_decay)
                momentum.add_(tile_coefficients(param.grad), alpha=lr)
                sent = take_top_k(momentum, param.shape, self.config.top_k, self.config.value_bits)
                payload[name] = dataclasses.replace(sent, position=position)
        return payload

    @torch.no_grad()
    def apply(self, gathered: Sequence[tuple[str, Payload]], own: str) -> list[str]:
        """The step on what the gathered (sender, payload) pairs that count vouch for (`step`);
        `own` is this replica's sender name. Returns the senders that voted. Where nothing has to
        be judged on the whole step first, each group of parameters is stepped as soon as its
        direction is known (at 60 M parameters, 240 MB the allocator would hand out and take back
        every step); a vote of two senders, or of three or more, own's among them, is judged
        whole (`_directions`)."""
        voters, directions = self._directions(gathered, own)
        self._take(directions)
        return voters

    @torch.no_grad()
    def apply_alone(self, payload: Payload) -> None:
        """The step this replica's own payload alone vouches for, as `apply` would take it were it
        the only voter, and no record touched: demo-overlap's step ahead of its late set (overlap.py)."""
        self._take(self._scaled(self._majorities([payload])))

    def _take(self, directions: Iterable[tuple[str, torch.Tensor]]) -> None:
        for name, tiles in directions:
            param = self.params[name]
            param.mul_(1 - self.rate * self.config.weight_decay)
            add_tiles_(param, tiles, -self.rate)

    @torch.no_grad()
    def step(self, gathered: Sequence[tuple[str, Payload]], own: str) -> tuple[list[str], dict[str, torch.Tensor]]:
        """The senders that vote and, per parameter any of them sent, the direction of this step as
        its tiles (n_tiles, *tile), of RMS 1 at most (module docstring): what a majority of
        the pairs that the evidence does not rule out (`trusted`) vouches for (`majority_mean`), or
        of two senders their agreeing minimum. Keeps the records, as `apply` does."""
        voters, directions = self._directions(gathered, own)
        return voters, dict(directions)

    def _directions(
        self, gathered: Sequence[tuple[str, Payload]], own: str
    ) -> tuple[list[str], Iterator[tuple[str, torch.Tensor]]]:
        """`step`'s voters, with the records kept now, and its directions as they are computed,
        parameter by parameter. Of two senders that the signs of their coefficients leave
        together, the step's kept share is judged too (`_kept_two`), so both updates are decoded
        before either counts (twice the block's size in memory); of three or more, own's among
        them, the vote and own's update alone are both computed whole before either is taken
        (`keeps_own`: twice the block's size too); otherwise each group of parameters is
        combined as it is decoded."""
        kept, self.evidence.record = self.trusted(gathered, own)
        voters = [gathered[i][1] for i in kept]
        mine = [i for i, (sender, _) in enumerate(gathered) if sender == own]
        if len(gathered) == 2 and len(kept) == 2:  # neither of two moves a coordinate the other does not
            decoded = list(self._decoded(voters))
            kept = self._kept_two(gathered, decoded, own)
            combined: Iterable[tuple[list[str], torch.Tensor]] = (
                (names, agreeing_minimum(group) if len(kept) == 2 else group[kept[0]]) for names, group in decoded
            )
        elif len(gathered) > 2 and mine:  # the vote must keep some of own's (evidence.py `keeps_own`)
            combined = list(self._majorities(voters))
            alone = list(self._majorities([gathered[mine[0]][1]]))
            keeps, self.kept.record = self.kept.keeps_own(own, kept_of_own(self._by_name(combined),
                                                                           self._by_name(alone)))  # fmt: skip
            if not keeps:
                kept, combined = mine, alone
        else:
            combined = self._majorities(voters)
        return [gathered[i][0] for i in kept], self._scaled(combined)

    def _by_name(self, combined: list[tuple[list[str], torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Groups of combined tiles (`_majorities`) as each parameter's tiles, by name (views, no copy)."""
        return {name: tiles for names, group in combined
                for name, tiles in zip(names, group.split([self.tiles[name][0] for name in names]))}  # fmt: skip

    def _scaled(self, combined: Iterable[tuple[list[str], torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """Each parameter's combined update, (n_tiles, *tile), scaled to an RMS of 1, up by at most
        1 / STEP_RMS_FLOOR (module docstring)."""
        for batch_names, majority in combined:
            for name, tiles in zip(batch_names, majority.split([self.tiles[name][0] for name in batch_names])):
                rms = torch.linalg.vector_norm(tiles) / math.sqrt(tiles.numel())
                yield name, tiles.div_(rms.clamp_min_(STEP_RMS_FLOOR))

    def _majorities(self, voters: list[Payload]) -> Iterator[tuple[list[str], torch.Tensor]]:
        """Per group of parameters decoded together (`_sent`), their names and what a majority of
        the voters vouches for (`majority_mean`), (tiles, *tile). Decoded DECODE_CHUNK values at a
        time, so that the voters' decoded tiles are combined while they are still in the cache
        instead of written out whole and read back (a tile's result does not depend on its chunk)."""
        for names, tile, indices, values in self._sent(voters):
            majority = torch.empty(indices.shape[1], *tile, dtype=values.dtype, device=values.device)
            chunk = max(1, DECODE_CHUNK // (len(voters) * math.prod(tile)))
            decoded = torch.empty(len(voters) * min(chunk, indices.shape[1]), *tile, dtype=values.dtype,
                                  device=values.device)  # fmt: skip (one buffer for every chunk)
            for start in range(0, indices.shape[1], chunk):
                end = min(start + chunk, indices.shape[1])
                if len(voters) == 1:  # its own majority: decoded where the majority goes (demo-overlap's step ahead)
                    decoded_updates(indices[:, start:end], values[:, start:end], tile, majority[start:end])
                    continue
                into = decoded[: len(voters) * (end - start)]
                majority[start:end] = majority_mean(
                    list(decoded_updates(indices[:, start:end], values[:, start:end], tile, into))
                )
            yield names, majority

    def _decoded(self, voters: list[Payload]) -> Iterator[tuple[list[str], torch.Tensor]]:
        """Per group of parameters decoded together (`_sent`), their names and each voter's decoded
        update, (voters, tiles, *tile), whole."""
        for names, tile, indices, values in self._sent(voters):
            yield names, decoded_updates(indices, values, tile)

    def _sent(self, voters: list[Payload]) -> Iterator[tuple[list[str], tuple[int, int], torch.Tensor, torch.Tensor]]:
        """Per group of parameters of one tile shape (`batches`: at most BATCH_ELEMENTS values of
        the block, so a group's majority stays small), their names, the tile, and every voter's
        indices and values, (voters, tiles, k), one parameter after the other; a voter that sent
        nothing for a parameter counts as no coefficient there (it votes 0). Each voter's values
        of a parameter are scaled so that its decoded update has an RMS of 1 (`unit_values`):
        every voter weighs the same, however large its momentum (a replica that joined late
        sends smaller values than one that has trained for a while)."""
        names = [name for name in self.names if any(name in p for p in voters)]
        for batch in batches(
            [self._transform_key(name) for name in names], [self.params[name].numel() for name in names]
        ):
            batch_names = [names[i] for i in batch]
            sent = [[p[name] if name in p else self._silent(name) for name in batch_names] for p in voters]
            dtype = working_dtype(functools.reduce(torch.promote_types, (c.values.dtype for row in sent for c in row)))
            indices = torch.stack([torch.cat([c.indices for c in row]) for row in sent])
            values = torch.stack([torch.cat([unit_values(c, dtype) for c in row]) for row in sent])
            yield batch_names, sent[0][0].tile, indices, values

    def _kept_two(self, gathered: Sequence[tuple[str, Payload]], decoded: list[tuple[list[str], torch.Tensor]],
                  own: str) -> list[int]:  # fmt: skip
        """Of two senders, both voting (`decoded`, from `_decoded`): both positions, or `own`'s alone
        once the record of the share of the larger update that their agreeing minimum keeps
        (`kept_share`, sizes summed over every coordinate) is at most `kept_at` on the mean of
        the steps remembered. A stranger whose payload keeps
        nothing of this replica's update (all-zero values, or no parameter) would freeze it under
        unanimity, and shares no nonzero coefficient with it for the sign record to count."""
        first, second = ({group: v[i] for group, (_, v) in enumerate(decoded)} for i in (0, 1))
        kept, self.kept.record = self.kept.judged([sender for sender, _ in gathered],
                                                  lambda i, j: kept_share(first, second), own)  # fmt: skip
        return kept

    def _transform_key(self, name: str) -> Hashable:
        """The parameters whose entries are decoded in one inverse share this (`batches`)."""
        n_tiles, tile = self.tiles[name]
        k = keep_per_tile(self.config.top_k, math.prod(tile))
        return (tile, self.params[name].device) if shares_transform(n_tiles, tile, k) else name

    def _silent(self, name: str) -> Compressed:
        """What a voter that sent nothing for a parameter counts as: no coefficient (it decodes to 0)."""
        param, (n_tiles, tile) = self.params[name], self.tiles[name]
        k = keep_per_tile(self.config.top_k, math.prod(tile))
        zeros = torch.zeros(n_tiles, k, dtype=torch.int64, device=param.device)
        return Compressed(param.shape, tile, zeros, torch.zeros(n_tiles, k, dtype=param.dtype, device=param.device))

    def trusted(self, gathered: Sequence[tuple[str, Payload]], own: str) -> tuple[list[int], Record]:
        """The positions of the (sender, payload) pairs that vote, and the record with this step's
        counts in (`apply` keeps it; this leaves the replica as it was): `Evidence.judged` keeps
        every sender but those a strict majority of the others contradict, and of two senders a
        contradicting pair leaves `own` alone (the module docstring). Two payloads are compared
        on the DCT coefficients both of them sent (same parameter, tile and index): honest
        replicas' momenta share the gradient's large components, so where both picked one they
        agree on its sign (seen: 90-100% of shared coefficients early in training, ~70% or more
        later), while a payload negated, flipped to the largest values, or with random signs
        agrees on 0-30% (50% for random). Two payloads of one step rarely share many coefficients
        (a hostile replica beside two honest ones, in benchmarks/attacks.py: often under 8), so
        the counts of every pair of senders are kept over the steps (`evidence.record`: agreed
        and shared, times `evidence_decay` per step): sender j contradicts i when, so counted,
        they share at least `min_shared` coefficients and agree on at most `contradicted_at` of
        them. The record follows from the sets applied alone, so replicas that applied the same
        sets keep the same voters; those that did not (a late joiner starts with none) may
        differ, and the voters are in the fingerprint of what a replica applied (exchange.py),
        so the others notice and average parameters."""
        sent = [self._sent_coefficients(payload) for _, payload in gathered] if len(gathered) > 1 else []

        def compare(i: int, j: int) -> tuple[float, float]:
            return _agreed_and_shared(sent[i], sent[j])

        return self.evidence.judged([sender for sender, _ in gathered], compare, own)

    def _sent_coefficients(self, payload: Payload) -> tuple[torch.Tensor, torch.Tensor]:
        """Where each DCT coefficient a payload sent lies among all of the block's (the parameter's
        offset, then its tile's, then the index in the tile), ascending, and its sign; only the
        nonzero ones: a payload sends about one coefficient in 512, so two are compared on what
        they sent, not over every parameter."""
        names = [name for name in self.names if name in payload]
        if not names:
            return torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int8)
        places = torch.cat([(payload[name].indices + self.tile_starts[name]).flatten() for name in names])
        signs = torch.cat([payload[name].values.flatten() for name in names]).float().sign().to(torch.int8)
        if not bool((places[1:] > places[:-1]).all()):  # they are where indices are (decode checks, _top_k sorts)
            places, order = places.sort()
            signs = signs[order]
        return places[signs != 0], signs[signs != 0]


def unit_values(sent: Compressed, dtype: torch.dtype) -> torch.Tensor:
    """`sent`'s values in `dtype`, scaled so that the update they decode to has an RMS of 1 (all
    zero: left as they are). The DCT is orthonormal, so the decoded update's sum of squares is
    the values' own: no inverse is needed to know it. Computed in float64, whose range holds the
    squares of the smallest values a payload may carry (a float32 square of 1e-20 is 0)."""
    values = sent.values.to(torch.float64)
    rms = (values.pow(2).sum() / math.prod(sent.shape)).sqrt_().clamp_min_(torch.finfo(torch.float64).tiny)
    return (values / rms).to(dtype)


def decoded_updates(
    indices: torch.Tensor, values: torch.Tensor, tile: tuple[int, int], out: torch.Tensor | None = None
) -> torch.Tensor:
    """Each voter's decoded update: from indices and values (voters, tiles, k) of one tile shape,
    (voters, tiles, *tile), in one inverse (`idct_of_kept`), into `out` (voters x tiles, *tile) if given."""
    voters, tiles, k = indices.shape
    return idct_of_kept(indices.reshape(-1, k), values.reshape(-1, k), tile, out).view(voters, tiles, *tile)


def _agreed_and_shared(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> tuple[int, int]:
    """Of the nonzero coefficients two payloads sent (`_sent_coefficients`), how many both sent
    and, of those, how many with the same sign."""
    (places_a, signs_a), (places_b, signs_b) = a, b
    if not len(places_a) or not len(places_b):
        return 0, 0
    at = torch.searchsorted(places_b, places_a).clamp_(max=len(places_b) - 1)
    shared = places_b[at] == places_a
    return int((shared & (signs_b[at] == signs_a)).sum()), int(shared.sum())


def encode_payload(payload: Payload, value_bits: int) -> bytes:
    """The wire form: which parameters (by position) are present, then one bit stream holding,
    parameter after parameter, the indices at ceil(log2(tile)) bits and the values (bfloat16
    words, or sign bits followed by one empty-tile flag per tile). Both sides know the shapes.
    The entries of one tile shape are turned into bits together, then cut apart."""
    entries = list(payload.values())
    streams: list[list[np.ndarray]] = [[] for _ in entries]
    for group in batches([(c.tile, c.indices.shape[1], c.values.dtype) for c in entries]):
        members = [entries[i] for i in group]
        bits = index_bits(math.prod(members[0].tile))
        indices = to_bits(torch.cat([c.indices for c in members]), bits)
        index_parts = np.split(indices, np.cumsum([c.indices.numel() * bits for c in members])[:-1])
        for i, index_part, value_part in zip(group, index_parts, _value_bits_of(members, value_bits)):
            streams[i] = [index_part, value_part]
    return pack_message({"v": value_bits, "p": [c.position for c in entries]}, [s for pair in streams for s in pair])


def decode_payload(data: bytes, optimizer: DeMoOptimizer) -> Payload:
    """A payload from another replica, checked against `optimizer`'s parameters; PayloadError if
    bad. The entries of one tile shape are read and checked together."""
    (value_bits, present), bit_array = unpack_message(data, ("v", "p"))
    if value_bits != optimizer.config.value_bits or not isinstance(present, list):
        raise PayloadError(f"payload has value bits {str(value_bits)[:20]} or no list of parameters")
    for position in present:  # each an int before the set below: a list or a map in there is unhashable
        if type(position) is not int or not 0 <= position < len(optimizer.names):
            raise PayloadError(f"payload names parameter #{str(position)[:20]}, which this block does not have")
    if len(set(present)) != len(present):
        raise PayloadError("payload names a parameter twice")
    layout = _wire_layout(present, optimizer, len(bit_array))
    check_fully_read(bit_array, layout[-1].end if layout else 0)
    payload = {}
    for group in batches([(entry.tile, optimizer.params[entry.name].device) for entry in layout]):
        members = [layout[i] for i in group]
        device = optimizer.params[members[0].name].device  # checked here, used on its device, one copy a group
        indices, values = (part.to(device) for part in _read_entries(members, bit_array, optimizer))
        counts = [entry.n_tiles for entry in members]
        for entry, entry_indices, entry_values in zip(members, indices.split(counts), values.split(counts)):
            payload[entry.name] = Compressed(entry.shape, entry.tile, entry_indices, entry_values, entry.position)
    return {entry.name: payload[entry.name] for entry in layout}


@dataclass(frozen=True)
class _WireEntry:
    """Where one parameter's indices and values lie in a payload's bit stream."""

    name: str
    position: int
    shape: torch.Size
    tile: tuple[int, int]
    n_tiles: int
    k: int
    start: int  # its indices' first bit
    values_start: int
    end: int


def _wire_layout(present: list[int], optimizer: DeMoOptimizer, length: int) -> list[_WireEntry]:
    """Where each present parameter's bits lie: the shapes are known, so the lengths are too."""
    layout, offset = [], 0
    for position in present:
        name = optimizer.names[position]
        n_tiles, tile = optimizer.tiles[name]
        k = keep_per_tile(optimizer.config.top_k, math.prod(tile))
        values_start = offset + n_tiles * k * index_bits(math.prod(tile))
        end = values_start + n_tiles * (k * 16 if optimizer.config.value_bits != 1 else k + 1)
        if end > length:
            raise PayloadError(f"{name}: payload is too short for this block")
        shape = optimizer.params[name].shape
        layout.append(_WireEntry(name, position, shape, tile, n_tiles, k, offset, values_start, end))
        offset = end
    return layout


def _read_entries(members: list[_WireEntry], bit_array: np.ndarray, optimizer: DeMoOptimizer):
    """The indices and values, (tiles, k) each, of parameters of one tile shape, one after the
    other, checked (in numpy: a parameter of a small block costs microseconds there, several
    times that in torch); PayloadError naming the first parameter that fails a check."""
    k, tile_elements, counts = members[0].k, math.prod(members[0].tile), [e.n_tiles for e in members]
    index_stream = np.concatenate([bit_array[e.start : e.values_start] for e in members])
    indices = read_bits(index_stream, 0, index_bits(tile_elements), sum(counts) * k)[0].reshape(-1, k)
    values, checked = _read_values(members, bit_array, optimizer.config.value_bits)
    largest = 1.0 if optimizer.config.value_bits == 1 else optimizer.max_value  # 1-bit values are signs
    checks = {"index out of range": (indices >= tile_elements).any(axis=1),
              "indices repeated or out of order": ~(np.diff(indices, axis=1) > 0).all(axis=1),  # honest ones are sorted
              "values are not finite, or larger than honest ones can be":
                  ~np.isfinite(checked).all(axis=1) | (np.abs(checked) > largest).any(axis=1)}  # fmt: skip
    for what, bad in checks.items():
        if bad.any():
            first = members[int(np.searchsorted(np.cumsum(counts), int(bad.argmax()), side="right"))]
            raise PayloadError(f"{first.name}: {what}")
    return torch.from_numpy(indices), values


def _value_bits_of(members: list[Compressed], value_bits: int) -> list[np.ndarray]:
    """Each entry's values on the wire (entries of one dtype and k)."""
    values = torch.cat([c.values for c in members])
    if value_bits != 1:
        words = to_bits(values.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF, 16)
        return np.split(words, np.cumsum([16 * c.values.numel() for c in members])[:-1])
    signs = np.split((values > 0).flatten().cpu().numpy(), np.cumsum([c.values.numel() for c in members])[:-1])
    empty = np.split((values == 0).all(dim=1).cpu().numpy(), np.cumsum([c.values.shape[0] for c in members])[:-1])
    return [np.concatenate([s, e]).astype(np.uint8) for s, e in zip(signs, empty)]


def _read_values(members: list[_WireEntry], bit_array: np.ndarray, value_bits: int) -> tuple[torch.Tensor, np.ndarray]:
    """The values of parameters of one tile shape, (tiles, k), as sent (bfloat16 words, or signs
    in float32), and the same values as a float32 array for the checks."""
    k, tiles = members[0].k, sum(e.n_tiles for e in members)
    if value_bits != 1:
        stream = np.concatenate([bit_array[e.values_start : e.end] for e in members])
        words = read_bits(stream, 0, 16, tiles * k)[0]
        widened = (words.astype(np.uint32) << 16).view(np.float32).reshape(-1, k)  # a bfloat16 is a float32's top half
        return torch.from_numpy(words.astype(np.int16)).view(torch.bfloat16).view(-1, k), widened
    signs = np.concatenate([bit_array[e.values_start : e.end - e.n_tiles] for e in members]).reshape(-1, k)
    empty = np.concatenate([bit_array[e.end - e.n_tiles : e.end] for e in members]).astype(bool)
    values = np.where(empty[:, None], 0.0, signs * 2.0 - 1).astype(np.float32)
    return torch.from_numpy(values), values
