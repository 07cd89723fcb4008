"""Reading one results folder: its JSON files, each read recorded, and a missing key as one line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ReportError(Exception):
    """The page cannot be written from the results as they are; the message is the one line for stderr."""


@dataclass(frozen=True)
class Node:
    """A dict or list inside one results file: a key it lacks is a ReportError naming the file and the key."""

    data: Any
    file: str
    where: str = ""

    def __getitem__(self, key: str | int) -> Any:
        """The value under key: a Node for a dict or list, the plain value otherwise."""
        try:
            value = self.data[key]
        except (KeyError, IndexError, TypeError):
            raise ReportError(
                f"{self.file}: no key {self.where}{key!s} (rerun the benchmark, or teach report.py)"
            ) from None
        return Node(value, self.file, f"{self.where}{key}.") if isinstance(value, (dict, list)) else value

    def get(self, key: str) -> Any:
        """The value under key, or None where the file does not record it (older runs, optional parts)."""
        return self[key] if isinstance(self.data, dict) and key in self.data else None

    def num(self, key: str | int) -> float | None:
        """A number (None stays None: a figure the run could not measure)."""
        value = self[key]
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            shown = f"a JSON {type(value.data).__name__}" if isinstance(value, Node) else repr(value)[:40]
            raise ReportError(f"{self.file}: {self.where}{key} is {shown}, not a number")
        return value

    def names(self) -> list[str]:
        """The keys of a JSON object (anything else is a ReportError)."""
        if not isinstance(self.data, dict):
            raise ReportError(f"{self.file}: {self.where.rstrip('.') or 'the file'} is not a JSON object")
        return list(self.data)

    def items(self) -> Iterator[tuple[str, Any]]:
        for key in self.names():
            yield key, self[key]

    def __iter__(self) -> Iterator[Any]:
        if not isinstance(self.data, list):
            raise ReportError(f"{self.file}: {self.where.rstrip('.') or 'the file'} is not a JSON list")
        for i in range(len(self.data)):
            yield self[i]


@dataclass
class Folder:
    """One folder under results/: its JSON files (each read is recorded, with what it held) and its pictures."""

    path: Path
    base: Path  # the page's folder: what its links and error lines are relative to
    read: dict[Path, Any] = field(default_factory=dict)  # shared with its subfolders

    @property
    def rel(self) -> str:
        """The folder as the page links it."""
        return self.path.relative_to(self.base).as_posix()

    def json(self, name: str) -> Node:
        path = self.path / name
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise ReportError(f"{self.rel}/{name}: cannot read it as JSON ({error})") from None
        self.read[path] = data
        return Node(data, f"{self.rel}/{name}")

    def subfolders(self) -> list[Folder]:
        """The folders of later runs beside the main one (results/sync/spare/, ...), each its own Folder."""
        return [Folder(p, self.base, self.read) for p in sorted(self.path.iterdir()) if p.is_dir()]

    def unread(self) -> list[Path]:
        return [p for p in sorted(self.path.rglob("*.json")) if p not in self.read]

    def pictures(self) -> str:
        """A line linking every PNG of this folder (not its subfolders')."""
        links = [f"[{p.name}]({self.rel}/{p.name})" for p in sorted(self.path.glob("*.png"))]
        return f"Pictures: {', '.join(links)}." if links else ""
