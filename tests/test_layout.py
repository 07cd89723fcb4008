"""The package layout is the architecture: imports run one way, and the model needs no network."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ROOT / "swarm"

# each part of the library, and the parts it may import (besides itself and the shared base)
# __main__: `python -m swarm` lists the commands
BASE = {"swarm", "swarm.errors", "swarm.waiting", "swarm.files", "swarm.schema", "swarm.__main__"}
MAY_IMPORT = {
    "model": set(),
    "p2p": {"model"},
    "checkpoints": {"model", "p2p"},
    "sync": {"model", "p2p", "checkpoints"},  # reconcile.py merges the replicas' downloaded checkpoints
    "serving": {"model", "p2p", "checkpoints"},
    "health": {"model", "p2p", "checkpoints"},  # checks.py downloads the checkpoints hosts announce
    "peer": {"model", "p2p", "checkpoints", "sync", "serving"},
    "lab": {"model", "p2p", "checkpoints", "sync", "serving"},
    "api": {"model", "p2p", "checkpoints", "serving"},  # swarm.load, swarm.connect, swarm.fetch
    "cli": {"model", "p2p", "checkpoints", "sync", "serving", "peer", "lab", "health", "api"},
}
# the programs, by the names they install under (pyproject.toml) and the folders they live in
PROGRAMS = ("swarm_peer", "swarm_bootstrap", "peers", "bootstrap", "benchmarks", "tests")
INSTALLED_PROGRAMS = {"swarm_peer": "peers", "swarm_bootstrap": "bootstrap"}


def part_of(module: str) -> str | None:
    """The part ("model", "p2p", ...) a swarm module belongs to; None for the shared base."""
    if module in BASE:
        return None
    return module.split(".")[1]


def imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            if node.module == "swarm":  # `from swarm import lab`: a room; `import __version__`: the base
                found |= {f"swarm.{a.name}" for a in node.names
                          if (LIBRARY / a.name).exists() or (LIBRARY / f"{a.name}.py").exists()}
    return found


def library_files() -> list[Path]:
    return sorted(LIBRARY.rglob("*.py"))


@pytest.mark.parametrize("path", library_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_run_one_way(path):
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    here = part_of(module)
    allowed = MAY_IMPORT.get(here, set()) | {here}
    for name in imported_modules(path):
        assert name.split(".")[0] not in PROGRAMS, f"{module} imports the program {name}"
        if name.startswith("swarm.") and part_of(name) is not None and here is not None:
            assert part_of(name) in allowed, f"{module} ({here}) imports {name}, which sits above it"



def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def import_circle(graph: dict[str, set[str]]) -> list[str]:
    """A circle of modules each importing the next (the first again at the end), or [] if none."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str]:
        if module in path:
            return path[path.index(module):] + [module]
        if module in done:
            return []
        for name in sorted(graph.get(module, ())):
            if circle := visit(name, path + [module]):
                return circle
        done.add(module)
        return []

    return next((circle for module in sorted(graph) if (circle := visit(module, []))), [])


def test_no_module_imports_itself_round_a_circle():
    """Not even for a type hint (peer/announcer.py and peer/life.py were one, issue 45). The package's
    __init__ is left out: it imports the API only when `swarm.load` and the rest are first used."""
    assert import_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    modules = {module_name(p): p for p in library_files()}
    graph = {}
    for module, path in modules.items():
        named = imported_modules(path) | {f"{n.module}.{a.name}" for n in ast.walk(ast.parse(path.read_text()))
                                          if isinstance(n, ast.ImportFrom) and n.module for a in n.names}  # fmt: skip
        graph[module] = {name for name in named if name in modules and name not in (module, "swarm")}
    assert import_circle(graph) == []


def test_the_peer_only_runs_its_phases():
    """swarm/peer/life.py runs the phases of a peer's life, each in a module of its own, and holds what
    changes while it runs: it must not grow back into the junction box it was (633 lines importing 35
    swarm modules, issue 60). A module counts once, under the name its import statement gives:
    `import swarm.x.y` and `from swarm.x.y import a, b` count `swarm.x.y`; `from swarm import
    __version__` counts `swarm`."""
    life = LIBRARY / "peer" / "life.py"
    lines = len(life.read_text().splitlines())
    modules = sorted(name for name in imported_modules(life) if name == "swarm" or name.startswith("swarm."))
    assert lines <= 350, f"swarm/peer/life.py has {lines} lines"
    assert len(modules) <= 20, f"swarm/peer/life.py imports {len(modules)} swarm modules: {modules}"


def test_every_part_is_a_known_room():
    parts = {p.name for p in LIBRARY.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    modules = {p.stem for p in LIBRARY.glob("*.py")} - {"__init__"}
    assert parts | modules == set(MAY_IMPORT) | {"errors", "waiting", "files", "schema", "__main__"}


def test_setup_installs_every_package_and_the_programs_under_their_own_names():
    """pyproject.toml lists its packages (the programs' names differ from their folders, which package
    discovery cannot give): every package of swarm/ is there, and no generic top-level name is installed."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    library = {".".join(p.relative_to(ROOT).parts) for p in [LIBRARY, *LIBRARY.iterdir()]
               if (p / "__init__.py").exists()}
    assert set(setuptools["packages"]) == library | set(INSTALLED_PROGRAMS)
    assert setuptools["package-dir"] == INSTALLED_PROGRAMS


def test_the_model_runs_without_hivemind():
    """Importing every model module (and what they import) loads no hivemind."""
    modules = [f"swarm.model.{p.stem}" for p in (LIBRARY / "model").glob("*.py") if p.stem != "__init__"]
    code = f"import sys; import {', '.join(modules)}; print('hivemind' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_the_layout_page_names_every_room_in_import_order():
    """docs/layout.md names every room, each after every room it may import ("imports run down this list")."""
    layout = (ROOT / "docs" / "layout.md").read_text()
    rooms = {part: f"`swarm/{part}/`" if (LIBRARY / part).is_dir() else f"`swarm/{part}.py`" for part in MAY_IMPORT}
    for room in rooms.values():
        assert room in layout, f"docs/layout.md does not name {room}"
    for part, allowed in MAY_IMPORT.items():
        for below in allowed:
            where = layout.index(rooms[below]), layout.index(rooms[part])
            assert where[0] < where[1], f"docs/layout.md lists {rooms[part]} above {rooms[below]}, which it imports"
