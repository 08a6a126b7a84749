"""One function run in a thread of its own while the caller goes on: its result (or what it
raised) as a ``concurrent.futures.Future``. For work that waits on an engine worker or writes a
file beside another engine run (the fold's reference check, pack's early conversion).
Owns no process: what a function starts, it stops.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor


def in_background(name: str, function, /, *args, **kwargs) -> Future:
    """``function(*args, **kwargs)`` started now in a thread named ``reprokit-<name>``."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"reprokit-{name}")
    try:
        return pool.submit(function, *args, **kwargs)
    finally:
        pool.shutdown(wait=False)  # the thread ends with the function; nothing else is queued
