"""Every benchmark script imports and answers --help, so that a rename in the library cannot break one silently.

The benchmarks are never run as tests (they take minutes to hours); this runs each as a user
would, `python benchmarks/NAME.py --help`, which imports it and everything it imports.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = sorted((ROOT / "benchmarks").glob("*.py"))
HELP_TIMEOUT_S = 120  # importing torch and hivemind on a busy machine


def test_there_are_benchmarks_to_check():
    assert len(BENCHMARKS) >= 10, BENCHMARKS


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda p: p.name)
def test_a_benchmark_answers_help(script):
    result = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True,
                            timeout=HELP_TIMEOUT_S, cwd=ROOT)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage" in result.stdout.lower(), result.stdout[:500]
