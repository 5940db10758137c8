"""README's lists of methods, allocations, indicators, families and tasks equal the registries they
come from (a new row in a registry fails here until the user guide names it)."""

from __future__ import annotations

import re
from pathlib import Path

from cake_cli.engine.allocation import ALLOCATIONS
from cake_cli.engine.families import FAMILIES
from cake_cli.engine.indicators import INDICATORS
from cake_cli.engine.methods import METHODS
from cake_cli.tasks.templates import task_names

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")


def option_values(flag: str) -> set[str]:
    """The values README writes as `FLAG a|b|c` (the first such mention)."""
    match = re.search(re.escape(flag) + r" ([a-z0-9_+.-]+(?:\|[a-z0-9_+.-]+)+)", README)
    assert match, f"README names no values for {flag}"
    return set(match.group(1).split("|"))


def test_readme_method_lists_equal_the_registries():
    assert option_values("--method") == set(METHODS)
    assert option_values("--allocation") == set(ALLOCATIONS)
    assert option_values("--indicator") == set(INDICATORS)


def test_readme_families_equal_the_registry():
    paragraph = README[README.index("Supported families") :].split("\n\n", 1)[0]
    assert set(re.findall(r"`([a-z0-9_]+)`", paragraph)) == set(FAMILIES)


def test_readme_shows_every_task_command():
    commands = set(re.findall(r"^cake ([a-z-]+) ", README, flags=re.M))
    assert set(task_names()) <= commands, set(task_names()) - commands
