"""Storage emulator: fp16/bf16 storage with fp32 arithmetic, on onnxruntime CPU.

Every float tensor — graph inputs, initializers and each node's float outputs, inside If/Loop/Scan
bodies too — is rounded
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

from reprokit.engine.backends.base import Availability, Backend, RunResult, module_version
from reprokit.engine.backends.ort import make_session, run_session
from reprokit.errors import EngineUnavailable, UsageError
from reprokit.graph.model import name_unnamed_nodes
from reprokit.spec import OptionDoc, TargetSpec
from reprokit.standalone.declared import widen_declared
from reprokit.standalone.emulation import (
    NARROW,
    CannotEmulate,
    emulate_model,
    lift_changes,
    round_through,
)


class EmulateBackend(Backend):
    engine = "emulate"
    summary = "fp16/bf16 storage emulator on onnxruntime CPU (predicts TensorRT FP16 trouble)"
    OPTIONS = {
        "fp16": OptionDoc("round every float tensor through IEEE fp16 (max 65504)"),
        "bf16": OptionDoc("round every float tensor through bfloat16 (8-bit mantissa)"),
        "typed": OptionDoc("run an explicit-precision model (fp16/bf16 Casts in the file, as AutoCast writes it) "
                           "as typed: only the tensors the file declares fp16/bf16 are rounded"),
        "fp32-nodes": OptionDoc(
            "keep these nodes' outputs in fp32, names separated by ';' (fp32-nodes=a;b)", "str"
        ),
    }
    deterministic = True
    reads_weights_dir = True
    runs_nodes_as_written = True  # onnxruntime with graph optimizations off; inputs rounded per reader
    install_hint = "pip install onnxruntime ml-dtypes"

    @classmethod
    def validate(cls, spec: TargetSpec) -> None:
        chosen = [p for p in (*NARROW, "typed") if spec.has(p)]
        if len(chosen) != 1:
            raise UsageError(
                "emulate needs exactly one precision: emulate:fp16, emulate:bf16 or emulate:typed",
                hint="e.g. --target emulate:fp16 (emulate:typed runs a model that is already fp16 as written)",
            )
        if spec.has("typed") and spec.has("fp32-nodes"):
            raise UsageError("emulate:typed takes no fp32-nodes=: the model's own Casts say what stays fp32",
                             hint="convert the model again with those nodes excluded (AutoCast --nodes_to_exclude)")

    def narrow(self) -> str:
        """fp16 or bf16 (emulate:typed: fp16, the tolerance's precision unless the run says otherwise)."""
        return "bf16" if self.spec.has("bf16") else "fp16"

    def precision(self) -> str:
        return self.narrow()

    @classmethod
    def probe(cls) -> Availability:
        return module_version("onnxruntime")

    def run(self, model_path, feeds, output_names):
        import onnx

        if self.spec.has("typed"):
            return self._run_typed(model_path, feeds, output_names)
        keep = frozenset(filter(None, str(self.spec.get("fp32-nodes", "")).split(";")))
        source = onnx.load(model_path, load_external_data=False)
        if keep:  # fp32-nodes may name an unnamed node by its label, OP_INDEX in this file
            name_unnamed_nodes(source)
        try:
            # the lift is checked before the rewrite exists: its runs' peak never holds that copy
            changed = lift_changes(source, feeds) if self.narrow() == "bf16" else None
            if changed:  # the rewrite's fault, not the engine's: never a verdict
                raise CannotEmulate(changed)
            model = emulate_model(source, self.narrow(), keep)
        except CannotEmulate as exc:
            raise EngineUnavailable(
                f"emulate:{self.narrow()} cannot emulate this model: {exc}",
                hint="use emulate:fp16 (no opset lift needed), or convert the model to opset >= 13 yourself",
            ) from exc
        weights = self.weights_dir or os.path.dirname(os.path.abspath(model_path))
        with tempfile.TemporaryDirectory(prefix="reprokit-emulate-") as tmp:
            path = os.path.join(tmp, "emulated.onnx")
            onnx.save(model, path)
            del source, model  # the session holds its own weights: the protos' copies would sit beside it
            session = make_session(path, weights_dir=weights)
            # float tensor inputs are rounded inside the model (for narrow readers only); a
            # sequence's tensors are rounded here
            rounded = {k: _rounded(v, self.narrow()) if isinstance(v, (list, tuple)) else v for k, v in feeds.items()}
            outputs = run_session(session, rounded, output_names)
        return RunResult(outputs=outputs, meta={"storage": self.narrow(), "fp32_nodes": sorted(keep)})

    def _run_typed(self, model_path, feeds, output_names):
        """The model as its file types it: fp16/bf16 tensors stored narrow, the rest float32."""
        import onnx

        weights = self.weights_dir or os.path.dirname(os.path.abspath(model_path))
        try:
            wide, narrow, keep = widen_declared(onnx.load(model_path, load_external_data=False))
            model = emulate_model(wide, narrow, keep) if narrow else wide
        except CannotEmulate as exc:
            raise EngineUnavailable(f"emulate:typed cannot run this model: {exc}",
                                    hint="run it on its engine (ort, trt:strongly-typed)") from exc
        with tempfile.TemporaryDirectory(prefix="reprokit-emulate-") as tmp:
            path = os.path.join(tmp, "typed.onnx")
            onnx.save(model, path)
            del model, wide
            session = make_session(path, weights_dir=weights)
            widened = {k: np.asarray(v, np.float32) if getattr(v, "dtype", None) in (np.float16,) else v
                       for k, v in feeds.items()}
            outputs = run_session(session, widened, output_names)
        return RunResult(outputs=outputs, meta={"storage": narrow or "fp32", "typed": True})


def _rounded(value, narrow: str):
    """A feed through the narrow type: a tensor, each tensor of a sequence; None stays None."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return [round_through(np.asarray(v), narrow) for v in value]
    return round_through(np.asarray(value), narrow)
