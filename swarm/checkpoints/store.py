"""A peer's checkpoints of its block on disk: what it saves, adopts from replicas, and serves,
each with its record (`CheckpointInfo`) and its chunk list, computed once from the bytes in hand."""

from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path
from typing import NamedTuple

from swarm.checkpoints.chunks import chunk_hashes, list_sha256
from swarm.files import write_atomic
from swarm.model.checkpoint import encode_block
from swarm.model.denoiser import Denoiser, ModelConfig
from swarm.p2p.records import MAX_TAKEN_FROM, CheckpointInfo


class Described(NamedTuple):
    """A checkpoint file's record and its chunk list (`chunk_hashes`), whose sha256 the record names."""

    info: CheckpointInfo
    chunk_list: bytes


def describe(step: int, data: bytes) -> Described:
    """The record of checkpoint bytes `data` stamped `step`, and their chunk list: what a host
    announces, and what it serves to a downloader that checks the one against the other."""
    hashes = chunk_hashes(data)
    sha256 = hashlib.sha256(data).hexdigest()
    return Described(CheckpointInfo(step=step, sha256=sha256, size=len(data), chunks=list_sha256(hashes)), hashes)


class CheckpointStore:
    """A peer's checkpoints of its block: `block_<b>_step_<n>.safetensors`, the newest `keep` kept,
    and older ones too while they are younger than `min_age_s`.

    Keeping older files lets a peer still serve a checkpoint its record named a moment before
    it saved the next ones (a fast peer may save several within one announce period).

    Beside them, `lineage_block_<b>.json` says whom the last checkpoint it adopted was taken from
    (`keep_lineage`): a peer restarted from that checkpoint announces the same lineage, not those
    weights as its own (issue 46, laundering).
    """

    def __init__(
        self, folder: Path, config: ModelConfig, block: int, swarm: str, keep: int = 2, min_age_s: float = 0.0
    ):
        self.folder, self.config, self.block, self.swarm, self.keep = Path(folder), config, block, swarm, keep
        self.min_age_s = min_age_s
        self.folder.mkdir(parents=True, exist_ok=True)
        self._described: dict[Path, Described] = {}
        for stale in self.folder.glob(f".block_{block}_step_*.tmp"):  # a save that a crash cut short
            stale.unlink(missing_ok=True)

    def _pattern(self) -> re.Pattern:
        return re.compile(rf"^block_{self.block}_step_(\d+)\.safetensors$")

    def _files(self) -> list[tuple[int, Path]]:
        pattern = self._pattern()
        found = [(int(m.group(1)), p) for p in self.folder.iterdir() if (m := pattern.match(p.name))]
        return sorted(found)

    def path_for(self, step: int) -> Path:
        return self.folder / f"block_{self.block}_step_{step}.safetensors"

    def save(self, denoiser: Denoiser, step: int) -> CheckpointInfo:
        data = encode_block(denoiser, self.config, self.block, step, self.swarm)
        write_atomic(self.path_for(step), data)
        described = self._described[self.path_for(step)] = describe(step, data)
        self._prune()
        return described.info

    def adopt(self, data: bytes, info: CheckpointInfo) -> Path:
        """Keep a verified checkpoint that came from another peer (its record named its chunk
        list's sha256, and its bytes matched it)."""
        path = self.path_for(info.step)
        write_atomic(path, data)
        self._described[path] = Described(info, chunk_hashes(data))
        self._prune()
        return path

    def _prune(self) -> None:
        now = time.time()
        for _, old in self._files()[: -self.keep]:
            if now - old.stat().st_mtime >= self.min_age_s:  # announced a moment ago? others may be fetching it
                old.unlink(missing_ok=True)
                self._described.pop(old, None)

    def _describe(self, path: Path) -> Described:
        """The record and chunk list of the file at `path`: kept from when this store wrote it, or
        read once (a file it found on disk)."""
        if path not in self._described:
            step = int(self._pattern().match(path.name).group(1))
            self._described[path] = describe(step, path.read_bytes())
        return self._described[path]

    def info(self, path: Path) -> CheckpointInfo:
        return self._describe(path).info

    def chunk_list(self, path: Path) -> bytes:
        """The chunk list of the file at `path` (what `rpc_chunk_list` serves), hashed once with its record."""
        return self._describe(path).chunk_list

    def latest(self) -> tuple[Path, CheckpointInfo] | None:
        files = self._files()
        return (files[-1][1], self.info(files[-1][1])) if files else None

    def find(self, sha256: str) -> Path | None:
        for _, path in reversed(self._files()):
            if self.info(path).sha256 == sha256:
                return path
        return None

    @property
    def _lineage_path(self) -> Path:
        return self.folder / f"lineage_block_{self.block}.json"

    def keep_lineage(self, info: CheckpointInfo, voices: tuple[str, ...]) -> None:
        """Remember that checkpoint `info`, adopted, was taken from `voices` (owner fingerprints)."""
        record = {"sha256": info.sha256, "taken_from": list(voices)}
        write_atomic(self._lineage_path, json.dumps(record).encode())

    def lineage_of(self, info: CheckpointInfo) -> tuple[str, ...] | None:
        """The voices checkpoint `info` was taken from, if it is the one this store last adopted;
        None for any other (its own), and for a lineage file that is not one `keep_lineage` wrote."""
        try:
            record = json.loads(self._lineage_path.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(record, dict) or record.get("sha256") != info.sha256:
            return None
        voices = record.get("taken_from")
        if not isinstance(voices, list) or len(voices) > MAX_TAKEN_FROM:
            return None
        if not all(isinstance(v, str) and re.fullmatch(r"[0-9a-f]{32}", v) for v in voices):
            return None
        return tuple(voices)
