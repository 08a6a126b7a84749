"""Write, on the CPU, the ONNX files whose TensorRT-RTX build time bench/trt_buildcost.py measures.

    python bench/trt_buildcost_prepare.py OUT_DIR [--runs attention_softmax_nan,layernorm_overflow,det]

A harness, not a test: it owns no reprokit behaviour. Four kinds of files, each case a folder of
``OUT_DIR`` with a ``manifest.json`` (file, kind, nodes, members, input shapes) and one
``weights.bin`` holding each distinct initializer once (packs copy the same weights per member;
stored once they travel to the GPU machine within one transfer):

- ``whole``: the samples, PP-OCRv4 det/rec (rapidocr) and three HuggingFace exports with random
  weights (MobileNetV2, a 4-layer BERT, a 12-layer ViT-tiny), as given;
- ``single``: one node of each distinct op type of those models, cut with its producers' shapes;
- ``run``: every target call of a real ``reprokit shrink --target emulate:fp16`` run, in the order
  the run made them (the model files reprokit wrote, captured at ``Oracle.run_target``);
- ``subpack``: the first k members (k = 1, 2, 4, …) of the largest pack a run made — packs of k
  candidates exactly as ``build_pack`` writes them (members are concatenated in order);
- ``whole_pf`` and ``run_pf_*`` / ``polygraphy_pf_*`` (``--passfail ROWS``): bench_passfail.py's
  realistic exports as given and constant-folded (what a Constant node and the exporter's shape
  arithmetic cost a builder), and every model both tools' pass/fail check calls built on those
  rows (captured by bench/count_check.py, $BENCH_CAPTURE_DIR).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLES = os.path.join(ROOT, "samples")


class Case:
    """One folder: models whose initializers are stored once in weights.bin (external data)."""

    def __init__(self, folder: str):
        self.folder = folder
        os.makedirs(folder, exist_ok=True)
        self.blob = open(os.path.join(folder, "weights.bin"), "wb")
        self.offset = 0
        self.seen: dict[str, tuple[int, int]] = {}
        self.manifest: list[dict] = []

    def add(
        self, model, name: str, kind: str, shapes: dict, members: int = 1, extra: dict | None = None
    ):
        model = onnx.ModelProto.FromString(model.SerializeToString())
        for init in model.graph.initializer:
            raw = (
                numpy_helper.to_array(init).tobytes()
                if not init.HasField("raw_data")
                else init.raw_data
            )
            if len(raw) < 1024:
                continue  # small tensors stay inline
            if not init.HasField("raw_data"):
                init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init), init.name))
            key = hashlib.sha1(init.raw_data).hexdigest() + str(init.data_type)
            if key not in self.seen:
                self.blob.write(init.raw_data)
                self.seen[key] = (self.offset, len(init.raw_data))
                self.offset += len(init.raw_data)
            offset, length = self.seen[key]
            init.ClearField("raw_data")
            init.data_location = onnx.TensorProto.EXTERNAL
            del init.external_data[:]
            for k, v in (
                ("location", "weights.bin"),
                ("offset", str(offset)),
                ("length", str(length)),
            ):
                entry = init.external_data.add()
                entry.key, entry.value = k, v
        file = f"{name}.onnx"
        with open(os.path.join(self.folder, file), "wb") as handle:
            handle.write(model.SerializeToString())
        self.manifest.append(
            {
                "file": file,
                "kind": kind,
                "nodes": len(model.graph.node),
                "members": members,
                "inputs": len(model.graph.input),
                "outputs": len(model.graph.output),
                "shapes": {k: list(v) for k, v in shapes.items()},
                **(extra or {}),
            }
        )

    def close(self):
        self.blob.close()
        with open(os.path.join(self.folder, "manifest.json"), "w") as handle:
            json.dump(self.manifest, handle, indent=1)


def _ocr(name: str) -> str:
    import rapidocr_onnxruntime

    return os.path.join(os.path.dirname(rapidocr_onnxruntime.__file__), "models", name)


def _static(model, shapes: dict):
    """The model with its graph inputs fixed to ``shapes`` (TensorRT then needs no profile)."""
    for value in model.graph.input:
        if value.name in shapes:
            dims = value.type.tensor_type.shape.dim
            for dim, size in zip(dims, shapes[value.name]):
                dim.Clear()
                dim.dim_value = int(size)
    return model


def hf_models(folder: str) -> dict[str, str]:
    """MobileNetV2, BERT (4 layers) and ViT-tiny from transformers' configs, random weights
    (seed 0), exported with torch's ONNX exporter at opset 17, static shapes."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    made = {}
    cases = {
        "hf_mobilenetv2": (
            tf.MobileNetV2Model(tf.MobileNetV2Config()),
            (torch.randn(1, 3, 224, 224),),
            ["pixel_values"],
        ),
        "hf_bert4": (
            tf.BertModel(
                tf.BertConfig(
                    num_hidden_layers=4,
                    hidden_size=256,
                    num_attention_heads=4,
                    intermediate_size=1024,
                    vocab_size=2000,
                )
            ),
            (torch.randint(0, 2000, (1, 128)),),
            ["input_ids"],
        ),
        "hf_vit_tiny": (
            tf.ViTModel(
                tf.ViTConfig(
                    hidden_size=192,
                    num_hidden_layers=12,
                    num_attention_heads=3,
                    intermediate_size=768,
                )
            ),
            (torch.randn(1, 3, 224, 224),),
            ["pixel_values"],
        ),
    }

    class Wrap(torch.nn.Module):  # one keyword input, one tensor output
        def __init__(self, net, key):
            super().__init__()
            self.net, self.key = net, key

        def forward(self, x):
            return self.net(**{self.key: x}).last_hidden_state

    for name, (net, args, names) in cases.items():
        path = os.path.join(folder, f"{name}.onnx")
        wrapped = Wrap(net.eval(), names[0]).eval()
        torch.onnx.export(wrapped, args, path, input_names=names, opset_version=17, dynamo=False)
        made[name] = path
    return made


def whole_models(folder: str) -> dict[str, tuple[str, dict]]:
    models = {}
    for name in (
        "attention_softmax_nan",
        "layernorm_overflow",
        "conv_clip",
        "log_div_underflow",
        "static_batch_broadcast",
    ):
        feeds = np.load(os.path.join(SAMPLES, f"{name}.inputs.npz"))
        models[name] = (
            os.path.join(SAMPLES, f"{name}.onnx"),
            {k: feeds[k].shape for k in feeds.files},
        )
    models["ppocrv4_det"] = (_ocr("ch_PP-OCRv4_det_infer.onnx"), {"x": (1, 3, 320, 320)})
    models["ppocrv4_rec"] = (_ocr("ch_PP-OCRv4_rec_infer.onnx"), {"x": (1, 3, 48, 320)})
    for name, path in hf_models(folder).items():
        model = onnx.load(path)
        shapes = {
            v.name: tuple(d.dim_value for d in v.type.tensor_type.shape.dim)
            for v in model.graph.input
        }
        models[name] = (path, shapes)
    return models


def singles(model, shapes: dict, limit: int = 40) -> list:
    """One model per distinct op type: the node alone, its non-constant inputs as graph inputs
    with the shapes inference gives on the static model."""
    model = shape_inference.infer_shapes(
        _static(onnx.ModelProto.FromString(model.SerializeToString()), shapes)
    )
    graph = model.graph
    known = {v.name: v for v in list(graph.value_info) + list(graph.input) + list(graph.output)}
    inits = {t.name: t for t in graph.initializer}
    constants = {o: n for n in graph.node if n.op_type == "Constant" for o in n.output}
    done, out = set(), []
    for node in graph.node:
        if node.op_type in done or node.op_type == "Constant" or len(out) >= limit:
            continue
        ins, init, extra = [], [], []
        ok = True
        for tensor in node.input:
            if not tensor:
                continue
            if tensor in inits:
                init.append(inits[tensor])
            elif tensor in constants:
                extra.append(constants[tensor])
            elif tensor in known and all(
                d.HasField("dim_value") for d in known[tensor].type.tensor_type.shape.dim
            ):
                if known[tensor].type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
                    ok = False  # integer shape tensors cut as inputs turn shapes dynamic
                ins.append(known[tensor])
            else:
                ok = False
        outs = [known[o] for o in node.output if o in known]
        if not ok or len(outs) != len(node.output) or not ins:
            continue
        g = helper.make_graph([*extra, node], f"single_{node.op_type}", ins, outs, init)
        sub = helper.make_model(
            g, opset_imports=list(model.opset_import), ir_version=model.ir_version
        )
        try:
            onnx.checker.check_model(sub)
        except Exception:  # noqa: BLE001 - a node that cannot stand alone is simply not measured
            continue
        done.add(node.op_type)
        out.append(
            (
                node.op_type,
                sub,
                {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in ins},
            )
        )
    return out


# Patched into the shrink subprocess: copies every model a target call builds, with its feeds' shapes.
_CAPTURE = r"""
import json, os, shutil, sys
from reprokit.engine import oracle
where = os.environ["H39_CAPTURE"]
os.makedirs(where, exist_ok=True)
real = oracle.Oracle.run_target
def run_target(self, model_path, feeds, output_names=None):
    n = len(os.listdir(where)) // 2
    shutil.copy(model_path, os.path.join(where, f"call{n:03d}.onnx"))
    with open(os.path.join(where, f"call{n:03d}.json"), "w") as h:
        json.dump({k: list(getattr(v, "shape", ())) for k, v in feeds.items()}, h)
    return real(self, model_path, feeds, output_names)
oracle.Oracle.run_target = run_target
from reprokit.cli.app import main
sys.exit(main(sys.argv[1:]))
"""


def capture_runs(name: str, raw_rk: str, raw_pg: str) -> None:
    """Both tools on bench_shrink.py's row ``name`` (same target, feeds, checks); every model a
    target call builds is copied: reprokit's at Oracle.run_target, polygraphy's by the check
    command (bench/oracle_check.py, $BENCH_CAPTURE_DIR)."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import bench_shrink

    spec = next(m for m in bench_shrink.models() if m["name"] == name)
    work = tempfile.mkdtemp(prefix="h39-run-")
    feeds = bench_shrink.prepare_feeds(spec, work)
    cmd = [
        sys.executable,
        "-c",
        _CAPTURE,
        "shrink",
        spec["path"],
        "--target",
        spec["target"],
        "--inputs",
        feeds["npz"],
        "-o",
        os.path.join(work, "out"),
    ]
    for key, dims in spec["shapes"].items():
        cmd += ["--input-shapes", f"{key}:{'x'.join(map(str, dims))}"]
    subprocess.run(
        cmd,
        env={**os.environ, "H39_CAPTURE": raw_rk},
        check=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.environ["BENCH_CAPTURE_DIR"] = raw_pg
    try:
        bench_shrink.run_polygraphy(spec, feeds, os.path.join(work, "polygraphy"))
    finally:
        del os.environ["BENCH_CAPTURE_DIR"]
    shutil.rmtree(work, ignore_errors=True)


def _static_shapes(model, npz: str | None) -> dict:
    """Input shapes a builder needs for ``model``: the feeds' where given, else its own dims."""
    shapes = {}
    if npz and os.path.exists(npz):
        with np.load(npz) as data:
            shapes = {k: list(data[k].shape) for k in data.files}
    for value in model.graph.input:
        if value.name not in shapes:
            shapes[value.name] = [d.dim_value or 1 for d in value.type.tensor_type.shape.dim]
    return shapes


def capture_passfail(rows: list[str], out: str) -> None:
    """bench_passfail.py's rows whose name holds one of ``rows``: both tools' check calls, copied
    by bench/count_check.py, become ``run_pf_<n>`` / ``polygraphy_pf_<n>``; the realistic exports
    as given and folded become ``whole_pf``."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import bench_passfail

    from reprokit.engine.folding import fold_constants

    root = tempfile.mkdtemp(prefix="h39-pf-")
    whole, seen = Case(os.path.join(out, "whole_pf")), set()
    for number, case in enumerate(bench_passfail.scenarios(root)):
        if not any(r in case["name"] for r in rows):
            continue
        path, npz = case["model"][0], case["model"][1]
        model = onnx.load(path)
        shapes = _static_shapes(model, npz)
        stem = os.path.basename(path)[:-5]
        if stem not in seen:
            seen.add(stem)
            whole.add(model, f"{stem}__given", "whole", shapes)
            whole.add(fold_constants(model, path), f"{stem}__folded", "whole", shapes)
        for tool, run in (("run", bench_passfail.run_reprokit), ("polygraphy", bench_passfail.run_polygraphy)):
            raw = tempfile.mkdtemp(prefix=f"h39-{tool}-")
            work = os.path.join(root, f"{number}-{tool}")
            os.makedirs(work)
            os.environ["BENCH_CAPTURE_DIR"] = raw
            try:
                row = run(case, work)
            finally:
                del os.environ["BENCH_CAPTURE_DIR"]
            print(f"{case['name']}: {tool} {row.get('calls')} calls, {row.get('nodes_built')} nodes", flush=True)
            folder = Case(os.path.join(out, f"{tool}_pf_{number:02d}"))
            for file in sorted(f for f in os.listdir(raw) if f.endswith(".onnx")):
                call = onnx.load(os.path.join(raw, file))
                folder.add(call, file[:-5], tool, _static_shapes(call, npz), extra={"row": case["name"]})
            folder.close()
            shutil.rmtree(raw, ignore_errors=True)
    whole.close()
    shutil.rmtree(root, ignore_errors=True)


def sub_pack(model, k: int):
    """The first ``k`` members of a pack written by build_pack (names ``rk{i}/...``)."""
    graph = model.graph
    keep = [
        n
        for n in graph.node
        if any(o.startswith(tuple(f"rk{i}/" for i in range(k))) for o in n.output)
    ]
    used = {t for n in keep for t in n.input}
    prefixes = tuple(f"rk{i}/" for i in range(k))
    g = helper.make_graph(
        keep,
        "reprokit_pack",
        [v for v in graph.input if v.name in used],
        [v for v in graph.output if v.name.startswith(prefixes)],
        [t for t in graph.initializer if t.name in used],
    )
    sub = helper.make_model(g, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    sub.functions.extend(model.functions)
    return sub


def members_of(model) -> int:
    return len({o.name.split("/", 1)[0] for o in model.graph.output if o.name.startswith("rk")})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument(
        "--runs",
        default="attention_softmax_nan,layernorm_overflow,conv_clip,ppocrv4_det emulate:bf16 picture",
        help="bench_shrink.py rows whose calls both tools make are captured (comma-separated)",
    )
    parser.add_argument(
        "--passfail",
        default="",
        help="bench_passfail.py rows (name substrings, comma-separated) whose check calls both tools "
        "make are captured, with the realistic exports as given and folded (whole_pf)",
    )
    args = parser.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    os.makedirs(args.out)
    exports = tempfile.mkdtemp(prefix="h39-hf-")
    models = whole_models(exports)
    whole = Case(os.path.join(args.out, "whole"))
    single = Case(os.path.join(args.out, "single"))
    for name, (path, shapes) in models.items():
        model = onnx.load(path)
        whole.add(model, name, "whole", shapes)
        for op, sub, sub_shapes in singles(model, shapes):
            single.add(sub, f"{name}__{op}", "single", sub_shapes, extra={"model": name, "op": op})
    whole.close()
    single.close()
    for name in [r for r in args.runs.split(",") if r]:
        slug = name.split()[0] + ("_" + name.split()[1].replace(":", "-") if " " in name else "")
        raw_rk, raw_pg = tempfile.mkdtemp(prefix="h39-rk-"), tempfile.mkdtemp(prefix="h39-pg-")
        capture_runs(name, raw_rk, raw_pg)
        case = Case(os.path.join(args.out, f"run_{slug}"))
        biggest, most, big_shapes = None, 1, {}
        for file in sorted(f for f in os.listdir(raw_rk) if f.endswith(".onnx")):
            model = onnx.load(os.path.join(raw_rk, file))
            with open(os.path.join(raw_rk, file.replace(".onnx", ".json"))) as handle:
                shapes_in = json.load(handle)
            members = members_of(model) or 1
            case.add(model, file[:-5], "run", shapes_in, members=members)
            if members > most:
                biggest, most, big_shapes = model, members, shapes_in
        case.close()
        pg = Case(os.path.join(args.out, f"polygraphy_{slug}"))
        for file in sorted(f for f in os.listdir(raw_pg) if f.endswith(".onnx")):
            pg.add(onnx.load(os.path.join(raw_pg, file)), file[:-5], "polygraphy", {})
        pg.close()
        if biggest is not None:
            subs = Case(os.path.join(args.out, f"subpack_{slug}"))
            k = 1
            while k < most:
                sub = sub_pack(biggest, k)
                subs.add(
                    sub,
                    f"k{k:03d}",
                    "subpack",
                    {i.name: big_shapes[i.name] for i in sub.graph.input if i.name in big_shapes},
                    members=k,
                )
                k *= 4
            subs.add(biggest, f"k{most:03d}", "subpack", big_shapes, members=most)
            subs.close()
        shutil.rmtree(raw_rk, ignore_errors=True)
        shutil.rmtree(raw_pg, ignore_errors=True)
    shutil.rmtree(exports, ignore_errors=True)
    if args.passfail:
        capture_passfail([r for r in args.passfail.split(",") if r], args.out)
    for case in sorted(os.listdir(args.out)):
        with open(os.path.join(args.out, case, "manifest.json")) as handle:
            rows = json.load(handle)
        size = sum(
            os.path.getsize(os.path.join(args.out, case, f))
            for f in os.listdir(os.path.join(args.out, case))
        )
        print(f"{case}: {len(rows)} files, {size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
