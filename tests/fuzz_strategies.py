"""hypothesis strategies the fuzz tests share (test_fuzz.py, test_fuzz_peer.py): what a hostile peer can send."""

from __future__ import annotations

from hypothesis import strategies as st

from swarm.lab.mutations import HUGE_PREFIXES

# any value msgpack can carry: what a peer can put in a field
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(), st.text(max_size=40),
                    st.binary(max_size=40), st.sampled_from(["x" * 70_000, b"\xff" * 70_000]))  # fmt: skip
values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
BYTE_MUTATIONS = ("bit flips", "truncation", "extension", "huge length prefix")


@st.composite
def mutated(draw: st.DrawFn, sample: bytes, how: tuple[str, ...] = BYTE_MUTATIONS) -> bytes:
    """`sample` with bits flipped, cut short, extended, or with a huge length prefix spliced in."""
    kind = draw(st.sampled_from(how))
    if kind == "bit flips":
        flipped = bytearray(sample)
        for bit in draw(st.lists(st.integers(0, 8 * len(sample) - 1), min_size=1, max_size=8)):
            flipped[bit // 8] ^= 1 << (bit % 8)
        return bytes(flipped)
    if kind == "truncation":
        return sample[: draw(st.integers(0, len(sample) - 1))]
    if kind == "extension":
        return sample + draw(st.binary(min_size=1, max_size=512))
    at = draw(st.integers(0, len(sample)))
    return sample[:at] + draw(st.sampled_from(HUGE_PREFIXES)) + sample[at:]


def with_field(draw: st.DrawFn, fields: dict) -> dict:
    """`fields` with one of them (or a new one, or one nested in a sub-record) set to any value."""
    changed = dict(fields)
    key = draw(st.sampled_from([*changed, "unknown"]))
    inner = changed.get(key)
    if isinstance(inner, dict) and inner and draw(st.booleans()):
        changed[key] = {**inner, draw(st.sampled_from(list(inner))): draw(values)}
    else:
        changed[key] = draw(values)
    return changed
