"""Which units a results file's model counted in: a model recorded without a `tokenizer` was measured
on raw bytes, before the model moved to subword tokens (issue 44), and its figures await a rerun.

Decided from the file alone, so that a rerun (whose config records its tokenizer) clears the line.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from .formatting import plain

UNIT_FIELDS = ("prefix_len", "gen_len")  # counted in units: bytes then, tokens now
SHAPE_FIELDS = ("d_model", "n_layers", "layers_per_block", "n_blocks", "n_heads")  # where a file records no units


def models(data: Any) -> Iterator[dict]:
    """Every JSON object in a results file that describes a model measured (one with `d_model`)."""
    if isinstance(data, dict):
        if "d_model" in data:
            yield data
            return
        data = list(data.values())
    if isinstance(data, list):
        for value in data:
            yield from models(value)


def byte_model_line(files: Iterable[Any]) -> str:
    """The line saying a section's results were measured on the byte-level model, naming what they
    record of it; "" where every model they record has its tokenizer."""
    old = [model for data in files for model in models(data) if "tokenizer" not in model]
    if not old:
        return ""
    fields = [f for f in UNIT_FIELDS if any(f in m for m in old)]
    fields = fields or [f for f in SHAPE_FIELDS if any(f in m for m in old)]
    values = {f: list(dict.fromkeys(m[f] for m in old if f in m)) for f in fields}
    named = ", ".join(f"`{f}` {plain(v)}" for f, v in values.items()) + (" bytes" if fields[0] in UNIT_FIELDS else "")
    return (f"Measured on the old byte-level model, before subword tokens (issue 44): its results record a model with "
            f"no `tokenizer` ({named}). These figures await a rerun.")
