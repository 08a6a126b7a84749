"""The drift window's search plan (pure algorithm: tiles and the pruning rule, no engine; the
search itself runs on real engines in test_packing.py and test_precision.py)."""

from __future__ import annotations

import math

from reprokit.shrink.passes.drift_window import (
    FIRST_BY_COST,
    _may_drift,
    _next_round,
    _next_rounds,
    first_tiles,
)


def test_the_first_round_asks_its_windows_smallest_first_and_covers_the_graph():
    tiles = first_tiles(330)
    sizes = [size for _, size in tiles]
    assert sizes == sorted(sizes) and set(sizes) == {330 // k for k in (16, 8, 4, 2)}
    for size in set(sizes):  # every size tiles the whole graph, the last window flush at its end
        starts = [a for a, s in tiles if s == size]
        assert starts[0] == 0 and starts[-1] + size == 330


def test_a_window_inside_one_that_stayed_far_under_the_bar_is_not_asked():
    judged = {(0, 20): 0.01, (20, 20): 0.08}
    assert not _may_drift((4, 6), judged, 0.1)  # inside a window at a tenth of the bar
    assert _may_drift((24, 6), judged, 0.1)  # inside one near the bar
    assert _may_drift((16, 6), judged, 0.1)  # no judged window holds it whole: asked
    assert _may_drift((4, 6), judged, None) and _may_drift((4, 6), judged, math.nan)  # no bar: asked


def test_a_rounds_riders_are_the_next_round_of_its_likeliest_hit_first():
    """Each window a round asks brings the round it would start were it the hit, as riders: the
    window whose smallest judged container drifted most first (its halves, quarters, eighths,
    then the shorter sizes over the graph), none twice and none the round asks itself."""
    seen = {(0, 40): 0.01, (40, 40): 0.09}  # bar 0.1: the first half far under it, the second near
    tiles = [(4, 10), (44, 10), (40, 20)]
    riders = _next_rounds(tiles, 80, seen, 0.1)
    assert riders[:len(_next_round(44, 10, 80, seen, 0.1))] == _next_round(44, 10, 80, seen, 0.1)
    assert not any(a < 40 and a + s <= 40 for a, s in riders)  # inside a window at a tenth of the bar
    assert len(riders) == len(set(riders)) and not set(riders) & set(tiles)


def test_windows_the_marked_run_leaves_under_half_the_bar_are_not_asked_the_likeliest_first():
    """The marked run's error at a window's nodes bounds what the window adds alone: a window whose
    nodes stayed under half the bar there is not asked, and each size asks its windows the
    largest marked-run error first (the window holding the error's jump before the others)."""
    at = [0.01] * 320 + [0.3] + [0.04] * 9  # 330 nodes: the marked run's error jumps at node 320

    def peak(tile):
        return max(at[tile[0]:tile[0] + tile[1]])

    tiles = first_tiles(330, peak, 0.1)
    assert tiles and all(peak(t) >= 0.05 for t in tiles)  # only windows holding node 320 are left
    assert all(a <= 320 < a + s for a, s in tiles)
    sizes = [s for _, s in tiles]
    assert sizes == sorted(sizes)
    assert first_tiles(330, None, 0.1) == first_tiles(330)  # no marked run: every window, as before
    flat = [0.06] * 330
    ranked = first_tiles(330, lambda t: max(flat[t[0]:t[0] + t[1]]) + (0.01 if t[0] == 40 else 0.0), 0.1)
    assert [t for t in ranked if t[1] == 20][0] == (40, 20)  # within a size, the likeliest first


def test_by_build_cost_the_first_tiling_starts_at_eighths_and_still_covers_every_sixteenth():
    """Each size's tiling builds about twice the model: packed by build cost the sixteenths are
    not tiled, and every sixteenth-window lies whole inside an eighth-window (half-window strides)."""
    coarse = first_tiles(330, finest=FIRST_BY_COST)
    assert min(size for _, size in coarse) == 330 // 8
    for a, size in first_tiles(330):
        if size == 330 // 16:
            assert any(b <= a and a + size <= b + length for b, length in coarse if length == 330 // 8)


def test_after_a_hit_below_the_first_tiling_no_shorter_size_goes_over_the_graph():
    """The round after a 12-node hit asks inside it only (elsewhere=False), not the 3/4 and 5/8
    sizes over all 403 nodes (PP-OCRv4 rec under openvino:bf16: 988 nodes built for no hit)."""
    inside = _next_round(213, 12, 403, {}, 0.01, elsewhere=False)
    assert inside and all(213 <= a and a + s <= 225 for a, s in inside)
    assert len(_next_round(213, 12, 403, {}, 0.01)) > 4 * len(inside)  # by count: the graph too
