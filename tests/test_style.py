"""The style is checked, not hoped for: ruff (configured in pyproject.toml's [tool.ruff]) finds nothing in the
library, the tests or the benchmarks. The test extra installs ruff, so CI runs this on every run."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ["swarm", "tests", "benchmarks", "peers", "bootstrap"]


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="ruff is not installed (pip install -e '.[test]')")
def test_ruff_finds_nothing():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", *CHECKED],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, f"ruff check {' '.join(CHECKED)}:\n{result.stdout}{result.stderr}"
