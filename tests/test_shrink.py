"""shrink end to end with real engines: the fp16 storage emulator on the five samples and on tiny
generated models, and ``cmd`` targets running small check scripts written into tmp_path.

Every run is a real reduction: candidates are extracted subgraphs fed with captured reference
activations, judged by engine processes. Runs shared by several tests are made once per session.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
import shrink_models as sm
from conftest import assert_user_error, interrupt_when, pid_gone, reprokit_exe, run_cli

from reprokit.api import RunOptions
from reprokit.shrink.budget import Limits
from reprokit.shrink.steps import shrink

# The search tests ask for a 1-minimal result: no call budget (the default stops near
# polygraphy's cost on searches that localization cannot settle; see test_budget_*).
THOROUGH = Limits(max_calls=None)

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "samples"
CATALOG = {s["name"]: s for s in json.loads((SAMPLES / "catalog.json").read_text())["samples"]}
PY = shlex.quote(sys.executable)


def sample_options(name: str) -> RunOptions:
    return RunOptions(inputs=str(SAMPLES / f"{name}.inputs.npz"))


def real_inputs(model: onnx.ModelProto) -> list[str]:
    init = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in init]


def step(summary: dict, name: str) -> dict:
    found = [s for s in summary["steps"] if s["step"] == name]
    assert found, f"no step {name!r} in {[s['step'] for s in summary['steps']]}"
    return found[0]


def assert_valid_minimal(out_dir, original: onnx.ModelProto) -> onnx.ModelProto:
    """minimal.onnx passes the full checker, keeps opset and IR, and matches summary.json."""
    minimal = onnx.load(os.path.join(out_dir, "minimal.onnx"))
    onnx.checker.check_model(minimal, full_check=True)
    assert minimal.ir_version == original.ir_version
    assert [(o.domain, o.version) for o in minimal.opset_import] == [
        (o.domain, o.version) for o in original.opset_import
    ]
    summary = json.loads(Path(out_dir, "summary.json").read_text())
    assert summary["minimal"]["node_names"] == [n.name for n in minimal.graph.node]
    assert summary["minimal"]["nodes"] == len(minimal.graph.node)
    with np.load(os.path.join(out_dir, "inputs.npz")) as data:
        assert sorted(data.files) == sorted(real_inputs(minimal))
    return minimal


def run_minimal_on_ort(out_dir) -> dict:
    minimal = onnx.load(os.path.join(out_dir, "minimal.onnx"))
    with np.load(os.path.join(out_dir, "inputs.npz")) as data:
        feeds = {k: data[k] for k in data.files}
    return sm.ort_run(minimal, feeds)


@pytest.fixture(scope="session")
def session_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("shrink-runs")


@pytest.fixture(scope="session")
def sample_shrink(session_dir):
    """``sample_shrink(name)``: the default shrink of a sample under emulate:fp16 with its own
    committed feeds, run once per session."""
    done: dict = {}

    def get(name: str):
        if name not in done:
            out = session_dir / f"sample-{name}"
            done[name] = shrink(
                str(SAMPLES / f"{name}.onnx"),
                "emulate:fp16",
                str(out),
                options=sample_options(name),
            )
        return done[name]

    return get


NO_LOCALIZE_SAMPLE = "log_div_underflow"  # 65 nodes, 11 candidates: window, then ddmin


@pytest.fixture(scope="session")
def search_baseline(session_dir):
    """An uninterrupted ``--no-localize --jobs 1`` shrink of a sample: the result every other
    way of running the same search (resumed, parallel, repeated) must reproduce byte for byte."""
    out = session_dir / "baseline-no-localize"
    result = shrink(
        str(SAMPLES / f"{NO_LOCALIZE_SAMPLE}.onnx"),
        "emulate:fp16",
        str(out),
        options=sample_options(NO_LOCALIZE_SAMPLE),
        localize_first=False,
        jobs=1,
    )
    return result


# -- 1. the five samples --------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_sample_shrinks_to_a_small_model_around_its_fault(sample_shrink, name):
    entry = CATALOG[name]
    result = sample_shrink(name)
    summary = result.summary
    out = result.out_dir
    expected_kind = entry["expected"]["emulate:fp16"]
    assert summary["status"] == "done"
    assert summary["one_minimal"] is True
    assert summary["original"]["nodes"] == entry["nodes"]
    assert summary["signature"]["kind"] == expected_kind
    if summary["verdict"]["signature"]["kind"] != expected_kind:
        # the minimal shows another kind (layernorm_overflow: the Pow's Inf) only where its values,
        # injected into the original's reference run, cause the original's symptom (issue 38)
        assert summary["no_slippage"]["accepted"].get("shows it: causal test"), summary["no_slippage"]
    assert 1 <= summary["minimal"]["nodes"] <= 6, summary["minimal"]
    assert entry["fault_node"] in summary["minimal"]["node_names"]
    assert entry["fault_op"] in summary["minimal"]["ops"]

    original = onnx.load(str(SAMPLES / entry["file"]))
    minimal = assert_valid_minimal(out, original)

    # The feeds are the real activations of the original model on the sample's own inputs.
    with np.load(SAMPLES / entry["inputs"]) as data:
        sample_feeds = {k: data[k] for k in data.files}
    with np.load(os.path.join(out, "inputs.npz")) as data:
        feeds = {k: data[k] for k in data.files}
    with np.load(os.path.join(out, "reference_outputs.npz")) as data:
        reference = {k: data[k] for k in data.files}
    assert sorted(reference) == sorted(o.name for o in minimal.graph.output)
    wanted = [n for n in list(feeds) + list(reference) if n not in sample_feeds]
    truth = sm.ort_run(original, sample_feeds, wanted)
    truth.update(sample_feeds)
    windows = (summary.get("shapes") or {}).get("windows", {})
    for tensor, value in feeds.items():
        # shape shrinking keeps a window of the activation: the same numbers, cropped
        expected = truth[tensor][tuple(slice(start, start + size) for start, size in windows[tensor])] \
            if tensor in windows else truth[tensor]
        assert value.dtype == expected.dtype and value.shape == expected.shape, tensor
        assert np.array_equal(value, expected), f"{tensor} is not the original's activation"
    # the reference outputs are the reference's own outputs on those feeds
    mine = sm.ort_run(minimal, feeds, list(reference))
    for tensor, value in reference.items():
        assert np.array_equal(value, mine[tensor]) or np.allclose(value, mine[tensor], rtol=1e-6, atol=0), tensor
    if not windows:
        for tensor, value in reference.items():
            assert np.array_equal(value, truth[tensor]), f"{tensor} is not the original's activation"

    # The minimal model and its feeds reproduce on their own, through the CLI.
    proc = run_cli(
        "check",
        os.path.join(out, "minimal.onnx"),
        "--inputs",
        os.path.join(out, "inputs.npz"),
        "--target",
        "emulate:fp16",
        "--json",
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["verdict"]["signature"]["kind"] == summary["verdict"]["signature"]["kind"]


# -- 2, 3. branches and outputs -------------------------------------------------------------


@pytest.mark.parametrize("localize", [True, False], ids=["localize", "search"])
def test_fault_in_one_branch_keeps_only_that_branch(tmp_path, localize):
    model = sm.branch_fault()
    path = sm.save(model, tmp_path / "branches.onnx")
    result = shrink(path, "emulate:fp16", str(tmp_path / "out"), localize_first=localize)
    names = result.summary["minimal"]["node_names"]
    assert result.summary["status"] == "done"
    assert result.summary["signature"]["kind"] == "nonfinite"
    assert "b/mm" in names
    assert all(n.startswith("b/") for n in names), names
    assert result.summary["one_minimal"] is True
    assert_valid_minimal(result.out_dir, model)


@pytest.mark.parametrize("localize", [True, False], ids=["localize", "search"])
def test_only_the_diverging_output_side_is_kept(tmp_path, localize):
    model = sm.two_outputs_one_diverges()
    path = sm.save(model, tmp_path / "two_outputs.onnx")
    result = shrink(path, "emulate:fp16", str(tmp_path / "out"), localize_first=localize)
    summary = result.summary
    assert summary["signature"]["kind"] == "nonfinite"
    assert summary["signature"]["outputs"] == ["total"]
    density_side = {"d/sig", "d/half"}
    assert not density_side & set(summary["minimal"]["node_names"])
    assert "c/sum" in summary["minimal"]["node_names"]
    minimal = assert_valid_minimal(result.out_dir, model)
    producers = {t: n.name for n in minimal.graph.node for t in n.output}
    for out in minimal.graph.output:
        assert producers[out.name].startswith("c/"), out.name
    assert summary["verdict"]["signature"]["kind"] == "nonfinite"


# -- 4, 5, 13. cmd targets ------------------------------------------------------------------


def test_failure_that_needs_two_distant_nodes_keeps_both(tmp_path):
    model = sm.pair_chain(length=32, first=4, second=27)
    path = sm.save(model, tmp_path / "chain.onnx")
    script = sm.write_script(tmp_path, "pair_check.py", sm.PAIR_SCRIPT)
    target = f"cmd:{PY} {script} {{model}}"
    result = shrink(
        path, target, str(tmp_path / "out"), options=RunOptions(fail_regex="Error Code 2"),
        limits=THOROUGH,
    )
    summary = result.summary
    assert summary["signature"]["kind"] == "build-error"
    assert summary["signature"]["detail"] == "check failed matching /Error Code 2/"
    assert sorted(summary["minimal"]["ops"]) == ["Sigmoid", "Tanh"]
    assert summary["minimal"]["node_names"] == ["n04", "n27"]
    assert summary["one_minimal"] is True
    assert summary["verdict"]["signature"] == summary["signature"]
    assert_valid_minimal(result.out_dir, model)


def test_fusion_fault_that_vanishes_when_marked_is_found_by_the_search(tmp_path):
    model = sm.conv_relu_fusion()
    path = sm.save(model, tmp_path / "fusion.onnx")
    script = sm.write_script(tmp_path, "fused_engine.py", sm.FUSION_SCRIPT)
    target = f"cmd:{PY} {script} {{model}} {{inputs}} {{outputs}}"
    result = shrink(path, target, str(tmp_path / "out"), limits=THOROUGH, shrink_shapes=False)  # the search's calls
    summary = result.summary
    assert summary["signature"]["kind"] == "mismatch"
    assert sorted(summary["minimal"]["node_names"]) == ["f/conv", "f/relu"]
    assert summary["one_minimal"] is True
    assert summary["verdict"]["signature"]["kind"] == "mismatch"
    # The marked run (riding along in the survey's pack) marks every tensor, which prevents the
    # fusion, and each node alone has its output marked too: neither shows it. The pair
    # Conv→Relu, judged alone with its inner tensor internal, does.
    assert all(s["accepted"] == 0 for s in summary["steps"] if s["step"] in ("survey", "localize"))
    assert step(summary, "pairs")["accepted"] == 1
    assert summary["calls"]["target"] <= 6 + 4  # + the replays of a cmd check (original 1, result 3)
    minimal = assert_valid_minimal(result.out_dir, model)
    # The Conv output stays internal in the minimal model, as the fusion needs.
    assert "c1" not in {o.name for o in minimal.graph.output}


def test_no_slippage_to_other_failures_which_are_listed(tmp_path):
    model = sm.pair_chain(length=32, first=4, second=27)
    path = sm.save(model, tmp_path / "chain.onnx")
    script = sm.write_script(tmp_path, "flaky_engine.py", sm.SLIPPAGE_SCRIPT)
    target = f"cmd:{PY} {script} {{model}}"
    # --fail-regex says which message is the bug: the other failures are other findings
    result = shrink(path, target, str(tmp_path / "out"), limits=THOROUGH,
                    options=RunOptions(fail_regex="myelin fusion"))
    summary = result.summary
    signature = summary["signature"]
    assert signature["kind"] == "build-error"
    assert "myelin fusion" in signature["detail"]
    assert summary["verdict"]["signature"] == signature
    assert sorted(summary["minimal"]["ops"]) == ["Sigmoid", "Tanh"]
    findings = summary["other_findings"]
    assert any(k.startswith("crash") and "SIGSEGV" in k for k in findings), findings
    assert any(k.startswith("build-error") and "tactic selection" in k for k in findings), findings


def test_without_fail_regex_the_exit_status_is_the_bug_and_other_messages_are_said(tmp_path):
    """As polygraphy's --check means it: the same exit status is the same failure. Tanh alone
    fails with exit 1 and another message: that IS the reduction now, and the summary says its
    message differs from the original's, so the user can add --fail-regex."""
    model = sm.pair_chain(length=32, first=4, second=27)
    path = sm.save(model, tmp_path / "chain.onnx")
    script = sm.write_script(tmp_path, "flaky_engine.py", sm.SLIPPAGE_SCRIPT)
    result = shrink(path, f"cmd:{PY} {script} {{model}}", str(tmp_path / "out"), limits=THOROUGH)
    summary = result.summary
    assert summary["signature"]["detail"] == "check command exit code 1"
    assert summary["minimal"]["ops"] == ["Tanh"]
    assert any(k.startswith("same build-error, other message") and "tactic selection" in k
               for k in summary["other_findings"]), summary["other_findings"]


# -- 5b. the original's replay rides in the survey's packed call (issue 25) -------------------


def test_a_numeric_replay_rides_with_the_survey_one_call_fewer(tmp_path):
    """--replays 1 on the (deterministic) emulator forces an original replay. The confirming
    judgement is the survey pack's first member (confirm.FoldedConfirm) and the replay rides in
    the next packed call (localize's on this sample): 3 calls either way (survey, localize,
    final; the result's replay rides too), the same minimal model. Before issue 25 the replay was
    a call of its own at confirm: 5 calls; then it rode in the survey pack: 4."""
    name = "layernorm_overflow"
    runs = {}
    for replays in (0, 1):
        runs[replays] = shrink(str(SAMPLES / f"{name}.onnx"), "emulate:fp16", str(tmp_path / f"out{replays}"),
                               replays=replays, options=RunOptions(inputs=str(SAMPLES / f"{name}.inputs.npz"))).summary
    zero, one = runs[0], runs[1]
    assert one["calls"]["target"] == zero["calls"]["target"] == 3
    assert step(one, "confirm")["calls"] == step(zero, "confirm")["calls"] == 0
    assert "riding with the next packed call" in one["original_replays"], one["original_replays"]
    assert zero["original_replays"] == "none"
    assert zero["original_confirmed"] == one["original_confirmed"] == "the first member of the survey's packed call"
    assert one["budget"]["max_calls"] == zero["budget"]["max_calls"] + 2  # the original's replay, the result's
    assert one["minimal"]["node_names"] == zero["minimal"]["node_names"]


def test_the_original_replay_rides_in_the_shapes_ladder_and_no_best_is_written_before_it(tmp_path):
    """On this sample the survey's pack holds the answer, so the next packed call is the shapes
    ladder's: the original's replay rides there (its 230 nodes among the crops), 3 calls in all,
    the minimal model of a --replays 0 run. No best-so-far file is written while it is pending:
    none says more than the replay allowed. Without shapes it is a call of its own before the
    result is written (step "replay"; the result alone is then replayed too: 4 calls)."""
    name = "attention_softmax_nan"
    out = tmp_path / "out"
    seen = {}

    def said(line: str) -> None:
        if line.startswith("branches:"):  # the step after the survey kept its node
            seen["written then"] = (out / "minimal.onnx").exists() or (out / "summary.json").exists()

    summary = shrink(str(SAMPLES / f"{name}.onnx"), "emulate:fp16", str(out), replays=1,
                     options=RunOptions(inputs=str(SAMPLES / f"{name}.inputs.npz")), on_event=said).summary
    assert summary["calls"]["target"] == 3 and "replay" not in [s["step"] for s in summary["steps"]], summary["steps"]
    assert step(summary, "shapes")["nodes_built"] >= 230  # the original rode in the ladder's pack
    assert "one riding with the next packed call" in summary["original_replays"], summary["original_replays"]
    assert seen == {"written then": False}
    assert summary["minimal"]["node_names"] == ["layer2/self0/attn/qk_matmul"]

    lines = []
    summary = shrink(str(SAMPLES / f"{name}.onnx"), "emulate:fp16", str(tmp_path / "plain"), replays=1,
                     shrink_shapes=False, options=RunOptions(inputs=str(SAMPLES / f"{name}.inputs.npz")),
                     on_event=lines.append).summary
    # the survey, the result alone and its replay, the original's replay: 4, as before the change
    assert summary["calls"]["target"] == 4 and step(summary, "replay")["calls"] == 1
    assert "in a call of its own" in summary["original_replays"], summary["original_replays"]
    assert "replaying the original (no packed call carried its replay)" in lines, lines
    assert summary["minimal"]["node_names"] == ["layer2/self0/attn/qk_matmul"]


FLAKY_NUMERIC = """
    # A numeric check (it writes the model's outputs) whose Sigmoid comes out 1.5x too big, except
    # on its 2nd run: the pack calibration, which confirms too (1), then the survey's packed call
    # (2), which carries the original's replay: that replay agrees. (The Identity probe comes only
    # where no call passed, before a result is kept: issue 25.)
    import sys
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    with open({log!r}, "a+") as handle:
        handle.write("run\\n")
        handle.seek(0)
        count = len(handle.read().splitlines())
    model = onnx.load(sys.argv[1])
    graph = model.graph
    nodes = []
    for n in graph.node:
        nodes.append(n)
        if n.op_type == "Sigmoid" and count != 2:
            wanted = n.output[0]
            n.output[0] = wanted + "__bad"
            nodes.append(helper.make_node("Mul", [wanted + "__bad", "__bug"], [wanted]))
    if len(nodes) > len(graph.node):
        graph.initializer.append(numpy_helper.from_array(np.array(1.5, np.float32), "__bug"))
    del graph.node[:]
    graph.node.extend(nodes)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    np.savez(sys.argv[3], **dict(zip(names, session.run(names, dict(np.load(sys.argv[2]))))))
"""


def test_a_flaky_numeric_original_is_refused_by_the_replay_riding_with_the_survey(tmp_path):
    """The replay that rides in the survey's pack is held to the same rule as one at confirm: a
    numeric check that agrees on that run stops the run as a flaky original (exit 6, the tally),
    with no reduction and no result."""
    path = sm.save(sm.pair_chain(length=8, first=2, second=6), tmp_path / "chain.onnx")
    log = tmp_path / "runs.log"
    script = sm.write_script(tmp_path, "flaky_numeric.py", FLAKY_NUMERIC.format(log=str(log)))
    out = tmp_path / "out"
    proc = run_cli("shrink", path, "--target", f"cmd:{PY} {script} {{model}} {{inputs}} {{outputs}}",
                   "-o", str(out), "--replays", "1")
    assert proc.returncode == 6, proc.stderr
    assert "flaky on the unchanged model" in proc.stderr and "2 runs" in proc.stderr, proc.stderr
    assert "mismatch" in proc.stderr and "agree" in proc.stderr, proc.stderr
    assert len(log.read_text().splitlines()) == 2  # it rode in the 2nd call: the survey's pack
    assert not (out / "minimal.onnx").exists()


# -- 6. nothing to reduce -------------------------------------------------------------------


def test_model_that_agrees_exits_6_with_numbers_and_the_rerun_command(tmp_path):
    path = sm.save(sm.agreeing_mlp(), tmp_path / "mlp.onnx")
    out = tmp_path / "out"
    proc = run_cli("shrink", path, "--target", "emulate:fp16", "-o", str(out))
    error, hint = assert_user_error(proc, 6, contains="does not diverge under emulate:fp16")
    assert "rel-l2" in error and "worst y" in error, error
    command = hint.split("rerun the check by hand: ", 1)[1]
    assert command.startswith(f"reprokit check {path} --target emulate:fp16"), hint
    assert not (out / "minimal.onnx").exists()
    assert not (out / "summary.json").exists()
    # The hint's command runs as written, agrees (exit 0) and shows the same number.
    argv = shlex.split(command)
    assert argv[0] == "reprokit"
    rerun = run_cli(*argv[1:], "--json")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    worst = json.loads(rerun.stdout)["verdict"]["outputs"][0]
    assert worst["name"] == "y"
    assert f"rel-l2 {worst['error']:.3g}" in error, (error, worst["error"])


# -- 7, 8, 9. resume, jobs, determinism -----------------------------------------------------


def shrink_args(out, *extra) -> list[str]:
    """The search run the interrupt tests start and resume (the report archive is tested
    elsewhere; it costs seconds here)."""
    return ["shrink", str(SAMPLES / f"{NO_LOCALIZE_SAMPLE}.onnx"), "--target", "emulate:fp16",
            "--inputs", str(SAMPLES / f"{NO_LOCALIZE_SAMPLE}.inputs.npz"), "--no-localize",
            "-o", str(out), "--no-pack", *extra]


def start_shrink(out, *extra):
    args = [reprokit_exe(), *shrink_args(out, *extra)]
    env = {k: v for k, v in os.environ.items() if k != "REPROKIT_DEBUG"}
    return subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        env=env,
    )


def journal_lines(out) -> int:
    try:
        return sum(
            1 for line in open(os.path.join(out, ".reprokit", "journal.jsonl")) if line.strip()
        )
    except FileNotFoundError:
        return 0


# The baseline search journals 11 candidates: the end bisection takes 6 (then keeps 33 of 65
# nodes), the start bisection 4, ddmin 1. SIGINT comes before any step is accepted, SIGTERM after.
@pytest.mark.parametrize(
    "signum, after, reduced",
    [(signal.SIGINT, 3, False), (signal.SIGTERM, 7, True)],
    ids=["SIGINT", "SIGTERM"],
)
def test_interrupted_shrink_keeps_best_so_far_and_resumes_to_the_same_result(
    tmp_path, search_baseline, signum, after, reduced
):
    out = tmp_path / "out"
    proc = start_shrink(out)
    err = interrupt_when(proc, lambda: journal_lines(out) >= after, signum)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and errors[0].startswith("Error: interrupted"), err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    original = onnx.load(str(SAMPLES / f"{NO_LOCALIZE_SAMPLE}.onnx"))
    interrupted = assert_valid_minimal(out, original)
    if reduced:
        assert len(interrupted.graph.node) < summary["original"]["nodes"]
    else:
        assert len(interrupted.graph.node) <= summary["original"]["nodes"]
    run_minimal_on_ort(out)  # best-so-far model and its feeds run as they are

    resumed = run_cli(*shrink_args(out, "--resume"))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "done"
    assert sum(s["cached"] for s in summary["steps"]) >= after - 1  # the journal was replayed
    baseline = Path(search_baseline.minimal_path).read_bytes()
    assert (out / "minimal.onnx").read_bytes() == baseline


def test_starting_over_an_unfinished_run_without_resume_is_refused(tmp_path, search_baseline):
    proc = run_cli(
        "shrink",
        str(SAMPLES / f"{NO_LOCALIZE_SAMPLE}.onnx"),
        "--target",
        "emulate:fp16",
        "--inputs",
        str(SAMPLES / f"{NO_LOCALIZE_SAMPLE}.inputs.npz"),
        "--no-localize",
        "-o",
        search_baseline.out_dir,
    )
    assert_user_error(proc, 3, contains="already holds a shrink run", hint_contains="--resume")


# Found by this test: window prefetched one candidate twice and two threads shared its file
# (FileNotFoundError); fixed in 2e2d54f (prefetch dedupe, one temp folder per evaluation).
def test_jobs_2_gives_the_same_minimal_model_as_jobs_1(tmp_path, search_baseline):
    assert (
        search_baseline.summary["minimal"]["nodes"] < search_baseline.summary["original"]["nodes"]
    )
    assert step(search_baseline.summary, "window")["accepted"] >= 1
    result = shrink(
        str(SAMPLES / f"{NO_LOCALIZE_SAMPLE}.onnx"),
        "emulate:fp16",
        str(tmp_path / "j2"),
        options=sample_options(NO_LOCALIZE_SAMPLE),
        localize_first=False,
        jobs=2,
    )
    assert Path(result.minimal_path).read_bytes() == Path(search_baseline.minimal_path).read_bytes()
    assert result.summary["minimal"] == search_baseline.summary["minimal"]
    assert result.summary["one_minimal"] == search_baseline.summary["one_minimal"]


def test_resume_with_other_options_is_refused_and_leaves_the_run_alone(tmp_path):
    """Found by this test: --resume reused the old activations and journal whatever the new
    options said (another --seed gave the old run's activations in inputs.npz while summary's
    rerun named --seed 5); fixed in 2e2d54f by the run fingerprint .reprokit/run.json."""
    model = sm.branch_fault()
    path = sm.save(model, tmp_path / "branches.onnx")
    out = tmp_path / "out"
    shrink(path, "emulate:fp16", str(out), options=RunOptions(seed=0))
    before = {
        p: p.read_bytes() for p in (out / "minimal.onnx", out / "inputs.npz", out / "summary.json")
    }
    changes = {
        "feeds": ("emulate:fp16", RunOptions(seed=5)),
        "target": ("emulate:bf16", RunOptions(seed=0)),
        "criterion": ("emulate:fp16", RunOptions(seed=0, tolerance=0.5)),
    }
    for field, (target, options) in changes.items():
        proc = run_cli(
            "shrink",
            path,
            "--target",
            target,
            "-o",
            str(out),
            "--resume",
            *(["--seed", str(options.seed)]),
            *(["--tol", str(options.tolerance)] if options.tolerance else []),
        )
        assert_user_error(proc, 3, contains=field, hint_contains="new -o directory")
        assert all(p.read_bytes() == data for p, data in before.items()), field
    # The same options resume (and finish at once: every candidate is in the journal).
    same = run_cli(
        "shrink", path, "--target", "emulate:fp16", "-o", str(out), "--resume", "--no-pack"
    )
    assert same.returncode == 0, same.stderr
    assert (out / "minimal.onnx").read_bytes() == before[out / "minimal.onnx"]


def test_two_runs_give_byte_identical_minimal_models(tmp_path, sample_shrink):
    name = "layernorm_overflow"  # localize, then ddmin deletions: several accepted steps
    first = sample_shrink(name)
    again = shrink(
        str(SAMPLES / f"{name}.onnx"),
        "emulate:fp16",
        str(tmp_path / "again"),
        options=sample_options(name),
    )
    assert Path(again.minimal_path).read_bytes() == Path(first.minimal_path).read_bytes()
    assert again.summary["minimal"] == first.summary["minimal"]
    for name in ("inputs.npz", "reference_outputs.npz"):
        assert Path(again.out_dir, name).read_bytes() == Path(first.out_dir, name).read_bytes(), (
            name
        )


def engines_running(script: str) -> list[int]:
    """pids of running ``python SCRIPT ...`` processes (a script file only one test uses)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    argv = handle.read().split(b"\0")
            except OSError:
                continue
            if len(argv) > 1 and argv[1] == script.encode():
                pids.append(int(entry))
    return [p for p in pids if not pid_gone(p)]


def test_ctrl_c_with_jobs_2_kills_the_engine_calls_in_flight(tmp_path):
    path = sm.save(sm.pair_chain(), tmp_path / "chain.onnx")
    script = sm.write_script(tmp_path, "slow_engine.py", sm.SLOW_SCRIPT)
    out = tmp_path / "out"
    args = [
        reprokit_exe(),
        "shrink",
        path,
        "--target",
        f"cmd:{PY} {script} {{model}}",
        "--fail-regex",
        "Error Code 2",
        "--jobs",
        "2",
        "--one-by-one",  # speculation runs in one-by-one searches with no call budget
        "--max-calls",
        "0",
        "--no-localize",
        "-o",
        str(out),
    ]
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 60
        while len(engines_running(script)) < 2 and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        # two at once: only the speculative pool does that (confirm and replay run one by one)
        assert len(engines_running(script)) == 2, "two speculative candidates should be running"
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=10)  # the engine calls would take 60 s
        except subprocess.TimeoutExpired:
            pytest.fail("shrink --jobs 2 did not exit within 10 s of Ctrl-C")
        assert proc.returncode == 130, err
        assert engines_running(script) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in engines_running(script):  # engine processes this test started
            os.kill(pid, signal.SIGKILL)


# -- 10. empty optional inputs and subgraphs ------------------------------------------------


@pytest.mark.parametrize("localize", [True, False], ids=["localize", "search"])
@pytest.mark.parametrize(
    "make, fault",
    [(sm.clip_empty_min_fault, "mm"), (sm.if_loop_fault, "mm")],
    ids=["clip-empty-min", "if-loop"],
)
def test_empty_optional_inputs_and_subgraphs_shrink_to_valid_models(
    tmp_path, make, fault, localize
):
    model = make()
    path = sm.save(model, tmp_path / "model.onnx")
    result = shrink(path, "emulate:fp16", str(tmp_path / "out"), localize_first=localize)
    summary = result.summary
    assert summary["status"] == "done"
    assert summary["signature"]["kind"] == "nonfinite"
    assert fault in summary["minimal"]["node_names"]
    assert summary["verdict"]["signature"]["kind"] == "nonfinite"
    # Candidates holding the Clip / If / Loop ran (window prefixes hold them): none was a model
    # the engine refused.
    assert not any(k.startswith(("build-error", "crash")) for k in summary["other_findings"])
    assert_valid_minimal(result.out_dir, model)
    run_minimal_on_ort(result.out_dir)


def test_budget_stops_a_search_near_polygraphys_cost_with_the_best_so_far(tmp_path):
    """The same two-node search, searched only (no named node, no survey), under the default
    budget (auto: 2*ceil(log2(33)) + the confirming call + 2 replays — a pass/fail check's original is
    not replayed, both are fresh runs of the result (issue 39) — + 2 for the check's pack calibration and
    its Identity probe (held back until a call passes) + the result alone = 19 calls, every call counted.
    20 before issue 39, when a check command's result was replayed 3 times; 18 while the calibration
    always carried the original's replay): the run
    stops at the budget it prints with a valid, smaller model that keeps the signature, and says so."""
    model = sm.pair_chain(length=32, first=4, second=27)
    path = sm.save(model, tmp_path / "chain.onnx")
    script = sm.write_script(tmp_path, "pair_check.py", sm.PAIR_SCRIPT)
    log = tmp_path / "runs.log"
    counting = sm.write_script(tmp_path, "counting.py", f"""
    import subprocess, sys
    with open({str(log)!r}, "a") as handle:
        handle.write("run\\n")
    sys.exit(subprocess.call([sys.executable, {str(script)!r}, *sys.argv[1:]]))
    """)
    result = shrink(path, f"cmd:{PY} {counting} {{model}}", str(tmp_path / "out"), localize_first=False,
                    options=RunOptions(fail_regex="Error Code 2"))
    summary = result.summary
    assert summary["budget"]["max_calls"] == 19
    assert summary["budget"]["stopped"] and "call budget" in summary["note"]
    assert summary["one_minimal"] is False
    # a promise: every run of the check is counted, and there are no more than the budget
    assert summary["calls"]["target"] == len(log.read_text().splitlines()) <= 19
    assert {"Sigmoid", "Tanh"} <= set(summary["minimal"]["ops"])
    assert summary["minimal"]["nodes"] < 32
    assert summary["verdict"]["signature"] == summary["signature"]
