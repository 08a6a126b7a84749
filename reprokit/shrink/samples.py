"""Inputs that hold several samples (a polygraphy JSON list, a folder of ``test_data_set_N``
folders, an .npz with ``name@N`` members; read by ``inputs.py``): every sample judged.

``check`` judges each sample (``session.check``) and reports a verdict per sample. ``shrink``
judges each sample on the original model, reduces on the first failing one (its feeds and its
captured activations, as for a single sample), then judges the node-minimal model on every other
failing sample: that sample's activations at the minimal's cuts are captured by one reference run
of the reduced-from model with the cut tensors marked, the minimal is extracted again from them
(small integer cut tensors it holds as constants are that sample's), and judged. Owns no engine
and no reduction: it asks the oracle and reuses ``subgraph.extract``.
"""

from __future__ import annotations

import os

import numpy as np

from reprokit.engine.activations import ActivationStore, tensor_bytes
from reprokit.engine.bug import shows_bug
from reprokit.engine.session import SampleVerdict
from reprokit.errors import NothingToReduce
from reprokit.graph.extract import extract
from reprokit.graph.io import save_model
from reprokit.graph.model import mark_outputs


def choose_sample(oracle, prepared, model, models_dir: str, event) -> None:
    """shrink on several samples: judge each on the original model (one target call each) and
    make the first failing one the feeds the run reduces on. The file judged is the one the
    confirming step judges (``confirm.py``), so its verdict is a cache hit there. No sample
    failing is the same stop as a single sample that agrees."""
    if not prepared.samples:
        return

    path = save_model(model, os.path.join(models_dir, "original.onnx"), base_dir=prepared.base_dir)
    event(f"judging each of the {len(prepared.samples)} input samples on the original model")
    prepared.sample_verdicts = [SampleVerdict(k, oracle.judge(path, feeds.arrays))
                                for k, feeds in enumerate(prepared.samples)]
    for judged in prepared.sample_verdicts:
        event(judged.line())
    failing = [s.index for s in prepared.sample_verdicts if s.verdict.diverges]
    if not failing:
        raise NothingToReduce(
            f"none of the {len(prepared.samples)} input samples diverges under {oracle.target} "
            f"({oracle.criterion.describe()}): " + "; ".join(s.line() for s in prepared.sample_verdicts),
            hint="nothing to reduce; `reprokit check` with the same --inputs shows each sample's numbers")
    prepared.feeds = prepared.samples[failing[0]]
    if len(failing) < len(prepared.samples) or failing[0]:
        prepared.notes.append(f"samples {_listed(failing)} of {len(prepared.samples)} diverge; the model is "
                              f"reduced on sample {failing[0]} (--sample N picks another)")


def sample_calls(prepared) -> tuple[int, int]:
    """Target calls of the samples: (spent judging each on the original, reserved for judging
    the minimal model on every failing sample but the one reduced on)."""
    if not prepared.sample_verdicts:
        return 0, 0
    failing = sum(1 for s in prepared.sample_verdicts if s.verdict.diverges)
    return len(prepared.sample_verdicts), max(0, failing - 1)


def samples_summary(prepared, minimal: dict | None = None) -> list[dict] | None:
    """summary.json's ``samples``: per sample, whether it diverged on the original model and
    whether the minimal model reproduces the run's signature on it (None: not judged)."""
    if not prepared.sample_verdicts:
        return None
    reduced = _reduced_index(prepared)
    rows = []
    for s in prepared.sample_verdicts:
        row = {"index": s.index, "diverged_originally": s.verdict.diverges,
               "signature_originally": s.verdict.signature.to_json(), "worst_originally": s.worst(),
               "reduced_on": s.index == reduced, "reproduces": None}
        row.update((minimal or {}).get(s.index, {}))
        rows.append(row)
    return rows


def judge_minimal(run, reducer, nodes, final, judged_verdict) -> list[dict] | None:
    """The node-minimal model (``nodes`` of ``run.model``, ``final`` its extraction on the reduced
    sample, ``judged_verdict`` its verdict there) judged on every other failing sample, fed with
    that sample's own activations. Returns summary.json's ``samples`` and notes the outcome."""
    prepared = run.prepared
    if not prepared.sample_verdicts:
        return None
    reduced = _reduced_index(prepared)
    signature = reducer.signature
    # judged on the node-minimal model: shape shrinking (reduce/shapes.py) crops around the
    # reduced sample's worst elements, which another sample need not share
    found = {reduced: {"reproduces": shows_bug(signature, judged_verdict),
                       "minimal_worst": SampleVerdict(reduced, judged_verdict).worst(), "judged_on": "node-minimal"}}
    others = [s.index for s in prepared.sample_verdicts if s.verdict.diverges and s.index != reduced]
    if others:
        reducer.begin("samples")
    for index in others:
        calls = run.oracle.stats.target
        found[index] = {**_judge_on_sample(run, reducer, nodes, final, index), "judged_on": "node-minimal"}
        reducer.stats["samples"].calls += run.oracle.stats.target - calls
        reducer.stats["samples"].candidates += 1
        run.event(f"sample {index}: the minimal model "
                  + ("reproduces" if found[index]["reproduces"] else found[index].get("why", "does not reproduce")))
    rows = samples_summary(prepared, found)
    yes = [r["index"] for r in rows if r["reproduces"]]
    no = [r["index"] for r in rows if r["diverged_originally"] and not r["reproduces"]]
    prepared.notes.append(f"the minimal model reproduces {signature.kind.value} on sample{'s' if len(yes) != 1 else ''} "
                          f"{_listed(yes)} of the {len(rows)}"
                          + (f"; not on sample{'s' if len(no) != 1 else ''} {_listed(no)}, which diverge on the original"
                             if no else "") + " (summary.json: samples)")
    return rows


def _judge_on_sample(run, reducer, nodes, final, index: int) -> dict:
    oracle, index_ = run.oracle, run.index
    feeds = run.prepared.samples[index].arrays
    produced = {t for i in nodes for t in index_.node_outputs[i]}
    cuts = [t for i in sorted(nodes) for t in index_.node_inputs[i]
            if t and t not in produced and t not in index_.initializers and t not in index_.graph_inputs]
    names = list(dict.fromkeys(cuts + [t for i in sorted(nodes) for t in index_.node_outputs[i] if t]))
    checked = [o for o in index_.graph_outputs if o not in names] if run.levels else []
    folder = os.path.join(run.state_dir, f"activations-sample-{index}")

    def run_chunk(chunk):
        path = save_model(mark_outputs(run.model, chunk), os.path.join(run.models_dir, "capture-sample.onnx"))
        return oracle.run_reference(path, feeds, chunk)

    store = ActivationStore.capture(run_chunk, names + checked,
                                    {n: tensor_bytes(index_.value_info[n]) for n in names if n in index_.value_info},
                                    folder, chunk_bytes=1 << 30)
    if run.levels and not _opened_model_holds(run, store, feeds, checked):
        return {"reproduces": None, "why": "not judged: the control flow was opened as the reduced sample runs it, "
                                           "and this sample takes other branches"}
    sub = extract(run.model, index_, nodes, store, feeds=feeds)
    if reducer.space.wrap is not None and sub.outputs:
        sub = reducer.space.wrap(sub)
    path = save_model(sub.model, os.path.join(run.models_dir, f"final-sample-{index}.onnx"),
                      base_dir=run.prepared.base_dir, self_contained=True)
    reference = {n: store.get(n) for n in sub.outputs if n in store}
    verdict = oracle.judge(path, sub.feeds, reference_outputs=reference)
    same = sub.model.SerializeToString() == final.model.SerializeToString()
    return {"reproduces": shows_bug(reducer.signature, verdict),
            "minimal_signature": verdict.signature.to_json(), "minimal_worst": SampleVerdict(index, verdict).worst(),
            "same_model": same}


def _opened_model_holds(run, store, feeds, checked) -> bool:
    """With control flow opened for the reduced sample, this sample's activations are right only
    where the opened model computes the given model's outputs on it too."""
    given = os.path.join(run.models_dir, "original.onnx")
    result = run.oracle.run_reference(given, feeds)
    try:
        for name in checked:
            if name in result.outputs and not np.allclose(np.asarray(result.outputs[name]), store.get(name),
                                                          rtol=1e-5, atol=1e-6, equal_nan=True):
                return False
        return True
    finally:
        result.discard()


def _reduced_index(prepared) -> int | None:
    return next((k for k, feeds in enumerate(prepared.samples) if feeds is prepared.feeds), None)


def _listed(indices: list[int]) -> str:
    return ", ".join(map(str, indices)) if indices else "none"
