"""Command line: click commands and option parsing, by concern — ``app.py`` (the group, its
entry point and the ONE place errors become ``Error:``/``Hint:`` lines and exit codes),
``options.py`` (shared options and what a command may write), ``commands.py`` (check, pack,
audit, verify, env, matrix clean, backends),
``shrink.py``. Holds no logic.
"""

from __future__ import annotations

import os
import signal


def _early_interrupt(signum, frame):  # until main() installs the real handlers
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
