"""The trust boundary for running an archive: what code runs on an archive someone sent.

An archive is data. ``runnable`` is the ONE function every path that runs something on an
archive's behalf passes (``verify --versions`` cells, local or on Ray): it returns the script to
run and the files it reads. By default the script is reprokit's OWN standalone reproducer,
rendered here from ``templates/repro.py.j2`` with the archive's recorded settings (verdict.json,
checked by ``check_verdict``) as Python literals (``pylit``): the archive supplies numbers,
names and files (model, inputs, reference outputs), never code. The archive's own ``repro.py``
runs only when the user asked for it by name (``--run-archive-code``).

This module runs nothing and never imports an engine; the cells run what it returns.
Plain ``verify`` runs no script at all (reprokit's own check, in process workers).
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass

from reprokit.errors import InputError
from reprokit.report.archive import files_under
from reprokit.report.render import render
from reprokit.report.reprovalues import repro_values
from reprokit.report.schema import check_verdict
from reprokit.report.verify import archive_policy, trusted_archive_spec

SCRIPT = "repro.py"  # where the cell writes the script it runs (the archive's own is not kept)
OPT_IN = "--run-archive-code"


class Origin(str, enum.Enum):
    REPROKIT = "reprokit's own reproducer (the archive's repro.py is not run)"
    ARCHIVE = "the archive's own repro.py (--run-archive-code)"


@dataclass(frozen=True)
class Runnable:
    """What a cell runs: ``script`` (Python source) beside the checked files of ``top`` (the
    archive's extracted top folder; its own repro.py left out), and where the script came from."""

    script: str
    top: str
    origin: Origin

    def names(self) -> list[str]:
        """The files a cell gets, as paths in the top folder."""
        return [rel for rel in files_under(self.top) if rel != SCRIPT]

    def files(self) -> tuple[tuple[str, bytes], ...]:
        """The files as bytes, for a cell on another machine (Ray's object store)."""
        return tuple((rel, _read(self.top, rel)) for rel in self.names())

    def cargo(self, *, as_bytes: bool) -> dict:
        """Plain data for a cell: the files as bytes (Ray), or the folder's path and the names to
        copy (a local cell, while the folder exists): no copy of a large model in memory."""
        if as_bytes:
            return {"script": self.script, "files": self.files()}
        return {"script": self.script, "folder": self.top, "names": self.names()}


def runnable(
    top: str,
    recorded: dict,
    archive_path: str,
    *,
    target: str | None = None,
    run_archive_code: bool = False,
) -> Runnable:
    """The boundary: the script and the data files a cell gets for the archive extracted (and its
    manifest checked) at ``top`` (``verify.open_archive``). Without ``run_archive_code`` nothing
    the archive wrote is code; ``target`` is the user's --target (else the archive's, checked)."""
    check_verdict(recorded, archive_path)
    if run_archive_code:
        path = os.path.join(top, SCRIPT)
        if not os.path.isfile(path):
            raise InputError(
                f"archive {archive_path} has no {SCRIPT} to run ({OPT_IN})",
                hint=f"drop {OPT_IN}: reprokit's own reproducer needs no repro.py",
            )
        with open(path, encoding="utf-8", errors="replace") as handle:
            script, origin = handle.read(), Origin.ARCHIVE
    else:
        script, origin = (
            standalone_reproducer(recorded, archive_path, target=target),
            Origin.REPROKIT,
        )
    return Runnable(script, top, origin)


def _read(top: str, rel: str) -> bytes:
    with open(os.path.join(top, *rel.split("/")), "rb") as handle:
        return handle.read()


def standalone_reproducer(recorded: dict, archive_path: str, *, target: str | None = None) -> str:
    """reprokit's repro.py template rendered for the archive's recorded verdict by the same builder
    ``pack`` uses (report/reprovalues.py): every value the archive gives enters as a Python literal
    in SETTINGS (or, in the docstring, escaped as text); the code is reprokit's."""
    check_verdict(recorded, archive_path)
    target = target or trusted_archive_spec(
        recorded["target"], "target", archive_path
    )  # never cmd: or a path
    checked = {
        **recorded,
        "reference": trusted_archive_spec(
            recorded.get("reference", "ort"), "reference", archive_path
        ),
        "check_policy": archive_policy(recorded, archive_path).to_json(),  # its regexes bounded
    }
    return render(SCRIPT + ".j2", **repro_values(checked, target=target))
