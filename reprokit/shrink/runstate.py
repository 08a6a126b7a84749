"""A shrink run's state on disk and the commands printed for the user: the run fingerprint that
``--resume`` checks, what ``--resume DIR`` alone needs, the "rerun by hand" and "continue" commands,
TensorRT's private timing cache, and writes that are all or nothing. No engine runs here.
"""

from __future__ import annotations

import json
import os
import shlex

from reprokit.engine.oracle import feeds_digest, file_digest
from reprokit.engine.session import RunOptions
from reprokit.errors import InputError
from reprokit.files import atomic_write, read_json
from reprokit.graph.io import file_outline
from reprokit.spec import TargetSpec, parse_target
from reprokit.standalone.arrays import save_npz

STATE_DIR = ".reprokit"


def _atomic_json(path: str, payload: dict) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w") as handle:
            json.dump(payload, handle, indent=2, default=str)

    _atomic(path, ".tmp", write)


def _atomic_npz(path: str, arrays: dict) -> None:
    _atomic(path, ".tmp.npz", lambda tmp: save_npz(tmp, arrays))


def _atomic(path: str, suffix: str, write) -> None:
    """Write through a temporary file and rename; a failed write leaves nothing behind."""
    atomic_write(path, write, suffix=suffix)


def option_args(options: RunOptions) -> list[str]:
    """The command-line options that give ``options`` back: every one that shapes the feeds or
    the criterion, so a printed command judges exactly what this run judged."""
    defaults = RunOptions()
    parts: list[str] = []
    if options.reference != defaults.reference:
        parts += ["--reference", options.reference]
    if options.inputs:
        parts += ["--inputs", options.inputs]
        if options.sample != defaults.sample:
            parts += ["--sample", str(options.sample)]
    else:
        parts += ["--seed", str(options.seed)]
        for name, (lo, hi) in options.val_ranges.items():
            parts += ["--val-range", f"{name + ':' if name is not None else ''}[{lo!r},{hi!r}]"]
    for name, dims in options.input_shapes.items():
        parts += ["--input-shapes", f"{name}:{'x'.join(map(str, dims))}"]
    if options.metric != defaults.metric:
        parts += ["--metric", options.metric]
    for flag, value in (("--tol", options.tolerance), ("--atol", options.atol), ("--rtol", options.rtol)):
        if value is not None:
            parts += [flag, repr(float(value))]
    if options.timeout != defaults.timeout:
        parts += ["--timeout", repr(float(options.timeout))]
    if options.reference_model:  # MODEL is the converted model, this its fp32 original
        parts += ["--reference-model", options.reference_model]
    if options.ignore_positions:
        parts += ["--ignore-positions", options.ignore_positions]
    parts += options.policy().argv()
    return parts


def rerun_command(model_path: str, target: str, options: RunOptions) -> str:
    """The check to rerun by hand, under the user's own target: the timing cache a shrink run
    adds for itself (:func:`_with_timing_cache`) is private to the run and left out."""
    parts = ["reprokit", "check", model_path, "--target", _without_private_timing_cache(target),
             *option_args(options)]
    return " ".join(shlex.quote(p) for p in parts)


def saved_run(out_dir: str) -> dict:
    """What ``--resume OUT`` needs to continue a run with no other argument: the model, the
    target and every option of the run (as command-line options), from OUT/.reprokit/run.json."""
    path = os.path.join(out_dir, STATE_DIR, "run.json")
    try:
        saved = read_json(path)["resume"]
        return {"model": saved["model"], "target": saved["target"], "args": list(saved["args"])}
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(f"--resume {out_dir}: no shrink run to continue there ({path} is missing or unreadable)",
                         hint="give the directory a shrink wrote with -o, or start over: "
                              "reprokit shrink MODEL --target SPEC -o DIR") from exc


# What a run keeps in OUT/.reprokit only while it may be resumed: the captured reference
# activations (gigabytes on a large model), the candidate models and the engine calls' folders.
# run.json, journal.jsonl and a TensorRT timing cache stay: small, and all --resume needs.
BULKY = ("activations", "models", "calls")


def state_bytes(out_dir: str) -> int:
    """Bytes of OUT/.reprokit's bulky folders."""
    total = 0
    for name in BULKY:
        for base, _, files in os.walk(os.path.join(out_dir, STATE_DIR, name)):
            for file in files:
                try:
                    total += os.lstat(os.path.join(base, file)).st_size
                except OSError:
                    pass
    return total


def drop_state(out_dir: str) -> int:
    """Remove OUT/.reprokit's bulky folders when a run has ended; the bytes freed. A resumed run
    captures the activations again (one reference run)."""
    import shutil

    freed = state_bytes(out_dir)
    for name in BULKY:
        shutil.rmtree(os.path.join(out_dir, STATE_DIR, name), ignore_errors=True)
    return freed


FINISHED = ("done", "accumulated")


def finished_run(out_dir: str) -> dict | None:
    """OUT/summary.json of a run that ended with its answer (not interrupted, not stopped at the
    call budget): ``--resume`` has nothing to continue there and keeps it as it is."""
    try:
        summary = read_json(os.path.join(out_dir, "summary.json"))
    except ValueError:
        return None
    if not isinstance(summary, dict) or summary.get("status") not in FINISHED:
        return None
    if (summary.get("budget") or {}).get("stopped"):
        return None
    return summary


def result_gone(out_dir: str, summary: dict) -> list[str]:
    """The files a finished run's summary says it wrote into OUT (minimal.onnx, the archive by its
    own name) that are no longer there."""
    names = ["minimal.onnx"] if summary.get("status") == "done" else []
    if summary.get("report"):
        names.append(os.path.basename(summary["report"]))
    return [name for name in names if not os.path.exists(os.path.join(out_dir, name))]


AFTER = "after-search.json"  # in OUT/.reprokit while a finished search's audit or archive is unwritten


def mark_after_search(out_dir: str, steps: list[str]) -> None:
    """The search has ended and ``steps`` (audit, pack) follow: until :func:`clear_after_search`,
    ``--resume`` runs them instead of saying the run is finished."""
    _atomic_json(os.path.join(out_dir, STATE_DIR, AFTER), {"pending": list(steps)})


def clear_after_search(out_dir: str) -> None:
    try:
        os.remove(os.path.join(out_dir, STATE_DIR, AFTER))
    except FileNotFoundError:
        pass


def after_search_pending(out_dir: str) -> bool:
    """Was the run in ``out_dir`` interrupted after its search, before its audit or archive?"""
    return os.path.exists(os.path.join(out_dir, STATE_DIR, AFTER))


def stopped_at_budget(out_dir: str) -> bool:
    """Did the run in ``out_dir`` stop at its call budget (summary.json says so)? Such a run is
    continued by ``--resume --max-calls``, so its captured activations are worth keeping."""
    try:
        summary = read_json(os.path.join(out_dir, "summary.json"))
        return bool(isinstance(summary, dict) and (summary.get("budget") or {}).get("stopped"))
    except (ValueError, AttributeError):
        return False


def resume_hint(out_dir: str, extra: list[str] | tuple = ()) -> str:
    """The command that continues an interrupted run in ``out_dir``, or why there is none."""
    if not os.path.exists(os.path.join(out_dir, STATE_DIR, "run.json")):
        return "nothing was saved yet; run the same command again"
    command = " ".join(shlex.quote(p) for p in ["reprokit", "shrink", "--resume", out_dir, *extra])
    if not os.path.exists(os.path.join(out_dir, "minimal.onnx")):
        # judged candidates are journaled, but no best was written yet (none found, or one
        # waiting for the original's replay): --resume reads them back instead of asking again
        return f"no best model was written yet; the calls made are kept in {out_dir}; continue with: {command}"
    return f"the best so far is kept in {out_dir}; continue with: {command}"


def weights_digest(model_path: str) -> str:
    """A digest of the model's external data files (their bytes, by name; "" for a model with
    none): a weight file changed beside an unchanged .onnx is another model."""
    import hashlib

    folder = os.path.dirname(os.path.abspath(model_path))
    names = sorted(file_outline(model_path).locations)
    if not names:
        return ""
    digest = hashlib.sha256()
    for name in names:
        path = os.path.join(folder, name)
        digest.update(f"{name}|{file_digest(path) if os.path.isfile(path) else 'missing'}|".encode())
    return digest.hexdigest()


def changed_model(out_dir: str, model_path: str) -> str:
    """What changed on disk in the model of the run in ``out_dir`` since it started ("model",
    "weights", or "" when neither did or run.json did not record it)."""
    try:
        before = read_json(os.path.join(out_dir, STATE_DIR, "run.json"))
    except ValueError:
        return ""
    if not isinstance(before, dict):
        return ""
    if not os.path.isfile(model_path):
        return "model"
    if "model" in before and before["model"] != file_digest(model_path):
        return "model"
    if "weights" in before and before["weights"] != weights_digest(model_path):
        return "weights"
    return ""


def _check_same_run(state_dir, model_path, target, options, feeds, oracle, resume, run_args=(), search=None) -> None:
    """--resume continues only the run that was started: same model (its bytes and its external
    data's), feeds, target, criterion and search options (``search``: what steers the passes; a
    run.json from before ``search`` or ``weights`` was recorded is not held to them)."""
    fingerprint = {
        "model": file_digest(model_path), "weights": weights_digest(model_path), "feeds": feeds_digest(feeds), "target": str(parse_target(target)),
        "reference": oracle.reference, "criterion": oracle.criterion.describe(),
        "check_policy": options.policy().to_json(),
        "input_shapes": {k: list(v) for k, v in sorted(options.input_shapes.items())},
        "search": dict(search or {}),
    }
    if options.reference_model:  # the fp32 twin is the reference's model: the same file, or another run
        fingerprint["reference_model"] = file_digest(options.reference_model)
    path = os.path.join(state_dir, "run.json")
    if resume and os.path.exists(path):
        try:
            before = read_json(path)
            before.get("model")
        except (ValueError, AttributeError) as exc:
            raise InputError(f"--resume: {path} is unreadable ({exc}); it is not the state of a run reprokit can "
                             "continue", hint="start over in a new -o directory (or delete that folder's .reprokit)") from exc
        changed = [k for k in fingerprint if before.get(k) != fingerprint[k] and (k not in ("search", "weights") or k in before)]
        if changed:
            raise InputError(
                f"--resume: this run differs from the one in {os.path.dirname(state_dir)} in {', '.join(changed)}",
                hint="resume with the same model, inputs/seed, target, tolerances and search options, or use a "
                     "new -o directory")
    # Absolute paths: `reprokit shrink --resume OUT` works from any directory (saved_run).
    absolute = options.inputs and os.path.abspath(options.inputs)
    from dataclasses import replace

    resume_with = {"model": os.path.abspath(model_path), "target": target,
                   "args": option_args(replace(options, inputs=absolute or None, reference_model=options.reference_model
                                               and os.path.abspath(options.reference_model))) + list(run_args)}
    _atomic_json(path, {**fingerprint, "resume": resume_with})


def _with_timing_cache(target: str, state_dir: str) -> str:
    """TensorRT targets share one timing cache across every build of a shrink run."""
    spec = parse_target(target)
    if spec.engine != "trt" or spec.has("timing-cache"):
        return target
    return str(spec.with_options(f"timing-cache={os.path.abspath(os.path.join(state_dir, 'timing.cache'))}"))


def _without_private_timing_cache(target: str) -> str:
    """``target`` less the timing cache :func:`_with_timing_cache` put in a run's state folder."""
    spec = parse_target(target)
    private = os.path.join(STATE_DIR, "timing.cache")
    options = tuple((k, v) for k, v in spec.options
                    if not (k == "timing-cache" and str(v).endswith(os.sep + private)))
    return target if options == spec.options else str(TargetSpec(spec.engine, options, spec.command))


