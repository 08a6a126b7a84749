"""The report archive: bundle a small diverging model with its inputs, both engines' outputs,
the verdict, an environment fingerprint, polygraphy commands and logs, a standalone repro.py, a
ready-to-file ISSUE.md, a README and a manifest (a ``cmd:`` target's own files: ``checkfiles.py``).
Verifying an archive someone sent is :mod:`reprokit.report.verify`'s.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

from reprokit import __version__
from reprokit.engine.bug import shows_bug
from reprokit.engine.envinfo import fingerprint
from reprokit.engine.envinfo import redact as redact_env
from reprokit.engine.session import RunOptions, check
from reprokit.errors import InputError, NothingToReduce, UsageError
from reprokit.graph.io import (
    external_locations,
    fits_inline,
    inline_external_data,
    load_model,
    save_model,
)
from reprokit.report.archive import write_archive, write_manifest
from reprokit.report.checkfiles import bundle_check_files, check_note
from reprokit.report.conversion import early_conversion, settled, write_conversion
from reprokit.report.describe import (
    describe,
    environment_lines,
    polygraphy_command,
    polygraphy_note,
    reference_parts,
    title,
    trtexec_command,
)
from reprokit.report.logs import (
    Logs,
    drop_early,
    early_kept,
    early_logs,
    finish_logs,
    start_logs,
    stop_logs,
    write_inputs_for_tools,
)
from reprokit.report.redact import private_strings, redact, scrub_tree
from reprokit.report.render import render
from reprokit.report.reprorun import Started, engine_seconds_within, read_times, repro_argv
from reprokit.report.reprovalues import ENGINE_PACKAGES, criterion_words, repro_values
from reprokit.report.trtcommands import trt_values
from reprokit.report.twincommands import twin_commands
from reprokit.report.upstream import issue_template, upstream_values
from reprokit.spec import TargetSpec, parse_target
from reprokit.standalone.arrays import save_npz


@dataclass
class PackResult:
    archive: str
    verdict: object
    reproduces: bool  # repro.py, run here, exited 1
    notes: list[str] = field(default_factory=list)
    redaction: dict | None = None
    engine_seconds: float = 0.0  # its checks' engine runs (worker processes), for shrink's accounts
    # the seconds it waited, its own writing done, for repro.py's and polygraphy's processes: what
    # of the archive's wall is those processes' (their start-up, imports and engine runs alike)
    tool_seconds: float = 0.0
    # of that wait, the seconds during which an engine run in them was going, as they recorded it
    # (reprorun.ENGINE_TIMES); the rest of the wait is their interpreters, imports and loading
    tool_engine_seconds: float = 0.0


def pack(model_path: str, target: str, out_path: str, *, options: RunOptions | None = None,
         fmt: str | None = None, redact: bool = False, context: dict | None = None, on_event=None,
         audit_dir: str | None = None) -> PackResult:
    """Check the model once more, then write the archive ``out_path`` (.tar.gz or .zip).
    ``audit_dir`` (a ``reprokit audit`` output folder) goes into the archive as audit/."""
    options = options or RunOptions()
    if redact and options.reference_model:
        raise UsageError("--redact does not work with --reference-model yet (two models to redact alike)",
                         hint="pack without --redact")
    event = on_event or (lambda text: None)
    spec = parse_target(target)  # parsed once: the bundle and the manifest read the typed spec
    fmt = fmt or ("zip" if out_path.endswith(".zip") else "tar.gz")
    name = re.sub(r"(\.tar\.gz|\.tgz|\.zip)$", "", os.path.basename(out_path)) or "report"
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="reprokit-pack-") as tmp:
        stage = os.path.join(tmp, name)
        early = None if redact else early_logs(model_path, options, spec, stage, event)
        converting = early_conversion(model_path, spec, stage) if early is not None else None
        try:  # every way out stops the early runs and waits for the early conversion: no orphan
            event(f"checking {model_path} under {target}")
            result = check(model_path, target, options=options, workdir=os.path.join(tmp, "check"))
            engine_seconds = result.engine_seconds
            if not result.verdict.diverges:
                raise NothingToReduce(
                    f"{model_path} does not diverge under {target} ({result.verdict.criterion.describe()}): "
                    "nothing to pack", hint="pack a model that `reprokit check` reports as diverging")
            notes.extend(f"WARNING: {w}" for w in result.verdict.warnings)  # a degenerate reference
            redaction = None
            if redact:
                event("redacting and checking that the redacted model still diverges")
                result, redaction = _redacted(result, target, options, tmp, notes)
                engine_seconds += result.engine_seconds
            os.makedirs(os.path.join(stage, "logs"), exist_ok=True)
            if options.reference_model:  # the user's converted cut, the target's model (repro.py runs it)
                save_model(load_model(model_path, load_weights=False), os.path.join(stage, "model.target.onnx"),
                           base_dir=os.path.dirname(os.path.abspath(model_path)), self_contained=True)
            event("writing the bundle")
            waited: dict[str, float] = {}
            reproduces = _write_bundle(stage, result, spec, options, context, redaction, name, fmt, notes, event,
                                       model_path=os.fspath(model_path), waited=waited, early=early,
                                       converting=converting)
        finally:
            if early is not None:  # done runs: nothing to stop
                stop_logs(early)
            settled(converting)
        if audit_dir and redact:
            notes.append("audit/ left out of the archive: it names the original nodes, and --redact asks for none")
        elif audit_dir:
            # the folder's ledger (.reprokit/owned.json, reprokit/files.py) is not part of the audit
            shutil.copytree(audit_dir, os.path.join(stage, "audit"), ignore=shutil.ignore_patterns(".reprokit"))
        extra = {"reprokit": __version__, "target": str(spec)}
        if context and context.get("torch"):  # --torch: the export settings and the exporter column
            with open(os.path.join(stage, "torch.json"), "w") as handle:
                json.dump(context["torch"], handle, indent=2, default=str)
            extra["torch"] = {k: context["torch"]["export"].get(k) for k in ("torch", "exporter", "dynamo", "opset")}
        if redaction:  # every text file, logs included: no venv, home, host or temp path leaves
            scrub_tree(stage, private_strings(stage, model_path))
        write_manifest(stage, extra)
        os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
        write_archive(stage, out_path, fmt)
    return PackResult(out_path, result.verdict, reproduces, notes, redaction, engine_seconds,
                      round(waited.get("seconds", 0.0), 3), round(waited.get("engine_seconds", 0.0), 3))


def _redacted(result, target, options, tmp, notes):
    feeds = result.prepared.feeds.arrays
    model = result.prepared.model
    model = inline_external_data(type(model).FromString(model.SerializeToString()), result.prepared.base_dir)
    for randomize in (True, False):
        red = redact(model, feeds, randomize_weights=randomize)
        path = save_model(red.model, os.path.join(tmp, f"redacted-{randomize}.onnx"))
        inputs = os.path.join(tmp, f"redacted-{randomize}.npz")
        save_npz(inputs, red.feeds)
        again = check(path, target, options=_with_inputs(options, inputs, red.names),
                      workdir=os.path.join(tmp, f"red-{randomize}"))
        if shows_bug(result.verdict.signature, again.verdict):
            info = {"renamed_tensors": len(red.names), "randomized_weights": len(red.randomized),
                    "weights": "replaced by random values (same shape, mean, std)" if randomize else "KEPT",
                    # kind and detail only: output names would leak the real tensor names
                    "verdict_before": _kind_words(result.verdict.signature),
                    "verdict_after": _kind_words(again.verdict.signature)}
            if not randomize:
                notes.append("WARNING: with random weights the divergence does NOT reproduce; the real "
                             "weights were KEPT in the archive (names, doc strings and metadata are redacted)")
            return again, info
    raise InputError("the redacted model no longer diverges, even with the real weights kept",
                     hint="pack without --redact, or share the model another way")


def _kind_words(signature) -> str:
    return signature.kind.value + (f" ({signature.detail})" if signature.detail else "")


def _with_inputs(options: RunOptions, inputs: str, names: dict) -> RunOptions:
    """The options that check the redacted model: its one sample, and a recorded step table (a
    quantized shrink's) under the redacted names."""
    from dataclasses import replace

    table = options.quant_steps
    if table is not None:
        table = {**table, "steps": {names.get(k, k): v for k, v in table["steps"].items()},
                 "after_quantized": [names.get(k, k) for k in table.get("after_quantized", ())]}
    return replace(options, inputs=inputs, sample=None, input_shapes={}, val_ranges={}, quant_steps=table)


def _write_bundle(stage, result, spec: TargetSpec, options, context, redaction, name, fmt, notes, event,
                  model_path: str = "", waited: dict | None = None, early: Logs | None = None,
                  converting: Future | None = None) -> bool:
    verdict = result.verdict
    feeds = result.prepared.feeds.arrays
    model = result.prepared.model
    if early is not None and not early_kept(early, feeds, _file_is_model(result, redaction, model_path)):
        drop_early(early)  # the check ran another file or other feeds: polygraphy runs what the archive holds
        early = None
        if converting is not None:  # converted from that file: made again from the checked model
            settled(converting)
            converting = None
            for narrow in ("fp16", "bf16"):
                if os.path.exists(os.path.join(stage, f"model.{narrow}.onnx")):
                    os.remove(os.path.join(stage, f"model.{narrow}.onnx"))
    if early is None:
        _write_model(stage, result, redaction, model_path)
    for line in early.said if early is not None else []:
        event(line)  # kept: the archive's logs/ exist now, so they are named
    save_npz(os.path.join(stage, "inputs.npz"), feeds)
    save_npz(os.path.join(stage, "reference_outputs.npz"), result.reference_outputs)
    save_npz(os.path.join(stage, "target_outputs.npz"), result.target_outputs)
    bins = early.bins if early is not None else write_inputs_for_tools(stage, feeds)
    spec, bundled, needed = bundle_check_files(stage, spec)
    recorded = {**verdict.to_json(), "check_policy": options.policy().to_json(), "reprokit": __version__,
                "redaction": redaction, "timeout": options.timeout}
    if result.quant is not None:  # a quantized model: its outputs' steps, so repro.py and verify judge alike
        recorded["quant_steps"] = result.quant.recorded(o.name for o in model.graph.output)
    recorded = json.loads(json.dumps(recorded, default=str))  # exactly what verdict.json holds
    with open(os.path.join(stage, "verdict.json"), "w") as handle:
        json.dump(recorded, handle, indent=2)
    env = fingerprint()
    if redaction:
        env = redact_env(env)
    with open(os.path.join(stage, "env.json"), "w") as handle:
        json.dump(env, handle, indent=2)
    archive_name = f"{name}.{fmt}"
    # repro.py's values: the one builder, from the verdict just recorded (the matrix's reproducer
    # renders reprokit's own repro.py from an archive's verdict.json with it too)
    repro = repro_values(recorded, target=str(spec), bundled=bundled, needs=needed)
    values = _template_values(result, spec, env, context, archive_name, model, bins, recorded)
    values["twin"] = bool(options.reference_model)  # model.target.onnx: the user's converted cut
    with open(os.path.join(stage, "repro.py"), "w") as handle:
        handle.write(render("repro.py.j2", **repro))
    os.chmod(os.path.join(stage, "repro.py"), 0o755)
    # on a GPU (TensorRT, CUDA, a check command's maybe) one process at a time, and repro.py may
    # build the converted model: it is written first. On CPU engines repro.py reads model.onnx
    # alone: it and polygraphy's runs start now and the conversion is written while they run (a
    # Swin window's 96 MB: its conversion and save overlap their start-up and model loading)
    alone = spec.engine in ("trt", "cmd") or spec.has("cuda")
    conversion = write_conversion(stage, result.prepared.model, result.prepared.base_dir, spec) if alone else None
    event("running the bundled repro.py")
    # repro.py gives each engine call the run's --timeout itself (a hang is a verdict there too);
    # the margin covers its own start and the reference run
    times = os.path.join(os.path.dirname(stage), ".engine-times-repro")  # beside the stage, never in the archive
    with Started(repro_argv(), stage, os.path.dirname(stage), timeout=max(60.0, options.timeout + 60.0),
                 times=times) as started:
        logs = None if alone else early or start_logs(stage, result, spec, values, event, together=True)
        if logs is not None:
            logs.result = result
        try:
            if not alone:
                conversion = (converting.result() if converting is not None
                              else write_conversion(stage, result.prepared.model, result.prepared.base_dir, spec))
            values.update(trt_values(spec, verdict, model, bins, env, values["engine_packages"], conversion))
            if values["twin"]:  # TensorRT builds the converted cut as written: strongly typed, two polygraphy runs
                values.update(twin_commands(spec, verdict, bins), polygraphy_note="")
                # the user's converted cut is the explicit-precision model: no weakly typed form of the fp32
                # cut and no conversion of reprokit's own stand beside it
                values.update(trt_forms=[], converted="", converted_file=None)
            values.update({key: repro[key] for key in ("settings", "engine_requirement", "alternative")})
            values.update(upstream_values(spec, env))  # the engine's own issue form: its fields, command, release link
            if spec.engine == "cmd":
                values["command_heading"] = "The check command on the bundled files (also in `commands.sh`):"
                values["check_note"] = check_note(bundled, needed)
            with open(os.path.join(stage, "commands.sh"), "w") as handle:
                handle.write(render("commands.sh.j2", **values))
            os.chmod(os.path.join(stage, "commands.sh"), 0o755)
        except BaseException:
            if logs is not None:
                stop_logs(logs)
            raise
        since = time.time()  # epoch seconds: the tools record their engine runs so
        if alone:
            ran = started.result()
            logs = start_logs(stage, result, spec, values, event)
            finish_logs(logs)
        else:
            finish_logs(logs)
            ran = started.result()
        if waited is not None:
            until = time.time()
            waited["seconds"] = until - since
            waited["engine_seconds"] = engine_seconds_within(read_times(times) + logs.engine_runs(), since, until)
    reproduces = ran.returncode == 1 and "REPRODUCES" in ran.stdout
    if not reproduces:
        notes.append(f"WARNING: repro.py did not reproduce here (exit {ran.returncode}); see logs/repro.log")
    with open(os.path.join(stage, "logs", "repro.log"), "w") as handle:
        handle.write(f"$ python repro.py\n{ran.stdout}{ran.stderr}\n[exit code {ran.returncode}]\n")
    values["repro_output"] = ran.stdout.strip() + f"\n[exit code {ran.returncode}]"
    with open(os.path.join(stage, "ISSUE.md"), "w") as handle:
        handle.write(render(issue_template(spec), **values))
    with open(os.path.join(stage, "README.md"), "w") as handle:
        handle.write(render("README.md.j2", **values))
    return reproduces


def _write_model(stage: str, result, redaction, model_path: str) -> None:
    """model.onnx: the checked file's own bytes when it is the model as checked, holds its
    weights and stays one file (a shrink's window or minimal model: no parse-and-serialize of its
    weights a second time), else the model saved with its weights read in (past 2 GB, beside it)."""
    prepared = result.prepared
    target = os.path.join(stage, "model.onnx")
    if _file_is_model(result, redaction, model_path):
        shutil.copyfile(prepared.path, target)
        return
    save_model(prepared.model, target, base_dir=prepared.base_dir, self_contained=True)


def _file_is_model(result, redaction, model_path: str) -> bool:
    """Is the user's file, byte for byte, the model.onnx the archive holds?"""
    prepared = result.prepared
    return bool(not redaction and os.path.isfile(prepared.path) and not external_locations(prepared.model) and (
        os.path.abspath(prepared.path) == os.path.abspath(model_path or "")) and fits_inline(prepared.model))


def _template_values(result, spec, env, context, archive_name, model, bins, recorded) -> dict:
    """The words of ISSUE.md, README.md and commands.sh (repro.py's are ``repro_values``')."""
    verdict = result.verdict
    nodes = [n for n in model.graph.node]
    ops = sorted({n.op_type for n in nodes})
    return {
        "version": __version__, "title": title(verdict, spec, env, ops), "verdict": verdict,
        "description": describe(verdict, spec, model, context, (recorded.get("quant_steps") or {}).get("steps")),
        "context": context,
        "mode": verdict.target_meta.get("mode", spec.engine), "sweep": (context or {}).get("sweep"),
        "env_lines": environment_lines(env, verdict.target_meta), "archive_name": archive_name, "nodes": len(nodes), "ops": ops,
        "opset": next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), "?"),
        "engine_packages": ENGINE_PACKAGES[spec.engine],
        "reference": verdict.reference, "target": verdict.target, "criterion": criterion_words(recorded),
        "polygraphy_command": polygraphy_command(spec, verdict, model), "trtexec_command": trtexec_command(spec, bins),
        "polygraphy_note": polygraphy_note(spec),
        "latest_release": _latest_release(spec, env), "other_frameworks": _other_frameworks(env, verdict.reference),
        "repro_output": "",
    }


def _latest_release(spec, env) -> str:
    version = env["tensorrt"]["version"]
    if spec.engine == "trt" and version:
        package = env["tensorrt"].get("distribution") or "tensorrt"
        if "rtx" in package:  # TensorRT-RTX: not a package the matrix varies
            return f"Reproduced with TensorRT {version} (see Environment). Not yet tried with a newer release."
        return (f"Reproduced with TensorRT {version} (see Environment). Not yet tried with a newer release: "
                f"`reprokit verify ARCHIVE --versions '{package}>={version}' --bisect --ray auto --gpus KIND` "
                "runs `repro.py` on each newer release (docs/matrix.md).")
    return ("Not run on TensorRT: this archive was made on a machine without it, with the target "
            f"`{spec}`. `commands.sh` has the TensorRT command to run with the latest release.")


def _other_frameworks(env, reference: str) -> str:
    """The answer to "tried another framework?": the archive's own reference, as it was run."""
    name, setting = reference_parts(reference)
    package = {"ONNX Runtime": "onnxruntime", "OpenVINO": "openvino"}.get(name)
    version = f" {env['packages'].get(package) or '?'}" if package else ""
    if name == "ONNX Runtime" and "optimizations" not in setting:
        setting += ", graph optimizations off"
    return (f"Yes. {name}{version} ({setting}) runs the model with finite outputs: `reference_outputs.npz`, "
            "and `logs/polygraphy_run_onnxrt.log` for polygraphy's own ONNX Runtime run.")
