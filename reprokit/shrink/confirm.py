"""The confirming step of a shrink run: the original must diverge, every replay alike (a flaky
target is diagnosed with a tally, never reduced). The original's last replay is a call of its
own only where no call that comes anyway carries it (:class:`RideAlong`): for numeric signatures
the survey's first packed call holds the original as one more member. A pass/fail check
command's failing original is not replayed at all: its replays are fresh runs of the result
(``replays_go_to_result``, issue 39).
On a numeric engine the confirming judgement itself is that first member
(:class:`FoldedConfirm`, issue 25): the run's first call is the survey's, and the candidates of
that pack are judged only once the original's verdict gave the signature they are held to; a
replay (engines that are not deterministic) then rides in the next packed call.
A check command that never passed during the run must pass a one-node Identity probe before a
result is accepted: one that fails there too does not depend on the model, and is refused
(exit 4, with its own words).
"""

from __future__ import annotations

import os
import re
import threading

import numpy as np

from reprokit.engine.bug import same_failure, shows_bug
from reprokit.engine.oracle import quote_message
from reprokit.engine.worker import kill_running
from reprokit.errors import EngineUnavailable, NothingToReduce
from reprokit.graph.extract import Extraction
from reprokit.graph.io import save_model
from reprokit.shrink.runstate import rerun_command
from reprokit.spec import parse_target


class RideAlong:
    """The original's last replay, pending until a call that comes anyway carries it (``carrier``
    names it: the survey's packed call, evaluator.py): the whole original model as a member
    judged against the reference outputs."""

    folded = False  # the original's first judgement (FoldedConfirm), not a replay

    def __init__(self, model, feeds: dict, graph_outputs: dict, seen: list, rerun: str, carrier: str = ""):
        self.model, self.feeds, self.reference, self.carrier = model, dict(feeds), graph_outputs, carrier
        self.sub = Extraction(model, self.feeds, list(graph_outputs))
        self.seen, self.signature, self.rerun = seen, seen[0].signature if seen else None, rerun

    def check(self, again) -> None:
        """The replay's verdict: the same signature, else the run stops as a flaky original does
        at confirm (the same message and tally)."""
        self.seen.append(again)
        if not shows_bug(self.signature, again):
            raise _flaky_original(self.seen, self.signature, self.rerun)


class Unfold(Exception):
    """The folded confirmation gave no numeric divergence (or no pack carried it): the run
    confirms as usual, from ``verdict`` where one was seen (no call is made twice)."""

    def __init__(self, verdict=None):
        super().__init__("the original was not confirmed in the survey's packed call")
        self.verdict, self.confirmed = verdict, ""  # confirmed: where it was judged (summary.json)


class FoldedConfirm(RideAlong):
    """The original's first judgement, pending as the first member of the survey's first packed
    call (``can_fold``). ``on_verdict(verdict)`` holds the run to the signature seen there before
    any other member of that pack is judged; an original that agrees, or fails otherwise, stops
    the folded search (:class:`Unfold`)."""

    folded = True

    def __init__(self, model, feeds: dict, graph_outputs: dict, on_verdict):
        super().__init__(model, feeds, graph_outputs, [], "", "survey's packed call")
        self.on_verdict, self.verdict = on_verdict, None

    def check(self, again) -> None:
        if not again.diverges or again.signature.kind.value not in ("nonfinite", "mismatch"):
            raise Unfold(again)  # the original's own verdict (a member's outputs are its outputs alone)
        self.verdict = again
        self.on_verdict(again)


def can_fold(run, *, replays: int, packing: bool, localize: bool, resume: bool, weights_fit: bool) -> bool:
    """May the confirming call be the survey's first packed call? A numeric engine (not a check
    command) whose survey packs (packing and the survey on), at most one replay asked (it rides
    in the next packed call), a fresh run, a single input sample and no opened control flow (they
    judge the original themselves), and a copy of the weights that fits a pack beside the others.
    A pack's members are disjoint copies, each with its own feeds where the engine may fuse
    across a shared one (budget.packs_share_feeds): a member's outputs are its outputs alone
    (tests/test_packing.py compares packed and one-by-one verdicts on each engine)."""
    return (replays <= 1 and packing and localize and not resume and weights_fit and not run.levels
            and not run.prepared.samples and parse_target(run.target).engine != "cmd")


def replays_go_to_result(target, verdict) -> bool:
    """Does a failing original keep its replays for the result instead (issue 39)? A pass/fail
    check command's: each run is one bit whatever model it runs, and the result is the model
    the report names — a fresh failure of it is the evidence a user reruns, and it builds a
    fraction of the original. A numeric check (its outputs judged) and built-in engines keep
    the original's replay: it rides in a packed call that comes anyway (no call, no build of
    its own). An original that passes is run again all the same (``confirm``)."""
    return (parse_target(str(target)).engine == "cmd" and verdict.diverges
            and verdict.signature.kind.value not in ("nonfinite", "mismatch"))


def confirms_beside_capture(run, resume: bool) -> bool:
    """May the confirming call run while the reference activations are captured? A check
    command that cannot write outputs (its command names no ``{outputs}``) is judged by its exit
    status and words alone: the original's judgement reads no reference value, so its call runs
    beside the capture's reference run (a worker process of onnxruntime on the CPU) instead of
    after it — never beside another call of the check. Not on --resume (its verdict comes from
    the run's own record)."""
    spec = parse_target(run.target)
    return spec.engine == "cmd" and "{outputs}" not in (spec.command or "") and not resume


class ConfirmBeside:
    """The original judged by a pass/fail check command in a thread of its own, started before
    the capture (:func:`confirms_beside_capture`); :meth:`verdict` waits for it. The call is the
    confirming step's one call (``confirm(first=...)``), judged as it would be after the capture."""

    def __init__(self, run):
        model = run.given if run.given is not None else run.model
        self.path = save_model(model, os.path.join(run.models_dir, "original.onnx"), base_dir=run.prepared.base_dir)
        self._oracle, self._verdict, self._error = run.oracle, None, None
        # a daemon thread, not a pool's: one the kill leaves stuck must not hold the interpreter's exit
        self._thread = threading.Thread(target=self._judge, args=(run.oracle, self.path, dict(run.feeds)),
                                        name="reprokit-confirm", daemon=True)
        run.event("confirming the divergence beside the capture (1 target run: a pass/fail check reads no "
                  "reference values)")
        self._thread.start()

    def _judge(self, oracle, path: str, feeds: dict) -> None:
        try:
            self._verdict = oracle.judge(path, feeds, reference_outputs={})
        except BaseException as exc:  # raised where the verdict is asked for, in the run's thread
            self._error = exc

    def verdict(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._verdict

    def abandon(self) -> None:
        """The capture failed or was interrupted: the check's process group is killed (it runs in
        a session of its own, which a Ctrl-C does not reach), and its thread ends. The killed
        call's verdict is not kept for a --resume (it would answer the confirmation there)."""
        if self._thread.is_alive():
            self._oracle.remember = None
            kill_running()
            self._thread.join(timeout=10)


def confirm(run, graph_outputs: dict, replays: int, ride=None, first=None, where: str = "judged already",
            model_file: str | None = None):
    """The original must diverge (and every replay the user asked for, with the same signature;
    a pass/fail check command's failing original is not replayed: its replays run on the result,
    ``replays_go_to_result``). ``ride(verdict)``: which call that comes anyway carries the last
    replay ("survey's packed call"), or "" when none does; a carried replay is not run here, the
    returned RideAlong (else None) carries it. ``first``: the original's verdict from a folded
    confirmation (``Unfold``) or made beside the capture (:class:`ConfirmBeside`; ``where`` says
    which), not judged again; ``model_file``: the original as :class:`ConfirmBeside` wrote it
    (not written twice). Returns (verdict, ride-along)."""
    oracle = run.oracle
    model = run.given if run.given is not None else run.model
    model_file = model_file or save_model(model, os.path.join(run.models_dir, "original.onnx"),
                                          base_dir=run.prepared.base_dir)
    verdict = first or oracle.judge(model_file, run.feeds, reference_outputs=graph_outputs)
    if replays_go_to_result(run.target, verdict):
        replays = 0
    carrier = bool(replays and verdict.diverges and ride is not None) and ride(verdict)
    folded = bool(carrier)
    here = (first is None) + replays - folded
    runs = f"{here} target run{'s' if here != 1 else ''}"
    if first is not None:  # judged beside the capture, or in (or right after) the survey's first call
        runs = where + (f", {runs} more" if here else ", no call more")
    run.event(f"confirming the divergence ({runs}" + (f", the last replay rides in the {carrier})" if folded else ")"))
    signature = verdict.signature
    rerun = rerun_command(run.model_path, run.target, run.options)
    if not verdict.diverges and replays:  # a flaky target that happened to pass: say so
        again = oracle.run_again(model_file, run.feeds, graph_outputs)
        if again.diverges:
            raise _flaky_original([verdict, again], again.signature, rerun)
    if not verdict.diverges:
        worst = verdict.worst()
        if worst:
            why = f"{verdict.criterion.describe()}; worst {worst.name}: {verdict.criterion.metric.value} {worst.error:.3g}"
        else:  # nothing compared: a check command that passed and wrote no outputs
            why = "the check passed" if str(run.target).startswith("cmd:") else verdict.criterion.describe()
        if replays:  # it was replayed above and passed again: twice is not never
            cmd = str(run.target).startswith("cmd:")
            said = ("the check passed on the original twice: it does not fail, or fails only sometimes"
                    if cmd else f"the original model agreed twice under {run.target}: it does not diverge, "
                    "or diverges only sometimes")
            raise NothingToReduce(
                said + ("" if why == "the check passed" else f" ({why})"),
                hint="nothing to reduce if it never fails; one that fails only sometimes must fail every time "
                     "first (fixed tactics, a timing cache, a fixed seed), then shrink again; rerun the check "
                     f"by hand: {rerun}")
        raise NothingToReduce(
            f"the original model does not diverge under {run.target} ({why})",
            hint=f"nothing to reduce; rerun the check by hand: {rerun}")
    seen = [verdict]
    for _ in range(replays - folded):
        seen.append(oracle.run_again(model_file, run.feeds, graph_outputs))
        if not shows_bug(signature, seen[-1]):
            raise _flaky_original(seen, signature, rerun)
    run.event(f"diverges: {signature.describe()}")
    if signature.kind.value == "timeout":  # every call that hangs costs the whole --timeout
        run.prepared.notes.append(
            f"the original gives no answer within --timeout {run.options.timeout:g} s: each candidate that hangs "
            "costs that long (about 2·log2(nodes) of them, and the replays); a --timeout a little above a "
            "passing run's time makes the run that much shorter")
    return verdict, (RideAlong(model, run.feeds, graph_outputs, seen, rerun, carrier) if folded else None)


def _flaky_original(verdicts: list, signature, rerun: str) -> NothingToReduce:
    return NothingToReduce(f"the target is flaky on the unchanged model: {flaky_tally(verdicts, signature)}",
                           hint="stabilize the target first (fixed tactics, timing cache, a check that gives one "
                                f"answer per model); rerun: {rerun}")


# What a check command prints when it did not get as far as looking at the model.
_BROKEN_CHECK = re.compile(
    r"Traceback \(most recent call last\)|ModuleNotFoundError|ImportError|No module named|command not found|"
    r"No such file or directory|Permission denied|SyntaxError|IndentationError|NameError|"
    r"cannot open shared object|error while loading shared libraries|is not recognized as")


def probe_model(like=None):
    """x[1] → Identity → y: a model without anyone's bug; a check must pass it. Written under
    the opsets and IR version of ``like`` (the user's model) where given: a check that runs the
    model with the user's own tools then sees the versions it was written for, and a pack that
    holds the probe beside the model's nodes declares the model's opsets (graph.pack.declared).
    Identity has the same meaning in every opset."""
    from onnx import TensorProto, helper

    opsets = [helper.make_opsetid("", 13)]
    ir_version = 8
    if like is not None:
        default = next((o.version for o in like.opset_import if o.domain in ("", "ai.onnx")), None)
        opsets = [helper.make_opsetid(o.domain, o.version) for o in like.opset_import]
        if default is None:  # a model of custom domains only: the probe's own op needs one
            opsets.append(helper.make_opsetid("", 13))
        ir_version = like.ir_version
    return helper.make_model(helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"], name="reprokit_probe")], "reprokit_probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])]),
        opset_imports=opsets, ir_version=ir_version)


PROBE_FEEDS = {"x": np.ones((1,), np.float32)}


def probe_pending(run) -> bool:
    """Does this run still owe the Identity probe? Only a check command does, and only until one
    of its calls agreed: a check that passed once does not fail whatever the model."""
    return parse_target(run.target).engine == "cmd" and run.oracle.stats.agreed == 0 and not run.probed


def refuse_model_blind_check(run, verdict) -> None:
    """A check command that fails whatever the model is does not depend on the model. When no
    call of the run has passed by the time a result is about to be accepted, one more call runs
    the check on a one-node Identity model that holds nothing of the user's; the same failure
    there stops the run with the check's own words (exit 4) before the result is accepted."""
    if not probe_pending(run):
        return
    path = save_model(probe_model(run.model), os.path.join(run.models_dir, "probe.onnx"))
    seen = run.oracle.run_again(path, PROBE_FEEDS, {"y": PROBE_FEEDS["x"]})
    run.probed = True  # a probe that showed something else (no pass either) is not asked twice
    if not shows_bug(verdict.signature, seen):
        return
    broken = _BROKEN_CHECK.search(verdict.message or "")
    raise EngineUnavailable(
        "the check command fails the same way on a one-node Identity model that holds nothing of yours: "
        f"it does not depend on the model{', it is broken' if broken else ''}: "
        f"{quote_message(verdict.message, 240) or verdict.signature.describe()}",
        hint=("run the check by hand on your model and fix it (its interpreter, imports, paths); "
              if broken else "make the check fail only on what is wrong with the model (--fail-regex, "
              "--fail-code); ") + "a check must pass on a model without the bug")


def flaky_tally(verdicts: list, signature) -> str:
    """How often runs of one model showed the signature, and what the others showed."""
    counts: dict[str, int] = {}
    for verdict in verdicts:
        counts[verdict.signature.describe()] = counts.get(verdict.signature.describe(), 0) + 1
    said = next((quote_message(v.message, 160) for v in verdicts if v.message and same_failure(signature, v.signature)), "")
    return (f"{len(verdicts)} runs: " + ", ".join(f"{text} ×{n}" for text, n in counts.items())
            + (f"; its message: {said}" if said else ""))
