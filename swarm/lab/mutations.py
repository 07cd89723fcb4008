"""Seeded mutations of valid messages: the inputs a fuzzer sends (fuzz.py, benchmarks/fuzz.py).

Two levels, as a hostile peer has them:
- bytes (`Mutator.of_bytes`): random bytes, bit flips, truncation, extension, and a huge length
  prefix spliced in (a msgpack string, bytes, array or map header, a protobuf field or a stream
  frame that announces gigabytes and brings a few bytes);
- values (`Mutator.of_value`): the decoded fields of a message (a msgpack map) with one field
  dropped, added, or set to a value of the wrong type, out of range (the edges of int64 and
  uint64, negative, NaN, inf), huge (a string or byte string of up to `huge_bytes`), or nested
  deeper than any reader should follow;
- envelopes (`Mutator.of_envelope`): a hivemind request or reply (`ExpertRequest` and kin) with its
  metadata mutated as a message, or a tensor added, dropped or replaced: by one of the wrong
  dtype or shape, holding NaN, inf or values out of range, or by a serialized tensor whose dtype,
  shape, codec or buffer lies.
`of_message` and `of_envelope` pick a level at random and return bytes. Every draw comes from
one `random.Random(seed)`, so a run is repeated exactly by its seed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import msgpack
import torch
from google.protobuf.message import Message as Protobuf
from hivemind.compression import serialize_torch_tensor
from hivemind.proto import runtime_pb2

# headers that announce about 4 GiB: msgpack str32, bin32, array32, map32; a protobuf field 1 of
# length 2^35; a stream frame (hivemind's marker byte and 8-byte length)
HUGE_PREFIXES = (b"\xdb\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff", b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff",
                 b"\x0a\x80\x80\x80\x80\x80\x01", b"\x00\xff\xff\xff\xff\xff\xff\xff\x7f")  # fmt: skip
EDGE_INTS = (-1, 0, 1, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, -(2**31), -(2**63))
EDGE_FLOATS = (math.nan, math.inf, -math.inf, -0.0, 1e308, -1e308, 5e-324, 1e-45)
DTYPES = (
    "",
    "object",
    "float64",
    "float16",
    "bfloat16",
    "int8",
    "uint8",
    "bool",
    "complex64",
    "V3",
    "<U4",
    "int64",
    "float32",
    "(1000000000,)f8",
    "float#2",
)  # what a tensor's dtype field may say: numpy's, torch's, nonsense
DEEP = 400  # nesting of a deep value: below msgpack's packing limit (511), far above any message of ours
WRONG_TYPES: tuple[object, ...] = (None, True, False, "", "x", b"", b"\x00", [], {}, [1, 2], {"a": 1}, 0.5, -7)


def packed(value: object) -> bytes:
    """msgpack, as our messages are written."""
    return msgpack.packb(value, use_bin_type=True)


class Mutator:
    """Mutations of valid messages, drawn from one seeded random generator (module docstring)."""

    def __init__(self, seed: int = 0, huge_bytes: int = 64 * 1024):
        """`huge_bytes`: the length of a huge string or byte string, and the most random bytes drawn."""
        self.rng, self.huge_bytes = random.Random(seed), huge_bytes

    def _random_bytes(self, most: int) -> bytes:
        return self.rng.randbytes(self.rng.randint(0, most))

    def of_bytes(self, data: bytes) -> tuple[str, bytes]:
        """(the strategy, `data` mutated by it)."""
        strategy = self.rng.choice(("random bytes", "bit flips", "truncation", "extension", "huge length prefix"))
        return strategy, _BYTE_MUTATIONS[strategy](self, data)

    def _bit_flips(self, data: bytes) -> bytes:
        if not data:
            return self.rng.randbytes(1)
        flipped = bytearray(data)
        for _ in range(self.rng.randint(1, 8)):
            bit = self.rng.randrange(8 * len(flipped))
            flipped[bit // 8] ^= 1 << (bit % 8)
        return bytes(flipped)

    def _truncation(self, data: bytes) -> bytes:
        return data[: self.rng.randrange(len(data))] if data else data

    def _extension(self, data: bytes) -> bytes:
        tail = data * self.rng.randint(1, 4) if self.rng.random() < 0.3 else self._random_bytes(256)
        return data + tail

    def _huge_prefix(self, data: bytes) -> bytes:
        at = self.rng.randint(0, len(data))
        return data[:at] + self.rng.choice(HUGE_PREFIXES) + data[at:]

    def bad_value(self, old: object) -> object:
        """A value that should not be where `old` was: of another type, out of range, huge or deep."""
        kind = self.rng.choice(("wrong type", "edge int", "edge float", "huge", "deep"))
        if kind == "edge int":
            return self.rng.choice(EDGE_INTS)
        if kind == "edge float":
            return self.rng.choice(EDGE_FLOATS)
        if kind == "huge":
            size = self.rng.randint(self.huge_bytes // 2, self.huge_bytes)
            return self.rng.choice(
                ("x" * size, b"\xff" * size, [0] * (size // 8), {str(i): i for i in range(size // 64)})
            )
        if kind == "deep":
            value: object = old
            for _ in range(self.rng.randint(DEEP // 2, DEEP)):
                value = [value] if self.rng.random() < 0.5 else {"a": value}
            return value
        return self.rng.choice([v for v in WRONG_TYPES if type(v) is not type(old)])

    def of_value(self, value: object) -> object:
        """`value` with one part changed: in a map, a field set to a bad value, dropped or added; in
        a list, an element; anything else replaced by a bad value."""
        if isinstance(value, dict) and value:
            changed, key = dict(value), self.rng.choice(list(value))
            action = self.rng.random()
            if action < 0.15:
                del changed[key]
            elif action < 0.25:
                changed[self.rng.choice(("", "zz", key + "_"))] = self.bad_value(None)
            elif action < 0.45 and isinstance(value[key], (dict, list)):
                changed[key] = self.of_value(value[key])  # deeper: a nested record's field
            else:
                changed[key] = self.bad_value(value[key])
            return changed
        if isinstance(value, list) and value:
            changed_list, at = list(value), self.rng.randrange(len(value))
            changed_list[at] = self.of_value(value[at]) if self.rng.random() < 0.5 else self.bad_value(value[at])
            return changed_list
        return self.bad_value(value)

    def of_message(self, fields: dict, pack: Callable[[object], bytes] = packed) -> tuple[str, bytes]:
        """The bytes of `fields` (as `pack` writes them: msgpack by default) mutated: as values
        (`of_value`), or as bytes (`of_bytes`)."""
        if self.rng.random() < 0.5:
            try:
                return "value", pack(self.of_value(fields))
            except (ValueError, OverflowError, TypeError):  # a value `pack` cannot write: mutate the bytes instead
                pass
        return self.of_bytes(pack(fields))

    def of_envelope(self, envelope: Protobuf) -> tuple[str, bytes]:
        """The bytes of a hivemind envelope (a protobuf with `metadata` and maybe `tensors`), mutated:
        as bytes, in its metadata (as a message), or in its tensors (where it carries some: a handler
        that takes none ignores them)."""
        choice = self.rng.random()
        has_tensors = "tensors" in envelope.DESCRIPTOR.fields_by_name and len(envelope.tensors) > 0
        if choice < 0.3 or not hasattr(envelope, "metadata"):
            return self.of_bytes(envelope.SerializeToString())
        changed = type(envelope)()
        changed.CopyFrom(envelope)
        if choice < 0.6 or not has_tensors:
            strategy, changed.metadata = self.of_message(_fields_of(envelope.metadata))
            return f"metadata: {strategy}", changed.SerializeToString()
        strategy = self._tensors(changed.tensors)
        return f"tensors: {strategy}", changed.SerializeToString()

    def _tensors(self, tensors) -> str:
        """Change a repeated field of serialized tensors in place; the strategy used."""
        kind = self.rng.choice(("drop", "add", "bad values", "wrong shape", "lying fields"))
        if kind == "drop" and len(tensors):
            del tensors[self.rng.randrange(len(tensors))]
            return kind
        if kind == "add" or not len(tensors):
            tensors.add().CopyFrom(serialize_torch_tensor(torch.zeros(self.rng.randint(0, 4))))
            return "add"
        at = self.rng.randrange(len(tensors))
        tensor = tensors[at]
        if kind == "lying fields":
            self._lie(tensor)
            return kind
        shape = list(tensor.size) or [1]
        if kind == "wrong shape":
            where = self.rng.randrange(len(shape))
            shape[where] = self.rng.choice((0, 1, shape[where] + 1, 65, 1000))
            if self.rng.random() < 0.3:
                shape.append(self.rng.choice((1, 2)))
        values = torch.full(shape, self.rng.choice((*EDGE_FLOATS, *map(float, EDGE_INTS))), dtype=torch.float64)
        dtype = self.rng.choice((torch.float32, torch.int64, torch.float16, torch.int32, torch.bool))
        tensors[at].CopyFrom(serialize_torch_tensor(values.to(dtype)))
        return kind

    def _lie(self, tensor: runtime_pb2.Tensor) -> None:
        """One field of a serialized tensor says something its other fields do not."""
        field = self.rng.choice(("dtype", "size", "buffer", "compression", "requires_grad"))
        if field == "dtype":
            tensor.dtype = self.rng.choice(DTYPES)
        elif field == "size":
            del tensor.size[:]
            tensor.size.extend(self.rng.choice((0, 1, 7, 2**20, 2**32 - 1)) for _ in range(self.rng.randint(0, 5)))
        elif field == "buffer":
            tensor.buffer = self.of_bytes(tensor.buffer)[1][: self.huge_bytes]
        elif field == "compression":
            tensor.compression = self.rng.randrange(len(runtime_pb2.CompressionType.keys()))
        else:
            tensor.requires_grad = True


def _fields_of(metadata: bytes) -> dict:
    """A message's fields, for value mutations ({} for metadata that is not a msgpack map)."""
    try:
        fields = msgpack.unpackb(metadata, raw=False)
    except Exception:  # noqa: BLE001 (msgpack raises several types on garbage)
        return {}
    return fields if isinstance(fields, dict) else {}


_BYTE_MUTATIONS: dict[str, Callable[[Mutator, bytes], bytes]] = {
    "random bytes": lambda m, data: m._random_bytes(max(64, min(2 * len(data) + 16, m.huge_bytes))),
    "bit flips": Mutator._bit_flips,
    "truncation": Mutator._truncation,
    "extension": Mutator._extension,
    "huge length prefix": Mutator._huge_prefix,
}
