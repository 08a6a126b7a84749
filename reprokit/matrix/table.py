"""Words for a matrix: the markdown table, the JSON payload (schema ``reprokit.matrix/1``) and
the answer to "Have you tried the latest release?" that goes into ISSUE.md. Pure formatting:
runs nothing, judges nothing.
"""

from __future__ import annotations

import re

SCHEMA = "reprokit.matrix/1"


def _seconds(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def row_words(row: dict) -> str:
    if row.get("known"):
        return f"{row['outcome']} (packed with it; not rerun)"
    return row["outcome"]


def markdown_table(rows: list[dict], package: str, latest: str | None) -> str:
    lines = [f"| {package} | GPU kind | outcome | env (s) | repro.py (s) | note |",
             "| --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        version = row["version"] + (" (latest)" if row["version"] == latest else "")
        note = (row.get("why") or "").replace("|", "\\|")
        if row.get("env_built") is False:
            note = (note + "; " if note else "") + "environment from the cache"
        lines.append(f"| {version} | {row.get('gpu') or '-'} | {row_words(row)} | {_seconds(row.get('env_seconds'))} "
                     f"| {_seconds(row.get('run_seconds'))} | {note[:160]} |")
    return "\n".join(lines)


def latest_answer(payload: dict) -> str:
    """The ISSUE.md paragraph: what ran, where it reproduces, and the bisected boundary."""
    package, rows, latest = payload["package"], payload["rows"], payload.get("latest")
    by = {}
    for row in rows:
        by.setdefault(row["outcome"], []).append(row["version"] + (f" @ {row['gpu']}" if row.get("gpu") else "")
                                               + (" (latest)" if row["version"] == latest else ""))
    parts = [f"{word} on {package} {', '.join(versions)}" for word, versions in by.items()]
    text = (f"Yes. `repro.py` ran against {package} release by release, each in a fresh environment "
            f"(`reprokit verify --versions '{payload['spec']}'{' --bisect' if payload.get('bisect') else ''}`): "
            + "; ".join(parts) + ".")
    if latest and not any(row["version"] == latest for row in rows):
        text += f" The latest release on the index, {latest}, was not run."
    found = payload.get("bisect")
    if found:
        words = [b_words(b) for b in found["boundaries"]]
        span = f"{found['versions'][0]} to {found['versions'][-1]}"
        text += (f"\n\nBisected over {len(found['versions'])} releases ({span}) with {found['environments']} "
                 f"environment{'s' if found['environments'] != 1 else ''}: " + ("; ".join(words) if words else found.get("note", "no change found")) + ".")
    text += "\n\nThe whole table is in `matrix.json` and below.\n\n" + markdown_table(rows, package, latest)
    return text


def b_words(boundary: dict) -> str:
    if boundary["kind"] == "fixed":
        return f"first fixed release {boundary['after']} (last reproducing {boundary['before']})"
    return f"first reproducing release {boundary['after']} (last good {boundary['before']})"


# "## Have you tried [the latest release](…)?" (TensorRT's form) or "### Have you tried the latest
# release?" (the OpenVINO and onnxruntime forms, whose fields are level-3 headings).
_LATEST_HEADING = re.compile(r"^#{2,3} .*latest (release|version).*$", re.IGNORECASE | re.MULTILINE)


def answer_in_issue(issue: str, answer: str) -> str:
    """ISSUE.md with its "latest release" section answered by ``answer`` (appended as its own
    section where the template has none)."""
    match = _LATEST_HEADING.search(issue)
    if match is None:
        return issue.rstrip("\n") + "\n\n## Where it reproduces (engine versions)\n\n" + answer + "\n"
    following = re.search(r"^#{2,3} ", issue[match.end():], re.MULTILINE)
    end = match.end() + following.start() if following else len(issue)
    return issue[:match.end()] + "\n\n" + answer + "\n\n" + issue[end:].lstrip("\n")
