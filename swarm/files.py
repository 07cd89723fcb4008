"""Files written whole or not at all: what every room writes its keys, checkpoints, models and results with.

A file goes to a temporary name beside it, is fsynced and renamed over the old one; a folder is
built under a temporary name and renamed into place. A crash leaves the old one or the new one,
never half of either, and a reader never sees a torn file.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
from pathlib import Path


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write bytes to `path` so that a crash leaves the old file or the new one, never a torn one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_folder_atomic(folder: Path, files: dict[str, str | bytes]) -> None:
    """Build a folder under a temporary name, then rename it into place (replacing an old one)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.", suffix=".tmp"))
    try:
        for name, content in files.items():
            data = content.encode() if isinstance(content, str) else content
            with open(tmp / name, "wb") as f:
                f.write(data)
                os.fsync(f.fileno())
        os.chmod(tmp, 0o755)
        old = folder.with_name(f".{folder.name}.old")
        if folder.exists():
            os.replace(folder, old)
        os.replace(tmp, folder)
        shutil.rmtree(old, ignore_errors=True)
        _fsync_dir(folder.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_picture(path: Path, figure, dpi: int = 110) -> None:
    """A matplotlib figure written as a PNG with `write_atomic`: a reader never sees half a picture."""
    picture = io.BytesIO()
    figure.savefig(picture, format="png", dpi=dpi)
    write_atomic(path, picture.getvalue())
