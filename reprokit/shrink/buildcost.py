"""What a packed call costs an engine that builds what it runs (issue 39): TensorRT's build time
follows the network it builds, not the number of calls. Owns the estimate (seconds ≈ a per call
+ b per node built, measured with TensorRT-RTX 1.7 on the H100: docs/benchmark.md, "TensorRT
build cost") and the one decision it drives: whether a speculative member (a rider) is worth its
build. Runs no engine, reads no file.
"""

from __future__ import annotations

from dataclasses import dataclass

from reprokit.spec import parse_target


@dataclass(frozen=True)
class BuildCost:
    """seconds ≈ ``per_call_s``·calls + ``per_node_s``·nodes built."""

    per_call_s: float
    per_node_s: float

    def seconds(self, calls: int, nodes: int) -> float:
        return self.per_call_s * calls + self.per_node_s * nodes

    def rider_pays(self, nodes: int, chance: float) -> bool:
        """A speculative member of ``nodes`` nodes that a later step needs with probability
        ``chance``: riding now saves that later call's fixed cost when it is needed, and builds
        its nodes for nothing when it is not (when needed they are built either way)."""
        return chance * self.per_call_s >= (1 - chance) * self.per_node_s * nodes


# TensorRT-RTX 1.7.1.116 on an H100, fp32, strongly typed (bench/results/buildcost/rtx_h100.jsonl,
# bench/trt_buildcost_fit.py): a one-node build 13.5 ms (median of 72), then 3.07 ms a node.
# Full TensorRT adds tactic timing per distinct layer configuration, which the run's shared
# timing cache pays once; its per-node part is larger too, its ratio of the two unmeasured.
TENSORRT = BuildCost(per_call_s=0.0135, per_node_s=0.00307)

# How likely a rider is to be asked about later: unknown in general, so even odds. At the
# measured TensorRT costs a rider then pays up to 4 nodes (a shape crop, a producer→consumer
# pair), never a 100-node drift window.
RIDER_CHANCE = 0.5


def for_target(target: str) -> BuildCost | None:
    """The build-cost model of ``target``'s engine; None for engines whose cost is the call
    itself (the emulator, onnxruntime, OpenVINO on the CPU: riders there cost memory, which the
    pack bounds already govern)."""
    return TENSORRT if parse_target(target).engine == "trt" else None
