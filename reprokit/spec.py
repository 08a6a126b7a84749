"""Target spec grammar: ``engine[:option,option...]`` → :class:`TargetSpec`.

Owns parsing and validation against each backend's declared options. Must not import an
engine: backends are resolved through the lazy registry (``reprokit.engine.backends.registry``, which
imports nothing of reprokit, so backends → spec → registry has no circle).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from reprokit.engine.backends.registry import backend_class, engine_names
from reprokit.errors import UsageError


@dataclass(frozen=True)
class OptionDoc:
    """One documented option of a target spec. ``kind`` is flag, int, str or path (a file the
    engine reads or writes: ``verify`` never takes such a value from an archive)."""

    help: str
    kind: str = "flag"


@dataclass(frozen=True)
class TargetSpec:
    """A parsed target: engine name plus ordered options (flags map to True)."""

    engine: str
    options: tuple[tuple[str, object], ...] = field(default=())
    command: str | None = None  # only for the ``cmd`` engine

    def get(self, name: str, default=None):
        for key, value in self.options:
            if key == name:
                return value
        return default

    def has(self, name: str) -> bool:
        return any(key == name for key, _ in self.options)

    def __str__(self) -> str:
        if self.command is not None:  # cmd[:precision=P]:COMMAND
            parts = [f"{k}={v}" for k, v in self.options]
            return ":".join([self.engine, *parts, self.command])
        if not self.options:
            return self.engine
        parts = [k if v is True else f"{k}={v}" for k, v in self.options]
        return f"{self.engine}:{','.join(parts)}"

    def with_options(self, *options: str) -> TargetSpec:
        """Return a spec with extra options appended (used by sweeps and reports)."""
        return parse_target(str(self) + ("," if self.options else ":") + ",".join(options))


def parse_target(text: str) -> TargetSpec:
    """Parse ``engine[:option,option...]``; raise UsageError with the valid choices."""
    text = (text or "").strip()
    if not text:
        raise UsageError("empty target spec", hint=f"use one of: {', '.join(engine_names())}")
    engine, _, rest = text.partition(":")
    engine = engine.strip().lower()
    if engine not in engine_names():
        raise UsageError(
            f"unknown engine {engine!r} in target spec {text!r}",
            hint=f"engines: {', '.join(engine_names())}; see `reprokit backends`",
        )
    cls = backend_class(engine)
    if engine == "cmd":
        if not rest.strip():
            raise UsageError(
                "the cmd engine needs a command: cmd:COMMAND",
                hint="e.g. --target 'cmd:python my_check.py {model} {inputs}'",
            )
        options, command = _cmd_options(cls, rest.strip())
        spec = TargetSpec(engine="cmd", options=options, command=command)
        cls.validate(spec)
        return spec
    options: list[tuple[str, object]] = []
    for raw in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = raw.partition("=")
        key = key.strip().lower()
        doc = cls.OPTIONS.get(key)
        if doc is None:
            valid = ", ".join(sorted(cls.OPTIONS)) or "(none)"
            raise UsageError(
                f"unknown option {key!r} for engine {engine!r}",
                hint=f"options of {engine}: {valid}",
            )
        if doc.kind == "flag":
            if eq:
                raise UsageError(f"option {key!r} of {engine!r} takes no value", hint=doc.help)
            options.append((key, True))
            continue
        if not eq or not value.strip():
            raise UsageError(f"option {key!r} of {engine!r} needs a value: {key}=...", hint=doc.help)
        if doc.kind == "int":
            try:
                options.append((key, int(value)))
            except ValueError:
                raise UsageError(
                    f"option {key!r} of {engine!r} needs an integer, got {value!r}", hint=doc.help
                ) from None
        else:
            options.append((key, value.strip()))
    spec = TargetSpec(engine=engine, options=tuple(options))
    cls.validate(spec)
    return spec


# ``cmd:precision=fp16:COMMAND``: options of a check command sit between ``cmd:`` and the
# command, ``key=value`` each followed by a colon. A command cannot start like that: it runs
# without a shell, and no program is called ``precision=fp16:python``.
_CMD_OPTION = re.compile(r"([a-z][a-z0-9-]*)=([^:\s]*):")


def _cmd_options(cls, rest: str) -> tuple[tuple[tuple[str, object], ...], str]:
    options: list[tuple[str, object]] = []
    while match := _CMD_OPTION.match(rest):
        key, value = match.group(1), match.group(2)
        doc = cls.OPTIONS.get(key)
        if doc is None:
            break  # not an option of cmd: part of the command
        if not value:
            raise UsageError(f"option {key!r} of 'cmd' needs a value: cmd:{key}=...:COMMAND", hint=doc.help)
        options.append((key, value))
        rest = rest[match.end():].lstrip()
    if not rest:
        raise UsageError("the cmd engine needs a command after its options",
                         hint="e.g. --target 'cmd:precision=fp16:python my_check.py {model} {inputs} {outputs}'")
    return tuple(options), rest


def marking_changes_engine(target: str) -> bool:
    """Can marking intermediate tensors as outputs change what ``target`` computes (fusion)?"""
    return backend_class(parse_target(target).engine).marking_changes_engine
