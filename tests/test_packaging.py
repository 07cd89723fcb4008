"""The package as a user gets it: `python -m build` makes a wheel and an sdist from pyproject.toml,
and the wheel installs in a fresh virtual environment whose commands run.

One test, a minute or two (the build's own environment, then torch and hivemind into a new venv,
from pip's cache where it has them); marked slow so a local run can leave it out, and CI runs it.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest

import swarm

ROOT = Path(__file__).resolve().parent.parent
STEP_TIMEOUT_S = 600
DIST_INFO = f"blockswarm-{swarm.__version__}.dist-info"


def run(*command: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run a step of the check; its output is in the failure message when it fails."""
    done = subprocess.run(list(map(str, command)), check=False, capture_output=True, text=True, cwd=cwd,
                          timeout=STEP_TIMEOUT_S)  # fmt: skip
    assert done.returncode == 0, f"{' '.join(map(str, command))}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def the_one(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    assert len(found) == 1, found
    return found[0]


def check_wheel(wheel: Path) -> None:
    """The programs under their own names, the package data, the license and the metadata are inside."""
    with zipfile.ZipFile(wheel) as archive:
        names, metadata = archive.namelist(), archive.read(f"{DIST_INFO}/METADATA").decode()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"swarm", "swarm_peer", "swarm_bootstrap", DIST_INFO}, tops
    for expected in ("swarm_peer/main.py", "swarm_bootstrap/main.py", "swarm/cli/demo_start/manifest.json"):
        assert expected in names, expected
    for data in ("swarm/health/static/", "swarm/model/tokenizers/"):  # the page; the built-in config's tokenizer
        assert any(name.startswith(data) for name in names), data
    assert f"{DIST_INFO}/licenses/LICENSE" in names
    assert "License-Expression: MIT" in metadata
    core = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert not any("matplotlib" in line for line in core), core  # the bench extra's, not the core's


def check_sdist(sdist: Path) -> None:
    """The sdist holds what a wheel is built from: the metadata, the license, the programs' folders."""
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    for expected in ("pyproject.toml", "LICENSE", "README.md", "peers/main.py", "bootstrap/main.py",
                     "swarm/cli/demo_start/manifest.json"):  # fmt: skip
        assert expected in names, expected


@pytest.mark.slow
def test_a_built_wheel_installs_in_a_fresh_venv_and_its_commands_run(tmp_path):
    dist = tmp_path / "dist"
    run(sys.executable, "-m", "build", "--outdir", dist, ROOT)
    check_sdist(the_one(dist, "blockswarm-*.tar.gz"))
    wheel = the_one(dist, "blockswarm-*-py3-none-any.whl")
    check_wheel(wheel)
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    # the torch build this test runs under (the README's pin), so pip takes it from its local wheels or cache
    run(venv / "bin" / "pip", "install", f"torch=={version('torch')}", wheel, cwd=tmp_path)
    helped = run(venv / "bin" / "swarm-demo", "--help", cwd=tmp_path)
    assert "Usage: swarm-demo" in helped.stdout
    listed = run(venv / "bin" / "python", "-m", "swarm", cwd=tmp_path)
    assert "python -m swarm_peer.main" in listed.stdout
    # the built-in config's tokenizer is package data: the installed package finds it
    code = "from swarm.model.denoiser import ModelConfig; print(ModelConfig.from_json_file(None).units().encode('The'))"
    assert run(venv / "bin" / "python", "-c", code, cwd=tmp_path).stdout.strip().startswith("[")
    # the installed package, not this checkout: run from elsewhere, the import finds the venv's copy
    where = run(venv / "bin" / "python", "-c", "import swarm; print(swarm.__file__)", cwd=tmp_path).stdout
    assert str(venv) in where and str(ROOT) not in where
