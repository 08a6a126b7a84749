"""An engine's error message, made stable (a signature's detail) or short (one line to quote).

Owns the masking of names, numbers and paths. ``normalize_message`` is embedded in repro.py by
its source alone: it may call nothing of this module. Must not judge verdicts.
"""

from __future__ import annotations

import re


def normalize_message(message: str) -> str:
    """A stable form of an engine error: first error-looking line, names/numbers/paths masked."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if not lines:
        return ""
    chosen = next((line for line in lines if re.search(r"error|fail|unsupported|invalid", line, re.I)), lines[0])
    chosen = re.sub(r"(?<![\w>])(?:/[\w.\-]+){2,}", "<path>", chosen)
    # A quote opens a name only where no letter precedes it and closes one only where none
    # follows: the apostrophes of "can't" or "model's" are not quotes.
    # Quoted operator types stay: "unsupported op 'Unique'" and "… 'NonZero'" are two bugs. The
    # set of every op type onnx knows is kept on the function itself: repro.py embeds this
    # function's source alone, so it may not call a helper of this module.
    if not hasattr(normalize_message, "op_types"):
        try:
            import onnx.defs

            normalize_message.op_types = frozenset(s.name for s in onnx.defs.get_all_schemas_with_history())
        except Exception:  # no onnx: every quoted name is masked
            normalize_message.op_types = frozenset()
    chosen = re.sub(r"(?<!\w)(['\"`])(.*?)\1(?!\w)",
                    lambda m: m.group(0) if m.group(2) in normalize_message.op_types else "<name>", chosen)
    chosen = re.sub(r"0x[0-9a-fA-F]+|(?<![A-Za-z])\d+", "N", chosen)
    return chosen[:200]


def _last_lines(text: str, count: int = 3) -> str:
    return "\n".join([line for line in text.splitlines() if line.strip()][-count:])


def quote_message(message: str, limit: int = 300) -> str:
    """An engine's message on one line, at most ``limit`` characters, cut only between words.

    Engines put the context first and the reason last ("… while running Mul node. Name:'m'
    Status Message: …"), so a long line keeps its start and its end around an ellipsis; a first
    line that only introduces ("Exception from core.cpp:117:") is followed by the last line."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    text = lines[0]
    if len(lines) > 1 and text.endswith(":"):
        text = f"{text} … {lines[-1]}"
    if len(text) <= limit:
        return text
    head = text[: limit // 3].rsplit(" ", 1)[0]
    tail = text[-(limit - len(head) - 3):]
    tail = tail.split(" ", 1)[1] if " " in tail else tail
    return f"{head} … {tail}"
