"""The report archive's ``logs/``: polygraphy's own runs on the bundled model (inspect, run on
onnxruntime; on TensorRT the comparison), each in a process of its own with a timeout, and the
target engine's log. On CPU engines polygraphy's runs go at once, beside repro.py (each is
mostly its own start); on a GPU one at a time. Changes no verdict; runs nothing of an archive.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from dataclasses import dataclass

from reprokit.engine.backends import backend_class
from reprokit.report.reprorun import Started
from reprokit.report.twincommands import reference_run, target_run


def _polygraphy() -> list[str] | None:
    beside = os.path.join(os.path.dirname(sys.executable), "polygraphy")
    found = beside if os.path.exists(beside) else shutil.which("polygraphy")
    return [found] if found else None


def write_logs(stage, result, spec, values, event, together: bool = False) -> None:
    """polygraphy's logs; ``together``: its runs at once (CPU engines: each is mostly its own start)."""
    finish_logs(start_logs(stage, result, spec, values, event, together))


@dataclass
class Logs:
    """polygraphy's runs for ``logs/``, started (together) or done (one at a time)."""

    stage: str
    result: object
    spec: object
    runs: dict  # file -> polygraphy's arguments
    done: dict  # file -> Started, a CompletedProcess, or the words written instead


def start_logs(stage, result, spec, values, event, together: bool = False) -> Logs:
    """Start polygraphy's runs on the bundled model (``together``: all at once, left running
    while the caller writes the rest of the archive; else one at a time, each waited for).
    Needs model.onnx and inputs.json in ``stage``; :func:`finish_logs` writes the logs."""
    tool = _polygraphy()
    runs = {
        "polygraphy_inspect_model.log": ["inspect", "model", "model.onnx", "--show", "layers"],
        "polygraphy_run_onnxrt.log": ["run", "model.onnx", "--onnxrt", "--load-inputs", "inputs.json"],
    }

    saved = os.path.join(os.path.dirname(stage), "twin_reference_outputs.json")  # beside the archive's folder
    if values.get("twin"):  # the fp32 cut's outputs, which the converted cut's TensorRT run compares against
        runs["polygraphy_run_onnxrt.log"] = reference_run(saved)
    if spec.engine == "trt" and backend_class("trt").probe().available:
        runs["polygraphy_run_trt_vs_onnxrt.log"] = (target_run(spec, result.verdict, saved) if values.get("twin")
                                                    else shlex.split(values["polygraphy_command"])[1:])
    logs = Logs(stage, result, spec, runs, {})
    try:
        _start_logs(runs, tool, stage, logs.done, event, together)
    except BaseException:
        stop_logs(logs)
        raise
    return logs


def stop_logs(logs: Logs) -> None:
    """Kill what still runs (an error or an interrupt while the archive was written): no orphan."""
    for run in logs.done.values():
        if isinstance(run, Started):
            run.stop()


def finish_logs(logs: Logs) -> None:
    """Wait for polygraphy's runs and write logs/ (and the target engine's log)."""
    folder = os.path.join(logs.stage, "logs")
    try:
        for file, args in logs.runs.items():
            run = logs.done[file].result() if isinstance(logs.done[file], Started) else logs.done[file]
            with open(os.path.join(folder, file), "w") as handle:
                handle.write(run if isinstance(run, str) else f"$ polygraphy {shlex.join(args)}\n{run.stdout}"
                             f"{run.stderr}\n[exit code {run.returncode}]\n")
    finally:
        stop_logs(logs)
    result, spec = logs.result, logs.spec
    with open(os.path.join(folder, f"target_{spec.engine}.log"), "w") as handle:
        handle.write(f"target {result.verdict.target}; engine settings: {json.dumps(result.verdict.target_meta, default=str)}\n")
        handle.write(result.target_log or "(the engine printed nothing)\n")


def _start_logs(runs: dict, tool, stage: str, done: dict, event, together: bool) -> None:
    for file, args in runs.items():
        if tool is None:
            done[file] = "polygraphy is not installed here: pip install polygraphy\n"
        elif "inputs.json" in args and not os.path.exists(os.path.join(stage, "inputs.json")):
            done[file] = ("not run: the feeds hold strings, sequences or optionals, which polygraphy cannot load "
                          "(they are in inputs.npz)\n")
        else:
            event(f"logs/{file}: polygraphy {' '.join(args[:2])}")
            done[file] = Started(tool + args, stage, os.path.dirname(stage), timeout=300.0)
            if not together:
                done[file] = done[file].result()
