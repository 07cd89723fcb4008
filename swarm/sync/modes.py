"""The `--sync` modes in one table: each name, what it needs from the peer, and how it is built.

The peer reads a mode's facts to set up what the mode needs (a payload exchange, hivemind's
averager) and hands them to its builder in a `SyncInputs`; `PeerConfig.checked()` and the
`--sync` option of swarm-peer read the names and the help from here, so that a mode is named
once. What each strategy does is in its own module (strategy.py lists them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from swarm.sync.decoupled_momentum import DeMoConfig, DeMoOptimizer
from swarm.sync.dense import CountingAverager, DenseSync
from swarm.sync.descent import DescentProbe
from swarm.sync.exchange import Exchange
from swarm.sync.lockstep import DeMoSync
from swarm.sync.outer import OuterOverlapSync, OuterSync
from swarm.sync.overlap import DeMoOverlapSync
from swarm.sync.pseudo_gradient import OuterConfig, OuterOptimizer
from swarm.sync.strategy import NoSync, SyncStrategy


@dataclass(frozen=True)
class SyncInputs:
    """What the peer hands a mode's builder: the block's live module and peak learning rate, the
    sync settings, and the exchange or averager the mode asked for (None where it did not)."""

    module: nn.Module
    lr: float
    de_mo: DeMoConfig
    outer: OuterConfig
    overlap_steps: int  # demo-overlap: how many steps late each gathered set is applied
    timeout: float  # dense: how long a step's all-reduce may take
    exchange: Exchange | None = None
    averager: CountingAverager | None = None
    probe: DescentProbe | None = None  # outer rounds: the replica's private held-out measure of a vote (descent.py)


@dataclass(frozen=True)
class Mode:
    """One way of keeping a block's replicas in step."""

    summary: str  # what it does, for swarm-peer --help
    build: Callable[[SyncInputs], SyncStrategy]
    exchanges_payloads: bool = False  # needs a payload exchange (and so can compute spare batches while it waits)
    outer_rounds: bool = False  # rounds of `outer.steps` steps: replicas agree only at a round's end
    averages_gradients: bool = False  # needs hivemind's averager at every step


def _demo(given: SyncInputs) -> SyncStrategy:
    return DeMoSync(DeMoOptimizer(given.module, given.de_mo, given.lr), given.exchange)


def _demo_overlap(given: SyncInputs) -> SyncStrategy:
    optimizer = DeMoOptimizer(given.module, given.de_mo, given.lr)
    return DeMoOverlapSync(optimizer, given.exchange, late_steps=given.overlap_steps)


def _outer(given: SyncInputs) -> SyncStrategy:
    return OuterSync(OuterOptimizer(given.module, given.outer, given.lr, given.probe), given.exchange)


def _outer_overlap(given: SyncInputs) -> SyncStrategy:
    return OuterOverlapSync(OuterOptimizer(given.module, given.outer, given.lr, given.probe), given.exchange)


def _dense(given: SyncInputs) -> SyncStrategy:
    return DenseSync(given.module, given.averager, given.timeout)


MODES: dict[str, Mode] = {
    "demo": Mode("DeMo exchange with the block's other replicas, every step in lockstep", _demo,
                 exchanges_payloads=True),
    "demo-overlap": Mode("the same, each step's exchange overlapped with the next step's compute", _demo_overlap,
                         exchanges_payloads=True),
    "outer": Mode("--outer-steps local AdamW steps, then one compressed exchange", _outer, exchanges_payloads=True,
                  outer_rounds=True),
    "outer-overlap": Mode("the same, the exchange overlapped with the next round's steps", _outer_overlap,
                          exchanges_payloads=True, outer_rounds=True),
    "dense": Mode("all-reduce of full fp32 gradients through hivemind's averager (the baseline; it trusts every "
                  "groupmate: one stranger can move the weights)", _dense, averages_gradients=True),
    "none": Mode("AdamW alone", lambda given: NoSync()),
}  # fmt: skip


def modes_help() -> str:
    """Every mode and what it does, on one line."""
    return "; ".join(f"{name}: {mode.summary}" for name, mode in MODES.items()) + "."


def payload_modes() -> list[str]:
    """The modes that exchange payloads."""
    return [name for name, mode in MODES.items() if mode.exchanges_payloads]
