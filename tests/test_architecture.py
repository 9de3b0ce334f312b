"""The package's modules import each other without a circle.

Every module under ``scopegraph/`` is parsed (not imported). An import of another scopegraph module
counts wherever it is written, at module level or inside a function, because either way one module
needs the other to work; an import under ``if TYPE_CHECKING:`` does not, because it never runs.
``from . import x`` counts as an import of the submodule ``x`` when there is one, else of the
package itself. Importing a submodule also runs its parent packages' ``__init__``, but that is
Python's mechanics, not a dependency the code chose, so it is not counted.
"""

from __future__ import annotations

import ast
import graphlib
import itertools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "scopegraph"


def module_names() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (packages by their ``__init__``)."""
    names = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


class _Imports(ast.NodeVisitor):
    """Collects the targets of every import statement that runs, resolved against the package."""

    def __init__(self, module: str, is_package: bool, modules: set[str]) -> None:
        self.package = module if is_package else module.rpartition(".")[0]
        self.modules = modules
        self.found: dict[str, int] = {}  # imported module -> first line

    def _add(self, name: str, line: int) -> None:
        if name in self.modules:
            self.found.setdefault(name, line)

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            for child in node.orelse:  # only the else branch runs
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.package.split(".")
            base = base[: len(base) - (node.level - 1)]
            target = ".".join([*base, *([node.module] if node.module else [])])
        else:
            target = node.module or ""
        for alias in node.names:
            submodule = f"{target}.{alias.name}"
            if submodule in self.modules:
                self._add(submodule, node.lineno)
            else:
                self._add(target, node.lineno)


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {module it imports: line of the first such import}."""
    files = module_names()
    modules = set(files)
    graph = {}
    for name, path in files.items():
        visitor = _Imports(name, path.name == "__init__.py", modules)
        visitor.visit(ast.parse(path.read_text(), filename=str(path)))
        graph[name] = {target: line for target, line in visitor.found.items() if target != name}
    return graph


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's algorithm: the groups of modules that all reach each other (only groups of two or more)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def describe_cycle(cycle: list[str], graph: dict[str, dict[str, int]], files: dict[str, Path]) -> str:
    steps = []
    for a, b in itertools.pairwise(cycle):
        where = files[a].relative_to(PACKAGE.parent)
        steps.append(f"  {a} imports {b}  ({where}:{graph[a][b]})")
    return "\n".join(steps)


def test_the_parser_sees_imports() -> None:
    graph = import_graph()
    assert "scopegraph" in graph and "scopegraph._graph" in graph
    assert graph["scopegraph"], "scopegraph/__init__.py imports its modules"


def test_no_import_circle() -> None:
    graph = import_graph()
    sorter = graphlib.TopologicalSorter({module: set(targets) for module, targets in graph.items()})
    try:
        sorter.prepare()
    except graphlib.CycleError as err:
        cycle: list[str] = list(reversed(err.args[1]))  # graphlib lists it against the import direction
        groups = strongly_connected(graph)
        message = [f"import circle: {' -> '.join(cycle)}", describe_cycle(cycle, graph, module_names())]
        for group in groups:
            message.append(f"{len(group)} modules import each other, directly or not: {', '.join(group)}")
        raise AssertionError("\n".join(message)) from None
