"""The one JSON reader (``reprokit.files.read_json`` / ``parse_json``): every JSON file reprokit
reads back goes through it, bounded in bytes and nesting, and a bad file becomes the site's own
documented answer, never an internal error (exit 70).

Each CLI case plants a bad file where a real run reads it: an archive member, a --resume state
file, the output folder's ledger and lock, the journal. The model is tests.models'
matmul_overflow_softmax (x[1,16] -> MatMul(3e4) -> Softmax -> y: NaN under emulate:fp16).
"""

from __future__ import annotations

import ast
import json
import os
import threading
from pathlib import Path

import pytest
from conftest import assert_user_error, pack_matmul_softmax, run_cli

from reprokit.files import MAX_JSON_DEPTH, UnreadableJSON, parse_json, read_json
from tests.models import matmul_overflow_softmax, save
from tests.test_qa_archives import edited

REPO = Path(__file__).resolve().parent.parent
NESTED = b"[" * 100_000 + b"]" * 100_000  # valid JSON, deeper than Python's recursion limit


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return pack_matmul_softmax(tmp_path_factory.mktemp("pack")).archive


@pytest.fixture
def model(tmp_path):
    return save(matmul_overflow_softmax(), tmp_path / "model.onnx")


def test_no_module_parses_json_but_the_one_reader():
    """A json.load/json.loads call anywhere in reprokit/ but files.py is a reader the bounds miss
    (a round trip of reprokit's own value, json.loads(json.dumps(...)), reads no file)."""
    found = []
    for path in sorted((REPO / "reprokit").rglob("*.py")):
        if path.name == "files.py" and path.parent.name == "reprokit":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("load", "loads")
                and getattr(node.func.value, "id", "") == "json"
            ):
                argument = node.args[0] if node.args else None
                round_trip = (
                    isinstance(argument, ast.Call)
                    and isinstance(argument.func, ast.Attribute)
                    and argument.func.attr == "dumps"
                )
                if not round_trip:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not found, f"JSON read outside reprokit.files.read_json/parse_json: {found}"


def test_the_reader_bounds_bytes_nesting_and_file_kind(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_bytes(NESTED)
    with pytest.raises(UnreadableJSON, match="nests deeper than"):
        read_json(str(deep))
    within = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert parse_json(within) is not None
    with pytest.raises(
        UnreadableJSON, match="nests deeper than"
    ):  # under the recursion limit, past the bound
        parse_json("[" + within + "]")
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"pad": "x" * 2048}))
    with pytest.raises(UnreadableJSON, match="larger than"):
        read_json(str(big), max_bytes=1024)
    with pytest.raises(UnreadableJSON, match="not JSON"):
        parse_json(b"\xff{")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    done = []  # a FIFO with no writer would block an open() for ever: refused before any read

    def read() -> None:
        try:
            read_json(str(fifo))
        except UnreadableJSON as exc:
            done.append(str(exc))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    assert done and "not a regular file" in done[0], "read_json waited on a FIFO"


def test_an_archive_json_past_its_byte_bound_is_a_refused_archive(packed, tmp_path):
    # old code: read whole (any size), and a 9 MB verdict.json reproduced: exit 1
    top = tmp_path / "look"
    from reprokit.report.archive import safe_extract

    verdict = json.loads((Path(safe_extract(packed, str(top))) / "verdict.json").read_text())
    verdict["padding"] = "x" * (9 << 20)
    archive = edited(packed, tmp_path, {"verdict.json": json.dumps(verdict).encode()})
    assert_user_error(
        run_cli("verify", archive),
        3,
        contains="no usable verdict.json (verdict.json is larger than 8 MiB",
    )


def test_a_nested_ledger_owns_nothing_and_is_no_internal_error(model, tmp_path):
    # old code: "internal error: RecursionError" (exit 70) reading OUT/.reprokit/owned.json
    out = tmp_path / "out"
    (out / ".reprokit").mkdir(parents=True)
    (out / ".reprokit" / "owned.json").write_bytes(NESTED)
    (out / "verdict.json").write_text("the user's own notes")
    assert_user_error(
        run_cli("check", model, "--target", "emulate:fp16", "-o", str(out)),
        2,
        contains="was not written by reprokit",
    )
    assert (out / "verdict.json").read_text() == "the user's own notes"


def test_a_nested_lock_file_left_behind_is_taken_over(model, tmp_path):
    # old code: "internal error: RecursionError" (exit 70) reading who left OUT/.reprokit/lock
    out = tmp_path / "out"
    (out / ".reprokit").mkdir(parents=True)
    (out / ".reprokit" / "lock").write_bytes(b"[" * 4000)
    proc = run_cli("check", model, "--target", "emulate:fp16", "-o", str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr  # it diverges: the check ran
    assert "Traceback" not in proc.stderr and (out / "verdict.json").exists()


def test_resume_over_a_nested_run_json_is_an_input_error(model, tmp_path):
    # old code: "internal error: RecursionError" (exit 70) comparing OUT/.reprokit/run.json
    out = tmp_path / "out"
    (out / ".reprokit").mkdir(parents=True)
    (out / ".reprokit" / "run.json").write_bytes(NESTED)
    proc = run_cli(
        "shrink", model, "--target", "emulate:fp16", "-o", str(out), "--resume", "--no-pack"
    )
    assert_user_error(proc, 3, contains="run.json is unreadable", hint_contains="new -o directory")
    assert_user_error(
        run_cli("shrink", "--resume", str(out)), 3, contains="no shrink run to continue"
    )


def test_a_nested_journal_line_is_a_call_made_again(model, tmp_path):
    # old code: "internal error: RecursionError" (exit 70) replaying OUT/.reprokit/journal.jsonl
    out = tmp_path / "out"
    (out / ".reprokit").mkdir(parents=True)
    (out / ".reprokit" / "journal.jsonl").write_bytes(NESTED + b"\n")
    proc = run_cli(
        "shrink", model, "--target", "emulate:fp16", "-o", str(out), "--resume", "--no-pack"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads((out / "summary.json").read_text())["status"] == "done"


def test_matrix_results_nested_past_the_limit_are_no_results(tmp_path):
    """verify --versions's environment marker and the result of a `check MODEL...` fan-out task
    (a cell's own JSON): nested past the limit, the environment is rebuilt and the row has no
    check object, as for any unreadable one."""
    # old code: RecursionError out of envs.intact and fanout._row (uncaught: exit 70)
    from reprokit.matrix import envs, fanout

    (tmp_path / envs.MARKER).write_bytes(NESTED)
    assert "unreadable" in envs.intact(str(tmp_path))
    result = {
        "stdout": NESTED.decode(),
        "argv": ["reprokit", "m.onnx"],
        "gpu": None,
        "exit_code": 1,
        "seconds": 1.0,
        "host": "here",
        "stderr": "",
    }
    row = fanout._row(result)
    assert row["check"] is None and row["words"] == "m.onnx: diverges"
