"""Issue 28, item 10: the README is for a newcomer's first five minutes. It stays short, its two
set-up commands are the ones CI runs, every page it links exists, and the audit PNG it no longer
promises is optional everywhere (a run without matplotlib says so instead of failing)."""

from __future__ import annotations

import os
import re

import numpy as np
from conftest import REPO, run_cli
from models import matmul_overflow, save

README = REPO / "README.md"


def _links(path):
    """Relative link targets of a markdown file (anchors dropped)."""
    text = path.read_text()
    return [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text)
            if not t.startswith(("http://", "https://", "#"))]


def test_readme_is_short_enough_to_read_in_five_minutes():
    assert len(README.read_bytes()) <= 12 * 1024


def test_readme_setup_commands_are_the_ones_ci_runs():
    text = README.read_text()
    block = text.split("```", 2)[1].strip().splitlines()
    first, second = block
    assert first.endswith("reprokit shrink samples/attention_softmax_nan.onnx --target emulate:fp16 -o out/")
    assert "pip install -e '.[openvino]'" in first
    assert second.endswith("pip install -e '.[test]' && python -m pytest -q -n 2")
    ci = (REPO / ".ci" / "run").read_text()
    assert "pip install -q -e '.[test]'" in ci and "\npython -m pytest -q -n 2\n" in ci
    assert "947 s" in text  # the test command's time as CI measured it, not a hopeful guess
    assert os.path.exists(REPO / "samples" / "attention_softmax_nan.onnx")


def test_every_relative_link_of_the_readme_and_docs_resolves():
    pages = [README, *sorted((REPO / "docs").glob("*.md"))]
    missing = []
    for page in pages:
        for target in _links(page):
            if target and not (page.parent / target).exists():
                missing.append(f"{page.relative_to(REPO)} -> {target}")
    assert not missing, missing


def test_readme_story_commands_name_bundled_samples():
    """Each example command of the five stories runs on a file that ships with the repository."""
    text = README.read_text()
    samples = set(re.findall(r"samples/([a-z_]+\.onnx)", text))
    assert len(samples) == 5, samples
    for name in samples:
        assert (REPO / "samples" / name).exists(), name


def test_audit_without_matplotlib_says_the_png_was_not_drawn(tmp_path):
    """The plain install has no matplotlib: audit still writes its files and says why no PNG."""
    shadow = tmp_path / "no_matplotlib" / "matplotlib"
    shadow.mkdir(parents=True)
    # A package of that name that refuses to import: to Python, matplotlib is not installed.
    (shadow / "__init__.py").write_text("raise ImportError('matplotlib is not installed here')\n")
    model = save(matmul_overflow(), tmp_path / "m.onnx")
    np.savez(tmp_path / "in.npz", x=np.random.default_rng(0).uniform(0, 1, (1, 16)).astype(np.float32))
    path = os.pathsep.join(p for p in (str(shadow.parent), os.environ.get("PYTHONPATH")) if p)
    proc = run_cli("audit", model, "--target", "emulate:fp16", "--inputs", str(tmp_path / "in.npz"),
                   "-o", str(tmp_path / "audit"), "--no-sweep", "--no-explain", env={"PYTHONPATH": path})
    assert proc.returncode == 0, proc.stderr
    files = sorted(os.listdir(tmp_path / "audit"))
    assert "layerwise.png" not in files and "audit.html" in files, files
    assert "layerwise.png not drawn: matplotlib is not installed" in proc.stdout, proc.stdout
    assert "layerwise.png" not in proc.stdout.split("wrote", 1)[1]  # not listed as written
    assert "pip install 'reprokit[plot]'" in proc.stdout
