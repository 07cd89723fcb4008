"""The documentation tells the truth: the README for users, the benchmarks page generated, docs/ in the tree.

Every check here is a function over text, and each test first shows its check firing on a
planted bad example, so that a check that can no longer fail is itself a failure.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGE = ROOT / "benchmarks" / "README.md"
RESULTS = ROOT / "benchmarks" / "results"
LAYOUT = ROOT / "docs" / "layout.md"
PAGES = [README, PAGE, *sorted((ROOT / "docs").glob("*.md"))]
MAX_README_LINES = 200
MACHINE_PATHS = ("/tmp/", "/work/", "/root/", "/home/", str(ROOT))
# what .ci/run executes: these lines, in this order, after the README's `<!-- ci:` marker
CI_BLOCK = [
    "python3 -m venv .venv && . .venv/bin/activate",
    "pip install torch==2.13.0 -e '.[test]'",
    'bash .ci/regions-setup || echo "emulated-region tests will be skipped: see the lines above"',
    'bash .ci/browser-setup || echo "the health page\'s browser test will be skipped: see the lines above"',
    "python -m pytest -q --durations=15",
]


def load_report() -> ModuleType:
    """benchmarks/report.py as a module (benchmarks/ is a folder of programs, not a package), its
    folder first on sys.path while it loads, as python runs it: it imports page/ beside it."""
    spec = importlib.util.spec_from_file_location("report", ROOT / "benchmarks" / "report.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return module


report = load_report()


# --- checks over text ---------------------------------------------------------------------------------


def prose(markdown: str) -> str:
    """What a reader takes as figures: no code blocks or spans (commands, versions, addresses),
    no link targets, no comments, no issue numbers."""
    text = re.sub(r"```.*?```", " ", markdown, flags=re.DOTALL)
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.DOTALL)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    return re.sub(r"\bissues? \d+", " ", text)


def figures(markdown: str) -> list[str]:
    """The figures a page quotes: integers from 10 up, decimals, and ratios such as 29x or 1.013x."""
    found = re.findall(r"(?<![\w.,])\d[\d,]*(?:\.\d+)?x?(?![\w.]*\d)", prose(markdown))
    return [f for f in found if "." in f or f.endswith("x") or int(f.replace(",", "")) >= 10]


def missing_figures(readme: str, page: str) -> list[str]:
    """The README's figures that the benchmarks page does not print as they are."""
    return [f for f in figures(readme) if not re.search(rf"(?<![\d.,]){re.escape(f)}(?![\d]|\.\d)", page)]


def commit_hashes(text: str) -> list[str]:
    """Words that look like commits: 7 to 40 hex characters, with a digit and a letter among them."""
    words = re.findall(r"\b[0-9a-f]{7,40}\b", text)
    return [w for w in words if re.search(r"\d", w) and re.search(r"[a-f]", w)]


def links(markdown: str) -> list[str]:
    """Every link and image target of a markdown page (inline form)."""
    return re.findall(r"\]\(([^)\s]+)\)", markdown)


def bad_links(page: Path, text: str) -> list[str]:
    """Relative links that leave the repository or name nothing in it (web links are not followed)."""
    bad = []
    for target in links(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        if not path.is_relative_to(ROOT) or not path.exists():
            bad.append(target)
    return bad


def strings(data: Any) -> Iterator[str]:
    if isinstance(data, dict):
        for key, value in data.items():
            yield key
            yield from strings(value)
    elif isinstance(data, list):
        for value in data:
            yield from strings(value)
    elif isinstance(data, str):
        yield data


def machine_paths(data: Any) -> list[str]:
    """Strings in a results file that hold an absolute path of the machine it ran on."""
    return [s for s in strings(data) if any(p in s for p in MACHINE_PATHS)]


def ci_block(readme: str) -> list[str]:
    """The lines .ci/run executes: the first bash block after the `<!-- ci:` marker."""
    after = readme[readme.index("<!-- ci:") :]
    block = re.search(r"^```bash\n(.*?)^```", after, flags=re.DOTALL | re.MULTILINE)
    return block.group(1).splitlines() if block else []


def unnamed_modules(layout: str) -> list[str]:
    """Modules of swarm/'s rooms and of benchmarks/page/ that their section of the layout page leaves out."""
    missing = []
    for path in sorted([*(ROOT / "swarm").glob("*/*.py"), *(ROOT / "benchmarks" / "page").glob("*.py")]):
        folder = path.parent.relative_to(ROOT).as_posix()
        section = re.search(rf"^## `{folder}/`\n(.*?)(?=^## |\Z)", layout, flags=re.DOTALL | re.MULTILINE)
        if path.stem != "__init__" and (section is None or f"`{path.name}`" not in section.group(1)):
            missing.append(f"{folder}/{path.name}")
    return missing


# --- the benchmarks page -------------------------------------------------------------------------------


def test_the_benchmarks_page_is_what_report_py_writes():
    assert report.render(RESULTS) == PAGE.read_text(), "benchmarks/README.md is stale: run python benchmarks/report.py"


@pytest.fixture
def results_copy(tmp_path, monkeypatch) -> Path:
    """A copy of the results and the page for report.py to read and write, leaving the real ones alone."""
    results = tmp_path / "benchmarks" / "results"
    shutil.copytree(RESULTS, results)
    shutil.copy(PAGE, tmp_path / "benchmarks" / "README.md")
    monkeypatch.setattr(report, "RESULTS", results)
    monkeypatch.setattr(report, "PAGE", tmp_path / "benchmarks" / "README.md")
    return results


def one_line_error(capsys, argv: list[str]) -> str:
    """Run report.py's main, which must fail; its stderr, which must be one line."""
    assert report.main(argv) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


def test_check_fails_in_one_line_when_a_results_file_changed_without_regenerating(results_copy, capsys):
    assert report.main(["--check"]) == 0
    chaos = results_copy / "chaos" / "chaos.json"
    data = json.loads(chaos.read_text())
    data["chaos"]["hangs"] = 3
    chaos.write_text(json.dumps(data))
    assert "run python benchmarks/report.py" in one_line_error(capsys, ["--check"])
    assert report.main([]) == 0 and report.main(["--check"]) == 0  # rewritten, the page matches again
    assert "| hangs | 3 |" in report.PAGE.read_text()
    assert [p.name for p in report.PAGE.parent.iterdir() if p.name.startswith(".")] == []  # no temp file left


def test_a_results_folder_without_a_renderer_is_one_line_not_a_traceback(results_copy, capsys):
    (results_copy / "latency").mkdir()
    assert "results/latency/ has no renderer" in one_line_error(capsys, [])


def test_a_missing_key_is_one_line_naming_the_file_and_the_key(results_copy, capsys):
    serve = results_copy / "serve" / "serve.json"
    data = json.loads(serve.read_text())
    del data["defences"]["extra_requests_per_request"]
    serve.write_text(json.dumps(data))
    err = one_line_error(capsys, [])
    assert "results/serve/serve.json" in err and "defences.extra_requests_per_request" in err


def test_a_value_of_the_wrong_kind_or_a_file_nobody_reads_is_one_line(results_copy, capsys):
    sync = results_copy / "sync" / "sync.json"
    data = json.loads(sync.read_text())
    data["summary"] = "lost"
    sync.write_text(json.dumps(data))
    assert "results/sync/" in one_line_error(capsys, [])
    shutil.copy(RESULTS / "sync" / "sync.json", sync)
    (results_copy / "chaos" / "chaos-rerun.json").write_text("{}")
    assert "chaos-rerun.json" in one_line_error(capsys, [])



def section_of(page: str, title: str) -> str:
    """One section of the benchmarks page, its heading left out."""
    return page.split(f"\n## {title}\n")[1].split("\n## ")[0]


def test_a_model_recorded_without_its_tokenizer_is_one_line_naming_the_byte_model(results_copy):
    """Decided from the results file alone, so that a rerun (its config records a tokenizer) clears it."""
    start_model = results_copy / "start_model" / "start_model.json"
    data = json.loads(start_model.read_text())
    assert "byte-level model" not in section_of(report.render(results_copy), "The demo's start model")
    del data["model"]["tokenizer"]
    start_model.write_text(json.dumps(data))
    assert (
        "Measured on the old byte-level model, before subword tokens (issue 44): its results record a model with no "
        "`tokenizer` (`prefix_len` 16, `gen_len` 8 bytes). These figures await a rerun."
    ) in section_of(report.render(results_copy), "The demo's start model")


def test_a_time_to_loss_run_kept_in_a_subfolder_is_a_later_run_of_its_own(results_copy):
    """A run of dense alone (a target of its own) is shown under the main run, with its own headline."""
    main = json.loads((results_copy / "time_to_loss" / "time_to_loss.json").read_text())
    later = {**main, "modes": {"dense": next(iter(main["modes"].values()))},
             "summary": {**main["summary"], "best_mode": None}}  # fmt: skip
    (results_copy / "time_to_loss" / "later").mkdir(exist_ok=True)
    (results_copy / "time_to_loss" / "later" / "time_to_loss.json").write_text(json.dumps(later))
    section = section_of(report.render(results_copy), "Time to a loss across regions")
    main_part = section.split("\n### Later run, ")[0]
    later_part = section.split("\n### Later run, `results/time_to_loss/later/`\n")[1].split("\n### ")[0]
    assert "Best mode:" in main_part and "Dense alone: no compressed mode in this run." in later_part
    assert "\n| dense |" in later_part and "\n| dense |" not in main_part


def test_the_loss_line_of_attacks_shows_only_where_a_part_trained():
    """It says what parts 2 and 3's losses are; a run of part 1 alone has none to explain."""
    main, *later = section_of(report.render(RESULTS), "Attacks").split("\n### Later run, ")
    assert "\nLoss: " in main
    part_one_only = [run for run in later if run.startswith("`results/attacks/issue46_rows/`")]
    assert part_one_only and "\nLoss: " not in part_one_only[0]


# --- the README ---------------------------------------------------------------------------------------


def test_every_figure_in_the_readme_is_on_the_benchmarks_page():
    assert missing_figures("took 0.51 s, 29x faster, over 64 nodes", "0.513 s, 29.2x, 64 nodes") == ["0.51", "29x"]
    assert figures("`torch==2.13.0` on `127.0.0.1`, issue 26, 3 blocks") == []
    assert missing_figures(README.read_text(), PAGE.read_text()) == []


def test_the_readme_holds_no_commit_hash():
    assert commit_hashes("measured on 66f8dac, then on 4ed8e10") == ["66f8dac", "4ed8e10"]
    assert commit_hashes("feedback, defaced, 1234567") == []
    assert commit_hashes(README.read_text()) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_stay_inside_the_repository_and_name_what_is_there(page):
    assert bad_links(README, "see [the design](../shared/DESIGN.md) and [docs](docs/)") == ["../shared/DESIGN.md"]
    text = page.read_text()
    assert "../shared" not in text and bad_links(page, text) == []


def test_the_readme_stays_short_and_keeps_the_block_ci_runs():
    assert ci_block("<!-- ci: x -->\n```bash\necho a\n```\n") == ["echo a"]
    readme = README.read_text()
    assert len(readme.splitlines()) < MAX_README_LINES
    assert ci_block(readme) == CI_BLOCK


def test_the_readme_has_a_line_for_every_command():
    commands = list(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])
    assert len(commands) >= 10, commands
    rows = [line for line in README.read_text().splitlines() if line.startswith("| `swarm-")]
    assert [c for c in commands if not any(row.startswith(f"| `{c}") for row in rows)] == []


# --- results files and docs/ --------------------------------------------------------------------------


def test_no_results_file_holds_a_path_of_this_machine():
    assert machine_paths({"config": {"out": "/tmp/attacks_full", "regions": "benchmarks/regions.yaml"}}) == [
        "/tmp/attacks_full"
    ]
    found = {
        str(p.relative_to(ROOT)): machine_paths(json.loads(p.read_text())) for p in sorted(RESULTS.rglob("*.json"))
    }
    assert {k: v for k, v in found.items() if v} == {}


def test_the_layout_page_names_every_module_in_its_room():
    assert unnamed_modules("## `swarm/model/`\n\n- `denoiser.py`: the model.\n")  # the rest of the tree is missing
    assert unnamed_modules(LAYOUT.read_text()) == []
