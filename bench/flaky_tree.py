"""The exact odds of a pass/fail shrink run under a check that fails half the time whatever the
model (bench_passfail.py's flaky check), instead of a sample of 20 coin runs: every sequence of
answers the check could give is run once (a depth-first walk of the run's decision tree: one
shrink run per leaf, the check answering from a script of F/P), and each leaf weighs 2^-calls.

    PYTHONPATH=TREE python bench/flaky_tree.py          # ~450 leaves, a few minutes on 2 cores

Prints the probability of each exit code, and of exit 0 with a reduced model (the outcome issue
39 bounds). Run it with PYTHONPATH on two source trees to compare their rules exactly.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)

import planted  # noqa: E402

from reprokit.errors import ReprokitError  # noqa: E402
from reprokit.shrink.steps import shrink  # noqa: E402

# Answers the script's next letter (F fails, as the flaky check does: exit 1 with its words), P
# once the script is spent; logs each call so the walk knows how many answers the run used.
CHECK = """
import sys
script = open({script!r}).read().strip()
with open({log!r}, "a+") as handle:
    handle.seek(0)
    call = len(handle.read().splitlines())
    handle.write("x\\n")
if call < len(script) and script[call] == "F":
    print("FLAKY FAILURE")
    sys.exit(1)
"""


def walk(work: str) -> list[tuple[str, int, int | None]]:
    """Every leaf: (the answers given, exit code, nodes of the result or None)."""
    model, _ = planted.save(*planted.reducable(), work, "reducable")
    script, log = os.path.join(work, "script"), os.path.join(work, "calls.log")
    check = os.path.join(work, "check.py")
    with open(check, "w") as handle:
        handle.write(CHECK.format(script=script, log=log))
    target = f"cmd:{sys.executable} {check} {{model}}"
    leaves, pending = [], [""]
    while pending:
        prefix = pending.pop()
        with open(script, "w") as handle:
            handle.write(prefix + "\n")
        open(log, "w").close()
        out = os.path.join(work, "out")
        shutil.rmtree(out, ignore_errors=True)
        try:
            result = shrink(model, target, out)
            code, nodes = 0, len(result.summary["minimal"]["node_names"])
        except ReprokitError as exc:
            code, nodes = int(exc.exit_code), None
        with open(log) as handle:
            calls = len(handle.read().splitlines())
        answers = (prefix + "P" * calls)[:calls]
        leaves.append((answers, code, nodes))
        pending.extend(answers[:j] + "F" for j in range(len(prefix), calls))  # each P given could have been F
        print(f"{len(leaves)} {answers} exit {code}", file=sys.stderr, flush=True)
    return leaves


def main() -> int:
    work = tempfile.mkdtemp(prefix="flaky-tree-")
    try:
        leaves = walk(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    weight = {answers: 0.5 ** len(answers) for answers, _, _ in leaves}
    codes = sorted({code for _, code, _ in leaves})
    print(json.dumps({
        "leaves": len(leaves),
        "total": sum(weight.values()),  # 1.0: every sequence was walked
        "exit_0_reduced": sum(weight[a] for a, code, nodes in leaves if code == 0 and nodes is not None and nodes < 5),
        "by_exit_code": {str(c): sum(weight[a] for a, code, _ in leaves if code == c) for c in codes},
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
