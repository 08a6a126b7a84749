"""The evaluation layer: turn "verdicts for these candidates" into engine calls.

Three ways, chosen by the Reducer from the signature, never by a pass:

- **alone**: one candidate, one call (and the last word on any result);
- **packed** (numeric oracles: nonfinite, mismatch): many candidates as disjoint copies in one
  model (``pack.py``), each judged from its own outputs against its own captured reference, with
  the same oracle and signature rule. A pack the engine refuses as a whole is split in halves;
- **group-tested** (pass/fail oracles: exit status, build error, crash): a pack of candidates
  with disjoint node sets and the user's node names; a pack that passes clears every member in
  one call, a failing one is split (binary splitting), so one failing member among W costs about
  log2 W calls. When no member fails alone, the members interact: nothing is concluded.

Every candidate outcome is journaled on its own, so ``--resume`` replays packed work too.
"""

from __future__ import annotations

import os
import time
import uuid

from reprokit.graph.pack import build_pack, feed_bytes
from reprokit.shrink.reducer import Outcome


def _save(reducer, model) -> str:
    import onnx

    # A unique file per evaluation: threads never share one. External weights stay where
    # they are; the engines are told the folder (oracle.weights_dir).
    path = os.path.join(reducer.workdir, f"candidate-{uuid.uuid4().hex}.onnx")
    onnx.save(model, path)
    return path


def _prepare(reducer, nodes: frozenset, *, check: bool):
    """The candidate's extraction, or a trivial outcome that needs no engine call."""
    sub = reducer.extraction(nodes, check=check)
    if not sub.outputs:
        return None, Outcome(False, "no-outputs", "", None, True)
    reason = reducer.unrepresentable_feed(sub.feeds)
    if reason:
        return None, Outcome(False, "invalid", reason, None, True)
    return sub, None


def _outcome(reducer, verdict, *, packed: bool) -> Outcome:
    interesting = verdict.diverges and reducer.signature.same_bug(verdict.signature)
    error = max((o.error for o in verdict.outputs), default=None)
    if interesting and reducer.severity is not None and error is not None and not error >= reducer.severity:
        # A mismatch much milder than the original's is another, smaller effect: a repro a
        # maintainer would dismiss as noise. Counted, never followed.
        interesting = False
        label = f"milder mismatch (error below {reducer.severity:.3g})"
        reducer.findings[label] = reducer.findings.get(label, 0) + 1
    if interesting and reducer.message_key and verdict.message:
        # Same failure class, other words (a check printing which node it saw): counted, so the
        # summary can say so and suggest --fail-regex when they are different bugs.
        from reprokit.engine.oracle import normalize_message

        said = normalize_message(verdict.message)
        if said and said != reducer.message_key:
            label = f"same {verdict.kind.value}, other message: {said}"
            reducer.findings[label] = reducer.findings.get(label, 0) + 1
    return Outcome(
        interesting=interesting,
        kind=verdict.kind.value, detail=verdict.signature.detail,
        error=error,
        from_cache=verdict.cached, packed=packed,
    )


def judge_alone(reducer, nodes: frozenset) -> Outcome:
    """One candidate in one engine call (or the oracle's own cache)."""
    sub, trivial = _prepare(reducer, nodes, check=True)
    if trivial is not None:
        return trivial
    reducer.charge()
    path = _save(reducer, sub.model)
    start = time.monotonic()
    try:
        reference = {name: reducer.store.get(name) for name in sub.outputs if name in reducer.store}
        verdict = reducer.oracle.judge(path, sub.feeds, reference_outputs=reference)
    finally:
        os.remove(path)
    if not verdict.cached:
        reducer.note_call(len(nodes), 1, time.monotonic() - start)
    return reducer.record(nodes, _outcome(reducer, verdict, packed=False))


def _member_bytes(reducer, sub) -> int:
    """What one copy makes the engine hold: its feeds, its outputs and its own weights (every copy
    gets its own; external ones are read from disk for each)."""
    import numpy as np

    from reprokit.graph.model import tensor_proto_bytes

    def nbytes(name: str) -> int:
        shape, dtype = reducer.store.info(name)
        return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize

    weights = sum(tensor_proto_bytes(t) for t in sub.model.graph.initializer)
    return feed_bytes(sub) + weights + sum(nbytes(n) for n in sub.outputs if n in reducer.store)


def _fit(reducer, prepared: list) -> list[list]:
    """Split (candidate, extraction) pairs into packs under the byte and node limits."""
    groups, current, size, nodes = [], [], 0, 0
    for cand, sub in prepared:
        weight = _member_bytes(reducer, sub)
        count = len(sub.model.graph.node)
        if current and (size + weight > reducer.pack_bytes or nodes + count > reducer.pack_nodes):
            groups.append(current)
            current, size, nodes = [], 0, 0
        current.append((cand, sub))
        size += weight
        nodes += count
    if current:
        groups.append(current)
    return groups


def judge_packed(reducer, candidates: list[frozenset], *, stop_at_hit: bool = False) -> list[Outcome | None]:
    """Outcomes of numeric candidates, as many per engine call as the pack limits allow. A
    pending layerwise request (``reducer.want_layerwise``) rides along as one more member: the
    whole model with every float tensor marked, its own copy like any other member."""
    results: dict[frozenset, Outcome] = {}
    prepared = []
    if reducer.want_layerwise:
        marked = _marked_member(reducer)
        if reducer.heavy():  # its own copy of every weight would double what the engine holds
            _run_marked_alone(reducer, marked)
        else:
            prepared.append((None, marked))
    for cand in candidates:
        sub, trivial = _prepare(reducer, cand, check=False)
        if trivial is not None:
            results[cand] = trivial
        else:
            prepared.append((cand, sub))
    for group in _fit(reducer, prepared):
        _run_numeric_pack(reducer, group, results)
        if stop_at_hit and any(results[c].interesting for c, _ in group if c is not None and c in results):
            break
    return [results.get(c) for c in candidates]


def _marked_member(reducer):
    from reprokit.engine.layerwise import float_node_outputs
    from reprokit.graph.extract import Extraction
    from reprokit.graph.model import mark_outputs

    names = [t for t, *_ in float_node_outputs(reducer.model)]
    outputs = list(dict.fromkeys([*reducer.index.graph_outputs, *names]))
    return Extraction(mark_outputs(reducer.model, names), dict(reducer.feeds), outputs)


def _layerwise_from(reducer, outputs: dict, status: str = "ok", message: str = "") -> None:
    from reprokit.engine.layerwise import compare_marked_run
    from reprokit.engine.worker import WorkerResult

    reducer.want_layerwise = False
    reducer.layerwise_report = compare_marked_run(
        reducer.model, reducer.store, WorkerResult(status, outputs=outputs, message=message), reducer.oracle)


def _run_marked_alone(reducer, sub) -> None:
    reducer.charge()
    path = _save(reducer, sub.model)
    start = time.monotonic()
    try:
        result = reducer.oracle.run_target(path, sub.feeds, sub.outputs)
    finally:
        os.remove(path)
    reducer.note_call(len(sub.model.graph.node), 0, time.monotonic() - start)
    try:
        _layerwise_from(reducer, dict(result.outputs) if result.status == "ok" else {}, result.status,
                        result.message)
    finally:
        result.discard()


def _run_numeric_pack(reducer, group: list, results: dict) -> None:
    if len(group) == 1:
        cand, sub = group[0]
        if cand is None:
            _run_marked_alone(reducer, sub)
        else:
            results[cand] = judge_alone(reducer, cand)
        return
    from reprokit.engine.worker import WorkerResult

    pack = build_pack([sub for _, sub in group], keep_node_names=False, same_node_names=reducer.names_select_nodes)
    reducer.charge()
    path = _save(reducer, pack.model)
    start = time.monotonic()
    try:
        result = reducer.oracle.run_target(path, pack.feeds)
    finally:
        os.remove(path)
    reducer.note_call(pack.nodes, sum(1 for cand, _ in group if cand is not None), time.monotonic() - start)
    if result.status != "ok":  # the engine refused the pack as a whole: find out who, by halves
        result.discard()
        half = len(group) // 2
        _run_numeric_pack(reducer, group[:half], results)
        _run_numeric_pack(reducer, group[half:], results)
        return
    try:
        for member, (cand, sub) in zip(pack.members, group):
            outputs = {original: result.outputs[packed] for packed, original in member.outputs.items()
                       if packed in result.outputs}
            if cand is None:
                _layerwise_from(reducer, outputs)
                continue
            reference = {n: reducer.store.get(n) for n in sub.outputs if n in reducer.store}
            if set(outputs) != set(member.outputs.values()):
                outcome = Outcome(False, "build-error", "target output missing", None, packed=True)
            else:
                own = WorkerResult("ok", outputs=outputs, meta=result.meta, seconds=result.seconds)
                outcome = _outcome(reducer, reducer.oracle.verdict_from(own, reference), packed=True)
            results[cand] = reducer.record(cand, outcome)
    finally:
        result.discard()


def group_fails(reducer, group: list[frozenset]) -> bool:
    """Pass/fail: does a pack of these disjoint candidates show the signature? One call.
    A pack that passes clears every member (journaled as agreeing)."""
    prepared = []
    for cand in group:
        sub, trivial = _prepare(reducer, cand, check=False)
        if trivial is None:
            prepared.append((cand, sub))
    if not prepared:
        return False
    pack = build_pack([sub for _, sub in prepared], keep_node_names=True)
    reducer.charge()
    path = _save(reducer, pack.model)
    start = time.monotonic()
    try:
        verdict = reducer.oracle.judge(path, pack.feeds, reference_outputs={})
    finally:
        os.remove(path)
    if not verdict.cached:
        reducer.note_call(pack.nodes, len(prepared), time.monotonic() - start)
    fails = verdict.diverges and reducer.signature.same_bug(verdict.signature)
    if not fails and not verdict.diverges:
        for cand, _ in prepared:
            reducer.record(cand, Outcome(False, "agree", "cleared in a group", None, packed=True))
    return fails


def first_failing_group(reducer, candidates: list[frozenset], *, together_fail: bool = False) -> int | None:
    """Earliest interesting candidate by group testing over runs of consecutive, pairwise
    disjoint candidates (overlapping ones are judged one by one). ``together_fail``: all the
    candidates together are known to fail, so the first run needs no call of its own."""
    position = 0
    while position < len(candidates):
        known = reducer.cached(candidates[position])
        if known is not None:
            reducer._count(known)
            if known.interesting:
                return position
            position += 1
            continue
        run, used, nodes = [position], set(candidates[position]), len(candidates[position])
        following = position + 1
        while following < len(candidates):
            cand = candidates[following]
            if cand & used or reducer.cached(cand) is not None or nodes + len(cand) > reducer.pack_nodes:
                break
            run.append(following)
            used |= cand
            nodes += len(cand)
            following += 1
        known = together_fail and len(run) == len(candidates) and position == 0
        hit = _split(reducer, candidates, run, known_fail=known)
        if hit is not None:
            return hit
        if known and len(run) > 1:
            _interaction(reducer, [candidates[i] for i in run])
        position = following
    return None


def _interaction(reducer, members: list[frozenset]) -> bool:
    """A group failed but none of its members fails alone: they fail together. Their union is a
    candidate of its own (judged alone); kept for the passes after this one when it holds."""
    union = frozenset().union(*members)
    if len(union) >= len(reducer.best) or any(found <= union for found in reducer.interactions):
        return False  # a smaller set inside it already fails together
    if reducer.test(union):
        reducer.interactions.append(union)
        return True
    reducer.contradictions += 1  # failing in a pack, not alone: a packing effect, or a flaky check
    return False


def _split(reducer, candidates, run: list[int], *, known_fail: bool, assumed: bool = False) -> int | None:
    """Binary splitting: the earliest member of ``run`` that fails alone, or None. ``assumed``:
    the run's failure is inferred from the confirmed model, not seen in a pack — its right half
    is then tested rather than inferred (no single may fail alone at all: a fusion, a pair)."""
    if len(run) == 1:
        return run[0] if reducer.test(candidates[run[0]]) else None
    if not known_fail and not reducer._group_fails([candidates[i] for i in run]):
        return None
    half = len(run) // 2
    left, right = run[:half], run[half:]
    left_fails = (reducer.test(candidates[left[0]]) if len(left) == 1
                  else reducer._group_fails([candidates[i] for i in left]))
    if left_fails:
        hit = _split(reducer, candidates, left, known_fail=True)
        if hit is not None:
            return hit
        if _interaction(reducer, [candidates[i] for i in left]):
            return None  # the left members fail together: a smaller candidate than the rest
        return _split(reducer, candidates, right, known_fail=False)
    # Left passed, the whole failed: under "a pack fails when a member fails", right holds it.
    hit = _split(reducer, candidates, right, known_fail=not assumed)
    if hit is None and len(right) > 1 and not assumed:
        _interaction(reducer, [candidates[i] for i in right])
    return hit
