"""General-purpose compressors as baselines of the model's bits per byte, on the same text.

A language model is a compressor: its bits per byte is what an arithmetic coder driven by it would
spend. So the floor any model of ours must clear is what gzip, bzip2 and xz spend on the same
validation text, and the fair rival of a model that has read the training text is xz after
reading it too: the bits xz adds to the training text's compressed size when the validation text
follows it (its 1.5 GiB dictionary at preset 9 holds both), per byte of validation text.

Measured with Python's own gzip, bz2 and lzma modules, so that every benchmark computes them
beside its models and nobody types them in.
"""

from __future__ import annotations

import bz2
import gzip
import lzma

XZ_PRESET = 9 | lzma.PRESET_EXTREME  # xz -9e


def _bits_per_byte(compressed: int, original: int) -> float:
    return 8 * compressed / original


def compressor_bits_per_byte(validation: bytes, train: bytes | None = None) -> dict[str, float]:
    """{compressor: bits per byte of `validation`}: gzip -9, bzip2 -9, xz -9e, and with `train`,
    xz -9e after reading the training text (`xz_after_train`)."""
    size = len(validation)
    figures = {
        "gzip": _bits_per_byte(len(gzip.compress(validation, compresslevel=9, mtime=0)), size),
        "bzip2": _bits_per_byte(len(bz2.compress(validation, compresslevel=9)), size),
        "xz": _bits_per_byte(len(lzma.compress(validation, preset=XZ_PRESET)), size),
    }
    if train is not None:
        alone = len(lzma.compress(train, preset=XZ_PRESET))
        together = len(lzma.compress(train + validation, preset=XZ_PRESET))
        figures["xz_after_train"] = _bits_per_byte(together - alone, size)
    return figures
