"""Every run file the benchmark pages, the README and its guide (docs/guide.md) name exists under
benchmarks/runs/, and every relative link of those pages resolves: a figure on a page can be traced
to its file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "benchmarks" / "runs"
PAGES = [ROOT / "README.md", *sorted((ROOT / "benchmarks").glob("*.md")), ROOT / "docs" / "guide.md"]
RUN_NAME = re.compile(r"(?<![\w/.-])(?:benchmarks/)?runs/([\w.-]*[\w-])")  # "runs/x.json", "benchmarks/runs/x.json"
LINK = re.compile(r"\]\(([^)\s]+)\)")  # markdown link targets


def named_runs(text: str) -> set[str]:
    """File names after every "runs/" or "benchmarks/runs/" in `text` (a bare "runs/" names the folder)."""
    return {m.group(1) for m in RUN_NAME.finditer(text)}


def test_pages_are_found():
    assert ROOT / "README.md" in PAGES and ROOT / "benchmarks" / "speed.md" in PAGES and len(PAGES) >= 4


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_run_file_a_page_names_exists(page):
    missing = sorted(name for name in named_runs(page.read_text(encoding="utf-8")) if not (RUNS / name).is_file())
    assert not missing, f"{page.name} names run files that are not in benchmarks/runs/: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_of_a_page_resolves(page):
    targets = [t.split("#")[0] for t in LINK.findall(page.read_text(encoding="utf-8"))]
    local = [t for t in targets if t and "://" not in t and not t.startswith("mailto:")]
    missing = sorted(t for t in local if not (page.parent / t).exists())
    assert not missing, f"{page.name} links to files that do not exist: {missing}"


def test_every_run_file_is_named_by_a_page():
    named = set().union(*(named_runs(p.read_text(encoding="utf-8")) for p in PAGES))
    orphans = sorted(f.name for f in RUNS.iterdir() if f.is_file() and f.name not in named)
    assert not orphans, f"run files no page names: {orphans}"
    assert len(named) >= 10  # the pages do cite their runs


def test_the_name_pattern_reads_paths_as_pages_write_them():
    text = (
        "[runs/qwen-eval.json](runs/qwen-eval.json), -o benchmarks/runs/cache-timing-qwen.json \\\n"
        "([runs/speed-2026-12-01.txt](runs/speed-2026-12-01.txt)). Every answer in `benchmarks/runs/`."
    )
    assert named_runs(text) == {"qwen-eval.json", "cache-timing-qwen.json", "speed-2026-12-01.txt"}
    assert named_runs("see runs/missing.json.") == {"missing.json"}  # a sentence's full stop is not part of it
