"""The version matrix's trust boundary (issue 37 item 1 and the exit-code contract): ``verify
--versions`` runs reprokit's own reproducer on the archive's data in every cell, local or on a Ray
worker, never the archive's repro.py unless ``--run-archive-code`` is given; an archive that is
malformed in any way plain ``verify`` refuses is refused before the first cell; only exit 1 with
the REPRODUCES line counts as "reproduces".

Real archives (conftest.pack_matmul_softmax: x[1,16] -> MatMul(3e4) -> Softmax, NaN under
emulate:fp16) edited as a hostile sender would (a file changed, MANIFEST.json recomputed), real uv
environments of the onnxruntime installed here, a real in-process Ray cluster.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import assert_user_error, pack_matmul_softmax, private_env_cache, run_cli

from reprokit.errors import InputError, UsageError
from reprokit.report.archive import safe_extract, write_archive, write_manifest

ORT = __import__("onnxruntime").__version__
SPEC = f"onnxruntime=={ORT}"


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> str:
    return pack_matmul_softmax(tmp_path_factory.mktemp("pack")).archive


def edited(archive: str, tmp_path: Path, edit: Callable[[Path], None], name: str = "edited") -> str:
    """The archive after ``edit(top)``, with a MANIFEST.json that matches again (any sender can
    recompute it)."""
    top = Path(safe_extract(archive, str(tmp_path / f"{name}-x")))
    edit(top)
    manifest = json.loads((top / "MANIFEST.json").read_text())
    os.remove(top / "MANIFEST.json")
    write_manifest(str(top), {k: v for k, v in manifest.items() if k not in ("schema", "files")})
    out = str(tmp_path / f"{name}.tar.gz")
    write_archive(str(top), out, "tar.gz")
    shutil.rmtree(tmp_path / f"{name}-x")
    return out


def add_line(line: str):
    """An edit: one line added to repro.py right after its imports."""

    def edit(top: Path) -> None:
        text = (top / "repro.py").read_text()
        (top / "repro.py").write_text(
            text.replace("\nimport tempfile\n", "\nimport tempfile\n" + line + "\n", 1)
        )

    return edit


def json_file(name: str, value):
    def edit(top: Path) -> None:
        (top / name).write_text(json.dumps(value))

    return edit


def verdict_change(**changes):
    def edit(top: Path) -> None:
        verdict = json.loads((top / "verdict.json").read_text())
        verdict.update(changes)
        (top / "verdict.json").write_text(json.dumps(verdict))

    return edit


# -- refused before any cell: no uv, no index, nothing run ----------------------------------------


@pytest.mark.parametrize(
    "edit,message",
    [
        (
            json_file("verdict.json", [1, 2]),
            "verdict.json does not follow its schema: the file must be an object",
        ),
        (json_file("env.json", [1, 2]), "env.json reprokit cannot read"),
        (verdict_change(criterion=None), "criterion must be an object"),
        (verdict_change(signature="x"), "signature must be an object"),
        (verdict_change(target="cmd:/usr/bin/touch /tmp/reprokit-h37a-pwned"), "runs a command"),
        (verdict_change(reference="cmd:/usr/bin/touch /tmp/reprokit-h37a-pwned"), "runs a command"),
    ],
)
def test_versions_refuses_what_plain_verify_refuses_before_any_cell(
    packed, tmp_path, edit, message
):
    """Each was accepted (exit 0 after the cells) or crashed (exit 70) at 21297fd."""
    from reprokit.matrix.run import verify_versions

    archive = edited(packed, tmp_path, edit)
    cells = []
    with pytest.raises(InputError, match=message):
        verify_versions(archive, SPEC, out_path=str(tmp_path / "m.tar.gz"), on_event=cells.append)
    assert cells == [] and not (tmp_path / "m.tar.gz").exists()  # not even the index was asked
    assert not os.path.exists("/tmp/reprokit-h37a-pwned")


def test_versions_refuses_a_bad_out_before_any_cell(packed, tmp_path):
    """-o under a file (no folder can be made there): exit 2 at once, not exit 70 after the cells."""
    (tmp_path / "plain").write_text("a file")
    proc = run_cli("verify", packed, "--versions", SPEC, "-o", str(tmp_path / "plain" / "m.tar.gz"))
    assert_user_error(proc, 2, contains="--out")
    assert "listing" not in proc.stderr and "running" not in proc.stderr


def test_run_archive_code_goes_with_versions(packed):
    proc = run_cli("verify", packed, "--run-archive-code")
    assert_user_error(proc, 2, contains="--run-archive-code")


def test_the_reproducer_is_reprokits_own_rendering(packed, tmp_path):
    """The script a cell gets is rendered from reprokit's template: the archive's edited repro.py
    is not in it; the archive's values enter only as literals in SETTINGS."""
    from reprokit.report.reproducer import Origin, runnable
    from reprokit.report.verify import open_archive

    marker = "open('/tmp/reprokit-h37a-pwned', 'w')"
    archive = edited(packed, tmp_path, add_line(marker))
    top, recorded = open_archive(archive, str(tmp_path / "x"))
    plan = runnable(top, recorded, archive)
    assert plan.origin is Origin.REPROKIT and marker not in plan.script
    assert "repro.py" not in plan.names() and "model.onnx" in dict(plan.files())
    own = runnable(top, recorded, archive, run_archive_code=True)
    assert own.origin is Origin.ARCHIVE and marker in own.script
    quoted = edited(
        packed, tmp_path, verdict_change(target='emulate:fp16"""\nimport os'), name="quoted"
    )
    top, recorded = open_archive(quoted, str(tmp_path / "y"))
    with pytest.raises(
        (InputError, UsageError)
    ):  # not a target reprokit knows: refused, never embedded
        runnable(top, recorded, quoted)


def test_the_reproducer_for_a_tensorrt_target_carries_reprokits_tensorrt_facts(packed, tmp_path):
    """A cell asked for a trt target renders reprokit's reproducer with reprokit's own TensorRT
    facts, as pack writes them. Without them its repro.py stopped on a KeyError (exit 70, an
    "error" row) wherever a tensorrt module imports. A FAKE ``tensorrt`` module (only a
    ``__version__`` too old for strongly typed builds; the version gate is under test, not
    TensorRT) stands on PYTHONPATH: the reproducer says it cannot run here (4)."""
    import subprocess
    import sys

    from reprokit.report.reproducer import runnable
    from reprokit.report.verify import open_archive

    top, recorded = open_archive(packed, str(tmp_path / "x"))
    plan = runnable(top, recorded, packed, target="trt:strongly-typed,fp16")
    Path(top, "own.py").write_text(plan.script)
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "tensorrt.py").write_text("__version__ = '8.6.1'\n")
    env = {**os.environ, "PYTHONPATH": str(fake)}
    ran = subprocess.run([sys.executable, "own.py", "--target", "trt:strongly-typed,fp16"], cwd=top,
                         capture_output=True, text=True, timeout=300, env=env)
    assert ran.returncode == 4, ran.stdout[-1500:] + ran.stderr[-1500:]
    assert "COULD NOT RUN HERE" in ran.stdout and "KeyError" not in ran.stderr


@pytest.mark.parametrize(
    "code,stdout,outcome",
    [
        (1, "Traceback (most recent call last):\nRuntimeError: boom\n", "error"),
        (1, "REPRODUCES: nonfinite, as reported\n", "reproduces"),
        (70, "", "error"),
        (0, "", "error"),
        (0, "DOES NOT REPRODUCE: every output agrees\n", "does not reproduce"),
        (2, "usage: repro.py [-h]\n", "error"),
        (4, "COULD NOT RUN HERE: model.onnx is missing\n", "cannot run"),
    ],
)
def test_only_exit_1_with_its_line_reproduces(code, stdout, outcome):
    """The exit-code contract (0 no, 1 yes, 3/4 cannot run here, anything else an error): an
    exception exits 1 too, and was counted as "reproduces" at 21297fd."""
    from reprokit.matrix.cells import judge_exit

    assert judge_exit(code, stdout, "").__getitem__(0).value == outcome


# -- real cells ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def env_cache(tmp_path_factory):
    yield from private_env_cache(tmp_path_factory)


@pytest.fixture(scope="module")
def tampered(packed, tmp_path_factory):
    """repro.py with one line that writes a file (a fixed path: a Ray worker has its own
    environment variables); the archive and that path."""
    folder = tmp_path_factory.mktemp("tampered")
    pwned = folder / "PWNED"
    return edited(packed, folder, add_line(f"open({str(pwned)!r}, 'w').write('ran')")), pwned


def _matrix(archive, tmp_path, **kw):
    from reprokit.errors import MatrixNoAnswer
    from reprokit.matrix.run import verify_versions

    try:
        return verify_versions(
            archive, SPEC, out_path=str(tmp_path / f"m{len(os.listdir(tmp_path))}.tar.gz"), **kw
        )
    except MatrixNoAnswer as exc:  # no cell gave a verdict: the rows as far as they went
        return exc.result


@pytest.mark.slow
def test_a_tampered_archive_runs_none_of_its_code_without_the_opt_in(tampered, env_cache, tmp_path):
    """At 21297fd the cell ran the archive's repro.py: the file was written."""
    archive, pwned = tampered
    pwned.unlink(missing_ok=True)
    result = _matrix(archive, tmp_path)
    assert [r["outcome"] for r in result.rows] == ["reproduces"], (
        result.rows
    )  # reprokit's reproducer
    assert not pwned.exists()
    assert result.payload["ran"].startswith("reprokit's own reproducer")
    opted = _matrix(archive, tmp_path, run_archive_code=True)
    assert pwned.read_text() == "ran" and [r["outcome"] for r in opted.rows] == ["reproduces"]
    assert "--run-archive-code" in opted.payload["ran"]


@pytest.mark.slow
def test_an_archive_repro_py_that_raises_is_an_error_not_a_reproduction(
    packed, env_cache, tmp_path
):
    """Exit 1 from an uncaught exception: "reproduces" at 21297fd."""
    archive = edited(packed, tmp_path, add_line("raise RuntimeError('not the bug')"))
    result = _matrix(archive, tmp_path, run_archive_code=True)
    assert [r["outcome"] for r in result.rows] == ["error"], result.rows
    assert "RuntimeError: not the bug" in result.rows[0]["why"]


@pytest.fixture(scope="module")
def ray_cluster(env_cache):
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'reprokit[matrix]'")
    # one GPU Ray is told of (the cells run on the CPU); workers see REPROKIT_ENV_CACHE
    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.mark.slow
def test_on_ray_a_tampered_archive_runs_none_of_its_code_without_the_opt_in(
    tampered, tmp_path, ray_cluster
):
    archive, pwned = tampered
    pwned.unlink(missing_ok=True)
    result = _matrix(archive, tmp_path, ray_address="auto")
    assert [r["outcome"] for r in result.rows] == ["reproduces"], result.rows
    assert not pwned.exists()
    _matrix(archive, tmp_path, ray_address="auto", run_archive_code=True)
    assert pwned.read_text() == "ran"


@pytest.mark.slow
def test_a_poisoned_environment_is_detected_and_rebuilt(env_cache):
    """At 21297fd onnxruntime/__init__.py was a hard link into uv's cache (a line appended there
    reached every later environment) and a cached environment was reused unchecked."""
    import glob

    from reprokit.matrix.envs import EnvRequest, ensure_env, intact

    request = EnvRequest((f"onnxruntime=={ORT}",))
    env = ensure_env(request)
    site = Path(glob.glob(os.path.join(env.path, "lib", "python*", "site-packages"))[0])
    init = site / "onnxruntime" / "__init__.py"
    assert os.stat(init).st_nlink == 1  # a copy: writing it cannot reach uv's cache
    clean = init.read_text()
    with open(init, "a") as handle:
        handle.write("\nopen('/tmp/reprokit-h37a-pwned', 'w')\n")
    assert "onnxruntime/__init__.py differs from its RECORD hash" in intact(env.path)
    again = ensure_env(request)
    assert again.built and "onnxruntime/__init__.py" in again.rebuilt_why
    assert init.read_text() == clean
    (site / "zz-startup.pth").write_text("import os\n")  # runs at every interpreter start
    again = ensure_env(request)
    assert again.built and "zz-startup.pth was added" in again.rebuilt_why
    assert not (site / "zz-startup.pth").exists() and intact(env.path) is None
    assert ensure_env(request).built is False  # intact: reused


def _sleeper(packed, tmp_path, name):
    """An archive whose repro.py (run with --run-archive-code) marks that it runs, then waits."""
    mark = tmp_path / f"{name}.running"
    line = f"open({str(mark)!r}, 'w').close(); __import__('time').sleep(60)"
    return edited(packed, tmp_path, add_line(line), name=name), mark


def _start(archive, env_cache, out):
    import subprocess
    import sys

    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "reprokit",
            "verify",
            archive,
            "--versions",
            SPEC,
            "--run-archive-code",
            "-o",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "REPROKIT_ENV_CACHE": str(env_cache)},
    )


def _wait_for(path: Path, process, seconds: float = 180) -> None:
    import time

    deadline = time.monotonic() + seconds
    while not path.exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the cell never started"
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.0, 0.13, 0.41])
def test_ctrl_c_while_a_cell_runs_is_always_exit_130(packed, env_cache, tmp_path, delay):
    """At 21297fd an interrupt landing inside a lock of the waiting loop ended in "release
    unlocked lock", exit 70 (2 of 13 tries); now the handler only notes it."""
    import signal
    import time

    archive, mark = _sleeper(packed, tmp_path, "sleeper")
    process = _start(archive, env_cache, tmp_path / "m.tar.gz")
    _wait_for(mark, process)
    time.sleep(delay)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "Error: interrupted" in err and "Traceback" not in err


@pytest.mark.slow
def test_matrix_clean_keeps_the_environment_a_running_cell_uses(packed, env_cache, tmp_path):
    """At 21297fd clean removed it under the running cell."""
    import signal

    archive, mark = _sleeper(packed, tmp_path, "sleeper")
    process = _start(archive, env_cache, tmp_path / "m.tar.gz")
    try:
        _wait_for(mark, process)
        in_use = [
            p
            for p in env_cache.iterdir()
            if p.is_dir()
            and (p / "reprokit-env.json").exists()
            and "onnx" in json.loads((p / "reprokit-env.json").read_text())["packages"]
        ]
        done = run_cli("matrix", "clean", "--json", env={"REPROKIT_ENV_CACHE": str(env_cache)})
        assert done.returncode == 0, done.stderr
        cleaned = json.loads(done.stdout)
        assert in_use and all(p.name in cleaned["busy"] and p.is_dir() for p in in_use), cleaned
    finally:
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=60)


@pytest.mark.slow
def test_on_ray_a_gpu_target_asks_for_a_gpu_without_gpus(packed, tmp_path, ray_cluster):
    """A CUDA target's cell asks Ray for a GPU of its own (Ray then sets CUDA_VISIBLE_DEVICES for
    it); at 21297fd it asked for none without --gpus and shared the devices unaccounted."""
    seen = tmp_path / "devices"
    line = f"open({str(seen)!r}, 'w').write(os.environ.get('CUDA_VISIBLE_DEVICES', 'unset'))"
    archive = edited(packed, tmp_path, add_line(line))
    _matrix(archive, tmp_path, ray_address="auto", target="ort:cuda", run_archive_code=True)
    assert seen.read_text() == "0"


def test_check_on_ray_says_the_models_need_a_shared_filesystem(tmp_path):
    """check --ray ships paths: a worker that lacks the model says so instead of a bare 'not a
    file' from a reprokit it started for nothing."""
    from reprokit.matrix.executor import run_reprokit

    result = run_reprokit(["check", str(tmp_path / "elsewhere.onnx"), "--json"], timeout=60)
    assert result["exit_code"] is None and "a filesystem every node shares" in result["stderr"]


def test_help_states_the_boundary():
    proc = run_cli("verify", "--help")
    text = " ".join(proc.stdout.split())
    assert proc.returncode == 0
    assert (
        "never the archive's repro.py" in text and "--run-archive-code" in text and "RISK" in text
    )


@pytest.mark.slow
def test_a_burst_of_ctrl_c_while_cells_run_is_exit_130(packed, env_cache, tmp_path):
    """Ten SIGINTs 20 ms apart while the first environment is built (a user pressing Ctrl-C
    again): at 21297fd a second interrupt landed inside the clean-up's locks, "release unlocked
    lock" or a traceback, exit 70."""
    import signal
    import subprocess
    import sys
    import time

    cache = tmp_path / "envs"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "reprokit",
            "verify",
            packed,
            "--versions",
            SPEC,
            "-o",
            str(tmp_path / "m.tar.gz"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "REPROKIT_ENV_CACHE": str(cache)},
    )
    try:
        deadline = time.monotonic() + 120
        while not any(p.is_dir() for p in cache.glob("*")) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert process.poll() is None, process.communicate()
        for _ in range(10):
            process.send_signal(signal.SIGINT)
            time.sleep(0.02)
        out, err = process.communicate(timeout=60)
    finally:  # a verify that hangs after the burst fails the test, and is not left running
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, err
    assert err.count("Error: interrupted") == 1 and "Traceback" not in err, err
