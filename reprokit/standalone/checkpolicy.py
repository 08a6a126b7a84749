"""When does a check command's run count as a failure? polygraphy's ``--check`` rules.

- no option: a non-zero exit status is a failure; the exit status is its class (two exit codes
  are two findings);
- ``--fail-code N`` (repeatable): only those exit codes fail;
- ``--ignore-fail-code N`` (repeatable): those exit codes pass;
- ``--fail-regex RE`` (repeatable): a run whose output matches any of them fails, whatever its
  exit status (with ``--fail-code``: the code must be listed too). The regexes are its class.
  Exactly as polygraphy's ``debug`` tools apply them: each regex compiled on its own (inline
  flags such as ``(?i)`` and numbered back-references work), searched with ``re.search`` over
  the whole output, stdout then stderr, so a match may span lines.

A run that exits non-zero without failing by these rules is a *different finding* (never the bug
being reduced, but counted and shown), not silence. Standard library only: repro.py embeds this
module's source.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

FAIL, PASS, OTHER = "fail", "pass", "other"


@dataclass(frozen=True)
class CheckPolicy:
    regexes: tuple = ()
    fail_codes: tuple = ()
    ignore_codes: tuple = ()

    @classmethod
    def from_json(cls, value) -> CheckPolicy:
        """From what an archive or a run directory recorded (a regex string, a list, or a dict)."""
        if not value:
            return cls()
        if isinstance(value, str):
            return cls(regexes=(value,))
        if isinstance(value, (list, tuple)):
            return cls(regexes=tuple(value))
        return cls(tuple(value.get("regexes") or ()), tuple(int(c) for c in value.get("fail_codes") or ()),
                   tuple(int(c) for c in value.get("ignore_codes") or ()))

    def to_json(self) -> dict:
        return {"regexes": list(self.regexes), "fail_codes": list(self.fail_codes),
                "ignore_codes": list(self.ignore_codes)}

    def __bool__(self) -> bool:
        return bool(self.regexes or self.fail_codes or self.ignore_codes)

    def argv(self) -> list:
        """The command-line options that give this policy back."""
        parts = []
        for regex in self.regexes:
            parts += ["--fail-regex", regex]
        for code in self.fail_codes:
            parts += ["--fail-code", str(code)]
        for code in self.ignore_codes:
            parts += ["--ignore-fail-code", str(code)]
        return parts

    def first_match(self, output: str) -> str | None:
        """The line(s) where the first of the regexes that matches ``output`` (stdout + stderr,
        whole) matches, or None when none does (or there are none). Each regex is compiled alone:
        joined into one pattern, a global flag would stop being at the start and a back-reference
        would count the groups of the regexes before it."""
        for regex in self.regexes:
            found = re.search(regex, output)
            if found is not None:
                start = output.rfind("\n", 0, found.start()) + 1
                end = output.find("\n", max(found.end() - 1, found.start()))
                return output[start:end if end >= 0 else len(output)].strip() or found.group(0)
        return None

    def label(self) -> str:
        """The regexes as the signature detail names them."""
        return " | ".join(f"/{r}/" for r in self.regexes)

    def decide(self, code: int, matched: bool) -> tuple:
        """(FAIL | PASS | OTHER, detail) for a run that exited with ``code`` (>= 0) and whose
        output did (not) match the regexes. ``detail`` is the failure class: stable across
        candidates, so it is what a reduction holds fixed."""
        if code in self.ignore_codes:
            return PASS, ""
        if self.fail_codes and code not in self.fail_codes:
            why = f"exit code {code} is not a --fail-code ({', '.join(map(str, self.fail_codes))})"
            return (OTHER, why) if code != 0 else (PASS, "")
        if self.regexes:
            if matched:
                return FAIL, f"check failed matching {self.label()}"
            return (OTHER, f"check command exit code {code} without matching {self.label()}") if code != 0 else (PASS, "")
        if code != 0 or code in self.fail_codes:  # --fail-code 0: a check that fails by exiting 0
            return FAIL, f"check command exit code {code}"
        return PASS, ""


_NO_MODULE = re.compile(r"ModuleNotFoundError: No module named '([^']+)'")


def missing_module(output: str) -> str | None:
    """The module a Python check could not import, when that is the last thing it said (its
    traceback's last line): the check never looked at the model, whatever its exit status would
    mean — reprokit's exit 4, repro.py's "cannot run here", never a failure of the model."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    found = _NO_MODULE.fullmatch(lines[-1]) if lines else None
    return found.group(1) if found else None
