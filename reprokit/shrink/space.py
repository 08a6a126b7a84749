"""The candidate space: how a reducer's node ids become candidate models, and how the causal
test (engine/bug.py) reaches the values a candidate's target run gives.

One object, supplied by whoever numbers the nodes: the run (top-level positions of the model
reduced), the opening (each candidate put back inside an If: ``wrap``), the inside step (sites
inside If branches: ``build``/``refuse``, journal keys under their own ``scope``) and the model
the inside step adopts. Every candidate of every space is judged by the one decision; the space
says only how its node ids map onto the model the causal test injects into: top-level positions
(the cone test applies), or names alone (the candidate's outputs that are top-level tensors of
that model are injected; a candidate with none is held to its signature, and counted so).

Must not judge verdicts, call engines or count budgets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class CandidateSpace:
    scope: str = ""  # prefix of journal keys: node ids of another numbering never meet the run's
    build: Callable | None = None  # build(nodes, check) -> Extraction, where ids are not top-level positions
    wrap: Callable | None = None  # puts each candidate back inside its control flow (controlflow.wrap_in_if)
    refuse: Callable | None = None  # refuse(nodes) -> why a candidate cannot be built (no engine call), or None
    top_level: bool = True  # ids are positions in the model the causal test injects into

    def causal_nodes(self, nodes, same_model: bool):
        """The candidate's node ids as the causal test's cone test reads them, or None (names only)."""
        return nodes if self.top_level and self.build is None and same_model else None

    def describe(self) -> str:
        if self.build is not None:
            return "nodes inside If branches"
        if self.wrap is not None:
            return "each candidate kept inside an If"
        return "top-level nodes" if self.top_level else "nodes of the model the inside step adopted"
