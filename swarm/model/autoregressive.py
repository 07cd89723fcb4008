"""The autoregressive baseline: a causal byte transformer with next-byte loss.

It shares the transformer layer with the denoiser (without noise conditioning) and judges
generated text in evaluation (`gen_nll`). It has the config's width, and as many layers as
bring its parameter count closest to the end-to-end denoiser's (its layers lack the
adaptive-norm weights, so it needs a few more of them).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from swarm.model.denoiser import ModelConfig, TransformerLayer, build_end_to_end, count_parameters
from swarm.model.steps import pick_bytes


def matched_depth(config: ModelConfig) -> int:
    """The number of causal layers whose model has about the end-to-end denoiser's parameter count."""
    with torch.device("meta"):
        target = count_parameters(build_end_to_end(config))
        fixed = count_parameters(ByteTransformer(config, n_layers=0))
        per_layer = count_parameters(TransformerLayer(config.d_model, config.n_heads, config.mlp_ratio, False))
    return max(1, round((target - fixed) / per_layer))


class ByteTransformer(nn.Module):
    """Causal transformer over up to P + G bytes: logits for the byte after each position."""

    def __init__(self, config: ModelConfig, n_layers: int | None = None):
        super().__init__()
        d = config.d_model
        n_layers = matched_depth(config) if n_layers is None else n_layers
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, d)
        self.layers = nn.ModuleList(
            TransformerLayer(d, config.n_heads, config.mlp_ratio, conditioned=False, causal=True)
            for _ in range(n_layers)
        )
        self.norm_out = nn.LayerNorm(d)
        tied = config.tie_embeddings  # as the denoisers it is measured against: the embedding is the head
        self.head = None if tied else nn.Linear(d, config.vocab_size)
        self.head_bias = nn.Parameter(torch.zeros(config.vocab_size)) if tied else None
        if tied:
            nn.init.normal_(self.embed.weight, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.logits(x)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The head over the final rows x (N, T, d)."""
        x = self.norm_out(x)
        return self.head(x) if self.head is not None else F.linear(x, self.embed.weight, self.head_bias)


def next_byte_loss(model: ByteTransformer, window: torch.Tensor) -> torch.Tensor:
    """Training loss: cross-entropy of every next byte of the window."""
    logits = model(window[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), window[:, 1:].reshape(-1))


def continuation_nll(model: ByteTransformer, prefix: torch.Tensor, continuation: torch.Tensor) -> torch.Tensor:
    """Per-window mean negative log-likelihood (nats per byte) of `continuation` after `prefix`."""
    tokens = torch.cat([prefix, continuation], dim=1)
    logits = model(tokens[:, :-1])[:, prefix.shape[1] - 1 :]
    nll = F.cross_entropy(logits.transpose(1, 2), continuation, reduction="none")
    return nll.mean(dim=1)


@torch.no_grad()
def generate_bytes(
    model: ByteTransformer, prefix: torch.Tensor, count: int, generator: torch.Generator, temperature: float = 0.0
) -> torch.Tensor:
    """`count` bytes after each prefix (N, P), one byte per forward pass (no KV cache)."""
    tokens = prefix
    for _ in range(count):
        logits = model(tokens[:, -model.config.seq_len :])[:, -1]
        tokens = torch.cat([tokens, pick_bytes(logits, temperature, generator)[:, None]], dim=1)
    return tokens[:, prefix.shape[1] :]
