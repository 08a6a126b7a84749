"""Command line: click commands and option parsing. The ONE place where errors become
``Error:``/``Hint:`` lines and exit codes (docs/exit-codes.md). Holds no logic.
"""

from __future__ import annotations

import os
import signal
import sys


def _early_interrupt(signum, frame):  # until main() installs the real handlers
    os.write(2, b"Error: interrupted\nHint: nothing was started yet\n")
    os._exit(130)


# Installed before the heavier imports below, so Ctrl-C or SIGTERM during start-up still ends
# with the documented exit code and no traceback (hence pyproject's E402 exception for this file).
signal.signal(signal.SIGINT, _early_interrupt)
signal.signal(signal.SIGTERM, _early_interrupt)

import json
import re
import time
import traceback
from dataclasses import replace

import click

from reprokit import __version__, torch_export
from reprokit import api as session
from reprokit.api import RunOptions
from reprokit.audit import audit as run_audit
from reprokit.console import (
    Ticker,
    err,
    print_audit,
    print_backends,
    print_check,
    print_env,
    print_pack,
    print_shrink,
    print_torch,
    print_verify,
)
from reprokit.engine import enginelog
from reprokit.engine.backends import backend_class, engine_names
from reprokit.engine.envinfo import fingerprint
from reprokit.engine.inputs import (
    feed_dtype,
    feed_shape,
    parse_shape_args,
    parse_val_ranges,
    save_feeds,
)
from reprokit.errors import ExitCode, ReprokitError, UsageError
from reprokit.files import atomic_text, atomic_write, claim_file, claim_folder, read_paths
from reprokit.graph.dims import say_in_error
from reprokit.graph.io import external_locations, load_model
from reprokit.matrix.cli import clean_matrix_envs, verify_matrix
from reprokit.matrix.fanout import check_many
from reprokit.report import bundle as report
from reprokit.report import verify as verifying
from reprokit.shrink import steps as shrinking
from reprokit.shrink.budget import Limits
from reprokit.shrink.clock import StepClock, process_started
from reprokit.shrink.output import close_summary, pack_accumulated
from reprokit.shrink.runstate import STATE_DIR, drop_state, finished_run, state_bytes
from reprokit.spec import parse_target
from reprokit.torch_export import columns as torch_columns
from reprokit.torch_export import reference_columns

_DEBUG = False
_JSON = False  # --json: failures also print a reprokit.error/1 object on stdout
_OUT: str | None = None  # the command's -o: a full disk names it when the failed write named no file


def _writing(path: str) -> None:
    global _OUT
    _OUT = path
    if os.path.isdir(path):
        _OUT_DIRS.append(path)  # what an interrupt left there is said from it (_interrupted_hint)


def run_options(func):
    """Options shared by every command that runs engines on a model."""
    options = [
        click.option("--reference", default="ort", show_default=True, help="Reference target spec."),
        click.option("--inputs", "inputs", default=None, metavar="PATH",
                     help="Feeds: .npz (NAME@N members: sample N), polygraphy JSON (a list: several samples), an "
                          "ONNX test_data_set folder, or a folder of test_data_set_N folders."),
        click.option("--sample", default=None, type=click.IntRange(0), metavar="N",
                     help="Use sample N of a multi-sample --inputs only (default: check and shrink judge every sample)."),
        click.option("--seed", default=0, show_default=True, type=click.IntRange(0), help="Seed for random feeds."),
        click.option("--input-shapes", multiple=True, metavar="NAME:DIMS",
                     help="Freeze dynamic dims, e.g. x:1x3x320x320 (repeatable)."),
        click.option("--val-range", multiple=True, metavar="[NAME:][LO,HI]",
                     help="Range of random feeds, e.g. x:[-1,1] (default [0,1])."),
        click.option("--metric", type=click.Choice(["rel-l2", "max-abs", "cosine", "allclose"]),
                     default="rel-l2", show_default=True, help="Error metric per output."),
        click.option("--tol", type=click.FloatRange(min=0), default=None,
                     help="Bound on the metric (default: by target precision, see README)."),
        click.option("--atol", type=click.FloatRange(min=0), default=None, help="Absolute tolerance for allclose."),
        click.option("--rtol", type=click.FloatRange(min=0), default=None, help="Relative tolerance for allclose."),
        click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=600.0, show_default=True,
                     help="Seconds per engine call; a call past it is killed (verdict: timeout)."),
        click.option("--fail-regex", multiple=True, metavar="RE",
                     help="cmd targets: a run whose output matches RE fails, whatever its exit status "
                          "(repeatable: any match). The regexes, not the words, are the bug's signature."),
        click.option("--fail-code", multiple=True, type=int, metavar="N",
                     help="cmd targets: only these exit codes are failures (repeatable)."),
        click.option("--ignore-fail-code", multiple=True, type=int, metavar="N",
                     help="cmd targets: these exit codes are passes (repeatable)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


# --force: the one way to let reprokit replace a file it did not write (never one the run reads).
FORCE = click.option("--force", is_flag=True,
                     help="Replace existing output files reprokit did not write (never a file the command reads).")

# What each command writes in its output folder (reprokit/files.py: claimed before any work).
CHECK_FILES = ("inputs.npz", "reference_outputs.npz", "target_outputs.npz", "verdict.json", "engine.log")
AUDIT_FILES = ("audit.json", "audit.md", "audit.html", "layerwise.png", "overlay-*.json")
SHRINK_FILES = ("minimal.onnx", "minimal.onnx.data", "inputs.npz", "reference_outputs.npz", "summary.json",
                "engine.log")
TORCH_FILES = ("*",)


def _torch_files(kw: dict) -> tuple:
    return tuple(f"torch/{p}" for p in TORCH_FILES) if kw.get("torch_entry") else ()


def _reads(model: str | None, kw: dict) -> list[str]:
    """Every file the command reads: the model, its external data, --inputs, the --torch script."""
    paths = [model, kw.get("inputs"), (kw.get("torch_entry") or "").rpartition(":")[0] or None]
    if model and os.path.isfile(model):
        try:
            folder = os.path.dirname(os.path.abspath(model))
            paths += [os.path.join(folder, loc) for loc in external_locations(load_model(model, load_weights=False))]
        except Exception:  # noqa: BLE001  an unreadable model is refused later, with its own message
            pass
    return read_paths(paths)


def torch_options(func):
    """--torch FILE.py:FUNC and its export settings (PyTorch in; torch is an optional extra)."""
    options = [
        click.option("--torch", "torch_entry", default=None, metavar="FILE.py:FUNC",
                     help="Start from PyTorch: FUNC returns (module, example inputs); exported with torch.onnx.export "
                          "into the run's folder, and PyTorch eager is judged beside onnxruntime and the target."),
        click.option("--torch-exporter", type=click.Choice(["auto", "dynamo", "legacy"]), default="auto",
                     show_default=True, help="--torch: dynamo=True, the legacy TorchScript exporter, or auto "
                                             "(dynamo where onnxscript is installed)."),
        click.option("--torch-opset", type=click.IntRange(1), default=None, metavar="N",
                     help="--torch: opset_version for torch.onnx.export (default: the exporter's)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _from_torch(model, kw: dict, options, folder: str):
    """MODEL, or with --torch the module exported into ``folder``: (model path, TorchExport or
    None). The example inputs become the feeds (``options.inputs``)."""
    entry, exporter, opset = kw.pop("torch_entry"), kw.pop("torch_exporter"), kw.pop("torch_opset")
    if entry is None:
        if model is None:
            raise UsageError("give MODEL or --torch FILE.py:FUNC", hint="e.g. reprokit check model.onnx --target emulate:fp16")
        return model, None
    if model is not None:
        raise UsageError(f"give MODEL ({model}) or --torch {entry}, not both",
                         hint="--torch exports the module to an ONNX model itself")
    if options.inputs:
        raise UsageError("--inputs and --torch: the feeds are FUNC's example inputs",
                         hint="return the inputs you want from FUNC")

    exported = torch_export.export(entry, folder, exporter=exporter, opset=opset)
    options.inputs = exported.inputs_path
    return exported.model_path, exported


def _torch_info(exported, options, folder: str, as_json: bool) -> dict | None:
    """shrink, audit, pack with --torch: the exporter column (PyTorch eager vs the ONNX reference)
    beside the export settings, written to the export's folder as columns.json."""
    if exported is None:
        return None
    import tempfile

    with tempfile.TemporaryDirectory(prefix="reprokit-torch-") as work:
        info = reference_columns(exported, options, work)
    with open(os.path.join(exported.folder, "columns.json"), "w") as handle:
        json.dump(info, handle, indent=2, default=str)
    if not as_json:
        s = info["export"]
        err.print(f"[dim]torch {s['torch']}: exported {s['source']} ({'dynamo' if s['dynamo'] else 'legacy'}, "
                  f"opset {s['opset']}) to {exported.model_path}; {info['words']}[/]")
    return info


def parse_size(text: str, option: str) -> int:
    """'500M', '20G', '1.5G', '4096' (bytes) → bytes."""

    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)i?[bB]?\s*", text or "")
    if not match:
        raise UsageError(f"cannot parse {option} {text!r}", hint=f"e.g. {option} 20G or {option} 500M")
    scale = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}[match.group(2).lower()]
    return int(float(match.group(1)) * scale)


def _parse_max_calls(text: str) -> int | None:
    if text.strip().lower() == "auto":
        return -1
    if not text.strip().isdigit():
        raise UsageError(f"--max-calls takes a number or 'auto', got {text!r}", hint="e.g. --max-calls 40, or 0 for no limit")
    return int(text) or None


def make_run_options(kw: dict):
    return RunOptions(
        reference=kw.pop("reference"), metric=kw.pop("metric"), tolerance=kw.pop("tol"),
        atol=kw.pop("atol"), rtol=kw.pop("rtol"), timeout=kw.pop("timeout"),
        fail_regex=tuple(kw.pop("fail_regex")), fail_codes=tuple(kw.pop("fail_code")),
        ignore_fail_codes=tuple(kw.pop("ignore_fail_code")), inputs=kw.pop("inputs"), sample=kw.pop("sample"),
        seed=kw.pop("seed"), input_shapes=parse_shape_args(kw.pop("input_shapes")),
        val_ranges=parse_val_ranges(kw.pop("val_range")),
    )


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


def _engine_log(out_dir: str | None, *, fresh: bool = True) -> None:
    """The engines' own messages of this run go to OUT/engine.log (reprokit/enginelog.py)."""
    enginelog.set_log(os.path.join(out_dir, "engine.log") if out_dir else None, fresh=fresh)


@cli.command()
@click.argument("models", nargs=-1, metavar="[MODEL]...")
@click.option("--target", "-t", required=True, help="Target spec, e.g. trt:fp16, emulate:fp16, openvino:bf16.")
@run_options
@torch_options
@click.option("--layerwise", is_flag=True, help="Compare every intermediate tensor; show where divergence starts.")
@click.option("--top", default=10, show_default=True, type=click.IntRange(0), help="Rows of the layerwise table.")
@click.option("--out", "-o", "out_dir", default=None, metavar="DIR",
              help="Write inputs.npz, verdict.json and both engines' outputs here (several models: DIR/NAME/).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (schema reprokit.check/1).")
@click.option("--ray", "ray_address", default=None, metavar="ADDRESS|auto|local",
              help="Several MODELs: one Ray task each (docs/matrix.md); without it, a local pool.")
@click.option("--gpus", default=None, metavar="KINDS", help="With --ray: each model on each GPU kind, e.g. L4,A100.")
@click.option("--jobs", "-j", default=2, show_default=True, type=click.IntRange(1, 64),
              help="Several MODELs without --ray: checks at once.")
@FORCE
@click.pass_context
def check(ctx, models, target, layerwise, top, out_dir, as_json, ray_address, gpus, jobs, force, **kw):
    """Does TARGET diverge from the reference on MODEL? Exit 0 agree, 1 diverge (several
    MODELs: 1 if any diverges)."""
    if len(models) > 1 or ray_address or gpus:  # a zoo sweep: one `reprokit check` per model

        passed = [a for p in ctx.command.params if p.name not in ("models", "ray_address", "gpus", "jobs", "out_dir",
                                                                  "as_json") and _given(ctx, p.name)
                  for a in _as_args(p, ctx.params[p.name])]
        sys.exit(check_many(list(models), passed, out_dir=out_dir, as_json=as_json, ray_address=ray_address,
                            gpus=gpus, jobs=jobs))
    model = models[0] if models else None

    reads = _reads(model, kw)
    options = make_run_options(kw)
    parse_target(target)  # a bad spec is a usage error before any work
    if out_dir:
        claim_folder(out_dir, CHECK_FILES + _torch_files(kw), reads, force=force)
        _writing(out_dir)
    _engine_log(out_dir)
    import tempfile

    scratch = tempfile.TemporaryDirectory(prefix="reprokit-torch-")  # --torch without -o: the export's folder
    model, exported = _from_torch(model, kw, options, os.path.join(out_dir or scratch.name, "torch"))
    ticker = Ticker(quiet=as_json)  # a big model's run is never silent for long
    ticker(f"running {options.reference} and {target} on {model} …")
    result = session.check(model, target, options=options, layerwise=layerwise)
    ticker.close()
    columns = None
    if exported is not None:  # PyTorch eager: the third column

        columns = torch_columns(exported, result, options.reference, options.metric)
    if out_dir:
        for name, arrays in (("inputs.npz", result.prepared.feeds.arrays),
                             ("reference_outputs.npz", result.reference_outputs),
                             ("target_outputs.npz", result.target_outputs)):
            atomic_write(os.path.join(out_dir, name), lambda tmp, arrays=arrays: save_feeds(tmp, arrays))
        atomic_text(os.path.join(out_dir, "verdict.json"), json.dumps(result.verdict.to_json(), indent=2))
    if as_json:
        payload = {
            "schema": "reprokit.check/1",
            "model": model,
            "verdict": result.verdict.to_json(),
            "feeds": {"source": result.prepared.feeds.source,
                      "inputs": {k: {"shape": feed_shape(v), "dtype": feed_dtype(v)}
                                 for k, v in result.prepared.feeds.arrays.items()}},
            "notes": result.prepared.notes,
            "warnings": result.verdict.warnings,
            "layerwise": result.layerwise.to_json(top) if result.layerwise else None,
            "torch": columns.to_json() if columns else None,
        }
        if result.samples:  # a multi-sample --inputs: each sample's verdict (exit 1 if any diverges)
            payload["samples"] = [s.to_json() for s in result.samples]
        click.echo(json.dumps(payload, indent=2))
    else:
        print_check(result, model, top)
        if columns is not None:
            print_torch(columns)
        if out_dir:
            err.print(f"[dim]wrote inputs, outputs and verdict.json to {out_dir}[/]")
    diverges = columns.diverges if columns is not None else result.verdict.diverges
    sys.exit(ExitCode.DIVERGES if diverges else ExitCode.OK)


@cli.command()
@click.argument("model", required=False)
@click.option("--target", "-t", default=None,
              help="Target spec, e.g. trt:fp16, emulate:fp16, openvino:bf16 (required unless --resume DIR).")
@run_options
@torch_options
@click.option("--out", "-o", "out_dir", default="reprokit-out", show_default=True, metavar="DIR",
              help="Where minimal.onnx, inputs.npz and summary.json go (rewritten after every step).")
@click.option("--jobs", "-j", default=1, show_default=True, type=click.IntRange(1, 64),
              help="Evaluate candidates in parallel; the result is the same for every N.")
@click.option("--replays", default=None, type=click.IntRange(0, 10),
              help="Extra runs of the original and of the result to detect a flaky target. Default: none "
                   "for deterministic engines; otherwise the original once and the result once (twice for "
                   "cmd checks).")
@click.option("--resume", "resume", is_flag=False, flag_value="", default=None, metavar="[DIR]",
              help="Continue an interrupted or budget-stopped run: --resume DIR alone takes the model, target "
                   "and run options from DIR; plain --resume continues the same command's --out.")
@click.option("--max-activation-disk", default=None, metavar="SIZE",
              help="Stop with an error if the captured activations would pass SIZE (e.g. 20G, 500M).")
@click.option("--max-calls", default="auto", show_default=True, metavar="N|auto",
              help="Target calls in all (engine builds). auto: about polygraphy's bisect cost; 0: no limit.")
@click.option("--capture-chunk", default="1G", show_default=True, metavar="SIZE",
              help="Activations one reference run may return at once; more runs when the model needs more.")
@click.option("--no-localize", is_flag=True,
              help="Skip the survey and localization (named node, each node alone, layerwise); search only.")
@click.option("--one-by-one", is_flag=True,
              help="Judge one candidate per engine call (no packed candidates, no group testing).")
@click.option("--accept-milder", is_flag=True,
              help="Accept candidates whose mismatch is much milder than the original's (by default a candidate "
                   "must reach a tenth of its error, between 1x and 10x the tolerance).")
@click.option("--search-accumulated", is_flag=True,
              help="When no small region shows a mismatch alone (accumulated error), search on for the "
                   "smallest window instead of stopping with the attribution.")
@click.option("--no-reduce-inputs", is_flag=True,
              help="Keep the model's own inputs: remove nodes only from the end (polygraphy's flag).")
@click.option("--no-reduce-outputs", is_flag=True,
              help="Keep the model's own outputs: remove nodes only from the start (polygraphy's flag).")
@click.option("--no-shrink-shapes", is_flag=True,
              help="Keep the minimal model's input shapes (by default they are halved while the signature holds).")
@click.option("--no-pack", is_flag=True, help="Do not write the report archive OUT/report.tar.gz.")
@click.option("--format", "fmt", type=click.Choice(["tar.gz", "zip"]), default="tar.gz", show_default=True,
              help="Report archive format.")
@click.option("--redact", is_flag=True, help="Redact names, metadata and (if it still reproduces) weights in the report.")
@click.option("--audit", "with_audit", is_flag=True,
              help="Also audit the original model (OUT/audit/; the report gets audit/ and a sweep).")
@click.option("--overlay", "with_overlay", is_flag=True,
              help="Write Model Explorer overlays of the original model (OUT/audit/overlay-*.json: layerwise, "
                   "isolated and range data, the nodes kept); a light audit unless --audit.")
@click.option("--keep-state", is_flag=True,
              help="Keep OUT/.reprokit's captured activations and candidate models after the run (by default "
                   "they are removed when the run ends, kept only when it is interrupted).")
@click.option("--json", "as_json", is_flag=True, help="Print summary.json to stdout at the end.")
@FORCE
@click.pass_context
def shrink(ctx, model, target, out_dir, jobs, replays, resume, max_activation_disk, max_calls, capture_chunk,
           no_localize, one_by_one, accept_milder, search_accumulated, no_reduce_inputs, no_reduce_outputs,
           no_shrink_shapes, no_pack, fmt, redact, with_audit, with_overlay, keep_state, as_json, force, **kw):
    """Cut MODEL down to a minimal model that shows the same divergence under TARGET."""
    clock = StepClock(process_started())  # summary.json's steps cover the process, start-up included

    flags = {name: ctx.params[name] for name in _SHRINK_ONLY}  # the command's own options
    if resume:  # --resume DIR: every option not given again comes from DIR's saved run
        if _given(ctx, "out_dir") and os.path.abspath(out_dir) != os.path.abspath(resume):
            raise UsageError(f"--resume {resume} and -o {out_dir} name different directories",
                             hint=f"give one of them: reprokit shrink --resume {resume}")
        out_dir = resume
        saved = shrinking.saved_run(out_dir)
        finished = finished_run(out_dir)
        if finished is not None:  # nothing to continue: the answer on disk stays as it is
            _say_finished(out_dir, finished, as_json)
            return
        model, target = model or saved["model"], target or saved["target"]
        before = ctx.command.make_context("shrink", list(saved["args"]))
        for name, value in before.params.items():
            if _given(before, name) and not _given(ctx, name):
                if name in flags:
                    flags[name] = value
                elif name in kw:
                    kw[name] = value
    (jobs, replays, max_activation_disk, max_calls, capture_chunk, no_localize, one_by_one, accept_milder,
     search_accumulated, no_reduce_inputs, no_reduce_outputs, no_shrink_shapes, no_pack, fmt, redact, with_audit,
     with_overlay, keep_state) = (flags[name] for name in _SHRINK_ONLY)
    run_args = [a for p in ctx.command.params if p.name in flags and flags[p.name] not in (None, p.default)
                for a in _as_args(p, flags[p.name])]
    if (model is None and not kw.get("torch_entry")) or target is None:
        raise UsageError("shrink needs MODEL and --target (or --resume DIR of an earlier run)",
                         hint="e.g. reprokit shrink model.onnx --target emulate:fp16 -o out/")
    reads = _reads(model, kw)
    options = make_run_options(kw)
    parse_target(target)  # a bad spec or a missing check script fails before any work
    # so does an output that would replace a file the run reads or one the user wrote
    claim_folder(out_dir, SHRINK_FILES + _torch_files(kw) + (() if no_pack else (f"report.{fmt}",))
                 + (tuple(f"audit/{p}" for p in AUDIT_FILES) if with_audit or with_overlay else ()),
                 reads, force=force)
    _writing(out_dir)
    if kw.get("torch_entry"):
        clock.begin("torch export")
    model, exported = _from_torch(model, kw, options, os.path.join(out_dir, "torch"))
    torch_info = _torch_info(exported, options, out_dir, as_json)
    _engine_log(out_dir, fresh=resume is None)
    progress = Ticker(stamp=True, quiet=as_json)  # a line at least every few seconds, in every step

    limits = Limits(
        capture_chunk_bytes=parse_size(capture_chunk, "--capture-chunk"),
        max_activation_disk_bytes=parse_size(max_activation_disk, "--max-activation-disk") if max_activation_disk else None,
        max_calls=_parse_max_calls(max_calls),
    )
    try:  # the captured activations outlive the run only when it was interrupted, or with --keep-state
        result = shrinking.shrink(model, target, out_dir, options=options, jobs=jobs, replays=replays,
                                  resume=resume is not None, localize_first=not no_localize, on_event=progress,
                                  limits=limits, pack_candidates=not one_by_one,
                                  search_accumulated=search_accumulated, accept_milder=accept_milder,
                                  keep_inputs=no_reduce_inputs, keep_outputs=no_reduce_outputs,
                                  shrink_shapes=not no_shrink_shapes, clock=clock, run_args=tuple(run_args))
    except KeyboardInterrupt:  # run.json holds every option: --resume DIR alone continues
        _end_state(out_dir, True, as_json, "for --resume")
        raise ReprokitError("interrupted", hint=shrinking.resume_hint(out_dir),
                            exit_code=ExitCode.INTERRUPTED) from None
    except BaseException:
        _end_state(out_dir, keep_state, as_json)
        raise
    _end_state(out_dir, keep_state, as_json)
    audited = None
    if torch_info is not None:
        result.summary["torch"] = torch_info
    accumulated = result.summary["status"] == "accumulated"  # no model to call minimal, nothing to pack
    reduced_on = next((row["index"] for row in result.summary.get("samples") or [] if row.get("reduced_on")), None)
    if reduced_on is not None:  # several samples: the audit explains the one shrink reduced on
        options = replace(options, sample=reduced_on)
    if with_overlay and not with_audit and not accumulated:  # overlays only: no sweep, no explain

        progress("Model Explorer overlays of the original model")
        clock.begin("overlay")
        light = run_audit(model, target, os.path.join(out_dir, "audit"), options=options, sweep=False,
                          explain_inputs=False, kept_nodes=result.summary["minimal"]["node_names"], on_event=progress)
        result.summary["overlay"] = light.payload.get("overlay")
        if light.payload.get("overlay"):
            result.notes.append(f"overlay: {light.payload['overlay']['command']}")
    if with_audit and not accumulated:  # --- audit (reprokit/audit): the ORIGINAL model, naming what shrink kept

        progress("auditing the original model")
        clock.begin("audit")
        audited = run_audit(model, target, os.path.join(out_dir, "audit"), options=options,
                            kept_nodes=result.summary["minimal"]["node_names"], on_event=progress)
        result.summary["overlay"] = audited.payload.get("overlay")
        result.summary["audit"] = os.path.join(out_dir, "audit", "audit.json")
        found = audited.workaround
        result.notes.append(f"audit: {out_dir}/audit/audit.html"
                            + (f"; smallest workaround: {found['change']} ({found['setting']})" if found else ""))
    if not no_pack and accumulated:  # the whole model is the repro; ISSUE.md gets the attribution
        progress("packing the report archive (the whole model, with the attribution)")
        clock.begin("pack")

        packed = pack_accumulated(result, model, target, options, fmt=fmt, redact=redact, on_event=progress)
        if packed is not None:
            result.notes.extend(packed.notes)
    if not no_pack and not accumulated:
        progress("packing the report archive")
        clock.begin("pack")
        packed = shrinking.pack_result(result, target, options, fmt=fmt, redact=redact, on_event=progress,
                                       audit=audited)
        result.summary["report"] = packed.archive
        result.notes.extend(packed.notes)
    progress.close()
    close_summary(result)  # every step's seconds, the archive's included, add up to wall_s
    if as_json:
        click.echo(json.dumps(result.summary, indent=2, default=str))
    else:
        print_shrink(result)


@cli.command()
@click.argument("model", required=False)
@click.option("--target", "-t", required=True, help="Target spec the model diverges under.")
@run_options
@torch_options
@click.option("--out", "-o", "out_path", default="report.tar.gz", show_default=True,
              help="Archive to write (.tar.gz or .zip).")
@click.option("--format", "fmt", type=click.Choice(["tar.gz", "zip"]), default=None,
              help="Archive format (default: from the file name).")
@click.option("--redact", is_flag=True, help="Generic names, no metadata; random weights if it still reproduces.")
@click.option("--audit", "with_audit", is_flag=True,
              help="Audit the model first (written beside the archive as NAME.audit/); the archive gets audit/.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@FORCE
def pack(model, target, out_path, fmt, redact, with_audit, as_json, force, **kw):
    """Bundle a small diverging MODEL into a report archive ready to file."""
    reads = _reads(model, kw)
    stem = re.sub(r"(\.tar\.gz|\.tgz|\.zip)$", "", out_path)
    _ensure_out_file(out_path)
    claim_file(out_path, reads, force=force)
    _writing(out_path)
    if with_audit:
        claim_folder(stem + ".audit", AUDIT_FILES, reads, force=force)
    if kw.get("torch_entry"):
        claim_folder(stem + ".torch", TORCH_FILES, reads, force=force)
    options = make_run_options(kw)
    on_event = Ticker(quiet=as_json)
    context = audit_dir = None
    model, exported = _from_torch(model, kw, options, stem + ".torch")
    torch_info = _torch_info(exported, options, os.path.dirname(exported.folder) if exported else "", as_json)
    if with_audit:  # --- audit (reprokit/audit)
        audit_dir = stem + ".audit"
        audited = run_audit(model, target, audit_dir, options=options, on_event=on_event)
        context = audited.issue_context()
    if torch_info is not None:  # the archive records the torch version and export settings
        context = {**(context or {}), "torch": torch_info}
    result = report.pack(model, target, out_path, options=options, fmt=fmt, redact=redact,
                         on_event=on_event, context=context, audit_dir=audit_dir)
    on_event.close()
    if as_json:
        click.echo(json.dumps({"schema": "reprokit.pack/1", "archive": result.archive,
                               "reproduces": result.reproduces, "notes": result.notes,
                               "redaction": result.redaction, "verdict": result.verdict.to_json()}, indent=2))
    else:
        print_pack(result)


@cli.command()
@click.argument("model", required=False)
@click.option("--target", "-t", required=True, help="Target spec, e.g. trt:fp16, emulate:fp16, openvino:bf16.")
@run_options
@torch_options
@click.option("--out", "-o", "out_dir", default="reprokit-audit", show_default=True, metavar="DIR",
              help="Where audit.json, audit.md, audit.html and (with matplotlib) layerwise.png go.")
@click.option("--no-sweep", is_flag=True, help="Skip the knob sweep (one target call per setting).")
@click.option("--no-explain", is_flag=True, help="Skip the random-inputs / random-weights runs.")
@click.option("--ranges-only", is_flag=True, help="Only the range audit: one reference run, no target call.")
@click.option("--json", "as_json", is_flag=True, help="Print audit.json (schema reprokit.audit/1).")
@FORCE
def audit(model, target, out_dir, no_sweep, no_explain, ranges_only, as_json, force, **kw):
    """Why does MODEL diverge under TARGET, and which setting avoids it? Exit 0 when written."""
    reads = _reads(model, kw)
    options = make_run_options(kw)
    claim_folder(out_dir, AUDIT_FILES + ("engine.log",) + _torch_files(kw), reads, force=force)
    _writing(out_dir)
    _engine_log(out_dir)
    model, exported = _from_torch(model, kw, options, os.path.join(out_dir, "torch"))
    _torch_info(exported, options, out_dir, as_json)
    ticker = Ticker(quiet=as_json)
    result = run_audit(model, target, out_dir, options=options, sweep=not no_sweep, explain_inputs=not no_explain,
                       ranges_only=ranges_only, on_event=ticker)
    ticker.close()
    if as_json:
        with open(result.files["json"]) as handle:
            click.echo(handle.read())
    else:
        print_audit(result)


@cli.command()
@click.argument("archive")
@click.option("--target", "-t", default=None, help="Check under this target instead of the recorded one "
              "(needed when the archive records a cmd: target or a file path).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=600.0, show_default=True,
              help="Seconds per engine call.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--versions", default=None, metavar="SPEC",
              help="Run repro.py per engine release, each in its own uv environment, e.g. "
                   "'onnxruntime==1.28.0,1.29.0,latest' or 'openvino>=2024.0' (docs/matrix.md). Needs reprokit[matrix].")
@click.option("--bisect", is_flag=True, help="--versions: find where the outcome changes in the range (~log2 n envs).")
@click.option("--ray", "ray_address", default=None, metavar="ADDRESS|auto|local",
              help="--versions: run each cell as a Ray task (auto: the running cluster; local: start one here).")
@click.option("--gpus", default=None, metavar="KINDS", help="--versions on Ray: one cell per GPU kind, e.g. L4,A100 "
              "(num_gpus=1, accelerator_type=KIND).")
@click.option("--jobs", "-j", default=2, show_default=True, type=click.IntRange(1, 64),
              help="--versions without --ray: cells run at once.")
@click.option("--out", "-o", "out_path", default=None, metavar="FILE",
              help="--versions: the new archive with matrix.json (default: ARCHIVE's name + .matrix.tar.gz).")
@FORCE
def verify(archive, target, timeout, as_json, versions, bisect, ray_address, gpus, jobs, out_path, force):
    """Does the divergence in a report ARCHIVE reproduce here? Exit 1 yes, 0 no.
    With --versions: on which engine releases? A table in a new archive: exit 0 when at least one
    release ran, 9 when none could (nothing written) or --bisect judged fewer than two."""
    if versions is None and (bisect or ray_address or gpus or out_path or force):
        raise UsageError("--bisect, --ray, --gpus, --out and --force go with --versions", hint="e.g. reprokit verify "
                         "report.tar.gz --versions 'onnxruntime>=1.20' --bisect")
    if versions is not None:
        verify_matrix(archive, versions, target=target, timeout=timeout, as_json=as_json, bisect=bisect,
                      ray_address=ray_address, gpus=gpus, jobs=jobs, out_path=out_path, force=force)
        return
    result = verifying.verify(archive, target, timeout=timeout)
    if as_json:
        click.echo(json.dumps({"schema": "reprokit.verify/1", "archive": archive, "target": result.target,
                               "reproduces": result.reproduces, "recorded": result.recorded,
                               "verdict": result.verdict.to_json()}, indent=2, default=str))
    else:
        print_verify(result, archive)
    sys.exit(ExitCode.DIVERGES if result.reproduces else ExitCode.OK)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON (schema reprokit.env/1).")
def env(as_json):
    """The environment fingerprint that reports carry."""
    info = fingerprint()
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return

    print_env(info)


@cli.group()
def matrix():
    """The version matrix's housekeeping (verify --versions runs it; docs/matrix.md)."""


@matrix.command("clean")
@click.option("--dry-run", is_flag=True, help="Say what would be removed and freed; remove nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (schema reprokit.matrix-clean/1).")
def matrix_clean(dry_run, as_json):
    """Remove the environments verify --versions cached (REPROKIT_ENV_CACHE, else
    ~/.cache/reprokit/envs) and print the bytes freed; what reprokit did not build is left alone."""
    clean_matrix_envs(dry_run=dry_run, as_json=as_json)


# shrink's own options (beside the run options): kept in run.json, restored by --resume.
_SHRINK_ONLY = ("jobs", "replays", "max_activation_disk", "max_calls", "capture_chunk", "no_localize",
                "one_by_one", "accept_milder", "search_accumulated", "no_reduce_inputs", "no_reduce_outputs",
                "no_shrink_shapes", "no_pack", "fmt", "redact", "with_audit", "with_overlay", "keep_state")


def _end_state(out_dir: str, keep: bool, as_json: bool, why: str = "(--keep-state)") -> None:
    """A shrink run has ended: its captured activations go, unless kept; either way, say how much."""
    where = os.path.join(out_dir, STATE_DIR)
    if keep:
        size = state_bytes(out_dir)
        text = f"kept {_mib(size)} of captured activations and candidates in {where} {why}"
    else:
        size = drop_state(out_dir)
        text = f"removed {_mib(size)} of captured activations and candidates from {where} (--keep-state keeps them)"
    if size and not as_json:
        err.print(f"[dim]{text}[/]")


def _mib(size: int) -> str:
    return f"{size / 2**20:,.1f} MiB"


def _say_finished(out_dir: str, summary: dict, as_json: bool) -> None:
    """--resume of a run that already ended with its answer: say so, change nothing."""
    if as_json:
        click.echo(json.dumps(summary, indent=2, default=str))
        return
    minimal = summary.get("minimal") or {}
    what = (f"a minimal model of {minimal.get('nodes')} nodes" if summary.get("status") == "done"
            else "an accumulated error (summary.json: attribution)")
    err.print(f"{out_dir} holds a finished run ({what}, {summary.get('calls', {}).get('target')} target calls); "
              "nothing to continue, the result is kept as it is. To start over, use a new -o directory.")


def _given(ctx, name: str) -> bool:
    from click.core import ParameterSource

    return ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)


def _as_args(param, value) -> list[str]:
    if getattr(param, "is_flag", False):
        return [param.opts[0]] if value else []
    if getattr(param, "multiple", False):  # repeatable options: once per value
        return [a for v in value for a in (param.opts[0], str(v))]
    return [param.opts[0], str(value)]


# Output folders this command made or writes into: what an interruption leaves is said from them.
_OUT_DIRS: list[str] = []
_STARTED = time.time()  # files changed since are this command's


def _interrupted_hint() -> str:
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


def _ensure_out_file(path: str) -> None:
    """The archive's folder must be a directory that can be made and written: checked before
    any engine runs, not after all the work."""
    if os.path.isdir(path):
        raise UsageError(f"--out {path} is a directory", hint="give the archive's file name, e.g. -o report.tar.gz")
    existing = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise UsageError(f"cannot write --out {path}: {existing} is a file, not a directory",
                         hint="choose another path for the archive")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write --out {path}: {existing} is not writable", hint="choose a writable directory")


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def backends(as_json):
    """List the engines, whether they work here, and how to get the missing ones."""
    rows = []
    for engine in engine_names():
        cls = backend_class(engine)
        found = cls.probe()
        rows.append({"engine": engine, "summary": cls.summary, "available": found.available,
                     "version": found.version, "detail": found.detail, "install": cls.install_hint,
                     "options": {k: v.help for k, v in cls.OPTIONS.items()}})
    if as_json:
        click.echo(json.dumps({"schema": "reprokit.backends/1", "backends": rows}, indent=2))
    else:
        print_backends(rows)


# A multi-line reason (an engine's or the OS's own words) is kept, but not without bound.
_MORE_LINES = 20


def _fail(message: str, hint: str | None, code: int, details: dict | None = None) -> None:
    Ticker.close_all()  # no "still at it" line after the Error: line
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
    sys.exit(int(code))


def main(argv=None) -> None:
    """Entry point: run the CLI and turn every failure into its exit code."""
    import errno

    global _DEBUG, _JSON
    args = list(sys.argv[1:] if argv is None else argv)
    _DEBUG = "--debug" in args or os.environ.get("REPROKIT_DEBUG") == "1"
    _JSON = "--json" in args
    # SIGTERM ends every command like Ctrl-C: workers are killed, best-so-far results kept.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        cli.main(args=args, prog_name="reprokit", standalone_mode=False)
    except SystemExit:
        raise
    except ReprokitError as exc:
        if _DEBUG:
            traceback.print_exc()

        say_in_error(exc)  # sizes reprokit chose for dynamic dims are named in every outcome
        _fail(exc.message, exc.hint, exc.exit_code, exc.details)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
        sys.exit(0)
    except click.UsageError as exc:
        command = exc.ctx.command_path if exc.ctx else "reprokit"
        _fail(exc.format_message(), f"see '{command} --help'", ExitCode.USAGE)
    except (click.exceptions.Abort, KeyboardInterrupt) as exc:
        if isinstance(exc, click.exceptions.Abort) and isinstance(exc.__context__, EOFError):
            _fail(f"unexpected end of input: {exc.__context__}", "a file ended early; check it", ExitCode.INPUT)
        _fail("interrupted", _interrupted_hint(), ExitCode.INTERRUPTED)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            where = f" {exc.filename or _OUT}" if exc.filename or _OUT else ""
            _fail(f"cannot write{where}: {exc.strerror} (disk full or file size limit)",
                  "free disk space or write elsewhere (-o); results already written are kept",
                  ExitCode.ENVIRONMENT)
        if _DEBUG:
            traceback.print_exc()
        _fail(f"internal error: {exc.__class__.__name__}: {exc}",
              "rerun with --debug and report the traceback", ExitCode.INTERNAL)
    except click.ClickException as exc:
        _fail(exc.format_message(), None, exc.exit_code)
    except Exception as exc:  # a bug: say so plainly, traceback only with --debug
        if _DEBUG:
            traceback.print_exc()
        _fail(f"internal error: {exc.__class__.__name__}: {exc}",
              "rerun with --debug and report the traceback", ExitCode.INTERNAL)


if __name__ == "__main__":
    main()
