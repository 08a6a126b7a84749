"""Packs by estimated build cost (issue 39): on TensorRT a build's time follows the nodes it
builds (measured with TensorRT-RTX on the H100, docs/benchmark.md), so a speculative member rides
in a packed call only where the estimate says it pays; on the emulator (whose cost is the call)
riders still fill the room the packs have left.

The reducer is a real one over the activations a finished ``shrink --target emulate:fp16`` of
the bundled layernorm sample captured (143 nodes); its target is ``trt`` or ``emulate:fp16``.
Deciding which members ride makes no engine call.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from reprokit.api import RunOptions, make_oracle
from reprokit.engine.activations import ActivationStore
from reprokit.engine.oracle import Kind, Signature
from reprokit.graph.index import GraphIndex
from reprokit.shrink.buildcost import RIDER_CHANCE, TENSORRT, for_target, policy
from reprokit.shrink.members import Member, fit, ride_along
from reprokit.shrink.passes import survey
from reprokit.shrink.reducer import Journal, Reducer
from reprokit.shrink.steps import shrink

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
NAME = "layernorm_overflow"


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    out = tmp_path_factory.mktemp("ln") / "out"
    shrink(
        str(SAMPLES / f"{NAME}.onnx"),
        "emulate:fp16",
        str(out),
        options=RunOptions(inputs=str(SAMPLES / f"{NAME}.inputs.npz")),
        shrink_shapes=False,
    )
    return out


def _reducer(out: Path, target: str, tmp: Path) -> Reducer:
    model = onnx.load(SAMPLES / f"{NAME}.onnx")
    summary = json.loads((out / "summary.json").read_text())
    inputs = SAMPLES / f"{NAME}.inputs.npz"
    oracle = make_oracle(target, RunOptions(inputs=str(inputs)), str(tmp / "calls"))
    with np.load(inputs) as data:
        feeds = {k: data[k] for k in data.files}
    signature = Signature(
        Kind(summary["signature"]["kind"]),
        tuple(summary["signature"]["outputs"]),
        summary["signature"]["detail"],
    )
    reducer = Reducer(
        model,
        GraphIndex.build(model),
        ActivationStore.open(str(out / ".reprokit" / "activations")),
        feeds,
        oracle,
        signature,
        workdir=str(tmp),
        journal=Journal(None),
        best=frozenset(range(len(model.graph.node))),
    )
    reducer.packing = "numeric"
    reducer.build_cost = policy("auto", target)  # what steps.py sets: --pack-by auto
    return reducer


def test_the_estimate_lets_a_pair_ride_and_keeps_a_window_out():
    assert for_target("trt:fp16") is TENSORRT and for_target("emulate:fp16") is None
    assert TENSORRT.rider_pays(1, RIDER_CHANCE) and TENSORRT.rider_pays(2, RIDER_CHANCE)
    assert not TENSORRT.rider_pays(30, RIDER_CHANCE)
    # a sure rider always pays; one never asked about never does
    assert TENSORRT.rider_pays(300, 1.0) and not TENSORRT.rider_pays(1, 0.0)
    # the fit: a one-node build 13.5 ms, 3.07 ms a node (docs/benchmark.md)
    assert TENSORRT.seconds(16, 1642) == pytest.approx(0.0135 * 16 + 0.00307 * 1642)


@pytest.mark.parametrize("target, window_rides", [("trt", False), ("emulate:fp16", True)])
def test_riders_on_tensorrt_ride_only_where_their_build_pays(
    captured, tmp_path, target, window_rides
):
    reducer = _reducer(captured, target, tmp_path)
    nodes = len(reducer.model.graph.node)
    singles = [
        Member(frozenset({i}), reducer.extraction(frozenset({i}), check=False)) for i in range(4)
    ]
    groups = fit(reducer, singles)
    pair = frozenset({10, 11})
    window = frozenset(range(20, 60))  # 40 consecutive nodes: a drift window's size
    riders = [
        Member(pair, reducer.extraction(pair, check=False), quiet=True),
        Member(window, reducer.extraction(window, check=False), quiet=True),
    ]
    ride_along(reducer, groups, riders)
    packed = {m.nodes for group in groups for m in group}
    assert pair in packed  # 2 nodes: the call it may save pays for building them now
    assert (window in packed) == window_rides, (target, nodes)


@pytest.mark.parametrize(
    "target, born", [("emulate:fp16", ["middle1/norm2/pow"]), ("emulate:bf16", [])]
)
def test_births_are_read_from_the_reference_values(captured, tmp_path, target, born):
    """survey.born_here, on the layernorm sample's real captured activations: the one node whose
    reference output overflows fp16 while its inputs do not is the Pow (the sample's answer; the
    ReduceMean after it reads the overflowed value, so it is no birth); bf16 holds every value."""
    reducer = _reducer(captured, target, tmp_path)
    found = [
        node.name for i, node in enumerate(reducer.model.graph.node) if survey.born_here(reducer, i)
    ]
    assert found == born


def test_chunks_double_after_the_first(captured, tmp_path):
    """The first chunk of the expected-cost optimum, each next one doubling, covering the
    sequence within the calls (a sequence of one chunk: nothing to double); where even that needs
    more calls, chunks of total/calls."""
    first = TENSORRT.chunk_nodes(916)
    assert TENSORRT.chunks(916) == (first, True)
    assert TENSORRT.chunks(916, calls=50) == (first, True)
    assert TENSORRT.chunks(916, calls=4) == (first, True)
    assert TENSORRT.chunks(4) == (4, False)  # one chunk holds it all
    sizes, left, size = [], 916, first
    while left > 0:
        sizes.append(min(size, left))
        left, size = left - size, size * 2
    assert len(sizes) <= 4, sizes
    assert TENSORRT.chunks(4000, calls=2) == (2000, False)
    reducer = _reducer(captured, "trt", tmp_path)
    singles = [
        Member(frozenset({i}), reducer.extraction(frozenset({i}), check=False)) for i in range(14)
    ]
    assert [len(g) for g in fit(reducer, singles, chunks=(2, True))] == [2, 4, 8]
    assert [len(g) for g in fit(reducer, singles, chunks=(5, False))] == [5, 5, 4]
