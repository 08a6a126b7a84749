"""External check command, like polygraphy's ``--check``.

``{model}``, ``{inputs}`` (an .npz of the feeds) and ``{outputs}`` (an .npz path the command may
write for a numeric comparison) are substituted into each argument. Which runs fail is
polygraphy's rule (``reprokit.standalone.checkpolicy``: exit status, ``--fail-code``, ``--ignore-fail-code``,
``--fail-regex``); a non-zero exit that is not a failure by that rule is reported as a different
finding instead of passing silently. Death by a signal is a crash.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile

from reprokit.engine.backends.base import Availability, Backend, BuildError, RunResult
from reprokit.errors import EngineUnavailable, InputError, ReprokitError, UsageError
from reprokit.spec import OptionDoc, TargetSpec
from reprokit.standalone.arrays import load_npz, save_npz
from reprokit.standalone.checkpolicy import FAIL, OTHER, CheckPolicy, missing_module
from reprokit.standalone.compare import DEFAULT_TOLERANCE

# What a check command may declare it runs at: the keys of the default tolerance table.
PRECISIONS = tuple(DEFAULT_TOLERANCE)

_TAIL_BYTES = 16_384


class CommandTimeout(ReprokitError):
    """The check command gave no answer within the call's timeout; its process group was killed."""


def call(argv: list[str], out, err) -> int:
    """Run the check command to its end (inside a worker process, whose process group the parent
    kills at the timeout): its exit code."""
    return subprocess.call(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL)


class CommandCrash(ReprokitError):
    """The check command died by a signal; the worker reports it as a crash verdict."""

    def __init__(self, message: str, signal_name: str):
        super().__init__(message)
        self.signal_name = signal_name


def command_argv(command: str, **paths: str) -> list[str]:
    """Split the command like a shell would and substitute the placeholders."""
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise UsageError(f"cannot parse the check command: {exc}", hint="check its quoting") from exc
    if not argv:
        raise UsageError("the check command is empty", hint="--target 'cmd:python check.py {model}'")
    return [_substitute(token, paths) for token in argv]


def _substitute(token: str, paths: dict[str, str]) -> str:
    for key, value in paths.items():
        token = token.replace("{" + key + "}", value)
    return token


def read_output(stdout_path: str, stderr_path: str, policy) -> tuple[str | None, str]:
    """(the line where a --fail-regex matched or None, the tail of stdout + stderr). The regexes
    are searched over the whole output, stdout then stderr, as polygraphy does (a match may span
    lines); without regexes only the tails are read, so a huge log costs no memory."""
    match = None
    if policy.regexes:
        with open(stdout_path, "rb") as out, open(stderr_path, "rb") as err:
            match = policy.first_match(out.read().decode("utf-8", "replace") + err.read().decode("utf-8", "replace"))
    tail = _tail(stdout_path) + _tail(stderr_path)
    if len(tail) > _TAIL_BYTES and "\n" in tail[-_TAIL_BYTES:]:
        tail = tail[-_TAIL_BYTES:].split("\n", 1)[1]  # quote whole lines only
    return match, tail


def _tail(path: str) -> str:
    with open(path, "rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        handle.seek(max(0, size - _TAIL_BYTES))
        text = handle.read().decode("utf-8", "replace")
    if size > _TAIL_BYTES and "\n" in text:
        text = text.split("\n", 1)[1]  # the first line starts mid-line: quote whole lines only
    return text


# A path-like argument that names a script: checked for existence before any run.
_SCRIPT = re.compile(r"[^\s=:;|&<>'\"-][^\s=;|&<>'\"]*\.(?:py|sh|bash)")


def _raise_if_script_missing(argv: list[str], log: str) -> None:
    """The interpreter's own "can't open file" about one of the command's arguments means the
    check never ran: an environment error (exit 4), never a build-error verdict."""
    for match in re.finditer(r"can't open file '([^']+)'", log):
        missing = os.path.abspath(match.group(1))
        if any(os.path.abspath(token) == missing for token in argv[1:]):
            raise EngineUnavailable(
                f"the check command could not open its script {match.group(1)!r}",
                hint="fix the path in --target 'cmd:...'; relative paths are read from the current directory",
            )


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def said_and_rest(headline: str, said: str, tail: str) -> str:
    """``headline: said`` and below it the command's output, without repeating ``said`` when it
    is the output's last line (it was shown twice: once quoted, once in the log)."""
    lines = tail.rstrip().splitlines()
    if lines and lines[-1].strip() == said:
        lines.pop()
    rest = "\n".join(lines).strip("\n")
    return f"{headline}: {said}" + (f"\n{rest}" if rest.strip() else "")


class CmdBackend(Backend):
    engine = "cmd"
    summary = "an external check command; {model} {inputs} {outputs} are substituted"
    OPTIONS = {
        "precision": OptionDoc(
            "the precision the command's engine runs at, one of " + ", ".join(PRECISIONS)
            + ": sets the default tolerance (cmd:precision=fp16:COMMAND; default fp32)", "str"),
    }
    install_hint = "the command itself must be installed and on PATH"
    marking_changes_engine = True  # unknown engine: assume the worst

    def __init__(self, spec: TargetSpec, policy: CheckPolicy | None = None, launch=call):
        super().__init__(spec)
        self.policy = policy or CheckPolicy()
        # launch(argv, stdout, stderr) -> exit code: ``call`` inside a worker process; the worker's
        # own launcher where the call runs in reprokit's process (engine/worker.py, issue 39)
        self.launch = launch

    @classmethod
    def validate(cls, spec: TargetSpec) -> None:
        precision = spec.get("precision", "fp32")
        if precision not in PRECISIONS:
            raise UsageError(f"cmd precision {precision!r} is none of {', '.join(PRECISIONS)}",
                             hint="e.g. --target 'cmd:precision=fp16:python my_check.py {model} {inputs} {outputs}'")
        argv = command_argv(spec.command or "", model="m", inputs="i", outputs="o")
        if shutil.which(argv[0]) is None and not os.path.exists(argv[0]):
            raise EngineUnavailable(
                f"check command not found: {argv[0]!r}",
                hint="give the full path or install it; the command is run without a shell",
            )
        # A check that cannot start is missing here, not a divergence of the model.
        for token in argv[1:]:
            if _SCRIPT.fullmatch(token) and not os.path.exists(token):
                raise EngineUnavailable(
                    f"the check command's script does not exist: {token!r} (from {os.getcwd()})",
                    hint="fix the path in --target 'cmd:...'; relative paths are read from the current directory",
                )

    def precision(self) -> str:
        return str(self.spec.get("precision", "fp32"))

    @classmethod
    def probe(cls) -> Availability:
        return Availability(True, None, "always available: runs the command you give")

    def run(self, model_path, feeds, output_names):
        with tempfile.TemporaryDirectory(prefix="reprokit-cmd-") as tmp:
            inputs_path = os.path.join(tmp, "inputs.npz")
            outputs_path = os.path.join(tmp, "outputs.npz")
            stdout_path, stderr_path = os.path.join(tmp, "stdout.log"), os.path.join(tmp, "stderr.log")
            if "{inputs}" in self.spec.command:  # a pack's feeds can be hundreds of MB: written only when read
                save_npz(inputs_path, feeds)
            argv = command_argv(
                self.spec.command, model=model_path, inputs=inputs_path, outputs=outputs_path
            )
            try:
                with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
                    code = self.launch(argv, out, err)
            except FileNotFoundError as exc:
                raise EngineUnavailable(
                    f"check command not found: {argv[0]!r}", hint="give the full path or install it"
                ) from exc
            except PermissionError as exc:
                raise EngineUnavailable(
                    f"check command is not executable: {argv[0]!r}", hint="chmod +x it, or prefix an interpreter"
                ) from exc
            match, tail = read_output(stdout_path, stderr_path, self.policy)
            meta = {"argv": argv, "exit_code": code}
            if code < 0:
                name = signal.Signals(-code).name
                raise CommandCrash(f"check command killed by {name}\n{tail}", name)
            if code != 0:
                _raise_if_script_missing(argv, tail)
                missing = missing_module(tail) if match is None else None
                if missing:  # the check never ran: an environment error, not a verdict
                    raise EngineUnavailable(
                        f"the check command could not import {missing!r} here (ModuleNotFoundError): it "
                        "never checked the model",
                        hint=f"install {missing} for the Python the check runs with, or name that Python "
                        "in --target 'cmd:/path/to/python ...'",
                    )
            verdict, detail = self.policy.decide(code, match is not None)
            if verdict == FAIL:
                # The class of the failure (exit status, or the regexes that matched) is its
                # signature: a checker's words vary with the candidate (which node it saw) and
                # are kept for the report only.
                how = f" matching {self.policy.label()}" if match is not None else ""
                said = match if match is not None else last_line(tail)
                raise BuildError(said_and_rest(f"check command failed (exit code {code}){how}", said, tail),
                                 detail=detail)
            if verdict == OTHER:  # its own words are its signature: two such failures, two findings
                raise BuildError(said_and_rest(f"check command exited {code}, a different finding ({detail})",
                                               last_line(tail), tail))
            outputs = {}
            if os.path.exists(outputs_path):
                try:
                    outputs = load_npz(outputs_path)
                except Exception as exc:  # not a zip, a truncated member, an object array
                    raise InputError(
                        f"the check command wrote {{outputs}} as something reprokit cannot read: "
                        f"{exc.__class__.__name__}: {str(exc)[:200]}",
                        hint="write plain numeric arrays: np.savez(sys.argv[N], name=array, ...)",
                    ) from exc
                if output_names:
                    outputs = {k: v for k, v in outputs.items() if k in output_names}
            meta["wrote_outputs"] = bool(outputs)
            return RunResult(outputs=outputs, meta=meta, log=tail)
