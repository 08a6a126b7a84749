"""``reprokit shrink``: its options, the run and its archive (the resume rules: cli/resuming.py).
Holds no logic.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import replace

import click

from reprokit.audit import audit as run_audit
from reprokit.cli import resuming
from reprokit.cli.app import cli, engine_log, writing
from reprokit.cli.options import (
    AUDIT_FILES,
    FORCE,
    MEMORY_BOUND,
    SHRINK_FILES,
    SHRINK_ONLY,
    as_args,
    files_read,
    from_torch,
    make_run_options,
    parse_max_calls,
    parse_size,
    run_options,
    torch_files,
    torch_options,
    torch_summary,
)
from reprokit.cli.progress import Ticker
from reprokit.console import (
    err,
    print_shrink,
)
from reprokit.engine import floatref
from reprokit.errors import ArchiveNotReproduced, ExitCode, ReprokitError, UsageError
from reprokit.files import claim_folder
from reprokit.shrink import steps as shrinking
from reprokit.shrink.budget import Limits
from reprokit.shrink.clock import StepClock, process_started
from reprokit.shrink.final import ShrinkResult
from reprokit.shrink.output import close_summary, pack_accumulated
from reprokit.shrink.runstate import (
    STATE_DIR,
    clear_after_search,
    drop_state,
    mark_after_search,
    state_bytes,
    stopped_at_budget,
)
from reprokit.spec import parse_target


@cli.command()
@click.argument("model", required=False)
@click.option("--target", "-t", default=None,
              help="Target spec, e.g. trt:fp16, emulate:fp16, openvino:bf16 (required unless --resume DIR).")
@run_options
@torch_options
@click.option("--out", "-o", "out_dir", default="reprokit-out", show_default=True, metavar="DIR",
              help="Where minimal.onnx, inputs.npz and summary.json go (rewritten after every step).")
@click.option("--jobs", "-j", default=1, show_default=True, type=click.IntRange(1, 64),
              help="Evaluate candidates one by one in parallel; the result is the same for every N. Only "
                   "with --max-calls 0 and a search that judges candidates one by one (--one-by-one, or a "
                   "pass/fail check's window and ddmin): under the auto call budget, and where candidates are "
                   "packed into one engine call, N does nothing.")
@click.option("--replays", default=None, type=click.IntRange(0, 10),
              help="Extra runs of the original and of the result to detect a flaky target. Default: none "
                   "for deterministic engines; otherwise the original once and the result once. A pass/fail "
                   "cmd check's failing original is not replayed: its N replays go to the result, which fails "
                   "1 + 2N fresh runs, one fewer after a calibration pack or the Identity probe (default: 3, or 2); an "
                   "original that passes runs again all the same. A numeric cmd check's outputs are judged as "
                   "a built-in engine's.")
@click.option("--resume", "resume", is_flag=False, flag_value="", default=None, metavar="[DIR]",
              help="Continue an interrupted or budget-stopped run: --resume DIR alone takes the model, target "
                   "and run options from DIR; plain --resume continues the same command's --out.")
@click.option("--max-activation-disk", default=None, metavar="SIZE",
              help="Stop with an error if the captured activations would pass SIZE (e.g. 20G, 500M).")
@click.option("--max-calls", default="auto", show_default=True, metavar="N|auto",
              help="Target calls in all (engine builds). auto: about polygraphy's bisect cost; 0: no limit.")
@click.option("--capture-chunk", default="1G", show_default=True, metavar="SIZE",
              help="Activations one reference run may return at once; more runs when the model needs more.")
@click.option("--pack-memory", default="auto", show_default=True, metavar="SIZE|auto",
              help="Data one packed target call may hold (feeds, outputs, weights of its members); more "
                   "calls when the candidates need more. auto: from the model's size and the engine.")
@click.option("--pack-by", type=click.Choice(["auto", "build-cost", "count"]), default="auto", show_default=True,
              help="How numeric candidates are packed into target calls. count: as few calls as the pack limits "
                   "allow; build-cost: as few estimated TensorRT build seconds (shrink/buildcost.py's fit: a "
                   "sequence that stops at its first hit in chunks, riders only where they pay). auto: build-cost "
                   "on trt targets, count elsewhere.")
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
@click.option("--no-fold-constants", is_flag=True,
              help="Reduce the model as given: by default its constant subgraphs are folded first (as polygraphy's "
                   "surgeon sanitize --fold-constants; checked on the reference, node names kept).")
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
@MEMORY_BOUND
@FORCE
@click.pass_context
def shrink(ctx, model, target, out_dir, jobs, replays, resume, max_activation_disk, max_calls, capture_chunk,
           pack_memory, pack_by, no_localize, one_by_one, accept_milder, search_accumulated, no_reduce_inputs, no_reduce_outputs,
           no_shrink_shapes, no_fold_constants, no_pack, fmt, redact, with_audit, with_overlay, keep_state, as_json,
           force, **kw):
    """Cut MODEL down to a minimal model that shows the same divergence under TARGET."""
    clock = StepClock(process_started())  # summary.json's steps cover the process, start-up included

    flags = {name: ctx.params[name] for name in SHRINK_ONLY}  # the command's own options
    # --resume DIR: every option not given again comes from DIR's saved run; one given again must
    # agree with it, but for the few that may change. (Plain --resume repeats the whole command:
    # the run's fingerprint, search options included, refuses another run with exit 3.)
    after_search = None  # the summary of a search that ended before its audit or archive was written
    if resume:
        saved = resuming.resumed(ctx, resume, out_dir, model, target, flags, kw, as_json)
        if saved is None:  # nothing to continue: the answer on disk stays as it is
            return
        out_dir, model, target, after_search = saved
    (jobs, replays, max_activation_disk, max_calls, capture_chunk, pack_memory, pack_by, no_localize, one_by_one,
     accept_milder, search_accumulated, no_reduce_inputs, no_reduce_outputs, no_shrink_shapes, no_fold_constants, no_pack,
     fmt, redact, with_audit, with_overlay, keep_state) = (flags[name] for name in SHRINK_ONLY)
    run_args = [a for p in ctx.command.params if p.name in flags and flags[p.name] not in (None, p.default)
                for a in as_args(p, flags[p.name])]
    if (model is None and not kw.get("torch_entry")) or target is None:
        raise UsageError("shrink needs MODEL and --target (or --resume DIR of an earlier run)",
                         hint="e.g. reprokit shrink model.onnx --target emulate:fp16 -o out/")
    reads = files_read(model, kw)
    options = make_run_options(kw, "shrink")
    parse_target(target)  # a bad spec or a missing check script fails before any work
    if options.reference_model and not kw.get("torch_entry"):  # so does the float model of a quantized MODEL
        floatref.refuse_outside_check(model, options.reference_model, "shrink")
    # so does an output that would replace a file the run reads or one the user wrote
    claim_folder(out_dir, SHRINK_FILES + torch_files(kw) + (() if no_pack else (f"report.{fmt}",))
                 + (tuple(f"audit/{p}" for p in AUDIT_FILES) if with_audit or with_overlay else ()),
                 reads, force=force)
    writing(out_dir)
    if kw.get("torch_entry"):
        clock.begin("torch export")
    model, exported = from_torch(model, kw, options, os.path.join(out_dir, "torch"))
    torch_info = torch_summary(exported, options, out_dir, as_json)
    engine_log(out_dir, fresh=resume is None)
    progress = Ticker(stamp=True, quiet=as_json)  # a line at least every few seconds, in every step

    if after_search is not None:  # the search had ended: only its audit and archive are left to do
        minimal = os.path.join(out_dir, "minimal.onnx")
        result = ShrinkResult(after_search, out_dir, minimal if os.path.exists(minimal) else "", None, clock=clock)
        progress(f"{out_dir}: the search had ended ({result.summary.get('calls', {}).get('target')} target calls); "
                 "writing what it left unwritten")
    else:
        result = _search(model, target, out_dir, options, resume, progress, clock, run_args, as_json,
                         jobs=jobs, replays=replays, max_activation_disk=max_activation_disk, max_calls=max_calls,
                         capture_chunk=capture_chunk, pack_memory=pack_memory, pack_by=pack_by,
                         no_localize=no_localize,
                         one_by_one=one_by_one, accept_milder=accept_milder, search_accumulated=search_accumulated,
                         no_reduce_inputs=no_reduce_inputs, no_reduce_outputs=no_reduce_outputs,
                         no_shrink_shapes=no_shrink_shapes, no_fold_constants=no_fold_constants,
                         keep_state=keep_state)
    if torch_info is not None:
        result.summary["torch"] = torch_info
    after = ([] if no_pack else ["pack"]) + (["audit"] if with_audit or with_overlay else [])
    if after:
        mark_after_search(out_dir, after)  # an interrupt from here on is continued by --resume
    try:
        _audit_and_pack(result, model, target, options, out_dir, progress, clock, with_audit=with_audit,
                        with_overlay=with_overlay, no_pack=no_pack, fmt=fmt, redact=redact)
    except KeyboardInterrupt:
        raise ReprokitError("interrupted after the search, while writing its " + " and ".join(after),
                            hint=f"the minimal model is kept in {out_dir}; write the rest with: "
                                 f"reprokit shrink --resume {shlex.quote(out_dir)}",
                            exit_code=ExitCode.INTERRUPTED) from None
    clear_after_search(out_dir)
    progress.close()
    close_summary(result)  # every step's seconds, the archive's included, add up to wall_s
    if not as_json:
        print_shrink(result)
    if result.summary.get("report_reproduces") is False:  # the archive is the deliverable: not exit 0
        raise ArchiveNotReproduced(result.summary["report"], result.summary if as_json else None,
                                   stands=f"what the run judged ({out_dir}/summary.json"
                                          + (f", {os.path.basename(result.minimal_path)})" if result.minimal_path else ")"))
    if as_json:
        click.echo(json.dumps(result.summary, indent=2, default=str))


def _search(model, target, out_dir, options, resume, progress, clock, run_args, as_json, *, jobs, replays,
            max_activation_disk, max_calls, capture_chunk, pack_memory, pack_by, no_localize, one_by_one,
            accept_milder, search_accumulated, no_reduce_inputs, no_reduce_outputs, no_shrink_shapes, no_fold_constants,
            keep_state):
    """The search itself (shrink/steps.py); what it captured is removed or kept as it ends."""
    limits = Limits(
        capture_chunk_bytes=parse_size(capture_chunk, "--capture-chunk"),
        max_activation_disk_bytes=parse_size(max_activation_disk, "--max-activation-disk") if max_activation_disk else None,
        max_calls=parse_max_calls(max_calls),
        pack_memory_bytes=None if pack_memory.strip().lower() == "auto" else parse_size(pack_memory, "--pack-memory"),
        pack_by=pack_by,
    )
    try:  # the captured activations outlive the run only when it was interrupted, or with --keep-state
        result = shrinking.shrink(model, target, out_dir, options=options, jobs=jobs, replays=replays,
                                  resume=resume is not None, localize_first=not no_localize, on_event=progress,
                                  limits=limits, pack_candidates=not one_by_one,
                                  search_accumulated=search_accumulated, accept_milder=accept_milder,
                                  keep_inputs=no_reduce_inputs, keep_outputs=no_reduce_outputs,
                                  shrink_shapes=not no_shrink_shapes, clock=clock, run_args=tuple(run_args),
                                  fold_constants=not no_fold_constants)
    except KeyboardInterrupt:  # run.json holds every option: --resume DIR alone continues
        _end_state(out_dir, True, as_json, "for --resume")
        raise ReprokitError("interrupted", hint=shrinking.resume_hint(out_dir),
                            exit_code=ExitCode.INTERRUPTED) from None
    except BaseException:
        _end_state(out_dir, keep_state or stopped_at_budget(out_dir), as_json, _kept_why(keep_state))
        raise
    _end_state(out_dir, keep_state or stopped_at_budget(out_dir), as_json, _kept_why(keep_state))
    return result


def _audit_and_pack(result, model, target, options, out_dir: str, progress, clock, *, with_audit: bool,
                    with_overlay: bool, no_pack: bool, fmt: str, redact: bool) -> None:
    """After the run: Model Explorer overlays or the audit of the original model (naming what
    shrink kept), then the report archive (the whole model with the attribution, for an
    accumulated error)."""
    audited = None
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
        progress("packing the report archive (the drift window, else the whole model; with the attribution)")
        clock.begin("pack")

        packed = pack_accumulated(result, model, target, options, fmt=fmt, redact=redact, on_event=progress)
        if packed is not None:
            _add_notes(result.notes, packed.notes)
    if not no_pack and not accumulated:
        progress("packing the report archive")
        clock.begin("pack")
        packed = shrinking.pack_result(result, target, options, fmt=fmt, redact=redact, on_event=progress,
                                       audit=audited)
        result.summary["report"] = packed.archive
        _add_notes(result.notes, packed.notes)


def _add_notes(notes: list[str], more: list[str]) -> None:
    """The pack's notes the shrink has not said (a degenerate reference's warning: said by both)."""
    notes.extend(note for note in more if note.casefold() not in {said.casefold() for said in notes})


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


def _kept_why(keep_state: bool) -> str:
    # a run stopped at its call budget is one `--resume --max-calls` continues: it keeps what it captured
    return "(--keep-state)" if keep_state else "for --resume (stopped at the call budget)"


def _mib(size: int) -> str:
    return f"{size / 2**20:,.1f} MiB"
