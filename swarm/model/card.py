"""A model folder's card: README.md, what a person reads to know what the folder holds.

`save_model_folder` writes one into every model folder: what the model is (kind, config, units,
parameters), where it came from (the swarm and each block's step and who vouched for it, from
the manifest), what is known of its quality, and how to load it. The card says what the folder's
files say, in words; config.json and manifest.json stay the record, and nothing reads the card.
"""

from __future__ import annotations

import json
from numbers import Real

from swarm import __version__
from swarm.model.denoiser import ModelConfig

KIND_WORDS = {
    "blocks": "a DiffusionBlocks model: {n_blocks} blocks of {layers} layers, "
    "each denoising its own slice of the noise",
    "end_to_end": "the end-to-end baseline: one denoiser of all {n_layers} layers, trained over all noise levels",
    "autoregressive": "the autoregressive baseline: a causal transformer of {n_layers} layers",
}
FAMILY_WORDS = {"masked": "masked diffusion (hidden units revealed step by step)",
                "gaussian": "gaussian diffusion in embedding space"}  # fmt: skip
SPOT_CHECK_WORDS = (
    "Spot-check loss: each block's training objective, measured by the fetcher on windows and noise "
    "draws of its own at the block's own noise levels; the worst of its sources' means (the swarm's "
    "validation and training text, and the fetcher's own text where it gave one), in nats per unit "
    "(a unit is {unit}). It is not bits per byte, and no block's loss is the model's: each covers its "
    "own noise levels only."
)


def model_card(name: str, kind: str, config: ModelConfig, parameters: list[int], manifest: dict | None) -> str:
    """The README.md of model folder `name` (its folder name, as a user would type it), holding
    `kind` modules of `parameters` each, described by `config` and `manifest`."""
    sections = [_what_it_is(kind, config, parameters), _origin(manifest or {}), _quality(name, config, manifest or {}),
                _how_to_load(name, kind)]  # fmt: skip
    return "\n\n".join(section for section in sections if section) + "\n"


def _what_it_is(kind: str, config: ModelConfig, parameters: list[int]) -> str:
    words = KIND_WORDS[kind].format(n_blocks=config.n_blocks, layers=config.layers_per_block, n_layers=config.n_layers)
    units = (f"tokens of a byte-level BPE of {config.vocab_size} units (tokenizer.json, sha256 {config.tokenizer})"
             if config.tokenizer is not None else "raw bytes (256 units)")  # fmt: skip
    each = f" ({', '.join(f'{p:,}' for p in parameters)} per block)" if kind == "blocks" else ""
    lines = [
        "# BlockSwarm model",
        "",
        f"This folder holds {words}.",
        "",
        f"- family: {FAMILY_WORDS[config.family] if kind != 'autoregressive' else 'none (next unit, left to right)'}",
        f"- units: {units}",
        f"- window: {config.prefix_len} units of context, {config.gen_len} written at once",
        f"- width {config.d_model}, {config.n_heads} heads, MLP ratio {config.mlp_ratio}",
        f"- parameters: {sum(parameters):,}{each}",
        f"- config hash: {config.hash()} (config.json; its fields: BlockSwarm's docs/config.md)",
        f"- written by BlockSwarm {__version__}",
    ]
    return "\n".join(lines)


def _origin(manifest: dict) -> str:
    blocks = manifest.get("blocks")
    if "swarm" in manifest and isinstance(blocks, dict):
        rows = ["| block | step | served by | vouched for by |", "|---|---|---|---|"]
        rows += [_block_row(block, entry) for block, entry in sorted(blocks.items(), key=lambda item: int(item[0]))]
        return "\n".join([f"## Where it came from\n\nAssembled by swarm-fetch from swarm `{manifest['swarm']}`: "
                          "for each block, the checkpoint its hosts agreed on that verified and passed a spot check "
                          "(manifest.json has every figure).", "", *rows])  # fmt: skip
    if isinstance(blocks, dict):
        steps = ", ".join(
            f"block {b} at step {e.get('step')}" for b, e in sorted(blocks.items(), key=lambda i: int(i[0]))
        )
        made_by = " How it was made: manifest.json's `made_by`." if "made_by" in manifest else ""
        return f"## Where it came from\n\nEach block's training step: {steps}.{made_by}"
    if "steps" in manifest:
        return f"## Where it came from\n\nTrained on one machine by swarm-train for {manifest['steps']} steps."
    return ""


def _block_row(block: str, entry: dict) -> str:
    step = entry.get("step")
    believed = entry.get("believed_step", step)
    step_words = f"{step}" if believed == step else f"{step} (taken as {believed})"
    host = entry.get("peer_id", "?") + (f" ({entry['public_name']})" if entry.get("public_name") else "")
    vouched = entry.get("vouched_by", [])
    return f"| {block} | {step_words} | {host} | {len(vouched)}: {', '.join(vouched)} |"


def _quality(name: str, config: ModelConfig, manifest: dict) -> str:
    lines = ["## Quality", "", "Bits per byte: not measured when this folder was written; "
             f"`swarm-eval --model {name}` measures them on validation text."]  # fmt: skip
    losses = {b: e.get("spot_check_loss") for b, e in (manifest.get("blocks") or {}).items() if isinstance(e, dict)}
    losses = {b: loss for b, loss in losses.items() if loss is not None}
    if losses:
        unit = "one byte" if config.tokenizer is None else "one token of the tokenizer"
        lines += ["", SPOT_CHECK_WORDS.format(unit=unit), ""]
        lines += [f"- block {b}: {_figure(loss)}" for b, loss in sorted(losses.items(), key=lambda i: int(i[0]))]
    return "\n".join(lines)


def _figure(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, Real) else json.dumps(value)


def _how_to_load(name: str, kind: str) -> str:
    if kind == "autoregressive":
        return (
            f"## How to use it\n\nA baseline and a judge, not a writer of its own here: "
            f"`swarm-eval --model <a blocks model> --judge {name}` scores that model's writing with it."
        )
    return "\n".join([
        "## How to load it",
        "",
        "```python",
        "import swarm",
        f'model = swarm.load("{name}")',
        'print(model.generate("The history of"))',
        "```",
        "",
        f'or `swarm-generate --model {name} "The history of"`; `swarm-eval --model {name}` measures it.',
    ])  # fmt: skip
