"""The structure drawn from the imports (every import, at module level or inside a function): each goes down the
layers below or stays inside its own package, and no modules import each other in a circle; an import inside a
function says why it is deferred."""

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("base", "allocator", "predictor", "traces", "harvest")
LAYERS = [
    ["base"],
    ["allocator", "predictor", "traces"],
    ["harvest.models", "harvest.step_stats"],
    ["harvest.finetune"],
    ["harvest.fleet"],
    ["harvest.config"],
    ["harvest.colocation"],
    ["harvest.jobs"],
    ["harvest.admin"],
    ["harvest.runtime"],
    ["harvest.worker"],
    ["harvest.sglang"],
    ["harvest.profiler", "harvest.replay", "harvest.doctor", "harvest.bundle", "harvest.deploy"],
    ["harvest.bench"],
    ["harvest.cli"],
    ["harvest"],
]
"""Lowest first; a unit is a top folder, a harvest sub-package, or a module at harvest's root."""


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def import_edges(found: dict[str, Path]) -> dict[str, set[str]]:
    def resolve(name: str) -> str | None:
        while name and name not in found:
            name = name.rpartition(".")[0]
        return name or None

    edges = defaultdict(set)
    for module, path in found.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in names:
                target = resolve(name) if name.split(".")[0] in PACKAGES else None
                if target and target != module and not module.startswith(target + "."):
                    edges[module].add(target)
    return edges


def unit_of(module: str) -> str:
    parts = module.split(".")
    if parts[0] != "harvest" or len(parts) == 1:
        return parts[0]
    return f"harvest.{parts[1]}"


def layer_of(unit: str) -> int:
    return next(i for i, units in enumerate(LAYERS) if unit in units)


def upward_arrows(edges) -> list[str]:
    arrows = []
    for source, targets in edges.items():
        for target in targets:
            a, b = unit_of(source), unit_of(target)
            if a != b and layer_of(b) >= layer_of(a):
                arrows.append(f"{source} -> {target}")
    return sorted(arrows)


def circles(edges) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index, low, on_stack, stack, groups = {}, {}, set(), [], []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in list(edges):
        if node not in index:
            visit(node)
    return groups


def unexplained_deferred_imports(source: str) -> list[int]:
    """Lines of imports inside functions with no reason: none on the import or the line above (`# deferred: ...`),
    nor one for the whole module in its docstring (a line starting `Deferred imports:`)."""
    tree = ast.parse(source)
    docstring = ast.get_docstring(tree) or ""
    if any(line.startswith("Deferred imports:") for line in docstring.splitlines()):
        return []
    lines = source.splitlines()
    functions = [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    deferred = {node.lineno for function in functions for node in ast.walk(function)
                if isinstance(node, (ast.Import, ast.ImportFrom))}
    return sorted(line for line in deferred
                  if not any("# deferred:" in lines[i - 1] for i in (line, line - 1) if i >= 1))


def test_every_unit_has_a_layer():
    units = {unit_of(module) for module in modules()}
    assert not [unit for unit in units if not any(unit in layer for layer in LAYERS)]


def test_no_import_goes_up_a_layer():
    assert upward_arrows(import_edges(modules())) == []


def test_no_modules_import_each_other_in_a_circle():
    assert circles(import_edges(modules())) == []


def test_the_checks_catch_an_arrow_up_and_a_circle():
    edges = {"harvest.admin.admin_app": {"harvest.sglang.launcher"}, "harvest.sglang.launcher": {"harvest.runtime"},
             "harvest.runtime": {"harvest.admin.admin_app"}}
    assert upward_arrows(edges) == ["harvest.admin.admin_app -> harvest.sglang.launcher"]
    assert circles(edges) == [["harvest.admin.admin_app", "harvest.runtime", "harvest.sglang.launcher"]]


def test_every_import_inside_a_function_says_why():
    unexplained = [f"{path.relative_to(REPO)}:{line}" for path in modules().values()
                   for line in unexplained_deferred_imports(path.read_text())]
    assert unexplained == []


def test_the_check_catches_a_deferred_import_without_a_reason():
    source = '''"""A module."""


def f():
    import torch
    # deferred: sglang pulls in CUDA set-up
    import sglang
    import json  # deferred: why not
    return torch, sglang, json
'''
    assert unexplained_deferred_imports(source) == [5]
    assert unexplained_deferred_imports(source.replace('module."""', 'module.\n\nDeferred imports: torch.\n"""')) == []


if __name__ == "__main__":
    edges = import_edges(modules())
    print("\n".join(upward_arrows(edges)) or "no arrow up")
    print("\n".join(" <-> ".join(group) for group in circles(edges)) or "no circle")
