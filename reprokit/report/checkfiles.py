"""A ``cmd:`` target's own files in the archive: the small text files its check command names
under the working directory (scripts, configs) are copied into ``check/`` and the command is
pointed at the copies; the files it names that the archive cannot carry are listed, and
ISSUE.md says which is which (``check_note``).

Must not run the check command or read a file it names beyond the first bytes that tell text
from binary (a file past 1 MiB is never read).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil

from reprokit.spec import TargetSpec

__all__ = ["CHECK_DIR", "bundle_check_files", "check_note"]


CHECK_DIR = "check"  # where a cmd target's own script goes in the archive
_MAX_CHECK_FILE = 1 << 20


def bundle_check_files(stage: str, spec):
    """cmd targets: copy the files the check command names that live under the working
    directory (small text files: scripts, configs) into check/ and point the command at the
    copies; list the other files it names, which the archive cannot carry. Returns (spec with
    the rewritten command, bundled paths, needed paths)."""
    if spec.engine != "cmd":
        return spec, [], []
    argv = shlex.split(spec.command)
    cwd = os.getcwd()
    bundled: list[str] = []
    needed: list[str] = []
    for index, token in enumerate(argv):
        if "{" in token or token.startswith("-") or not os.path.isfile(token):
            continue
        if index == 0 and os.sep not in token:
            continue  # a program found on PATH
        path = os.path.abspath(token)
        if os.path.commonpath([cwd, path]) == cwd and _small_text_file(path):
            rel = os.path.join(CHECK_DIR, os.path.relpath(path, cwd))
            os.makedirs(os.path.dirname(os.path.join(stage, rel)), exist_ok=True)
            shutil.copy2(path, os.path.join(stage, rel))
            argv[index] = rel
            bundled.append(rel)
        elif index > 0:  # an interpreter given by path (argv[0]) is a tool, not the check's file
            needed.append(path)

    # Not parse_target: the rewritten paths exist in the archive, not in this directory.
    return (
        TargetSpec(engine="cmd", options=spec.options, command=_shell_join(argv)),
        bundled,
        needed,
    )


def _small_text_file(path: str) -> bool:
    if os.path.getsize(path) > _MAX_CHECK_FILE:
        return False
    with open(path, "rb") as handle:
        return b"\0" not in handle.read(8192)


def _shell_join(argv: list[str]) -> str:
    """shlex.join that leaves {model} {inputs} {outputs} unquoted, for people to read."""
    return " ".join(t if re.fullmatch(r"[\w@%+=:,./{}-]+", t) else shlex.quote(t) for t in argv)


def check_note(bundled: list[str], needed: list[str]) -> str:
    parts = []
    if bundled:
        parts.append(
            "The check command's own files are bundled: "
            + ", ".join(f"`{p}`" for p in bundled)
            + "."
        )
    if needed:
        parts.append(
            "The check command also needs these files, which are NOT in this archive: "
            + ", ".join(f"`{p}`" for p in needed)
            + "; `repro.py` says so (exit 4) where they are missing."
        )
    return " ".join(parts)
