"""The import graph of `mini/` has no circle, counting imports inside functions too.

Importing `mini.a.b` from outside package `mini.a` counts as importing `mini/a/__init__.py` too. An import
placed inside a function to dodge a loop hides the loop instead of removing it; the layers are
(from the bottom) the shared types and utilities, then core / attention / model / sample, then worker and
structured output, then the engine, then the entry points and benchmarks. Imports under
`if TYPE_CHECKING:` never run and are left out. `from mini import X` follows `mini/__init__.py`'s lazy
table to the module that defines X.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import mini

# It looks inside the engine (scheduler, runner, observers): its engines run in-process in either suite mode.
pytestmark = pytest.mark.inprocess_engine

ROOT = pathlib.Path(mini.__file__).parent


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in ROOT.rglob("*.py")}


def _resolve(base: str, name: str | None) -> str | None:
    """The mini module that `from base import name` (or `import base`) loads."""
    if not base.startswith("mini"):
        return None
    if name is not None:
        candidate = f"{base}.{name}"
        if candidate in MODULES:
            return candidate
        if base == "mini" and name in mini._LAZY:
            return mini._LAZY[name][0]
    return base if base in MODULES else None


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(module: str, path: pathlib.Path) -> set[str]:
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add(_resolve(alias.name, None))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                found.add(_resolve(base, alias.name))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    found.discard(None)
    # Importing mini.a.b from outside package mini.a runs mini/a/__init__.py first: that is an edge too
    # (a module's own enclosing packages are not: they are already importing when it runs).
    for target in list(found):
        pieces = target.split(".")
        for depth in range(2, len(pieces)):
            ancestor = ".".join(pieces[:depth])
            if ancestor in MODULES and not (module == ancestor or module.startswith(ancestor + ".")):
                found.add(ancestor)
    found.discard(module)
    return found  # type: ignore[return-value]


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return circles


GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


def test_the_graph_is_read_from_every_module():
    assert len(GRAPH) > 80
    assert "mini.core.block_pool" in GRAPH["mini.core.kv_cache_manager"]   # a plain import is seen
    assert "mini.roles" in GRAPH["mini"]                                    # `from mini import roles`
    assert "mini.core" in GRAPH["mini.engine.llm_engine"]                   # a package's __init__ runs first


def test_a_circle_would_be_found():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_mini_has_no_import_circle_even_through_function_level_imports():
    circles = _circles(GRAPH)
    described = [" <-> ".join(circle) for circle in circles]
    assert not circles, "import circles in mini/:\n" + "\n".join(described)
