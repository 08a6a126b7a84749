"""The ``reprokit`` group and its entry point: ``--debug``/``--verbose``, the engines' log
lines, the outputs a command is writing (said on an interruption or a full disk), and the ONE
place where errors become ``Error:``/``Hint:`` lines (and a ``reprokit.error/1`` object under
``--json``) and documented exit codes (docs/exit-codes.md). Holds no logic.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback

import click

from reprokit import __version__, terminal
from reprokit.cli.progress import Ticker
from reprokit.console import (
    err,
)
from reprokit.engine import enginelog, threadlimit
from reprokit.errors import ExitCode, ReprokitError
from reprokit.files import STALE
from reprokit.graph.dims import say_in_error

_DEBUG = False


_JSON = False  # --json: failures also print a reprokit.error/1 object on stdout


_OUT: str | None = None  # the command's -o: a full disk names it when the failed write named no file


def writing(path: str) -> None:
    global _OUT
    _OUT = path
    while STALE:  # a crashed run's lock, taken over by this command (files.hold)
        err.print(f"[dim]{STALE.pop(0)}[/]")
    if os.path.isdir(path):
        _OUT_DIRS.append(path)  # what an interrupt left there is said from it (interrupted_hint)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="reprokit")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors, and the engines' own log lines.")
@click.option("--verbose", "-v", is_flag=True,
              help="Show the engines' own log lines (onnxruntime, OpenVINO, TensorRT); always in OUT/engine.log.")
def cli(debug, verbose):
    """Find, shrink and package divergences of an inference engine from an ONNX reference."""
    global _DEBUG
    _DEBUG = _DEBUG or debug
    if _DEBUG or verbose:
        _show_engine_logs()


def _show_engine_logs() -> None:
    from rich.text import Text

    def echo(label: str, text: str) -> None:
        err.print(f"[dim]engine log: {label}[/]")
        err.print(Text(text, style="dim"))

    enginelog.set_echo(echo)


def engine_log(out_dir: str | None, *, fresh: bool = True) -> None:
    """The engines' own messages of this run go to OUT/engine.log (reprokit/enginelog.py)."""
    enginelog.set_log(os.path.join(out_dir, "engine.log") if out_dir else None, fresh=fresh)


# Output folders this command made or writes into: what an interruption leaves is said from them.
_OUT_DIRS: list[str] = []


_STARTED = time.time()  # files changed since are this command's


def interrupted_hint() -> str:
    """Say what an interruption left on disk: the files it wrote, or that nothing was written."""
    written = []
    for folder in dict.fromkeys(_OUT_DIRS):
        for root, dirs, files in os.walk(folder):
            dirs[:] = [d for d in dirs if not d.startswith(".")]  # work state, not results
            written += [path for path in (os.path.join(root, name) for name in files)
                        if _written_since_start(path)]  # a user's own file there is no result of ours
    if not written:
        return "nothing was written; run the command again"
    shown = ", ".join(sorted(written)[:4]) + (f" and {len(written) - 4} more" if len(written) > 4 else "")
    return f"files written so far are kept: {shown}"


def _written_since_start(path: str) -> bool:
    try:
        return os.stat(path).st_mtime >= _STARTED
    except OSError:
        return False


_SIGNALLED = False  # Ctrl-C or SIGTERM came: whatever error follows is the interrupt's doing


def _raise_interrupt(signum, frame):
    global _SIGNALLED
    _SIGNALLED = True
    raise KeyboardInterrupt


def _interrupt_shown_as(exc: BaseException) -> bool:
    """An interrupt that surfaced as another error: a KeyboardInterrupt inside an extension
    module's initialisation (onnxruntime, OpenVINO) comes out as "ImportError: initialization
    failed", or as the engine-unavailable error that import failure is turned into."""
    return _SIGNALLED and getattr(exc, "exit_code", None) != ExitCode.INTERRUPTED


# A multi-line reason (an engine's or the OS's own words) is kept, but not without bound.
_MORE_LINES = 20


def fail(message: str, hint: str | None, code: int, details: dict | None = None) -> None:
    # the outcome is decided: a second Ctrl-C must not cut the Error:/Hint: lines or change the code
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    Ticker.close_all()  # no "still at it" line after the Error: line
    # an engine's words may quote a stranger's model (names, op domains): no escape sequence of
    # theirs reaches the terminal, shown as \x1b instead
    message, hint = _printable(message), _printable(hint) if hint else hint
    lines = [line.rstrip() for line in message.strip().splitlines() if line.strip()] or [message]
    first, rest = lines[0], lines[1:]
    if len(rest) > _MORE_LINES:
        rest = [*rest[:_MORE_LINES], f"… {len(rest) - _MORE_LINES} more lines (--debug shows the traceback)"]
    if _JSON:  # scripts read stdout: one object, whatever failed
        extra = {"details": details} if details else {}  # e.g. verify --versions' table as far as it went
        click.echo(json.dumps({"schema": "reprokit.error/1", "error": "\n".join([first, *rest]), "hint": hint,
                               "exit_code": int(code), **extra}, indent=2, default=str))
    # First line on Error: (what scripts grep), the rest indented below it: still one Error: line.
    click.echo(f"Error: {first}", err=True)
    for line in rest:
        click.echo(f"  {line.strip()}", err=True)
    if hint:
        click.echo(f"Hint: {hint}", err=True)
    if code == ExitCode.INTERRUPTED:
        _exit_within(_EXIT_GRACE_S, int(code))
    sys.exit(int(code))


_EXIT_GRACE_S = 15.0


def _printable(text: str) -> str:
    import re

    return re.sub(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]", lambda m: repr(m.group())[1:-1], str(text))


def _exit_within(seconds: float, code: int) -> None:
    """An interrupted run ends within ``seconds`` whatever the interpreter's shutdown meets: a
    burst of Ctrl-Cs can cut a thread pool's shutdown half-way (verify --versions under load:
    an idle pool worker never told to stop, the main thread joining it at exit for ever). The
    exit handlers (temporary folders) get their chance first; a daemon thread still runs while
    the interpreter waits on the others, and ends the process with the same code."""
    import threading

    def watchdog():
        time.sleep(seconds)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    threading.Thread(target=watchdog, name="reprokit-exit-watchdog", daemon=True).start()


def _no_thread(exc: BaseException) -> None:
    """reprokit's own thread or process could not start (EAGAIN): exit 4, naming the task limit
    that refused it, or saying that none is near (then it is memory: a data limit it runs under)."""
    limit = threadlimit.near_limit()
    if limit is None:
        fail(f"reprokit could not start a thread or process ({exc}); no thread or process limit is near its use "
             "here", "the memory limit reprokit was started under (ulimit -d, a container's) may be what refused "
             "the thread's stack: raise it, or run fewer processes at once", ExitCode.ENVIRONMENT)
    fail(f"reprokit could not start a thread or process: {limit} ({exc})", threadlimit.HINT, ExitCode.ENVIRONMENT)


def main(argv=None) -> None:
    """Entry point: run the CLI and turn every failure into its exit code. As the console script
    (``argv`` None) the process then ends at once (``_leave``); called with ``argv`` (a library
    user, a test) it returns or raises SystemExit as before."""
    if argv is None:
        terminal.outlive_closed_pipes()  # `reprokit check ... | head -1` keeps the verdict's exit code
    try:
        _main(argv)
    except SystemExit as exc:
        if argv is None and (exc.code is None or isinstance(exc.code, int)):
            _leave(exc.code or 0)
        raise
    if argv is None:
        _leave(0)


def _leave(code: int) -> None:
    """End the process now that everything it writes is written: the exit handlers run (locks
    released, temporary folders removed, logs flushed) and both streams are flushed, then
    ``os._exit`` skips the interpreter's teardown — freeing onnx's and onnxruntime's modules,
    0.1-0.3 s on a loaded 2-core machine, which came after summary.json's ``wall_s`` was written
    and so was counted by nobody (issue 39). A non-daemon thread still alive, or a stream that
    cannot be flushed (a closed pipe), gets the ordinary exit: its work and its exit status are
    the interpreter's to settle, as before; so does a process a profiler or coverage tool watches
    (``python -m cProfile -m reprokit``, ``coverage run``: they write their results at its end)."""
    import atexit
    import threading

    if _watched() or any(t.is_alive() and not t.daemon for t in threading.enumerate()
                         if t is not threading.main_thread()):
        sys.exit(code)
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        sys.exit(code)
    os._exit(code)


def _watched() -> bool:
    """A profiler, tracer or (Python 3.12+) monitoring tool is attached to this process."""
    if sys.getprofile() is not None or sys.gettrace() is not None:
        return True
    monitoring = getattr(sys, "monitoring", None)
    return monitoring is not None and any(monitoring.get_tool(tool) for tool in range(6))


def _main(argv) -> None:
    import errno

    global _DEBUG, _JSON
    args = list(sys.argv[1:] if argv is None else argv)
    _DEBUG = "--debug" in args or os.environ.get("REPROKIT_DEBUG") == "1"
    _JSON = "--json" in args
    # SIGTERM ends every command like Ctrl-C: workers are killed, best-so-far results kept.
    signal.signal(signal.SIGINT, _raise_interrupt)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        cli.main(args=args, prog_name="reprokit", standalone_mode=False)
        if _SIGNALLED:  # an interrupt some library swallowed (an extension's import turned it into an
            # ImportError a fingerprint took for "not installed"): still an interrupt, never exit 0
            fail("interrupted", interrupted_hint(), ExitCode.INTERRUPTED)
    except SystemExit:
        raise
    except ReprokitError as exc:
        if _DEBUG:
            traceback.print_exc()
        if _interrupt_shown_as(exc):
            fail("interrupted", interrupted_hint(), ExitCode.INTERRUPTED)

        say_in_error(exc)  # sizes reprokit chose for dynamic dims are named in every outcome
        fail(exc.message, exc.hint, exc.exit_code, exc.details)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
        sys.exit(0)
    except click.UsageError as exc:
        command = exc.ctx.command_path if exc.ctx else "reprokit"
        fail(exc.format_message(), f"see '{command} --help'", ExitCode.USAGE)
    except (click.exceptions.Abort, KeyboardInterrupt) as exc:
        if isinstance(exc, click.exceptions.Abort) and isinstance(exc.__context__, EOFError):
            fail(f"unexpected end of input: {exc.__context__}", "a file ended early; check it", ExitCode.INPUT)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C while exiting: still 130, said once
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        fail("interrupted", interrupted_hint(), ExitCode.INTERRUPTED)
    except OSError as exc:
        if _interrupt_shown_as(exc):
            fail("interrupted", interrupted_hint(), ExitCode.INTERRUPTED)
        if exc.errno == errno.EAGAIN:  # fork refused (BlockingIOError): a task limit, not a bug
            _no_thread(exc)
        if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            where = f" {exc.filename or _OUT}" if exc.filename or _OUT else ""
            fail(f"cannot write{where}: {exc.strerror} (disk full or file size limit)",
                  "free disk space or write elsewhere (-o); results already written are kept",
                  ExitCode.ENVIRONMENT)
        if _DEBUG:
            traceback.print_exc()
        fail(f"internal error: {exc.__class__.__name__}: {exc}",
              "rerun with --debug and report the traceback", ExitCode.INTERNAL)
    except click.ClickException as exc:
        fail(exc.format_message(), None, exc.exit_code)
    except Exception as exc:  # a bug: say so plainly, traceback only with --debug
        if _DEBUG:
            traceback.print_exc()
        if _interrupt_shown_as(exc):
            fail("interrupted", interrupted_hint(), ExitCode.INTERRUPTED)
        if isinstance(exc, RuntimeError) and threadlimit.said_refused(str(exc)):  # can't start new thread
            _no_thread(exc)
        fail(f"internal error: {exc.__class__.__name__}: {exc}",
              "rerun with --debug and report the traceback", ExitCode.INTERNAL)
