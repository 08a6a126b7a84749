"""What the Reducer knows of a candidate without an engine call: its one cache key, the trivial
and invalid outcomes (empty, missing the anchor, changing fixed inputs/outputs, splitting a Q/DQ
unit, refused by the candidate space), the journaled outcome of an earlier call (``cached``),
and the journal entry an engine outcome leaves (``record``), read back for the signature a
crop is held to (``held_for``) and for which test judged an accepted candidate.

A mixin of :class:`reprokit.shrink.reducer.Reducer`: it reads the Reducer's fields (``space``,
``index``, ``required``, ``keep_inputs``, ``keep_outputs``, ``journal``, ``signature``,
``cancelled``, ``judged_by``). Must not make an engine call or count statistics.
"""

from __future__ import annotations

from collections.abc import Iterable

from reprokit.engine.bug import Decision
from reprokit.engine.oracle import Kind, Signature
from reprokit.shrink.evaluator import Outcome
from reprokit.shrink.journal import entry_key
from reprokit.standalone.compare import jsonable

__all__ = ["KnownOutcomes"]


class KnownOutcomes:
    """The journal-backed cache of candidate outcomes, under one key."""

    def key(self, nodes: Iterable[int], crop: str = "") -> str:
        """The one cache key of a candidate: its node set in this numbering (``scope``) and, for
        a shape try, the crop of its inputs."""
        text = self.space.scope + ",".join(map(str, sorted(nodes))) + (f"|{crop}" if crop else "")
        return entry_key("cand", text)

    def cached(self, nodes, crop: str = "") -> Outcome | None:
        """The known outcome of a candidate (journal), or the trivial one; None = needs a call."""
        nodes = frozenset(nodes)
        if not nodes:
            return Outcome(False, "empty", "", None, True)
        if self.required and not self.required <= nodes:
            return Outcome(False, "no-anchor", "", None, True)
        if (self.keep_inputs or self.keep_outputs) and not self.io_kept(nodes):
            return Outcome(False, "invalid", "changes the model's inputs or outputs", None, True)
        why = self.space.refuse(nodes) if self.space.refuse is not None else None
        if not why and getattr(self.index, "units", None) and self.index.splits_unit(nodes):
            why = "splits a QuantizeLinear from its DequantizeLinear (a Q/DQ unit moves whole)"
        if why:
            return Outcome(False, "invalid", why, None, True)
        saved = self.journal.get(self.key(nodes, crop))
        if saved is not None:
            decision = saved.get("decision")
            return Outcome(
                saved["interesting"],
                saved["kind"],
                saved["detail"],
                saved["error"],
                True,
                saved.get("packed", False),
                saved.get("inferred", False),
                Decision(decision) if decision else None,
            )
        return None

    def io_kept(self, nodes: frozenset) -> bool:
        """Does the candidate keep what --no-reduce-inputs / --no-reduce-outputs hold fixed?
        Inputs: every tensor it reads is made inside it, a weight, a constant or a graph input
        (nodes go only from the end). Outputs: it holds every producer of a graph output and
        every reader of what it makes (nodes go only from the start)."""
        index = self.index
        if self.keep_inputs:
            for i in nodes:
                for tensor in index.node_inputs[i]:
                    producer = index.producer.get(tensor)
                    if (
                        producer is not None
                        and producer not in nodes
                        and tensor not in index.constants
                    ):
                        return False
        if self.keep_outputs:
            if any(
                index.producer.get(t) is not None and index.producer[t] not in nodes
                for t in index.graph_outputs
            ):
                return False
            if self._readers is None:
                self._readers = {}
                for reader, inputs in enumerate(index.node_inputs):
                    for tensor in inputs:
                        self._readers.setdefault(tensor, []).append(reader)
            for i in nodes:
                for tensor in index.node_outputs[i]:
                    if any(reader not in nodes for reader in self._readers.get(tensor, ())):
                        return False
        return True

    def record(self, nodes: frozenset, outcome: Outcome, *, crop: str = "") -> Outcome:
        """Journal an engine outcome (not after an interrupt: a killed call means nothing). An
        outcome inferred from a group's verdict is journaled as inferred, not as observed."""
        if not self.cancelled:
            entry = {
                "interesting": outcome.interesting,
                "kind": outcome.kind,
                "detail": outcome.detail,
                "error": jsonable(outcome.error),
                "nodes": len(nodes),
                "packed": outcome.packed,
            }
            if outcome.inferred:
                entry["inferred"] = True
            if outcome.decision is not None:
                entry["decision"] = outcome.decision.value
            if crop:
                entry["crop"] = crop
            self.journal.put(self.key(nodes, crop), entry)
        return outcome

    def held_for(self, nodes) -> Signature:
        """The signature a shape crop of ``nodes`` is held to: the original's, or — where that
        node set was accepted by the causal test showing another kind (an Inf that causes the
        original's mismatch) — the kind it showed: a crop has no full-size values to inject, so
        it must show what the node set showed."""
        saved = self.journal.get(self.key(frozenset(nodes))) or {}
        if (
            saved.get("decision") == Decision.CAUSAL.value
            and saved.get("kind") != self.signature.kind.value
        ):
            return Signature(Kind(saved["kind"]), self.signature.outputs, saved.get("detail", ""))
        return self.signature

    def _count_decision(self, nodes: frozenset) -> None:
        """summary.no_slippage.accepted: which test of engine/bug.py judged each accepted
        candidate, read from its journaled outcome (a shape try's crop is keyed apart: it is
        counted where it is accepted, shapes.py)."""
        saved = self.journal.get(self.key(nodes))
        decision = (saved or {}).get("decision") or "not judged alone (a pass's own inference)"
        self.judged_by[decision] = self.judged_by.get(decision, 0) + 1
