"""The ReprokitError hierarchy: a message, a hint and a documented exit code.

Library code raises these; only ``cli.py`` turns them into ``Error:``/``Hint:`` lines and
exit codes. Nothing here prints.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """Exit codes, documented per command in docs/exit-codes.md."""

    OK = 0  # check: outputs agree; other commands: success
    DIVERGES = 1  # check/verify: the target diverges from the reference (reproduces)
    USAGE = 2  # bad command line: unknown option, malformed target spec or shape
    INPUT = 3  # bad user input: unreadable model, wrong input names/shapes/dtypes
    ENVIRONMENT = 4  # an engine or tool is missing or unusable on this machine
    REFERENCE = 5  # the reference itself fails or is non-finite: nothing to compare against
    NOTHING_TO_REDUCE = 6  # shrink: the original does not diverge (or is flaky)
    NOT_REPRODUCED = 7  # shrink: the reduced model does not reproduce when judged alone
    NOTHING_REMOVED = 8  # shrink: the run removed no node and did not prove every node needed
    NO_ANSWER = 9  # verify --versions: no release could run, or --bisect judged fewer than two
    ARCHIVE_NOT_REPRODUCED = 10  # shrink/pack: the archive was written, its repro.py did not reproduce here
    MEMORY_BOUND = 11  # an engine process ran out of its memory bound (engine/memorybound.py): no verdict
    DIVERGES_DIFFERENTLY = 12  # verify: it fails here, but not as recorded (another kind or message)
    INTERRUPTED = 130  # Ctrl-C / SIGTERM; best-so-far results are kept on disk
    INTERNAL = 70  # a bug in reprokit: rerun with --debug and report it


class ReprokitError(Exception):
    """A failure the user can act on; ``hint`` says how."""

    exit_code: ExitCode = ExitCode.INPUT
    details: dict | None = None  # plain data for --json's error object (reprokit.error/1 "details")

    def __init__(self, message: str, hint: str | None = None, *, exit_code: ExitCode | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(ReprokitError):
    """The command line itself is wrong (spec grammar, option values)."""

    exit_code = ExitCode.USAGE


class InputError(ReprokitError):
    """A file or value the user gave cannot be used (model, feeds, shapes)."""

    exit_code = ExitCode.INPUT


class EngineUnavailable(ReprokitError):
    """An engine, library or GPU capability this run needs is not available here."""

    exit_code = ExitCode.ENVIRONMENT


class ReferenceFailure(ReprokitError):
    """The reference engine fails or produces non-finite values on the model."""

    exit_code = ExitCode.REFERENCE


class NothingToReduce(ReprokitError):
    """shrink was asked to reduce a model that does not diverge."""

    exit_code = ExitCode.NOTHING_TO_REDUCE


class NothingRemoved(ReprokitError):
    """shrink confirmed the bug but removed no node (the budget ran out, or no smaller candidate
    showed the bug) without proving every node needed: not a minimal repro."""

    exit_code = ExitCode.NOTHING_REMOVED


class NotReproduced(ReprokitError):
    """shrink reduced the model, but the result does not show the divergence when judged alone
    (a flaky target, or a packed verdict the model alone does not confirm)."""

    exit_code = ExitCode.NOT_REPRODUCED


class ArchiveNotReproduced(ReprokitError):
    """shrink/pack wrote the archive, but its own repro.py, run here, did not show the divergence:
    the deliverable is not a repro (a shrink's minimal.onnx and summary.json stand). ``details``:
    the command's --json object (reprokit.pack/1, or shrink's summary)."""

    exit_code = ExitCode.ARCHIVE_NOT_REPRODUCED

    def __init__(self, archive: str, details: dict | None = None, *, stands: str = ""):
        super().__init__(f"{archive} was written, but its repro.py did not reproduce the divergence here",
                         hint=f"see logs/repro.log in {archive} (what repro.py printed, its exit code)"
                              + (f"; {stands} stand" if stands else "")
                              + "; the check may depend on something outside the model (a flaky engine, a file, "
                                "the machine): the archive is no repro until its repro.py shows the bug")
        self.details = details


class EngineOutOfMemory(ReprokitError):
    """An engine process ran out of the memory bound reprokit gives it: the model asks for more
    than one engine process may take here, so there is no verdict (not a divergence, not a pass)."""

    exit_code = ExitCode.MEMORY_BOUND


class MatrixNoAnswer(ReprokitError):
    """``verify --versions`` ran, but the table answers nothing: no cell could run (no archive is
    written), or ``--bisect`` judged fewer than two releases (the archive holds what ran).
    ``result`` is the matrix as far as it went, for the table the CLI still prints."""

    exit_code = ExitCode.NO_ANSWER

    def __init__(self, message: str, hint: str | None = None, *, result=None):
        super().__init__(message, hint)
        self.result = result
