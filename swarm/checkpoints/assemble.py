"""A whole model from the swarm's blocks: for every block, the checkpoint to believe, into one model folder.

What `swarm-fetch` and `swarm.fetch` (the Python API) do: read each block's host records, choose
the checkpoint its hosts agree on that verifies and passes a spot check (choice.py), and write a
model folder (config.json, model.safetensors, tokenizer.json, manifest.json) whose manifest says,
for each block, who served it, at what step and sha256, who vouched for it and how it scored.
"""

from __future__ import annotations

import logging
from pathlib import Path

from swarm.checkpoints.choice import Choice, SpotCheck, choose_checkpoint, rank
from swarm.errors import SwarmError
from swarm.model.checkpoint import decode_block, save_model_folder
from swarm.model.denoiser import ModelConfig
from swarm.p2p.client import SwarmClient
from swarm.p2p.ledger import backed_keys

logger = logging.getLogger(__name__)

FETCH_TIMEOUT_S = 600.0  # one block's choice: downloads and spot checks of its candidates


def assemble(client: SwarmClient, config: ModelConfig, out: Path, spot_check: SpotCheck) -> None:
    """Write the swarm's model into the folder `out` (atomically); SwarmError if a block has no live
    host with a checkpoint, or none of its candidates passes."""
    hosts = client.directory.all_hosts(config.n_blocks)
    missing = [b for b, h in hosts.items() if not rank(h, config)]
    if missing:
        raise SwarmError(f"no live host with a checkpoint for block(s) {', '.join(map(str, missing))}")
    modules, manifest = [], {"swarm": client.swarm, "config_hash": config.hash(), "blocks": {}}
    backed = backed_keys(client.directory)
    for block in range(config.n_blocks):
        choice = choose_block(client, config, block, spot_check, backed)
        modules.append(decode_block(choice.data, config, block)[0])
        manifest["blocks"][str(block)] = manifest_entry(choice)
    manifest["spot_check_seconds"] = spot_check.seconds
    save_model_folder(Path(out), "blocks", config, modules, manifest)


def choose_block(client: SwarmClient, config: ModelConfig, block: int, spot_check: SpotCheck,
                 backed: frozenset[str] = frozenset()) -> Choice:  # fmt: skip
    """The checkpoint to assemble for `block`, chosen from its hosts' records as they are now; the
    hosts of keys in `backed` (swarm/p2p/ledger.py `backed_keys`) are measured first.

    Records are read again for each block, and once more if no candidate could be had: hosts
    keep a checkpoint only a while after a newer one replaces it in their record, and spot
    checks of the blocks before take minutes on a busy machine, so records read at the start
    may name checkpoints that are gone (seen in benchmarks/long_run.py)."""

    def choose() -> Choice:
        hosts = client.directory.hosts(block)
        coro = choose_checkpoint(client.p2p, hosts, config, block, spot_check, keys_count=client.directory.keys_count,
                                 backed=backed)  # fmt: skip
        return client.run(coro, FETCH_TIMEOUT_S)

    try:
        return choose()
    except SwarmError as error:
        logger.warning("%s; reading block %d's records again", error, block)
    return choose()


def manifest_entry(choice: Choice) -> dict:
    return {
        "peer_id": choice.host.peer_id,
        "public_name": choice.host.announcement.public_name,
        "step": choice.checkpoint.step,
        "believed_step": choice.step,  # the stamp, unless no other key's kept checkpoint makes it plausible
        "sha256": choice.checkpoint.sha256,
        "vouched_by": sorted(h.peer_id for h in choice.vouched_by),  # every host of its weights, under any stamp
        "taken_from": list(choice.taken_from),  # their independent voices (keys), lineage counted
        "spot_check_loss": choice.loss,
        "candidates_measured": len(choice.measured),
    }
