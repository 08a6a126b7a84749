"""Where reprokit writes (the hqa trial): never outside its output folder, even when the folder
holds a link where its state goes; and what ``verify`` says when handed an unpacked folder.

Real runs of the installed ``reprokit`` on x[1,16] -> MatMul(3e4) -> y (inf under emulate:fp16).
"""

from __future__ import annotations

import os

import pytest
from conftest import assert_user_error, pack_matmul_softmax, run_cli

from reprokit.report.archive import safe_extract
from tests.models import matmul_overflow, save


@pytest.mark.parametrize("command", [["shrink", "--no-pack"], ["check"]])
def test_a_link_where_the_run_state_goes_is_refused_and_nothing_lands_behind_it(tmp_path, command):
    # old code: shrink wrote run.json, journal.jsonl, owned.json ... into the linked folder (and
    # its clean-up deleted there); check -o wrote its ledger and lock there
    model = save(matmul_overflow(), tmp_path / "m.onnx")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(elsewhere, out / ".reprokit")
    proc = run_cli(command[0], model, "--target", "emulate:fp16", "-o", str(out), *command[1:])
    assert_user_error(proc, 2, contains=".reprokit is a link", hint_contains="remove the link")
    assert list(elsewhere.iterdir()) == []
    assert sorted(p.name for p in out.iterdir()) == [".reprokit"]


def test_verify_of_an_unpacked_folder_says_so(tmp_path):
    # old code: "archive not found: FOLDER", which it is not
    archive = pack_matmul_softmax(tmp_path).archive
    top = safe_extract(archive, str(tmp_path / "unpacked"))
    assert_user_error(
        run_cli("verify", top),
        3,
        contains="is a folder, not an archive",
        hint_contains="not a folder unpacked from it",
    )


@pytest.mark.parametrize("role", ["model", "--inputs", "--ignore-positions", "verify"])
def test_a_fifo_in_place_of_a_file_is_refused_at_once(tmp_path, role):
    # old code: --inputs and --ignore-positions waited for ever on the FIFO (and --inputs /dev/zero
    # read until memory ran out); the model was called "empty", the archive "not found"
    fifo = str(tmp_path / "pipe")
    os.mkfifo(fifo)
    model = save(matmul_overflow(), tmp_path / "m.onnx")
    args = {
        "model": ["check", fifo, "--target", "emulate:fp16"],
        "--inputs": ["check", model, "--target", "emulate:fp16", "--inputs", fifo],
        "--ignore-positions": [
            "check",
            model,
            "--target",
            "emulate:fp16",
            "--ignore-positions",
            fifo,
        ],
        "verify": ["verify", fifo],
    }[role]
    proc = run_cli(*args, timeout=60)
    assert_user_error(proc, 3, contains="not a")
    assert "empty" not in proc.stderr and "not found" not in proc.stderr


def test_resume_of_a_run_state_nested_past_the_recursion_limit_is_an_input_error(tmp_path):
    # old code: "internal error: RecursionError" (exit 70) reading OUT/.reprokit/run.json
    state = tmp_path / "out" / ".reprokit"
    state.mkdir(parents=True)
    (state / "run.json").write_text("[" * 100_000 + "]" * 100_000)
    assert_user_error(
        run_cli("shrink", "--resume", str(tmp_path / "out")),
        3,
        contains="no shrink run to continue",
    )
