"""The DiffusionBlocks denoiser and its config.

One `Denoiser` is a stack of bidirectional transformer layers over the positions
[prefix ; target]. It reads the clean prefix units (bytes or tokens: units.py) and a noisy
target at a noise level and returns logits over the units at every target position. What the
noisy target is depends on the config's `family`, and only the target-input module knows it:
- "gaussian": a noisy embedding z = T[y] + sigma * eps at noise level sigma (diffusion.py);
- "masked": unit ids with `config.mask_id` at masked positions, at mask rate t (masked.py).

A block of the swarm is a `Denoiser` with `n_layers / n_blocks` layers; the end-to-end
baseline is one `Denoiser` with all `n_layers`. A block owns everything it needs (prefix
embedding, input projection, layers, head), so it never needs another block's weights.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Annotated, Any, Literal, get_type_hints

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from torch import nn
from torch.utils.checkpoint import checkpoint

from swarm.errors import SwarmError
from swarm.model.units import BYTE_VOCAB, MAX_VOCAB, Units, find_tokenizer, units_for

FAMILIES = ("masked", "gaussian")  # swarm/model/families.py; the first is the default
# config fields added after the first checkpoints, with the value every config before them had
LATER_FIELDS = {"prefix_cache": False, "vocab_size": BYTE_VOCAB, "tokenizer": None, "tie_embeddings": False}
# the built-in tokenizer (swarm/model/tokenizers/): a byte-level BPE trained on the built-in corpus's training split
BUILTIN_TOKENIZER = "bcee1c8e4ea78a1f9075c58db5b9ad6142d0588ba84112607dd61bda99bf284d"
MAX_BLOCKS = 256  # as many as the swarm's records name (swarm/p2p/records.py)

# the field types of the config schema (`CONFIG_SCHEMA`): far above any model trained here, low enough
# that a config cannot ask a peer for tensors no machine holds
Length = Annotated[int, Field(ge=1, le=65536)]  # units of a window's part
Sigma = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


@dataclass(frozen=True)
class ModelConfig:
    """Architecture and noise partition; every peer of a swarm trains the same one.

    The units are the tokens of the tokenizer whose tokenizer.json hashes to `tokenizer`, or raw
    bytes when it is None (units.py); `vocab_size` is their number, so the config hash covers
    the tokenizer. Fields below speak of units: with the built-in tokenizer a unit is about 4
    bytes of the built-in text.

    `family` is the kind of noise (see the module docstring). The sigma fields below belong
    to the gaussian family; the masked family's noise level is the mask rate t in (0, 1],
    split among the blocks in equal slices (masked.py), and ignores them.

    The sigma range is tied to the codebook's signal-to-noise ratio: with codebook rows of
    RMS `sigma_data` in `d_model` dimensions (row norm `sigma_data * sqrt(d_model)`), the
    defaults are [norm / 8, 2.5 * norm] with `p_mean = log(norm / 2)`. For d_model=256 that
    is [1, 20] and p_mean = ln 4. Leave them as None to derive them from d_model.

    `prefix_cache` makes a generation hop cheap. A block runs K steps per request over the same
    clean prefix, and by default every step recomputes the prefix rows through every layer,
    because they attend to the target rows and every layer's adaptive norms modulate them by the
    noise level, which changes each step. With it on, prefix rows attend to prefix rows alone
    and their norms are plain (zero scale and shift, what a new layer computes), so their keys
    and values depend on the prefix alone: a request encodes them once (`Denoiser.encode_prefix`)
    and each step runs only the G target rows. Target rows still read everything. The cost is
    what the prefix can no longer express: nothing of it is computed in the light of the noisy
    target (docs/decisions.md has the measured price).
    """

    prefix_len: Length = 16  # P: clean units the model conditions on (about 64 bytes of the built-in text)
    gen_len: Length = 8  # G: units written at once by one pass through the blocks (about 32 bytes)
    d_model: Annotated[int, Field(ge=1, le=16384)] = 256  # width of every layer and of the target codebook
    n_heads: Annotated[int, Field(ge=1, le=1024)] = 4
    n_layers: Annotated[int, Field(ge=1, le=4096)] = 8  # L: layers of the whole model, split evenly among the blocks
    n_blocks: Annotated[int, Field(ge=1, le=MAX_BLOCKS)] = 4  # B
    mlp_ratio: Annotated[int, Field(ge=1, le=64)] = 4
    sigma_data: Sigma = 0.5  # RMS of a codebook row
    sigma_min: Sigma | None = None
    sigma_max: Sigma | None = None
    p_mean: Annotated[float, Field(allow_inf_nan=False)] | None = None  # mean of log sigma during training
    p_std: Sigma = 1.0  # std of log sigma during training
    # mass by which each block's training interval is widened on each side
    block_overlap: Annotated[float, Field(ge=0, lt=0.5)] = 0.05
    codebook_seed: Annotated[int, Field(ge=0, lt=2**63)] = 0  # the codebook is derived from this, never trained
    family: Literal[FAMILIES] = FAMILIES[0]  # "masked" (absorbing-state) or "gaussian" (EDM in embedding space)
    prefix_cache: bool = False  # prefix rows blind to the target and the noise level: a request encodes them once
    # units: the tokenizer's, or 256 for raw bytes
    vocab_size: Annotated[int, Field(ge=BYTE_VOCAB, le=MAX_VOCAB)] = 8192
    tokenizer: Sha256 | None = BUILTIN_TOKENIZER  # sha256 of the tokenizer.json (units.py); None for raw bytes
    tie_embeddings: bool = True  # masked family: one table embeds the prefix and the target and is the head

    def __post_init__(self) -> None:
        check_fields({f.name: getattr(self, f.name) for f in fields(self)})
        norm = self.sigma_data * math.sqrt(self.d_model)
        if self.sigma_min is None:
            object.__setattr__(self, "sigma_min", norm / 8)
        if self.sigma_max is None:
            object.__setattr__(self, "sigma_max", 2.5 * norm)
        if self.p_mean is None:
            object.__setattr__(self, "p_mean", math.log(norm / 2))
        self._validate()

    def _validate(self) -> None:
        """What no single field's type and range says (those `check_fields` checked)."""
        checks = [
            (self.d_model % self.n_heads == 0, "d_model must be a multiple of n_heads"),
            (self.n_layers % self.n_blocks == 0, "n_layers must be a multiple of n_blocks"),
            (self.sigma_min < self.sigma_max, "need 0 < sigma_min < sigma_max"),
            (self.tokenizer is not None or self.vocab_size == BYTE_VOCAB, "raw bytes (no tokenizer) have 256 units"),
            (not self.tie_embeddings or self.family == "masked", "tie_embeddings needs the masked family"),
        ]
        for ok, message in checks:
            if not ok:
                raise SwarmError(f"invalid model config: {message}")

    @property
    def layers_per_block(self) -> int:
        return self.n_layers // self.n_blocks

    @property
    def seq_len(self) -> int:
        return self.prefix_len + self.gen_len

    @property
    def mask_id(self) -> int:
        """The masked family's extra input unit: "this unit is hidden"."""
        return self.vocab_size

    def units(self, folder: str | Path | None = None) -> Units:
        """This model's units (units.py): raw bytes, or its tokenizer, found by its hash here or in
        `folder` (a model folder); SwarmError if the tokenizer is nowhere on this machine."""
        return units_for(self.tokenizer, self.vocab_size, folder)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ModelConfig:
        """The config whose fields `data` holds; SwarmError (one line) on a value of the wrong type
        or out of range, or an unknown field (`CONFIG_SCHEMA`). Values are kept as written (an int
        where a float may be stays an int), so the config's hash is what it was before the schema."""
        if not isinstance(data, dict):
            raise SwarmError("model config must be a mapping of fields")
        check_fields(data)
        return cls(**data)

    @classmethod
    def from_json_file(cls, path: str | Path | None) -> ModelConfig:
        """The config in a JSON file, or the built-in default when no file is given; SwarmError
        (one line) if the file cannot be read or does not hold a valid config.

        The file is a config's fields, or a model folder's config.json (its "model" entry): a
        fetched model's config starts a swarm of the same model. A tokenizer.json beside the file
        is the config's tokenizer if it hashes to the config's `tokenizer` (units.py)."""
        if path is None:
            return cls()
        try:
            data = json.loads(Path(path).read_text())
        except OSError as error:
            raise SwarmError(f"cannot read model config {path}: {error.strerror}") from None
        except ValueError:
            raise SwarmError(f"model config {path} is not valid JSON") from None
        if not isinstance(data, dict):
            raise SwarmError(f"model config {path} must be a JSON object")
        if "kind" in data and isinstance(data.get("model"), dict):  # a model folder's config.json
            data = data["model"]
        config = cls.from_dict(data)
        if config.tokenizer is not None:
            find_tokenizer(config.tokenizer, Path(path).parent)
        return config

    def hash(self) -> str:
        """A stable hash of the config (its family included): peers compare it before they train together.

        A field added since checkpoints were first written counts only when it is set away from
        its default, so every config written before it keeps its hash (and its checkpoints load).
        """
        data = {k: v for k, v in self.to_dict().items() if k not in LATER_FIELDS or v != LATER_FIELDS[k]}
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def block_slice(self, block: int, widened: bool = False) -> tuple[float, float]:
        """(lo, hi): the share of the training noise distribution's mass that block `block` owns,
        as mass fractions in [0, 1] (0 at the least noise); block 0 owns the most noise. Widened
        adds `block_overlap` of mass on each side (within [0, 1]): the slice a block trains on."""
        lo, hi = 1 - (block + 1) / self.n_blocks, 1 - block / self.n_blocks
        if widened:
            lo, hi = max(0.0, lo - self.block_overlap), min(1.0, hi + self.block_overlap)
        return lo, hi


# The config's schema, made from ModelConfig's own annotated fields: strict types (no 4.0 for an int,
# no "4" or true for a number; an int is a float's value as well), their ranges, and no unknown field.
_TYPES = get_type_hints(ModelConfig, include_extras=True)
CONFIG_SCHEMA: type[BaseModel] = create_model(
    "ModelConfigSchema",
    __config__=ConfigDict(strict=True, extra="forbid"),
    **{f.name: (_TYPES[f.name], f.default) for f in fields(ModelConfig)},
)


def check_fields(data: dict) -> None:
    """SwarmError (one line: the first problem, and how many more) unless `data` passes `CONFIG_SCHEMA`."""
    try:
        CONFIG_SCHEMA.model_validate(data)
    except ValidationError as error:
        problems = error.errors()
        unknown = sorted(str(p["loc"][0]) for p in problems if p["type"] == "extra_forbidden")
        if unknown:
            raise SwarmError(f"model config has unknown fields: {unknown}") from None
        first, more = problems[0], f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        field = ".".join(str(part) for part in first["loc"])
        message = first["msg"][0].lower() + first["msg"][1:]
        raise SwarmError(f"invalid model config: {field}: {message}, not {first['input']!r}{more}") from None


KeysValues = tuple[torch.Tensor, torch.Tensor]  # one layer's keys (rotated) and values, (N, heads, rows, head dim)


class TransformerLayer(nn.Module):
    """Pre-norm attention + MLP layer; with `conditioned`, the norms are adaptive (adaLN).

    The adaptive scale and shift come from the noise embedding and start at zero, so a new
    layer behaves like a plain pre-norm layer. With `checkpoint_activations` (a trainer's
    setting, `set_activation_checkpointing`; not part of the config or the weights), a training
    pass keeps only the inputs of its attention and its MLP and recomputes the rest in the
    backward pass (`_part`).
    """

    def __init__(self, d_model: int, n_heads: int, mlp_ratio: int, conditioned: bool, causal: bool = False):
        super().__init__()
        self.n_heads, self.causal = n_heads, causal
        self.norm1 = nn.LayerNorm(d_model, elementwise_affine=not conditioned)
        self.norm2 = nn.LayerNorm(d_model, elementwise_affine=not conditioned)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, mlp_ratio * d_model), nn.GELU(), nn.Linear(mlp_ratio * d_model, d_model)
        )
        self.modulation = nn.Linear(d_model, 4 * d_model) if conditioned else None
        if self.modulation is not None:
            nn.init.zeros_(self.modulation.weight)
            nn.init.zeros_(self.modulation.bias)
        self.checkpoint_activations = False

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        """The layer over rows x (N, T, d): `run`'s rows alone (its arguments, the same)."""
        return self.run(x, *args, **kwargs)[0]

    def run(
        self,
        x: torch.Tensor,
        cond: torch.Tensor | None = None,
        plain_rows: int = 0,
        mask: torch.Tensor | None = None,
        past: KeysValues | None = None,
    ) -> tuple[torch.Tensor, KeysValues]:
        """(x after the layer, the keys and values of x's rows).

        Args:
            cond: the noise embedding (N, d) the adaptive norms read; None gives plain norms.
            plain_rows: how many leading rows get plain norms all the same (a cacheable prefix).
            mask: boolean attention mask (T, T), True where a row may attend.
            past: keys and values of earlier rows that x's rows attend to as well; x's positions
                start after theirs.
        """
        scale1, shift1, scale2, shift2 = self._modulation(cond, x.shape[1], plain_rows)
        attended, keys_values = self._part(self._attention, x, scale1, shift1, mask, past)
        x = x + attended
        return x + self._part(self._feed_forward, x, scale2, shift2), keys_values

    def _part(self, part: Callable[..., Any], *args: Any) -> Any:
        """part(*args); with `checkpoint_activations`, in training with gradients on, recomputed in
        the backward pass instead of kept: the same gradients (the layer draws nothing at random)
        for about one more forward pass of time. Attention and the MLP are recomputed apart, so
        the backward pass holds the activations of one of them at a time, not of the whole layer
        (measured at d_model 1024: 271 MB for a whole layer). Evaluation and serving run plainly."""
        if self.checkpoint_activations and self.training and torch.is_grad_enabled():
            return checkpoint(part, *args, use_reentrant=False, preserve_rng_state=False)
        return part(*args)

    def _feed_forward(self, x: torch.Tensor, scale: torch.Tensor | None, shift: torch.Tensor | None) -> torch.Tensor:
        return self.mlp(modulate(self.norm2(x), scale, shift))

    def _modulation(self, cond: torch.Tensor | None, rows: int, plain_rows: int) -> tuple:
        """(scale1, shift1, scale2, shift2), each (N, 1 or T, d), or four Nones for plain norms."""
        if self.modulation is None or cond is None:
            return None, None, None, None
        modulation = self.modulation(cond).unsqueeze(1)
        if plain_rows:
            modulation = modulation * (torch.arange(rows, device=cond.device) >= plain_rows)[:, None]
        return modulation.chunk(4, dim=-1)

    def _attention(
        self,
        x: torch.Tensor,
        scale: torch.Tensor | None,
        shift: torch.Tensor | None,
        mask: torch.Tensor | None,
        past: KeysValues | None,
    ) -> tuple[torch.Tensor, KeysValues]:
        x = modulate(self.norm1(x), scale, shift)
        n, t, d = x.shape
        q, k, v = self.qkv(x).view(n, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        start = 0 if past is None else past[0].shape[2]
        q, k = rotate(q, start), rotate(k, start)
        keys, values = (k, v) if past is None else (torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2))
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=self.causal)
        return self.proj(out.transpose(1, 2).reshape(n, t, d)), (k, v)


def set_activation_checkpointing(module: nn.Module, on: bool) -> None:
    """Every transformer layer of `module` recomputes its activations in the backward pass (on) or keeps them.

    Why: a training step's peak memory beyond the weights, gradients and AdamW state is the
    activations every layer keeps for the backward pass; with this on, a layer keeps only the
    inputs of its attention and its MLP, and the backward pass holds the activations of one of
    them at a time (`TransformerLayer._part`); benchmarks/scale.py measures what it saves. A
    setting of the trainer, not of the model: it changes no weight and no result, so the config
    (and its hash) does not hold it.
    """
    for layer in module.modules():
        if isinstance(layer, TransformerLayer):
            layer.checkpoint_activations = on


def modulate(x: torch.Tensor, scale: torch.Tensor | None, shift: torch.Tensor | None) -> torch.Tensor:
    """adaLN: x * (1 + scale) + shift, or x as it is where there is no modulation."""
    return x if scale is None else x * (1 + scale) + shift


def rotate(x: torch.Tensor, start: int = 0, base: float = 10_000.0) -> torch.Tensor:
    """Rotary position embedding (RoPE) of queries or keys (N, heads, T, head dim) at positions
    start, start + 1, ...

    Why: with learned absolute positions alone, a bidirectional stack must learn from random
    position vectors which position is a byte's neighbour. Measured on 2 cores (d=128, one
    block of 2 layers, mask rates up to 0.3): on a rule where each byte is its left neighbour
    plus one, the loss after 100 steps was 3.04 nats without rotation and 0.25 with it; on
    text, a hidden byte among 90% visible ones stayed at the unigram entropy (3.0 nats) for
    200 steps without it, and reached 2.81 in 150 with it (2.96 with learned positions added
    as well, which is why there are none). Rotation makes attention a function of the
    distance between positions from the first step.
    """
    half = x.shape[-1] // 2
    frequencies = base ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    positions = torch.arange(start, start + x.shape[-2], device=x.device, dtype=torch.float32)
    angles = positions[:, None] * frequencies
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


class NoiseEmbedding(nn.Module):
    """Maps the noise feature c_noise (about [0, 1] for either family) to a d_model vector
    through Fourier features and an MLP."""

    def __init__(self, d_model: int, n_frequencies: int = 32):
        super().__init__()
        self.register_buffer("frequencies", torch.arange(1, n_frequencies + 1) * math.pi, persistent=False)
        self.mlp = nn.Sequential(nn.Linear(2 * n_frequencies, d_model), nn.SiLU(), nn.Linear(d_model, d_model))

    def forward(self, c_noise: torch.Tensor) -> torch.Tensor:
        angles = c_noise[:, None] * self.frequencies
        return self.mlp(torch.cat([angles.sin(), angles.cos()], dim=-1))


class EmbeddingInput(nn.Linear):
    """Gaussian family: the noisy target embedding z at noise level sigma, preconditioned EDM-style.

    The network sees c_in * z with c_in = 1 / sqrt(sigma^2 + sigma_data^2), and the level as
    c_noise = log(sigma) / 4.
    """

    def __init__(self, config: ModelConfig):
        super().__init__(config.d_model, config.d_model)
        self.sigma_data = config.sigma_data

    def forward(self, z: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        c_in = (sigma**2 + self.sigma_data**2).rsqrt()[:, None, None]
        return super().forward(c_in * z.to(self.weight.dtype))

    @staticmethod
    def c_noise(sigma: torch.Tensor) -> torch.Tensor:
        return sigma.log() / 4


class MaskedInput(nn.Embedding):
    """Masked family: target unit ids, `config.mask_id` where hidden; the level is the mask rate t itself.

    Its vocab_size + 1 rows (the mask's included) are the block's own, like every other weight of
    it. With `tie_embeddings` its first vocab_size rows also embed the prefix and are the head.
    """

    def __init__(self, config: ModelConfig):
        super().__init__(config.vocab_size + 1, config.d_model)

    def forward(self, ids: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return super().forward(ids)

    @staticmethod
    def c_noise(t: torch.Tensor) -> torch.Tensor:
        return t


TARGET_INPUTS = {"gaussian": EmbeddingInput, "masked": MaskedInput}


class Denoiser(nn.Module):
    """D(prefix, target, level) -> logits over the vocabulary's units at each of the G target positions.

    `target` and `level` are the family's (see the module docstring); the target-input module
    turns them into the target positions' input and the noise feature that conditions every
    layer through adaptive layer norm. Attention knows the distance between positions (rotary
    embeddings, `rotate`) and nothing else of them: the prefix and the target have embeddings
    of their own, so where the target starts is in the content.

    With `tie_embeddings` (masked family) the target input's table embeds the prefix too and its
    transpose is the head (`head_bias` alone is the head's own): a vocabulary of thousands of
    units costs one table a block instead of three, which is what lets the demo's start model
    ship at a few tens of MB (GPT-2 ties its input and output embeddings the same way).
    """

    def __init__(self, config: ModelConfig, n_layers: int):
        super().__init__()
        d, tied = config.d_model, config.tie_embeddings
        self.config = config
        self.prefix_embed = None if tied else nn.Embedding(config.vocab_size, d)
        self.input_proj = TARGET_INPUTS[config.family](config)
        self.noise_embed = NoiseEmbedding(d)
        self.layers = nn.ModuleList(
            TransformerLayer(d, config.n_heads, config.mlp_ratio, conditioned=True) for _ in range(n_layers)
        )
        self.norm_out = nn.LayerNorm(d)
        self.head = None if tied else nn.Linear(d, config.vocab_size)
        self.head_bias = nn.Parameter(torch.zeros(config.vocab_size)) if tied else None
        self._init_embeddings()

    def _init_embeddings(self) -> None:
        """Unit embeddings start small (std 0.02, as GPT-2's), not at torch's N(0, 1).

        Measured here before rotary embeddings, beside learned position embeddings of std
        0.02: at N(0, 1) the content drowned the positions and a copy task stayed at loss 4.5
        of 5.7 for 300 steps. Kept with rotary embeddings; not measured again since.
        """
        for table in (self.prefix_embed, self.input_proj):
            if isinstance(table, nn.Embedding):
                nn.init.normal_(table.weight, std=0.02)

    def embed_prefix(self, prefix: torch.Tensor) -> torch.Tensor:
        if self.prefix_embed is None:
            return F.embedding(prefix, self.input_proj.weight)
        return self.prefix_embed(prefix)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The head over the final rows x (N, T, d): (N, T, vocab_size)."""
        x = self.norm_out(x)
        if self.head is None:
            return F.linear(x, self.input_proj.weight[: self.config.vocab_size], self.head_bias)
        return self.head(x)

    def forward(
        self, prefix: torch.Tensor, target: torch.Tensor, level: torch.Tensor, cache: PrefixCache | None = None
    ) -> torch.Tensor:
        """prefix: (N, P) int64 bytes; target: (N, G, d) noisy embeddings or (N, G) int64 ids; level: (N,).

        With `cache` (`encode_prefix(prefix)`) only the target rows run, over the cached prefix's
        keys and values: the same logits as without it, to rounding. Noise levels and embeddings
        are drawn in float32 wherever the block runs; they are taken into the block's own dtype
        here, so a block in another dtype needs nothing of its callers.
        """
        level = level.to(self.norm_out.weight.dtype)
        cond = self.noise_embed(self.input_proj.c_noise(level))
        x = self.input_proj(target, level)
        if cache is not None:
            for layer, past in zip(self.layers, cache.keys_values):
                x = layer(x, cond, past=past)
            return self.logits(x)
        x = torch.cat([self.embed_prefix(prefix), x], dim=1)
        if self.config.prefix_cache:
            plain_rows, mask = self.config.prefix_len, self._prefix_mask(x.device)
        else:
            plain_rows, mask = 0, None
        for layer in self.layers:
            x = layer(x, cond, plain_rows, mask)
        return self.logits(x[:, self.config.prefix_len :])

    def encode_prefix(self, prefix: torch.Tensor) -> PrefixCache:
        """Every layer's keys and values of the prefix rows (N, P): what a request's K steps share.

        Only a config with `prefix_cache` has them: elsewhere the prefix rows read the target.
        """
        if not self.config.prefix_cache:
            raise ValueError("this model's prefix rows read the target: its config has no prefix_cache")
        x, keys_values = self.embed_prefix(prefix), []
        for layer in self.layers:
            x, layer_keys_values = layer.run(x)
            keys_values.append(layer_keys_values)
        return PrefixCache(keys_values)

    def _prefix_mask(self, device: torch.device) -> torch.Tensor:
        """(T, T), True where a row may attend: a prefix row to prefix rows, a target row to all."""
        position = torch.arange(self.config.seq_len, device=device)
        return (position[:, None] >= self.config.prefix_len) | (position[None, :] < self.config.prefix_len)


@dataclass(frozen=True)
class PrefixCache:
    """One request's clean prefix, encoded once (`Denoiser.encode_prefix`): each layer's keys and values."""

    keys_values: list[KeysValues]


def over_prefix(
    denoiser: Denoiser, prefix: torch.Tensor, steps: int
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """D(target, level) for one request's prefix: what a block's `steps` steps call. With the
    config's `prefix_cache` and more than one step, the prefix is encoded here, once, and each step
    runs the target rows alone. One step has nothing to share: an encoding and a target-only pass
    cost a little more than the full forward (P + G rows against P, then G)."""
    if not denoiser.config.prefix_cache or steps < 2:
        return lambda target, level: denoiser(prefix, target, level)
    cache = denoiser.encode_prefix(prefix)
    return lambda target, level: denoiser(prefix, target, level, cache)


def build_block(config: ModelConfig, block: int) -> Denoiser:
    """One block of the swarm: a denoiser of L/B layers. Raises SwarmError for a bad index."""
    if not 0 <= block < config.n_blocks:
        raise SwarmError(f"block index {block} is out of range: this model has blocks 0..{config.n_blocks - 1}")
    return Denoiser(config, config.layers_per_block)


def build_end_to_end(config: ModelConfig) -> Denoiser:
    """The end-to-end baseline: all L layers as one denoiser over the whole noise range."""
    return Denoiser(config, config.n_layers)


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
