"""``reprokit matrix clean``: remove the environments ``verify --versions`` cached, and say how
many bytes that freed.

Only what ``envs`` built is removed: a folder named by an environment key (20 hex digits) that
holds the completion marker, or an incomplete build beside its ``.lock`` (the empty locks stay, so
a build waiting on one never races a new one). Anything
else in the cache folder (``REPROKIT_ENV_CACHE`` may point anywhere) is left alone and named. An
environment being built or used by a running cell right now (its lock held, exclusively by a
builder, shared by cells) is skipped.

Environments hold copies of uv's cached files (``envs`` installs with ``--link-mode copy``);
one built before that may hold hard links into uv's cache, so the bytes are counted per inode,
freed only when every link of it was removed, and the rest is reported as still held by uv's
cache (``uv cache clean`` frees that). Standard library only.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
from dataclasses import dataclass, field

from reprokit.matrix.envs import MARKER, cache_root

_KEY = re.compile(r"[0-9a-f]{20}")


@dataclass
class CleanResult:
    root: str
    removed: list[str] = field(default_factory=list)  # environment keys
    busy: list[str] = field(default_factory=list)  # being built or used by a cell now: kept
    left: list[str] = field(default_factory=list)  # not reprokit's: never touched
    freed_bytes: int = 0  # disk space given back (blocks of inodes whose every link was removed)
    linked_bytes: int = 0  # removed links whose data another link (uv's cache) still holds

    def to_json(self) -> dict:
        return {"schema": "reprokit.matrix-clean/1", **self.__dict__}


def clean_envs(*, dry_run: bool = False, root: str | None = None) -> CleanResult:
    root = root or cache_root()
    result = CleanResult(root)
    if not os.path.isdir(root):
        return result
    names = sorted(os.listdir(root))
    ours = {key for key in (n.removesuffix(".lock") for n in names) if _is_env(root, key)}
    result.left = [n for n in names if n.removesuffix(".lock") not in ours]
    inodes: dict[tuple[int, int], list[int]] = {}  # (dev, ino) -> [links seen here, st_nlink, bytes]
    for key in sorted(ours):
        folder, lock_path = os.path.join(root, key), os.path.join(root, key + ".lock")
        if dry_run and not os.path.exists(lock_path):  # a dry run creates nothing, not even a lock
            if not os.path.isdir(folder):
                continue
            _count(folder, inodes)
            result.removed.append(key)
            continue
        with open(lock_path, "a") as lock:  # "a": never truncates; creates a lock an old build lacked
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                result.busy.append(key)
                continue
            if not os.path.isdir(folder):
                continue  # a lock alone: kept (0 bytes), so a builder waiting on it and a new one share it
            _count(folder, inodes)
            if not dry_run:
                shutil.rmtree(folder, ignore_errors=True)  # under the lock: no cell is building it
        result.removed.append(key)
    for seen, links, size in inodes.values():
        if seen >= links:
            result.freed_bytes += size
        else:
            result.linked_bytes += size
    return result


def _is_env(root: str, key: str) -> bool:
    """A folder (or a lock) that ``envs`` made: a key name, and a marker or a lock beside it."""
    folder = os.path.join(root, key)
    if not _KEY.fullmatch(key) or (os.path.exists(folder) and not os.path.isdir(folder)):
        return False
    return os.path.exists(os.path.join(folder, MARKER)) or os.path.isfile(folder + ".lock")


def _count(folder: str, inodes: dict) -> None:
    """Each file's inode once per link found here (a link is a directory entry, so the walk sees
    every link inside the removed folders)."""
    for top, dirs, files in os.walk(folder):
        for name in dirs + files:
            try:
                info = os.lstat(os.path.join(top, name))
            except OSError:
                continue
            if name in dirs and not os.path.islink(os.path.join(top, name)):
                size_links = 1  # a directory's own blocks: freed with it
            else:
                size_links = info.st_nlink
            entry = inodes.setdefault((info.st_dev, info.st_ino), [0, size_links, info.st_blocks * 512])
            entry[0] += 1
