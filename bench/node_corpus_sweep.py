"""Sweep `reprokit check` over the ONNX operator test corpus; count exit codes per target.

    python bench/node_corpus_sweep.py [--per-op 3] [--targets emulate:fp16,openvino:f32]
                                      [--out DIR] [--jobs 2] [--timeout 120] [--details]

The onnx wheel no longer ships ``backend/test/data/node``, so the corpus is regenerated from the
installed package's own generators (``onnx/backend/test/case/node/*.py``: each ``expect`` call
records a model and its inputs) into ``--out`` (default: a temporary directory). A deterministic
sample — up to ``--per-op`` tests per operator, picked by a hash of the test name, expanded
(function-body) variants counted with their operator — is checked under every target, fed with
each test's own ``test_data_set_0``. Prints a table of exit codes per target and every exit-70
case (an internal error: always reprokit's bug); ``--details`` lists every non-zero case too.
Not part of CI: it takes minutes to hours, and its counts follow the installed engines.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import os
import re
import sys
import warnings


def regenerate(root: str) -> list[tuple[str, str, str]]:
    """Write every node test as ``root/NAME/model.onnx`` + ``test_data_set_0/input_*.pb``.

    Returns (name, operator, directory) per test. The writer follows onnx's own
    ``backend/test/cmd_tools.py`` (tensors, sequences, maps and optionals)."""
    from onnx import TensorProto, numpy_helper
    from onnx.backend.test.case import node

    with warnings.catch_warnings():  # the generators overflow on purpose (casts, 1/0)
        warnings.simplefilter("ignore")
        cases = node.collect_testcases()
    single = {c.name: c.model.graph.node[0].op_type for c in cases if len(c.model.graph.node) == 1}
    written = []
    for case in cases:
        base = re.sub(r"_expanded(_ver\d+)?$", "", case.name)
        op = single.get(base) or single.get(case.name) or base
        folder = os.path.join(root, case.name)
        data_set = os.path.join(folder, "test_data_set_0")
        os.makedirs(data_set, exist_ok=True)
        with open(os.path.join(folder, "model.onnx"), "wb") as handle:
            handle.write(case.model.SerializeToString())
        inputs, _ = case.data_sets[0]
        for index, value in enumerate(inputs):
            declared = case.model.graph.input[index]
            kind = declared.type.WhichOneof("value")
            if kind == "map_type":
                proto = numpy_helper.from_dict(value, declared.name)
            elif kind == "sequence_type":
                proto = numpy_helper.from_list(value, declared.name)
            elif kind == "optional_type":
                proto = numpy_helper.from_optional(value, declared.name)
            elif isinstance(value, TensorProto):
                proto = value
            else:
                proto = numpy_helper.from_array(value, declared.name)
            with open(os.path.join(data_set, f"input_{index}.pb"), "wb") as handle:
                handle.write(proto.SerializeToString())
        written.append((case.name, op, folder))
    return written


def sample(tests: list[tuple[str, str, str]], per_op: int) -> list[tuple[str, str, str]]:
    """Up to ``per_op`` tests per operator, the same ones on every run (ordered by name hash)."""
    by_op = collections.defaultdict(list)
    for test in tests:
        by_op[test[1]].append(test)
    chosen = []
    for op in sorted(by_op):
        ranked = sorted(by_op[op], key=lambda t: hashlib.sha256(t[0].encode()).hexdigest())
        chosen.extend(ranked[:per_op])
    return sorted(chosen)


def main() -> int:
    """The node corpus alone, check only: ``corpus_sweep.py`` does the work and prints the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-op", type=int, default=3, help="tests per operator (default 3)")
    parser.add_argument("--targets", default="emulate:fp16,openvino:f32")
    parser.add_argument("--out", help="where to regenerate the corpus (default: a temporary directory)")
    parser.add_argument("--jobs", type=int, default=1, help="checks run at once")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per check")
    parser.add_argument("--details", action="store_true", help="list every non-zero exit too")
    parser.add_argument("--json", dest="json_path", help="also write all results to this file")
    args = parser.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import corpus_sweep

    argv = ["--suites", "node", "--node-per-op", str(args.per_op), "--targets", args.targets, "--no-shrink",
            "--jobs", str(args.jobs), "--timeout", str(args.timeout)]
    argv += (["--node-dir", args.out] if args.out else []) + (["--details"] if args.details else [])
    argv += ["--json", args.json_path] if args.json_path else []
    return corpus_sweep.main(argv)


if __name__ == "__main__":
    sys.exit(main())
