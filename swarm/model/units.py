"""The model's units: raw bytes, or the subword tokens of a byte-level BPE pinned by the config.

A model reads and writes units. Measured here at equal CPU time, a byte-level BPE of a few
thousand tokens cut bits per byte by about 40% against raw bytes, for masked-diffusion blocks
and the autoregressive baseline alike (docs/decisions.md), so the built-in model uses one.

A tokenizer belongs to the model: it is trained once by the swarm's creator, and the config
names it by the sha256 of its `tokenizer.json` (`ModelConfig.tokenizer`), so the config hash
covers it. Peers and clients never train their own (BPE training is not bit-reproducible across
machines); they get the file from a model folder, the package (the built-in one), this machine's
cache, or a peer of the swarm, and `add_tokenizer` believes a file only if its hash is the one
the config names. Every model folder carries its `tokenizer.json`.

Byte-level BPE maps every byte to a unit of its 256-symbol alphabet before merging, so any UTF-8
text round-trips: `decode(encode(text)) == text.encode()`. A unit decodes to bytes, not to
characters, because a span's last unit may end inside a character that the next span finishes.
Likelihoods stay in bits per byte of text: a window's units know how many bytes they stand for
(`byte_lengths`).

Bytes (`tokenizer` None, 256 units) remain for the tests' tiny models, which need no corpus to
train a tokenizer on, and for the models and checkpoints written before tokens.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterable
from functools import cached_property
from pathlib import Path
from typing import Protocol

import torch

from swarm.errors import SwarmError
from swarm.files import write_atomic

logger = logging.getLogger(__name__)

BYTE_VOCAB = 256
TOKENIZER_FILE = "tokenizer.json"  # a model folder's tokenizer, by that name
BUILTIN_FOLDER = Path(__file__).parent / "tokenizers"  # shipped tokenizers, each named <sha256>.json
MAX_TOKENIZER_BYTES = 1536 * 1024  # a tokenizer file from anywhere is refused above this: it travels in one P2P message
MAX_VOCAB = 65536  # units are stored as int32 and sent as int64; embeddings bound the rest


class Units(Protocol):
    """What a model needs of its units."""

    vocab_size: int
    sha256: str | None

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Iterable[int]) -> bytes: ...

    @property
    def byte_lengths(self) -> torch.Tensor: ...


class ByteUnits:
    """Raw UTF-8 bytes: 256 units, no tokenizer."""

    vocab_size = BYTE_VOCAB
    sha256 = None

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int]) -> bytes:
        return bytes(int(i) for i in ids)

    @cached_property
    def byte_lengths(self) -> torch.Tensor:
        return torch.ones(BYTE_VOCAB, dtype=torch.long)


BYTES = ByteUnits()


def byte_alphabet() -> dict[str, int]:
    """The byte-level BPE alphabet: one printable character per byte value, as GPT-2 defined it
    (printable Latin-1 bytes stand for themselves; the others are shifted past 255)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(256) if b not in kept]
    table = {chr(b): b for b in kept}
    table.update({chr(256 + n): b for n, b in enumerate(shifted)})
    return table


class TokenUnits:
    """A byte-level BPE tokenizer (HF `tokenizers`) read from its JSON file."""

    def __init__(self, data: bytes):
        from tokenizers import Tokenizer  # only models with a tokenizer need the package loaded

        if len(data) > MAX_TOKENIZER_BYTES:
            raise SwarmError(f"a tokenizer file is at most {MAX_TOKENIZER_BYTES} bytes; this one has {len(data)}")
        try:
            self.tokenizer = Tokenizer.from_str(data.decode("utf-8"))
        except Exception as error:  # tokenizers raises its own exception types for a bad file
            raise SwarmError(f"not a tokenizer file: {str(error).splitlines()[0] if str(error) else error}") from None
        self.data, self.sha256 = data, hashlib.sha256(data).hexdigest()
        self.vocab_size = self.tokenizer.get_vocab_size()
        self._unit_bytes = self._decode_table()

    def _decode_table(self) -> list[bytes]:
        """Each unit's bytes; SwarmError unless every unit is a string of the byte alphabet and
        every single byte is a unit (so that any text can be encoded)."""
        if not 0 < self.vocab_size <= MAX_VOCAB:
            raise SwarmError(f"a tokenizer has 1 to {MAX_VOCAB} units; this one has {self.vocab_size}")
        alphabet, table = byte_alphabet(), [b""] * self.vocab_size
        for piece, unit in self.tokenizer.get_vocab().items():
            if not 0 <= unit < self.vocab_size or not piece or any(c not in alphabet for c in piece):
                raise SwarmError("not a byte-level tokenizer: a unit is outside the byte alphabet")
            table[unit] = bytes(alphabet[c] for c in piece)
        if not all(table) or not {bytes([b]) for b in range(256)} <= set(table):
            raise SwarmError("not a byte-level tokenizer: some byte is not a unit of its own")
        return table

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> bytes:
        return b"".join(self._unit_bytes[int(i)] for i in ids)

    @cached_property
    def byte_lengths(self) -> torch.Tensor:
        return torch.tensor([len(piece) for piece in self._unit_bytes], dtype=torch.long)


_known: dict[str, TokenUnits] = {}


def cache_folder() -> Path:
    """Where tokenizers fetched from a swarm are kept on this machine: $XDG_CACHE_HOME/blockswarm/tokenizers."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "blockswarm" / "tokenizers"


def add_tokenizer(data: bytes, expected_sha256: str | None = None, keep: bool = True) -> TokenUnits:
    """Believe a tokenizer file: it must parse as a byte-level BPE and, when `expected_sha256` is
    given, hash to it (SwarmError otherwise). With `keep` it is written to this machine's cache,
    so that the next process finds it without asking the swarm."""
    digest = hashlib.sha256(data).hexdigest()
    if expected_sha256 is not None and digest != expected_sha256:
        raise SwarmError(f"the tokenizer's sha256 is {digest[:12]}..., not the model's {expected_sha256[:12]}...")
    if digest not in _known:
        _known[digest] = TokenUnits(data)
    if keep:
        _keep(digest, data)
    return _known[digest]


def _keep(digest: str, data: bytes) -> None:
    path = cache_folder() / f"{digest}.json"
    if path.exists() or (BUILTIN_FOLDER / path.name).exists():
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, data)
    except OSError as error:  # a read-only home loses nothing but a later fetch
        logger.warning("could not keep the tokenizer in %s: %s", path.parent, error.strerror)


def find_tokenizer(sha256: str, folder: str | Path | None = None) -> TokenUnits | None:
    """The tokenizer of this hash from memory, a model folder, the package or this machine's cache;
    None if none of them has it (then ask the swarm: swarm.p2p.tokenizer)."""
    if sha256 in _known:
        return _known[sha256]
    candidates = [BUILTIN_FOLDER / f"{sha256}.json", cache_folder() / f"{sha256}.json"]
    if folder is not None:
        candidates.insert(0, Path(folder) / TOKENIZER_FILE)
    for path in candidates:
        if path.is_file():
            data = path.read_bytes()
            if hashlib.sha256(data).hexdigest() == sha256:
                return add_tokenizer(data, sha256, keep=path.parent != BUILTIN_FOLDER)
            logger.warning("%s is not the tokenizer %s...: ignored", path, sha256[:12])
    return None


def units_for(tokenizer: str | None, vocab_size: int, folder: str | Path | None = None) -> Units:
    """The units a config names (`ModelConfig.units()` calls this); SwarmError if its tokenizer
    is nowhere here, or has another number of units than the config says."""
    if tokenizer is None:
        return BYTES
    units = find_tokenizer(tokenizer, folder)
    if units is None:
        raise SwarmError(
            f"this model's tokenizer ({tokenizer[:12]}...) is not on this machine: "
            "join its swarm, or use a model folder that holds its tokenizer.json"
        )
    if units.vocab_size != vocab_size:
        raise SwarmError(f"the tokenizer has {units.vocab_size} units; the model config says {vocab_size}")
    return units


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> bytes:
    """A byte-level BPE of `vocab_size` units trained on `texts`: the creator's one-time step.
    Returns its tokenizer.json; not bit-reproducible across machines, so ship the file, not the recipe."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if not BYTE_VOCAB <= vocab_size <= MAX_VOCAB:
        raise SwarmError(f"a tokenizer has {BYTE_VOCAB} to {MAX_VOCAB} units, not {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer.to_str().encode("utf-8")
