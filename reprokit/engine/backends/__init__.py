"""Engines behind one interface (``base.py``), one module each, resolved lazily by name.

Importing this package, or resolving a class, never imports an inference engine; the registry
lives in ``registry.py`` (which imports nothing of reprokit) so that ``reprokit.spec`` can read it
without an import circle.
"""

from __future__ import annotations

from reprokit.engine.backends.registry import backend_class, create_backend, engine_names

__all__ = ["backend_class", "create_backend", "engine_names"]
