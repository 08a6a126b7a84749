"""The drift window's search plan (pure algorithm: tiles and the pruning rule, no engine; the
search itself runs on real engines in test_packing.py and test_precision.py)."""

from __future__ import annotations

import math

from reprokit.shrink.passes.drift_window import _may_drift, first_tiles


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
