"""Registry of engines as lazy ``"module:Class"`` strings.

Imports nothing of reprokit: ``reprokit.spec`` reads it to validate target specs and the backends
import ``reprokit.spec`` for their option declarations, so the dependency runs one way only
(backends → spec → registry). Resolving a class never imports an inference engine: each backend
module imports its engine inside methods that run in a worker process.
"""

from __future__ import annotations

import importlib

_REGISTRY: dict[str, str] = {
    "ort": "reprokit.engine.backends.ort:OrtBackend",
    "emulate": "reprokit.engine.backends.emulate:EmulateBackend",
    "openvino": "reprokit.engine.backends.openvino:OpenVinoBackend",
    "trt": "reprokit.engine.backends.trt:TrtBackend",
    "cmd": "reprokit.engine.backends.cmd:CmdBackend",
}


def engine_names() -> list[str]:
    return list(_REGISTRY)


def backend_class(engine: str):
    module_name, _, class_name = _REGISTRY[engine].partition(":")
    return getattr(importlib.import_module(module_name), class_name)


def create_backend(spec):
    """Instantiate the backend for a parsed :class:`reprokit.spec.TargetSpec`."""
    return backend_class(spec.engine)(spec)
