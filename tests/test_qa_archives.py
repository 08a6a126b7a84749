"""An attacker's archives and a new user's oversized inputs (the hqa trial of issue 39's round):
each case here was an internal error (exit 70) or an unbounded allocation on the code before it.

Real archives: packed by ``pack`` (conftest.pack_matmul_softmax: x[1,16] -> MatMul(3e4) ->
Softmax, NaN under emulate:fp16), then edited the way a hostile sender would, MANIFEST.json
rewritten to match; run through the installed ``reprokit`` command.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_user_error, pack_matmul_softmax, run_cli

from reprokit.engine import feedfiles
from reprokit.errors import InputError
from reprokit.graph.model import input_infos
from reprokit.report.archive import safe_extract, write_archive, write_manifest
from tests.models import dynamic_relu, matmul_overflow, save


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return pack_matmul_softmax(tmp_path_factory.mktemp("pack")).archive


def edited(archive: str, tmp_path: Path, files: dict[str, bytes], *, rehash: bool = True) -> str:
    """The archive with ``files`` replaced; MANIFEST.json recomputed unless it is one of them."""
    top = Path(safe_extract(archive, str(tmp_path / "edit")))
    for name, data in files.items():
        (top / name).write_bytes(data)
    if rehash and "MANIFEST.json" not in files:
        manifest = json.loads((top / "MANIFEST.json").read_text())
        os.remove(top / "MANIFEST.json")
        write_manifest(
            str(top), {k: v for k, v in manifest.items() if k not in ("schema", "files")}
        )
    out = str(tmp_path / "hostile.tar.gz")
    write_archive(str(top), out, "tar.gz")
    shutil.rmtree(tmp_path / "edit")
    return out


NESTED = (
    b"[" * 100_000 + b"]" * 100_000
)  # 200 kB of valid JSON, deeper than Python's recursion limit


@pytest.mark.parametrize("name", ["verdict.json", "MANIFEST.json"])
def test_json_nested_past_the_recursion_limit_is_a_refused_archive(packed, tmp_path, name):
    # old code: "internal error: RecursionError" (exit 70), for verify and verify --versions alike
    archive = edited(packed, tmp_path, {name: NESTED})
    for args in (
        ["verify", archive],
        ["verify", archive, "--versions", "onnxruntime==1.20.0", "--json"],
    ):
        assert_user_error(run_cli(*args), 3, contains=f"no usable {name}")


def npy_header_only(shape: tuple[int, ...]) -> bytes:
    """An .npz member whose header declares ``shape`` float32 and holds 16 bytes of data."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": shape}
    )
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as npz:
        npz.writestr("x.npy", header.getvalue() + b"\0" * 16)
    return buffer.getvalue()


def test_archive_inputs_declaring_terabytes_are_refused_before_any_allocation(packed, tmp_path):
    # old code: numpy was asked for 4 TiB and said MemoryError; a declared size under the
    # machine's memory but above what it can spare was allocated and filled
    archive = edited(packed, tmp_path, {"inputs.npz": npy_header_only((1 << 40,))})
    _, hint = assert_user_error(
        run_cli("verify", archive), 3, contains="declares 4.1e+03 GiB of arrays"
    )
    assert "corrupt or hostile" in hint


def test_an_npz_bomb_is_refused_from_its_headers_without_reading_its_data(tmp_path, monkeypatch):
    """64 MiB of zeros deflate to 64 kB: with the bound at 1 MiB the file is refused from its
    headers, and no member is decompressed (the loader is never reached)."""
    bomb = tmp_path / "bomb.npz"
    np.savez_compressed(bomb, x=np.zeros((1 << 24,), np.float32))
    assert bomb.stat().st_size < 1 << 20
    monkeypatch.setattr(feedfiles, "memory_bound", lambda: 1 << 20, raising=False)
    monkeypatch.setattr(
        feedfiles, "load_npz", lambda path: pytest.fail("the bomb was decompressed")
    )
    with pytest.raises(InputError, match="declares 64 MiB of arrays"):
        feedfiles.load_feeds(str(bomb), input_infos(matmul_overflow()))  # x[1,16] -> MatMul -> y


def test_input_shapes_beyond_memory_are_a_usage_error_not_an_internal_one(tmp_path):
    # old code: "internal error: MemoryError: Unable to allocate 21.3 PiB" (exit 70)
    model = save(dynamic_relu(), tmp_path / "dyn.onnx")  # x[N,3,H,W] -> Relu -> y
    proc = run_cli(
        "check", model, "--target", "emulate:fp16", "--input-shapes", "x:100000x3x100000x100000"
    )
    error, hint = assert_user_error(proc, 2, contains="more than half this machine's memory")
    assert "--input-shapes" in hint and "[100000, 3, 100000, 100000]" in error


def test_a_manifest_that_lies_about_a_size_is_refused(packed, tmp_path):
    # old code: only the SHA-256 was compared; a manifest claiming 999999 bytes for model.onnx
    # passed its check and verify reproduced (exit 1)
    top = Path(safe_extract(packed, str(tmp_path / "edit")))
    manifest = json.loads((top / "MANIFEST.json").read_text())
    manifest["files"]["model.onnx"]["bytes"] = 999_999
    (tmp_path / "e").mkdir()
    archive = edited(packed, tmp_path / "e", {"MANIFEST.json": json.dumps(manifest).encode()})
    assert_user_error(run_cli("verify", archive), 3, contains="model.onnx has")
