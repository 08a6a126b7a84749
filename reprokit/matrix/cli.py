"""The matrix commands' printing: ``verify --versions`` progress, table and JSON, and ``matrix
clean``. Kept out of
``reprokit/cli.py`` (which only parses options); raises ReprokitErrors, never exits.
"""

from __future__ import annotations

import json
import os

import click

from reprokit.console import err, out
from reprokit.errors import MatrixNoAnswer
from reprokit.matrix.clean import clean_envs
from reprokit.matrix.run import verify_versions
from reprokit.matrix.table import b_words


def verify_matrix(archive: str, versions: str, *, target, timeout, as_json, bisect, ray_address, gpus, jobs,
                  out_path, force: bool = False, run_archive_code: bool = False) -> None:
    kinds = tuple(k.strip() for k in (gpus or "").split(",") if k.strip())
    on_event = None if as_json else (lambda text: err.print(f"[dim]{text}[/]"))
    try:
        result = verify_versions(archive, versions, target=target, bisect=bisect, ray_address=ray_address,
                                 gpus=kinds, jobs=jobs, timeout=timeout, out_path=out_path, on_event=on_event,
                                 force=force, run_archive_code=run_archive_code)
    except MatrixNoAnswer as exc:  # the table as far as it went, then the error and exit 9
        if exc.result is not None and as_json:  # one object on stdout: the error's, holding the table
            exc.details = {**exc.result.payload, "archive": exc.result.archive}
        elif exc.result is not None:
            show(exc.result, as_json)
        raise
    show(result, as_json)


def show(result, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({**result.payload, "archive": result.archive}, indent=2, default=str))
        return
    from rich.table import Table

    payload = result.payload
    table = Table(title=f"{payload['target']} under {payload['spec']} (reference: {payload['reference']})")
    for column in (payload["package"], "GPU kind", "outcome", "env (s)", "repro.py (s)", "note"):
        table.add_column(column)
    styles = {"reproduces": "red", "does not reproduce": "green", "diverges differently": "yellow"}
    for row in result.rows:
        version = row["version"] + (" (latest)" if row["version"] == payload.get("latest") else "")
        outcome = row["outcome"] + (" (packed with it; not rerun)" if row.get("known") else "")
        seconds = [("-" if row.get(k) is None else f"{row[k]:.1f}") for k in ("env_seconds", "run_seconds")]
        table.add_row(version, row.get("gpu") or "-", f"[{styles.get(row['outcome'], 'dim')}]{outcome}[/]",
                      *seconds, (row.get("why") or "")[:70])
    out.print(table)
    for row in result.rows:  # the table cuts notes at 70 characters; why a cell cannot run needs all of it
        if row["outcome"] in ("cannot run", "error") and len(row.get("why") or "") > 70:
            out.print(f"{row['version']}{' @ ' + row['gpu'] if row.get('gpu') else ''} {row['outcome']}: "
                      f"{' '.join(row['why'].split())[:400]}", markup=False, highlight=False)
    found = payload.get("bisect")
    if found:
        words = [b_words(b) for b in found["boundaries"]]
        out.print(f"bisect over {len(found['versions'])} releases with {found['environments']} "
                  f"environment{'s' if found['environments'] != 1 else ''}: "
                  + ("; ".join(words) if words else found.get("note", "")))
    if payload.get("ran"):
        err.print(f"[dim]each cell ran {payload['ran']}[/]", highlight=False)
    if result.archive:
        err.print(f"[dim]wrote {result.archive} (matrix.json, ISSUE.md answers 'the latest release')[/]")


def clean_matrix_envs(*, dry_run: bool, as_json: bool) -> None:
    result = clean_envs(dry_run=dry_run)
    if as_json:
        click.echo(json.dumps({**result.to_json(), "dry_run": dry_run}, indent=2))
        return
    if not os.path.isdir(result.root):
        out.print(f"no environment cache at {result.root}: nothing to remove")
        return
    verb = "would remove" if dry_run else "removed"
    count = len(result.removed)
    out.print(f"{verb} {count} environment{'s' if count != 1 else ''} in {result.root}: "
              f"{'would free' if dry_run else 'freed'} {_size(result.freed_bytes)}"
              + (f" ({result.freed_bytes} bytes)" if result.freed_bytes >= 1000 else "")
              + (f"; {_size(result.linked_bytes)} more stay as hard links into uv's cache (`uv cache clean` "
                 "frees them)" if result.linked_bytes else ""))
    if result.busy:
        out.print(f"kept {len(result.busy)} in use or being built now: {', '.join(result.busy)}")
    if result.left:
        shown = ", ".join(result.left[:8]) + (" …" if len(result.left) > 8 else "")
        out.print(f"left alone (not environments reprokit built): {shown}")


def _size(count: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"
