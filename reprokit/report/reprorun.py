"""How reprokit runs an archive's repro.py so that its exit status means what repro.py says:
1 only after it ran both engines and saw the divergence. Python itself exits 1 for a file that
does not compile (an edited copy with a SyntaxError) or an exception raised outside repro.py's
``main``; run through :func:`repro_argv` those are 70 (INTERNAL), never "reproduces" (issue 36).
Must not import or execute the archive's code in reprokit's own process.
"""

from __future__ import annotations

import sys

INTERNAL = 70

# Runs in the child interpreter: compile first (a SyntaxError is 70), then the script as
# __main__; its sys.exit codes pass through, anything else it raises is 70.
_LAUNCH = """
import runpy, sys, traceback
path = sys.argv[1]
try:
    with open(path, encoding="utf-8") as handle:
        compile(handle.read(), path, "exec")
except (OSError, SyntaxError, ValueError) as exc:
    print(f"INTERNAL ERROR: {path} cannot be run: {exc.__class__.__name__}: {exc}")
    sys.exit(70)
sys.argv = sys.argv[1:]
try:
    runpy.run_path(path, run_name="__main__")
except SystemExit:
    raise
except BaseException:
    traceback.print_exc()
    print(f"INTERNAL ERROR: {path} raised outside its main(): nothing was judged")
    sys.exit(70)
"""


def repro_argv(script: str = "repro.py", *args: str) -> list[str]:
    """The command that runs ``script`` (relative to the archive folder) with this interpreter."""
    return [sys.executable, "-c", _LAUNCH, script, *args]
