"""Trust boundaries (issue 16, findings 1 and 2): ``verify`` runs nothing an archive chose, and
tensor names that are np.savez's own parameters travel like any other name.

Everything runs for real: archives packed by ``pack`` with the emulate backend, then edited the
way a hostile sender would (verdict.json changed, MANIFEST.json rewritten to match), and the
installed ``reprokit`` command on tiny generated models.
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import PY, assert_user_error, pack_matmul_softmax, run_cli
from onnx import TensorProto, helper

from reprokit.report.archive import safe_extract, write_archive, write_manifest
from tests.models import make, save, vi


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """The MatMul→Softmax archive (conftest.pack_matmul_softmax), packed once for the module."""
    return pack_matmul_softmax(tmp_path_factory.mktemp("pack")).archive


def hostile(archive: str, tmp_path: Path, **changes) -> str:
    """The archive with verdict.json fields replaced and a matching MANIFEST.json, as a
    hostile sender would write it."""
    top = Path(safe_extract(archive, str(tmp_path / "edit")))
    verdict = json.loads((top / "verdict.json").read_text())
    verdict.update(changes)
    (top / "verdict.json").write_text(json.dumps(verdict))
    manifest = json.loads((top / "MANIFEST.json").read_text())
    os.remove(top / "MANIFEST.json")
    write_manifest(str(top), {k: v for k, v in manifest.items() if k not in ("schema", "files")})
    out = str(tmp_path / "hostile.tar.gz")
    write_archive(str(top), out, "tar.gz")
    shutil.rmtree(tmp_path / "edit")
    return out


# -- finding 1: verify never executes what the archive chose -------------------------------------


def test_verify_refuses_a_recorded_cmd_target_and_runs_nothing(packed, tmp_path):
    pwned = tmp_path / "PWNED"
    target = f"cmd:/usr/bin/touch {pwned}"
    archive = hostile(packed, tmp_path, target=target)
    proc = run_cli("verify", archive)
    error, hint = assert_user_error(proc, 3, contains="runs a command")
    assert target in error  # the recorded target is shown
    assert "--target" in hint
    assert not pwned.exists()


def test_verify_refuses_a_recorded_cmd_reference(packed, tmp_path):
    pwned = tmp_path / "PWNED"
    archive = hostile(packed, tmp_path, reference=f"cmd:/usr/bin/touch {pwned}")
    proc = run_cli("verify", archive, "--target", "emulate:fp16")
    assert_user_error(proc, 3, contains="reference")
    assert not pwned.exists()


def test_verify_refuses_a_recorded_path_option(packed, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    archive = hostile(packed, tmp_path, target=f"trt:fp16,timing-cache={victim}")
    proc = run_cli("verify", archive)
    error, _ = assert_user_error(proc, 3, contains="timing-cache")
    assert str(victim) in error
    assert victim.read_text() == "keep me"


def test_an_explicit_target_runs_the_users_choice(packed, tmp_path):
    archive = hostile(packed, tmp_path, target=f"cmd:/usr/bin/touch {tmp_path / 'PWNED'}")
    proc = run_cli("verify", archive, "--target", "emulate:fp16")
    assert proc.returncode == 1, proc.stderr  # reproduces: the user chose a built-in engine
    assert "cmd:/usr/bin/touch" in proc.stdout  # the recorded target is printed
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("regex", ["(a+)+$", "(x|xx)*y", r"(\w)\1", "a" * 201, ".*a.*b.*c.*d", "("])
def test_verify_refuses_a_recorded_regex_that_can_backtrack_for_ever(packed, tmp_path, regex):
    archive = hostile(packed, tmp_path, fail_regex=regex)
    proc = run_cli("verify", archive, "--target", f"cmd:{PY} -c pass")
    assert_user_error(proc, 3, contains="fail_regex")


def test_verify_accepts_a_plain_recorded_regex(packed, tmp_path):
    archive = hostile(packed, tmp_path, fail_regex=r"Error Code \d+: .*unsupported")
    assert run_cli("verify", archive).returncode == 1  # not a cmd target: the regex stays unused
    proc = run_cli("verify", archive, "--target", f"cmd:{PY} -c pass")
    assert proc.returncode == 0 and "Error" not in proc.stderr, proc.stderr


# -- finding 2: tensor names that are np.savez's parameters --------------------------------------


def savez_names_model(scale: float):
    """Inputs named like np.savez's parameters and with a '/'; MatMul by ``scale`` overflows fp16
    when scale is large."""
    # file[1,4] + allow_pickle[1,4] -> s ; s + a/b[1,4] -> t ; t * scale -> y[1,4]
    return make(
        [
            helper.make_node("Add", ["file", "allow_pickle"], ["s"], name="add1"),
            helper.make_node("Add", ["s", "a/b"], ["t"], name="add2"),
            helper.make_node("Mul", ["t", "k"], ["y"], name="mul"),
        ],
        [vi("file", [1, 4]), vi("allow_pickle", [1, 4]), vi("a/b", [1, 4])],
        [vi("y", [1, 4])],
        [helper.make_tensor("k", TensorProto.FLOAT, [], [scale])],
    )


@pytest.mark.parametrize("scale, code", [(1.0, 0), (1e5, 1)])
def test_inputs_named_file_and_allow_pickle_get_their_verdict(tmp_path, scale, code):
    path = save(savez_names_model(scale), tmp_path / "m.onnx")
    out = tmp_path / "out"
    proc = run_cli("check", path, "--target", "emulate:fp16", "-o", str(out), "--json")
    assert proc.returncode == code, proc.stderr
    kind = json.loads(proc.stdout)["verdict"]["signature"]["kind"]
    assert kind == ("agree" if code == 0 else "nonfinite")
    with np.load(out / "inputs.npz") as data:  # plain numpy reads what reprokit wrote
        assert sorted(data.files) == ["a/b", "allow_pickle", "file"]
    again = run_cli("check", path, "--target", "emulate:fp16", "--inputs", str(out / "inputs.npz"))
    assert again.returncode == code, again.stderr


def test_a_cmd_target_gets_inputs_named_file(tmp_path):
    path = save(savez_names_model(1.0), tmp_path / "m.onnx")
    script = tmp_path / "check.py"
    script.write_text("import sys, numpy as np\n"
                      "d = np.load(sys.argv[1])\n"
                      "sys.exit(0 if sorted(d.files) == ['a/b', 'allow_pickle', 'file'] else 3)\n")
    proc = run_cli("check", path, "--target", f"cmd:{PY} {script} {{inputs}}")
    assert proc.returncode == 0, proc.stderr


def test_npz_transport_keeps_every_dtype_and_any_name(tmp_path):
    import ml_dtypes

    from reprokit.standalone.arrays import load_npz, save_npz

    arrays = {
        "file": np.arange(6, dtype=np.float32).reshape(2, 3),
        "allow_pickle": np.array([True, False]),
        "a/b": np.arange(4, dtype=np.int64),
        "bf16": np.array([1.5, -2.0, 3e38], dtype=ml_dtypes.bfloat16),
        "f8": np.array([1.0, -448.0], dtype=ml_dtypes.float8_e4m3fn),
        "f8e5": np.array([1.0, 2.0], dtype=ml_dtypes.float8_e5m2),
        "int4": np.array([-8, 7], dtype=ml_dtypes.int4),
        "uint4": np.array([0, 15], dtype=ml_dtypes.uint4),
        "strings": np.array(["a", "bc"], dtype=object),
        "fp16": np.array([65504.0], dtype=np.float16),
    }
    path = save_npz(str(tmp_path / "a.npz"), arrays)
    back = load_npz(path)
    assert list(back) == list(arrays)
    for name, value in arrays.items():
        assert back[name].dtype == value.dtype, name
        assert back[name].tobytes() == value.tobytes() if value.dtype != object else list(back[name]) == list(value)
    with np.load(path, allow_pickle=False) as data:  # any numpy reads it; no extra members
        assert data.files == list(arrays)
    with zipfile.ZipFile(path) as archive:
        assert archive.getinfo("bf16.npy").comment == b"reprokit-dtype:bfloat16"


# -- finding 8: archive layout clashes, weights linked out of the model folder ----------------------


@pytest.mark.filterwarnings("ignore:Duplicate name")
@pytest.mark.parametrize("order", [("top/a", "top/a/b"), ("top/a/b", "top/a"), ("top/a", "top/a")])
def test_a_zip_whose_file_is_also_a_folder_is_refused_cleanly(tmp_path, order):
    archive = tmp_path / "clash.zip"
    with zipfile.ZipFile(archive, "w") as handle:
        for name in order:
            handle.writestr(name, b"x")
    proc = run_cli("verify", str(archive))
    assert_user_error(proc, 3, contains="clashes with an earlier member")


def test_a_tar_whose_file_is_also_a_folder_is_refused_cleanly(tmp_path):
    import io
    import tarfile

    archive = tmp_path / "clash.tar.gz"
    with tarfile.open(archive, "w:gz") as handle:
        for name in ("top/a", "top/a/b"):
            info = tarfile.TarInfo(name)
            info.size = 1
            handle.addfile(info, io.BytesIO(b"x"))
    assert_user_error(run_cli("verify", str(archive)), 3, contains="clashes with an earlier member")


def linked_weights_model(tmp_path: Path, target_dir: Path) -> str:
    """model/m.onnx whose external weight file model/weights.bin is a symlink into ``target_dir``."""
    from tests.models import big_weights, save_external

    exported = tmp_path / "exported"
    exported.mkdir()
    save_external(big_weights(), exported / "m.onnx")
    target_dir.mkdir(exist_ok=True)
    shutil.move(exported / "weights.bin", target_dir / "secret.bin")
    folder = tmp_path / "model"
    folder.mkdir()
    shutil.move(exported / "m.onnx", folder / "m.onnx")
    os.symlink(target_dir / "secret.bin", folder / "weights.bin")
    return str(folder / "m.onnx")


@pytest.mark.parametrize("outside", ["elsewhere", "model-sibling"])
def test_a_weight_file_linked_out_of_the_model_folder_is_refused(tmp_path, outside):
    # "model-sibling" shares the folder's name as a prefix: containment needs the separator
    path = linked_weights_model(tmp_path, tmp_path / outside)
    proc = run_cli("check", path, "--target", "emulate:fp16", "-o", str(tmp_path / "out"))
    error, hint = assert_user_error(proc, 3, contains="resolves outside the model folder")
    assert "weights.bin" in error and "link" in hint
    pack_proc = run_cli("pack", path, "--target", "emulate:fp16", "-o", str(tmp_path / "r.tar.gz"))
    assert_user_error(pack_proc, 3, contains="resolves outside the model folder")
    assert not (tmp_path / "r.tar.gz").exists()


def test_inlining_refuses_a_link_out_of_the_folder_and_keeps_a_link_inside(tmp_path):
    import onnx

    from reprokit.errors import InputError
    from reprokit.graph.io import inline_external_data

    path = linked_weights_model(tmp_path, tmp_path / "model-x")
    with pytest.raises(InputError, match="resolves outside"):
        inline_external_data(onnx.load(path, load_external_data=False), os.path.dirname(path))
    folder = Path(path).parent
    os.remove(folder / "weights.bin")
    shutil.copy(tmp_path / "model-x" / "secret.bin", folder / "real.bin")
    os.symlink("real.bin", folder / "weights.bin")  # a link that stays inside is fine
    model = inline_external_data(onnx.load(path, load_external_data=False), str(folder))
    assert model.graph.initializer[0].raw_data
