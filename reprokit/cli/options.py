"""Options shared by the commands: the run options every engine-running command takes (and
their replay for ``shrink --resume``), ``--force`` and the files each command writes and reads,
``--torch``, sizes and budgets, and the checks on ``--out`` made before any engine runs. Holds no
logic.
"""

from __future__ import annotations

import errno
import json
import math
import os
import tempfile

import click

from reprokit import torch_export
from reprokit.api import RunOptions
from reprokit.console import err
from reprokit.engine.inputs import (
    parse_shape_args,
    parse_val_ranges,
)
from reprokit.engine.memorybound import ENV as MEMORY_ENV
from reprokit.engine.memorybound import parse_bound, parse_size  # noqa: F401  (parse_size: the commands' import)
from reprokit.errors import UsageError
from reprokit.files import read_paths
from reprokit.graph.io import file_outline
from reprokit.torch_export import reference_columns


class NumberRange(click.FloatRange):
    """``click.FloatRange`` that refuses NaN: every comparison with NaN is false, so
    ``FloatRange(min=0)`` let ``--tol nan`` through (every output then "diverged", exit 1, on a
    model that agrees) and ``--timeout nan`` (a check that never exits was never killed)."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if math.isnan(number):
            self.fail(f"{value!r} is not a number", param, ctx)
        return number


def run_options(func):
    """Options shared by every command that runs engines on a model."""
    options = [
        click.option("--reference", default="ort", show_default=True, help="Reference target spec."),
        click.option("--reference-model", default=None, metavar="FP32.onnx",
                     help="MODEL is your converted (fp16/mixed, explicit-precision) model and FP32.onnx its fp32 "
                          "original: the reference runs FP32.onnx, the target runs MODEL's cuts as written "
                          "(check, shrink)."),
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
        click.option("--tol", type=NumberRange(min=0), default=None,
                     help="Bound on the metric (default: by target precision, see README)."),
        click.option("--quant-reference", type=click.Choice(["fake-quant", "fp32"]), default="fake-quant",
                     show_default=True,
                     help="Quantized (Q/DQ) models: compare the target with the model's Q/DQ semantics run in "
                          "fp32 (fake-quant: the engine's error) or with its fp32 twin, Q/DQ dropped (fp32: the "
                          "quantization's error too). docs/quantized.md"),
        click.option("--atol", type=NumberRange(min=0), default=None, help="Absolute tolerance for allclose."),
        click.option("--ignore-positions", default=None, metavar="PATH",
                     help="An .npz of boolean arrays named as outputs: positions where True are left out of the "
                          "comparison (padded positions of a batch nobody reads)."),
        click.option("--rtol", type=NumberRange(min=0), default=None, help="Relative tolerance for allclose."),
        click.option("--timeout", type=NumberRange(min=0, min_open=True), default=600.0, show_default=True,
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


def _set_memory_bound(ctx, param, value):
    """Checked at once (exit 2), then handed to every engine worker (and verify --versions's
    cells) through the environment, where ``engine.memorybound.configured`` reads it."""
    if value is not None:
        parse_bound(value, "--memory-bound")
        os.environ[MEMORY_ENV] = value
    return value


MEMORY_BOUND = click.option(
    "--memory-bound", default=None, metavar="SIZE|auto|off", expose_value=False, callback=_set_memory_bound,
    help="Memory one engine process (onnxruntime, the emulator, OpenVINO) may allocate; past it the run stops "
         "with exit 11, no verdict. auto: half this machine's memory (env REPROKIT_MEMORY_BOUND sets the default).")


# What each command writes in its output folder (reprokit/files.py: claimed before any work).
CHECK_FILES = ("inputs.npz", "reference_outputs.npz", "target_outputs.npz", "verdict.json", "engine.log")


AUDIT_FILES = ("audit.json", "audit.md", "audit.html", "layerwise.png", "overlay-*.json")


SHRINK_FILES = ("minimal.onnx", "minimal.onnx.data", "minimal.target.onnx", "inputs.npz", "reference_outputs.npz", "summary.json",
                "engine.log")


TORCH_FILES = ("*",)


def torch_files(kw: dict) -> tuple:
    return tuple(f"torch/{p}" for p in TORCH_FILES) if kw.get("torch_entry") else ()


def files_read(model: str | None, kw: dict) -> list[str]:
    """Every file the command reads: the model, its external data, --inputs, the --torch script."""
    paths = [model, kw.get("inputs"), kw.get("reference_model"), (kw.get("torch_entry") or "").rpartition(":")[0] or None]
    if model and os.path.isfile(model):
        try:
            folder = os.path.dirname(os.path.abspath(model))
            paths += [os.path.join(folder, loc) for loc in file_outline(model).locations]
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


def from_torch(model, kw: dict, options, folder: str):
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


def torch_summary(exported, options, folder: str, as_json: bool) -> dict | None:
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


def parse_max_calls(text: str) -> int | None:
    if text.strip().lower() == "auto":
        return -1
    if not text.strip().isdigit():
        raise UsageError(f"--max-calls takes a number or 'auto', got {text!r}", hint="e.g. --max-calls 40, or 0 for no limit")
    return int(text) or None


def make_run_options(kw: dict, command: str = ""):
    if command and command != "check" and kw.get("quant_reference") == "fp32":
        # only check compares with the fp32 twin: refused before any work, never silently ignored
        raise UsageError(f"--quant-reference fp32 is for check: {command} compares with fake-quant, the model's "
                         "own Q/DQ semantics", hint="drop --quant-reference (docs/quantized.md)")
    return RunOptions(
        reference=kw.pop("reference"), metric=kw.pop("metric"), tolerance=kw.pop("tol"),
        atol=kw.pop("atol"), rtol=kw.pop("rtol"), timeout=kw.pop("timeout"),
        fail_regex=tuple(kw.pop("fail_regex")), fail_codes=tuple(kw.pop("fail_code")),
        ignore_fail_codes=tuple(kw.pop("ignore_fail_code")), inputs=kw.pop("inputs"), sample=kw.pop("sample"),
        seed=kw.pop("seed"), input_shapes=parse_shape_args(kw.pop("input_shapes")),
        val_ranges=parse_val_ranges(kw.pop("val_range")), reference_model=kw.pop("reference_model"),
        quant_reference=kw.pop("quant_reference", "fake-quant"),
        ignore_positions=kw.pop("ignore_positions"),
    )


# shrink's own options (beside the run options): kept in run.json, restored by --resume.
SHRINK_ONLY = ("jobs", "replays", "max_activation_disk", "max_calls", "capture_chunk", "pack_memory", "pack_by", "no_localize",
                "one_by_one", "accept_milder", "search_accumulated", "no_reduce_inputs", "no_reduce_outputs",
                "no_shrink_shapes", "no_fold_constants", "no_pack", "fmt", "redact", "with_audit", "with_overlay", "keep_state")


def given(ctx, name: str) -> bool:
    from click.core import ParameterSource

    return ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)


def as_args(param, value) -> list[str]:
    if getattr(param, "is_flag", False):
        return [param.opts[0]] if value else []
    if getattr(param, "multiple", False):  # repeatable options: once per value
        return [a for v in value for a in (param.opts[0], str(v))]
    return [param.opts[0], str(value)]


def ensure_out_file(path: str) -> None:
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
    try:  # os.access says yes to root everywhere (/proc, a read-only mount): create a file to know
        fd, probe = tempfile.mkstemp(prefix=".reprokit-probe-", dir=existing)
        os.close(fd)
        os.remove(probe)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):  # a full disk is said when the archive is written
            raise UsageError(f"cannot write --out {path}: {existing}: {exc.strerror}",
                             hint="choose a writable directory") from exc
