"""reprokit's estimated TensorRT build seconds split as issue 39's cost criteria read them: the
**fixed** part (what every sound run pays: the confirmation, the calibration, the probe, the
result's runs and replays, an accumulated error's tested workaround — summary.json's steps of
those names) and the **search** (all else),
each priced by the estimate of record (reprokit/shrink/buildcost.py ESTIMATE) from what each
step's calls built: heavy layers, and the calls of light layers only at the light rate. Beside
them the **floor**: the estimate of the cheapest sound run, one build of the user's model (the
confirmation) and one of reprokit's result.

Shared by bench/bench_shrink.py and bench/bench_passfail.py; reads results, runs nothing.
"""

from __future__ import annotations

from reprokit.shrink.buildcost import ESTIMATE

# summary.json's steps outside the search (issue 39: "fixed calls: confirm, calibrate, the result
# twice"; the probe — one call on a one-node Identity model — asks the check, not the model; and
# "accumulated errors: <= 4 calls plus the workaround's own calls": an accumulated run's
# attribution step makes no call but the tested workaround's, each a build of the whole model)
FIXED_STEPS = ("confirm", "calibrate", "probe", "replay", "final", "attribution")


def step_seconds(step: dict) -> float:
    """One summary.json step's calls priced by ESTIMATE (its light calls at the light rate)."""
    return ESTIMATE.seconds(
        step["calls"], step["heavy_built"], step["light_calls"], step["light_nodes"]
    )


def riding_seconds(by_kind: dict, nodes: int, heavy: int) -> float:
    """What the copies of the original (``nodes`` nodes, ``heavy`` heavy layers) that rode in a
    search step's packed call added to those builds — a confirmation or replay carried by the
    survey pack, a calibration or group test: their layers, not a call (the call was made anyway)."""
    riding = sum(
        built
        for kind, built in by_kind.items()
        if kind.endswith(": original copy") and kind.split(":")[0] not in FIXED_STEPS
    )
    copies = riding / max(1, nodes)
    return copies * (ESTIMATE.per_heavy_s * heavy if heavy else ESTIMATE.per_light_node_s * nodes)


def split(
    steps: list[dict] | None, by_kind: dict | None, nodes: int, heavy: int
) -> tuple[float, float] | None:
    """(fixed, search) estimated seconds of one reprokit run from summary.json's ``steps`` and
    ``build_work.by_kind``; ``nodes``/``heavy``: the original the run built copies of (a copy riding
    in a search step's pack is fixed work). None for a run recorded before light calls were named."""
    if not steps or by_kind is None or any("light_calls" not in s for s in steps):
        return None
    fixed = sum(step_seconds(s) for s in steps if s["step"] in FIXED_STEPS)
    search = sum(step_seconds(s) for s in steps if s["step"] not in FIXED_STEPS)
    riding = riding_seconds(by_kind, nodes, heavy)
    return fixed + riding, search - riding


def floor(model: tuple[int, int], result: tuple[int, int]) -> float:
    """The cheapest sound run: one build of the user's model and one of the result, each a
    (nodes, heavy layers) pair."""
    return ESTIMATE.call_seconds(*model) + ESTIMATE.call_seconds(*result)


def above_lines(rows: list[tuple[str, float, float, float, float]]) -> list[str]:
    """The table's closing lines from (name, reprokit est., its fixed part, its search part,
    polygraphy's est.) per row: the restated criterion (search <= polygraphy's whole estimate on
    every row) and the rows where reprokit's whole estimate is above polygraphy's, each with
    whether the excess is at most its fixed part."""
    over_search = [
        f"{name} ({search:.2f} vs {pg:.2f} s)" for name, _, _, search, pg in rows if search > pg
    ]
    lines = [
        f"Search est. <= polygraphy's whole est. on {len(rows) - len(over_search)} of {len(rows)} rows"
        + (f"; above on: {', '.join(over_search)}." if over_search else ".")
    ]
    over = [(name, rk - pg, fixed) for name, rk, fixed, _, pg in rows if rk > pg]
    if not over:
        return [*lines, "reprokit's whole est. is above polygraphy's on no row."]
    within = sum(excess <= fixed for _, excess, fixed in over)
    lines.append(
        f"reprokit's whole est. above polygraphy's on {len(over)} of {len(rows)} rows, the excess at most "
        f"its fixed calls' est. on {within} of them: "
        + ", ".join(
            f"{name} (+{excess:.2f} s, fixed {fixed:.2f} s: {'within' if excess <= fixed else 'NOT within'})"
            for name, excess, fixed in over
        )
        + "."
    )
    return lines
