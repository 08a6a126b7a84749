"""The tested precision workaround: the smallest set of nodes that, kept in fp32 on the target,
brings the WHOLE model within tolerance — found over a ranking (each node's own error, largest
first) and run exactly as printed before it is offered.

Two searches, chosen by the engine, never by the caller:

- **packed** (``emulate``; ``ort:cuda,fp16|bf16``, whose conversion keeps nodes by name too): one
  call holds several whole-model copies, each with its own node names (``rk3/…``), and one
  ``fp32-nodes=`` list names each copy's own set, so one call judges several candidate sets:
  prefix sizes 1, 2, 4, … first, then evenly spaced sizes inside the bracket, then, for a set
  no larger than one call's width, every "the set minus one node" to drop what it does not need
  (a larger set is offered as the ranked prefix: pruning it costs as many calls as the search);
- **bisection** over the prefix size elsewhere (OpenVINO, TensorRT: one build per size, as
  ``polygraphy debug precision`` does over the topological order; and wherever shrink packs by
  build cost: a packed call builds every copy), its first sizes all of the ranking and the
  largest close enough beside it; each call is already the printed setting on the user's model,
  so the last agreeing one is the answer. Both prefix searches are ``prefix.py``'s.

Whatever the search, the answer offered is one call of the printed target spec on the model the
user gave (its result travels beside it). Given a journal (shrink's), every trial is journaled under
its candidate set, the target spec, packed or alone (the run's fingerprint holds the feeds), so a resumed run reads back the
trials already judged (no call: on TensorRT each is an engine build) and reaches the same answer. Owns no oracle construction (the caller passes
``oracle_for``), no archive and no words for the console; the copies are graph surgery
(:func:`reprokit.graph.pack.model_copies`).

It sits in ``shrink/`` (shrink's last step offers it) and ``audit/`` uses it from there: audit
sits above shrink, so shrink could not import it from ``audit/``.
"""

from __future__ import annotations

import json
import math
import os
import uuid
from dataclasses import dataclass, field, replace

from reprokit.graph.io import external_locations, weights_apart
from reprokit.graph.pack import model_copies
from reprokit.shrink.buildcost import heavy_layers
from reprokit.shrink.fp32_nodes import packable, with_nodes
from reprokit.shrink.journal import PassStats, entry_key
from reprokit.shrink.prefix import bisect_prefix, close_enough, packed_prefix  # noqa: F401  (close_enough: tests')
from reprokit.standalone.compare import jsonable

PACK_WIDTH = 16  # whole-model copies per packed call


@dataclass(frozen=True)
class Trial:
    """One candidate set judged on the whole model."""

    size: int
    nodes: tuple[str, ...]
    agrees: bool
    error: float | None
    packed: bool
    call: int  # the target call (1-based) that judged it
    kind: str = "agree"  # the verdict's kind: agree, mismatch, nonfinite, …
    cached: bool = False  # read back from the journal (a resumed run): ``call`` is the earlier run's

    def to_json(self) -> dict:
        return {"size": self.size, "agrees": self.agrees, "kind": self.kind, "error": jsonable(self.error), "packed": self.packed,
                "call": self.call, **({"cached": True} if self.cached else {}),
                **({"nodes": list(self.nodes)} if self.size <= 12 else {})}


@dataclass
class Workaround:
    method: str  # packed, bisection, none
    ranked: int  # nodes in the ranking
    nodes: list[str] = field(default_factory=list)
    setting: str = ""  # the printed target spec, run exactly so
    verdict: str = ""  # that run's verdict: agree, mismatch, nonfinite, …
    error: float | None = None
    tolerance: float | None = None
    agrees: bool = False
    calls: int = 0  # target calls of the search, the confirming run included
    cached: int = 0  # trials read back from the journal: a resumed run's, or a set met again (no call)
    trials: list[Trial] = field(default_factory=list)
    note: str = ""
    prefix_fails: int = 0  # nodes of the largest ranked prefix judged not to agree (0: none); see close_enough

    def to_json(self) -> dict:
        return {"method": self.method, "ranked": self.ranked, "nodes": self.nodes, "size": len(self.nodes),
                "prefix_fails": self.prefix_fails,
                "setting": self.setting, "verdict": self.verdict, "error": jsonable(self.error),
                "tolerance": self.tolerance, "agrees": self.agrees, "calls": self.calls, "cached": self.cached,
                "trials": [t.to_json() for t in self.trials], "note": self.note}


def ranking(isolated: dict, label) -> list[str]:
    """Node labels by their own error (fed with reference inputs), largest first; nodes whose
    output the narrow type leaves exactly as the reference (error 0: Identity, Reshape, integer
    ops) are left out — keeping them in fp32 changes nothing."""
    scored = [(float(o.error), label(i)) for i, o in isolated.items()
              if o.error is not None and float(o.error) != 0.0]
    scored = [(e if e == e else math.inf, n) for e, n in scored]
    names = [n for _, n in sorted(scored, key=lambda s: -s[0])]
    return [n for n in names if "," not in n and ";" not in n]


class Search:
    """Judges fp32 sets on the whole model. ``oracle_for(spec)`` builds an oracle for a target
    spec; ``reference`` holds the graph outputs of the reference run on ``feeds``. ``journal``
    (get/put by key, shrink's ``Journal``) keeps every trial for a resumed run; ``cancelled()``
    says an interrupt killed the calls, whose outcomes are then not journaled; ``charge()`` runs
    before each call (shrink's call budget: it raises to stop the search)."""

    def __init__(self, model, model_path: str, feeds: dict, reference: dict, target: str, oracle_for, workdir: str,
                 weights_dir: str | None = None, ledger=None, width: int = PACK_WIDTH, pack: bool = True,
                 on_event=None, journal=None, cancelled=None, charge=None):
        self.model = model
        self.event = on_event or (lambda text: None)  # a line per engine call: the search takes minutes
        self.path = model_path
        self.feeds = feeds
        self.reference = reference
        self.target = target
        self.oracle_for = oracle_for
        self.workdir = workdir
        self.weights_dir = weights_dir
        self.ledger = ledger
        self.width = width
        self.packed = pack and packable(target)  # several sets per call (else bisection)
        self.calls = 0
        self.built = PassStats()  # what those calls built (a packed call: every copy); its calls unused
        self.cached = 0  # trials read back from the journal
        self.trials: list[Trial] = []
        self.tolerance: float | None = None
        self._alone: dict[tuple[str, ...], tuple[str, Trial]] = {}  # deterministic engines: asked once
        self.not_kept: list[str] = []  # named nodes the engine ran narrow anyway (its run's meta)
        self.fails_at = 0  # the largest prefix size known not to agree when the search stopped
        self.journal = journal
        self.cancelled = cancelled or (lambda: False)
        self.charge = charge or (lambda: None)
        self._light, self._weights_file = None, None  # _copies_source
        os.makedirs(workdir, exist_ok=True)

    # ------------------------------------------------------------- the journal

    def _key(self, nodes, packed: bool) -> str:
        """A trial's journal key: the candidate set, the target spec, packed or alone (a packed
        copy may be judged otherwise than the model alone); the feeds are the run's, which its
        fingerprint holds (a resume with other feeds is refused before any trial is read)."""
        return entry_key("precision", json.dumps([self.target, bool(packed), list(nodes)]))

    def _saved(self, nodes, packed: bool) -> Trial | None:
        """The trial of an earlier (interrupted) run, or None: it needs a call."""
        entry = self.journal.get(self._key(nodes, packed)) if self.journal is not None else None
        if entry is None:
            return None
        self.tolerance = entry.get("tolerance", self.tolerance)
        if not packed:
            self.not_kept = list(entry.get("not_kept") or [])
        error = entry.get("error")
        trial = Trial(len(nodes), tuple(nodes), bool(entry["agrees"]), None if error is None else float(error), packed,
                      int(entry.get("call", 0)), entry.get("kind", "agree"), cached=True)
        self.cached += 1
        self.trials.append(trial)
        return trial

    def _journal(self, *trials: Trial) -> None:
        """One call's trials, all or none (one write): the interrupt is asked once."""
        if self.journal is None or self.cancelled():
            return  # a call an interrupt killed means nothing
        self.journal.put_all([(self._key(trial.nodes, trial.packed),
                               {"agrees": trial.agrees, "kind": trial.kind, "error": jsonable(trial.error),
                                "call": trial.call, "size": trial.size, "tolerance": self.tolerance,
                                **({} if trial.packed else {"not_kept": self.not_kept})}) for trial in trials])

    # ------------------------------------------------------------- one call

    def _run(self, spec: str, path: str, feeds: dict, what: str, nodes: int, heavy: int):
        self.charge()
        oracle = self.oracle_for(spec)
        oracle.weights_dir = self.weights_dir
        self.calls += 1
        self.built.note_built(nodes, heavy)
        self.event(f"precision search, call {self.calls}: {what}")
        if self.ledger is not None:
            result = self.ledger.run("precision", "target", oracle, what, path, feeds)
        else:
            result = oracle.run_target(path, feeds)
        return oracle, result

    def alone(self, nodes: list[str]) -> tuple[str, Trial]:
        """The printed setting on the user's model: (spec, its trial)."""
        if tuple(nodes) in self._alone:
            return self._alone[tuple(nodes)]
        spec = with_nodes(self.target, nodes)
        trial = self._saved(nodes, False)
        if trial is None:
            oracle, result = self._run(spec, self.path, self.feeds, f"fp32-nodes: {len(nodes)} nodes",
                                       len(self.model.graph.node), heavy_layers(self.model))
            verdict = oracle.verdict_from(result, self.reference)
            self.tolerance = verdict.criterion.tolerance
            self.not_kept = list(verdict.target_meta.get("fp32_nodes_not_kept") or [])
            worst = verdict.worst()
            error = float(worst.error) if worst is not None else None
            trial = Trial(len(nodes), tuple(nodes), not verdict.diverges, error, False, self.calls, verdict.kind.value)
            self.trials.append(trial)
            self._journal(trial)
        self._alone[tuple(nodes)] = spec, trial
        return spec, trial

    def judge(self, sets: list[list[str]]) -> list[Trial]:
        """Every set judged on the whole model: packed copies where the engine allows, else one
        call each."""
        if not self.packed or len(sets) == 1:
            return [self.alone(nodes)[1] for nodes in sets]
        out = []
        for start in range(0, len(sets), self.width):
            out.extend(self._packed(sets[start:start + self.width]))
        return out

    def _packed(self, sets: list[list[str]]) -> list[Trial]:
        """One packed call for the sets the journal does not hold; the trials in ``sets``' order."""
        saved = [self._saved(nodes, True) for nodes in sets]
        todo = [nodes for nodes, trial in zip(sets, saved) if trial is None]
        fresh = iter(self._packed_call(todo) if todo else [])
        return [trial if trial is not None else next(fresh) for trial in saved]

    def _copies_source(self):
        """The model packed calls copy, its inline weights written once beside the copies: a
        copy's private weights are references, not bytes (a Swin's 16 copies were 1.7 GB per call)."""
        if self._light is None:
            self._weights_file = None if external_locations(self.model) else os.path.join(
                self.workdir, f"weights-{uuid.uuid4().hex}.bin")
            self._light = weights_apart(self.model, self._weights_file) if self._weights_file else self.model
        return self._light

    def release(self) -> None:
        """The search is over: the weights file the packed calls shared goes."""
        if self._weights_file and os.path.exists(self._weights_file):
            os.remove(self._weights_file)
        self._light = self._weights_file = None

    def _packed_call(self, sets: list[list[str]]) -> list[Trial]:
        import onnx

        model, outputs, names = model_copies(self._copies_source(), sets)
        path = os.path.join(self.workdir, f"copies-{uuid.uuid4().hex}.onnx")  # beside the weights file
        onnx.save(model, path)
        try:
            oracle, result = self._run(with_nodes(self.target, names), path, self.feeds,
                                       f"{len(sets)} fp32 sets, packed", len(model.graph.node),
                                       heavy_layers(model))
        finally:
            os.remove(path)
        trials = []
        for nodes, mapping in zip(sets, outputs):
            if result.status == "ok":
                own = replace(result, outputs={orig: result.outputs[packed] for packed, orig in mapping.items()
                                               if packed in result.outputs})
            else:
                own = result
            verdict = oracle.verdict_from(own, self.reference)
            self.tolerance = verdict.criterion.tolerance
            worst = verdict.worst()
            trials.append(Trial(len(nodes), tuple(nodes), not verdict.diverges,
                                float(worst.error) if worst is not None else None, True, self.calls,
                                verdict.kind.value))
        self.trials.extend(trials)
        self._journal(*trials)
        return trials


def with_readers(model, ranked: list[str]) -> list[list[str]]:
    """For each ranked node, the node and the nodes that read its outputs: a node kept in fp32
    whose reader is narrow still hands it a rounded copy (the converted model's Cast, TensorRT's
    reformat, the emulator's round trip), so its own error goes away only with its readers kept."""
    labels = [n.name or f"{n.op_type}_{i}" for i, n in enumerate(model.graph.node)]
    readers: dict[str, list[str]] = {}
    for label, node in zip(labels, model.graph.node):
        for name in node.input:
            if name:
                readers.setdefault(name, []).append(label)
    outputs = dict(zip(labels, (list(n.output) for n in model.graph.node)))
    return [[node] + [r for t in outputs.get(node, []) for r in readers.get(t, [])] for node in ranked]


def _union(units: list[list[str]], k: int) -> list[str]:
    return list(dict.fromkeys(n for unit in units[:k] for n in unit))


def find_workaround(search: Search, ranked: list[str], *, prune: int = 2, calls: int | None = None,
                    slack: int = 10) -> Workaround:
    """The smallest prefix of ``ranked`` that agrees (each node with its readers), pruned to the
    nodes it needs (packed engines, a set of at most ``search.width`` nodes), confirmed by one
    call of the printed setting. Bisection only: ``calls`` caps its calls (None: none) and
    ``slack`` is :func:`close_enough`'s bracket (a ``1/slack`` share of the agreeing set)."""
    try:
        return _find_workaround(search, ranked, prune, calls, slack)
    finally:
        search.release()


def _find_workaround(search: Search, ranked: list[str], prune: int, calls: int | None, slack: int) -> Workaround:
    found = Workaround("packed" if search.packed else "bisection", len(ranked))
    if not ranked:
        found.method, found.note = "none", "no node has an error of its own to keep in fp32"
        return found
    units = with_readers(search.model, ranked)
    ranked = [_union(units, k) for k in range(1, len(units) + 1)]  # ranked[k-1]: the set of prefix k
    size = packed_prefix(search, ranked) if search.packed else bisect_prefix(search, ranked, calls, slack)
    if size is None:
        # what was run: the ranked nodes and their readers, not every node (one kept outside the
        # ranking, e.g. a Sqrt fed an out-of-range variance, can be what a fix needs)
        found.note = (f"all {len(ranked)} ranked nodes in fp32 with their readers ({len(ranked[-1])} nodes) "
                      "do not bring the model within tolerance")
        if search.not_kept:
            found.note += (f"; the engine ran {len(search.not_kept)} of them narrow anyway (e.g. "
                           f"{', '.join(search.not_kept[:3])}: its own fusions drop the per-node mark)")
        last = next(t for t in reversed(search.trials) if t.nodes == tuple(ranked[-1]))
        found.error, found.verdict = last.error, last.kind
        found.calls, found.cached = search.calls, search.cached
        found.trials = list(search.trials)
        return found
    nodes = ranked[size - 1]
    found.prefix_fails = len(ranked[search.fails_at - 1]) if search.fails_at else 0
    if search.packed and 1 < len(nodes) <= search.width:
        # a set this small has its every "set minus one node" in one packed call; a larger one
        # is offered as the ranked prefix: on PP-OCRv4 det (288 nodes) two calls of pruning
        # dropped 21 nodes and cost 3 calls and a run alone, as many as the whole search
        nodes = _prune(search, nodes, prune)
    spec, trial = search.alone(nodes)
    if not trial.agrees and nodes != ranked[size - 1]:
        # agreed as a packed copy but not alone (an engine may choose otherwise for one copy): the prefix
        nodes = ranked[size - 1]
        spec, trial = search.alone(nodes)
    _fill(found, search, nodes, spec, trial)
    return found


def _prune(search: Search, nodes: list[str], calls: int) -> list[str]:
    """Drop what the set does not need, ddmin's complement step in packed calls: the set split in
    up to ``width`` parts, every "set minus one part" judged in one call, the first that agrees
    taken; parts shrink to single nodes (1-minimal when the budget of ``calls`` lasts)."""
    parts = min(search.width, len(nodes))
    start = search.calls
    while search.calls - start < calls:
        if len(nodes) <= 1:
            break
        chunks = [nodes[i * len(nodes) // parts:(i + 1) * len(nodes) // parts] for i in range(parts)]
        candidates = [[n for n in nodes if n not in set(chunk)] for chunk in chunks if chunk]
        # no more sets than the calls left can hold (the budget is calls, not rounds)
        candidates = candidates[:search.width * (calls - (search.calls - start))]
        trials = search.judge(candidates)
        kept = next((c for c, t in zip(candidates, trials) if t.agrees and c), None)
        if kept is not None:
            nodes = kept
            parts = max(2, min(parts - 1, len(nodes)))
        elif parts >= len(nodes) and len(trials) == len(chunks):
            break  # every single node is needed: 1-minimal
        else:
            parts = min(len(nodes), parts * 2)
    return nodes


def _fill(found: Workaround, search: Search, nodes, spec, trial: Trial) -> None:
    found.nodes = list(nodes)
    found.setting = spec
    found.verdict = trial.kind
    found.error = trial.error
    found.tolerance = search.tolerance
    found.agrees = trial.agrees
    found.calls, found.cached = search.calls, search.cached
    found.trials = list(search.trials)
