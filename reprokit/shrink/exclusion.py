"""The tested AutoCast exclusion of ``--reference-model``: the fix a user of an explicit-precision
model (TensorRT 11, TensorRT-RTX) can apply is to convert the fp32 model again with the diverging
nodes kept in fp32 (ModelOpt AutoCast's ``--nodes_to_exclude``), not a builder flag.

Starting from the minimal model's nodes, the fp32 model is converted again with those nodes
excluded — by reprokit's own converter, standing in for AutoCast, which is not a dependency — and
the target runs the whole reconverted model once against the fp32 reference. A node kept in fp32
still hands a narrow copy of its output to narrow readers (the Cast AutoCast inserts), so an
overflowing value goes away only with its readers kept too: while the model still diverges, the
readers of the nodes added last join the set, a few rounds at most, one target call each. The
command is offered as tested only when a round agreed. Owns no oracle and prints nothing.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass

from reprokit.convert import convert_float_model
from reprokit.convert.twin import declared_precision
from reprokit.graph.io import load_model, save_model
from reprokit.shrink.runstate import _atomic_json

ROUNDS = 4  # reconversions tried at most: the minimal nodes, then three steps down their readers


@dataclass(frozen=True)
class Round:
    nodes: int  # nodes excluded in this round
    verdict: str  # "agree", or the divergence's words


@dataclass(frozen=True)
class Exclusion:
    """The nodes to keep in fp32, the AutoCast command that does it, and whether a reconversion
    with them excluded agreed with the fp32 reference on the whole model."""

    nodes: tuple[str, ...]
    precision: str
    command: str
    agrees: bool
    rounds: tuple[Round, ...]
    unnamed: tuple[str, ...] = ()  # nodes AutoCast cannot name (no name in the file)

    def to_json(self) -> dict:
        return {
            "nodes": list(self.nodes),
            "precision": self.precision,
            "autocast": self.command,
            "tested": self.agrees,
            "converter": "reprokit (standing in for ModelOpt AutoCast)",
            "rounds": [{"nodes": r.nodes, "verdict": r.verdict} for r in self.rounds],
            **({"unnamed": list(self.unnamed)} if self.unnamed else {}),
        }

    def lines(self) -> list[str]:
        """For people: the node list, the command, and what the test said."""
        tried = ", ".join(
            f"{r.nodes} node{'s' if r.nodes != 1 else ''}: {r.verdict}" for r in self.rounds
        )
        if self.agrees:
            head = (
                f"workaround (tested: the fp32 model converted again to {self.precision} with these "
                f"{len(self.nodes)} node{'s' if len(self.nodes) != 1 else ''} kept in fp32 agrees with it; "
                f"reprokit's converter stood in for AutoCast; tried {tried})"
            )
        else:
            head = (
                f"no tested workaround: converting again with the diverging nodes and their readers kept in "
                f"fp32 still diverges ({tried}); the command below is the first step, untested"
            )
        return [head, f"  nodes to keep in fp32: {';'.join(self.nodes)}", f"  {self.command}"]


def autocast_command(fp32_path: str, precision: str, nodes, keep_io_types: bool) -> str:
    """ModelOpt AutoCast's command line keeping ``nodes`` in fp32. Its ``--nodes_to_exclude``
    takes regular expressions of node names: each name is escaped and anchored, so it selects
    that node only."""
    patterns = " ".join(shlex.quote(f"^{re.escape(n)}$") for n in nodes)
    return (
        f"python -m modelopt.onnx.autocast --onnx_path {shlex.quote(fp32_path)} --low_precision_type "
        f"{precision}{' --keep_io_types' if keep_io_types else ''} --nodes_to_exclude {patterns}"
    )


def _keeps_io_types(fp32, converted) -> bool:
    """Did the user's conversion keep the fp32 graph inputs and outputs (AutoCast --keep_io_types)?"""

    def types(model):
        return [
            v.type.tensor_type.elem_type for v in list(model.graph.input) + list(model.graph.output)
        ]

    return types(fp32) == types(converted)


def _readers(model) -> dict[str, list[str]]:
    """Node name -> names of the nodes that read its outputs."""
    by_tensor: dict[str, list[str]] = {}
    for node in model.graph.node:
        for name in node.input:
            if name:
                by_tensor.setdefault(name, []).append(node.name)
    return {n.name: [r for o in n.output for r in by_tensor.get(o, [])] for n in model.graph.node}


def find_exclusion(
    oracle,
    fp32_path: str,
    converted_path: str,
    nodes: list[str],
    feeds: dict,
    workdir: str,
    *,
    rounds: int = ROUNDS,
    user_path: str | None = None,
) -> Exclusion:
    """Exclude ``nodes`` (then their readers, round by round) and judge the whole reconverted
    model on the target against the fp32 model on the reference. ``user_path``: the fp32 file
    the command names (the user's, where ``fp32_path`` is a prepared copy)."""
    fp32 = load_model(fp32_path)
    converted = load_model(converted_path, load_weights=False)
    precision = declared_precision(converted) or "fp16"
    named = [n for n in nodes if n]
    readers = _readers(fp32)
    reference = oracle.run_reference(fp32_path, feeds)
    keep = list(dict.fromkeys(named))
    newest = list(keep)
    tried: list[Round] = []
    agrees = False
    os.makedirs(workdir, exist_ok=True)
    try:
        for number in range(rounds):
            path = save_model(
                convert_float_model(fp32, precision, frozenset(keep)),
                os.path.join(workdir, f"excluded-{number}.onnx"),
            )
            oracle.target_model.as_is.add(os.path.abspath(path))
            result = oracle.run_target(path, feeds)
            try:
                verdict = oracle.verdict_from(result, reference.outputs)
            finally:
                result.discard()
            tried.append(
                Round(len(keep), "agree" if not verdict.diverges else verdict.signature.describe())
            )
            if not verdict.diverges:
                agrees = True
                break
            if number + 1 == rounds:
                break
            newest = [r for n in newest for r in readers.get(n, []) if r and r not in keep]
            if not newest:
                break
            keep += list(dict.fromkeys(newest))
    finally:
        reference.discard()
    return Exclusion(
        tuple(keep),
        precision,
        autocast_command(user_path or fp32_path, precision, keep, _keeps_io_types(fp32, converted)),
        agrees,
        tuple(tried),
        tuple(n for n in nodes if not n),
    )


def offer_exclusion(run, writer, nodes) -> list[str]:
    """shrink's last word under --reference-model: the exclusion found and tested on the whole
    model, recorded in summary.json (``exclusion``); returns the lines for the console."""
    names = [run.model.graph.node[i].name for i in sorted(nodes)]
    run.event(
        "testing the AutoCast exclusion: the fp32 model converted again with those nodes in fp32"
    )
    found = find_exclusion(
        run.oracle,
        run.prepared.path,
        run.oracle.target_model.converted_path,
        names,
        run.feeds,
        os.path.join(run.state_dir, "exclusion"),
        user_path=run.options.reference_model,
    )
    writer.summary["exclusion"] = found.to_json()
    _atomic_json(os.path.join(run.out_dir, "summary.json"), writer.summary)
    return found.lines()
