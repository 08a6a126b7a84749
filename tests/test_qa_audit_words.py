"""audit.md says what ran, on the bundled samples/layernorm_overflow.onnx under emulate:fp16.
Found on e970ed4 and hqa's 3b3eb5d (the test fails there): the tested workaround was stored under
the payload's "precision" key, over the target's precision ("fp16"), so audit.md printed the
search's whole dict as "Range audit ({'method': 'packed', ...}, no engine call)" and "Every weight
fits {...}"; and its note said "even all 140 ranked nodes in fp32 do not bring the model within
tolerance" beside a sweep row whose 4-node set agrees (that set keeps nodes the ranking lacks).
"""

from __future__ import annotations

import json
from pathlib import Path

from conftest import run_cli

SAMPLES = Path(__file__).resolve().parents[1] / "samples"


def test_audit_md_names_the_precision_and_never_contradicts_its_sweep(tmp_path):
    done = run_cli("audit", str(SAMPLES / "layernorm_overflow.onnx"), "--target", "emulate:fp16", "--inputs",
                   str(SAMPLES / "layernorm_overflow.inputs.npz"), "-o", str(tmp_path / "a"), timeout=600)  # fmt: skip
    assert done.returncode in (0, 1), done.stdout + done.stderr
    text = (tmp_path / "a" / "audit.md").read_text()
    payload = json.loads((tmp_path / "a" / "audit.json").read_text())
    assert payload["precision"] == "fp16"
    assert "**Range audit** (fp16, no engine call)" in text and "{'method'" not in text, text[:600]
    assert "Every weight fits fp16" in text
    assert "even all" not in text
    tested, sweep = payload["tested_workaround"], payload["workaround"]
    if not tested["agrees"] and sweep and sweep["key"] == "fp32-nodes" and sweep["fixes"]:
        assert "with their readers" in tested["note"]
        assert f"The sweep's set agrees (`{sweep['setting']}`" in text, text
