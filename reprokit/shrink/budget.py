"""A shrink run's call budget: its resource limits, the replays a target gets, the automatic
budget (about what polygraphy's bisect spends, plus reprokit's promises), the calls every run
makes outside the search, and the refusal of a --max-calls that cannot be kept. Every target call
counts against the budget. Runs no engine.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from reprokit.engine.backends import backend_class
from reprokit.errors import UsageError
from reprokit.files import read_json
from reprokit.spec import parse_target


@dataclass(frozen=True)
class Limits:
    """Resource bounds of a shrink run."""

    capture_chunk_bytes: int = 1 << 30  # activations one reference run may return at once
    pack_memory_bytes: int | None = None  # data one packed target call may hold; None = auto (pack_memory)
    max_activation_disk_bytes: int | None = None  # --max-activation-disk
    max_calls: int | None = -1  # target calls in all; -1 = auto (polygraphy parity), None = no limit
    pack_by: str = "auto"  # "count", "build-cost" or "auto" (build-cost on trt): shrink/buildcost.py


# Below this much data a packed call costs an engine little more than its own start-up (the
# samples' survey packs hold 5-241 MiB): splitting one would spend a call for nothing.
PACK_MEMORY_FLOOR = 256 << 20


def pack_memory(limits: Limits, run_bytes: int, shared_feeds: bool = False) -> int:
    """Data (feeds, outputs, weights of its members) one packed target call may hold. Auto: a
    multiple of ``run_bytes``, the data of one run of the whole model with every tensor marked
    (what the reference capture returns, what polygraphy's mark-all run holds), at least the
    floor and at most a capture chunk: twice it, or ``SHARED_FEEDS_RUNS`` times for an engine
    whose packs share equal feeds (``shared_feeds``: Backend.runs_nodes_as_written), whose peak
    per byte of a pack's data is lower. Measured, peak RSS of the engine process against a
    pack's data (PP-OCRv4 det and rec, one survey pack and its riders):
    OpenVINO CPU bf16, disjoint copies: 1,080 MiB for 529, 951 for 468, 466 for 137 (about
    330 MiB of start-up plus 1.6-2.1x the data); 2,151 MiB for the rec survey in one pack
    (494 MiB of feeds, 599 of outputs), above polygraphy's 1,195 for its marked run.
    emulate:bf16, shared feeds: 892 MiB for 709 (det), 1,050 for 831 (rec), 784 for 640, 967
    for 756: about 1.2-1.3x the data, start-up included. Polygraphy's marked run took
    1,064-1,139 MiB (det, a 170 MiB marked run) and 1,195-1,452 (rec, 202 MiB): about 6x a
    marked run, so these multiples keep a pack's peak 10% or more under it."""
    if limits.pack_memory_bytes is not None:
        return limits.pack_memory_bytes
    runs = SHARED_FEEDS_RUNS if shared_feeds else 2
    return int(min(limits.capture_chunk_bytes, max(PACK_MEMORY_FLOOR, runs * run_bytes)))


SHARED_FEEDS_RUNS = 4  # marked runs of data one pack may hold when its members share feeds (x1.3: under 6)


def packs_share_feeds(target: str) -> bool:
    """Do packed members of this target read one copy of the feeds they have in common? Only
    where the engine runs every node as written (Backend.runs_nodes_as_written): nothing can be
    merged or fused across members through a shared input."""
    spec = parse_target(target)
    return backend_class(spec.engine)(spec).runs_nodes_as_written


def default_replays(target: str) -> tuple[int, int]:
    """Extra runs of (the original, the result) when the user gives no --replays: none for a
    deterministic engine; for others the original once (a flaky target is caught before any
    reduction) and the result once. A pass/fail check command's failing original is not
    replayed: its replays are fresh runs of the result (``confirm.replays_go_to_result``, issue
    39), one fewer where a calibration pack failed alike (``passfail.result_replays``); a result
    whose judgement alone comes from the search's cache is no evidence for it (final.py). So a
    check command's run spends 4 calls outside the search on a deterministic check (confirm,
    then the calibration and the result twice, or the result three times), and ends "done" only
    after 4 runs of failing models failed — a check failing with probability p whatever the model
    gets there with probability at most p^4 once it reached a result (a search that met a
    contradiction earns the result two more runs, steps.shrink: p^6). bench_passfail.py
    --flaky-only measures it. A check command whose outputs are judged (numeric) gets the same
    one replay of the original and of the result as a built-in engine that is not deterministic:
    its shapes ladder's pack that judged the crop is the result's."""
    spec = parse_target(target)
    if backend_class(spec.engine)(spec).deterministic:  # per target: ort on the CPU is, ort:cuda is not
        return 0, 0
    return 1, 1


SHAPE_CALLS = 1  # what the auto budget adds for shapes: the ladder's packed call (its crop alone is the final)


def auto_call_budget(nodes: int, replays: int = 0) -> int:
    """About what polygraphy's bisect spends on a graph of ``nodes`` (log2 of the nodes for each
    end), plus what reprokit spends on its promises: the confirming call, the final judgement of
    the result alone and the ``replays`` of both. Every target call counts against it."""
    return 2 * math.ceil(math.log2(nodes + 1)) + 2 + replays


def inside_allowance(inner: int) -> int:
    """What the auto budget adds for reducing inside If branches (the inside step) when the model
    reduced still has ``inner`` nodes inside control flow: a bisection's worth of them."""
    return 2 * math.ceil(math.log2(inner + 1)) if inner > 0 else 0


def fixed_calls(target: str, replays: int | None) -> int:
    """Target calls a run may make whatever the search does: the confirming call and its
    replays, for a check command the pack calibration and the Identity probe, the result judged
    alone and its replays (steps confirm, calibrate, final). At most: a pass/fail check's original
    replays go to the result, one fewer where the calibration came, and the probe runs only when
    no call passed."""
    original, minimal = default_replays(target) if replays is None else (replays, replays)
    return 1 + original + (2 if parse_target(target).engine == "cmd" else 0) + 1 + minimal


def check_budget(target: str, max_calls: int | None, replays: int | None, resume: bool) -> None:
    """A --max-calls below what a run spends outside the search cannot be kept: refused before
    any call (a resumed run counts its earlier calls, so it is not checked here)."""
    if resume or max_calls is None or max_calls == -1:
        return
    needed = fixed_calls(target, replays)
    if max_calls < needed:
        raise UsageError(f"--max-calls {max_calls} is below the {needed} target calls every run of this target "
                         "makes outside the search (the confirming call, the result judged alone, their replays"
                         + (", the check's Identity probe and pack calibration" if parse_target(target).engine == "cmd"
                            else "") + ")",
                         hint=f"give --max-calls {needed} or more ({needed + 10} leaves the search room), or 'auto', "
                              "or fewer --replays")


def earlier_calls(out_dir: str) -> int:
    """Target calls the interrupted or budget-stopped run in ``out_dir`` already made."""
    try:
        return int(read_json(os.path.join(out_dir, "summary.json"))["calls"]["target"])
    except (ValueError, KeyError, TypeError):
        return 0
