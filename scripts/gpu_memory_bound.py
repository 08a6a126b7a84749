"""Does the engine workers' memory bound (RLIMIT_DATA, engine/memorybound.py) let GPU engines run,
and does it stop a model that allocates host memory without end under them? Run on the GPU
machine (docs/gpu.md, "Memory bound on GPU engines"); every part but the CUDA/TensorRT cells runs
here on the CPU too (``--targets ort``), which is how the script itself is tested.

    python scripts/gpu_memory_bound.py all --out DIR [--targets ort:cuda trt] [--bombs]
    python scripts/gpu_memory_bound.py probe SPEC MODEL FEEDS BOUND   (one child: JSON on stdout)

Prints one JSON line per measurement (and appends it to DIR/gpu_memory_bound.jsonl):
- ``machine``: kernel, memory, the cgroup's limit, reprokit's default bound;
- ``control``: numpy asking 3x a bound of 1 GiB under it (does the kernel enforce RLIMIT_DATA?);
- ``probe``: VmData / VmRSS / VmPeak / VmHWM (``/proc/self/status``) of a fresh process after
  the bound is applied, after the engine's import, after its session/engine is made, after a run,
  with the bound (none, reprokit's default, 8/4/2/1 GiB) and the result;
- ``cli``: ``reprokit check`` of a sample or a bomb under ``--memory-bound``: exit code, status
  line, seconds (``REPROKIT_PYTHONPATH`` picks the code that runs: the candidate or the old one).
Bomb models: ``host`` (a string Expand: the CUDA provider has no string kernel, so onnxruntime
runs it on the CPU side, one host allocation of 32 bytes an element) and ``device`` (a float
Expand the CUDA provider runs: GPU memory, which RLIMIT_DATA does not count).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLES = ("attention_softmax_nan", "conv_clip")
GIB = 1 << 30
_KEYS = ("VmPeak", "VmData", "VmRSS", "VmHWM")


def status() -> dict:
    """This process's memory counters in MiB (VmData is what RLIMIT_DATA is checked against)."""
    found = {}
    with open("/proc/self/status") as handle:
        for line in handle:
            key, _, value = line.partition(":")
            if key in _KEYS:
                found[key] = round(int(value.split()[0]) / 1024, 1)
    return found


def probe(spec: str, model: str, feeds: str, bound: int) -> dict:
    """One engine run in this (fresh) process under ``bound`` bytes (0: none), counters between."""
    import faulthandler

    from reprokit.engine import memorybound

    faulthandler.dump_traceback_later(45, exit=True)  # a hang under a tight bound: where it waits
    points = {"start": status()}
    held = memorybound.apply(bound) if bound else None
    points["bounded"] = status()
    row: dict = {
        "spec": spec,
        "model": os.path.basename(model),
        "bound_mib": held and held >> 20,
        "rlimit_data_mib": resource.getrlimit(resource.RLIMIT_DATA)[0] >> 20,
    }
    started = time.monotonic()
    try:
        data = dict(np.load(feeds)) if feeds else {}
        if spec.startswith("ort:cuda"):  # the session made apart from the run: two points
            import onnxruntime as ort

            points["imported"] = status()
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            providers = [("CUDAExecutionProvider", {"use_tf32": "1"}), "CPUExecutionProvider"]
            session = ort.InferenceSession(model, options, providers=providers)
            if session.get_providers()[0] != "CUDAExecutionProvider" and hasattr(
                ort, "preload_dlls"
            ):
                ort.preload_dlls()  # what reprokit's ort:cuda does when the libraries are the pip packages'
                session = ort.InferenceSession(model, options, providers=providers)
            row["providers"] = session.get_providers()
            points["session"] = status()
            session.run(None, {i.name: data[i.name] for i in session.get_inputs()})
            points["run"] = status()
            session.run(None, {i.name: data[i.name] for i in session.get_inputs()})
            points["run2"] = status()
        else:  # reprokit's own backend (trt: build only, the runtime refuses compute capability 9.0)
            from reprokit.engine.backends import create_backend
            from reprokit.spec import parse_target

            backend = create_backend(parse_target(spec))
            backend.build_only = spec.startswith("trt")
            points["imported"] = status()
            result = backend.run(model, data, [])
            row["meta_build_seconds"] = result.meta.get("build_seconds")
            points["run"] = status()
        row["result"] = "ok"
    except BaseException as exc:  # noqa: BLE001 - the measurement records whatever the engine raised
        row["result"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        points["failed"] = status()
    row["seconds"] = round(time.monotonic() - started, 2)
    row["points"] = points
    return row


def bomb(kind: str, nbytes: int, path: str) -> str:
    """A model asking ``nbytes`` of host (``host``) or GPU (``device``) memory in one Expand."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    if kind == "host":
        # x[1,16] -> Cast(string) -> Expand([rows,16]) -> Cast(float) -> ReduceMean(0) -> Add(x) -> y[1,16]
        # (computed from the input, so no constant folding in reprokit's own process takes it)
        rows = max(1, nbytes // (16 * 32))  # a std::string is 32 bytes (short strings inline)
        nodes = [
            helper.make_node("Cast", ["x"], ["s"], to=TensorProto.STRING, name="to_string"),
            helper.make_node("Expand", ["s", "shape"], ["big"], name="expand"),
            helper.make_node("Cast", ["big"], ["f"], to=TensorProto.FLOAT, name="cast"),
        ]
        inits = []
    else:
        # x[1,16] -> Expand([rows,16]) -> ReduceMean(0) -> Add(x) -> y[1,16]
        rows = max(1, nbytes // (16 * 4))
        nodes = [helper.make_node("Expand", ["x", "shape"], ["f"], name="expand")]
        inits = []
    nodes += [
        helper.make_node("ReduceMean", ["f"], ["m"], axes=[0], keepdims=1, name="mean"),
        helper.make_node("Add", ["m", "x"], ["y"], name="add"),
    ]
    inits.append(numpy_helper.from_array(np.array([rows, 16], np.int64), "shape"))
    graph = helper.make_graph(
        nodes,
        f"{kind}_bomb",
        [helper.make_tensor_value_info("x", 1, [1, 16])],
        [helper.make_tensor_value_info("y", 1, [1, 16])],
        inits,
    )
    onnx.save(
        helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)]), path
    )
    return path


def emit(row: dict, out: str) -> None:
    line = json.dumps(row)
    print(line, flush=True)
    with open(os.path.join(out, "gpu_memory_bound.jsonl"), "a") as handle:
        handle.write(line + "\n")


def cgroup_limit() -> str:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as handle:
                return handle.read().strip()
        except OSError:
            continue
    return "unknown"


def control(out: str) -> None:
    """Does this kernel enforce RLIMIT_DATA on mmap at all (gVisor's may not)?"""
    code = (
        "import resource, numpy as np; hard = resource.getrlimit(resource.RLIMIT_DATA)[1]; resource.setrlimit(resource.RLIMIT_DATA, (1 << 30, hard));\n"
        "try:\n a = np.ones(3 << 28, np.float32); print('allocated', a.nbytes)\n"
        "except MemoryError as e:\n print('MemoryError', e)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    emit(
        {
            "kind": "control",
            "asked_gib": 3,
            "bound_gib": 1,
            "said": (proc.stdout + proc.stderr).strip()[-300:],
        },
        out,
    )


def run_probe(
    spec: str, model: str, feeds: str, bound: int, out: str, timeout: float = 300
) -> None:
    argv = [sys.executable, os.path.abspath(__file__), "probe", spec, model, feeds, str(bound)]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        emit(
            {
                "kind": "probe",
                "spec": spec,
                "model": os.path.basename(model),
                "bound": bound,
                "result": "timeout",
            },
            out,
        )
        return
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    row = (
        json.loads(lines[-1])
        if lines
        else {"result": f"exit {proc.returncode}: {proc.stderr.strip()[-400:]}"}
    )
    emit({"kind": "probe", "exit": proc.returncode, **row, "bound_asked_mib": bound >> 20}, out)


def run_cli(
    label: str, args: list[str], bound: str, out: str, code: str, timeout: float = 150
) -> None:
    """``reprokit ARGS`` run from ``code``: ``python -m`` puts the working folder before PYTHONPATH
    (device run 2's "candidate" rows ran the checkout's old code so: bench/results/gpu_memory_bound.md)."""
    env = dict(os.environ, PYTHONPATH=code + os.pathsep + os.environ.get("PYTHONPATH", ""))
    started = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "reprokit", *args, "--memory-bound", bound],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            stdin=subprocess.DEVNULL,
            cwd=code,
        )
        code_, text = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired:
        code_, text = None, "timeout"
    said = [
        line
        for line in text.splitlines()
        if line.startswith(("Error", "Hint", "DIVERGES", "AGREES", "REPRO"))
    ]
    emit(
        {
            "kind": "cli",
            "label": label,
            "code": "candidate" if "carry" in code else "old",
            "bound": bound,
            "exit": code_,
            "said": said[:3] or text.strip().splitlines()[-3:],
            "seconds": round(time.monotonic() - started, 1),
        },
        out,
    )


def main_all(ns) -> None:
    from reprokit.engine import memorybound

    os.makedirs(ns.out, exist_ok=True)
    default = memorybound.default_bound()
    with open("/proc/meminfo") as handle:
        total = handle.readline().split()[1]
    emit(
        {
            "kind": "machine",
            "kernel": platform.release(),
            "memtotal_gib": round(int(total) / 2**20, 1),
            "cgroup_memory_max": cgroup_limit(),
            "default_bound_gib": round(default / GIB, 1),
            "stack_allowance_mib": memorybound.stack_allowance() >> 20,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        ns.out,
    )
    control(ns.out)
    bounds = [0, default, *(int(float(g) * GIB) for g in ns.bounds_gib)]
    for spec in ns.targets:
        for name in ns.models:
            model, feeds = (
                os.path.join(ns.samples, f"{name}.{ext}") for ext in ("onnx", "inputs.npz")
            )
            for bound in bounds:
                run_probe(spec, model, feeds, bound, ns.out)
    sample = os.path.join(ns.samples, "attention_softmax_nan")
    for spec in (
        ns.targets if not ns.no_cli else ()
    ):  # the worker path end to end, candidate code (bounds GPU workers)
        for bound in ("auto", "2G", "1G", "512M"):
            run_cli(
                f"{spec} sample",
                [
                    "check",
                    sample + ".onnx",
                    "--target",
                    spec,
                    "--inputs",
                    sample + ".inputs.npz",
                    "--timeout",
                    "300",
                ],
                bound,
                ns.out,
                ns.candidate,
            )
    if not ns.bombs:
        return
    feeds = os.path.join(ns.out, "x.npz")
    np.savez(feeds, x=np.full((1, 16), 0.5, np.float32))
    spec = ns.targets[0]  # the GPU worker runs the bomb as reference and target alike
    cases = (  # the old code runs only what fits this machine unbounded
        (
            "host bomb 1.5x default",
            bomb("host", int(default * 1.5), os.path.join(ns.out, "hd.onnx")),
            "auto",
            False,
        ),
        ("host bomb 6 GiB", bomb("host", 6 * GIB, os.path.join(ns.out, "h6.onnx")), "2G", True),
        (
            "device bomb 32 GiB",
            bomb("device", 32 * GIB, os.path.join(ns.out, "d32.onnx")),
            "2G",
            True,
        ),
        ("device loop bomb", loop_bomb(os.path.join(ns.out, "loop.onnx")), "auto", True),
    )
    for label, model, bound, old_too in cases:
        args = [
            "check",
            model,
            "--target",
            spec,
            "--reference",
            spec,
            "--inputs",
            feeds,
            "--timeout",
            "300",
        ]
        for code in (ns.candidate, ns.old) if old_too else (ns.candidate,):
            run_cli(f"{spec} {label}", args, bound, ns.out, code)
    for name in ("h6.onnx", "d32.onnx"):
        run_probe(spec, os.path.join(ns.out, name), feeds, 2 * GIB, ns.out)


def loop_bomb(path: str) -> str:
    """A Loop that doubles a tensor 64 times: on the CUDA provider, GPU memory until it runs out."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    # x[1,16] -> Loop(64: v = Concat(v, v)) -> ReduceMean(0) -> Add(x) -> y[1,16]
    body = helper.make_graph(
        [
            helper.make_node("Concat", ["v_in", "v_in"], ["v_out"], axis=0),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "grow",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_in", TensorProto.FLOAT, None),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, None),
        ],
    )
    nodes = [
        helper.make_node("Loop", ["trips", "", "x"], ["big"], body=body, name="loop"),
        helper.make_node("ReduceMean", ["big"], ["m"], axes=[0], keepdims=1, name="mean"),
        helper.make_node("Add", ["m", "x"], ["y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes,
        "loop_bomb",
        [helper.make_tensor_value_info("x", 1, [1, 16])],
        [helper.make_tensor_value_info("y", 1, [1, 16])],
        [numpy_helper.from_array(np.array(64, np.int64), "trips")],
    )
    onnx.save(
        helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)]), path
    )
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("probe")
    one.add_argument("spec")
    one.add_argument("model")
    one.add_argument("feeds")
    one.add_argument("bound", type=int)
    every = sub.add_parser("all")
    every.add_argument("--out", required=True)
    every.add_argument("--targets", nargs="+", default=["ort:cuda"])
    every.add_argument("--bombs", action="store_true")
    every.add_argument("--no-cli", action="store_true", help="probes only")
    every.add_argument(
        "--samples", default=os.path.join(ROOT, "samples"), help="folder of the bundled samples"
    )
    every.add_argument(
        "--models", nargs="*", default=list(SAMPLES), help="which samples the probes run"
    )
    every.add_argument(
        "--bounds-gib",
        nargs="*",
        default=["8", "4", "2", "1", "0.5"],
        help="bounds the probes run under, besides none and the default",
    )
    every.add_argument("--candidate", default=ROOT, help="PYTHONPATH of the code under test")
    every.add_argument("--old", default=ROOT, help="PYTHONPATH of the code before")
    ns = parser.parse_args()
    if ns.command == "probe":
        print(json.dumps(probe(ns.spec, ns.model, ns.feeds, ns.bound)), flush=True)
        return 0
    main_all(ns)
    return 0


if __name__ == "__main__":
    sys.exit(main())
