"""Every benchmark script imports and answers --help, so that a rename in the library cannot break one silently.

The benchmarks are never run as tests (they take minutes to hours); this runs each as a user
would, `python benchmarks/NAME.py --help`, which imports it and everything it imports. All of
them run in one fresh interpreter, one after the other, so that torch and hivemind are imported
once, not once a script (that cost most of a minute): each runs as `__main__` with its folder first
on sys.path, as python runs a script, and the project's modules an earlier script imported are
forgotten first, so that each script imports the project afresh, as it does alone.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import assert_one_line_error

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = sorted((ROOT / "benchmarks").glob("*.py"))
HELP_TIMEOUT_S = 300  # importing torch and hivemind, then every script, on a busy machine

# argv: the results file, then the scripts; writes {script: {"returncode", "stdout", "stderr"}}
EACH_HELP = """
import contextlib, io, json, runpy, sys, traceback
from pathlib import Path

out, scripts = sys.argv[1], sys.argv[2:]
own = {"swarm", *(Path(s).stem for s in scripts)}
answers = {}
for script in scripts:
    for name in [m for m in sys.modules if m.split(".")[0] in own]:
        del sys.modules[name]
    sys.argv, sys.path[0] = [script, "--help"], str(Path(script).parent)
    stdout, stderr, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else int(exit.code is not None)
        except BaseException:
            traceback.print_exc()
            code = 1
    answers[script] = {"returncode": code, "stdout": stdout.getvalue(), "stderr": stderr.getvalue()}
Path(out).write_text(json.dumps(answers))
"""


@pytest.fixture(scope="module")
def answers(tmp_path_factory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("help") / "answers.json"
    command = [sys.executable, "-c", EACH_HELP, str(out), *map(str, BENCHMARKS)]
    ran = subprocess.run(command, check=False, capture_output=True, text=True, timeout=HELP_TIMEOUT_S, cwd=ROOT)
    assert ran.returncode == 0 and out.exists(), ran.stderr[-3000:]
    return json.loads(out.read_text())


def test_there_are_benchmarks_to_check():
    assert len(BENCHMARKS) >= 10, BENCHMARKS


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda p: p.name)
def test_a_benchmark_answers_help(answers, script):
    result = answers[str(script)]
    assert result["returncode"] == 0, result["stderr"][-2000:]
    assert "usage" in result["stdout"].lower(), result["stdout"][:500]


@pytest.mark.parametrize("mode", ["outer", "outer-k128", "outer-overlap-spare"])
def test_sync_refuses_steps_that_end_an_outer_mode_between_its_rounds(mode):
    """An outer mode's replicas agree only at the end of a round of H steps: a run that stops
    between rounds compares weights that were never synced (outer-k128 and the -spare mode slipped
    past this check once)."""
    command = [sys.executable, "benchmarks/sync.py", "--modes", "dense", mode, "--steps", "7", "--region-modes", "demo"]
    ran = subprocess.run(command, check=False, capture_output=True, text=True, timeout=HELP_TIMEOUT_S, cwd=ROOT)
    assert_one_line_error(ran, "multiple of the outer steps' H")
