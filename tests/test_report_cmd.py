"""Issue 18, finding 2: a report of a ``cmd:`` target reproduces only what it recorded.

The archive is packed from one folder, extracted into another and its repro.py run from a
third: the check script travels in check/, a missing script or package is "could not run here"
(exit 4 / 3, no traceback), and a different failure is never "REPRODUCES".
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import PY, run_cli
from models import make, save, vi
from onnx import helper

CHECK = '''import sys
import onnx
model = onnx.load(sys.argv[1])
if any(node.op_type == "Exp" for node in model.graph.node):
    print(f"error: unsupported operator 'Exp' in {sys.argv[1]}")
    sys.exit(3)
'''


def exp_model():
    # x[1,4] -> Exp -> y[1,4]   (the check script refuses Exp: a build-error verdict)
    return make([helper.make_node("Exp", ["x"], ["y"], name="exp")], [vi("x", [1, 4])], [vi("y", [1, 4])])


def pack_and_extract(tmp_path: Path, command: str) -> Path:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / "my_check.py").write_text(CHECK)
    save(exp_model(), work / "exp.onnx")
    packed = run_cli("pack", "exp.onnx", "--target", f"cmd:{command}", "-o", "report.tar.gz", cwd=work)
    assert packed.returncode == 0, packed.stdout + packed.stderr
    elsewhere = tmp_path / "elsewhere"
    with tarfile.open(work / "report.tar.gz") as archive:
        archive.extractall(elsewhere, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return elsewhere / "report"


def repro(top: Path, tmp_path: Path, *python_flags: str, env=None):
    cwd = tmp_path / "third"
    cwd.mkdir(exist_ok=True)
    return subprocess.run([sys.executable, *python_flags, str(top / "repro.py")], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env=env)


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cmd-report")
    return tmp, pack_and_extract(tmp, f"{PY} my_check.py {{model}} {{inputs}} {{outputs}}")


def test_the_check_script_is_bundled_and_reproduces_from_another_folder(archive):
    tmp, top = archive
    assert (top / "check" / "my_check.py").read_text() == CHECK
    done = repro(top, tmp)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "REPRODUCES" in done.stdout


def test_issue_md_shows_the_command_on_the_bundled_files(archive):
    _, top = archive
    issue = (top / "ISSUE.md").read_text()
    assert "{model}" not in issue.split("## Steps To Reproduce")[1].split("Output here")[0]
    assert "check/my_check.py model.onnx inputs.npz outputs.npz" in issue
    assert "same comparison with polygraphy" not in issue
    commands = (top / "commands.sh").read_text()
    assert "check/my_check.py model.onnx inputs.npz outputs.npz" in commands


def test_a_missing_check_script_is_could_not_run_here_not_reproduces(archive, tmp_path):
    _, packed = archive
    top = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(packed), str(top)], check=True)
    (top / "check" / "my_check.py").unlink()
    done = repro(top, tmp_path)
    assert done.returncode == 4, done.stdout + done.stderr
    assert "COULD NOT RUN HERE" in done.stdout and "REPRODUCES" not in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_a_different_failure_is_not_reproduces(archive, tmp_path):
    """Build errors match by normalized message, not by kind: another error is exit 2."""
    _, packed = archive
    top = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(packed), str(top)], check=True)
    (top / "check" / "my_check.py").write_text("import sys\nprint('Segmentation of the planner failed')\nsys.exit(7)\n")
    done = repro(top, tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "DIFFERENT FAILURE" in done.stdout and "REPRODUCES" not in done.stdout


def test_missing_numpy_or_onnxruntime_is_exit_4_without_traceback(archive, tmp_path):
    """A missing package is the environment, as the CLI's exit 4 (issue 36: one code for "cannot run here")."""
    _, top = archive
    no_site = repro(top, tmp_path, "-I", "-S")  # no site-packages: numpy cannot be imported
    assert no_site.returncode == 4, no_site.stdout + no_site.stderr
    assert "Traceback" not in no_site.stdout + no_site.stderr
    assert "numpy" in no_site.stderr
    # onnxruntime that cannot be imported (a broken install shadows the real one)
    broken = tmp_path / "broken"
    (broken / "onnxruntime").mkdir(parents=True)
    (broken / "onnxruntime" / "__init__.py").write_text("raise ImportError('No module named onnxruntime.capi')\n")
    done = repro(top, tmp_path, env={**os.environ, "PYTHONPATH": str(broken)})
    assert done.returncode == 4, done.stdout + done.stderr
    assert "COULD NOT RUN HERE" in done.stdout and "onnxruntime" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_a_script_outside_the_working_directory_is_named_as_needed(tmp_path):
    """Not bundled: the archive says it is needed, and repro.py refuses to claim without it."""
    outside = tmp_path / "tools"
    outside.mkdir()
    script = outside / "other_check.py"
    script.write_text(CHECK)
    top = pack_and_extract(tmp_path, f"{PY} {script} {{model}}")
    assert not (top / "check").exists()
    assert str(script) in (top / "ISSUE.md").read_text()
    assert "NOT in this archive" in (top / "ISSUE.md").read_text()
    assert repro(top, tmp_path).returncode == 1  # it is still on this machine
    script.unlink()
    done = repro(top, tmp_path)
    assert done.returncode == 4, done.stdout + done.stderr
    assert str(script) in done.stdout and "REPRODUCES" not in done.stdout
