"""Every command BlockSwarm installs, what it does, and how to run it with `python -m` (`python -m swarm` lists them).

The names are pyproject.toml's `[project.scripts]` (tests/test_conventions.py checks that the two
agree). The table names modules, never imports them: listing the commands loads neither torch nor
hivemind, and the library does not import the two programs (swarm_peer, swarm_bootstrap).
"""

from __future__ import annotations

from dataclasses import dataclass

from swarm import __version__


@dataclass(frozen=True)
class Program:
    name: str  # the console script
    module: str  # what `python -m` runs
    summary: str


PROGRAMS = (
    Program("swarm-demo", "swarm.cli.demo", "a whole swarm on this machine, from a start model to generated text"),
    Program("swarm-bootstrap", "swarm_bootstrap.main", "a swarm's entry point: creates it, prints the join line"),
    Program("swarm-peer", "swarm_peer.main", "joins a swarm, trains one block of its model, serves it"),
    Program("swarm-status", "swarm.cli.status", "which peers host which block, or each key's verified contributions"),
    Program("swarm-fetch", "swarm.cli.fetch", "assembles the model from the swarm's blocks into a model folder"),
    Program("swarm-generate", "swarm.cli.generate", "continues a prompt, with a model folder or the swarm's peers"),
    Program("swarm-eval", "swarm.cli.evaluate", "a model folder's figures of quality, as JSON"),
    Program("swarm-train", "swarm.cli.train", "trains a model on this machine: every block in turn, or a baseline"),
    Program("swarm-health", "swarm.cli.health", "a web page that follows one swarm"),
    Program("swarm-bench", "swarm.cli.bench", "measurements against a live swarm (latency)"),
)


def listing() -> str:
    """What `python -m swarm` prints: every command, what it does, and its `python -m` form."""
    width, summary_width = max(len(p.name) for p in PROGRAMS), max(len(p.summary) for p in PROGRAMS)
    lines = [f"BlockSwarm {__version__}: train and serve a DiffusionBlocks language model across a swarm of peers.",
             "", "Commands (each takes -h for its options; or run it as python -m MODULE):"]  # fmt: skip
    lines += [f"  {p.name:<{width}}  {p.summary:<{summary_width}}  python -m {p.module}" for p in PROGRAMS]
    lines += ["", "The join line's options may come from the environment: BLOCKSWARM_SWARM, BLOCKSWARM_CREATOR,",
              "BLOCKSWARM_INITIAL_PEERS (addresses separated by spaces). Exit codes: docs/exit-codes.md."]  # fmt: skip
    return "\n".join(lines)
