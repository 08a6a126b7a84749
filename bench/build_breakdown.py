"""Where each run's nodes built go (issue 39): reprokit's per step and member kind, polygraphy's per call.

    python bench/build_breakdown.py bench/results/shrink.json > bench/results/shrink.build.md

bench/bench_shrink.py writes ``shrink.build.md`` itself after a run. Reads a results JSON, runs
nothing. Counted the same way for both tools: the nodes of every model the target built
(reprokit: summary.json's ``build_work.by_kind``; polygraphy: the node count of each model its
``--check`` was given, logged by bench/oracle_check.py). polygraphy's ``debug reduce`` never
builds the whole original (its first build is a half); reprokit confirms the original on the
target first, so its lower bound per row is that copy and the result judged alone.
"""

from __future__ import annotations

import json
import os
import sys

from reprokit.shrink.buildcost import ESTIMATE, TENSORRT

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cost_split  # noqa: E402  (bench/: the floor, priced by the estimate of record)


def _est(calls: int, nodes: int) -> str:
    """The per-node estimate of the earlier rounds (buildcost.TENSORRT), kept for comparability."""
    return f"{TENSORRT.seconds(calls, nodes):.2f}"


def _est_heavy(row: dict) -> str:
    """The estimate of record (buildcost.ESTIMATE): calls, heavy layers built, and the calls of
    light layers only where the row names them (polygraphy's from its log, reprokit's from
    summary.json's build_work; a row recorded before that prices them as calls with heavy layers).
    — for a row recorded before heavy layers were counted."""
    if row.get("heavy_built") is None:
        return "—"
    seconds = ESTIMATE.seconds(
        row["calls"], row["heavy_built"], row.get("light_calls") or 0, row.get("light_nodes") or 0
    )
    return f"{seconds:.2f}"


def _heavy(row: dict) -> str:
    return "—" if row.get("heavy_built") is None else str(row["heavy_built"])


def _kinds(row: dict) -> str:
    found = row.get("built_by") or {}
    return ", ".join(
        f"{kind} {nodes}" for kind, nodes in sorted(found.items(), key=lambda item: -item[1])
    )


def _polygraphy_calls(row: dict) -> str:
    calls = row.get("call_nodes") or []
    if not calls:
        return "(not logged: a row reused from an earlier run)"
    return (
        " + ".join(map(str, calls))
        if len(calls) <= 24
        else f"{' + '.join(map(str, calls[:24]))} + …"
    )


def _floor(res: dict) -> tuple[str, str]:
    """The lower bound's heavy layers and its estimate of record (bench/cost_split.py's floor: one
    build of the user's model and one of the result); — for a row recorded before they were."""
    rk = res.get("reprokit") or {}
    model, result = rk.get("model_work"), rk.get("result_work")
    if not model or not result or model[1] is None:
        return "—", "—"
    return str(model[1] + result[1]), f"{cost_split.floor(model, result):.2f}"


def lower_bound(res: dict) -> tuple[int, int] | None:
    """(calls, nodes) reprokit cannot go under on a row: the original's confirmation (one copy of the
    model it reduces) and the result judged alone (the emulator's targets replay neither); an
    accumulated error's result is its printed workaround, a run of the whole model."""
    rk = res.get("reprokit") or {}
    if rk.get("error") or not rk.get("start_nodes"):
        return None
    result = (
        rk["start_nodes"] if rk.get("status") == "accumulated" else (rk.get("minimal_nodes") or 0)
    )
    return 2, rk["start_nodes"] + result


def render(payload: dict) -> str:
    lines = [
        "# Where the nodes built go",
        "",
        f"Estimated TensorRT build seconds (reprokit/shrink/buildcost.py): *est.*, the estimate of record, "
        f"{ESTIMATE.per_call_s} s a call + {ESTIMATE.per_heavy_s} s a heavy layer built, a call of light layers "
        f"only {ESTIMATE.per_light_call_s} s + {ESTIMATE.per_light_node_s} s a node (polygraphy's light calls "
        "named by its log, reprokit's by summary.json; before it named them, priced as heavy); *est. per node, old*: "
        f"{TENSORRT.per_call_s} s a call + {TENSORRT.per_node_s} s a node built. reprokit runs twice per row: with the target's default packing "
        "(count: the emulator, OpenVINO) and with `--pack-by build-cost` (the policy of trt targets). "
        "The lower bound is reprokit's confirmation of the original plus the result judged alone.",
        "",
        "| model | run | calls | nodes built | heavy layers built | est. (s) | est. per node, old (s) "
        "| where the nodes went |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for res in payload["results"]:
        if res.get("error"):
            continue
        for label, key in (
            ("reprokit (default)", "reprokit"),
            ("reprokit --pack-by build-cost", "reprokit_cost"),
        ):
            row = res.get(key)
            if not row or row.get("error") or row.get("calls") is None:
                continue
            lines.append(
                f"| {res['name']} | {label} | {row['calls']} | {row['nodes_built']} | {_heavy(row)} | "
                f"{_est_heavy(row)} | {_est(row['calls'], row['nodes_built'])} | {_kinds(row)} |"
            )
        pg = res.get("polygraphy") or {}
        if pg.get("calls") is not None:
            lines.append(
                f"| {res['name']} | polygraphy | {pg['calls']} | {pg['nodes_built']} | {_heavy(pg)} | "
                f"{_est_heavy(pg)} | {_est(pg['calls'], pg['nodes_built'])} | "
                f"per call: {_polygraphy_calls(pg)} |"
            )
        bound = lower_bound(res)
        if bound is not None:
            lines.append(
                f"| {res['name']} | reprokit's lower bound | {bound[0]} | {bound[1]} | "
                f"{' | '.join(_floor(res))} | {_est(*bound)} | the original's confirmation + the result alone |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    with open(sys.argv[1]) as handle:
        print(render(json.load(handle)))
