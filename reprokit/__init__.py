"""reprokit: find, shrink and package engine divergences from an ONNX reference.

The public API mirrors the CLI. Importing this package never imports an inference engine
(tensorrt, onnxruntime, openvino, torch): engines are loaded lazily inside worker processes.
"""

from __future__ import annotations

__version__ = "0.1.0"

from reprokit.errors import (  # noqa: E402
    EngineUnavailable,
    ExitCode,
    InputError,
    ReprokitError,
    UsageError,
)

__all__ = [
    "EngineUnavailable",
    "ExitCode",
    "InputError",
    "ReprokitError",
    "UsageError",
    "__version__",
    "check",
]


def check(model, target="emulate:fp16", **kwargs):
    """Run the reference and the target on ``model``; return a :class:`reprokit.engine.oracle.Verdict`.

    Keyword arguments are those of :func:`reprokit.api.check`.
    """
    from reprokit.api import check as _check  # lazy: `import reprokit` stays light (no numpy, onnx)

    return _check(model, target=target, **kwargs)
