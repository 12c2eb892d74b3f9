"""Figures of leasejobs' structure, read from the source (nothing is imported).

    python docs/structure.py

Prints, for the modules of ``leasejobs/`` (migrations left out): how many
other leasejobs modules import each one (imports inside functions count
too), the import circles among them, and the largest functions in lines.
docs/architecture.md quotes its output.
"""

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def modules(root: Path) -> dict[str, Path]:
    found = {}
    for path in sorted((root / "leasejobs").rglob("*.py")):
        if "migrations" in path.parts:
            continue
        name = ".".join(path.relative_to(root).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The leasejobs modules that ``name`` imports, anywhere in its file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            subs = {f"{base}.{alias.name}" for alias in node.names} & set(known)
            targets.update(subs or {base})
    return {t for t in targets if t in known and t != name}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def main(root: Path = ROOT) -> None:
    known = modules(root)
    graph = {name: imports(name, path, known) for name, path in known.items()}
    importers: dict[str, set[str]] = defaultdict(set)
    for name, targets in graph.items():
        for target in targets:
            importers[target].add(name)
    print(f"{len(known)} modules; imported by how many other leasejobs modules:")
    for name, users in sorted(importers.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        print(f"  {len(users):3d}  {name}")
    found = circles(graph)
    print(f"import circles: {len(found)}")
    for component in found:
        print("  " + " <-> ".join(component))
    functions = []
    for path in known.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno:
                where = f"{path.relative_to(root)}:{node.lineno} {node.name}"
                functions.append((node.end_lineno - node.lineno + 1, where))
    print("largest functions (lines):")
    for lines, where in sorted(functions, reverse=True)[:10]:
        print(f"  {lines:4d}  {where}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
