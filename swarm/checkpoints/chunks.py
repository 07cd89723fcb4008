"""A checkpoint cut into chunks: the sha256 of each chunk (the chunk list), and which chunks each
download stream fetches next (no network here; download.py runs the streams).

Hosts that vouch for one checkpoint serve it at once, each stream a run of consecutive chunks.
The receiver checks every chunk on arrival against the chunk list, so a bad chunk is traced to
the host that sent it and fetched again elsewhere. The list is a function of the file's bytes
(`CHUNK_BYTES` is fixed), so a record names its sha256 (`list_sha256`, `CheckpointInfo.chunks`):
a host's list is checked against its record as it comes in, and the whole against the record's
sha256 at the end (see download.py).

`ChunkPlan` hands out the work. A stream claims a run of unclaimed chunks about 1/n of what is
left long (n: the streams planned), so runs start long, which keeps a stream's window open on a
long fat link, and get shorter towards the end (guided self-scheduling). Once nothing is left
unclaimed, an idle stream takes the second half of the longest run still in flight (work
stealing), or asks a second host for the last chunk of a run, so a slow host never holds up
the end of a download.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Container, Hashable, Iterable
from dataclasses import dataclass, field

from swarm.p2p.messages import HASH_BYTES, MAX_CHUNKS  # the wire's bounds on a chunk list

# Small: a host serving bad bytes is caught after little of them, and the end of a download
# stays short. A host pushes a stream's chunks ahead of the reads (its window, its queues), so a
# run cut short by work stealing, and the second copy of a last chunk, cost what was in flight;
# and a host's streams share its uplink, so the last chunk of a stream comes at a fraction of it.
# Measured in the lab of benchmarks/transfer.py (4 hosts at 5 Mbit/s each into 20 Mbit/s, 100 ms,
# 25 MB, two runs each): with 256 KiB chunks the joiner received 1.13-1.18x the file and got 0.84-0.85
# of its cap; with 64 KiB, 1.06-1.07x (TCP/IP headers alone are 1.046x) and 0.90.
CHUNK_BYTES = 64 * 1024
MAX_COPIES = 2  # streams that may fetch one chunk at once (the last chunks of a download)


def chunk_count(size: int) -> int:
    return -(-size // CHUNK_BYTES)


def chunk_hashes(data: bytes) -> bytes:
    """The chunk list of `data`: the sha256 digests of its chunks, one after the other."""
    view = memoryview(data)
    return b"".join(hashlib.sha256(view[i : i + CHUNK_BYTES]).digest() for i in range(0, len(data), CHUNK_BYTES))


def list_sha256(hashes: bytes) -> str:
    """The sha256 of a chunk list (`chunk_hashes`), as a record names it (`CheckpointInfo.chunks`)."""
    return hashlib.sha256(hashes).hexdigest()


@dataclass(frozen=True)
class ChunkList:
    """The size of a file and the sha256 of each of its chunks; ValueError if they do not fit together."""

    size: int
    hashes: bytes

    def __post_init__(self) -> None:
        if (self.size <= 0 or chunk_count(self.size) > MAX_CHUNKS
                or len(self.hashes) != HASH_BYTES * chunk_count(self.size)):
            raise ValueError(f"a chunk list of {len(self.hashes)} bytes does not describe a file of {self.size} bytes")

    @property
    def count(self) -> int:
        return chunk_count(self.size)

    def length(self, index: int) -> int:
        return min(CHUNK_BYTES, self.size - index * CHUNK_BYTES)

    def matches(self, index: int, data: bytes) -> bool:
        """Whether `data` is chunk `index` of the file this list describes."""
        expected = self.hashes[index * HASH_BYTES : (index + 1) * HASH_BYTES]
        return len(data) == self.length(index) and hashlib.sha256(data).digest() == expected


@dataclass
class Run:
    """Chunks [next, end) that one stream fetches, in order; `end` shrinks when another stream
    takes the second half."""

    next: int
    end: int

    @property
    def left(self) -> int:
        return self.end - self.next


@dataclass
class ChunkPlan:
    """Which chunks are still missing and which stream fetches which; `streams` is how many
    streams share the work (it sets the length of a new run)."""

    count: int
    streams: int
    have: Iterable[int] = ()
    missing: set[int] = field(init=False)
    runs: dict[Hashable, Run] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.missing = set(range(self.count)) - set(self.have)

    @property
    def complete(self) -> bool:
        return not self.missing

    def _copies(self) -> dict[int, int]:
        copies: dict[int, int] = {}
        for run in self.runs.values():
            for index in range(run.next, run.end):
                copies[index] = copies.get(index, 0) + 1
        return copies

    def claim(self, stream: Hashable, own: Container = ()) -> Run | None:
        """The next run for `stream` (which has none in flight), or None while there is nothing to
        take. The runs of the streams in `own` (those of the same host: its uplink is theirs) are
        never stolen from: what their host pushed ahead would be sent twice."""
        copies = self._copies()
        unclaimed = sorted(i for i in self.missing if i not in copies)
        if unclaimed:
            first, length = unclaimed[0], math.ceil(len(unclaimed) / max(1, self.streams))
            end = first + 1
            while end < first + length and end in self.missing and end not in copies:
                end += 1
            run = Run(first, end)
        else:
            run = self._steal(copies, own)
        if run is not None:
            self.runs[stream] = run
        return run

    def unclaimed(self, run: Run) -> bool:
        """Whether every chunk of `run` is still missing and no stream fetches it."""
        copies = self._copies()
        return all(index in self.missing and index not in copies for index in range(run.next, run.end))

    def assign(self, stream: Hashable, run: Run) -> None:
        """`stream` fetches `run`, asked for before its host joined (download.py asks each host for
        a first run along with its chunk list)."""
        self.runs[stream] = run

    def _steal(self, copies: dict[int, int], own: Container) -> Run | None:
        """The second half of the longest run in flight but `own`; for a run down to its last
        chunk, a second copy of that chunk (if it has not one already)."""
        others = [run for key, run in self.runs.items() if key not in own]
        longest = max(others, key=lambda r: r.left, default=None)
        if longest is None or longest.left == 0:
            return None
        if longest.left >= 2:
            middle = longest.next + math.ceil(longest.left / 2)
            run, longest.end = Run(middle, longest.end), middle
            return run
        last = [r.next for r in others if r.left == 1 and copies.get(r.next, 0) < MAX_COPIES]
        return Run(last[0], last[0] + 1) if last else None

    def received(self, stream: Hashable, index: int) -> None:
        """Chunk `index` of `stream`'s run arrived and verified."""
        self.missing.discard(index)
        self.runs[stream].next = index + 1

    def release(self, stream: Hashable) -> None:
        """`stream` stops (its run done, or its host dropped): what it had not fetched is free again."""
        self.runs.pop(stream, None)
