"""Storage emulator: fp16/bf16 storage with fp32 arithmetic, on onnxruntime CPU.

Every float tensor — graph inputs, initializers and each node's float outputs — is rounded
through the narrow type (overflow past the narrow maximum becomes inf, tiny values underflow to
zero), while each op computes in fp32: the semantics of TensorRT's FP16 kernels (fp16 storage,
fp32 accumulation). It predicts FP16 trouble on a machine with no GPU.

Rounding of node outputs is done by rewriting the graph with Cast(narrow)→Cast(float) pairs,
so onnxruntime runs with graph optimizations off (they would fold the pairs away).
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

from reprokit.backends.base import Availability, Backend, RunResult, module_version
from reprokit.errors import UsageError
from reprokit.spec import OptionDoc, TargetSpec

_NARROW = {"fp16": "float16", "bf16": "bfloat16"}


def round_through(array: np.ndarray, narrow: str) -> np.ndarray:
    """Round a float32 array through fp16/bf16 and back (numpy, no engine)."""
    if array.dtype != np.float32:
        return array
    if narrow == "fp16":
        with np.errstate(over="ignore"):
            return array.astype(np.float16).astype(np.float32)
    import ml_dtypes

    return array.astype(ml_dtypes.bfloat16).astype(np.float32)


def emulate_model(model, narrow: str, keep_fp32: frozenset[str] = frozenset()):
    """Return a copy of ``model`` whose float storage is rounded through ``narrow``.

    ``keep_fp32`` names nodes whose outputs stay fp32 (the "keep this layer in FP32" knob).
    Tensor names are unchanged: each float output ``t`` is produced as ``t`` by a Cast pair
    fed from the node's renamed wide output.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.ModelProto.FromString(model.SerializeToString())
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # shape inference is best effort; unknown types are left wide
        inferred = model
    graph = model.graph
    float_names = {
        vi.name
        for vi in list(inferred.graph.value_info) + list(inferred.graph.output)
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT
    }
    narrow_type = TensorProto.FLOAT16 if narrow == "fp16" else TensorProto.BFLOAT16
    for init in graph.initializer:
        if init.data_type == TensorProto.FLOAT:
            rounded = round_through(numpy_helper.to_array(init), narrow)
            init.CopyFrom(numpy_helper.from_array(rounded, init.name))
    new_nodes = []
    for index, node in enumerate(graph.node):
        new_nodes.append(node)
        if node.name in keep_fp32:
            continue
        for slot, name in enumerate(node.output):
            if not name or name not in float_names:
                continue
            wide, mid = f"{name}__rk_wide{index}", f"{name}__rk_narrow{index}"
            node.output[slot] = wide
            new_nodes.append(helper.make_node("Cast", [wide], [mid], to=narrow_type, name=mid))
            new_nodes.append(helper.make_node("Cast", [mid], [name], to=TensorProto.FLOAT, name=name + "__rk_cast"))
    del graph.node[:]
    graph.node.extend(new_nodes)
    return model


class EmulateBackend(Backend):
    engine = "emulate"
    summary = "fp16/bf16 storage emulator on onnxruntime CPU (predicts TensorRT FP16 trouble)"
    OPTIONS = {
        "fp16": OptionDoc("round every float tensor through IEEE fp16 (max 65504)"),
        "bf16": OptionDoc("round every float tensor through bfloat16 (8-bit mantissa)"),
        "fp32-nodes": OptionDoc(
            "keep these nodes' outputs in fp32, names separated by ';' (fp32-nodes=a;b)", "str"
        ),
    }
    deterministic = True
    install_hint = "pip install onnxruntime ml-dtypes"

    @classmethod
    def validate(cls, spec: TargetSpec) -> None:
        chosen = [p for p in _NARROW if spec.has(p)]
        if len(chosen) != 1:
            raise UsageError(
                "emulate needs exactly one precision: emulate:fp16 or emulate:bf16",
                hint="e.g. --target emulate:fp16",
            )

    def narrow(self) -> str:
        return "fp16" if self.spec.has("fp16") else "bf16"

    def precision(self) -> str:
        return self.narrow()

    @classmethod
    def probe(cls) -> Availability:
        return module_version("onnxruntime")

    def run(self, model_path, feeds, output_names):
        import onnx

        from reprokit.backends.ort import make_session, run_session

        keep = frozenset(filter(None, str(self.spec.get("fp32-nodes", "")).split(";")))
        model = emulate_model(onnx.load(model_path), self.narrow(), keep)
        with tempfile.TemporaryDirectory(prefix="reprokit-emulate-") as tmp:
            path = os.path.join(tmp, "emulated.onnx")
            onnx.save(model, path, save_as_external_data=model.ByteSize() > 1_800_000_000)
            session = make_session(path)
            rounded = {k: round_through(np.asarray(v), self.narrow()) for k, v in feeds.items()}
            outputs = run_session(session, rounded, output_names)
        return RunResult(outputs=outputs, meta={"storage": self.narrow(), "fp32_nodes": sorted(keep)})
