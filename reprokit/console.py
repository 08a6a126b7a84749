"""Human-readable output (rich) for verdicts, layerwise tables and backend lists.

Only the CLI calls this; library code never prints. Names come from models and archives that may
be a stranger's: they are printed as text (``escape``), never as rich markup, and no control
character of theirs reaches the terminal (the consoles ``out`` and ``err`` of ``terminal.py``,
importable from here too).
"""

from __future__ import annotations

import os

from rich.markup import escape
from rich.table import Table

from reprokit.engine.inputs import feed_dtype, feed_shape
from reprokit.report.render import fmt
from reprokit.terminal import err, out  # noqa: F401  (err: the CLI imports it from here)


def print_check(result, model_path: str, top: int = 10) -> None:
    verdict = result.verdict
    feeds = result.prepared.feeds

    shapes = ", ".join(f"{k}{feed_shape(v)} {feed_dtype(v)}" for k, v in feeds.arrays.items())
    out.print(f"[bold]reprokit check[/] {escape(model_path)}")
    out.print(f"  reference  {escape(verdict.reference)}")
    out.print(f"  target     {escape(verdict.target)} (precision {verdict.precision}, {verdict.seconds:.2f} s)")
    mode = verdict.target_meta.get("mode")
    if mode:
        built = verdict.target_meta.get("built_file")
        out.print(f"  trt mode   {mode}" + (f", built {built}" if built else ""))
    for note in verdict.target_meta.get("notes") or []:  # what changed what ran (issue 36)
        out.print(f"  [yellow]note[/]       {escape(str(note))}")
    out.print(f"  feeds      {feeds.source}: {shapes}")
    out.print(f"  criterion  {verdict.criterion.describe()} per output")
    if verdict.quantized:
        out.print(f"  quantized  {escape(verdict.quantized)}")
    attribution = getattr(result, "quantized", None)
    if attribution is not None:
        out.print(f"  cause      {escape(attribution.sentence())}")
        for name, value in attribution.quantization.items():
            out.print(f"             fake-quant vs {escape(attribution.against.removeprefix('the '))}: {escape(name)} rel-l2 {value:.3g}"
                      f" (tolerance {attribution.tolerance:g})")
    for note in result.prepared.notes:
        out.print(f"  [yellow]note[/]       {escape(note)}")
    for warning in verdict.warnings:
        out.print(f"  [bold yellow]warning[/]    {escape(warning)}")
    samples = getattr(result, "samples", None)
    if samples:  # a multi-sample --inputs: one line per sample, the numbers below are the first diverging
        for sample in samples:
            style = "red" if sample.verdict.diverges else "green"
            out.print(f"  [{style}]{escape(sample.line())}[/]")
        failing = [s.index for s in samples if s.verdict.diverges]
        verdict_words = (f"{len(failing)} of {len(samples)} samples diverge" if failing
                         else f"every one of {len(samples)} samples agrees")
        out.print(f"[bold red]DIVERGES[/] ({verdict_words}; sample {failing[0]} shown): {escape(verdict.signature.describe())}"
                  if failing else f"[bold green]AGREES[/] ({verdict_words}): every output within tolerance")
    elif verdict.diverges:
        out.print(f"[bold red]DIVERGES[/]: {escape(verdict.signature.describe())}")
    else:
        out.print("[bold green]AGREES[/]: every output within tolerance")
    if verdict.message:
        lines = message_lines(verdict.message)
        out.print("  engine message: " + escape(lines[0]))
        for line in lines[1:]:
            out.print("                  " + escape(line))
    if verdict.outputs:  # a quantized model's outputs it quantizes read in steps (engine/quantized.py)
        out.print(error_table(verdict.outputs, _error_column(verdict)))
    if result.layerwise is not None:
        print_layerwise(result.layerwise, top)


_REASON = ("error", "fail", "unsupported", "not supported", "invalid", "cannot", "can't", "refuse",
           "no conversion", "not implemented", "not found")


def message_lines(message: str, limit: int = 5) -> list[str]:
    """An engine's message in a few lines: the first, the lines that give the reason and the
    last (engines put "Exception from <file>" first and the reason below, often last)."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if not lines:
        return [""]
    reasons = [line for line in lines[1:-1] if any(word in line.lower() for word in _REASON)]
    # A line the first one already quotes (a check's last words) is not shown a second time.
    chosen = [lines[0], *(line for line in dict.fromkeys([*reasons[: limit - 2], lines[-1]])
                          if line != lines[0] and line not in lines[0])]
    return [line if len(line) <= 300 else line[:297] + "…" for line in chosen]


def _shape_text(error) -> str:
    shape = "x".join(map(str, error.shape)) or "scalar"
    if getattr(error, "shape_mismatch", False):
        shape += " (target " + ("x".join(map(str, error.target_shape)) or "scalar") + ")"
    return shape


def _error_column(verdict) -> str:
    """The error column's heading: a quantized model's outputs it quantizes read in steps (engine/quantized.py)."""
    return verdict.criterion.metric.value + (" | steps" if verdict.quantized else "")


def error_table(errors, metric: str, title: str | None = None) -> Table:
    table = Table(title=title, show_edge=False, pad_edge=False)
    for col in ("output", "shape", "rel L2", "max abs", "NaN", "Inf", "max |ref|", metric, "ok"):
        table.add_column(col, justify="left" if col in ("output", "shape") else "right",
                         overflow="fold")
    for e in errors:
        bad = e.exceeds or e.nonfinite_in_target_only
        table.add_row(
            escape(e.name), _shape_text(e), fmt(e.rel_l2), fmt(e.max_abs),
            str(e.target_nan), str(e.target_inf), fmt(e.max_abs_reference),
            f"exact: {e.mismatched} differ" if getattr(e, "exact", False) else fmt(e.error),
            "[red]no[/]" if bad else "[green]yes[/]",
        )
    return table


def print_layerwise(report, limit: int = 10) -> None:
    accumulated = report.start is not None and report.start.get("kind") == "accumulated"
    where = "where the accumulated error crosses the tolerance" if accumulated else "where divergence starts"
    out.print(f"\n[bold]Layerwise[/]: {len(report.rows)} tensors compared, "
              f"{len(report.diverging)} diverge, {len(report.first)} {where}")
    if report.marking_changes_engine:
        out.print("  [yellow]note[/]: this target fuses layers; marking every tensor as an output can "
                  "change what it computes, so a divergence may move or vanish in this view")
    if report.missing:
        out.print(f"  [yellow]note[/]: {len(report.missing)} tensors were not returned by the target "
                  f"(e.g. {report.missing[0]})")
    if report.start is not None and report.start.get("kind") in ("local", "accumulated"):
        color = "yellow" if report.start["kind"] == "accumulated" else "red"
        out.print(f"  [{color}]start[/]: {report.start['words']}")
    if not report.first:
        return
    table = Table(title="first diverging tensors (their inputs still agree)" + (": no node diverges on its own"
                                                                                 if accumulated else ""),
                  show_edge=False)
    for col in ("#", "node", "op", "tensor", "rel L2", "max abs", "max |ref|", "NaN", "Inf"):
        table.add_column(col, overflow="fold",
                         justify="left" if col in ("node", "op", "tensor") else "right")
    for row in report.first[:limit]:
        e = row.error
        table.add_row(str(row.index), escape(row.node), escape(row.op), escape(row.tensor), fmt(e.rel_l2), fmt(e.max_abs),
                      fmt(e.max_abs_reference), str(e.target_nan), str(e.target_inf))
    out.print(table)


def print_backends(rows) -> None:
    table = Table(show_edge=False)
    for col in ("engine", "available", "version", "detail / how to get it"):
        table.add_column(col)
    for row in rows:
        detail = row["detail"] if row["available"] else f"{row['detail']}\n  install: {row['install']}"
        table.add_row(row["engine"], "[green]yes[/]" if row["available"] else "[red]no[/]",
                      escape(row["version"] or "-"), escape(detail))
    out.print(table)


def _number(value) -> str:
    return value if isinstance(value, str) or value is None else f"{value:.3g}"


def print_attribution(result) -> None:
    """An accumulated error: no model is called minimal; where the error comes from instead."""
    s = result.summary
    found = s["attribution"]
    out.print(f"[bold]reprokit shrink[/] {s['model']}: [yellow]accumulated error[/] — no node, pair or small "
              f"region shows {s['signature']['kind']} on its own")
    out.print(f"  judged     {found['nodes_judged_alone']} nodes alone (fed with reference inputs); "
              f"{found['diverging_alone']} exceed the tolerance {found['tolerance']:g} alone")
    if found.get("quantized"):  # docs/quantized.md: one step is a rounding flip
        tail = (": none differs by more than a step alone — int8 rounding that accumulates, not one op's bug"
                if not found["diverging_alone"] else "")
        out.print("  quantized  each op was judged with its Q/DQ units, in quantization steps (the error column)" + tail)
    out.print(f"  calls      target {s['calls']['target']}, reference {s['calls']['reference']}; {s['wall_s']:.1f} s")
    table = Table(title="largest isolated errors (each node alone)", show_edge=False)
    for column in ("node", "op", "error", "kind"):
        table.add_column(column)
    for row in found["top"]:
        error = row["error"]
        table.add_row(row["node"], row["op"], error if isinstance(error, str) else f"{error:.3g}", row["kind"])
    out.print(table)
    tested = found.get("workaround") or {}
    if tested.get("agrees"):
        out.print(f"  fp32       tested: {tested['setting']} → {tested['verdict']} (error {_number(tested['error'])}, "
                  f"tolerance {tested['tolerance']:g}; {tested['size']} of {tested['ranked']} ranked nodes, "
                  f"{tested['calls']} target calls)")
    elif tested.get("reason"):
        out.print(f"  fp32       no per-node precision to suggest: {tested['reason']}")
    elif found["fp32_nodes"]:
        out.print(f"  fp32       keep these in fp32 (untested as a set): fp32-nodes={found['fp32_nodes']}"
                  + (f" — {tested['note']}" if tested.get("note") else ""))
    out.print(f"  wrote      {os.path.join(result.out_dir, 'summary.json')} (attribution: top, cumulative)"
              + (f", {s['report']} ({s.get('report_holds', 'the whole model')}; ISSUE.md with the attribution)"
                 if s.get("report") else ""))
    for note in result.notes[:-1]:
        out.print(f"  [yellow]note[/]       {escape(note)}")


def print_shrink(result) -> None:
    s = result.summary
    if s["status"] == "accumulated":
        print_attribution(result)
        return
    out.print(f"[bold]reprokit shrink[/] {escape(s['model'])} → {escape(result.minimal_path)}")
    out.print(f"  signature  {s['signature']['kind']}"
              + (f" ({escape(s['signature']['detail'])})" if s['signature']['detail'] else ""))
    inside = ""
    if "nodes_with_subgraphs" in s["original"] or s["minimal"].get("nodes_with_subgraphs", 0) > s["minimal"]["nodes"]:
        inside = (f" ({s['original'].get('nodes_with_subgraphs', s['original']['nodes'])} → "
                  f"{s['minimal'].get('nodes_with_subgraphs', s['minimal']['nodes'])} counted inside If/Loop bodies)")
    out.print(f"  nodes      {s['original']['nodes']} → {s['minimal']['nodes']}{inside}  ops: {', '.join(s['minimal']['ops'])}"
              f"  (1-minimal: {'yes' if s['one_minimal'] else 'not proven'})")
    out.print("  inputs     " + ", ".join(escape(f"{i['name']}{i['shape']}") for i in s['minimal']['inputs']))
    out.print("  outputs    " + ", ".join(escape(o['name']) for o in s['minimal']['outputs']))
    out.print(f"  calls      target {s['calls']['target']}, reference {s['calls']['reference']}, "
              f"cached {s['calls']['cached']}; {s['build_work']['nodes_built']} nodes built; {s['wall_s']:.1f} s")
    if s.get("other_findings"):
        out.print("  [yellow]other findings (not followed)[/]: " + "; ".join(f"{k} ×{v}" for k, v in s["other_findings"].items()))
        if any(", other message: " in k for k in s["other_findings"]) and not s.get("check_policy", {}).get("regexes"):
            out.print("  [yellow]hint[/]       some candidates failed with other words, counted as the same failure "
                      "(the exit status is the signature); if they are different bugs, pick yours with --fail-regex")
    verdict = result.verdict
    if verdict is not None and verdict.outputs:
        out.print(error_table(verdict.outputs, _error_column(verdict), title="minimal model"))
    out.print(f"  wrote      {os.path.join(result.out_dir, 'minimal.onnx')}, inputs.npz, summary.json"
              + (f", {s['report']}" if s.get("report") else ""))
    for note in result.notes:
        out.print(f"  [yellow]note[/]       {escape(note)}")


def print_pack(result) -> None:
    out.print(f"[bold]reprokit pack[/] → {result.archive}")
    out.print(f"  verdict    {escape(result.verdict.signature.describe())} under {escape(result.verdict.target)}")
    out.print(f"  repro.py   {'reproduces here (exit 1)' if result.reproduces else '[red]did NOT reproduce here[/]'}")
    if result.redaction:
        r = result.redaction
        out.print(f"  redacted   {r['renamed_tensors']} names; weights {r['weights']} "
                  f"({r['randomized_weights']} tensors); verdict before: {r['verdict_before']}, after: {r['verdict_after']}")
    for note in result.notes:
        out.print(f"  [bold yellow]{escape(note)}[/]")


def print_verify(result, archive: str) -> None:
    recorded = result.recorded
    out.print(f"[bold]reprokit verify[/] {escape(archive)}: manifest OK")
    out.print(f"  recorded   {escape(result.recorded_signature.describe())} under {escape(str(recorded['target']))}")
    here = result.verdict.signature.describe() if result.verdict.diverges else "agree"
    out.print(f"  here       {escape(here)} under {escape(result.target)}")
    if result.verdict.outputs:
        out.print(error_table(result.verdict.outputs, _error_column(result.verdict)))
    if result.reproduces:
        out.print("[bold red]REPRODUCES[/]")
    elif result.verdict.diverges:
        out.print("[bold yellow]DIVERGES DIFFERENTLY[/] here: not the recorded failure, so it does not reproduce")
    else:
        out.print("[bold green]DOES NOT REPRODUCE[/] here with this setting")


def print_env(info: dict) -> None:
    table = Table(show_edge=False, show_header=False)
    table.add_column("key")
    table.add_column("value", overflow="fold")
    for key, value in info.items():
        if key == "schema":
            continue
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v if v is not None else '(missing)'}" for k, v in value.items())
        elif isinstance(value, list):
            value = "; ".join(str(v) for v in value)
        table.add_row(key, "(missing)" if value is None else str(value))
    out.print(table)


def _print_calibration(calib: dict | None) -> None:
    """A quantized model's calibration diagnosis (audit/calibration.py), where there is one."""
    if not calib:
        return
    if calib["note"] and not calib["clipping"]:
        out.print(f"  calibration {escape(calib['note'])}")
        return
    clips = calib["clipping"]
    against = escape(calib.get("against", "the fp32 twin").removeprefix("the "))
    out.print(f"  calibration fake-quant vs {against} rel-l2 {fmt(calib['error'])} (tolerance {calib['tolerance']:g}); "
              f"{len(clips)} QuantizeLinear clip  [dim](reference runs only)[/]")
    for row in clips[:5]:
        without = "" if row["error_without"] is None else f"; left out: {fmt(row['error_without'])}"
        out.print(f"    {escape(row['node'])}: {100 * row['clipped']:.1f}% clipped, range "
                  f"[{fmt(row['range'][0])}, {fmt(row['range'][1])}], seen [{fmt(row['seen'][0])}, "
                  f"{fmt(row['seen'][1])}]{without}")
    if calib["cause"]:
        enough = calib["error_fixed"] is not None and calib["error_fixed"] <= calib["tolerance"]
        partial = "" if enough else (f"; not within {calib['tolerance']:g}: a partial cause, the rest is rounding "
                                     "or clipping beyond the nodes tried")
        out.print(f"  cause      {escape(', '.join(calib['cause']))} (causal: left unquantized, the error goes "
                  f"{fmt(calib['error'])} → {fmt(calib['error_fixed'])}{partial})")
        out.print(f"  {'fix' if enough else 'helps':<10} {escape(calib['printed_fix'])}")
        if calib["widened_error"] is not None:
            out.print(f"             or widen the calibration range there (tested: rel-l2 {fmt(calib['widened_error'])})")
    if calib.get("all_widened_error") is not None:
        out.print(f"  recalibrate every clipping pair widened to the range the inputs reach (calibration data that "
                  f"covers them): rel-l2 {fmt(calib['all_widened_error'])} (tested)")


def print_audit(result) -> None:
    """``reprokit audit``: the verdict, first range finding, first divergence, sweep, explain."""
    a = result.payload
    verdict = result.verdict
    out.print(f"[bold]reprokit audit[/] {a['model']} under {a['target']}")
    if verdict is None:
        out.print("  verdict    not run (--ranges-only: no target call)")
    else:
        out.print("  verdict    " + (f"[bold red]DIVERGES[/]: {escape(verdict.signature.describe())}" if verdict.diverges
                                     else "[bold green]AGREES[/]"))
    first = result.ranges.first
    if not result.ranges.applicable:
        out.print(f"  ranges     {result.ranges.reason}")
    else:
        weight = f", its weight {escape(first.tensor)}" if first is not None and first.readers else ""
        found = f"first [bold]{escape(first.node)}[/] ({first.op}{weight}): {escape(first.message)}" if first else "every tensor fits"
        out.print(f"  ranges     {found}  [dim](no engine call)[/]")
        for row in sorted(result.ranges.weights, key=lambda w: not w.severe)[:3]:
            out.print(f"  weights    {escape(row.tensor)}: {escape(row.message)}")
    _print_calibration(a.get("calibration"))
    lw = result.layerwise
    if lw.first:
        row = lw.first[0]
        out.print(f"  layerwise  first divergence at [bold]{escape(row.node)}[/] ({row.op}, depth {row.index}, "
                  f"{a['criterion']['metric']} {fmt(row.error.error)}); {len(lw.diverging)} of {len(lw.rows)} diverge")
    for grow in a["layerwise"].get("amplifiers", [])[:1]:
        out.print(f"  grows at   {escape(grow['node'])} ({grow['op']}): rel L2 {fmt(grow['input_rel_l2'])} → "
                  f"{fmt(grow['rel_l2'])} (×{grow['growth']:.3g})")
    if result.sweep:
        table = Table(title="knob sweep (smallest change first)", show_edge=False)
        for col in ("change", "setting", "verdict", "error", "calls"):
            table.add_column(col, overflow="fold", justify="right" if col in ("error", "calls") else "left")
        for row in result.sweep:
            verdict_text = f"[green]{row.verdict}[/]" if row.fixes else row.verdict
            table.add_row(escape(row.change), escape(row.setting), verdict_text, fmt(row.error),
                          str(row.target_calls + row.reference_calls))
        out.print(table)
        found = a.get("workaround")
        out.print("  workaround " + (f"[bold green]{escape(found['change'])}[/]: {escape(found['setting'])} ({found['basis']})"
                                     if found else f"[red]{escape(a.get('no_workaround') or 'none of the settings tried avoids it')}[/]"))
    if a.get("explain"):
        out.print(f"  explain    {escape(a['explain']['conclusion'])}")
    cost = a["cost"]
    out.print(f"  calls      target {cost['target_calls']}, reference {cost['reference_calls']}, "
              f"{cost['seconds']:.1f} s in engines; range audit 0 target calls")
    for note in a["notes"]:
        out.print(f"  [yellow]note[/]       {escape(note)}")
    if a.get("overlay"):
        out.print(f"  overlay    {escape(a['overlay']['command'])}")
    out.print("  wrote      " + ", ".join(result.files.get(k, "") for k in ("html", "markdown", "json", "plot") if k in result.files))


def print_torch(columns) -> None:
    """``check --torch``: PyTorch eager, onnxruntime and the target side by side, and the blame."""
    s = columns.settings
    out.print(f"  torch      {s['torch']}: torch.onnx.export({'dynamo' if s['dynamo'] else 'legacy TorchScript'}, "
              f"opset {s['opset']}) of {s['source']}")
    for note in s.get("notes", []):
        out.print(f"  [yellow]note[/]       {escape(note)}")
    metric = columns.engine.criterion.metric.value
    table = Table(title=f"three columns ({metric})", title_justify="left")
    for header in ("output", "torch → onnxruntime", "onnxruntime → target", "torch → target"):
        table.add_column(header)
    pairs = [columns.exporter, columns.engine, columns.end_to_end]
    names = [e.name for e in columns.exporter.outputs] or [e.name for e in columns.engine.outputs]
    for name in names:
        cells = []
        for verdict in pairs:
            error = next((e for e in verdict.outputs if e.name == name), None) if verdict is not None else None
            cells.append("-" if error is None else
                         (f"[red]{fmt(error.error)}[/]" if error.exceeds or error.nonfinite_in_target_only
                          else fmt(error.error)))
        table.add_row(escape(name), *cells)
    out.print(table)
    out.print(f"  exporter   {columns.exporter.signature.describe() if columns.exporter.diverges else 'agree'} "
              f"({columns.exporter.criterion.describe()}, fp32 both sides)")
    style = "bold green" if columns.blame == "none" else "bold red"
    out.print(f"[{style}]{columns.words}[/]")
