"""inputs.py: loading feeds (.npz, polygraphy JSON, ONNX test_data_set folders), seeded random
feeds, --val-range and --input-shapes parsing, and the errors for feeds that do not fit."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from reprokit.api import RunOptions, check, prepare
from reprokit.engine.feedfiles import load_feeds
from reprokit.engine.inputs import (
    parse_shape_args,
    parse_val_ranges,
    random_feeds,
    validate_feeds,
)
from reprokit.errors import ExitCode, InputError, UsageError
from reprokit.graph.io import load_model
from reprokit.graph.model import InputInfo, input_infos

X = InputInfo("x", np.dtype("float32"), (1, 8))


@pytest.fixture
def mlp_infos(model_file):
    return input_infos(load_model(model_file("small_mlp")))


def arr(seed=0, shape=(1, 8)):
    return np.random.default_rng(seed).uniform(size=shape).astype(np.float32)


# --- loading -----------------------------------------------------------------------------


def test_npz_roundtrip(tmp_path, mlp_infos):
    path = str(tmp_path / "in.npz")
    np.savez(path, x=arr(3))
    feeds = load_feeds(path, mlp_infos)
    assert feeds.source == path and feeds.notes == []
    np.testing.assert_array_equal(feeds.arrays["x"], arr(3))


def test_polygraphy_json_multi_sample_picks_and_notes(tmp_path, mlp_infos):
    from polygraphy.json import save_json

    path = str(tmp_path / "inputs.json")
    save_json([{"x": arr(1)}, {"x": arr(2)}], path)
    first = load_feeds(path, mlp_infos)
    np.testing.assert_array_equal(first.arrays["x"], arr(1))
    assert first.notes == [f"{path} has 2 samples; using sample 0 (--sample N picks another)"]
    second = load_feeds(path, mlp_infos, sample=1)
    np.testing.assert_array_equal(second.arrays["x"], arr(2))
    assert second.notes == [f"{path} has 2 samples; using sample 1 (--sample N picks another)"]
    with pytest.raises(UsageError) as info:
        load_feeds(path, mlp_infos, sample=2)
    assert info.value.message == f"--sample 2 is out of range: {path} has 2 samples"
    assert info.value.exit_code == ExitCode.USAGE


def test_polygraphy_json_sample_is_what_the_engines_see(model_file, tmp_path):
    """End to end: --inputs inputs.json --sample 1 feeds sample 1 to both engines."""
    from polygraphy.json import save_json

    path = str(tmp_path / "inputs.json")
    save_json([{"x": arr(1)}, {"x": arr(2)}], path)
    result = check(
        model_file("small_mlp"), "emulate:fp16", options=RunOptions(inputs=path, sample=1)
    )
    np.testing.assert_array_equal(result.prepared.feeds.arrays["x"], arr(2))
    assert any("2 samples; using sample 1" in note for note in result.prepared.notes)
    assert result.verdict.kind.value == "agree"


def test_onnx_test_data_set_folder(tmp_path, model_file):
    infos = input_infos(load_model(model_file("two_inputs")))
    folder = tmp_path / "test_data_set_0"
    folder.mkdir()
    x = arr(4, (2, 3))
    k = np.arange(6, dtype=np.int64).reshape(2, 3)
    # unnamed tensors map to the model's inputs in order (input_0 -> x, input_1 -> k)
    (folder / "input_0.pb").write_bytes(numpy_helper.from_array(x).SerializeToString())
    (folder / "input_1.pb").write_bytes(numpy_helper.from_array(k).SerializeToString())
    feeds = load_feeds(str(folder), infos)
    np.testing.assert_array_equal(feeds.arrays["x"], x)
    np.testing.assert_array_equal(feeds.arrays["k"], k)


def test_onnx_test_data_set_named_tensors(tmp_path, mlp_infos):
    folder = tmp_path / "test_data_set_0"
    folder.mkdir()
    (folder / "input_0.pb").write_bytes(numpy_helper.from_array(arr(5), "x").SerializeToString())
    np.testing.assert_array_equal(load_feeds(str(folder), mlp_infos).arrays["x"], arr(5))


def test_empty_test_data_set_folder_is_refused(tmp_path, mlp_infos):
    with pytest.raises(InputError, match="has no input_\\*.pb files"):
        load_feeds(str(tmp_path), mlp_infos)


def test_missing_inputs_file(tmp_path, mlp_infos):
    with pytest.raises(InputError) as info:
        load_feeds(str(tmp_path / "nope.npz"), mlp_infos)
    assert info.value.message == f"inputs file not found: {tmp_path / 'nope.npz'}"


def test_pickled_npz_is_refused(tmp_path, mlp_infos):
    path = str(tmp_path / "evil.npz")
    np.savez(path, x=np.array([{"a": 1}], dtype=object))
    with pytest.raises(InputError) as info:
        load_feeds(path, mlp_infos)
    assert "need pickling, which reprokit refuses" in info.value.message
    assert info.value.exit_code == ExitCode.INPUT


def test_not_an_npz_is_refused(tmp_path, mlp_infos):
    path = tmp_path / "junk.npz"
    path.write_bytes(b"definitely not a zip file")
    with pytest.raises(InputError) as info:
        load_feeds(str(path), mlp_infos)
    assert "pickl" not in info.value.message
    assert info.value.message.startswith(f"cannot read {path} as .npz")


# --- validation errors -------------------------------------------------------------------


def test_unknown_input_name():
    with pytest.raises(InputError) as info:
        validate_feeds({"x": arr(), "bogus": arr()}, [X])
    assert info.value.message == "the inputs name 'bogus', which is not an input of the model"
    assert info.value.hint == "model inputs: x"


def test_missing_input():
    with pytest.raises(InputError) as info:
        validate_feeds({}, [X])
    assert info.value.message == "the inputs lack model input 'x'"


def test_wrong_dtype():
    with pytest.raises(InputError) as info:
        validate_feeds({"x": arr().astype(np.float64)}, [X])
    assert info.value.message == "input 'x' has dtype float64, the model expects float32"
    assert info.value.hint == "convert it, e.g. array.astype(np.float32)"


def test_wrong_rank_and_wrong_static_dim():
    with pytest.raises(InputError, match=r"expects rank 2 \[1, 8\]"):
        validate_feeds({"x": np.zeros((8,), np.float32)}, [X])
    with pytest.raises(InputError) as info:
        validate_feeds({"x": np.zeros((1, 9), np.float32)}, [X])
    assert info.value.message == "input 'x' has shape [1, 9], the model expects [1, 8] (dim 1)"


def test_dynamic_dims_accept_any_size():
    info = InputInfo("x", np.dtype("float32"), ("N", 3, None, None))
    validate_feeds({"x": np.zeros((5, 3, 7, 2), np.float32)}, [info])
    with pytest.raises(InputError, match=r"\(dim 1\)"):
        validate_feeds({"x": np.zeros((5, 4, 7, 2), np.float32)}, [info])


# --- random feeds ------------------------------------------------------------------------


def test_random_feeds_are_deterministic_per_seed(model_file):
    infos = input_infos(load_model(model_file("two_inputs")))
    a = random_feeds(infos, seed=7)
    b = random_feeds(infos, seed=7)
    c = random_feeds(infos, seed=8)
    for name in ("x", "k"):
        np.testing.assert_array_equal(a.arrays[name], b.arrays[name])
    assert not np.array_equal(a.arrays["x"], c.arrays["x"])
    assert a.arrays["x"].dtype == np.float32 and a.arrays["k"].dtype == np.int64
    assert a.source == "random (seed 7)"
    assert 0 <= a.arrays["x"].min() and a.arrays["x"].max() < 1  # default range [0, 1)


def test_prepare_uses_the_seed(model_file, tmp_path):
    path = model_file("small_mlp")
    one = prepare(path, RunOptions(seed=3), str(tmp_path / "a")).feeds.arrays["x"]
    two = prepare(path, RunOptions(seed=3), str(tmp_path / "b")).feeds.arrays["x"]
    np.testing.assert_array_equal(one, two)


def test_val_range_per_input_and_for_all():
    ranges = parse_val_ranges(["x:[-2,-1]"])
    assert ranges == {"x": (-2.0, -1.0)}
    values = random_feeds([X], val_ranges=ranges).arrays["x"]
    assert values.min() >= -2 and values.max() < -1
    assert parse_val_ranges(["[0.5, 4]"]) == {None: (0.5, 4.0)}
    values = random_feeds([X], val_ranges={None: (10.0, 11.0)}).arrays["x"]
    assert values.min() >= 10 and values.max() < 11


@pytest.mark.parametrize("text", ["x:[2,1]", "x:2,1", "x:[a,b]", "[1]"])
def test_bad_val_range_is_a_usage_error(text):
    with pytest.raises(UsageError):
        parse_val_ranges([text])


def test_val_range_for_unknown_input():
    with pytest.raises(InputError) as info:
        random_feeds([X], val_ranges={"nope": (0.0, 1.0)})
    assert info.value.message == "--val-range names 'nope', which is not an input of the model"


def test_dynamic_dims_get_sizes_by_name_and_a_note(model_file):
    infos = input_infos(load_model(model_file("dynamic_relu")))
    feeds = random_feeds(infos)
    assert feeds.arrays["x"].shape == (1, 3, 224, 224)
    assert feeds.notes == [
        "input 'x' has dynamic dims ['N', 3, 'H', 'W']; reprokit chose 1x3x224x224 (N=1, H=224, W=224: by "
        "the dims' names); give the sizes your model takes with --input-shapes x:1x3x224x224"
    ]
    assert random_feeds(infos, shapes={"x": (2, 3, 4, 5)}).arrays["x"].shape == (2, 3, 4, 5)


# --- --input-shapes ----------------------------------------------------------------------


@pytest.mark.parametrize("text", ["x:1x3x8x8", "x:[1,3,8,8]", "x:[1, 3, 8, 8]"])
def test_input_shape_forms(text):
    assert parse_shape_args([text]) == {"x": (1, 3, 8, 8)}


def test_several_input_shapes():
    assert parse_shape_args(["a:1x2 b:[3,4]", "c:5"]) == {"a": (1, 2), "b": (3, 4), "c": (5,)}


@pytest.mark.parametrize("text", ["x", "1x3x8x8", "x:axb", ":1x3"])
def test_unparseable_input_shape_is_a_usage_error(text):
    with pytest.raises(UsageError) as info:
        parse_shape_args([text])
    assert info.value.hint == "write NAME:1x3x224x224 or NAME:[1,3,224,224]"


def test_garbage_after_dims_is_a_usage_error():
    with pytest.raises(UsageError):
        parse_shape_args(["x:1xAx8"])


def test_input_names_with_colons():
    assert parse_shape_args(["input:0:1x3x8x8"]) == {"input:0": (1, 3, 8, 8)}


def test_input_shapes_reach_the_prepared_model_and_feeds(model_file, tmp_path):
    prepared = prepare(
        model_file("dynamic_relu"), RunOptions(input_shapes={"x": (2, 3, 4, 5)}), str(tmp_path)
    )
    assert prepared.feeds.arrays["x"].shape == (2, 3, 4, 5)
    assert prepared.infos[0].shape == (2, 3, 4, 5)
    assert prepared.path == str(tmp_path / "prepared.onnx")
    frozen = onnx.load(prepared.path)
    assert [d.dim_value for d in frozen.graph.input[0].type.tensor_type.shape.dim] == [2, 3, 4, 5]
