"""The commands but ``shrink``: ``check``, ``pack``, ``audit``, ``verify``, ``env``,
``matrix clean``, ``backends``. Each parses, claims its outputs, calls the library and prints;
holds no logic.
"""

from __future__ import annotations

import json
import os
import re
import sys

import click

from reprokit import api as session
from reprokit.audit import audit as run_audit
from reprokit.cli.app import cli, engine_log, writing
from reprokit.cli.options import (
    AUDIT_FILES,
    CHECK_FILES,
    FORCE,
    MEMORY_BOUND,
    TORCH_FILES,
    NumberRange,
    as_args,
    ensure_out_file,
    files_read,
    from_torch,
    given,
    make_run_options,
    run_options,
    torch_files,
    torch_options,
    torch_summary,
)
from reprokit.cli.progress import Ticker
from reprokit.console import (
    err,
    print_audit,
    print_backends,
    print_check,
    print_env,
    print_pack,
    print_torch,
    print_verify,
)
from reprokit.engine import floatref
from reprokit.engine.backends import backend_class, engine_names
from reprokit.engine.envinfo import fingerprint
from reprokit.engine.inputs import (
    feed_dtype,
    feed_shape,
    save_feeds,
)
from reprokit.errors import ArchiveNotReproduced, ExitCode, UsageError
from reprokit.files import atomic_text, atomic_write, claim_file, claim_folder
from reprokit.matrix.cli import clean_matrix_envs, verify_matrix
from reprokit.matrix.fanout import check_many
from reprokit.report import bundle as report
from reprokit.report import verify as verifying
from reprokit.spec import parse_target
from reprokit.torch_export import columns as torch_columns


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
@MEMORY_BOUND
@FORCE
@click.pass_context
def check(ctx, models, target, layerwise, top, out_dir, as_json, ray_address, gpus, jobs, force, **kw):
    """Does TARGET diverge from the reference on MODEL? Exit 0 agree, 1 diverge (several
    MODELs: 1 if any diverges)."""
    if len(models) > 1 or ray_address or gpus:  # a zoo sweep: one `reprokit check` per model

        passed = [a for p in ctx.command.params if p.name not in ("models", "ray_address", "gpus", "jobs", "out_dir",
                                                                  "as_json", "memory_bound") and given(ctx, p.name)
                  for a in as_args(p, ctx.params[p.name])]
        sys.exit(check_many(list(models), passed, out_dir=out_dir, as_json=as_json, ray_address=ray_address,
                            gpus=gpus, jobs=jobs))
    model = models[0] if models else None

    reads = files_read(model, kw)
    options = make_run_options(kw)
    parse_target(target)  # a bad spec is a usage error before any work
    if out_dir:
        claim_folder(out_dir, CHECK_FILES + torch_files(kw), reads, force=force)
        writing(out_dir)
    engine_log(out_dir)
    import tempfile

    scratch = tempfile.TemporaryDirectory(prefix="reprokit-torch-")  # --torch without -o: the export's folder
    model, exported = from_torch(model, kw, options, os.path.join(out_dir or scratch.name, "torch"))
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
        if result.quantized is not None:  # a quantized model: whose divergence (docs/quantized.md)
            payload["quantized"] = result.quantized.to_json()
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
@MEMORY_BOUND
@FORCE
def pack(model, target, out_path, fmt, redact, with_audit, as_json, force, **kw):
    """Bundle a small diverging MODEL into a report archive ready to file."""
    reads = files_read(model, kw)
    if kw.get("reference_model") and not kw.get("torch_entry"):  # a quantized MODEL: check's, refused
        floatref.refuse_outside_check(model, kw["reference_model"], "pack")
    stem = re.sub(r"(\.tar\.gz|\.tgz|\.zip)$", "", out_path)
    ensure_out_file(out_path)
    claim_file(out_path, reads, force=force)
    writing(out_path)
    if with_audit:
        claim_folder(stem + ".audit", AUDIT_FILES, reads, force=force)
    if kw.get("torch_entry"):
        claim_folder(stem + ".torch", TORCH_FILES, reads, force=force)
    options = make_run_options(kw, "pack")
    on_event = Ticker(quiet=as_json)
    context = audit_dir = None
    model, exported = from_torch(model, kw, options, stem + ".torch")
    torch_info = torch_summary(exported, options, os.path.dirname(exported.folder) if exported else "", as_json)
    if with_audit:  # --- audit (reprokit/audit)
        audit_dir = stem + ".audit"
        audited = run_audit(model, target, audit_dir, options=options, on_event=on_event)
        context = audited.issue_context()
    if torch_info is not None:  # the archive records the torch version and export settings
        context = {**(context or {}), "torch": torch_info}
    result = report.pack(model, target, out_path, options=options, fmt=fmt, redact=redact,
                         on_event=on_event, context=context, audit_dir=audit_dir)
    on_event.close()
    payload = {"schema": "reprokit.pack/1", "archive": result.archive, "reproduces": result.reproduces,
               "notes": result.notes, "redaction": result.redaction, "verdict": result.verdict.to_json()}
    if not as_json:
        print_pack(result)
    if not result.reproduces:  # the archive is the deliverable: exit 0 only when its repro.py reproduces
        raise ArchiveNotReproduced(result.archive, payload if as_json else None)  # --json: one object, the error's
    if as_json:
        click.echo(json.dumps(payload, indent=2))


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
@MEMORY_BOUND
@FORCE
def audit(model, target, out_dir, no_sweep, no_explain, ranges_only, as_json, force, **kw):
    """Why does MODEL diverge under TARGET, and which setting avoids it? Exit 0 when written."""
    reads = files_read(model, kw)
    options = make_run_options(kw, "audit")
    # a quantized MODEL's float original is taken (the calibration diagnosis measures against it)
    if options.reference_model and (kw.get("torch_entry") or not floatref.is_quantized_file(model)):
        raise UsageError("audit does not take --reference-model yet",
                         hint="reprokit shrink CONVERTED.onnx --reference-model FP32.onnx finds the node and the "
                              "AutoCast exclusion that fixes it")
    claim_folder(out_dir, AUDIT_FILES + ("engine.log",) + torch_files(kw), reads, force=force)
    writing(out_dir)
    engine_log(out_dir)
    model, exported = from_torch(model, kw, options, os.path.join(out_dir, "torch"))
    torch_summary(exported, options, out_dir, as_json)
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
@click.option("--timeout", type=NumberRange(min=0, min_open=True), default=None,
              help="Seconds per engine call [default: 600; for an archive whose verdict is a timeout, the "
                   "--timeout of the run that packed it].")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--versions", default=None, metavar="SPEC",
              help="Rerun the archive per engine release, each in its own uv environment, e.g. "
                   "'onnxruntime==1.28.0,1.29.0,latest' or 'openvino>=2024.0' (docs/matrix.md). Each cell runs "
                   "reprokit's own reproducer on the archive's model, inputs and verdict, never the archive's "
                   "repro.py (see --run-archive-code). Needs reprokit[matrix].")
@click.option("--bisect", is_flag=True, help="--versions: find where the outcome changes in the range (~log2 n envs).")
@click.option("--ray", "ray_address", default=None, metavar="ADDRESS|auto|local",
              help="--versions: run each cell as a Ray task (auto: the running cluster; local: start one here).")
@click.option("--gpus", default=None, metavar="KINDS", help="--versions on Ray: one cell per GPU kind, e.g. L4,A100 "
              "(num_gpus=1, accelerator_type=KIND).")
@click.option("--jobs", "-j", default=2, show_default=True, type=click.IntRange(1, 64),
              help="--versions without --ray: cells run at once.")
@click.option("--out", "-o", "out_path", default=None, metavar="FILE",
              help="--versions: the new archive with matrix.json (default: ARCHIVE's name + .matrix.tar.gz).")
@click.option("--run-archive-code", is_flag=True,
              help="--versions: RISK: run the archive's own repro.py, code its sender wrote, in every cell (and "
                   "on every Ray worker) instead of reprokit's reproducer. Only for an archive you trust.")
@MEMORY_BOUND
@FORCE
def verify(archive, target, timeout, as_json, versions, bisect, ray_address, gpus, jobs, out_path, force,
           run_archive_code):
    """Does the divergence in a report ARCHIVE reproduce here? Exit 1 yes, 0 no (the outputs agree),
    12 it fails here but not as recorded (another kind, or another build-error message).
    With --versions: on which engine releases? A table in a new archive: exit 0 when at least one
    release ran, 9 when none could (nothing written) or --bisect judged fewer than two."""
    if versions is None and (bisect or ray_address or gpus or out_path or force or run_archive_code):
        raise UsageError("--bisect, --ray, --gpus, --out, --run-archive-code and --force go with --versions",
                         hint="e.g. reprokit verify "
                         "report.tar.gz --versions 'onnxruntime>=1.20' --bisect")
    if versions is not None:
        verify_matrix(archive, versions, target=target, timeout=timeout or 600.0, as_json=as_json, bisect=bisect,
                      ray_address=ray_address, gpus=gpus, jobs=jobs, out_path=out_path, force=force,
                      run_archive_code=run_archive_code)
        return
    result = verifying.verify(archive, target, timeout=timeout)
    if as_json:
        click.echo(json.dumps({"schema": "reprokit.verify/1", "archive": archive, "target": result.target,
                               "reproduces": result.reproduces, "outcome": result.outcome,
                               "recorded": result.recorded,
                               "verdict": result.verdict.to_json()}, indent=2, default=str))
    else:
        print_verify(result, archive)
    # a failure here that is not the recorded one is neither the bug nor agreement: its own code, so a
    # script triaging archives never reads it as 'does not reproduce' (0) or 'reproduces' (1)
    sys.exit(ExitCode.DIVERGES if result.reproduces else
             ExitCode.DIVERGES_DIFFERENTLY if result.outcome == "diverges differently" else ExitCode.OK)


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
