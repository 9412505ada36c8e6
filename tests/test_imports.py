"""The package's import graph has no cycle: every import of one sensegraph module by another,
at module level or inside a function, read from the source with ast (nothing is imported)."""
from __future__ import annotations

import ast
from pathlib import Path

import sensegraph

PACKAGE = Path(sensegraph.__file__).parent


def module_names() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, modules: set[str]) -> set[str]:
    """The sensegraph modules `name` imports. `from a import b` counts as importing a.b when b
    is a module, else a; a package's own __init__ is not counted for its submodules (that
    edge exists for every package and is not a cycle of our making)."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            subs = {f"{target}.{a.name}" for a in node.names} & modules
            found |= subs or {target}
    return {m for m in found if m in modules and m != name}


def graph() -> dict[str, set[str]]:
    modules = module_names()
    return {name: imports_of(name, path, set(modules)) for name, path in modules.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_graph_reader_sees_relative_and_function_level_imports():
    edges = graph()
    assert "sensegraph.evaluate.store" in edges["sensegraph.evaluate.judge"]  # from .store import ...
    assert "sensegraph.index.estimate" in edges["sensegraph.cli.index"]  # inside a function
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_among_sensegraph_modules():
    found = cycles(graph())
    assert found == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_nothing_below_the_cli_imports_it():
    edges = graph()
    offenders = {m for m, targets in edges.items() if not m.startswith("sensegraph.cli")
                 and any(t == "sensegraph.cli" or t.startswith("sensegraph.cli.") for t in targets)}
    assert offenders == set()
