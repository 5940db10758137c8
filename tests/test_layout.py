"""The package's layers: imports go one way (cli -> batch | serve -> tasks, bench -> models -> engine), no
cycles at any level (module-level, function-level and TYPE_CHECKING imports all count), the engine
is a library of torch + transformers only, modules and engine functions stay small."""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "cake_cli"
BASE = {"cake_cli", "cake_cli.errors", "cake_cli.paths", "cake_cli.files", "cake_cli.cores"}
# each layer and the layers it may import from (its own included); base modules are open to all
ALLOWED = {
    "engine": {"engine"},
    "models": {"models", "engine"},
    "tasks": {"tasks", "models", "engine"},
    "bench": {"bench", "tasks", "models", "engine"},
    "batch": {"batch", "tasks", "models", "engine"},
    "serve": {"serve", "tasks", "models", "engine"},
    "cli": {"cli", "batch", "bench", "serve", "tasks", "models", "engine"},
    "base": set(),
}
MAX_MODULE_LINES = 500  # a cap on one concept's size; split by concept, not by count
MAX_ENGINE_FUNCTION_LINES = 60


@functools.cache
def modules() -> dict[str, ast.Module]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return out


def layer(module: str) -> str:
    if module == "cake_cli.__main__":
        return "cli"
    return "base" if module in BASE else module.split(".")[1]


def project_imports(tree: ast.Module) -> set[str]:
    """Project modules a module imports anywhere: at module level, inside functions, and under
    TYPE_CHECKING (a type-only import is still a dependency a reader must follow)."""
    found = set()
    for sub in ast.walk(tree):
        if isinstance(sub, ast.ImportFrom) and sub.module and sub.level == 0:
            names = [sub.module] + [f"{sub.module}.{a.name}" for a in sub.names]
            found.update(n for n in names if n.startswith("cake_cli"))
        elif isinstance(sub, ast.Import):
            found.update(a.name for a in sub.names if a.name.startswith("cake_cli"))
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: {m for m in project_imports(tree) if m in mods and m != name} for name, tree in mods.items()}


def test_imports_go_one_way():
    bad = []
    for module, targets in graph().items():
        for target in targets:
            if layer(target) != "base" and layer(target) not in ALLOWED[layer(module)]:
                bad.append(f"{module} -> {target}")
    assert not bad, bad


def test_no_import_cycles():
    edges = graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in edges[node]:
            if nxt.startswith(node + ".") or node.startswith(nxt + "."):
                continue  # a package and its own submodules
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt) :] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in edges:
        if node not in state:
            visit(node, [node])
    assert not cycles, cycles


@pytest.mark.slow
def test_engine_imports_neither_the_cli_stack_nor_other_project_packages():
    code = (
        "import sys, cake_cli.engine as e; [getattr(e, n) for n in e.__all__]; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('typer', 'rich', 'click') "
        "or (m.startswith('cake_cli.') and not m.startswith('cake_cli.engine'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_command_line_starts_without_torch():
    heavy = "{'torch', 'transformers'}"
    code = f"import sys, cake_cli.cli.main; print(sorted({{m.split('.')[0] for m in sys.modules}} & {heavy}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("name", sorted(modules()))
def test_modules_are_small(name):
    tree = modules()[name]
    lines = max((getattr(node, "end_lineno", 0) for node in ast.walk(tree)), default=0)
    assert lines <= MAX_MODULE_LINES, f"{name}: {lines} lines"


def test_engine_functions_are_short():
    long = []
    for name, tree in modules().items():
        if layer(name) != "engine":
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = node.body[1:] if ast.get_docstring(node) else node.body  # the docstring is not code
                size = body[-1].end_lineno - body[0].lineno + 1 if body else 0
                if size > MAX_ENGINE_FUNCTION_LINES:
                    long.append(f"{name}.{node.name}: {size} lines")
    assert not long, long


def test_no_module_shadows_a_standard_library_module():
    shadowing = [name for name in modules() if name.rsplit(".", 1)[-1] in sys.stdlib_module_names]
    assert not shadowing, shadowing
