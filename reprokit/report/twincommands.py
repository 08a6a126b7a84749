"""The TensorRT commands of a ``--reference-model`` archive: the target's model is the user's own
converted cut, ``model.target.onnx``, built strongly typed as written (no precision flag exists
for it on TensorRT 11, and one would build another engine on 10.x); the reference is the fp32
cut, ``model.onnx``, on onnxruntime. polygraphy compares two models in two runs: the first saves
onnxruntime's outputs of ``model.onnx``, the second builds ``model.target.onnx`` and compares
against them (``--load-outputs``; an fp16 output is compared with the fp32 one as is).

``--strongly-typed`` / ``--stronglyTyped`` is required on TensorRT 10.x and accepted (ignored) on
11.x, where every network is strongly typed: the same line runs on both. TensorRT 8.6 has no
strongly typed networks. Text only: runs nothing.
"""

from __future__ import annotations

import shlex

SAVED = "reference_outputs.json"  # polygraphy's own RunResults of model.onnx, written by the first run


def reference_run(saved: str = SAVED) -> list[str]:
    """polygraphy's arguments (after ``polygraphy``) that save the fp32 cut's onnxruntime outputs."""
    return ["run", "model.onnx", "--onnxrt", "--load-inputs", "inputs.json", "--save-outputs", saved]


def target_run(spec, verdict, saved: str = SAVED) -> list[str]:
    """polygraphy's arguments that build the converted cut strongly typed and compare it."""
    tol = verdict.criterion
    tf32 = [] if spec.has("no-tf32") else ["--tf32"]  # reprokit's trt leaves TF32 on, as TensorRT does
    return ["run", "model.target.onnx", "--trt", "--strongly-typed", *tf32, "--load-inputs", "inputs.json",
            "--load-outputs", saved, "--atol", f"{tol.atol:g}", "--rtol", f"{tol.rtol:g}",
            "--check-error-stat", "mean"]


def twin_commands(spec, verdict, bins: dict[str, str]) -> dict[str, str]:
    """``polygraphy_command`` and ``trtexec_command`` for the archive's commands.sh and ISSUE.md."""
    loads = ",".join(f"{name}:{path}" for name, path in bins.items())
    trtexec = ["trtexec", "--onnx=model.target.onnx", "--stronglyTyped",
               *([f"--loadInputs={loads}"] if loads else []), "--dumpOutput", "--verbose"]
    return {"polygraphy_command": shlex.join(["polygraphy", *reference_run()]) + " && "
            + shlex.join(["polygraphy", *target_run(spec, verdict)]),
            "trtexec_command": shlex.join(trtexec)}
