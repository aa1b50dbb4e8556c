"""No import circles inside tandem/: the graph is built from the modules' own import statements.

Every import counts wherever it is written: at module level, inside a function or a class, and
under ``if TYPE_CHECKING:``. An import deferred into a function, or hidden from the run time behind
TYPE_CHECKING, still says that the lower module knows the upper one, so neither may hide a circle:
a circle is broken by moving the shared piece down a level (issue 26). Importing `a.b.c` also runs
`a/__init__` and `a/b/__init__`, so those count as imports too (except a module's own ancestors,
which Python has already started by then).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "tandem"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The tandem modules `module` imports (a `from pkg import name` that names a submodule
    counts as importing that submodule, else as importing the package)."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in known:
                    found.add(sub)
                elif target in known:
                    found.add(target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(module)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE_ROOT.rglob("*.py"))
    known = {module_name(p) for p in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        name = module_name(path)
        tree = ast.parse(path.read_text(), filename=str(path))
        graph[name] = _imports(tree, name, path.name == "__init__.py", known)
    return graph


def with_parent_packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Importing a.b.c first runs a/__init__ and a/b/__init__: add those edges."""
    out = {m: set(deps) for m, deps in graph.items()}
    for m, deps in graph.items():
        for dep in deps:
            parts = dep.split(".")
            for i in range(1, len(parts)):
                parent = ".".join(parts[:i])
                if parent in graph and parent != m and not m.startswith(parent + "."):
                    out[m].add(parent)
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = [0]

    def strongconnect(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return components


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each circle's members (so a message shows a real path)."""
    return [_cycle_in(graph, comp) for comp in circles(graph)]


def _cycle_in(graph: dict[str, set[str]], comp: list[str]) -> list[str]:
    """A shortest cycle through the component's first module (breadth-first)."""
    members, start = set(comp), comp[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start] + path[::-1][1:] + [start] if len(path) > 1 else [start, v, start]
                if w not in previous:
                    previous[w] = v
                    nxt.append(w)
        frontier = nxt
    return comp


def test_graph_sees_the_imports():
    # The graph must be real: a known edge is in it (so the cycle check below cannot pass on an
    # empty graph).
    graph = import_graph()
    assert "tandem.engine.llm_engine" in graph
    assert "tandem.core.scheduler" in graph["tandem.engine.llm_engine"]


def test_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles():
    graph = with_parent_packages(import_graph())
    found = circles(graph)
    assert not found, "import circles inside tandem/ (break each by moving the shared piece " \
        "down a level):\n" + "\n".join(
            f"  {' -> '.join(_cycle_in(graph, comp))}   (all of: {', '.join(comp)})"
            for comp in found)


def test_deferred_and_type_checking_imports_count():
    source = ("from typing import TYPE_CHECKING\n"
              "if TYPE_CHECKING:\n    from tandem.a import X\n"
              "def f():\n    from .b import y\n    import tandem.c\n")
    known = {"tandem.a", "tandem.pkg.b", "tandem.c", "tandem.pkg.m"}
    assert _imports(ast.parse(source), "tandem.pkg.m", False, known) == {
        "tandem.a", "tandem.pkg.b", "tandem.c"}
