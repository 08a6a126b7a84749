"""``shrink --resume DIR``'s rules: every option not given again comes from DIR's saved run; a
changed option other than the budget and limits is a usage error (the journal's verdicts were
made under them); a model changed on disk, or a finished run whose result was removed, is exit 3;
a finished run is said as such and changed in nothing. Holds no search logic.
"""

from __future__ import annotations

import json
import os
import shlex

import click

from reprokit.cli.options import given
from reprokit.console import err
from reprokit.engine.inputs import parse_shape_args, parse_val_ranges
from reprokit.errors import ArchiveNotReproduced, InputError, UsageError
from reprokit.shrink import steps as shrinking
from reprokit.shrink.runstate import after_search_pending, changed_model, finished_run, result_gone


def resumed(ctx, resume: str, out_dir: str, model, target, flags: dict, kw: dict, as_json: bool):
    """``--resume DIR``: every option not given again comes from DIR's saved run (``flags``, the
    command's own, and ``kw``, the run options, are updated in place). (out_dir, model, target,
    the summary of a search that ended before its audit or archive was written, else None);
    None when the run there has finished (said as such). A model changed on disk is exit 3."""
    if given(ctx, "out_dir") and os.path.abspath(out_dir) != os.path.abspath(resume):
        raise UsageError(f"--resume {resume} and -o {out_dir} name different directories",
                         hint=f"give one of them: reprokit shrink --resume {shlex.quote(resume)}")
    out_dir = resume
    saved = shrinking.saved_run(out_dir)
    before = ctx.command.make_context("shrink", list(saved["args"]))
    _refuse_changed(ctx, before, out_dir)  # a finished run too: its result was not made under them
    changed = changed_model(out_dir, model or saved["model"])
    if changed:  # the journal's verdicts, and a finished run's result, are of the model as it was
        what = "its external data" if changed == "weights" else "the file"
        raise InputError(f"--resume {out_dir}: the model {model or saved['model']} changed on disk since the run "
                         f"started ({what} differs)",
                         hint="restore the model the run started from, or start a new run with another -o directory")
    finished = finished_run(out_dir)
    if finished is not None and not after_search_pending(out_dir):
        _say_finished(out_dir, finished, as_json)
        return None
    model, target = model or saved["model"], target or saved["target"]
    for name, value in before.params.items():
        if given(before, name) and not given(ctx, name):
            if name in flags:
                flags[name] = value
            elif name in kw:
                kw[name] = value
    return out_dir, model, target, finished


# What a resumed run may change: its budget and limits, how often the result is replayed (the
# flaky verdict's hint says: raise --replays), and what happens after the search.
# Anything else given again must equal the saved run's value: the journal's verdicts and the
# search's path were made under those options (a criterion, the feeds, the passes it ran).
RESUME_MAY_CHANGE = ("max_calls", "timeout", "jobs", "keep_state", "no_pack", "fmt", "redact", "with_audit",
                     "with_overlay", "max_activation_disk", "capture_chunk", "pack_memory", "replays")
_NOT_OPTIONS = ("model", "target", "out_dir", "resume", "as_json", "force")


def _refuse_changed(ctx, before, out_dir: str) -> None:
    """A usage error (exit 2) naming every option given again with another value than the run
    in ``out_dir`` was started with (``before``: its saved arguments, parsed)."""
    changed = [name for name, value in before.params.items()
               if name not in RESUME_MAY_CHANGE + _NOT_OPTIONS and given(ctx, name)
               and _meaning(name, ctx.params[name]) != _meaning(name, value)]
    if not changed:
        return
    opts = {p.name: p.opts[0] for p in ctx.command.params}
    words = "; ".join(f"{opts[n]} {_shown(ctx.params[n])} (the run: {_shown(before.params[n])})" for n in changed)
    may = ", ".join(opts[n] for n in RESUME_MAY_CHANGE)
    raise UsageError(f"--resume {out_dir}: {words} {'differs' if len(changed) == 1 else 'differ'} from the run "
                     "being resumed",
                     hint=f"resume without {'it' if len(changed) == 1 else 'them'} (the run's own options are "
                          f"used; only {may} may change), or start a new run with another -o directory")


def _meaning(name: str, value):
    """An option's value as the run reads it: run.json saves shapes one per option, ranges as
    floats and --inputs as an absolute path, which the user need not retype alike."""
    if name == "input_shapes":
        return parse_shape_args(value)
    if name == "val_range":
        return parse_val_ranges(value)
    if name == "inputs" and value:
        return os.path.abspath(value)
    return value


def _shown(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (tuple, list)):
        return " ".join(map(str, value)) or "none"
    return "default" if value is None else str(value)


def _say_finished(out_dir: str, summary: dict, as_json: bool) -> None:
    """--resume of a run that already ended with its answer: say so, change nothing (an archive
    whose repro.py did not reproduce is exit 10 again: nothing changed that). A result removed
    since is no result kept: exit 3 naming what is gone (it said "kept as it is" over nothing)."""
    gone = result_gone(out_dir, summary)
    if gone:
        raise InputError(f"{out_dir} holds a finished run whose result is gone: {', '.join(gone)} (removed since "
                         "the run ended)",
                         hint="shrink again into a new -o directory (the run's captured state went when it ended)")
    if summary.get("report_reproduces") is False and summary.get("report"):
        if not as_json:
            err.print(f"{out_dir} holds a finished run; nothing to continue, the result is kept as it is.")
        raise ArchiveNotReproduced(summary["report"], summary if as_json else None,
                                   stands=f"what the run judged ({out_dir}/summary.json)")
    if as_json:
        click.echo(json.dumps(summary, indent=2, default=str))
        return
    minimal = summary.get("minimal") or {}
    what = (f"a minimal model of {minimal.get('nodes')} nodes" if summary.get("status") == "done"
            else "an accumulated error (summary.json: attribution)")
    err.print(f"{out_dir} holds a finished run ({what}, {summary.get('calls', {}).get('target')} target calls); "
              "nothing to continue, the result is kept as it is. To start over, use a new -o directory.")
