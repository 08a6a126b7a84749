"""Jinja rendering of the templates shipped in ``templates/`` (StrictUndefined: a missing value
is an error, never an empty string). Values that enter generated Python go through ``pylit``.
"""

from __future__ import annotations

import math
import os
from importlib import resources

from reprokit.report.describe import reference_parts


def templates_dir() -> str:
    """Installed wheels carry the templates as ``reprokit/_templates``; a source checkout has
    them at the top level next to the package."""
    packaged = resources.files("reprokit").joinpath("_templates")
    if packaged.is_dir():
        return str(packaged)
    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.join(os.path.dirname(package_dir), "templates")


def fmt(value: float) -> str:
    """A number for people: 3 significant digits, scientific outside [1e-3, 1e5)."""
    if isinstance(value, str):
        return value
    if value is None:
        return "-"
    if math.isinf(value) or math.isnan(value):
        return str(value)
    if value == 0:
        return "0"
    return f"{value:.3g}" if 1e-3 <= abs(value) < 1e5 else f"{value:.2e}"


def render(name: str, **values) -> str:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(templates_dir()),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.globals["fmt"] = fmt
    env.globals["reference_words"] = lambda reference: ", ".join(reference_parts(reference))
    env.filters["pylit"] = pylit
    env.filters["doc"] = doc
    return env.get_template(name).render(**values)


def doc(value) -> str:
    """``value`` as words safe inside generated code's triple-quoted docstring: a backslash or
    quote cannot end it or start an escape, and no control character (a NUL byte stops Python
    reading the file) nor lone surrogate (no UTF-8 for it) gets in."""
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    text = "".join(c if c in "\n\t" or (c.isprintable() and not 0xD800 <= ord(c) <= 0xDFFF) else "?" for c in text)
    return text


def pylit(value) -> str:
    """A Python literal for ``value`` (repr of plain data only), safe to embed in generated code."""
    if isinstance(value, (bool, int, float, str, type(None))):
        return repr(value)
    if isinstance(value, (list, tuple)):
        inner = ", ".join(pylit(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{pylit(k)}: {pylit(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"refusing to embed {type(value).__name__} in generated code")
