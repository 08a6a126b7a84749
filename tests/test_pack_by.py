"""``--pack-by build-cost`` (issue 39): packing by estimated TensorRT build seconds, the policy of
``trt`` targets, run here on the emulator so that it can be checked without a GPU.

The same bundled sample is shrunk twice with the real fp16 emulator, once packed by count (the
emulator's default: one survey pack holding every single, the producer→consumer pairs, the
marked layerwise copy and the original) and once by build cost (the singles in chunks that stop
at the first hit — the nodes where an fp16 overflow or underflow is born first, then graph order —
no riders that do not pay, the marked copy only where no single answers). Both must keep the same nodes; the build-cost run must build fewer nodes, and
summary.json's ``build_work.by_kind`` must say where they went.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reprokit.api import RunOptions
from reprokit.shrink.budget import Limits
from reprokit.shrink.buildcost import TENSORRT, BuildCost, policy
from reprokit.shrink.steps import shrink

SAMPLES = Path(__file__).resolve().parent.parent / "samples"


def _shrink(name: str, out: Path, pack_by: str) -> dict:
    shrink(
        str(SAMPLES / f"{name}.onnx"),
        "emulate:fp16",
        str(out),
        options=RunOptions(inputs=str(SAMPLES / f"{name}.inputs.npz")),
        limits=Limits(pack_by=pack_by),
        shrink_shapes=False,
    )
    return json.loads((out / "summary.json").read_text())


# static_batch_broadcast: one ReduceSum overflows alone (the survey's singles answer);
# log_div_underflow: no single node shows the Inf alone, localize keeps a 3-node region (Log, Pow,
# ReduceMean) grown from the marked run's anchor.
@pytest.mark.parametrize(
    "name, single_answers", [("static_batch_broadcast", True), ("log_div_underflow", False)]
)
def test_build_cost_policy_builds_less_and_keeps_the_answer(tmp_path, name, single_answers):
    by_count = _shrink(name, tmp_path / "count", "count")
    by_cost = _shrink(name, tmp_path / "cost", "build-cost")
    assert by_cost["status"] == by_count["status"] == "done"
    assert by_cost["minimal"]["node_names"] == by_count["minimal"]["node_names"]
    counted, costed = by_count["build_work"], by_cost["build_work"]
    assert costed["nodes_built"] < counted["nodes_built"], (counted, costed)
    est = {
        k: TENSORRT.seconds(s["calls"]["target"], s["build_work"]["nodes_built"])
        for k, s in (("count", by_count), ("cost", by_cost))
    }
    assert est["cost"] < est["count"], est
    # every node built is accounted for, per step and member kind
    for work in (counted, costed):
        assert sum(work["by_kind"].values()) == work["nodes_built"], work
    # by count, the survey pack carries the marked copy and the pairs whatever the singles say
    assert counted["by_kind"].get("survey: marked copy") and counted["by_kind"].get("survey: rider")
    # by build cost no pair rides, and the marked copy is built only where no single answers
    assert not any(
        kind.endswith("rider") and kind.startswith("survey") for kind in costed["by_kind"]
    )
    assert ("survey: marked copy" in costed["by_kind"]) is not single_answers, costed["by_kind"]


# polygraphy debug reduce on log_div_underflow (bench/results/shrink.md: its calls and nodes built are
# deterministic, the same in every run): 12 builds, 204 nodes built in all.
POLYGRAPHY_LOG_DIV = (12, 204)


def test_log_div_costs_no_more_than_polygraphy(tmp_path):
    """log_div_underflow (fp16 emulator, real model): no node shows the Inf alone. The survey asks
    only the node where the underflow is born (Pow: its reference output flushes to zero in fp16),
    then the marked copy's anchor leads localize to the same 3-node path packing by count keeps —
    without every single and every pair asked first (13 calls, 498 nodes before: 2.2x polygraphy's
    estimated build seconds)."""
    by_cost = _shrink("log_div_underflow", tmp_path / "cost", "build-cost")
    assert by_cost["status"] == "done"
    assert sorted(by_cost["minimal"]["node_names"]) == [
        "energy/log",
        "energy/pow",
        "energy/reduce_mean",
    ]
    assert by_cost["one_minimal"] is True
    calls, nodes = by_cost["calls"]["target"], by_cost["build_work"]["nodes_built"]
    assert TENSORRT.seconds(calls, nodes) <= TENSORRT.seconds(*POLYGRAPHY_LOG_DIV), (calls, nodes)
    by_kind = by_cost["build_work"]["by_kind"]
    assert by_kind["survey: asked"] == 1 and "pairs: asked" not in by_kind, by_kind


@pytest.mark.parametrize(
    "name, fault",
    [
        ("attention_softmax_nan", "layer2/self0/attn/qk_matmul"),
        ("layernorm_overflow", "middle1/norm2/pow"),
    ],
)
def test_build_cost_survey_asks_the_overflow_first(tmp_path, name, fault):
    """The node whose reference output overflows fp16 is asked first, in the original's own call:
    the survey builds one candidate node, not a graph-order chunk after chunk up to the fault."""
    by_cost = _shrink(name, tmp_path / "cost", "build-cost")
    assert by_cost["minimal"]["node_names"] == [fault]
    by_kind = by_cost["build_work"]["by_kind"]
    assert by_kind["survey: asked"] == 1 and "survey: marked copy" not in by_kind, by_kind
    assert by_cost["steps"][[s["step"] for s in by_cost["steps"]].index("survey")]["calls"] == 1


def test_chunk_size_is_the_expected_cost_minimum():
    """Chunks of k nodes over a sequence of n stopping at a hit equally likely at any node: the
    chosen k is within one of the brute-force minimum of the exact expected cost."""
    cost = BuildCost(per_call_s=0.0135, per_node_s=0.00307)

    def expected(n: int, k: int) -> float:
        total = 0.0
        for hit in range(1, n + 1):
            chunks = -(-hit // k)
            total += cost.seconds(chunks, min(n, chunks * k))
        return total / n

    for n in (10, 65, 230, 417, 2000):
        best = min(range(1, n + 1), key=lambda k: expected(n, k))
        chosen = cost.chunk_nodes(n)
        assert expected(n, chosen) <= expected(n, best) * 1.05, (n, chosen, best)


def test_pack_by_resolves_per_target():
    assert policy("auto", "trt:fp16") is TENSORRT and policy("auto", "emulate:fp16") is None
    assert policy("build-cost", "emulate:fp16") is TENSORRT and policy("count", "trt") is None
    with pytest.raises(ValueError):
        policy("nodes", "trt")
