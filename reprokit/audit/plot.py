"""The layerwise plot: error per tensor against depth (first divergence marked) above the
reference's largest magnitude per tensor against the narrow type's limits. matplotlib (Agg) is
imported only here, only when a plot is drawn.
"""

from __future__ import annotations

import math

from reprokit.files import atomic_write


def _number(value) -> float:
    if isinstance(value, str):
        return float(value)  # "inf" / "nan"
    return float(value)


def plot_layerwise(payload: dict, ranges, path: str) -> str:
    """Draw ``layerwise.png`` from audit.json's layerwise rows and the range report."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = payload["layerwise"]["rows"]
    tolerance = payload["criterion"]["tolerance"]
    metric = payload["criterion"]["metric"]
    model = payload["model"].rsplit("/", 1)[-1]
    if not rows:  # range audit only: the magnitudes panel alone
        fig, bottom = plt.subplots(1, 1, figsize=(11, 3.4))
        _ranges_panel(bottom, ranges)
        bottom.set_title(f"{model}: largest magnitude per tensor against the {ranges.precision} range", fontsize=10)
        bottom.set_xlabel("depth (tensor index in topological order)")
        fig.tight_layout()
        atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
        plt.close(fig)
        return path
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6.2), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    finite = [(_number(r["error"]), r) for r in rows]
    values = [e for e, _ in finite if math.isfinite(e) and e > 0]
    floor = min(values + [tolerance]) / 3 if values else tolerance / 100
    ceiling = max(values + [tolerance]) * 5 if values else tolerance * 100
    ok = [(r["index"], max(e, floor)) for e, r in finite if math.isfinite(e) and not r["exceeds"]]
    bad = [(r["index"], max(e, floor)) for e, r in finite if math.isfinite(e) and r["exceeds"]]
    nonfinite = [r["index"] for e, r in finite if not math.isfinite(e)]
    if ok:
        top.scatter(*zip(*ok), s=10, color="#7a8a99", label="within tolerance")
    if bad:
        top.scatter(*zip(*bad), s=14, color="#e08214", label="exceeds tolerance")
    if nonfinite:
        top.scatter(nonfinite, [ceiling] * len(nonfinite), s=18, marker="^", color="#c0142a", label="NaN/Inf in target")
    top.axhline(tolerance, color="#444", linestyle="--", linewidth=1, label=f"tolerance {tolerance:g}")
    top.set_yscale("log")
    top.set_ylim(floor / 1.5, ceiling * 2)
    top.set_ylabel(f"{metric} vs reference")
    first = payload["layerwise"]["first"]
    if first:
        for axis in (top, bottom):
            axis.axvline(first["index"], color="#c0142a", linewidth=1.2, alpha=0.7)
        top.annotate(f"first divergence: {first['node']} ({first['op']})", xy=(first["index"], ceiling),
                     xytext=(6, -4), textcoords="offset points", fontsize=8, color="#c0142a", va="top")
    grows = payload["layerwise"].get("amplifiers") or []
    if grows and (not first or grows[0]["index"] != first["index"]):
        grow = grows[0]
        top.annotate(f"error grows ×{grow['growth']:.3g} at {grow['node']} ({grow['op']})",
                     xy=(grow["index"], max(_number(grow["rel_l2"]), floor)), xytext=(-12, -28),
                     textcoords="offset points", fontsize=8, color="#8a4b00", ha="right",
                     arrowprops={"arrowstyle": "->", "color": "#8a4b00", "lw": 0.8})
    top.legend(loc="upper left", fontsize=7, framealpha=0.85)
    top.set_title(f"{model} under {payload['target']}: error per tensor (topological order)", fontsize=10)
    _ranges_panel(bottom, ranges)
    bottom.set_xlabel("depth (tensor index in topological order)")
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
    return path


def _ranges_panel(axis, ranges) -> None:
    points = [(r.index, r.max_abs) for r in ranges.rows if r.max_abs > 0 and math.isfinite(r.max_abs)]
    if points:
        axis.scatter(*zip(*points), s=6, color="#4a6fa5", label="max |x| (reference)")
    if ranges.maximum and ranges.maximum < 1e30:
        axis.axhline(ranges.maximum, color="#c0142a", linestyle="--", linewidth=1,
                     label=f"{ranges.precision} max {ranges.maximum:g}")
    flagged = [r for r in ranges.flagged]
    if flagged:
        marks = {"overflow": ("v", "#c0142a"), "underflow": ("o", "#7b3294"), "cancellation": ("s", "#e08214")}
        for kind, (marker, color) in marks.items():
            hits = [(r.index, max(r.max_abs, 1e-30)) for r in flagged if r.finding == kind]
            if hits:
                axis.scatter(*zip(*hits), s=36, marker=marker, facecolors="none", edgecolors=color,
                             linewidths=1.4, label=f"range audit: {kind}")
    weights = [(r.index, max(r.max_abs, 1e-30)) for r in ranges.weights if r.severe and r.index >= 0]
    if weights:
        axis.scatter(*zip(*weights), s=40, marker="x", color="#c0142a", label="range audit: weight (at its reader)")
    axis.set_yscale("log")
    axis.set_ylabel("max |x|")
    if not ranges.applicable:
        axis.text(0.01, 0.85, f"range audit: {ranges.reason}", transform=axis.transAxes, fontsize=8)
    if axis.get_legend_handles_labels()[0]:
        axis.legend(loc="upper left", fontsize=7, framealpha=0.85)
