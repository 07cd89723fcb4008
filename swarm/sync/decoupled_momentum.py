"""One replica's DeMo update: momentum, the payload it shares, and the sign step on what it gathered.

Per parameter: m = beta * m + lr * grad; the top-k DCT coefficients of m per tile are taken
out of m (error feedback) and shared. The replica then decodes the payloads of every replica
that arrived in time (its own included) and lets them vote: each payload votes, coordinate by
coordinate, the sign of its decoded update, and the step goes where most voted (nowhere on a
tie): p -= sign_lr * (sign(sum of votes) + weight_decay * p). This is signSGD with majority
vote: one replica's values, however large, weigh one vote, so an honest majority decides
every coordinate it agrees on. Where the honest ones disagree, though, a third payload
decides; so a payload that a strict majority of the others contradict on the sign of the DCT
coefficients they both sent (an update negated or sent against its own direction) leaves the
vote (`DeMoOptimizer.trusted`: judged on the counts of the last ~10 steps), and the honest
ones' disagreements become ties. Replicas that gathered the same sets compute the same update.

Two senders (a block with two replicas, or one replica and a stranger) cannot outvote each
other, so the rule there is unanimity and the evidence decides whether the other counts
(issue 26, item 4). A coordinate moves only where both voted and agree, so the other can never
move a weight in a direction this replica's own update does not (where this replica is silent
the other is too, by the rule), and the two compute the same step. Once the record shows the
other contradicting (the same test as above: `min_shared` coefficients shared, at most
`contradicted_at` of them agreed), it leaves the vote and this replica steps on its own update
alone: a negated stranger cannot freeze it. What a stranger that knows this can still do is
slow it: a payload whose coefficients avoid ours (so that the record never fills) decodes to an
update orthogonal to ours, which agrees on about half the coordinates, so about half of our
step is kept. Two honest replicas share coefficients and agree on 70% or more of them
(`trusted`), so they keep each other and stay identical.

Payloads cross the network as bytes (`encode_payload` / `decode_payload`); a payload that does
not fit this replica's parameters, or holds NaN, Inf, out-of-range or repeated indices or values larger
than honest ones can be (`max_value_per_lr` learning rates; honest coefficients of
lr * momentum stay near 1e-7..1e-5 at lr 2e-3 once training settles), is refused with
PayloadError and not applied. A payload decoded from bytes lands on its replica's device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from swarm.model.train import DENOISER_LR
from swarm.sync.compression import (
    Compressed,
    PayloadError,
    check_fully_read,
    decompress,
    extract,
    from_bits,
    index_bits,
    keep_per_tile,
    pack_message,
    tiling,
    to_bits,
    unpack_message,
)
from swarm.sync.evidence import Evidence, Record

Payload = dict[str, Compressed]


@dataclass
class DeMoConfig:
    """DeMo settings; the defaults follow the study in DESIGN.md (top-k 8, bfloat16), but the sign
    rate is the denoiser's AdamW rate (swarm/model/train.py's DENOISER_LR). Measured on 2 cores (the
    default config's last block, one replica, batch 32, its share of the bound in bits per byte
    after 100/200/300 steps): sign rate 2e-3, the study's, 1.14/1.13/1.09; 5e-4, 1.14/1.09/1.04."""

    top_k: int = 8  # coefficients kept per 64 x 64 tile (scaled with the tile's size)
    value_bits: int = 16  # 16: bfloat16 values; 1: signs only
    momentum_decay: float = 0.999
    sign_lr: float = DENOISER_LR
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


class DeMoOptimizer:
    """One replica's DeMo optimizer (it takes the place of AdamW): a momentum buffer per parameter,
    the payload made from it, the sign step on the gathered ones, and the evidence on who votes."""

    def __init__(self, module: nn.Module, config: DeMoConfig, lr: float):
        """`lr`: the peak learning rate the momentum is scaled with (it bounds honest values)."""
        self.config = config
        self.max_value = config.max_value_per_lr * lr
        self.params = dict(module.named_parameters())
        self.names = list(self.params)  # a parameter's position is its name on the wire
        self.momentum = {name: torch.zeros_like(p) for name, p in self.params.items()}
        # per pair of senders: coefficients they agreed on and shared, decayed (see `trusted`)
        self.evidence = Evidence(config.min_shared, config.contradicted_at, config.evidence_decay)

    def make_payload(self, lr: float) -> Payload:
        """Fold this step's gradients into the momentum and take out what is shared."""
        payload = {}
        for position, (name, param) in enumerate(self.params.items()):
            if param.grad is None:
                continue
            self.momentum[name].mul_(self.config.momentum_decay).add_(param.grad, alpha=lr)
            sent = extract(self.momentum[name], self.config.top_k, self.config.value_bits)
            payload[name] = dataclasses.replace(sent, position=position)
        return payload

    @torch.no_grad()
    def apply(self, gathered: Sequence[tuple[str, Payload]], own: str) -> list[str]:
        """The sign step on the coordinate-wise majority vote of the gathered (sender, payload)
        pairs that the evidence does not rule out (`trusted`), unanimity where two vote; `own`
        is this replica's sender name. Returns the senders that voted."""
        kept, self.evidence.record = self.trusted(gathered, own)
        voters = [gathered[i][1] for i in kept]
        for name, param in self.params.items():
            votes = [decompress(p[name]).sign() if name in p else torch.zeros_like(param) for p in voters]
            if not any(name in p for p in voters):
                continue
            stacked = torch.stack(votes)
            majority = stacked.sum(dim=0).sign()
            if len(gathered) == 2 and len(votes) == 2:  # unanimity: neither of two senders moves a coordinate the other does not
                majority = torch.where((stacked != 0).all(dim=0), majority, 0.0)
            param.mul_(1 - self.config.sign_lr * self.config.weight_decay)
            param.sub_(self.config.sign_lr * majority)
        return [gathered[i][0] for i in kept]

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
        signs = [self._coefficient_signs(payload) for _, payload in gathered] if len(gathered) > 1 else []

        def compare(i: int, j: int) -> tuple[float, float]:
            both = (signs[i] != 0) & (signs[j] != 0)
            return int(((signs[i] == signs[j]) & both).sum()), int(both.sum())

        return self.evidence.judged([sender for sender, _ in gathered], compare, own)

    def _coefficient_signs(self, payload: Payload) -> torch.Tensor:
        """The signs of every DCT coefficient a payload sent, laid out over all parameters (0: not sent)."""
        parts = []
        for name, param in self.params.items():
            if name not in payload:
                parts.append(torch.zeros(param.numel(), dtype=torch.int8, device=param.device))
                continue
            sent = payload[name]
            shape = sent.indices.shape[0], sent.tile[0] * sent.tile[1]
            dense = torch.zeros(shape, dtype=torch.int8, device=param.device)
            dense.scatter_(1, sent.indices.long(), sent.values.float().sign().to(torch.int8))
            parts.append(dense.flatten())
        return torch.cat(parts)


def encode_payload(payload: Payload, value_bits: int) -> bytes:
    """The wire form: which parameters (by position) are present, then one bit stream holding,
    parameter after parameter, the indices at ceil(log2(tile)) bits and the values (bfloat16
    words, or sign bits followed by one empty-tile flag per tile). Both sides know the shapes."""
    present, streams = [], []
    for c in payload.values():
        present.append(c.position)
        streams += [to_bits(c.indices, index_bits(c.tile[0] * c.tile[1])), _value_bits_of(c.values, value_bits)]
    return pack_message({"v": value_bits, "p": present}, streams)


def decode_payload(data: bytes, optimizer: DeMoOptimizer) -> Payload:
    """A payload from another replica, checked against `optimizer`'s parameters; PayloadError if bad."""
    (value_bits, present), bit_array = unpack_message(data, ("v", "p"))
    if value_bits != optimizer.config.value_bits or len(set(present)) != len(present):
        raise PayloadError(f"payload has value bits {value_bits} or repeats a parameter")
    payload, offset = {}, 0
    for position in present:
        if not isinstance(position, int) or not 0 <= position < len(optimizer.names):
            raise PayloadError(f"payload names parameter #{position}, which this block does not have")
        name = optimizer.names[position]
        payload[name], offset = _decode_entry(position, bit_array, offset, optimizer)
    check_fully_read(bit_array, offset)
    return payload


def _decode_entry(position: int, bit_array: np.ndarray, offset: int, optimizer: DeMoOptimizer):
    name = optimizer.names[position]
    param = optimizer.params[name]
    n_tiles, tile = tiling(param.shape)
    k = keep_per_tile(optimizer.config.top_k, tile[0] * tile[1])
    try:
        indices, offset = from_bits(bit_array, offset, index_bits(tile[0] * tile[1]), n_tiles * k)
        values, offset = _read_values(bit_array, offset, optimizer.config.value_bits, (n_tiles, k))
    except ValueError:
        raise PayloadError(f"{name}: payload is too short for this block") from None
    if indices.max() >= tile[0] * tile[1]:
        raise PayloadError(f"{name}: index out of range")
    if not (indices.view(-1, k).diff(dim=1) > 0).all():  # honest indices are sorted, each once
        raise PayloadError(f"{name}: indices repeated or out of order")
    largest = 1.0 if optimizer.config.value_bits == 1 else optimizer.max_value  # 1-bit values are signs
    if not torch.isfinite(values.float()).all() or values.float().abs().max() > largest:
        raise PayloadError(f"{name}: values are not finite, or larger than honest ones can be")
    indices, values = indices.view(-1, k).to(param.device), values.to(param.device)  # checked here, used on its device
    return Compressed(param.shape, tile, indices, values, position), offset


def _value_bits_of(values: torch.Tensor, value_bits: int) -> np.ndarray:
    if value_bits != 1:
        return to_bits(values.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF, 16)
    signs, empty = (values > 0).flatten().cpu().numpy(), (values == 0).all(dim=1).cpu().numpy()
    return np.concatenate([signs, empty]).astype(np.uint8)


def _read_values(bit_array: np.ndarray, offset: int, value_bits: int, shape: tuple[int, int]):
    count = shape[0] * shape[1]
    if value_bits != 1:
        words, offset = from_bits(bit_array, offset, 16, count)
        return words.to(torch.int16).view(torch.bfloat16).view(shape), offset
    signs, offset = from_bits(bit_array, offset, 1, count)
    empty, offset = from_bits(bit_array, offset, 1, shape[0])
    values = torch.where(empty.bool()[:, None], 0.0, signs.float().view(shape) * 2 - 1)
    return values, offset


