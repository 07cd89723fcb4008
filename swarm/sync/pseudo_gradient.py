"""The outer step without the network: a replica's pseudo-gradient, compressed, and the update a majority vouches for.

`--sync outer` (the strategy is in outer.py) is DiLoCo-style local training with SparseLoCo's
compression. The replicas share an *anchor*, the weights they all hold after an outer step.
Each replica takes H AdamW steps on its own batches from the anchor, then its pseudo-gradient
is the change `anchor - weights`. It scales its error buffer by `error_decay` and adds the
change, sends the top-k values of each tile of the buffer (tiles as in DeMo, up to 64 x 64;
optionally after a DCT) at 2 bits (sign, and whether the value is above its tile's median
size: two bfloat16 sizes per tile) or 1 bit (sign, one size per tile), and takes what it sent,
as decoded (after quantisation, as SparseLoCo does), out of the buffer (error feedback: what is
not sent this round may go out in a later one). The decay keeps the buffer bounded, near a
round's change at the default 0.5: without it top-k drains less of the buffer than each round
adds, and stale residuals outgrow each round's change (issue 58). `none` sends every value as
float32.

The outer update, coordinate by coordinate over the decoded changes of every replica that
arrived (its own included). Of three or more: their mean, clipped into the range that a
majority of them vouches for, [v(n-m+1), v(m)] of the n sorted values with m = n // 2 + 1.
Why this rule:
- wherever a strict majority of the replicas moves a coordinate the same way, the update goes
  that way (at least m values are above 0, so the clip's lower end is);
- with fewer than half of them hostile, both ends of the range are values some honest replica
  sent, so no minority can push a coordinate further than an honest replica asked for;
- it moves toward the coordinate-wise median.
Of two (a block with two replicas, or one replica beside a stranger) that range is [min, max]
and the rule would be the plain mean, which the other moves by up to half of the bound below,
any way it likes. So, as DeMo does for two senders (issue 26, item 4), a coordinate moves only
where both changes go the same way, and by the smaller of the two (`agreeing_minimum`): the
other can never move a weight further than this replica's own change asked for, nor another
way. Both replicas compute the same update, so an honest pair stays identical. That alone would
let a stranger freeze a replica (a negated change, or none, or one shrunk to almost nothing
keeps nothing), so each round of two adds to a record (evidence.py, as DeMo's) the share of the
larger of the two changes that the update keeps, the sizes summed over every coordinate
(`kept_share`); once its mean over the rounds remembered (`evidence_decay`) is at most
`contradicted_at`, the other leaves and each replica steps on its own change alone. Two
independent changes of like (Gaussian) sizes keep about 0.29 of each other; an honest pair
keeps more (seen once on the default block, built-in corpus, batch 16, DCT top-20 at 2 bits,
H = 30: 0.66 in the first round, 0.32 at step 300, where the plain mean kept 0.92 and 0.74 of
a replica's change), so `contradicted_at` = 0.1 leaves an honest pair together, while a
stranger that stays in the vote leaves this replica at least a tenth of its step, on the mean
over the rounds remembered (docs/trust.md). The price: an honest pair moves by less than its
mean, where their changes disagree not at all (what that costs in loss is not measured), and
with H = 1 and no compression an outer step of two is no longer parameter averaging (a test
replays the agreeing steps over real peers). With `raw` compression a decoded change is 0
wherever its replica sent nothing, so the agreeing minimum keeps only what both sent; how much
that is for an honest pair is not measured, and where it falls to `contradicted_at` the pair
parts (each steps alone, the fingerprints differ, and two replicas that drifted stay apart).
The anchor then moves by `outer_lr` times that update (1.0: SparseLoCo's choice; its error
feedback already plays the part of DiLoCo's outer momentum) and every replica's weights are
set to the new anchor, so replicas that applied the same payloads hold the same weights.

A payload is refused (PayloadError) if it does not fit this replica's parameters, or if any
decoded change is not finite or larger than `max_change_per_lr` x lr x H: a parameter moves
at most about lr per AdamW step, and the error buffer adds a few rounds' worth at most.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from swarm.schema import check_options, option
from swarm.sync.compression import (
    PayloadError,
    check_fully_read,
    dct,
    from_bits,
    from_tiles,
    idct_of_kept,
    index_bits,
    keep_per_tile,
    pack_message,
    tiling,
    to_bits,
    to_tiles,
    unpack_message,
    working_dtype,
)
from swarm.sync.descent import DescentProbe
from swarm.sync.evidence import Evidence, Record, agreeing_minimum, kept_of_own, kept_share, majority_mean

logger = logging.getLogger(__name__)

COMPRESSIONS = ("dct", "raw", "none")
Changes = dict[str, torch.Tensor]  # decoded pseudo-gradient, by parameter name


@dataclass
class OuterConfig:
    """Outer-step settings. With the defaults (H = 30, 96 values per 64 x 64 tile, 2 bits) a
    replica of the small block of benchmarks/sync.py sends about 1/1,300 of the bytes of dense
    per-step averaging with 4 replicas (1/650 with 8: every replica sends its payload to every
    other one). 128 a tile learnt no better there (600 steps: 1.029x of dense's loss, both) at
    1/1,012, too near 1/1,000 to keep it on another block or with the transport's overhead. Half
    the error buffer is dropped each round, so it stays near one round's change: with none dropped
    and 20 values a tile (the defaults before issue 58, 1/2,500) top-k drained less of it than each
    round added, it grew to 65 rounds' changes, and what was sent was mostly stale.
    benchmarks/outer_rounds.py measures each (benchmarks/results/outer_rounds/; docs/decisions.md
    says what each setting gave)."""

    # the fields with an `option` are swarm-peer's options of that name (swarm/schema.py)
    steps: int = field(default=30, metadata=option(  # H: local AdamW steps between outer steps
        "outer, outer-overlap: local steps between outer steps (H).", name="--outer-steps", min=1))
    compression: str = field(default="dct", metadata=option(
        "outer: top-k of each tile's DCT, of the raw change, or none (every value, float32).",
        name="--outer-compression", choices=COMPRESSIONS))
    # values kept per 64 x 64 tile (scaled with the tile's size, at least 1)
    top_k: int = field(default=96, metadata=option("outer: kept per 64x64 tile.", name="--outer-top-k", min=1))
    value_bits: int = field(default=2, metadata=option(
        "outer: sign and one of two sizes per tile, or sign and one size.", name="--outer-value-bits", choices=(2, 1)))
    outer_lr: float = field(default=1.0, metadata=option(
        "outer: the outer step's learning rate.", min=0, min_open=True))
    error_decay: float = 0.5  # the error buffer is multiplied by this before each round's change is added
    max_change_per_lr: float = 10.0  # refused: a decoded change above this many lr x H
    # of two senders, the other leaves when the update keeps at most this share of the larger
    # change (sizes summed over every coordinate), on the mean of the rounds remembered (`kept_share`)
    contradicted_at: float = 0.1
    evidence_decay: float = 0.5  # each round the shares of the rounds before weigh this much less

    def checked(self) -> OuterConfig:
        """This config, or a SwarmError naming the first option out of its bounds (those of swarm-peer --help)."""
        check_options(self)
        return self


class OuterOptimizer:
    """One replica's outer optimizer: the anchor, the error buffer, the payloads in and out, and the outer step."""

    def __init__(self, module: nn.Module, config: OuterConfig, lr: float, probe: DescentProbe | None = None):
        """`lr`: the peak inner learning rate (it bounds honest changes). `probe`: this replica's private
        held-out measure of a vote of three or more against its own change (descent.py; None: not measured)."""
        self.config = config.checked()
        self.probe = probe
        self.params = dict(module.named_parameters())
        self.names = list(self.params)  # a parameter's position is its name on the wire
        self.error = {name: torch.zeros_like(p) for name, p in self.params.items()}
        self.max_change = config.max_change_per_lr * lr * config.steps
        self.evidence = Evidence(1.0, config.contradicted_at, config.evidence_decay)  # one round is evidence enough
        self.anchor: Changes = {}
        self.reset()

    def reset(self) -> None:
        """The weights as they are now become the anchor (at start, and after parameter averaging)."""
        self.anchor = {name: p.detach().clone() for name, p in self.params.items()}

    @torch.no_grad()
    def make_payload(self) -> bytes:
        """This round's change folded into the error buffer; what is sent leaves the buffer."""
        entries = []
        for name, param in self.params.items():
            error = self.error[name].mul_(self.config.error_decay).add_(self.anchor[name] - param)
            sent = _compress(error, self.config)
            error.sub_(_decompress(sent, param, self.config))
            entries.append(sent)
        return _encode(entries, self.config)

    def decode(self, data: bytes) -> Changes:
        """A replica's payload as changes of this block's parameters (on their device, in float32
        or their dtype if wider: `working_dtype`); PayloadError if it is bad."""
        entries = _decode(data, self.config, [p.shape for p in self.params.values()])
        changes = {}
        for name, entry in zip(self.names, entries):
            change = _decompress(entry, self.params[name], self.config)
            low, high = torch.aminmax(change)  # NaN in, NaN out: no comparison holds
            if not (bool(low >= -self.max_change) and bool(high <= self.max_change)):
                raise PayloadError(f"{name}: changes are not finite, or larger than honest ones can be")
            changes[name] = change
        return changes

    @torch.no_grad()
    def apply(self, gathered: Sequence[tuple[str, Changes]], own: str, progress: Changes | None = None) -> list[str]:
        """The outer step on the gathered (sender, changes) pairs that count (`trusted`; `own` is
        this replica's sender name): of two, their agreeing minimum, or this replica's own changes
        once the other leaves; of one, or three and more, what a majority vouches for, unless it
        keeps too little of own's change (`Evidence.keeps_own`) or measures worse than own's on
        this replica's private held-out batch (`probe`, descent.py): then own's alone. Every
        replica's weights become the new anchor, plus `progress` where given: the change of its
        own local steps since it made the payload (an overlapped round, applied some steps late).
        With nothing to apply (every payload refused, our own included) the round changes
        nothing. Returns the senders whose changes were applied."""
        if not gathered:
            return []
        kept, self.evidence.record = self.trusted(gathered, own)
        applied = [gathered[i][1] for i in kept]
        combine = agreeing_minimum if len(applied) == 2 else majority_mean
        updates = {name: combine([changes[name] for changes in applied]) for name in self.params}
        mine = [i for i, (sender, _) in enumerate(gathered) if sender == own]
        if len(gathered) > 2 and mine:  # the vote must keep some of own's, and not measure worse than it
            own_changes = gathered[mine[0]][1]
            keeps, self.evidence.record = self.evidence.keeps_own(own, kept_of_own(updates, own_changes))
            if keeps and kept != mine and self.probe is not None:
                keeps = not self._measures_worse(updates, own_changes)
            if not keeps:
                kept, updates = mine, own_changes
        for name, param in self.params.items():
            self.anchor[name].sub_(updates[name], alpha=self.config.outer_lr)
            param.copy_(self.anchor[name])
            if progress is not None:
                param.add_(progress[name])
        return [gathered[i][0] for i in kept]

    def _measures_worse(self, vote: Changes, own_changes: Changes) -> bool:
        """Whether the probe finds the vote worse than own's change alone (descent.py), logged. A probe
        that fails (out of memory, say) is logged and decides nothing: the weights it left at its trial
        values are set right after, with the rest of the round, so no save holds them."""
        try:
            worse = self.probe.vote_is_worse(self.anchor, vote, own_changes, self.config.outer_lr)
        except Exception as error:  # noqa: BLE001 - a measurement that failed is no evidence either way
            logger.warning("the held-out probe failed (%s): the vote is judged without it", error)
            return False
        if worse:
            logger.info("the vote's outer update measures worse than this replica's own on a private held-out "
                        "batch (%.1f standard errors): its own alone", self.probe.last_z)  # fmt: skip
        return worse

    def trusted(self, gathered: Sequence[tuple[str, Changes]], own: str) -> tuple[list[int], Record]:
        """The positions of the (sender, changes) pairs applied, and the record with this round's
        share in (`apply` keeps it): every one, but of two senders whose record shows the
        agreeing minimum keeping at most `contradicted_at` of the larger change, `own` alone
        (`Evidence.judged`; the module docstring). Rounds of one sender, or of three and more,
        leave the record as it was."""
        if len(gathered) != 2:
            return list(range(len(gathered))), self.evidence.record
        (_, a), (_, b) = gathered
        return self.evidence.judged([sender for sender, _ in gathered], lambda i, j: kept_share(a, b), own)

    @torch.no_grad()
    def weights(self) -> Changes:
        """A copy of the weights as they are now (what `progress` is measured from)."""
        return {name: param.detach().clone() for name, param in self.params.items()}

    @torch.no_grad()
    def progress_since(self, weights: Changes) -> Changes:
        return {name: param.detach() - weights[name] for name, param in self.params.items()}


@dataclass
class _Entry:
    """One parameter's part of a payload: kept positions, their codes and their tiles' sizes
    (for `none`: every value, in `scales`)."""

    indices: torch.Tensor  # (tiles, k) positions inside each flattened tile
    codes: torch.Tensor  # (tiles, k) bit 0: negative; bit 1 (2-bit values): above the tile's median size
    scales: torch.Tensor  # (tiles, levels) bfloat16 sizes; for `none`: the float32 values
    tile_elements: int = 0  # values per tile (the indices' range)


def _levels(config: OuterConfig) -> int:
    return 2 if config.value_bits == 2 else 1


def _coefficients(tensor: torch.Tensor, config: OuterConfig) -> tuple[torch.Tensor, tuple[int, int]]:
    tiles, tile = to_tiles(tensor.detach().to(working_dtype(tensor.dtype)))
    return (dct(tiles) if config.compression == "dct" else tiles).flatten(1), tile


def _compress(tensor: torch.Tensor, config: OuterConfig) -> _Entry:
    if config.compression == "none":
        return _Entry(
            torch.empty(0, dtype=torch.long),
            torch.empty(0, dtype=torch.long),
            tensor.detach().float().flatten().clone(),
        )
    coefficients, _ = _coefficients(tensor, config)
    k = keep_per_tile(config.top_k, coefficients.shape[1])
    indices = coefficients.abs().topk(k, dim=1).indices.sort(dim=1).values
    kept = coefficients.gather(1, indices)
    size = kept.abs()
    big = (
        size > size.median(dim=1, keepdim=True).values
        if config.value_bits == 2
        else torch.zeros_like(size, dtype=torch.bool)
    )
    scales = torch.stack([_masked_mean(size, ~big), _masked_mean(size, big)], dim=1)[:, : _levels(config)]
    codes = (kept < 0).long() | (big.long() << 1)
    return _Entry(indices, codes, scales.to(torch.bfloat16), coefficients.shape[1])


def _masked_mean(size: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per tile, the mean size of the masked values (0 where none is)."""
    return (size * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)


def _decompress(entry: _Entry, param: torch.Tensor, config: OuterConfig) -> torch.Tensor:
    """The change an entry stands for, shaped as the parameter, on its device, in its working dtype."""
    if config.compression == "none":
        return entry.scales.view(param.shape).to(param.device, working_dtype(param.dtype))
    n_tiles, tile = tiling(param.shape)
    indices, codes = entry.indices.to(param.device), entry.codes.to(param.device)
    sizes = entry.scales.to(param.device, working_dtype(param.dtype)).gather(1, codes >> 1)
    values = torch.where(codes & 1 == 1, -sizes, sizes)
    if config.compression == "dct":
        return from_tiles(idct_of_kept(indices, values, tile), param.shape)
    coefficients = torch.zeros(n_tiles, tile[0] * tile[1], device=param.device, dtype=values.dtype)
    return from_tiles(coefficients.scatter_(1, indices, values).view(-1, *tile), param.shape)


def _encode(entries: list[_Entry], config: OuterConfig) -> bytes:
    """Wire form: compression, value bits, and one bit stream holding, parameter after parameter,
    the indices at ceil(log2(tile size)) bits, the codes at value_bits, then the sizes as
    bfloat16 words (`none`: every value as a float32 word). Both sides know the shapes."""
    streams = []
    for entry in entries:
        if config.compression == "none":
            streams.append(to_bits(entry.scales.view(torch.int32).to(torch.int64) & 0xFFFFFFFF, 32))
            continue
        streams += [to_bits(entry.indices, index_bits(entry.tile_elements)), to_bits(entry.codes, config.value_bits),
                    to_bits(entry.scales.view(torch.int16).to(torch.int32) & 0xFFFF, 16)]  # fmt: skip
    return pack_message({"c": config.compression, "v": config.value_bits}, streams)


def _decode(data: bytes, config: OuterConfig, shapes: list[torch.Size]) -> list[_Entry]:
    (compression, value_bits), bit_array = unpack_message(data, ("c", "v"))
    if compression != config.compression or value_bits != config.value_bits:
        raise PayloadError(f"payload has compression {compression!r} at {value_bits} bits")
    entries, offset = [], 0
    try:
        for shape in shapes:
            entry, offset = _decode_entry(bit_array, offset, shape, config)
            entries.append(entry)
    except ValueError:
        raise PayloadError("payload is too short for this block") from None
    check_fully_read(bit_array, offset)
    return entries


def _decode_entry(bit_array: np.ndarray, offset: int, shape: torch.Size, config: OuterConfig) -> tuple[_Entry, int]:
    if config.compression == "none":
        words, offset = from_bits(bit_array, offset, 32, math.prod(shape))
        return _Entry(
            torch.empty(0, dtype=torch.long),
            torch.empty(0, dtype=torch.long),
            words.to(torch.int32).view(torch.float32),
        ), offset
    n, tile = tiling(shape)
    size = tile[0] * tile[1]
    k = keep_per_tile(config.top_k, size)
    indices, offset = from_bits(bit_array, offset, index_bits(size), n * k)
    codes, offset = from_bits(bit_array, offset, config.value_bits, n * k)
    words, offset = from_bits(bit_array, offset, 16, n * _levels(config))
    indices = indices.view(n, k)
    if indices.max() >= size:
        raise PayloadError("index out of range")
    if not bool((indices.diff(dim=1) > 0).all()):  # honest ones are sorted (`_compress`); a repeat would add up
        raise PayloadError("indices repeated or out of order")
    scales = words.to(torch.int16).view(torch.bfloat16).view(n, _levels(config))
    return _Entry(indices, codes.view(n, k), scales, size), offset
