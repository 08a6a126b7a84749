"""The package's shape, checked from the code: scripts/check_imports.py finds no import cycle, no
upward import between wings and no hidden (function-local) import of reprokit on the real tree,
and finds each of those on a small tree made to have one; standalone/ imports nothing of reprokit
(repro.py embeds those files verbatim). See docs/architecture.md."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "check_imports.py"
EMBEDDED = "# repro.py: embedded above"  # bundle._module_source drops these lines


def run_checker(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--root", str(root), *args],
                          capture_output=True, text=True, timeout=120)


def test_the_tree_has_no_cycle_no_upward_and_no_hidden_import():
    proc = run_checker(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith("no cycle, no upward import"), proc.stdout


def make_tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "reprokit" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for folder in {p.parent for p in (root / "reprokit").rglob("*.py")}:
        (folder / "__init__.py").touch()
    return root


def test_checker_names_a_cycle_counting_function_local_imports(tmp_path):
    # graph/a.py ──module level──▶ graph/b.py ──inside a function──▶ graph/a.py
    make_tree(tmp_path, {
        "graph/a.py": "from reprokit.graph.b import g\n",
        "graph/b.py": "def g():\n    from reprokit.graph.a import f  # lazy: test\n    return f\n",
    })
    proc = run_checker(tmp_path)
    assert proc.returncode == 1
    assert "cycle: reprokit.graph.a ↔ reprokit.graph.b" in proc.stdout


def test_checker_names_an_upward_import(tmp_path):
    make_tree(tmp_path, {"graph/a.py": "from reprokit.engine.b import run\n", "engine/b.py": "run = 1\n"})
    proc = run_checker(tmp_path)
    assert proc.returncode == 1
    assert "upward: reprokit.graph.a:1 → reprokit.engine.b (graph imports engine, which sits above it)" in proc.stdout


def test_checker_names_an_unexplained_function_local_import(tmp_path):
    make_tree(tmp_path, {
        "engine/a.py": "def f():\n    from reprokit.graph.b import g\n    return g\n",
        "engine/c.py": "def f():\n    from reprokit.graph.b import g  # lazy: kept light for a test\n    return g\n",
        "graph/b.py": "g = 1\n",
    })
    proc = run_checker(tmp_path)
    assert proc.returncode == 1
    assert "function-local: reprokit.engine.a:2 → reprokit.graph.b" in proc.stdout
    assert "reprokit.engine.c" not in proc.stdout


def test_checker_passes_imports_that_go_down_and_writes_the_picture(tmp_path):
    make_tree(tmp_path, {
        "cli.py": "from reprokit.shrink import steps\nfrom reprokit.errors import E\n",
        "shrink/steps.py": "from reprokit.engine.oracle import O\nfrom reprokit import __version__\n",
        "engine/oracle.py": "from reprokit.graph.model import m\nfrom reprokit.spec import s\nO = 1\n",
        "graph/model.py": "from reprokit.standalone.names import n\nm = 1\n",
        "standalone/names.py": "n = 1\n",
        "errors.py": "E = 1\n",
        "spec.py": "from reprokit.engine.backends.registry import r\ns = 1\n",
        "engine/backends/registry.py": "r = 1\n",
    })
    picture = tmp_path / "deps.md"
    proc = run_checker(tmp_path, "--mermaid", str(picture))
    assert proc.returncode == 0, proc.stdout
    text = picture.read_text()
    assert "flowchart TD" in text
    for arrow in ("top -->|1| shrink", "shrink -->|1| engine", "engine -->|1| graph",
                  "graph -->|1| standalone", "top -->|1| base", "engine -->|1| base"):
        assert arrow in text, (arrow, text)


@pytest.mark.parametrize("path", sorted((ROOT / "reprokit" / "standalone").glob("*.py")), ids=lambda p: p.name)
def test_standalone_module_imports_nothing_of_reprokit(path):
    """A standalone module may read another standalone module only where repro.py embeds that one
    above it (the import line marked, and dropped from the embedded copy); nothing else of reprokit."""
    lines = path.read_text().splitlines()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            names = [("." * node.level) + (node.module or "")]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            if name.startswith(".") or name.split(".")[0] == "reprokit":
                assert name.startswith("reprokit.standalone."), (path.name, node.lineno, name)
                assert EMBEDDED in lines[node.lineno - 1], (path.name, node.lineno, name)
