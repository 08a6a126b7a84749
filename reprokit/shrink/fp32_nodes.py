"""What a target spec says about keeping chosen nodes in fp32 (``fp32-nodes=``): whether the
engine can, whether one call can judge several sets (whole-model copies with their own names),
and the spec with a set named. The precision search (``precision.py``) and audit read it.
"""

from __future__ import annotations

from reprokit.spec import TargetSpec, parse_target


def fp32_nodes_support(target: str) -> tuple[bool, str]:
    """(does the target keep chosen nodes in fp32, why not / how). Engines with no per-node
    precision are said so, never offered an ``fp32-nodes=`` they would refuse."""
    spec = parse_target(target)
    narrow = [p for p in ("fp16", "bf16", "int8", "fp8") if spec.has(p)]
    if spec.engine == "emulate" and spec.has("typed"):
        return False, ("emulate:typed runs the model's own precision: convert it again with the nodes excluded "
                       "(AutoCast --nodes_to_exclude)")
    if spec.engine == "emulate":
        return True, "the emulator leaves the named nodes' outputs unrounded"
    if spec.engine == "ort":
        if spec.has("cuda") and narrow:
            return True, "onnxruntime CUDA keeps the named nodes in float32 between Casts"
        return False, f"{spec} computes in fp32 already: there is no narrow type to keep nodes out of"
    if spec.engine == "trt":
        if narrow:
            return True, "TensorRT pins the named nodes' layers to FP32 (precision constraints) or keeps them between Casts"
        return False, f"{spec} computes in fp32 (TF32 aside): no narrow type to keep nodes out of"
    if spec.engine == "openvino":
        if not (spec.has("f32")):
            return True, "OpenVINO marks the named nodes' operations precise (rt_info), so the CPU plugin keeps them in f32"
        return False, "openvino:f32 computes in f32 already"
    return False, f"the {spec.engine} engine has no per-node precision reprokit can set"


def packable(target: str) -> bool:
    """Can one call judge several fp32 sets (whole-model copies with their own names)?"""
    spec = parse_target(target)
    if spec.engine == "emulate":
        return True
    return spec.engine == "ort" and spec.has("cuda") and (spec.has("fp16") or spec.has("bf16"))


def with_nodes(target: str, nodes) -> str:
    """``target`` with ``fp32-nodes=`` set to ``nodes`` (replacing any given)."""
    spec = parse_target(target)
    options = [(k, v) for k, v in spec.options if k != "fp32-nodes"]
    if nodes:
        options.append(("fp32-nodes", ";".join(nodes)))
    return str(TargetSpec(spec.engine, tuple(options), spec.command))
