"""A script author's trial of ``--json``: every top-level key each command prints is documented
in docs/cli.md, under the section for that command's schema (check's ``torch`` and the pack,
verify, env and backends objects were printed but documented nowhere before the hqa trial).

Real runs of the installed ``reprokit`` on a generated model:
x[1,16] -> MatMul(3e4) -> Softmax -> y (NaN under emulate:fp16).
"""

from __future__ import annotations

import json
import re

import pytest
from conftest import REPO, run_cli

from tests.models import matmul_overflow_softmax, save

DOCS = (REPO / "docs" / "cli.md").read_text()


def documented(schema: str) -> str:
    """The docs/cli.md section (heading to next heading) that names ``schema``."""
    sections = re.split(r"\n(?=## )", DOCS)
    found = [s for s in sections if f'"{schema}"' in s or f"`{schema}`" in s]
    assert found, f"{schema} is documented nowhere in docs/cli.md"
    return "\n".join(found)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("json")
    model = save(matmul_overflow_softmax(), folder / "model.onnx")
    archive = str(folder / "report.tar.gz")
    runs = {
        "check": run_cli("check", model, "--target", "emulate:fp16", "--json"),
        "pack": run_cli("pack", model, "--target", "emulate:fp16", "-o", archive, "--json"),
        "env": run_cli("env", "--json"),
        "backends": run_cli("backends", "--json"),
    }
    runs["verify"] = run_cli("verify", archive, "--json")
    return runs


@pytest.mark.parametrize(
    "command, code", [("check", 1), ("pack", 0), ("verify", 1), ("env", 0), ("backends", 0)]
)
def test_every_key_of_the_json_output_is_documented(outputs, command, code):
    proc = outputs[command]
    assert proc.returncode == code, proc.stdout + proc.stderr
    printed = json.loads(proc.stdout)
    section = documented(printed["schema"])
    missing = [key for key in printed if f'"{key}"' not in section]
    assert not missing, f"{printed['schema']} prints keys docs/cli.md does not name: {missing}"
    if command == "backends":  # one row per engine: its keys too
        row = printed["backends"][0]
        assert [key for key in row if f'"{key}"' not in section] == []
