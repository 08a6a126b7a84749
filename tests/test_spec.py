"""spec.py: the target grammar ``engine[:option,option...]`` and its errors (no engine runs)."""

from __future__ import annotations

import pytest

from reprokit.errors import EngineUnavailable, ExitCode, UsageError
from reprokit.spec import TargetSpec, parse_target


@pytest.mark.parametrize(
    "text, engine, options",
    [
        ("emulate:fp16", "emulate", (("fp16", True),)),
        ("  EMULATE:fp16 ", "emulate", (("fp16", True),)),
        ("emulate:bf16,fp32-nodes=a;b", "emulate", (("bf16", True), ("fp32-nodes", "a;b"))),
        ("openvino", "openvino", ()),
        ("openvino:f32", "openvino", (("f32", True),)),
        ("ort", "ort", ()),
        ("ort:trt,fp16", "ort", (("trt", True), ("fp16", True))),
    ],
)
def test_valid_specs(text, engine, options):
    spec = parse_target(text)
    assert (spec.engine, spec.options) == (engine, options)
    assert parse_target(str(spec)) == spec  # str() is a spec that parses back to itself


def test_spec_accessors():
    spec = parse_target("emulate:fp16,fp32-nodes=n1")
    assert spec.has("fp16") and not spec.has("bf16")
    assert spec.get("fp32-nodes") == "n1" and spec.get("nope", 5) == 5
    assert str(spec.with_options("fp32-nodes=n2")) == "emulate:fp16,fp32-nodes=n1,fp32-nodes=n2"
    assert str(parse_target("ort").with_options("opt")) == "ort:opt"


def test_cmd_spec_keeps_the_command_verbatim(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "check.py").write_text("")  # a missing script is an environment error (issue 18)
    spec = parse_target("cmd:python check.py {model} --flag=a,b")
    assert spec == TargetSpec(engine="cmd", command="python check.py {model} --flag=a,b")
    assert str(spec) == "cmd:python check.py {model} --flag=a,b"


def usage_error(text: str) -> UsageError:
    with pytest.raises(UsageError) as info:
        parse_target(text)
    assert info.value.exit_code == ExitCode.USAGE
    return info.value


def test_unknown_engine():
    err = usage_error("foo:fp16")
    assert err.message == "unknown engine 'foo' in target spec 'foo:fp16'"
    assert err.hint == "engines: ort, emulate, openvino, trt, cmd; see `reprokit backends`"


def test_unknown_option_lists_the_valid_ones():
    err = usage_error("emulate:fp17")
    assert err.message == "unknown option 'fp17' for engine 'emulate'"
    assert err.hint == "options of emulate: bf16, fp16, fp32-nodes, typed"


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty target spec"),
        ("emulate", "emulate needs exactly one precision: emulate:fp16, emulate:bf16 or emulate:typed"),
        ("emulate:fp16,bf16", "emulate needs exactly one precision: emulate:fp16, emulate:bf16 or emulate:typed"),
        ("emulate:fp16=1", "option 'fp16' of 'emulate' takes no value"),
        (
            "emulate:fp16,fp32-nodes",
            "option 'fp32-nodes' of 'emulate' needs a value: fp32-nodes=...",
        ),
        ("openvino:bf16,f32", "openvino takes one precision: bf16, f16 or f32"),
        ("ort:fp16", "ort:fp16 needs a GPU provider"),
        ("cmd:", "the cmd engine needs a command: cmd:COMMAND"),
        ("cmd:   ", "the cmd engine needs a command: cmd:COMMAND"),
    ],
)
def test_invalid_specs(text, message):
    assert usage_error(text).message == message


def test_missing_check_command_is_found_while_parsing():
    with pytest.raises(EngineUnavailable) as info:
        parse_target("cmd:no-such-command-xyz {model}")
    assert info.value.exit_code == ExitCode.ENVIRONMENT
    assert info.value.message == "check command not found: 'no-such-command-xyz'"
