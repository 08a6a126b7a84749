"""The one archive reader against header bombs (issue 37 item 2): a .tar.gz whose PAX or GNU
long-name header declares 1.5e9 bytes (1.5 MB on disk: concatenated gzip members of zeros) is
refused by ``verify`` and ``verify --versions`` within 100 MB of memory, measured as peak RSS in a
fresh process. At 21297fd ``tarfile`` read the header whole: about 1.5 GB before the refusal.
Sparse and continuous members, and zips declaring more members than allowed, are refused too.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from conftest import assert_user_error, run_cli

from reprokit.errors import InputError
from reprokit.report.archive import MAX_MEMBERS, safe_extract

DECLARED = 1_500_000_000
CHUNK = 16 << 20


def header_bomb(path: Path, kind: bytes) -> Path:
    """top/ then one header of type ``kind`` declaring DECLARED bytes, the bytes being zeros."""
    info = tarfile.TarInfo("top/bomb")
    info.type, info.size = kind, DECLARED
    folder = tarfile.TarInfo("top")
    folder.type = tarfile.DIRTYPE
    zeros = gzip.compress(b"\0" * CHUNK, compresslevel=9)
    with open(path, "wb") as handle:
        handle.write(
            gzip.compress(folder.tobuf(tarfile.USTAR_FORMAT) + info.tobuf(tarfile.USTAR_FORMAT))
        )
        for _ in range(
            -(-DECLARED // CHUNK) + 1
        ):  # gzip members concatenate: one stream to tarfile
            handle.write(zeros)
    assert path.stat().st_size < 10_000_000
    return path


MEASURE = """
import json, resource, sys, tempfile
from reprokit.errors import InputError
from reprokit.report.archive import safe_extract
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    with tempfile.TemporaryDirectory() as tmp:
        safe_extract(sys.argv[1], tmp)
    said = None
except InputError as exc:
    said = exc.message
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"grew_kb": after - before, "said": said}))
"""


@pytest.mark.parametrize(
    "kind,name",
    [
        (tarfile.XHDTYPE, "PAX"),
        (tarfile.GNUTYPE_LONGNAME, "GNU long-name"),
        (tarfile.XGLTYPE, "PAX global"),
    ],
)
def test_a_header_bomb_is_refused_within_100_mb(tmp_path, kind, name):
    bomb = header_bomb(tmp_path / "bomb.tar.gz", kind)
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, str(bomb)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["grew_kb"] < 100 * 1024, f"peak RSS grew {found['grew_kb'] / 1024:.0f} MB"
    assert found["said"] and f"a {name} header declares {DECLARED} bytes" in found["said"]


def test_verify_and_versions_refuse_the_bomb_with_exit_3(tmp_path):
    bomb = header_bomb(tmp_path / "bomb.tar.gz", tarfile.XHDTYPE)
    assert_user_error(run_cli("verify", str(bomb)), 3, contains="PAX header declares")
    proc = run_cli(
        "verify", str(bomb), "--versions", "onnxruntime==1.20.0", "-o", str(tmp_path / "m.tar.gz")
    )
    assert_user_error(proc, 3, contains="PAX header declares")


@pytest.mark.parametrize("kind", [tarfile.GNUTYPE_SPARSE, tarfile.CONTTYPE])
def test_members_of_other_kinds_are_refused(tmp_path, kind):
    path = tmp_path / "odd.tar.gz"
    with tarfile.open(path, "w:gz", format=tarfile.GNU_FORMAT) as archive:
        info = tarfile.TarInfo("top/model.onnx")
        info.type, info.size = kind, 0
        archive.addfile(info)
    with pytest.raises(InputError, match="sparse file|not a regular file"):
        safe_extract(str(path), str(tmp_path / "x"))
    assert not (tmp_path / "x" / "top" / "model.onnx").exists()


def test_a_zip_declaring_too_many_members_is_refused_before_listing(tmp_path):
    path = tmp_path / "many.zip"
    with zipfile.ZipFile(path, "w") as archive:
        for index in range(MAX_MEMBERS + 1):
            archive.writestr(f"top/{index}", b"")
    with pytest.raises(InputError, match=f"{MAX_MEMBERS + 1} members"):
        safe_extract(str(path), str(tmp_path / "x"))


def test_weights_that_do_not_compress_are_stored_and_round_trip(tmp_path):
    """Float weights barely deflate (a Swin window: 9%, seconds per 100 MB): a report folder
    that is mostly such bytes is written stored (the .tar.gz no smaller than they are; a zip
    stores that member and deflates the text), text alone is deflated, and both archives
    extract to the same bytes, their manifests checked."""
    import numpy as np

    from reprokit.report.archive import check_manifest, write_archive, write_manifest

    weights = np.random.default_rng(0).standard_normal(1 << 18).astype(np.float32).tobytes()
    text = ("the same line of a README, again and again\n" * 20000).encode()
    for name, files in (("weights", {"model.onnx": weights, "README.md": text[:4000]}), ("text", {"README.md": text})):
        root = tmp_path / name / "report"
        root.mkdir(parents=True)
        for rel, data in files.items():
            (root / rel).write_bytes(data)
        write_manifest(str(root))
        raw = sum(len(d) for d in files.values())
        for fmt in ("tar.gz", "zip"):
            out = tmp_path / name / f"report.{fmt}"
            write_archive(str(root), str(out), fmt)
            size = out.stat().st_size
            assert (size >= len(weights)) if name == "weights" else (size < raw // 10), (name, fmt, size, raw)
            if fmt == "zip":
                with zipfile.ZipFile(out) as archive:
                    kinds = {i.filename.split("/", 1)[1]: i.compress_type for i in archive.infolist()}
                assert kinds["README.md"] == zipfile.ZIP_DEFLATED
                assert kinds.get("model.onnx", zipfile.ZIP_STORED) == zipfile.ZIP_STORED
            top = safe_extract(str(out), str(tmp_path / name / f"x-{fmt}"))
            assert check_manifest(top) == []
            for rel, data in files.items():
                assert Path(top, rel).read_bytes() == data
