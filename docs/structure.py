"""Figures of leasejobs' structure, read from the source (nothing is imported), and
the check that docs/architecture.md matches the code.

    python docs/structure.py            # the figures
    python docs/structure.py --check    # docs/architecture.md against the code; exit 1 on drift

The figures, for the modules of ``leasejobs/`` (migrations left out): how
many other leasejobs modules import each one (imports inside functions
count too), the import circles among them, the imports that run to a
higher layer, and the largest modules and functions.

``--check`` reads the two tables of docs/architecture.md, the layers (rank,
name) and the modules (module, layer, job, imports), and says, one line
each, what does not hold:

- every module of the code has a row, and every row is a module of the code;
- each row's imports are the leasejobs modules its file imports;
- each module has a layer the layers table names;
- no import circle;
- no import to a module of a higher layer;
- no module over ``MAX_LINES`` lines, but those the doc lists as known to
  be over it (and a module listed there must still be).

Names in the tables are dotted paths below ``leasejobs`` (``db.sql.claim``);
the package itself is ``leasejobs``.
"""

import ast
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = Path("docs/architecture.md")
MAX_LINES = 600


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
        for w in sorted(graph[v]):
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


def short(name: str) -> str:
    """``leasejobs.db.sql`` -> ``db.sql``; the package itself stays ``leasejobs``."""
    return name.removeprefix("leasejobs.")


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def _names(cell: str) -> set[str]:
    return set(re.findall(r"`([^`]+)`", cell))


def read_doc(text: str) -> tuple[dict[str, int], dict[str, tuple[str, set[str]]], set[str]]:
    """The layers (name: rank), the modules (name: (layer, imports)) and the modules
    known to be over ``MAX_LINES``, from the tables of docs/architecture.md."""
    layers: dict[str, int] = {}
    rows: dict[str, tuple[str, set[str]]] = {}
    oversized: set[str] = set()
    table = None
    for line in text.splitlines():
        if not line.startswith("|"):
            table = None
            if line.startswith("Known to be over"):
                oversized |= _names(line)
            continue
        cells = _cells(line)
        if table is None:
            table = (
                "layers"
                if cells[:2] == ["rank", "layer"]
                else "modules"
                if cells[:2] == ["module", "layer"]
                else ""
            )
            continue
        if set(line) <= set("|-: "):
            continue
        if table == "layers":
            layers[cells[1].strip("`")] = int(cells[0])
        elif table == "modules":
            (name,) = _names(cells[0]) or {cells[0]}
            rows[name] = (cells[1].strip("`"), _names(cells[3]))
    return layers, rows, oversized


def problems(root: Path = ROOT) -> list[str]:
    """What in docs/architecture.md does not hold for the code, one sentence each."""
    known = modules(root)
    graph = {short(name): {short(t) for t in imports(name, path, known)} for name, path in known.items()}
    lines = {short(name): len(path.read_text().splitlines()) for name, path in known.items()}
    layers, rows, oversized = read_doc((root / DOC).read_text())
    found = []
    for name in sorted(set(graph) - set(rows)):
        found.append(f"{name}: a module of the code that {DOC} does not list")
    for name in sorted(set(rows) - set(graph)):
        found.append(f"{name}: listed in {DOC} but no such module")
    for name in sorted(set(rows) & set(graph)):
        layer, listed = rows[name]
        if listed != graph[name]:
            missing, extra = sorted(graph[name] - listed), sorted(listed - graph[name])
            found.append(f"{name}: its imports column misses {missing} and names {extra} wrongly")
        if layer not in layers:
            found.append(f"{name}: its layer {layer!r} is not in the layers table")
    for component in circles(graph):
        found.append("import circle: " + " <-> ".join(component))
    for name, target in upward(graph, layers, rows):
        found.append(f"{name} imports {target}, of a higher layer")
    for name in sorted(lines):
        if lines[name] > MAX_LINES and name not in oversized:
            found.append(f"{name}: {lines[name]} lines, over {MAX_LINES}")
    for name in sorted(oversized):
        if lines.get(name, 0) <= MAX_LINES:
            found.append(f"{name}: listed as over {MAX_LINES} lines but it is not (any more)")
    return found


def upward(
    graph: dict[str, set[str]], layers: dict[str, int], rows: dict[str, tuple[str, set[str]]]
) -> list[tuple[str, str]]:
    """Imports from a module to one of a higher layer (both with a known layer)."""

    def rank(name: str) -> int | None:
        return layers.get(rows[name][0]) if name in rows else None

    found = []
    for name in sorted(graph):
        for target in sorted(graph[name]):
            mine, theirs = rank(name), rank(target)
            if mine is not None and theirs is not None and theirs > mine:
                found.append((name, target))
    return found


def main(root: Path = ROOT) -> None:
    known = modules(root)
    graph = {short(name): {short(t) for t in imports(name, path, known)} for name, path in known.items()}
    importers: dict[str, set[str]] = defaultdict(set)
    for name, targets in graph.items():
        for target in targets:
            importers[target].add(name)
    print(f"{len(known)} modules; imported by how many other leasejobs modules (the first 15):")
    for name, users in sorted(importers.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:15]:
        print(f"  {len(users):3d}  {name}")
    found = circles(graph)
    print(f"import circles: {len(found)}")
    for component in found:
        print("  " + " <-> ".join(component))
    doc = root / DOC
    if doc.exists():
        layers, rows, _ = read_doc(doc.read_text())
        up = upward(graph, layers, rows)
        print(f"imports that run up to a higher layer (layers of {DOC}): {len(up)}")
        for name, target in up:
            print(f"  {name} -> {target}")
    sizes = sorted(((len(p.read_text().splitlines()), short(n)) for n, p in known.items()), reverse=True)
    print("largest modules (lines):")
    for lines, name in sizes[:5]:
        print(f"  {lines:4d}  {name}")
    functions = []
    for path in known.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno:
                where = f"{path.relative_to(root)}:{node.lineno} {node.name}"
                functions.append((node.end_lineno - node.lineno + 1, where))
    print("largest functions (lines):")
    for lines, where in sorted(functions, reverse=True)[:5]:
        print(f"  {lines:4d}  {where}")


def check(root: Path = ROOT) -> int:
    found = problems(root)
    for problem in found:
        print(problem)
    if not found:
        print(f"{DOC} matches the code.")
    return 1 if found else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--check"]:
        sys.exit(check(Path(args[1]) if len(args) > 1 else ROOT))
    main(Path(args[0]) if args else ROOT)
