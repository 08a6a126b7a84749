"""How late is the end of an engine call seen? ``Popen.wait(timeout)`` (what
``reprokit.engine.worker._waited`` used) polls with sleeps growing to 50 ms; the worker now waits
blocking with a timer that kills the group at the timeout. A table, not a test.

    python bench/bench_call_wait.py            # 20 calls of a check that sleeps 0.3 s, each way

Each row runs the same short command N times, alternating the two ways, and prints the mean wall
seconds per call and the mean lateness (wall minus the command's own sleep).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from reprokit.engine.worker import _waited  # noqa: E402


def polled(argv: list[str], timeout: float) -> int | None:
    """The earlier way: Popen.wait with a timeout (a polling loop)."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--sleep", type=float, default=0.3)
    args = parser.parse_args(argv)
    command = [sys.executable, "-S", "-c", f"import time; time.sleep({args.sleep})"]
    ways = {"Popen.wait(timeout) (polling)": lambda: polled(command, 600.0),
            "worker._waited (blocking + timer)": lambda: _waited(command, subprocess.DEVNULL, subprocess.DEVNULL,
                                                                 dict(os.environ), 600.0)}
    seconds = {name: [] for name in ways}
    for _ in range(args.calls):
        for name, way in ways.items():
            started = time.monotonic()
            way()
            seconds[name].append(time.monotonic() - started)
    print(f"| way | calls | mean s a call | mean s past the command's {args.sleep} s sleep |")
    print("|---|---|---|---|")
    for name, values in seconds.items():
        mean = sum(values) / len(values)
        print(f"| {name} | {len(values)} | {mean:.3f} | {mean - args.sleep:.3f} |")
    print("\nThe lateness includes the interpreter's start (the same both ways); the difference between the "
          "rows is the polling's.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
