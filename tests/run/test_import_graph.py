"""No import cycles among the project's modules (pipeline/, models/, data_prep/, conventions/): every import counts,
at module level, inside a function (the lazy ones) or under `if TYPE_CHECKING:`. A cycle that works only because one
of its imports is lazy is still a cycle: models/kernels.py swapped classes of models/bert.py that bert.py's constructor
imported kernels.py to swap, and pipeline/downstream/finetune.py read the family registry whose families import its
schema."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pipeline", "models", "data_prep", "conventions")


def project_modules() -> dict[str, Path]:
    """Dotted name -> file, a package under its own name (its __init__.py)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _with_parents(name: str, modules: dict[str, Path]) -> set[str]:
    """Importing a.b.c runs a's and a.b's __init__ first: the project modules an import of `name` loads."""
    parts = name.split(".")
    return {m for m in (".".join(parts[:i]) for i in range(1, len(parts) + 1)) if m in modules}


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `name` imports, wherever in the file the import is."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found |= _with_parents(alias.name, modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from its package (a package's own __init__ is its package)
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            found |= _with_parents(source, modules)
            for alias in node.names:  # `from pkg import sub` imports the submodule pkg.sub
                if f"{source}.{alias.name}" in modules:
                    found.add(f"{source}.{alias.name}")
    found.discard(name)
    # a module importing its own package's __init__ is what Python does anyway before running it: no edge
    return {m for m in found if not name.startswith(m + ".")}


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[tuple[list[str], list[str]]]:
    """Each strongly connected component of more than one module (Tarjan's), with one cycle through it as a closed
    path of imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:  # iterative, so that deep chains do not reach the recursion limit
        work = [(v, iter(sorted(graph[v])))]
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return [(component, _cycle_in(component, graph)) for component in components]


def _cycle_in(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest closed path through the component's first module (breadth-first within the component)."""
    members, start = set(component), component[0]
    parent = {start: None}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    path = [v]
                    while parent[path[-1]] is not None:
                        path.append(parent[path[-1]])
                    return [*reversed(path), start]
                if w not in parent:
                    parent[w] = v
                    following.append(w)
        frontier = following
    raise AssertionError(f"no cycle through {start}")


def test_the_graph_sees_every_kind_of_import(tmp_path):
    """Lazy, TYPE_CHECKING, relative and `from package import submodule` imports are edges."""
    modules = {"pipeline": ROOT, "pipeline.a": ROOT, "pipeline.b": ROOT, "pipeline.c": ROOT, "pipeline.d": ROOT,
               "pipeline.sub": ROOT, "pipeline.sub.e": ROOT}
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pipeline.a import X\n"
              "def f():\n    import pipeline.b\n"
              "from pipeline import c\nfrom . import d\nfrom .sub.e import Y\n")
    path = tmp_path / "probe.py"
    path.write_text(source)
    found = imports_of("pipeline.probe", path, modules)
    assert found == {"pipeline.a", "pipeline.b", "pipeline.c", "pipeline.d", "pipeline.sub", "pipeline.sub.e"}
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [(["a", "b", "c"], ["a", "b", "c", "a"])]


def test_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 100 and {"pipeline.families", "models.kernels", "data_prep.corpus"} <= graph.keys()
    cycles = import_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(
        f"{' -> '.join(cycle)}  (all {len(component)} modules of this knot: {', '.join(component)})"
        for component, cycle in cycles)
