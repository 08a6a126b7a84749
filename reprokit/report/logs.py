"""The report archive's ``logs/``: polygraphy's own runs on the bundled model (inspect, run on
onnxruntime; on TensorRT the comparison), each in a process of its own with a timeout, and the
target engine's log. On CPU engines polygraphy's runs go at once, beside repro.py (each is
mostly its own start); on a GPU one at a time. Changes no verdict; runs nothing of an archive.
Its onnxruntime runs record when their engine ran (``reprorun.timed_polygraphy_argv``), so that
pack tells their engine seconds from the rest of its wait.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from dataclasses import dataclass, field

import numpy as np

from reprokit.engine.backends import backend_class
from reprokit.report.reprorun import Started, read_times, timed_polygraphy_argv
from reprokit.report.twincommands import reference_run, target_run
from reprokit.standalone.arrays import load_npz


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
    bins: dict | None = None  # inputs/*.bin written with inputs.json, when pack wrote them before its check
    feeds: dict | None = None  # the feeds inputs.json holds then (pack keeps the runs only if its check used them)
    times: list = field(default_factory=list)  # files its runs record their engine runs in
    said: list = field(default_factory=list)  # early runs' progress lines, told once the archive keeps them

    def engine_runs(self) -> list[tuple[float, float]]:
        """(start, end) epoch seconds of the engine runs its processes recorded."""
        return [run for path in self.times for run in read_times(path)]


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
        _start_logs(runs, tool, stage, logs, event, together)
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


def _start_logs(runs: dict, tool, stage: str, logs: Logs, event, together: bool) -> None:
    done = logs.done
    for file, args in runs.items():
        if tool is None:
            done[file] = "polygraphy is not installed here: pip install polygraphy\n"
        elif "inputs.json" in args and not os.path.exists(os.path.join(stage, "inputs.json")):
            done[file] = ("not run: the feeds hold strings, sequences or optionals, which polygraphy cannot load "
                          "(they are in inputs.npz)\n")
        else:
            event(f"logs/{file}: polygraphy {' '.join(args[:2])}")
            argv, times = tool + args, None
            timed = timed_polygraphy_argv(args) if "--onnxrt" in args and "--trt" not in args else None
            if timed:  # polygraphy's own entry point, its onnxruntime runs timed (its output unchanged)
                argv, times = timed, os.path.join(os.path.dirname(stage), f".engine-times-{file}")
                logs.times.append(times)
            done[file] = Started(argv, stage, os.path.dirname(stage), timeout=300.0, times=times)
            if not together:
                done[file] = done[file].result()


def early_logs(model_path: str, options, spec, stage: str, event) -> Logs | None:
    """polygraphy's runs started before pack's check, on a copy of the model file and the feeds
    file as given: they need neither the verdict nor the check's files, so on CPU engines they
    run while the check's engines do (a Swin window: their 2-3 s of interpreter, imports and
    loading leave the end of the archive step). None where they could not be the archive's runs
    (a GPU or a check command: one process at a time; a converted cut, frozen shapes, feeds other
    than one .npz sample of plain numbers); :func:`early_kept` drops them after the check
    unless it ran this very file on these very feeds."""
    if (spec.engine in ("trt", "cmd") or spec.has("cuda") or options.reference_model or options.input_shapes
            or not options.inputs or not str(options.inputs).endswith(".npz") or not os.path.isfile(options.inputs)
            or os.path.getsize(model_path) >= 2**31):  # past protobuf's 2 GB the archive saves it another way
        return None
    try:
        feeds = load_npz(options.inputs)
    except Exception:  # noqa: BLE001 - any unreadable file: the check says why, on its own run
        return None
    if not feeds or any("@" in key for key in feeds):  # several samples: the check picks one
        return None
    os.makedirs(os.path.join(stage, "logs"), exist_ok=True)
    bins = write_inputs_for_tools(stage, feeds)
    if not bins:
        return None
    shutil.copyfile(model_path, os.path.join(stage, "model.onnx"))
    said: list[str] = []  # not told yet: a check that ends the pack (exit 6) leaves no logs/ to name
    logs = start_logs(stage, None, spec, {}, said.append, together=True)
    logs.bins, logs.feeds, logs.said = bins, feeds, said
    event(f"started beside the check: polygraphy {', '.join(' '.join(a[:2]) for a in logs.runs.values())}")
    return logs


def early_kept(early: Logs, feeds: dict, same_file: bool) -> bool:
    """Did the check run the file polygraphy's early runs read (``same_file``), on the same feeds?"""
    given = early.feeds or {}
    return same_file and set(feeds) == set(given) and all(
        isinstance(feeds[k], np.ndarray) and feeds[k].dtype == given[k].dtype and feeds[k].shape == given[k].shape
        and np.array_equal(feeds[k], given[k], equal_nan=feeds[k].dtype.kind in "fc") for k in feeds)


def drop_early(early: Logs) -> None:
    """Stop early runs the archive will not hold, and remove the inputs written for them."""
    stop_logs(early)
    shutil.rmtree(os.path.join(early.stage, "inputs"), ignore_errors=True)
    if os.path.exists(os.path.join(early.stage, "inputs.json")):
        os.remove(os.path.join(early.stage, "inputs.json"))


def write_inputs_for_tools(stage: str, feeds: dict) -> dict[str, str]:
    """inputs.json for polygraphy, inputs/<i>.bin (raw, C order) for trtexec: numeric tensors only
    (string, sequence and optional feeds are in inputs.npz alone; neither tool takes them)."""
    numeric = {k: v for k, v in feeds.items() if isinstance(v, np.ndarray) and v.dtype.kind in "biuf"}
    if len(numeric) < len(feeds):
        return {}
    with open(os.path.join(stage, "inputs.json"), "w") as handle:
        json.dump([{name: _polygraphy_array(value) for name, value in numeric.items()}], handle, indent=4)
    os.makedirs(os.path.join(stage, "inputs"), exist_ok=True)
    bins = {}
    for index, (name, value) in enumerate(numeric.items()):
        rel = f"inputs/input_{index}.bin"
        np.ascontiguousarray(value).tofile(os.path.join(stage, rel))
        bins[name] = rel
    return bins


def _polygraphy_array(value: np.ndarray) -> dict:
    """One array as polygraphy's JSON encoder writes it (np.save bytes, base64), written here:
    polygraphy's save_json imports torch wherever it is installed, which cost a pack ~6 s to
    import and ~1.6 s at exit (issue 28 item 8)."""
    import base64
    import io

    buffer = io.BytesIO()
    np.save(buffer, value, allow_pickle=False)
    return {"array": base64.b64encode(buffer.getvalue()).decode(), "polygraphy_class": "ndarray"}
