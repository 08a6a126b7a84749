"""Command line: click commands and option parsing, by concern — ``app.py`` (the group, its
entry point and the ONE place errors become ``Error:``/``Hint:`` lines and exit codes),
``options.py`` (shared options and what a command may write), ``commands.py`` (check, pack,
audit, verify, env, matrix clean, backends),
``shrink.py``. Holds no logic.
"""

from __future__ import annotations

import json
import os
import signal
import sys


def _early_interrupt(signum, frame):  # until main() installs the real handlers
    if "--json" in sys.argv[1:]:  # scripts read stdout: one object, whatever failed (as app.fail)
        said = {
            "schema": "reprokit.error/1",
            "error": "interrupted",
            "hint": "nothing was started yet",
            "exit_code": 130,
        }
        os.write(1, (json.dumps(said, indent=2) + "\n").encode())
    os.write(2, b"Error: interrupted\nHint: nothing was started yet\n")
    os._exit(130)


# Installed before the heavier imports below, so Ctrl-C or SIGTERM during start-up still ends
# with the documented exit code and no traceback (hence pyproject's E402 exception for this file).
signal.signal(signal.SIGINT, _early_interrupt)
signal.signal(signal.SIGTERM, _early_interrupt)

from reprokit.cli import commands, shrink  # noqa: F401  (defining them adds them to ``cli``)
from reprokit.cli.app import cli, main

__all__ = ["cli", "main"]

if __name__ == "__main__":
    main()
