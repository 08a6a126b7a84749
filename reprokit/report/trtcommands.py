"""The TensorRT commands of an archive, exactly as built, in both typings (issue 36): weakly typed
(TensorRT 8.6–10.x: builder flags, every layer of the fp32 nodes pinned under obey by repro.py's
fp32_layers, or by name where a TensorRT build recorded the layer names) and strongly typed
(TensorRT 11.x, TensorRT-RTX, 10.x with --strongly-typed: the explicit-precision model reprokit
converted, in the archive, with no precision flag). What exists on which version is read from
:mod:`reprokit.engine.backends.trt_versions`; every polygraphy line is parsed by polygraphy's own
argument parser in tests/test_trt_commands.py. Also the template values around them: the pinned
install line, the words on the converted model (which file TensorRT built, by which rules) and
the facts table repro.py reads. Words only: builds and runs nothing.

Facts relied on: polygraphy 0.53.6 ``run`` (tools/args/backend/trt/loader.py:
--trt-network-postprocess-script FILE:FUNC, called with the parsed network, --strongly-typed; config.py: --precision-constraints, --int8 calibrating over the
data loader, i.e. --load-inputs); trtexec's --layerPrecisions=NAME:fp32 --precisionConstraints=obey
and --stronglyTyped (10.x; 11.x "no longer needed: always enabled", migration guide); --fp16 with
--strongly-typed is refused on 10.x (NVIDIA/TensorRT#4253), so the strongly typed form has none.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

import numpy as np

from reprokit.engine.backends.trt_setup import GPU_REFUSED, has_qdq
from reprokit.engine.backends.trt_versions import FACTS, Typing, facts_for

_NARROW = ("fp16", "bf16", "int8", "fp8")


@dataclass(frozen=True)
class TrtForm:
    """One way to build the archive's model with TensorRT, and where it runs."""

    typing: Typing
    versions: str  # the TensorRT versions this form runs on, in words
    model: str  # the file TensorRT builds
    polygraphy: str | None  # None: this form cannot build what the archive reports (why_not says)
    trtexec: str | None
    install: str  # the pip line that gives a TensorRT this form runs on
    built: bool  # the form reprokit's own run used
    why_not: str = ""
    lines: tuple[str, ...] = ()  # the keys of trt_versions.FACTS this form's commands run on

    @property
    def label(self) -> str:
        words = "Weakly typed" if self.typing is Typing.WEAK else "Strongly typed"
        return f"{words} ({self.versions})" + (", as reprokit built it" if self.built else "")


def fp32_node_list(spec) -> list[str]:
    return [n.strip() for n in str(spec.get("fp32-nodes", "")).split(";") if n.strip()]


def narrow_of(spec) -> str | None:
    """The float type a strongly typed build converts the model to (fp16/bf16), if any."""
    return next((p for p in ("fp16", "bf16") if spec.has(p)), None)


def converted_file(spec) -> str | None:
    """The explicit-precision model in the archive a strongly typed TensorRT builds."""
    narrow = narrow_of(spec)
    return f"model.{narrow}.onnx" if narrow and spec.engine in ("trt", "emulate") else None


def trt_forms(
    spec,
    criterion,
    bins: dict[str, str],
    *,
    built_typing: str | None,
    qdq: bool,
    env: dict | None = None,
    pinned: dict[str, list[str]] | None = None,
) -> tuple[TrtForm, TrtForm]:
    """(weakly typed, strongly typed) forms for a ``trt`` or ``emulate`` target. ``built_typing``:
    the verdict's mode ("weakly-typed"/"strongly-typed") when TensorRT ran, else None; ``qdq``:
    whether the model holds Q/DQ nodes; ``env``: the fingerprint whose versions pin the install;
    ``pinned``: fp32-nodes label -> the layer names a weakly typed TensorRT build of this archive
    gave them (the verdict's fp32_layers), None where no TensorRT parsed the model."""
    tail = [
        "--onnxrt",
        "--load-inputs",
        "inputs.json",
        "--atol",
        f"{criterion.atol:g}",
        "--rtol",
        f"{criterion.rtol:g}",
        "--check-error-stat",
        "mean",
    ]
    loads = ",".join(f"{name}:{path}" for name, path in bins.items())
    exec_tail = ([f"--loadInputs={loads}"] if loads else []) + ["--dumpOutput", "--verbose"]
    common, exec_common = _common(spec)
    nodes = fp32_node_list(spec)
    weak_prec = (
        [p for p in _NARROW if spec.has(p)] if spec.engine == "trt" else [narrow_of(spec) or "fp16"]
    )
    pins = _pins(env or {})
    made_with = _made_with((env or {}).get("tensorrt") or {})

    # A node's first layer is NODE, its later ones NODE_<counter> (a Gemm "fc" with a bias: fc
    # and fc_0), an unnamed one's node_of_<first output> (tests/golden/trt_layer_names.txt): a
    # name list pins every layer only where a parser gave the names; repro.py's fp32_layers pins
    # by each layer's recorded origin, as reprokit's backend does
    layer = (
        [
            "--trt-network-postprocess-script",
            "repro.py:fp32_layers",
            "--precision-constraints",
            "obey",
        ]
        if nodes
        else []
    )
    names = [name for n in nodes for name in (pinned or {}).get(n, [])]
    known = bool(nodes) and all((pinned or {}).get(n) for n in nodes)
    exec_layer = (
        [f"--layerPrecisions={','.join(f'{n}:fp32' for n in names)}", "--precisionConstraints=obey"]
        if known
        else []
    )
    weak_poly = [
        "polygraphy",
        "run",
        "model.onnx",
        "--trt",
        *[f"--{p}" for p in weak_prec],
        *common,
        *layer,
        *tail,
    ]
    weak_exec = [
        "trtexec",
        "--onnx=model.onnx",
        *[f"--{p}" for p in weak_prec],
        *exec_common,
        *exec_layer,
        *exec_tail,
    ]
    weak_why = ""
    weak_trtexec: str | None = shlex.join(weak_exec)
    if nodes and not known:
        weak_trtexec = None
        weak_why = (
            "trtexec pins layers by name, and TensorRT's ONNX parser names a node's later layers "
            "NODE_<counter> (known only once it parsed the model): use the polygraphy command, whose "
            "repro.py:fp32_layers pins every layer made from the fp32-nodes, as reprokit does"
        )
    if "int8" in weak_prec and not qdq:  # trtexec --int8 without --calib sets placeholder ranges
        weak_trtexec = None
        weak_why = (
            "trtexec --int8 without a calibration cache uses placeholder dynamic ranges, not this "
            "calibration: use the polygraphy command, which calibrates on inputs.json"
        )
    weak_lines = _weak_lines(weak_prec)
    # the TensorRT the archive was made with is pinned only in a form that runs on it
    weak_pin = pins["tensorrt"] if made_with in weak_lines else "'tensorrt>=10,<11'"
    weak = TrtForm(
        Typing.WEAK,
        _weak_versions(weak_prec, weak_lines) + "; not 11, which removed the precision flags",
        "model.onnx",
        shlex.join(weak_poly),
        weak_trtexec,
        _install(pins, weak_pin),
        built_typing == "weakly-typed",
        weak_why,
        weak_lines,
    )

    model = converted_file(spec) or "model.onnx"
    strong_poly: str | None = shlex.join(
        ["polygraphy", "run", model, "--trt", "--strongly-typed", *common, *tail]
    )
    strong_exec: str | None = shlex.join(
        ["trtexec", f"--onnx={model}", "--stronglyTyped", *exec_common, *exec_tail]
    )
    strong_why = ""
    quantized = [p.upper() for p in ("int8", "fp8") if spec.has(p)]
    if quantized and not qdq:
        strong_poly = strong_exec = None
        strong_why = (
            f"a strongly typed TensorRT builds {'/'.join(quantized)} only from Q/DQ nodes and this model has "
            "none: quantize it first (onnxruntime.quantization.quantize_static, or NVIDIA ModelOpt)"
        )
    strong_pin = pins["tensorrt"] if made_with == "11" else "tensorrt"
    strong = TrtForm(
        Typing.STRONG,
        "TensorRT 11.x, 10.x with --strongly-typed, and TensorRT-RTX with "
        "POLYGRAPHY_USE_TENSORRT_RTX=1",
        model,
        strong_poly,
        strong_exec,
        _install(pins, strong_pin),
        built_typing == "strongly-typed",
        strong_why,
        tuple(f.key for f in FACTS if f.strongly_typed_flag),
    )
    return weak, strong


def _made_with(trt: dict) -> str | None:
    """The FACTS key of the TensorRT in an archive's fingerprint (TensorRT-RTX: "rtx"), if any."""
    version = trt.get("version")
    if not version or not version[0].isdigit():
        return None
    return facts_for(version, rtx="rtx" in (trt.get("distribution") or "")).key


def _weak_lines(precisions: list[str]) -> tuple[str, ...]:
    """The weakly typed version lines whose builder flags and ONNX parser build ``precisions``."""
    return tuple(
        f.key
        for f in FACTS
        if f.default_typing is Typing.WEAK
        and all(f.narrow_by_flag(p) for p in precisions)
        and ("fp8" not in precisions or "FP8" in f.qdq_types)
    )


def _weak_versions(precisions: list[str], lines: tuple[str, ...]) -> str:
    if "8.6" in lines:
        return "TensorRT 8.6–10.x"
    why = "8.6 has no BF16 flag" if "bf16" in precisions else "8.6's ONNX parser reads no FP8 Q/DQ"
    return f"TensorRT 10.x; {why}"


def _common(spec) -> tuple[list[str], list[str]]:
    """The options both typings share: TF32, optimization level, workspace."""
    poly, exe = [], []
    if spec.engine != "trt" or not spec.has("no-tf32"):
        poly.append("--tf32")
    else:
        exe.append("--noTF32")
    if spec.engine == "trt" and spec.has("opt-level"):
        poly += ["--builder-optimization-level", str(spec.get("opt-level"))]
        exe.append(f"--builderOptimizationLevel={spec.get('opt-level')}")
    if spec.engine == "trt" and spec.has("workspace"):
        poly += ["--pool-limit", f"workspace:{spec.get('workspace')}M"]
        exe.append(f"--memPoolSize=workspace:{spec.get('workspace')}M")
    return poly, exe


def _pins(env: dict) -> dict[str, str]:
    """``name==version`` of the packages the archive was made with (the name alone when absent)."""
    packages = env.get("packages") or {}
    out = {
        name: f"{name}=={packages[name]}" if packages.get(name) else name
        for name in ("numpy", "onnx", "onnxruntime", "polygraphy")
    }
    trt = env.get("tensorrt") or {}
    out["tensorrt"] = (
        f"{trt.get('distribution') or 'tensorrt'}=={trt['version']}"
        if trt.get("version")
        else "tensorrt"
    )
    return out


def _install(pins: dict[str, str], tensorrt: str) -> str:
    return f"pip install {pins['numpy']} {pins['onnx']} {pins['onnxruntime']} {tensorrt} {pins['polygraphy']}"


def install_line(env: dict, engine_packages: str) -> str:
    """The pip line of ISSUE.md's Steps To Reproduce, pinned to the versions it was reproduced with."""
    pins = _pins(env)
    extra = []
    for name in engine_packages.split():
        extra.append(pins.get(name) or _pinned(env, name))
    return " ".join(["pip install", pins["numpy"], pins["onnx"], pins["onnxruntime"], *extra])


def _pinned(env: dict, name: str) -> str:
    version = (env.get("packages") or {}).get(name)
    return f"{name}=={version}" if version else name


def repro_facts() -> dict:
    """What repro.py's SETTINGS hold of reprokit's own TensorRT knowledge (never an archive's):
    the facts per version and the words of a GPU refusal. Pack and the matrix's reproducer
    (report/reproducer.py) both put exactly this in."""
    return {"trt_facts": [f.to_json() for f in FACTS], "gpu_refused": GPU_REFUSED.pattern}


def trt_values(
    spec, verdict, model, bins, env, engine_packages: str, conversion: dict | None = None
) -> dict:
    """Template values of issue 36: the pinned install line, and for trt/emulate both TensorRT
    forms (commands.sh and ISSUE.md print both) and the explicit-precision model's words."""
    values = {
        "install_line": install_line(env, engine_packages),
        "trt_forms": [],
        "converted": "",
        "converted_file": None,
    }
    if spec.engine not in ("trt", "emulate"):
        return values
    forms = trt_forms(
        spec,
        verdict.criterion,
        bins,
        built_typing=verdict.target_meta.get("mode"),
        qdq=has_qdq(model),
        env=env,
        pinned=verdict.target_meta.get("fp32_layers"),
    )
    values["trt_forms"] = list(forms)
    built = next((f for f in forms if f.built), None)
    if built is not None:  # what TensorRT ran; an emulate archive ran none
        values["install_line"] = built.install
    if conversion is not None:  # the archive holds the converted model
        values["converted"] = conversion_words(spec, verdict, conversion)
        values["converted_file"] = converted_file(spec)
    return values


def beyond_range(model, narrow: str) -> list[str]:
    """Initializers with finite values past the narrow type's largest (clamped by the conversion)."""
    from onnx import numpy_helper

    limit = {"fp16": 65504.0, "bf16": 3.3895313892515355e38}[narrow]
    out = []
    for init in model.graph.initializer:
        if init.data_type != 1:  # float32 only: the conversion narrows these
            continue
        values = numpy_helper.to_array(init)
        if values.size and np.any(np.isfinite(values) & (np.abs(values) > limit)):
            out.append(init.name)
    return out


def conversion_words(spec, verdict, conversion: dict) -> str:
    """Which file a strongly typed TensorRT builds and how reprokit made it (ISSUE.md, Relevant Files)."""
    name = converted_file(spec)
    if not name:
        return ""
    narrow = name.split(".")[1]
    keep = fp32_node_list(spec)
    kept = (
        f" The target's fp32-nodes stay float32 between Casts: {', '.join(f'`{n}`' for n in keep)}."
        if keep
        else ""
    )
    schema = conversion.get("schema_fp32") or []
    ops = (
        f" {len(schema)} node(s) whose schema has no {narrow} at this opset stay float32: "
        f"{', '.join(f'`{n}`' for n in schema[:8])}{' …' if len(schema) > 8 else ''}."
        if schema
        else ""
    )
    clamped = conversion.get("clamped") or []
    big = (
        f" Initializers beyond the {narrow} range, clamped to its largest finite value: "
        f"{', '.join(f'`{n}`' for n in clamped[:8])}{' …' if len(clamped) > 8 else ''}."
        if clamped
        else ""
    )
    built = verdict.target_meta.get("built_file")
    ran = (
        f"TensorRT built `{built}` (driven {verdict.target_meta.get('mode')})."
        if built
        else "reprokit itself built no TensorRT engine for this archive."
    )
    return (
        f"`{name}` is `model.onnx` converted to {narrow} by reprokit (its own converter, the rules of "
        f"reprokit/convert): graph inputs and outputs stay float32, every other float tensor is {narrow}.{kept}"
        f"{ops}{big} A strongly typed TensorRT (11.x, TensorRT-RTX, 10.x with --strongly-typed) builds this "
        f"file; a weakly typed one (8.6–10.x) builds `model.onnx` with builder flags. {ran}"
    )
