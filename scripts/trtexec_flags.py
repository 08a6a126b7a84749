#!/usr/bin/env python
"""Write tests/golden/trtexec_flags.json: the options trtexec accepts per TensorRT release, read
from the parser in NVIDIA/TensorRT's own source (samples/common/sampleOptions.cpp) at each release
tag, so that tests/test_qa_trtexec.py checks every printed trtexec line against the versions its
form names, not against memory.

    python scripts/trtexec_flags.py PATH/TO/TensorRT-git-checkout

An option counts when sampleOptions.cpp hands it to one of its parsing helpers as
``(arguments, "--name"`` (getAndDelOption, getAndDelNegOption, getAndDelOptionBehind,
getLayerPrecisions, ...), outside ``SafeBuilderOptions::parse`` (the safety runtime's builder,
not trtexec). Reads git objects only; must not be imported by reprokit.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

# One or two release tags per line of reprokit/engine/backends/trt_versions.FACTS (its keys).
TAGS = {
    "8.6": ("v8.6.1",),
    "10.0-10.11": ("v10.0.0", "v10.11"),
    "10.12+": ("v10.12.0", "v10.16"),
    "11": ("v11.0", "v11.1"),
}
SOURCE = "samples/common/sampleOptions.cpp"
OUT = Path(__file__).resolve().parent.parent / "tests" / "golden" / "trtexec_flags.json"


def options_at(repo: Path, tag: str) -> tuple[str, list[str]]:
    """(commit, sorted trtexec options) of ``tag``."""
    commit = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", f"{tag}^{{commit}}"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    text = subprocess.run(
        ["git", "-C", str(repo), "show", f"{commit}:{SOURCE}"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    # drop the safety builder's parse function: its options are not trtexec's
    text = re.sub(r"\nvoid SafeBuilderOptions::parse\(.*?\n}\n", "\n", text, flags=re.S)
    found = set(re.findall(r'\(\s*arguments\s*,\s*"(--[A-Za-z0-9]+)"', text))
    return commit, sorted(found)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write(__doc__ or "")
        return 2
    repo = Path(argv[0])
    table = {}
    for key, tags in TAGS.items():
        for tag in tags:
            commit, options = options_at(repo, tag)
            table.setdefault(key, []).append({"tag": tag, "commit": commit, "options": options})
    doc = {
        "source": f"github.com/NVIDIA/TensorRT {SOURCE}, written by scripts/trtexec_flags.py",
        "lines": table,
    }
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
