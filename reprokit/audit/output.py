"""Write an audit's files: audit.json (schema reprokit.audit/1), layerwise.png, audit.md (for
reports and issues), audit.html (self-contained: the PNG embedded as base64) and the Model
Explorer overlays (overlay-*.json, :mod:`reprokit.audit.overlay`)."""

from __future__ import annotations

import base64
import json
import os

from reprokit.audit.overlay import open_command, write_overlays
from reprokit.audit.plot import plot_layerwise
from reprokit.files import atomic_text
from reprokit.report.render import render
from reprokit.standalone.compare import jsonable

FILES = {"json": "audit.json", "markdown": "audit.md", "html": "audit.html", "plot": "layerwise.png"}




def table_rows(payload: dict, top: int = 12) -> list[dict]:
    """Layerwise rows worth a table: the first divergence, then the largest errors, depth order."""
    rows = payload["layerwise"]["rows"]
    first = payload["layerwise"]["first"]

    def size(row):
        value = row["error"]
        return float(value) if not isinstance(value, str) else float("inf")

    chosen = {r["index"] for r in sorted(rows, key=size, reverse=True)[:top] if r["exceeds"]}
    if first:
        chosen.add(first["index"])
    return [r for r in rows if r["index"] in chosen]


def worst_error(verdict: dict):
    """The largest metric value over a verdict's outputs (JSON form), or None."""
    errors = [o["error"] for o in verdict.get("outputs", [])]
    return max(errors, key=lambda e: float(e) if not isinstance(e, str) else float("inf"), default=None)


def write_outputs(payload: dict, layer, ranges, out_dir: str) -> dict:
    os.makedirs(out_dir, exist_ok=True)
    paths = {k: os.path.join(out_dir, v) for k, v in FILES.items()}
    payload["files"] = {k: os.path.basename(v) for k, v in paths.items()}
    safe = jsonable(payload)
    image = None
    try:
        if layer.rows or ranges.rows:
            plot_layerwise(safe, ranges, paths["plot"])
            with open(paths["plot"], "rb") as handle:
                image = base64.b64encode(handle.read()).decode("ascii")
    except ImportError:
        # The PNG is optional (matplotlib is no default dependency): say so on the console too,
        # which prints payload's notes, not this JSON-safe copy.
        missing = "layerwise.png not drawn: matplotlib is not installed (pip install 'reprokit[plot]')"
        safe["notes"].append(missing)
        payload.setdefault("notes", []).append(missing)
    if image is None:
        paths.pop("plot")
        safe["files"].pop("plot")

    overlays = write_overlays(safe, out_dir)  # Model Explorer node data (reprokit/audit/overlay.py)
    safe["files"].update({f"overlay_{k}": os.path.basename(v) for k, v in overlays.items()})
    safe["overlay"] = ({"files": sorted(os.path.basename(v) for v in overlays.values()),
                        "command": open_command(safe["model"], list(overlays.values()))} if overlays else None)
    paths.update({f"overlay_{k}": v for k, v in overlays.items()})
    values = {"a": safe, "layer_rows": table_rows(safe), "image": image, "worst_error": worst_error}
    atomic_text(paths["markdown"], render("audit.md.j2", **values))
    atomic_text(paths["html"], render("audit.html.j2", **values))
    payload["files"] = dict(safe["files"])
    payload["overlay"] = safe["overlay"]
    atomic_text(paths["json"], json.dumps(safe, indent=2))
    return {k: v for k, v in paths.items()}
