"""Readability at a glance: the share of written words that are words of the training text.

A word is a run of non-whitespace with the punctuation at its ends stripped, lowercased. A span
of G bytes written after a prefix usually starts and ends inside a word; those two partial
words are left out (for the generated text and the true continuation alike), so a share
counts only words the model wrote whole.

Three guards keep the share honest, all found on models that wrote letter soup. The training
text holds every single letter somewhere ("e" as in "E. coli"), so a model that writes "e ee e"
scored 98%: a single letter counts as a word only if it is "a" or "i". It also holds many short
fragments once or a few times (a name, a foreign word: "es" 8 times in the built-in corpus's
714k words), so soup such as "t caa tat es t at han" still read 57.5%: a word counts only if
the training text holds it at least `MIN_COUNT` times (the built-in corpus then knows 12,190
words of its 49,110, the ones that make up most of its text). And a model that writes "the the
the" is all real words: `distinct` (the share of each span's whole words that differ, averaged
over spans) stands beside the share for that.
"""

from __future__ import annotations

import math
import string
from collections import Counter
from collections.abc import Iterable

import torch

PUNCTUATION = string.punctuation + "\u201c\u201d\u2018\u2019\u2013\u2014"


def words(text: str) -> list[str]:
    """The words of a text: whitespace-separated, end punctuation stripped, lowercased, none empty."""
    stripped = (token.strip(PUNCTUATION).lower() for token in text.split())
    return [word for word in stripped if word]


SINGLE_LETTER_WORDS = frozenset({"a", "i"})
MIN_COUNT = 5  # times a word must occur in the training text to count as a real word


def vocabulary(stream: torch.Tensor, min_count: int = MIN_COUNT) -> frozenset[str]:
    """Every word of a byte stream (the training split's) that counts as a real word: seen at
    least `min_count` times, and longer than one letter unless it is "a" or "i"."""
    counts = Counter(words(bytes(stream.tolist()).decode("utf-8", errors="replace")))
    return frozenset(w for w, n in counts.items() if n >= min_count and (len(w) > 1 or w in SINGLE_LETTER_WORDS))


def whole_words(prefix: bytes, span: bytes) -> list[str]:
    """The words of `span` written whole after `prefix`: a first word that continues the prefix's
    last one, and a last word that runs to the span's end, are left out."""
    tokens = span.decode("utf-8", errors="replace").split()
    if tokens and prefix[-1:].strip() and span[:1].strip():
        tokens = tokens[1:]
    if tokens and span[-1:].strip():
        tokens = tokens[:-1]
    return words(" ".join(tokens))


def real_word_share(prefixes: Iterable[bytes], spans: Iterable[bytes], known: frozenset[str]) -> dict:
    """{'share': the share of whole words written that are known words, 'words': how many were
    counted, 'distinct': the share of each span's whole words that differ, averaged over spans,
    'entropy': the entropy in bits of the words written, pooled over all spans}."""
    per_span = [whole_words(prefix, span) for prefix, span in zip(prefixes, spans)]
    written = [word for span in per_span for word in span]
    share = sum(word in known for word in written) / len(written) if written else 0.0
    spans_with_words = [span for span in per_span if span]
    distinct = sum(len(set(s)) / len(s) for s in spans_with_words) / len(spans_with_words) if spans_with_words else 0.0
    return {"share": share, "words": len(written), "distinct": distinct, "entropy": unigram_entropy(written)}


def unigram_entropy(written: list[str]) -> float:
    """The entropy in bits of the words' frequencies: a text that repeats a few common words
    scores low however real they are (log2 of the count for words all different)."""
    counts = Counter(written)
    total = sum(counts.values())
    return -sum(n / total * math.log2(n / total) for n in counts.values()) if total else 0.0
