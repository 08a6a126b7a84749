"""PyTorch in: ``--torch FILE.py:FUNC``. FUNC returns a ``torch.nn.Module`` and its example
inputs; the module is exported with ``torch.onnx.export`` into the run's folder (model, inputs,
PyTorch eager outputs, the export settings), and PyTorch eager becomes a third column beside the
ONNX reference and the target, so a divergence is blamed on the exporter (eager vs onnxruntime)
or on the engine (onnxruntime vs target).

torch is an optional extra (``pip install 'reprokit[torch]'``), imported only when ``--torch`` is
given. Knows nothing of click; raises ReprokitError subclasses only.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import logging
import os
import sys
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from reprokit.api import make_oracle
from reprokit.engine.oracle import Oracle
from reprokit.engine.worker import WorkerResult
from reprokit.errors import EngineUnavailable, InputError, UsageError
from reprokit.standalone.arrays import load_npz, save_npz
from reprokit.standalone.compare import Criterion

EXPORTERS = ("auto", "dynamo", "legacy")
INSTALL_HINT = "pip install 'reprokit[torch]' (torch==2.13.0; onnxscript for the dynamo exporter)"


@dataclass
class TorchExport:
    """A module exported into ``folder``: the ONNX file, its feeds, eager outputs, settings."""

    source: str  # FILE.py:FUNC
    folder: str
    model_path: str
    inputs_path: str
    eager_outputs: dict[str, np.ndarray]
    settings: dict  # torch version, exporter, dynamo, opset, ...
    notes: list[str] = field(default_factory=list)


def _import_torch():
    try:
        import torch
    except ImportError as exc:
        raise EngineUnavailable(f"--torch needs PyTorch, which is not installed here ({exc})",
                                hint=INSTALL_HINT) from None
    return torch


def load_entry(spec: str):
    """``FILE.py:FUNC`` → (module, tuple of example input tensors)."""
    path, sep, func = spec.rpartition(":")
    if not sep or not path or not func.isidentifier():
        raise UsageError(f"--torch {spec!r} is not FILE.py:FUNC",
                         hint="e.g. --torch models.py:make_model (FUNC returns the module and its example inputs)")
    if not os.path.isfile(path):
        raise UsageError(f"--torch: no file {path}", hint="give the path of the Python file that defines FUNC")
    torch = _import_torch()
    name = "reprokit_torch_entry_" + os.path.splitext(os.path.basename(path))[0].replace("-", "_")
    module_spec = importlib.util.spec_from_file_location(name, os.path.abspath(path))
    code = importlib.util.module_from_spec(module_spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))  # FILE's own imports beside it
    try:
        module_spec.loader.exec_module(code)
    except Exception as exc:
        raise InputError(f"--torch: importing {path} failed: {exc.__class__.__name__}: {exc}",
                         hint=f"run `python {path}` to see the traceback") from exc
    finally:
        sys.path.pop(0)
    entry = getattr(code, func, None)
    if not callable(entry):
        found = sorted(n for n, v in vars(code).items() if callable(v) and not n.startswith("_"))[:8]
        raise UsageError(f"--torch: {path} defines no function {func!r}",
                         hint=f"functions there: {', '.join(found) or 'none'}")
    try:
        returned = entry()
    except Exception as exc:
        raise InputError(f"--torch: {func}() failed: {exc.__class__.__name__}: {exc}",
                         hint="FUNC takes no arguments and returns (module, example_inputs)") from exc
    if not (isinstance(returned, (tuple, list)) and len(returned) == 2
            and isinstance(returned[0], torch.nn.Module)):
        raise InputError(f"--torch: {func}() must return (torch.nn.Module, example_inputs), got "
                         f"{type(returned).__name__}", hint="e.g. return model, (torch.randn(1, 3, 32, 32),)")
    module, inputs = returned
    inputs = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
    if not inputs or not all(isinstance(t, torch.Tensor) for t in inputs):
        raise InputError(f"--torch: {func}()'s example inputs must be tensors (a tensor or a tuple of them)",
                         hint="e.g. return model, (torch.randn(1, 3, 32, 32),)")
    return module, inputs


def _flat(value) -> list:
    """Eager outputs in the order the exporters give them as graph outputs."""
    if isinstance(value, (tuple, list)):
        return [leaf for item in value for leaf in _flat(item)]
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _flat(item)]
    return [value] if value is not None else []


def _array(tensor) -> np.ndarray:
    tensor = tensor.detach().cpu()
    if str(tensor.dtype) == "torch.bfloat16":
        import ml_dtypes

        return tensor.view(dtype=__import__("torch").int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def _input_names(module, count: int) -> list[str]:
    import inspect

    try:
        params = [p.name for p in inspect.signature(module.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    return params[:count] if len(params) >= count else [f"input_{i}" for i in range(count)]


def _choose_exporter(exporter: str) -> tuple[bool, list[str]]:
    """(dynamo?, notes). auto: the dynamo exporter where onnxscript is installed, else legacy."""
    if exporter not in EXPORTERS:
        raise UsageError(f"--torch-exporter {exporter!r}", hint=f"one of {', '.join(EXPORTERS)}")
    has_onnxscript = importlib.util.find_spec("onnxscript") is not None
    if exporter == "dynamo" and not has_onnxscript:
        raise EngineUnavailable("the dynamo exporter (torch.onnx.export(dynamo=True)) needs onnxscript",
                                hint="pip install onnxscript, or --torch-exporter legacy")
    if exporter == "auto" and not has_onnxscript:
        return False, ["onnxscript is not installed: exported with the legacy TorchScript exporter "
                       "(dynamo=False); pip install onnxscript for the dynamo exporter"]
    return exporter != "legacy", []


def export(spec: str, folder: str, *, exporter: str = "auto", opset: int | None = None) -> TorchExport:
    """Load FILE.py:FUNC, run PyTorch eager and export to ``folder``/model.onnx."""
    import onnx

    dynamo, notes = _choose_exporter(exporter)
    module, inputs = load_entry(spec)
    torch = _import_torch()
    os.makedirs(folder, exist_ok=True)
    module.eval()
    with torch.no_grad():
        eager = _flat(module(*inputs))
    names = _input_names(module, len(inputs))
    path = os.path.join(folder, "model.onnx")
    kwargs = {"opset_version": opset} if opset else {}
    log = io.StringIO()
    started = time.monotonic()
    # The exporters print progress and warnings (stdout, stderr, logging): into export.log, so
    # --json output stays one object.
    handler = logging.StreamHandler(log)
    loggers = [logging.getLogger(n) for n in list(logging.root.manager.loggerDict) if n.split(".")[0] == "torch"]
    saved = [(lg, lg.handlers[:], lg.propagate) for lg in loggers]
    for lg in loggers:
        lg.handlers[:] = [handler] if lg.name == "torch" else []
        lg.propagate = lg.name != "torch"
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if dynamo:
                torch.onnx.export(module, inputs, path, dynamo=True, external_data=False,
                                  input_names=names, verbose=False, **kwargs)
            else:
                torch.onnx.export(module, inputs, path, dynamo=False, input_names=names, **kwargs)
    except Exception as exc:
        with open(os.path.join(folder, "export.log"), "w") as handle:
            handle.write(log.getvalue())
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise InputError(f"torch.onnx.export ({'dynamo' if dynamo else 'legacy'}) failed: "
                         f"{exc.__class__.__name__}: {first}",
                         hint=("try --torch-exporter " + ("legacy" if dynamo else "dynamo")
                               + f"; the exporter's log is in {folder}/export.log")) from exc
    finally:
        for lg, handlers, propagate in saved:
            lg.handlers[:], lg.propagate = handlers, propagate
    with open(os.path.join(folder, "export.log"), "w") as handle:
        handle.write(log.getvalue())
    model = onnx.load(path, load_external_data=False)
    initializers = {t.name for t in model.graph.initializer}
    graph_inputs = [i.name for i in model.graph.input if i.name not in initializers]
    by_name = dict(zip(names, inputs))
    if all(n in by_name for n in graph_inputs):
        feeds = {n: _array(by_name[n]) for n in graph_inputs}
    elif len(graph_inputs) == len(inputs):
        feeds = {n: _array(t) for n, t in zip(graph_inputs, inputs)}
    else:
        raise InputError(f"the exported model has inputs {graph_inputs}, the example inputs are {names}",
                         hint="make every example input an input the module uses")
    outputs = [o.name for o in model.graph.output]
    if len(outputs) != len(eager):
        raise InputError(f"the exported model has {len(outputs)} outputs, PyTorch eager returned {len(eager)}",
                         hint="return tensors (or tuples of them) from forward")
    eager_outputs = {n: _array(t) for n, t in zip(outputs, eager)}
    inputs_path = save_npz(os.path.join(folder, "inputs.npz"), feeds)
    save_npz(os.path.join(folder, "eager_outputs.npz"), eager_outputs)
    opsets = {(o.domain or "ai.onnx"): o.version for o in model.opset_import}
    settings = {
        "schema": "reprokit.torch-export/1", "source": spec,
        "torch": torch.__version__, "exporter": "torch.onnx.export", "dynamo": dynamo,
        "exporter_choice": exporter, "opset": opsets.get("ai.onnx"), "opset_asked": opset, "opsets": opsets,
        "onnxscript": _version("onnxscript") if dynamo else None,
        "module": type(module).__name__, "inputs": {n: {"shape": list(a.shape), "dtype": str(a.dtype)}
                                                     for n, a in feeds.items()},
        "outputs": outputs, "export_seconds": round(time.monotonic() - started, 3),
        "files": {"model": "model.onnx", "inputs": "inputs.npz", "eager_outputs": "eager_outputs.npz",
                  "log": "export.log"},
        "notes": notes,
    }
    with open(os.path.join(folder, "export.json"), "w") as handle:
        json.dump(settings, handle, indent=2)
    return TorchExport(spec, folder, path, inputs_path, eager_outputs, settings, notes)


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


# --- the third column ---------------------------------------------------------------------------

BLAME = {
    "none": "PyTorch eager, onnxruntime and the target agree",
    "exporter": "the EXPORTER diverges: onnxruntime runs the exported ONNX differently from PyTorch eager, "
                "and the target agrees with onnxruntime",
    "engine": "the ENGINE diverges: the exported ONNX on onnxruntime matches PyTorch eager, the target does not",
    "both": "BOTH diverge: the exported ONNX already differs from PyTorch eager on onnxruntime, and the target "
            "differs from onnxruntime",
}


@dataclass
class Columns:
    """Three columns: PyTorch eager, the ONNX reference, the target; and whom to blame."""

    exporter: object  # Verdict: eager (as reference) vs the ONNX reference
    engine: object  # Verdict: the ONNX reference vs the target (check's own verdict)
    end_to_end: object | None  # Verdict: eager vs the target (None when the target gave no numbers)
    blame: str
    settings: dict

    @property
    def diverges(self) -> bool:
        return self.blame != "none"

    @property
    def words(self) -> str:
        return BLAME[self.blame]

    def to_json(self) -> dict:
        return {"blame": self.blame, "words": self.words, "export": self.settings,
                "exporter": self.exporter.to_json(), "engine": self.engine.to_json(),
                "end_to_end": self.end_to_end.to_json() if self.end_to_end is not None else None}


def _verdict(reference_name: str, target_name: str, criterion, precision: str, truth: dict, outputs: dict):
    """A verdict with ``truth`` as the reference, by the oracle's own rules."""
    judge = Oracle(reference_name, target_name, criterion, precision=precision)
    return judge.verdict_from(WorkerResult("ok", outputs=dict(outputs)), truth)


def exporter_verdict(exported: TorchExport, reference_outputs: dict, reference: str, metric: str = "rel-l2"):
    """PyTorch eager (as the reference) vs the exported model on the ONNX reference, by fp32
    tolerances: both compute in fp32, so anything past them is the export."""
    criterion = Criterion.for_precision("fp32", metric)
    return _verdict("torch:eager", reference, criterion, "fp32", exported.eager_outputs, reference_outputs)


def columns(exported: TorchExport, result, reference: str, metric: str = "rel-l2") -> Columns:
    """The three columns for a ``session.check`` result on the exported model."""
    exporter = exporter_verdict(exported, result.reference_outputs, reference, metric)
    engine = result.verdict
    end_to_end = None
    if result.target_outputs:
        end_to_end = _verdict("torch:eager", engine.target, engine.criterion, engine.precision,
                              exported.eager_outputs, result.target_outputs)
    blame = {(False, False): "none", (True, False): "exporter", (False, True): "engine",
             (True, True): "both"}[(exporter.diverges, engine.diverges)]
    return Columns(exporter, engine, end_to_end, blame, exported.settings)


def reference_columns(exported: TorchExport, options, workdir: str) -> dict:
    """For shrink, audit and pack: the exporter column alone (one reference run of the exported
    model), recorded beside the export settings."""
    oracle = make_oracle(options.reference, options, workdir)
    run = oracle.run_reference(exported.model_path, load_npz(exported.inputs_path))
    verdict = exporter_verdict(exported, run.outputs, oracle.reference, options.metric)
    return {"export": exported.settings, "exporter": verdict.to_json(), "exporter_diverges": verdict.diverges,
            "words": ("the exporter diverges: onnxruntime runs the exported ONNX differently from PyTorch eager"
                      if verdict.diverges else "the exported ONNX on onnxruntime matches PyTorch eager")}
