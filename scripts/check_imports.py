"""Check reprokit's own import graph: no cycle, no upward import between wings, no hidden import.

Reads every module under ``reprokit/`` with ``ast`` (nothing is imported or run) and collects
each ``import``/``from … import`` of reprokit itself, module-level and function-local alike.

Rules (docs/architecture.md explains them):

- **wings in order** — a module may import its own wing and the wings below it, never above:
  ``top`` (cli, api, console, terminal, torch_export, matrix/) → ``audit`` → ``shrink`` → ``report`` → ``engine`` →
  ``convert`` → ``graph`` → ``standalone``. Base modules — ``errors``, ``spec``, the backend
  name table ``engine/backends/registry`` that ``spec`` validates against, and ``files`` (what
  reprokit may write and how: the output claims and atomic writes) — may be imported by
  anyone and import nothing of reprokit but each other and ``standalone``. The package itself
  (``reprokit/__init__``: ``__version__`` and a lazy ``check``) is imported by Python before any
  of its modules, so importing it is allowed everywhere and is no edge of a cycle.
- **no cycle** between modules, counting function-local imports (an import inside a function is
  still a dependency: it only hides it).
- **module level** — reprokit's own imports sit at module level. A function-local one is allowed
  only with a ``# lazy:`` comment on its line saying why (e.g. to keep ``import reprokit`` light).
- ``standalone/`` imports nothing of reprokit: ``repro.py`` embeds those files verbatim.

Usage::

    python scripts/check_imports.py                # report violations; exit 1 if any
    python scripts/check_imports.py --write-docs   # also redraw the pictures in docs/

``--write-docs`` writes ``docs/dependencies.md`` (the wing picture and every module's imports) and
redraws the wing picture between the ``dependency-picture`` markers of ``docs/architecture.md``.

The exit status is 0 when the tree follows every rule, 1 otherwise.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "reprokit"

# Highest first. A module may import from its own wing or any wing after it in this list.
WINGS = ("top", "audit", "shrink", "report", "engine", "convert", "graph", "standalone")
# Base modules: importable from every wing; they themselves import only base and standalone/.
BASE = ("reprokit.errors", "reprokit.spec", "reprokit.engine.backends.registry", "reprokit.files")
# The top wing: commands and entry points (matrix/ is verify --versions: it prints through console).
TOP = ("cli", "api", "console", "terminal", "torch_export", "__main__", "matrix")
LAZY_MARK = "# lazy:"


@dataclass(frozen=True)
class Edge:
    source: str  # importing module, dotted
    target: str  # imported module, dotted
    line: int
    local: bool  # inside a function (or method) body
    lazy_ok: bool  # carries the "# lazy:" justification


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def discover(root: Path) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted((root / PACKAGE).rglob("*.py"))}


def wing_of(module: str) -> str:
    """``reprokit.shrink.passes.named`` → ``shrink``; top-level modules → ``top`` or base."""
    parts = module.split(".")
    if module in BASE:
        return "base"
    if len(parts) == 1 or parts[1] in TOP:
        return "top"
    if parts[1] in WINGS:
        return parts[1]
    return "unplaced"


def _resolve(node: ast.ImportFrom, source: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = source.split(".")
    # A package's own name counts as its first level; a module's parent is one level up.
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _targets(node: ast.AST, source: str, is_package: bool, modules: set[str]) -> list[str]:
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        assert isinstance(node, ast.ImportFrom)
        base = _resolve(node, source, is_package)
        # ``from reprokit.shrink import steps`` imports the module reprokit.shrink.steps.
        names = [
            f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
            for alias in node.names
        ]
    out = []
    for name in names:
        if name != PACKAGE and not name.startswith(PACKAGE + "."):
            continue
        # ``import reprokit.a.b`` where b is a name, not a module: fall back to the module.
        while name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        if name not in out:
            out.append(name)
    return out


def edges_of(module: str, path: Path, modules: set[str]) -> list[Edge]:
    text = path.read_text()
    lines = text.splitlines()
    tree = ast.parse(text, filename=str(path))
    is_package = path.name == "__init__.py"
    found: list[Edge] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                end = child.end_lineno or child.lineno
                marked = any(LAZY_MARK in lines[i - 1] for i in range(child.lineno, end + 1))
                for target in _targets(child, module, is_package, modules):
                    if target != module:
                        found.append(Edge(module, target, child.lineno, in_function, marked))
            nested = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            visit(child, nested)

    visit(tree, False)
    return found


def collect(root: Path = ROOT) -> list[Edge]:
    found = discover(root)
    modules = set(found)
    return [edge for name, path in found.items() for edge in edges_of(name, path, modules)]


def _rank(wing: str) -> int:
    return WINGS.index(wing)


def upward(edge: Edge) -> str | None:
    """Why this edge breaks the wing order, or None when it is allowed."""
    src, dst = wing_of(edge.source), wing_of(edge.target)
    if "unplaced" in (src, dst):
        return "a module in no wing: place it in scripts/check_imports.py's WINGS or TOP"
    if src == "standalone" and dst != "standalone":
        return "standalone/ imports reprokit (repro.py embeds it verbatim)"
    if edge.target == PACKAGE or dst == "base" or src == dst:
        return None
    if src == "base":
        return None if dst == "standalone" else f"base module imports {dst}"
    if _rank(dst) < _rank(src):
        return f"{src} imports {dst}, which sits above it"
    return None


def cycles(edges: list[Edge]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for edge in edges:
        if edge.target == PACKAGE:  # always initialised first: no cycle runs through it
            continue
        graph[edge.source].add(edge.target)
        graph.setdefault(edge.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def violations(edges: list[Edge]) -> list[str]:
    out = []
    for edge in edges:
        why = upward(edge)
        if why:
            out.append(f"upward: {edge.source}:{edge.line} → {edge.target} ({why})")
        if edge.local and not edge.lazy_ok:
            out.append(
                f"function-local: {edge.source}:{edge.line} → {edge.target} "
                f"(move it to module level, or say why with '{LAZY_MARK} …')"
            )
    for component in cycles(edges):
        inside = set(component)
        path = [f"{e.source}:{e.line}→{e.target}" for e in edges if {e.source, e.target} <= inside]
        out.append(f"cycle: {' ↔ '.join(component)} (edges: {', '.join(path)})")
    return out


def mermaid(edges: list[Edge]) -> str:
    """The wing-level picture: one box per wing, an arrow per importing pair with its count."""
    counts: Counter[tuple[str, str]] = Counter()
    for edge in edges:
        src = wing_of(edge.source)
        dst = "base" if edge.target == PACKAGE else wing_of(edge.target)  # reprokit.__version__
        if src != dst:
            counts[src, dst] += 1
    labels = {
        "top": "cli · api · console · terminal · torch_export · matrix/",
        "base": "errors · spec · backends/registry · files",
    }
    order = list(WINGS) + ["base"]
    lines = ["```mermaid", "flowchart TD"]
    for wing in order:
        lines.append(f'    {wing}["{labels.get(wing, wing + "/")}"]')
    for (src, dst), n in sorted(counts.items(), key=lambda kv: (order.index(kv[0][0]), order.index(kv[0][1]))):
        lines.append(f"    {src} -->|{n}| {dst}")
    lines.append("```")
    return "\n".join(lines) + "\n"


def modules_table(edges: list[Edge]) -> str:
    """Module → the reprokit modules it imports, one line each, for reading a wing in detail."""
    deps: dict[str, set[str]] = defaultdict(set)
    for edge in edges:
        deps[edge.source].add(edge.target)
    rows = ["| module | imports |", "| --- | --- |"]
    for name in sorted(deps, key=lambda m: (_rank(w) if (w := wing_of(m)) in WINGS else -1, m)):
        short = sorted(t.removeprefix(PACKAGE + ".") for t in deps[name])
        rows.append(f"| `{name.removeprefix(PACKAGE + '.')}` | {', '.join(short)} |")
    return "\n".join(rows) + "\n"


def picture(edges: list[Edge]) -> str:
    return (
        "# reprokit's dependency picture\n\n"
        "Generated by `python scripts/check_imports.py --write-docs` from the code (do not edit by\n"
        "hand). Arrows go from the importing wing to the imported one; the number counts import\n"
        "statements. See docs/architecture.md for the rules.\n\n"
        + mermaid(edges)
        + "\n## Module by module\n\n"
        + modules_table(edges)
    )


START, END = "<!-- dependency-picture:start -->", "<!-- dependency-picture:end -->"


def write_docs(root: Path, edges: list[Edge]) -> None:
    (root / "docs" / "dependencies.md").write_text(picture(edges))
    page = root / "docs" / "architecture.md"
    if page.exists() and START in (text := page.read_text()) and END in text:
        head, rest = text.split(START, 1)
        page.write_text(head + START + "\n" + mermaid(edges) + END + rest.split(END, 1)[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository root")
    parser.add_argument("--mermaid", type=Path, help="write the dependency picture to this file")
    parser.add_argument("--write-docs", action="store_true",
                        help="redraw docs/dependencies.md and the picture in docs/architecture.md")
    args = parser.parse_args(argv)
    edges = collect(args.root)
    if args.mermaid:
        args.mermaid.write_text(picture(edges))
    if args.write_docs:
        write_docs(args.root, edges)
    found = violations(edges)
    for line in found:
        print(line)
    modules = len(discover(args.root))
    local = sum(e.local for e in edges)
    print(
        f"{modules} modules, {len(edges)} imports of reprokit ({local} function-local): "
        + (f"{len(found)} violation(s)" if found else "no cycle, no upward import")
    )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
