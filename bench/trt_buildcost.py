"""Time TensorRT-RTX engine builds of the files bench/trt_buildcost_prepare.py wrote (GPU machine).

    python bench/trt_buildcost.py CASES_DIR OUT.jsonl [--deadline-s 500] [--cc 8.9]

A measuring harness, not reprokit code: it imports TensorRT-RTX's own bindings
(``tensorrt_rtx_bindings``) and onnx only. For every file of every case folder (manifest order):
parse the ONNX file into a strongly typed network, then build a serialized engine for compute
capability ``--cc`` (an ahead-of-time build: TensorRT-RTX refuses to run on the H100's 9.0 but
builds for 8.9 there), timing ``build_serialized_network`` alone:

- ``cold``: each build with no timing cache given (TensorRT makes a private one): twice, once
  for the calls of a captured run (``run_*``, ``polygraphy_*``);
- ``shared`` (captured runs only): one timing cache object per run, given to every build in the
  order the run made them (what a shrink run's calls share), once.

One JSON line per file: nodes, members, layers (network layers after parsing), distinct layer
configurations (type, input shapes and types), parse and build seconds, engine bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _trt():
    try:
        import tensorrt_rtx as trt
    except ImportError:
        import tensorrt_rtx_bindings as trt
    return trt


def _network(trt, builder, logger, path: str, shapes: dict):
    import onnx

    data = onnx.load(path).SerializeToString()  # external weights read in: the parser gets bytes
    flags = 0
    if hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    started = time.perf_counter()
    ok = parser.parse(data)
    parse_s = time.perf_counter() - started
    if not ok:
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        return None, parser, parse_s, errors[:400]
    return network, parser, parse_s, ""


def _nbytes(memory) -> int:
    """Bytes of a serialized host memory (TensorRT-RTX's IHostMemory has nbytes, no len)."""
    return int(getattr(memory, "nbytes", None) or len(memory))


def _configs(network) -> tuple[int, int, dict]:
    kinds: dict[str, int] = {}
    distinct = set()
    constants = 0
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        kind = str(layer.type).split(".")[-1]
        kinds[kind] = kinds.get(kind, 0) + 1
        constants += kind == "CONSTANT"
        ins = []
        for j in range(layer.num_inputs):
            t = layer.get_input(j)
            ins.append((tuple(t.shape), str(t.dtype)) if t is not None else None)
        distinct.add((kind, tuple(ins)))
    return len(distinct), constants, kinds


def _config(trt, builder, network, shapes: dict, cc: str, cache):
    config = builder.create_builder_config()
    if hasattr(config, "num_compute_capabilities"):
        major, minor = cc.split(".")
        config.num_compute_capabilities = 1
        config.set_compute_capability(getattr(trt.ComputeCapability, f"SM{major}{minor}"), 0)
    dynamic = [
        network.get_input(i)
        for i in range(network.num_inputs)
        if -1 in tuple(network.get_input(i).shape)
    ]
    if dynamic:
        profile = builder.create_optimization_profile()
        for tensor in dynamic:
            shape = shapes.get(tensor.name) or [max(d, 1) for d in tensor.shape]
            profile.set_shape(tensor.name, shape, shape, shape)
        config.add_optimization_profile(profile)
    if cache is not None:
        config.set_timing_cache(cache, False)
    return config


def measure(
    trt, builder, logger, path: str, row: dict, cc: str, shared_cache, repeats: int
) -> dict:
    network, parser, parse_s, error = _network(trt, builder, logger, path, row.get("shapes", {}))
    out = {k: v for k, v in row.items() if k != "shapes"}
    out["parse_s"] = round(parse_s, 4)
    if network is None:
        out["error"] = "parse: " + error
        return out
    out["layers"] = network.num_layers
    out["distinct_layers"], out["constant_layers"], out["layer_kinds"] = _configs(network)
    out["cold_s"] = []
    for _ in range(repeats):
        config = _config(trt, builder, network, row.get("shapes", {}), cc, None)
        started = time.perf_counter()
        engine = builder.build_serialized_network(network, config)
        out["cold_s"].append(round(time.perf_counter() - started, 4))
        if engine is None:
            out["error"] = "build failed"
            return out
        out["engine_bytes"] = engine.nbytes
        del engine
    if shared_cache is not None:
        try:
            config = _config(trt, builder, network, row.get("shapes", {}), cc, shared_cache)
            started = time.perf_counter()
            engine = builder.build_serialized_network(network, config)
            out["shared_s"] = round(time.perf_counter() - started, 4)
            del engine
        except Exception as error:  # noqa: BLE001 - the cold timings stand without it
            out["shared_error"] = f"{type(error).__name__}: {error}"[:200]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases")
    parser.add_argument("out")
    parser.add_argument("--deadline-s", type=float, default=500.0)
    parser.add_argument("--cc", default="8.9")
    parser.add_argument("--order", default="whole,single,subpack,run")
    args = parser.parse_args()
    trt = _trt()
    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    t0 = time.monotonic()
    folders = sorted(os.listdir(args.cases))
    ordered = [
        f
        for kind in args.order.split(",")
        for f in folders
        if f == kind or f.startswith(kind + "_")
    ]
    with open(args.out, "w") as sink:
        sink.write(json.dumps({"trt_version": trt.__version__, "cc": args.cc}) + "\n")
        # a first build pays for CUDA's and the builder's start: not counted in any row
        first = os.path.join(args.cases, "whole")
        rows = json.load(open(os.path.join(first, "manifest.json")))
        warm = min(rows, key=lambda r: r["nodes"])
        measure(trt, builder, logger, os.path.join(first, warm["file"]), warm, args.cc, None, 1)
        for folder in ordered:
            rows = json.load(open(os.path.join(args.cases, folder, "manifest.json")))
            probe = builder.create_builder_config()
            run = folder.startswith(("run_", "polygraphy_"))  # a run's calls, in its order
            cache = (
                probe.create_timing_cache(b"")
                if run and hasattr(probe, "create_timing_cache")
                else None
            )
            repeats = 1 if run else 2
            for row in rows:
                if time.monotonic() - t0 > args.deadline_s:
                    sink.write(
                        json.dumps({"case": folder, "file": row["file"], "skipped": "deadline"})
                        + "\n"
                    )
                    continue
                try:
                    result = measure(
                        trt,
                        builder,
                        logger,
                        os.path.join(args.cases, folder, row["file"]),
                        row,
                        args.cc,
                        cache,
                        repeats,
                    )
                except Exception as error:  # noqa: BLE001 - one file's failure is recorded, the rest measured
                    result = {**row, "error": f"{type(error).__name__}: {error}"[:300]}
                    result.pop("shapes", None)
                result["case"] = folder
                sink.write(json.dumps(result) + "\n")
                sink.flush()
                print(
                    folder,
                    row["file"],
                    result.get("layers"),
                    result.get("cold_s"),
                    result.get("shared_s"),
                    result.get("error", ""),
                    flush=True,
                )
            if cache is not None:
                sink.write(
                    json.dumps({"case": folder, "timing_cache_bytes": _nbytes(cache.serialize())})
                    + "\n"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
