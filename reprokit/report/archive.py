"""Report archives on disk: MANIFEST.json with SHA-256 of every file, deterministic .tar.gz /
.zip writing, and extraction that treats the archive as untrusted (one top folder, no absolute
paths, no '..', regular files and folders only, a size cap, manifest check). The ONE reader of
archives: every header is bounded before ``tarfile`` reads it (a PAX or GNU long-name header
declaring 1.5 GB would otherwise be read whole), a zip's member count before ``zipfile`` lists
them. Runs nothing from an archive.
"""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile
import zipfile

from reprokit.engine.oracle import file_digest as sha256
from reprokit.errors import InputError
from reprokit.files import atomic_write, read_json

MANIFEST = "MANIFEST.json"
MAX_TOTAL_BYTES = 4 * 2**30  # unpacked size cap: a decompression bomb stops here
MAX_MEMBERS = 10_000
ARCHIVE_JSON_BYTES = 8 << 20  # MANIFEST.json of MAX_MEMBERS files is ~1.5 MB; verdict.json, env.json: kB
MAX_HEADER_BYTES = 1 << 20  # a PAX / GNU long-name header holds a path and a few keys: never a megabyte
_LONG_HEADERS = {tarfile.XHDTYPE: "PAX", tarfile.XGLTYPE: "PAX global", tarfile.SOLARIS_XHDTYPE: "PAX (Solaris)",
                 tarfile.GNUTYPE_LONGNAME: "GNU long-name", tarfile.GNUTYPE_LONGLINK: "GNU long-link"}


class HeaderRefused(Exception):
    """A tar header reprokit will not let ``tarfile`` read (too large, or a kind it never writes)."""


class _BoundedInfo(tarfile.TarInfo):
    """A TarInfo that checks each header's kind and declared size before ``tarfile`` reads the
    header's data (it reads a PAX or GNU long-name header whole into memory)."""

    def _proc_member(self, tarfile_):
        kind = _LONG_HEADERS.get(self.type)
        if kind and self.size > MAX_HEADER_BYTES:
            raise HeaderRefused(f"a {kind} header declares {self.size} bytes (at most {MAX_HEADER_BYTES} are read)")
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise HeaderRefused(f"member {self.name!r} is a sparse file")
        return super()._proc_member(tarfile_)


def open_tar(path: str) -> tarfile.TarFile:
    """``tarfile.open(path, "r:*")`` with every header bounded (``_BoundedInfo``); raises
    HeaderRefused, tarfile.TarError or OSError."""
    return tarfile.open(path, "r:*", tarinfo=_BoundedInfo)


def zip_entries(path: str) -> int:
    """The member count a zip's end record declares, read before ``zipfile`` lists them all."""
    with open(path, "rb") as handle:
        end = zipfile._EndRecData(handle)  # noqa: SLF001 - the stdlib's own end-record reader
    if end is None:
        raise zipfile.BadZipFile("no end of central directory record")
    return int(end[zipfile._ECD_ENTRIES_TOTAL])  # noqa: SLF001


def files_under(root: str) -> list[str]:
    out = []
    for base, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            out.append(os.path.relpath(os.path.join(base, name), root).replace(os.sep, "/"))
    return out


def write_manifest(root: str, extra: dict | None = None) -> dict:
    entries = {rel: {"sha256": sha256(os.path.join(root, rel)), "bytes": os.path.getsize(os.path.join(root, rel))}
               for rel in files_under(root) if rel != MANIFEST}
    manifest = {"schema": "reprokit.manifest/1", "files": entries, **(extra or {})}
    with open(os.path.join(root, MANIFEST), "w") as handle:
        json.dump(manifest, handle, indent=2, sort_keys=True)
    return manifest


def check_manifest(root: str) -> list[str]:
    """Problems found: files changed, missing or not listed. Empty when all is well."""
    path = os.path.join(root, MANIFEST)
    if not os.path.exists(path):
        return [f"{MANIFEST} is missing"]
    try:
        listed = read_json(path, max_bytes=ARCHIVE_JSON_BYTES, what=MANIFEST)["files"]
    except (ValueError, KeyError, TypeError):
        listed = None
    if not isinstance(listed, dict):
        return [f"{MANIFEST} is not a reprokit manifest"]
    problems = []
    present = set(files_under(root)) - {MANIFEST}
    for rel, entry in sorted(listed.items()):
        if rel not in present:
            problems.append(f"{rel} is listed but missing")
        elif sha256(os.path.join(root, rel)) != entry.get("sha256"):
            problems.append(f"{rel} does not match its SHA-256 in the manifest")
        elif "bytes" in entry and entry["bytes"] != os.path.getsize(os.path.join(root, rel)):  # optional: old archives
            problems.append(f"{rel} has {os.path.getsize(os.path.join(root, rel))} bytes, the manifest says {entry['bytes']}")
    problems += [f"{rel} is not in the manifest" for rel in sorted(present - set(listed))]
    return problems


def write_archive(root: str, out_path: str, fmt: str) -> str:
    """Archive ``root`` as one top folder; byte-identical for identical content."""
    top = os.path.basename(os.path.normpath(root))
    # a full disk or an interrupt leaves no half archive behind
    return atomic_write(out_path, lambda tmp: _write(root, top, tmp, fmt))


def compresses(path: str, *, samples: int = 16, sample_bytes: int = 1 << 16) -> bool:
    """Does deflate save at least a tenth of this file? Judged on samples from the middles of
    equal stretches of it (an ONNX file's node list, which compresses, is its first percent: a
    sample at either end weighed it as much as 10 MB of weights). Float weights save a few
    percent at a few seconds per 100 MB (a Swin's drift window: 8%, 4 s of its archive): they
    are stored."""
    import zlib

    size = os.path.getsize(path)
    if size <= samples * sample_bytes:
        with open(path, "rb") as handle:
            data = handle.read()
    else:
        chunks = []
        with open(path, "rb") as handle:
            for k in range(samples):
                handle.seek((2 * k + 1) * size // (2 * samples) - sample_bytes // 2)
                chunks.append(handle.read(sample_bytes))
        data = b"".join(chunks)
    return not data or len(zlib.compress(data, 6)) <= 0.9 * len(data)


def _write(root: str, top: str, tmp: str, fmt: str) -> None:
    files = files_under(root)
    packed = {rel: compresses(os.path.join(root, rel)) for rel in files}
    if fmt == "zip":
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
            for rel in files:
                info = zipfile.ZipInfo(f"{top}/{rel}", date_time=(1980, 1, 1, 0, 0, 0))
                info.external_attr = 0o644 << 16
                info.compress_type = zipfile.ZIP_DEFLATED if packed[rel] else zipfile.ZIP_STORED
                with open(os.path.join(root, rel), "rb") as handle:
                    archive.writestr(info, handle.read())
    else:
        import gzip

        # one stream: level 6 (zlib's default, the zip's) when most of its bytes compress, else
        # stored (level 0) — float weights barely compress, and deflating them cost 4 s of a
        # 3,647-node Swin run's archive for 9% of its size (gzip's own default, 9, cost 33 s)
        stored = sum(os.path.getsize(os.path.join(root, rel)) for rel in files if not packed[rel])
        total = sum(os.path.getsize(os.path.join(root, rel)) for rel in files)
        level = 0 if stored > total // 2 else 6
        with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="",
                                                   compresslevel=level) as gz:
            with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as archive:
                for rel in files:
                    path = os.path.join(root, rel)
                    info = tarfile.TarInfo(f"{top}/{rel}")
                    info.size = os.path.getsize(path)
                    info.mode = 0o755 if rel.endswith((".py", ".sh")) else 0o644
                    info.mtime = 0
                    with open(path, "rb") as handle:
                        archive.addfile(info, handle)


def _refuse(archive_path: str, why: str):
    raise InputError(f"refusing archive {archive_path}: {why}",
                     hint="only archives written by `reprokit pack`, unmodified, are accepted")


class _Layout:
    """Names seen so far, so that no file is also a folder (``top/a`` and ``top/a/b``) and no
    file comes twice: extraction would fail half-way, or a later member overwrite an earlier one."""

    def __init__(self, archive_path: str):
        self.archive_path = archive_path
        self.files: set[str] = set()
        self.folders: set[str] = set()

    def add(self, name: str, is_dir: bool) -> None:
        parts = name.split("/")
        parents = {"/".join(parts[:i]) for i in range(1, len(parts))}
        if name in self.files or (not is_dir and name in self.folders) or parents & self.files:
            _refuse(self.archive_path, f"member {name!r} clashes with an earlier member "
                                       "(one path both a file and a folder, or a file listed twice)")
        self.folders |= parents
        (self.folders if is_dir else self.files).add(name)


def _check_name(archive_path: str, name: str, tops: set[str]) -> str:
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        _refuse(archive_path, f"absolute path {name!r}")
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        _refuse(archive_path, f"member {name!r} points outside the top folder")
    tops.add(parts[0])
    if len(tops) > 1:
        _refuse(archive_path, f"more than one top folder ({', '.join(sorted(tops))})")
    return "/".join(parts)


def safe_extract(archive_path: str, dest: str, max_bytes: int = MAX_TOTAL_BYTES) -> str:
    """Extract into ``dest`` after checking every member; return the top folder's path.
    A corrupt or truncated archive is refused like a hostile one."""
    import zlib

    try:
        return _safe_extract(archive_path, dest, max_bytes)
    except HeaderRefused as exc:
        _refuse(archive_path, str(exc))
    except (tarfile.TarError, zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno is not None:
            raise  # a real I/O error on our side (disk full ...), not the archive's
        _refuse(archive_path, f"it is corrupt or truncated ({exc.__class__.__name__}: {exc})")


def _safe_extract(archive_path: str, dest: str, max_bytes: int) -> str:
    if os.path.isdir(archive_path):
        raise InputError(f"{archive_path} is a folder, not an archive",
                         hint="give the .tar.gz or .zip that `reprokit pack` wrote, not a folder unpacked from it")
    if os.path.exists(archive_path) and not os.path.isfile(archive_path):
        raise InputError(f"{archive_path} is not a regular file", hint="give the .tar.gz or .zip that `reprokit pack` wrote")
    if not os.path.isfile(archive_path):
        raise InputError(f"archive not found: {archive_path}", hint="check the path")
    tops: set[str] = set()
    layout = _Layout(archive_path)
    total = 0
    members = []
    if zipfile.is_zipfile(archive_path):
        if zip_entries(archive_path) > MAX_MEMBERS:
            _refuse(archive_path, f"{zip_entries(archive_path)} members")
        with zipfile.ZipFile(archive_path) as archive:
            infos = archive.infolist()
            if len(infos) > MAX_MEMBERS:
                _refuse(archive_path, f"{len(infos)} members")
            for info in infos:
                name = _check_name(archive_path, info.filename, tops)
                mode = info.external_attr >> 16
                if stat.S_ISLNK(mode):
                    _refuse(archive_path, f"member {info.filename!r} is a link")
                if stat.S_IFMT(mode) not in (0, stat.S_IFREG, stat.S_IFDIR):
                    _refuse(archive_path, f"member {info.filename!r} is not a regular file or folder")
                total += info.file_size
                if total > max_bytes:
                    _refuse(archive_path, f"unpacks to more than {max_bytes} bytes (decompression bomb?)")
                layout.add(name, info.is_dir())
                if not info.is_dir():
                    members.append((name, info))
            for name, info in members:
                _write_member(dest, name, archive.open(info), info.file_size, max_bytes)
    else:
        try:
            archive = open_tar(archive_path)
        except (tarfile.TarError, OSError) as exc:
            _refuse(archive_path, f"not a .tar.gz or .zip ({exc})")
        with archive:
            count = 0
            for info in archive:
                count += 1
                if count > MAX_MEMBERS:
                    _refuse(archive_path, "too many members")
                name = _check_name(archive_path, info.name, tops)
                if info.issym() or info.islnk():
                    _refuse(archive_path, f"member {info.name!r} is a link")
                if info.isdir():
                    layout.add(name, True)
                    continue
                if info.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):  # not CONTTYPE, sparse, devices
                    _refuse(archive_path, f"member {info.name!r} is not a regular file")
                total += info.size
                if total > max_bytes:
                    _refuse(archive_path, f"unpacks to more than {max_bytes} bytes (decompression bomb?)")
                layout.add(name, False)
                _write_member(dest, name, archive.extractfile(info), info.size, max_bytes)
    if not tops:
        _refuse(archive_path, "it is empty")
    return os.path.join(dest, tops.pop())


def _write_member(dest: str, name: str, source: io.BufferedIOBase, declared: int, max_bytes: int) -> None:
    path = os.path.join(dest, *name.split("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    written = 0
    with source, open(path, "wb") as out:
        while chunk := source.read(1 << 20):
            written += len(chunk)
            if written > declared or written > max_bytes:
                raise InputError(f"archive member {name!r} is larger than it declares",
                                 hint="the archive is corrupt or hostile; do not use it")
            out.write(chunk)
