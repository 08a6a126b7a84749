"""``reprokit check MODEL... [--ray ADDRESS] [--gpus KINDS] --json``: a zoo sweep.

Each model is one ``reprokit check MODEL ... --json`` run by the matrix executor (a local pool, or
one Ray task per model and GPU kind, on workers where reprokit and the target's engine are
installed); results stream back as they finish and come out as one ``reprokit.check-many/1``
object (``--json``) or a table. The exit code: 1 when any model diverges, else the first other
failure's own code, else 0. Judges nothing itself: each verdict is the check's own. The memory
bound (``--memory-bound``, ``REPROKIT_MEMORY_BOUND``) is passed in each check's arguments, so a
Ray worker's check is bounded as a local one.
"""

from __future__ import annotations

import json
import os
import re

import click

from reprokit.console import err, out
from reprokit.engine.memorybound import ENV as MEMORY_ENV
from reprokit.errors import ExitCode, UsageError
from reprokit.files import parse_json
from reprokit.matrix.executor import fanout


def check_many(models: list[str], passed: list[str], *, out_dir: str | None, as_json: bool,
               ray_address: str | None, gpus: str | None, jobs: int) -> int:
    if not models:
        raise UsageError("give MODEL (one or more)", hint="e.g. reprokit check models/*.onnx --target emulate:fp16")
    if "--torch" in passed:
        raise UsageError("--torch checks one module; several MODELs are ONNX files", hint="drop --torch or the MODELs")
    kinds = [k.strip() for k in (gpus or "").split(",") if k.strip()]
    if kinds and not ray_address:
        raise UsageError("--gpus places checks on GPU kinds of a Ray cluster", hint="add --ray auto (or an address)")
    missing = [m for m in models if not os.path.isfile(m)]
    if missing:
        shapes = [m for m in missing if re.fullmatch(r".+:(\d+(x\d+)*|\[[\d,\s]*\])", m)]
        hint = (f"{shapes[0]} looks like an input shape: give several in one quoted --input-shapes "
                f"'a:1x3 b:2x4', or repeat --input-shapes" if shapes else "check the paths or the glob")
        raise UsageError(f"MODEL {missing[0]} is not a file" + (f" (+{len(missing) - 1} more)" if len(missing) > 1 else ""),
                         hint=hint)
    # The bound travels in each argv, not the environment: a Ray worker's environment is its
    # cluster's, not this process's (--memory-bound sets REPROKIT_MEMORY_BOUND here only)
    bound = os.environ.get(MEMORY_ENV, "").strip()
    argvs = []
    for model in models:
        argv = ["check", os.path.abspath(model), *passed, *(["--memory-bound", bound] if bound else []), "--json"]
        if out_dir:
            argv += ["--out", os.path.join(os.path.abspath(out_dir), _stem(model))]
        argvs.append(argv)
    done = [0]

    def progress(result: dict) -> None:
        done[0] += 1
        if not as_json:
            err.print(f"[dim][{done[0]}/{len(argvs) * max(1, len(kinds))}] {_words(result)}[/]")

    results = fanout(argvs, ray_address=ray_address, jobs=jobs, gpus=kinds or None, on_result=progress)
    rows = [_row(r) for r in results]
    if as_json:
        click.echo(json.dumps({"schema": "reprokit.check-many/1", "ray": ray_address, "gpus": kinds,
                               "results": rows}, indent=2, default=str))
    else:
        from rich.table import Table

        table = Table(title=f"{len(models)} models")
        for column in ("model", "GPU kind", "verdict", "exit", "s", "host"):
            table.add_column(column)
        for row in rows:
            table.add_row(row["model"], row["gpu"] or "-", row["words"], str(row["exit_code"]),
                          "-" if row["seconds"] is None else f"{row['seconds']:.1f}", row["host"] or "-")
        out.print(table)
    codes = [r["exit_code"] for r in rows]
    if ExitCode.DIVERGES in codes:
        return int(ExitCode.DIVERGES)
    return next((int(c) for c in codes if c not in (0, None)), int(ExitCode.ENVIRONMENT) if None in codes else 0)


def _stem(model: str) -> str:
    return re.sub(r"\.onnx$", "", os.path.basename(model)) or "model"


def _row(result: dict) -> dict:
    check = None
    try:
        check = parse_json(result["stdout"]) if result["stdout"].strip() else None
    except ValueError:
        pass
    return {"model": os.path.relpath(result["argv"][1]), "gpu": result["gpu"], "exit_code": result["exit_code"],
            "seconds": result["seconds"], "host": result["host"], "words": _words(result), "check": check,
            "stderr": None if result["exit_code"] in (0, 1) else result["stderr"][-1000:]}


def _words(result: dict) -> str:
    model = os.path.basename(result["argv"][1]) + (f" @ {result['gpu']}" if result.get("gpu") else "")
    code = result["exit_code"]
    if code == 0:
        return f"{model}: agrees"
    if code == 1:
        try:
            verdict = parse_json(result["stdout"])["verdict"]
            return f"{model}: diverges ({verdict['signature']['kind']})"
        except (ValueError, KeyError, TypeError):
            return f"{model}: diverges"
    lines = [line for line in (result.get("stderr") or "").splitlines() if line.startswith("Error:")]
    return f"{model}: could not check (exit {code}{': ' + lines[-1][7:] if lines else ''})"
