"""The schemas of an archive's two JSON files that ``verify`` trusts: ``verdict.json``
(reprokit.verdict/1, as ``pack`` writes it) and ``MANIFEST.json`` (reprokit.manifest/1).

An archive comes from someone else: before anything runs, each file is checked field by field
and the first deviation is an InputError (exit 3) that names the file and the field, e.g.
``verdict.json: criterion.tolerance must be a number, got 'abc'``. Every field ``verify`` reads is
required; the other known fields are checked when present; unknown fields are left alone (a newer
reprokit may add some). Runs no engine and reads only the JSON it is given.
"""

from __future__ import annotations

import math
import re

from reprokit.engine.oracle import Kind
from reprokit.errors import InputError
from reprokit.standalone.compare import FLOAT8_FORMATS, Metric

_SHA256 = re.compile(r"[0-9a-f]{64}")


class _Deviation(Exception):
    pass


def _typename(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), f"{type(value).__name__} {value!r}"[:60])


def _show(value) -> str:
    text = repr(value) if isinstance(value, str) else _typename(value)
    return text[:60]


def _object(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise _Deviation(f"{where} must be an object, got {_show(value)}")
    return value


def _string(value, where: str, *, choices=None) -> str:
    if not isinstance(value, str):
        raise _Deviation(f"{where} must be a string, got {_show(value)}")
    if choices is not None and value not in choices:
        raise _Deviation(f"{where} must be one of {', '.join(sorted(choices))}, got {value!r}"[:200])
    return value


def _number(value, where: str, *, nullable: bool = False) -> None:
    if value is None and nullable:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Deviation(f"{where} must be a number{' or null' if nullable else ''}, got {_show(value)}")
    if not math.isfinite(value) or value < 0:
        raise _Deviation(f"{where} must be a finite number >= 0, got {value!r}")


def _step(value, where: str) -> None:
    _number(value, where)
    if value == 0:  # a step of 0 would judge any difference as infinitely many steps
        raise _Deviation(f"{where} must be a number > 0, got 0")


def _list(value, where: str, item) -> None:
    if not isinstance(value, list):
        raise _Deviation(f"{where} must be a list, got {_show(value)}")
    for k, element in enumerate(value):
        item(element, f"{where}[{k}]")


def _boolean(value, where: str) -> None:
    if not isinstance(value, bool):
        raise _Deviation(f"{where} must be true or false, got {_show(value)}")


def _integer(value, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Deviation(f"{where} must be an integer, got {_show(value)}")


def _field(payload: dict, key: str, where: str, check, *, required: bool = True) -> None:
    if key not in payload:
        if required:
            raise _Deviation(f"{where}{key} is missing")
        return
    check(payload[key], f"{where}{key}")


def _verdict(payload) -> None:
    payload = _object(payload, "the file")
    _field(payload, "schema", "", lambda v, w: _string(v, w, choices={"reprokit.verdict/1"}))
    _field(payload, "diverges", "", _boolean)
    signature = payload.get("signature")
    _field(payload, "signature", "", _object)
    _field(signature, "kind", "signature.", lambda v, w: _string(v, w, choices={k.value for k in Kind}))
    _field(signature, "outputs", "signature.", lambda v, w: _list(v, w, _string), required=False)
    _field(signature, "detail", "signature.", _string, required=False)
    _field(payload, "target", "", _string)
    _field(payload, "reference", "", _string, required=False)
    criterion = payload.get("criterion")
    _field(payload, "criterion", "", _object)
    _field(criterion, "metric", "criterion.", lambda v, w: _string(v, w, choices={m.value for m in Metric}))
    _field(criterion, "tolerance", "criterion.", _number)
    for key in ("atol", "rtol"):
        _field(criterion, key, "criterion.", lambda v, w: _number(v, w, nullable=True))
    for key in ("precision", "message", "reprokit"):
        _field(payload, key, "", _string, required=False)
    _field(payload, "outputs", "", lambda v, w: _list(v, w, _object), required=False)
    _field(payload, "warnings", "", lambda v, w: _list(v, w, _string), required=False)
    _field(payload, "target_meta", "", _object, required=False)
    _field(payload, "seconds", "", _number, required=False)
    _field(payload, "timeout", "", _number, required=False)
    policy = payload.get("check_policy")
    if policy is not None:
        _object(policy, "check_policy")
        _field(policy, "regexes", "check_policy.", lambda v, w: _list(v, w, _string), required=False)
        for key in ("fail_codes", "ignore_codes"):
            _field(policy, key, "check_policy.", lambda v, w: _list(v, w, _integer), required=False)
    quant = payload.get("quant_steps")
    if quant is not None:  # a quantized model's steps: numbers and names, which repro.py and verify judge with
        _object(quant, "quant_steps")
        _field(quant, "steps", "quant_steps.", _object)
        for name, step in quant["steps"].items():
            _step(step, f"quant_steps.steps[{name[:60]!r}]")
        _field(quant, "after_quantized", "quant_steps.", lambda v, w: _list(v, w, _string), required=False)
        _field(quant, "fallback", "quant_steps.", _number, required=False)
        _field(quant, "ops", "quant_steps.", _object, required=False)
        for op, count in quant.get("ops", {}).items():
            _integer(count, f"quant_steps.ops[{op[:60]!r}]")
        _field(quant, "float8", "quant_steps.", _object, required=False)
        for name, kind in quant.get("float8", {}).items():
            _string(kind, f"quant_steps.float8[{name[:60]!r}]", choices=set(FLOAT8_FORMATS))
    if payload.get("redaction") is not None:
        _object(payload["redaction"], "redaction")


def _manifest(payload) -> None:
    payload = _object(payload, "the file")
    _field(payload, "schema", "", lambda v, w: _string(v, w, choices={"reprokit.manifest/1"}))
    files = payload.get("files")
    _field(payload, "files", "", _object)
    for rel, entry in files.items():
        where = f"files[{rel!r}]"
        _object(entry, where)
        _field(entry, "sha256", f"{where}.", _string)
        if not _SHA256.fullmatch(entry["sha256"]):
            raise _Deviation(f"{where}.sha256 must be 64 lowercase hex digits, got {entry['sha256'][:70]!r}")
        _field(entry, "bytes", f"{where}.", _integer, required=False)
    for key in ("reprokit", "target"):
        _field(payload, key, "", _string, required=False)
    _field(payload, "torch", "", _object, required=False)


def _check(name: str, payload, check, archive_path: str) -> None:
    try:
        check(payload)
    except _Deviation as exc:
        raise InputError(f"archive {archive_path}: {name} does not follow its schema: {exc}",
                         hint="only archives written by `reprokit pack`, unmodified, can be verified; "
                              "ask for a fresh one") from None


def check_verdict(payload, archive_path: str) -> None:
    """``verdict.json`` as ``pack`` writes it, or InputError naming the first field that is not."""
    _check("verdict.json", payload, _verdict, archive_path)


def check_manifest_schema(payload, archive_path: str) -> None:
    """``MANIFEST.json`` as ``pack`` writes it, or InputError naming the first field that is not."""
    _check("MANIFEST.json", payload, _manifest, archive_path)
