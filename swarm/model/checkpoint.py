"""Safetensors files: one block's checkpoint, and an assembled model folder.

A block checkpoint is one safetensors file whose metadata says what it is (format version,
swarm, block index, step, config hash), so a file can be checked before its tensors are
used. A model folder holds `config.json` (kind, model config, config hash),
`model.safetensors` (for a block model, block b's tensors under `blocks.<b>.`), `README.md` (its
card: card.py), `tokenizer.json` for a model of tokens and, when the blocks came from a swarm or
from swarm-train, `manifest.json`. Everything is written atomically (swarm/files.py), so a
reader never sees half of a file or a folder.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors_bytes
from safetensors.torch import save as save_safetensors_bytes  # only through safetensors_bytes
from torch import nn

from swarm.errors import SwarmError
from swarm.files import write_atomic, write_folder_atomic
from swarm.model.autoregressive import ByteTransformer
from swarm.model.card import model_card
from swarm.model.denoiser import Denoiser, ModelConfig, build_block, build_end_to_end, count_parameters
from swarm.model.units import TOKENIZER_FILE

FORMAT_VERSION = "1"
STEP_DIGITS = 15  # a checkpoint's step, in decimal digits: below 2^53, the bound on a step everywhere else
KINDS = ("blocks", "end_to_end", "autoregressive")


def safetensors_bytes(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> bytes:
    """The safetensors file of `tensors` and `metadata`, the same bytes for the same input.

    Replicas that applied the same updates must announce the same sha256: merge rounds group
    checkpoints by it, and so do generation's witnesses where keys count (an open swarm's choice
    groups by the weights, `weights_hash`). safetensors 0.5 to 0.8 write the
    metadata's keys in a random order, a new one on every save (safetensors issue #584), so
    the same weights gave different files. The header is written again here as sorted, compact
    JSON, padded with spaces to a multiple of 8 bytes as safetensors pads it; the tensor data,
    whose offsets count from the header's end, is kept as it is."""
    data = save_safetensors_bytes(tensors, metadata=metadata)
    length = int.from_bytes(data[:8], "little")
    header = json.dumps(json.loads(data[8 : 8 + length]), sort_keys=True, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    return b"".join((len(header).to_bytes(8, "little"), header, memoryview(data)[8 + length :]))  # one copy


def _tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """CPU copies of a module's tensors, wherever it lives and in its dtype: what safetensors writes."""
    return {name: t.detach().cpu().contiguous().clone() for name, t in module.state_dict().items()}


@dataclass(frozen=True)
class BlockFile:
    """What a block checkpoint's bytes are: enough to check them against a DHT record."""

    block: int
    step: int
    sha256: str
    size: int


def encode_block(denoiser: Denoiser, config: ModelConfig, block: int, step: int, swarm: str = "local") -> bytes:
    """The safetensors bytes of one block with its metadata."""
    metadata = {
        "format_version": FORMAT_VERSION,
        "swarm": swarm,
        "block": str(block),
        "step": str(step),
        "config_hash": config.hash(),
    }
    return safetensors_bytes(_tensors(denoiser), metadata)


def save_block(path: Path, denoiser: Denoiser, config: ModelConfig, block: int, step: int, swarm: str = "local"):
    """Atomically write a block checkpoint; returns its BlockFile (sha256 and size of the bytes)."""
    data = encode_block(denoiser, config, block, step, swarm)
    write_atomic(Path(path), data)
    return BlockFile(block=block, step=step, sha256=hashlib.sha256(data).hexdigest(), size=len(data))


def read_block_metadata(data: bytes) -> dict:
    """The metadata of a block checkpoint's bytes; SwarmError if they are not a safetensors file
    (a header that is not JSON, nested too deep to read, or whose metadata is not a map)."""
    try:
        header_len = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + header_len])
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise SwarmError("not a safetensors file (corrupt header)") from None
    metadata = header.get("__metadata__", {}) if isinstance(header, dict) else {}
    if not isinstance(metadata, dict):
        raise SwarmError("not a safetensors file (its metadata is not a map)")
    return metadata


def decode_block(data: bytes, config: ModelConfig, block: int) -> tuple[Denoiser, int]:
    """A block denoiser and its step from checkpoint bytes, checked against the config and index.

    The block is on the CPU, in the default dtype, whatever device or dtype wrote the file: a
    caller that trains or serves elsewhere loads it into its own module (`load_state_dict`
    copies onto that module's device and into its dtype) or moves it.
    """
    metadata = read_block_metadata(data)
    if metadata.get("config_hash") != config.hash():
        raise SwarmError("checkpoint was trained for a different model config (config hash differs)")
    if metadata.get("block") != str(block):
        raise SwarmError(f"checkpoint holds block {metadata.get('block')}, not block {block}")
    with torch.device("cpu"):
        denoiser = build_block(config, block)
    _load_into(denoiser, _decode(data))
    return denoiser, _step(metadata)


def _step(metadata: dict) -> int:
    """The step a checkpoint's metadata names (0 if none); SwarmError unless it is a whole number
    of at most STEP_DIGITS digits: `int()` would raise ValueError on "abc", and take "-5" or "1_0"."""
    step = metadata.get("step", "0")
    if not isinstance(step, str) or not re.fullmatch(rf"[0-9]{{1,{STEP_DIGITS}}}", step):
        raise SwarmError(f"checkpoint names no step it could hold ({str(step)[:20]!r})")
    return int(step)


def load_block(path: Path, config: ModelConfig, block: int) -> tuple[Denoiser, int]:
    """Read a block checkpoint file; SwarmError if it is missing, corrupt or for another model."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise SwarmError(f"cannot read checkpoint {path}: {error.strerror}") from None
    try:
        return decode_block(data, config, block)
    except SwarmError as error:
        raise SwarmError(f"{path}: {error}") from None


def _decode(data: bytes) -> dict[str, torch.Tensor]:
    try:
        return load_safetensors_bytes(data)
    except (SafetensorError, ValueError) as error:
        raise SwarmError(f"corrupt safetensors data ({error})") from None


def _load_into(module: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """The tensors as the module's weights, if they fit it and are all finite (a NaN weight from
    another peer would otherwise reach the spot check, generation or training)."""
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise SwarmError(f"tensor {name} holds a value that is not finite")
    try:
        module.load_state_dict(tensors, strict=True)
    except RuntimeError as error:
        raise SwarmError(f"tensors do not fit the model: {str(error).splitlines()[0]}") from None


@dataclass
class LoadedModel:
    """A model folder in memory: kind, config, and the modules (B blocks, or one model)."""

    kind: str
    config: ModelConfig
    modules: list[nn.Module]
    manifest: dict | None = None

    def denoiser_for_block(self, block: int) -> Denoiser:
        """The denoiser that owns a block's sigma interval."""
        return self.modules[block] if self.kind == "blocks" else self.modules[0]


def save_model_folder(
    folder: Path, kind: str, config: ModelConfig, modules: list[nn.Module], manifest: dict | None = None
) -> None:
    """Write config.json, model.safetensors, its card (README.md: card.py), the tokenizer.json of a
    model of tokens (and manifest.json) as one folder, atomically."""
    assert kind in KINDS, kind
    if kind == "blocks":
        tensors = {f"blocks.{b}.{k}": v for b, m in enumerate(modules) for k, v in _tensors(m).items()}
    else:
        tensors = _tensors(modules[0])
    files = {
        "config.json": json.dumps({"kind": kind, "model": config.to_dict(), "config_hash": config.hash()}, indent=2),
        "model.safetensors": safetensors_bytes(tensors, {"format_version": FORMAT_VERSION}),
        "README.md": model_card(Path(folder).name, kind, config, [count_parameters(m) for m in modules], manifest),
    }
    if manifest is not None:
        files["manifest.json"] = json.dumps(manifest, indent=2)
    if config.tokenizer is not None:  # the folder explains its own units: it loads with nothing else
        files[TOKENIZER_FILE] = config.units().data
    write_folder_atomic(Path(folder), files)


def load_model_folder(folder: Path) -> LoadedModel:
    """Read a model folder; SwarmError (one line) if it is missing, corrupt or inconsistent."""
    folder = Path(folder)
    if not (folder / "config.json").is_file() or not (folder / "model.safetensors").is_file():
        raise SwarmError(f"{folder} is not a model folder (needs config.json and model.safetensors)")
    try:
        meta = json.loads((folder / "config.json").read_text())
        kind, config = meta["kind"], ModelConfig.from_dict(meta["model"])
    except (ValueError, KeyError, TypeError):
        raise SwarmError(f"{folder}/config.json is not a valid model config") from None
    except SwarmError as error:  # a field the config's schema refuses: which one
        raise SwarmError(f"{folder}/config.json: {error}") from None
    if kind not in KINDS:
        raise SwarmError(f"{folder}/config.json: unknown model kind {kind!r}")
    config.units(folder)  # its tokenizer, from the folder if nowhere else: SwarmError if missing or another
    tensors = _decode((folder / "model.safetensors").read_bytes())
    modules = _build_modules(kind, config, tensors)
    manifest_path = folder / "manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else None
    except ValueError:
        raise SwarmError(f"{folder}/manifest.json is not valid JSON") from None
    return LoadedModel(kind, config, modules, manifest)


def _build_modules(kind: str, config: ModelConfig, tensors: dict[str, torch.Tensor]) -> list[nn.Module]:
    if kind == "autoregressive":
        modules: list[nn.Module] = [ByteTransformer(config)]
        _load_into(modules[0], tensors)
    elif kind == "end_to_end":
        modules = [build_end_to_end(config)]
        _load_into(modules[0], tensors)
    else:
        modules = [build_block(config, b) for b in range(config.n_blocks)]
        for b, module in enumerate(modules):
            prefix = f"blocks.{b}."
            _load_into(module, {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)})
    for module in modules:
        module.eval()
    return modules
