"""Issue 28, item 1: reprokit never writes over a file it did not create. ``-o`` naming a file the
command reads (the model, its external data, --inputs) or a folder where the run would write
over one is refused with exit 2 before any engine runs; an existing output file needs --force;
a user's files in an output folder are replaced only with --force, and reprokit's own files
(recorded in OUT/.reprokit/owned.json) are rewritten freely. Every case runs on copies in
tmp_path and compares the user's bytes before and after."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from conftest import PY, assert_user_error, run_cli
from models import matmul_overflow, save, save_external

from reprokit.standalone.arrays import save_npz


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def project(tmp_path):
    """proj/model.onnx (x[1,16] -> MatMul(3e4) -> y: inf in fp16) and proj/inputs.npz (its feeds)."""
    proj = tmp_path / "proj"
    proj.mkdir()
    save(matmul_overflow(), proj / "model.onnx")
    save_npz(str(proj / "inputs.npz"), {"x": np.full((1, 16), 0.9, np.float32)})
    return proj


@pytest.fixture
def never_runs(tmp_path):
    """A cmd target that leaves a file behind if it ever runs: proof that no engine was called."""
    (tmp_path / "mark.py").write_text("import pathlib, sys\npathlib.Path(sys.argv[1]).write_text('ran')\n")
    mark = tmp_path / "ran.txt"
    return f"cmd:{PY} {tmp_path / 'mark.py'} {mark}", mark


def test_pack_onto_its_own_model_is_refused(project):
    model = project / "model.onnx"
    before = digest(model)
    proc = run_cli("pack", str(model), "--inputs", str(project / "inputs.npz"), "-t", "emulate:fp16",
                   "-o", str(model), cwd=project)
    assert_user_error(proc, 2, contains="reads")
    assert digest(model) == before


def test_pack_onto_its_inputs_is_refused_even_with_force(project):
    feeds = project / "inputs.npz"
    before = digest(feeds)
    for extra in ((), ("--force",)):
        proc = run_cli("pack", str(project / "model.onnx"), "--inputs", str(feeds), "-t", "emulate:fp16",
                       "-o", str(feeds), *extra, cwd=project)
        assert_user_error(proc, 2, contains="inputs.npz")
        assert digest(feeds) == before


def test_pack_onto_the_models_external_data_is_refused(tmp_path):
    model = save_external(matmul_overflow(), tmp_path / "ext.onnx", location="w.bin")
    weights = tmp_path / "w.bin"
    before = digest(weights)
    proc = run_cli("pack", model, "-t", "emulate:fp16", "-o", str(weights), "--force", cwd=tmp_path)
    assert_user_error(proc, 2, contains="w.bin")
    assert digest(weights) == before


def test_pack_replaces_an_existing_archive_only_with_force(project, never_runs):
    target, mark = never_runs
    archive = project / "report.tar.gz"
    archive.write_bytes(b"the user's own archive")
    proc = run_cli("pack", str(project / "model.onnx"), "-t", target, "-o", str(archive), cwd=project)
    assert_user_error(proc, 2, contains="exists", hint_contains="--force")
    assert archive.read_bytes() == b"the user's own archive"
    assert not mark.exists()  # refused before any engine call
    proc = run_cli("pack", str(project / "model.onnx"), "-t", "emulate:fp16", "-o", str(archive), "--force",
                   cwd=project)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert archive.read_bytes()[:2] == b"\x1f\x8b"  # now reprokit's gzip archive
    assert not [p.name for p in project.iterdir() if ".writing" in p.name]  # the atomic write's temporary is gone


def test_shrink_into_the_project_folder_keeps_the_users_files(project, never_runs):
    """``shrink proj/model.onnx --inputs proj/inputs.npz -o proj``: inputs.npz is read and would be
    rewritten (refused even with --force); a minimal.onnx of the user's is refused unless --force."""
    target, mark = never_runs
    feeds = project / "inputs.npz"
    before = digest(feeds)
    for extra in ((), ("--force",)):
        proc = run_cli("shrink", str(project / "model.onnx"), "--inputs", str(feeds), "-t", target,
                       "-o", str(project), *extra, cwd=project)
        assert_user_error(proc, 2, contains="inputs.npz")
    assert digest(feeds) == before
    assert not mark.exists()

    (project / "minimal.onnx").write_text("the user's own minimal model")
    proc = run_cli("shrink", str(project / "model.onnx"), "-t", target, "-o", str(project), cwd=project)
    assert_user_error(proc, 2, contains="minimal.onnx", hint_contains="--force")
    assert (project / "minimal.onnx").read_text() == "the user's own minimal model"
    assert not mark.exists()


def test_shrink_into_a_folder_with_other_user_files_writes_beside_them(project):
    """Files whose names reprokit does not write are left alone; the run's own files are recorded,
    so a second command into the same folder may rewrite them."""
    notes = project / "notes.txt"
    notes.write_text("mine")
    out = project / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine too")
    proc = run_cli("shrink", str(project / "model.onnx"), "-t", "emulate:fp16", "-o", str(out), "--no-pack",
                   "--max-calls", "0", cwd=project, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "minimal.onnx").exists() and (out / "notes.txt").read_text() == "mine too"
    owned = json.loads((out / ".reprokit" / "owned.json").read_text())["patterns"]
    assert "minimal.onnx" in owned and "notes.txt" not in owned
    # check -o into the folder shrink wrote: inputs.npz is reprokit's, so no --force is needed
    proc = run_cli("check", str(out / "minimal.onnx"), "-t", "emulate:fp16", "-o", str(out), cwd=project)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert (out / "verdict.json").exists() and (out / "notes.txt").read_text() == "mine too"


@pytest.mark.parametrize("command,folder,name,text", [("check", "checked", "verdict.json", "{}"),
                                                     ("audit", "audited", "audit.md", "my notes")])
def test_out_folder_refuses_the_users_own_file(project, never_runs, command, folder, name, text):
    target, mark = never_runs
    out = project / folder
    out.mkdir()
    (out / name).write_text(text)
    proc = run_cli(command, str(project / "model.onnx"), "-t", target, "-o", str(out), cwd=project)
    assert_user_error(proc, 2, contains=name)
    assert (out / name).read_text() == text
    assert not mark.exists()


def test_check_out_folder_holding_its_inputs_is_refused(project):
    proc = run_cli("check", str(project / "model.onnx"), "--inputs", str(project / "inputs.npz"),
                   "-t", "emulate:fp16", "-o", str(project), "--force", cwd=project)
    assert_user_error(proc, 2, contains="inputs.npz")


def test_pack_audit_folder_is_claimed_and_its_ledger_stays_out_of_the_archive(project):
    import tarfile

    (project / "r.audit").mkdir()
    (project / "r.audit" / "audit.md").write_text("my notes")
    args = ("pack", str(project / "model.onnx"), "-t", "emulate:fp16", "--audit", "-o", "r.tar.gz")
    proc = run_cli(*args, cwd=project, timeout=300)
    assert_user_error(proc, 2, contains="audit.md")
    assert (project / "r.audit" / "audit.md").read_text() == "my notes"
    proc = run_cli(*args, "--force", cwd=project, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with tarfile.open(project / "r.tar.gz") as archive:
        names = archive.getnames()
    assert "r/audit/audit.json" in names and not [n for n in names if ".reprokit" in n], names


def test_verify_versions_out_replaces_a_users_file_only_with_force(tmp_path):
    """verify --versions -o: the new archive never replaces the archive verified (even through a
    link), and a file that is not a matrix archive reprokit wrote only with --force."""
    from reprokit.errors import UsageError
    from reprokit.matrix.run import _check_out

    archive, mine = tmp_path / "r.tar.gz", tmp_path / "mine.tar.gz"
    archive.write_bytes(b"archive")
    mine.write_bytes(b"not reprokit's")
    (tmp_path / "link.tar.gz").symlink_to(archive)
    with pytest.raises(UsageError, match="not a matrix archive") as refused:
        _check_out(str(mine), str(archive))
    assert "--force" in refused.value.hint
    _check_out(str(mine), str(archive), force=True)
    for same in (archive, tmp_path / "link.tar.gz"):
        with pytest.raises(UsageError, match="archive being verified"):
            _check_out(str(same), str(archive), force=True)
    proc = run_cli("verify", str(archive), "--force", cwd=tmp_path)
    assert_user_error(proc, 2, contains="--force go with --versions")
