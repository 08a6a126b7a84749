"""``reprokit verify``: does the divergence in a report archive someone sent reproduce here? The
archive is untrusted input: its manifest is checked before anything runs, it is extracted safely,
and what it asks for is bounded — engines and settings it may name, never a command to run, a
file for an engine to read or write, or a regex that backtracks for ever. Writing archives is
:mod:`reprokit.report.bundle`'s.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass, field

from reprokit.engine.backends import backend_class
from reprokit.engine.bug import same_failure
from reprokit.engine.session import RunOptions, check
from reprokit.engine.verdict import Kind, Signature
from reprokit.errors import InputError, ReprokitError
from reprokit.files import read_json
from reprokit.report.archive import ARCHIVE_JSON_BYTES, MANIFEST, check_manifest, safe_extract
from reprokit.report.schema import check_manifest_schema, check_verdict
from reprokit.spec import parse_target
from reprokit.standalone.checkpolicy import CheckPolicy


@dataclass
class VerifyResult:
    recorded: dict
    verdict: object
    reproduces: bool
    target: str  # what ran here: the user's --target, or the archive's after the trust checks
    notes: list[str] = field(default_factory=list)

    @property
    def recorded_signature(self) -> Signature:
        return recorded_signature(self.recorded)

    @property
    def outcome(self) -> str:
        """``reproduces``, ``diverges differently`` (it fails here, not as recorded: another
        kind, or another message for a build error or crash) or ``does not reproduce``; the
        words of repro.py and of ``verify --versions``'s cells."""
        if self.reproduces:
            return "reproduces"
        return "diverges differently" if self.verdict.diverges else "does not reproduce"


# An archive is untrusted input (README: "what verify trusts"): it may name engines and
# settings, never a command to run, a file for an engine to read or write, or a regex that
# backtracks for ever. Regexes from archives are bounded by shape, not by a timer: a clear
# refusal beats a `timeout` verdict that reads like the engine's.
DEFAULT_TIMEOUT = 600.0  # seconds per engine call, and the most an archive may ask for
MAX_ARCHIVE_REGEX = 200
MAX_ARCHIVE_REGEX_REPEATS = 3


def trusted_archive_spec(text: str, role: str, archive_path: str) -> str:
    """``text`` (a target or reference an archive names) if verify may run it on the archive's
    word; an InputError when it runs a command or hands an engine a path."""
    text = str(text or "").strip()
    engine = text.partition(":")[0].strip().lower()
    why = None
    if engine == "cmd":
        why = "runs a command"
    else:
        try:
            spec = parse_target(text)
        except ReprokitError as exc:
            raise InputError(f"archive {archive_path} names the {role} {text!r}, which is not usable here: "
                             f"{exc.message}", hint="ask for a fresh archive, or pass --target") from exc
        options = backend_class(spec.engine).OPTIONS
        paths = [key for key, _ in spec.options if options[key].kind == "path"]
        if paths:
            why = f"hands the engine a file path ({', '.join(paths)})"
    if why is None:
        return text
    if role == "target":
        hint = ("read it; verify runs nothing an archive chose. To run it anyway, name it yourself: "
                "--target '...', or pick another target, e.g. --target ort")
    else:
        hint = "verify runs only built-in references; rerun the check by hand with `reprokit check` on model.onnx"
    raise InputError(f"archive {archive_path} records the {role} {text!r}, which {why}; verify does not run "
                     "that on an archive's word", hint=hint)


def archive_policy(recorded: dict, archive_path: str) -> CheckPolicy:
    """The check policy an archive records (``check_policy``, or an older ``fail_regex``), its
    regexes bounded and its exit codes integers."""
    try:
        policy = CheckPolicy.from_json(recorded.get("check_policy"))
        legacy = CheckPolicy.from_json(recorded.get("fail_regex"))
    except (TypeError, ValueError, AttributeError) as exc:
        raise InputError(f"archive {archive_path} records a check policy reprokit cannot read",
                         hint="ask for a fresh archive") from exc
    regexes = policy.regexes + legacy.regexes
    return CheckPolicy(tuple(bounded_archive_regex(r, archive_path) for r in regexes),
                       policy.fail_codes, policy.ignore_codes)


def bounded_archive_regex(pattern, archive_path: str) -> str | None:
    """A ``fail_regex`` from an archive if it cannot backtrack for ever: at most
    MAX_ARCHIVE_REGEX characters, no repetition inside a repetition, no alternation or
    backreference under one, at most MAX_ARCHIVE_REGEX_REPEATS unbounded repetitions."""
    if pattern is None:
        return None
    why = None
    if not isinstance(pattern, str):
        why = "is not a string"
    elif len(pattern) > MAX_ARCHIVE_REGEX:
        why = f"is longer than {MAX_ARCHIVE_REGEX} characters"
    else:
        why = _regex_risk(pattern)
    if why:
        raise InputError(f"archive {archive_path} records a fail_regex that {why}: {str(pattern)[:80]!r}",
                         hint="such a regex can backtrack for ever; ask for a fresh archive, or check the "
                              "model by hand with `reprokit check --fail-regex ...`")
    return pattern


def _regex_risk(pattern: str) -> str | None:
    try:
        import re._parser as sre_parse  # Python >= 3.11
    except ImportError:  # pragma: no cover - Python 3.10
        import sre_parse
    try:
        parsed = sre_parse.parse(pattern)
    except re.error as exc:
        return f"is not a valid regex ({exc})"
    constants = sre_parse
    repeats = (constants.MAX_REPEAT, constants.MIN_REPEAT, getattr(constants, "POSSESSIVE_REPEAT", None))
    unbounded = 0

    def walk(items, under_repeat: bool) -> str | None:
        nonlocal unbounded
        for op, av in items:
            if op in repeats:
                low, high, body = av
                endless = high == constants.MAXREPEAT or high > 100
                if endless and under_repeat:
                    return "nests one repetition inside another (like (a+)+)"
                unbounded += endless
                found = walk(body, under_repeat or endless)
            elif op == constants.BRANCH:
                if under_repeat:
                    return "repeats an alternation (like (a|aa)*)"
                found = next(filter(None, (walk(b, under_repeat) for b in av[1])), None)
            elif op in (constants.GROUPREF, getattr(constants, "GROUPREF_EXISTS", None)):
                return "uses a backreference"
            elif op == constants.SUBPATTERN:
                found = walk(av[-1], under_repeat)
            elif op in (constants.ASSERT, constants.ASSERT_NOT):
                found = walk(av[1], under_repeat)
            elif op == getattr(constants, "ATOMIC_GROUP", None):
                found = walk(av, under_repeat)
            else:
                found = None
            if found:
                return found
        return None

    found = walk(parsed, False)
    if found:
        return found
    if unbounded > MAX_ARCHIVE_REGEX_REPEATS:
        return f"has more than {MAX_ARCHIVE_REGEX_REPEATS} unbounded repetitions"
    return None


def archive_json(top: str, name: str, archive_path: str, *, use: str = "verified"):
    """The JSON file ``name`` of an archive extracted to ``top``, through the one bounded reader
    (``files.read_json``: ARCHIVE_JSON_BYTES, nesting bounded); an InputError when it is missing
    or unreadable (only archives ``reprokit pack`` wrote can be ``use``)."""
    try:
        return read_json(os.path.join(top, name), max_bytes=ARCHIVE_JSON_BYTES, what=name)
    except ValueError as exc:
        raise InputError(f"archive {archive_path} has no usable {name} ({exc})",
                         hint=f"only archives written by `reprokit pack` can be {use}") from exc


def verify(archive_path: str, target: str | None = None, *, timeout: float | None = None) -> VerifyResult:
    """Extract an untrusted archive safely, check its manifest, rerun its check here. ``timeout``
    None: the packing run's own when its verdict is a timeout (the bug is "no answer within T"),
    else 600 s."""
    with tempfile.TemporaryDirectory(prefix="reprokit-verify-") as tmp:
        top, recorded = open_archive(archive_path, tmp)
        criterion = recorded["criterion"]
        chosen = target or trusted_archive_spec(recorded.get("target"), "target", archive_path)
        reference = trusted_archive_spec(recorded.get("reference", "ort"), "reference", archive_path)
        policy = archive_policy(recorded, archive_path)
        if timeout is None:
            timeout = recorded_timeout(recorded, archive_path)
        if not chosen.strip().lower().startswith("cmd:"):
            policy = CheckPolicy()  # a cmd archive verified under --target ort: nothing to match
        options = RunOptions(reference=reference, metric=criterion["metric"],
                             tolerance=criterion["tolerance"], atol=criterion["atol"], rtol=criterion["rtol"],
                             timeout=timeout, fail_regex=policy.regexes, fail_codes=policy.fail_codes,
                             ignore_fail_codes=policy.ignore_codes,
                             inputs=os.path.join(top, "inputs.npz"),
                             # a quantized model: its outputs judged in the steps the packing run used
                             quant_steps=recorded.get("quant_steps"))
        model = os.path.join(top, "model.onnx")
        twin = os.path.join(top, "model.target.onnx")  # --reference-model: the converted cut, the target's
        if os.path.exists(twin):
            model, options.reference_model = twin, model
        result = check(model, chosen, options=options, workdir=os.path.join(tmp, "check"))
        verdict = result.verdict
        # the one rule shrink judged with (engine/bug.same_failure): a build error or crash
        # reproduces only with the recorded message, as repro.py judges it, never by kind alone
        reproduces = verdict.diverges and same_failure(recorded_signature(recorded), verdict.signature)
        return VerifyResult(recorded, verdict, reproduces, chosen)


def recorded_signature(recorded: dict) -> Signature:
    """The signature an archive's checked verdict.json records (its shape: ``check_verdict``)."""
    s = recorded["signature"]
    return Signature(Kind(s["kind"]), tuple(s.get("outputs", ())), s.get("detail", ""))


def open_archive(archive_path: str, tmp: str, *, use: str = "verified") -> tuple[str, dict]:
    """THE validator every command that reads an archive goes through (verify, verify --versions
    and its cells, local or on Ray): safe extraction into ``tmp`` (bounded before it reads),
    the manifest's shape and every file's SHA-256, verdict.json's shape. Returns the top folder
    and the checked verdict. Runs nothing."""
    top = safe_extract(archive_path, tmp)
    if os.path.exists(os.path.join(top, MANIFEST)):  # a missing one: check_manifest says so
        check_manifest_schema(archive_json(top, MANIFEST, archive_path, use=use), archive_path)
    problems = check_manifest(top)
    if problems:
        raise InputError(f"archive {archive_path} fails its manifest check: {problems[0]}"
                         + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""),
                         hint="the archive was changed after packing; ask for a fresh one")
    recorded = archive_json(top, "verdict.json", archive_path, use=use)
    check_verdict(recorded, archive_path)  # every field read later is there, of its type
    return top, recorded


def recorded_timeout(recorded: dict, archive_path: str = "the archive") -> float:
    """The seconds per engine call to verify with: the packing run's ``--timeout`` when what it
    recorded is a timeout (600 s would turn a 5 s hang into a ten-minute wait), else 600. A
    recorded timeout past 600 s is refused: on an archive's word verify waits no longer than it
    does by default (1e300 s made a hanging model hang verify for ever); ``--timeout`` chooses."""
    packed = recorded.get("timeout")
    if recorded["signature"]["kind"] == "timeout" and isinstance(packed, (int, float)) and packed > 0:
        if packed > DEFAULT_TIMEOUT:
            raise InputError(
                f"archive {archive_path} records a timeout of {packed:g} s per engine call, longer than "
                f"verify waits on an archive's word ({DEFAULT_TIMEOUT:g} s)",
                hint="choose the wait yourself: reprokit verify ARCHIVE --timeout SECONDS")
        return float(packed)
    return DEFAULT_TIMEOUT
