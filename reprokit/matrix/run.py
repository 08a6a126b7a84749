"""``reprokit verify ARCHIVE --versions SPEC [--bisect] [--ray ADDRESS] [--gpus KINDS]``.

Checks the archive as ``verify`` does (safe extraction, manifest), picks the releases, runs one
cell per release (and GPU kind) or bisects, and writes the result into a NEW archive beside the
user's (``NAME.matrix.tar.gz``: the same files, plus ``matrix.json``, and ISSUE.md answering
"Have you tried the latest release?"). The user's archive is never changed; an existing output
is replaced only when it is a matrix archive reprokit wrote.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from datetime import datetime, timedelta

from reprokit.engine import memorybound
from reprokit.errors import EngineUnavailable, InputError, MatrixNoAnswer, UsageError
from reprokit.matrix import specs
from reprokit.matrix.bisect import bisect as run_bisect
from reprokit.matrix.cells import Cell, Outcome
from reprokit.matrix.envs import cache_root, find_uv
from reprokit.matrix.executor import INSTALL, execute, ray_reachable
from reprokit.matrix.table import SCHEMA, answer_in_issue, latest_answer
from reprokit.report.archive import (
    MANIFEST,
    MAX_MEMBERS,
    HeaderRefused,
    open_tar,
    write_archive,
    write_manifest,
    zip_entries,
)
from reprokit.report.reproducer import runnable
from reprokit.report.verify import archive_json, open_archive, trusted_archive_spec
from reprokit.spec import parse_target

# Which package a target's engine loads (emulate runs its rounded graph on onnxruntime).
TARGET_PACKAGES = {"ort": ("onnxruntime", "onnxruntime-gpu"), "emulate": ("onnxruntime", "onnxruntime-gpu"),
                   "openvino": ("openvino",), "trt": ("tensorrt", "tensorrt-cu11", "tensorrt-cu12", "tensorrt-cu13")}


@dataclass
class MatrixResult:
    payload: dict  # matrix.json
    archive: str | None  # the new archive written (None: nothing ran, nothing written)
    rows: list[dict]


def verify_versions(archive_path: str, versions: str, *, target: str | None = None, bisect: bool = False,
                    ray_address: str | None = None, gpus: tuple[str, ...] = (), jobs: int = 2,
                    timeout: float = 600.0, out_path: str | None = None, on_event=None,
                    force: bool = False, run_archive_code: bool = False) -> MatrixResult:
    event = on_event or (lambda text: None)
    spec = specs.parse_versions(versions)
    if not os.path.isfile(archive_path):  # as verify words it, before uv or the index is asked
        raise InputError(f"archive not found: {archive_path}", hint="check the path")
    if bisect and len(gpus) > 1:
        raise UsageError("--bisect runs on one GPU kind at a time", hint="give one --gpus kind, or drop --bisect")
    if gpus and ray_address is None:
        raise UsageError("--gpus places cells on GPU kinds of a Ray cluster", hint="add --ray auto (or an address)")
    if target:
        parse_target(target)  # an unknown engine or option: exit 2 naming the valid ones
    if find_uv() is None:
        raise EngineUnavailable("--versions builds environments with uv, which is not installed here", hint=INSTALL)
    if ray_address is not None:
        ray_reachable(ray_address)  # before any work: an address nobody listens on is exit 4 at once
    out_path = out_path or re.sub(r"(\.tar\.gz|\.tgz|\.zip)?$", "", archive_path, count=1) + ".matrix.tar.gz"
    _check_out(out_path, archive_path, force)
    with tempfile.TemporaryDirectory(prefix="reprokit-matrix-") as tmp:
        top, recorded = open_archive(archive_path, tmp, use="run as a matrix")  # plain verify's checks
        packed_env = archive_json(top, "env.json", archive_path, use="run as a matrix")
        if not isinstance(packed_env, dict) or not isinstance(packed_env.get("packages", {}), dict):
            raise InputError(f"archive {archive_path} has an env.json reprokit cannot read (not an object "
                             "with a 'packages' object)", hint="only archives written by `reprokit pack` can be run "
                             "as a matrix; ask for a fresh one")
        chosen_target = target or trusted_archive_spec(recorded.get("target"), "target", archive_path)
        plan = runnable(top, recorded, archive_path, target=target, run_archive_code=run_archive_code)
        cargo = plan.cargo(as_bytes=ray_address is not None)
        engine = chosen_target.partition(":")[0].strip().lower()
        if spec.package not in TARGET_PACKAGES.get(engine, ()):
            raise UsageError(f"--versions varies {spec.package}, but the target {chosen_target!r} does not load it",
                             hint="vary the target's own engine: " + ", ".join(TARGET_PACKAGES.get(engine, ("(none)",))))
        releases, listed = _releases(spec, event)
        chosen = specs.choose(spec, releases)
        if bisect and len(chosen) < 2:
            raise UsageError(f"--bisect needs a range of releases; {spec} names {len(chosen)}",
                             hint="e.g. --versions 'onnxruntime>=1.20' --bisect")
        packed = (packed_env.get("packages") or {}).get(spec.package)
        needs_gpu = engine == "trt" or spec.package == "onnxruntime-gpu" or "cuda" in chosen_target.lower()
        cells = {(r.version, g): _cell(spec, r, chosen_target if target else None, g, timeout, needs_gpu)
                 for r in chosen for g in (gpus or (None,))}
        rows_by: dict[tuple, dict] = {}

        def judge(versions: list[str]) -> dict[str, str]:
            wanted = [cells[(v, g)] for v in versions for g in (gpus or (None,))]
            event(f"running {len(wanted)} cell{'s' if len(wanted) != 1 else ''}: "
                  + ", ".join(c.label for c in wanted) + (f" on Ray ({ray_address})" if ray_address else ""))
            for row in execute(wanted, cargo, ray_address=ray_address, jobs=jobs,
                               on_result=lambda r: event(_progress(spec.package, r))):
                rows_by[(row["version"], row["gpu"])] = row
            return {v: rows_by[(v, gpus[0] if gpus else None)]["outcome"] for v in versions}

        found = None
        if bisect:
            known = {}
            if packed in [r.version for r in chosen] and _reproduced_when_packed(top) and target is None:
                known[packed] = Outcome.REPRODUCES.value
                rows_by[(packed, gpus[0] if gpus else None)] = {
                    "version": packed, "gpu": gpus[0] if gpus else None, "outcome": Outcome.REPRODUCES.value,
                    "known": True, "why": "repro.py reproduced when the archive was packed (logs/repro.log)",
                    "env_seconds": None, "run_seconds": None, "packages": {}}
            found = run_bisect([r.version for r in chosen], judge, known)
        else:
            judge([r.version for r in chosen])
        order = {r.version: i for i, r in enumerate(chosen)}
        rows = sorted(rows_by.values(), key=lambda r: (order[r["version"]], r.get("gpu") or ""))
        payload = {"schema": SCHEMA, "spec": str(spec), "package": spec.package, "target": chosen_target,
                   "ran": plan.origin.value,
                   "reference": "reference_outputs.npz (as packed: " + str(recorded.get("reference")) + ")",
                   "packed_with": packed, "latest": releases[-1].version if releases and listed else None,
                   "python": platform.python_version(), "ray": ray_address, "gpus": list(gpus), "env_cache": cache_root(),
                   "bisect": found.to_json() if found else None,
                   "rows": [{k: v for k, v in r.items() if k not in ("cell", "env_path")} for r in rows]}
        if recorded.get("redaction"):  # a --redact archive names no machine: nor does its matrix
            payload["env_cache"] = None
            for row in payload["rows"]:
                row["host"] = None
        problem = _no_answer(rows, found)
        payload["answer"] = problem[0] if problem else "answered"
        if problem and problem[0] == "no-cell-ran":  # an archive would answer "the latest release?" with nothing
            raise MatrixNoAnswer(problem[1], hint="each row's note says why; nothing was written"
                                 + _why_hint(rows), result=MatrixResult(payload, None, rows))
        _write(top, payload, out_path)
    result = MatrixResult(payload, out_path, rows)
    if problem:
        raise MatrixNoAnswer(problem[1], hint=f"{out_path} holds the releases that ran; the notes say why the "
                             "others cannot; widen the range or fix what stops them", result=result)
    return result


def _no_answer(rows: list[dict], found) -> tuple[str, str] | None:
    """Why the matrix answers nothing (never exit 0 on a guess): no cell ran, or a bisect with
    fewer than two judged releases, which can name no boundary."""
    ran = [r for r in rows if Outcome(r["outcome"]).judged and not r.get("known")]
    if not ran:
        cells = f"{len(rows)} cells, each" if len(rows) != 1 else "its one cell"
        return "no-cell-ran", f"no release could run: {cells} 'cannot run' or 'error'"
    if found is not None:
        judged = [v for v, outcome in found.outcomes.items() if Outcome(outcome).judged]
        if len(judged) < 2:
            return "bisect-inconclusive", (f"--bisect judged {len(judged)} of {len(found.versions)} releases "
                                           "(the others cannot run): no boundary to search")
    return None


def _why_hint(rows: list[dict]) -> str:
    whys = [r.get("why") or "" for r in rows if r.get("why")]
    if any("uv pip install failed" in w or "uv venv" in w for w in whys):
        return " (uv could not build the environments: is the package index reachable? UV_INDEX_URL picks another)"
    if any("ran past" in w for w in whys):
        return " (repro.py ran past --timeout: give a longer one)"
    if any("could not start a thread" in w for w in whys):
        return " (a limit on threads and processes stopped repro.py, not memory: raise it where the cells run " \
               "(a container's pids limit, ulimit -u) or give fewer --jobs)"
    if any("data limit it was started under" in w for w in whys):
        return " (repro.py ran out of the data limit it was started under: raise ulimit -d where the cells run, " \
               "only for an archive you trust; --memory-bound never raises it)"
    if any("memory bound" in w for w in whys):
        return " (repro.py ran out of its memory bound: raise --memory-bound, only for an archive you trust)"
    return ""


def _cell(spec, release, target, gpu, timeout, needs_gpu=False) -> Cell:
    resolve_at = None
    if release.uploaded:  # companions as of a week after the release: what its users installed
        when = datetime.fromisoformat(release.uploaded.replace("Z", "+00:00")) + timedelta(days=7)
        resolve_at = when.strftime("%Y-%m-%dT%H:%M:%SZ")
    requirements = (f"{spec.package}=={release.version}", *specs.COMPANIONS[spec.engine])
    return Cell(spec.package, release.version, requirements, resolve_at, target, gpu, timeout, needs_gpu,
                None if needs_gpu else memorybound.configured())


def _releases(spec, event) -> tuple[list, bool]:
    """The releases, and whether the index listed them (else the newest pin is not "latest")."""
    try:
        event(f"listing {spec.package} releases from {specs.index_url()}")
        return specs.list_releases(spec.package), True
    except EngineUnavailable as exc:
        exact = [p for p in spec.pins if p != "latest" and "*" not in p]
        if spec.range is None and exact and len(exact) == len(spec.pins):
            event(f"{exc.message}; running the exact releases named")
            return [specs.Release(v, None) for v in exact], False  # exact pins need no listing
        raise


def _progress(package: str, row: dict) -> str:
    where = f" @ {row['gpu']}" if row.get("gpu") else ""
    took = f" (env {row['env_seconds']} s, repro.py {row['run_seconds']} s)" if row.get("run_seconds") is not None else ""
    return f"{package} {row['version']}{where}: {row['outcome']}{took}"


def _reproduced_when_packed(top: str) -> bool:
    try:
        with open(os.path.join(top, "logs", "repro.log")) as handle:
            return "[exit code 1]" in handle.read()
    except OSError:
        return False


def _check_out(out_path: str, archive_path: str, force: bool = False) -> None:
    """The new archive may replace only a matrix archive reprokit wrote (or, with ``force``, any
    file but the archive being verified), never the user's (reprokit/files.py's rule)."""
    if os.path.abspath(out_path) == os.path.abspath(archive_path) or (
            os.path.exists(out_path) and os.path.samefile(out_path, archive_path)):
        raise UsageError("--out names the archive being verified", hint="the matrix goes into a new archive")
    if os.path.exists(out_path) and not force and not _is_matrix_archive(out_path):
        raise UsageError(f"{out_path} exists and is not a matrix archive reprokit wrote; not replacing it",
                         hint="move it away, choose another path with --out, or add --force to replace it")
    # Before any cell runs, not after all of them: a folder, or a place no file can be written.
    folder = os.path.dirname(os.path.abspath(out_path))
    existing = folder
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    why = ("is a folder" if os.path.isdir(out_path) else
           f"cannot be written: {existing} is not a folder" if not os.path.isdir(existing) else
           f"cannot be written: {existing} is not writable" if not os.access(existing, os.W_OK | os.X_OK) else None)
    if why:
        raise UsageError(f"--out {out_path} {why}", hint="give --out a file path in a folder you can write")


def _is_matrix_archive(path: str) -> bool:
    """Whether ``path`` is a matrix archive reprokit wrote; read through the bounded reader (a
    file at --out may be anybody's), at most MAX_MEMBERS names."""
    try:
        if path.endswith(".zip"):
            if zip_entries(path) > MAX_MEMBERS:
                return False
            with zipfile.ZipFile(path) as handle:
                names = handle.namelist()
        else:
            with open_tar(path) as handle:
                names = [m.name for m, _ in zip(handle, range(MAX_MEMBERS))]
    except (OSError, tarfile.TarError, zipfile.BadZipFile, HeaderRefused):
        return False
    return any(n.count("/") == 1 and n.endswith("/matrix.json") for n in names)


def _write(top: str, payload: dict, out_path: str) -> None:
    with open(os.path.join(top, "matrix.json"), "w") as handle:
        json.dump(payload, handle, indent=2, default=str)
    issue = os.path.join(top, "ISSUE.md")
    if os.path.exists(issue):
        with open(issue) as handle:
            text = handle.read()
        with open(issue, "w") as handle:
            handle.write(answer_in_issue(text, latest_answer(payload)))
    extra = {k: v for k, v in archive_json(top, MANIFEST, top).items() if k not in ("files", "schema")}
    write_manifest(top, {**extra, "matrix": "matrix.json"})
    folder = os.path.dirname(os.path.abspath(out_path))
    os.makedirs(folder, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".reprokit-matrix-") as staging:
        name = re.sub(r"(\.tar\.gz|\.tgz|\.zip)$", "", os.path.basename(out_path))
        stage = os.path.join(staging, name)
        shutil.copytree(top, stage)
        written = os.path.join(staging, os.path.basename(out_path))
        write_archive(stage, written, "zip" if out_path.endswith(".zip") else "tar.gz")
        os.replace(written, out_path)
