"""The one interface every engine implements, and the results it returns.

A backend turns (model file, feeds, wanted outputs) into output arrays, or raises
``BuildError`` (the engine refused the model) / ``EngineUnavailable`` (missing here).
It runs inside a worker process; it must not catch crashes or enforce timeouts itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from reprokit.errors import InputError, ReprokitError
from reprokit.spec import OptionDoc, TargetSpec


class BuildError(ReprokitError):
    """The engine could not parse or build the model; ``message`` is the engine's own.

    ``detail`` optionally fixes the signature text (otherwise derived from the message).
    """

    def __init__(self, message: str, hint: str | None = None, *, detail: str | None = None):
        super().__init__(message, hint)
        self.detail = detail


@dataclass
class RunResult:
    outputs: dict[str, np.ndarray]
    meta: dict = field(default_factory=dict)  # how the engine was set up (e.g. trt mode)
    log: str = ""  # the engine's own messages, for reports


@dataclass(frozen=True)
class Availability:
    available: bool
    version: str | None
    detail: str  # what is there, or what is missing and how to get it


class Backend:
    """Base class. Subclasses set the class attributes and implement ``run``."""

    engine: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    OPTIONS: ClassVar[dict[str, OptionDoc]] = {}
    install_hint: ClassVar[str] = ""
    # True when marking intermediate tensors as outputs can change what the engine computes
    # (layer fusion), so a layerwise divergence may move or vanish.
    marking_changes_engine: ClassVar[bool] = False
    # True when two runs of the same model give the same outputs; shrink replays the original
    # to detect flakiness only for engines that are not.
    deterministic: ClassVar[bool] = False
    # True when run() honours ``weights_dir``; for the others the worker stages symbolic links.
    reads_weights_dir: ClassVar[bool] = False
    # True when the engine runs every node as written (no fusion, no merging of equal nodes):
    # the members of a packed call may then read one shared copy of a feed they have in common
    # (shrink.members), which cannot change what any member computes. Elsewhere (OpenVINO,
    # TensorRT, ort:opt, GPUs) two members reading one input could be merged or fused across.
    runs_nodes_as_written: ClassVar[bool] = False

    def __init__(self, spec: TargetSpec):
        self.spec = spec
        # Set by the worker when only parsing/building matters (shrinking a build error): an
        # engine that can stop after its build does so and returns no outputs.
        self.build_only = False
        # Where the model's external data files are, when not next to the model file.
        self.weights_dir: str | None = None

    @classmethod
    def validate(cls, spec: TargetSpec) -> None:
        """Reject option combinations that make no sense (after per-option parsing)."""

    @classmethod
    def admit(cls, spec: TargetSpec, model) -> None:
        """Refuse (a ReprokitError) a target this engine cannot run as asked on the user's model
        (a ModelProto, weights not loaded), before any run. Candidates cut from it are not asked."""

    def refuse_containers(self, feeds: dict) -> None:
        """For engines that take tensors only: a sequence or optional input is an input error
        (exit 3) that says which engines take them, never a crash inside the engine."""
        for name, value in feeds.items():
            if value is None or isinstance(value, (list, tuple)):
                what = "an empty optional" if value is None else "a sequence"
                raise InputError(f"input {name!r} is {what}; the {self.engine} target takes tensors only",
                                 hint="check this model with onnxruntime-based targets (ort, ort:opt, emulate:fp16), "
                                      "which take sequences and optionals")

    def precision(self) -> str:
        """The narrowest arithmetic this target uses: fp32, tf32, bf16, fp16, int8 or fp8."""
        return "fp32"

    @classmethod
    def probe(cls) -> Availability:
        """Is the engine importable here? May import it: call only where that is acceptable."""
        raise NotImplementedError

    def run(
        self, model_path: str, feeds: dict[str, np.ndarray], output_names: list[str] | None
    ) -> RunResult:
        """Run the model; return the requested outputs (all graph outputs when None)."""
        raise NotImplementedError


def module_version(name: str) -> Availability:
    """Availability of an importable Python module, by importing it."""
    import importlib

    try:
        module = importlib.import_module(name)
    except Exception as exc:  # any import failure means "not usable here"
        return Availability(False, None, f"{name} not importable: {exc.__class__.__name__}: {exc}")
    return Availability(True, getattr(module, "__version__", "?"), f"{name} {getattr(module, '__version__', '?')}")
