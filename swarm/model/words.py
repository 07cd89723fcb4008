"""Readability at a glance: the share of written words that are words of the training text.

A word is a run of non-whitespace with the punctuation at its ends stripped, lowercased. A span
of G bytes written after a prefix usually starts and ends inside a word; those two partial
words are left out (for the generated text and the true continuation alike), so a share
counts only words the model wrote whole.
"""

from __future__ import annotations

import string
from typing import Iterable

import torch

PUNCTUATION = string.punctuation + "\u201c\u201d\u2018\u2019\u2013\u2014"


def words(text: str) -> list[str]:
    """The words of a text: whitespace-separated, end punctuation stripped, lowercased, none empty."""
    stripped = (token.strip(PUNCTUATION).lower() for token in text.split())
    return [word for word in stripped if word]


def vocabulary(stream: torch.Tensor) -> frozenset[str]:
    """Every word of a byte stream (the training split's): what counts as a real word."""
    return frozenset(words(bytes(stream.tolist()).decode("utf-8", errors="replace")))


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
    """{'share': the share of whole words written that are known words, 'words': how many were counted}."""
    written = [word for prefix, span in zip(prefixes, spans) for word in whole_words(prefix, span)]
    share = sum(word in known for word in written) / len(written) if written else 0.0
    return {"share": share, "words": len(written)}
