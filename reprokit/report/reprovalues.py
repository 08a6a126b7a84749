"""The ONE builder of repro.py's values: the script's SETTINGS and the words of its docstring,
from an archive's recorded verdict (verdict.json as ``pack`` writes it).

``pack`` (report/bundle.py) renders the archive's repro.py from the verdict it has just written,
and the matrix's reproducer (report/reproducer.py) renders reprokit's own repro.py from the
verdict.json of an archive someone sent, after ``verify.open_archive`` checked it: both call
:func:`repro_values`, so the two scripts judge alike, a quantized model's outputs in its
recorded quantization steps included (``quant_steps``), and say the same words. ISSUE.md's
criterion line is :func:`criterion_words` too.

Every recorded value enters the script as a Python literal (``pylit``) or, in the docstring,
through the ``doc`` filter (render.py): never as code. Must not run anything, read files other
than reprokit's own standalone modules, or decide whether an archive may be trusted (that is
``verify.open_archive``'s and ``verify.trusted_archive_spec``'s).
"""

from __future__ import annotations

import os
from inspect import getsource

from reprokit import __version__
from reprokit.engine.oracle import Kind, Signature, normalize_message
from reprokit.report.trtcommands import repro_facts
from reprokit.spec import parse_target
from reprokit.standalone.checkpolicy import CheckPolicy
from reprokit.standalone.compare import Criterion, Metric

# What `pip install numpy onnx onnxruntime …` needs on top for each engine, and in words.
ENGINE_PACKAGES = {
    "ort": "",
    "emulate": "",
    "openvino": "openvino",
    "trt": "tensorrt polygraphy",
    "cmd": "",
}
ENGINE_REQUIREMENT = {
    "ort": "nothing more",
    "emulate": "nothing more (the emulator is inside repro.py)",
    "openvino": "openvino",
    "trt": "tensorrt and polygraphy, on an NVIDIA GPU",
    "cmd": "the check command",
}
ALTERNATIVE = {
    "emulate": "ort",
    "openvino": "openvino:f32",
    "trt": "trt:no-tf32",
    "ort": "ort:opt",
    "cmd": "ort",
}
DEFAULT_TIMEOUT = 600.0  # RunOptions' own default: what an archive without a recorded timeout had
_SHOWN = 3  # outputs named in the criterion's words; the rest are counted


def repro_values(recorded: dict, *, target: str, bundled=(), needs=()) -> dict:
    """Every value ``templates/repro.py.j2`` reads, from ``recorded`` (verdict.json's content).
    ``target``: the spec repro.py runs by default (pack: the recorded one, a cmd command pointed
    at its bundled files; the reproducer: the checked or the user's); ``bundled``/``needs``: a
    cmd target's own files in the archive and those it lacks (pack only)."""
    sign = recorded["signature"]
    signature = Signature(
        Kind(sign["kind"]), tuple(sign.get("outputs", ())), sign.get("detail", "")
    )
    criterion = recorded["criterion"]
    reference = recorded.get("reference", "ort")
    timeout = recorded.get("timeout")
    engine = parse_target(target).engine if not target.startswith("cmd") else "cmd"
    settings = {
        "target": target,
        "reference": reference,
        "metric": criterion["metric"],
        "tolerance": criterion["tolerance"],
        "atol": criterion["atol"],
        "rtol": criterion["rtol"],
        "expected_kind": signature.kind.value,
        "summary": signature.describe(),
        "check_policy": CheckPolicy.from_json(recorded.get("check_policy")).to_json(),
        "timeout": timeout
        if isinstance(timeout, (int, float)) and timeout > 0
        else DEFAULT_TIMEOUT,
        "bundled": list(bundled),
        "needs": list(needs),
        "expected_detail": signature.detail,
        # a quantized model's outputs judged in its quantization steps, as the CLI judged them
        "quant_steps": recorded.get("quant_steps"),
        **repro_facts(),  # reprokit's own TensorRT facts, never an archive's
    }
    return {
        "version": __version__,
        "title": f"{signature.describe()} under {target}, against {reference}",
        "engine_requirement": ENGINE_REQUIREMENT[engine],
        "alternative": ALTERNATIVE[engine],
        "reference": reference,
        "target": target,
        "criterion": criterion_words(recorded),
        "settings": settings,
        **embedded_sources(),
    }


def criterion_words(recorded: dict) -> str:
    """How the outputs are judged, in words: the criterion, and for a quantized model which
    outputs are judged in quantization steps and which at the int8 tolerance."""
    criterion = recorded["criterion"]
    text = (
        Criterion(
            Metric(criterion["metric"]),
            criterion["tolerance"],
            criterion["atol"],
            criterion["rtol"],
        ).describe()
        + " per output"
    )
    table = recorded.get("quant_steps")
    if not table:
        return text
    steps = table.get("steps", {})
    if steps:
        text += (
            "; outputs the model quantizes in quantization steps, more than 1 step diverges ("
            + _named(f"{name} step {step:.3g}" for name, step in steps.items())
            + ")"
        )
    after = table.get("after_quantized", [])
    if after:
        text += (
            f"; outputs after quantized ops at rel-l2 <= {table.get('fallback', 0.1):g} ("
            + _named(after)
            + ")"
        )
    return text


def _named(items) -> str:
    items = list(items)
    more = f" and {len(items) - _SHOWN} more" if len(items) > _SHOWN else ""
    return ", ".join(items[:_SHOWN]) + more


def embedded_sources() -> dict[str, str]:
    """The standalone modules repro.py embeds verbatim."""
    return {
        "compare_source": module_source("values.py") + "\n\n" + module_source("compare.py"),
        "emulation_source": "\n\n".join(module_source(name) for name in ("names.py", "emulation.py", "declared.py")),
        "arrays_source": module_source("arrays.py") + "\n\n" + module_source("streams.py"),
        "policy_source": module_source("checkpolicy.py"),
        "normalize_source": getsource(normalize_message),
    }


def module_source(name: str) -> str:
    """A standalone reprokit module's source, without its __future__ import (repro.py has one) and
    without its imports of modules embedded above it (lines marked "# repro.py: embedded above")."""
    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(package_dir, "standalone", name)) as handle:
        text = handle.read()
    text = text.replace("from __future__ import annotations\n", "")
    return "\n".join(
        line for line in text.split("\n") if not line.endswith("# repro.py: embedded above")
    )
