"""``--versions SPEC``: which engine package and which of its releases a matrix runs.

SPEC is ``PACKAGE==V1,V2,latest`` (exact releases; ``10.0.*`` means the newest 10.0 release) or
``PACKAGE`` with a PEP 440 range (``openvino>=2024.0``, ``onnxruntime>=1.20,<1.30``: every release
in it). Releases are listed from the package index's JSON simple API (PEP 691/700), keeping only
those with a wheel this interpreter can install or an sdist alone (TensorRT's packages), and with
their upload time (the date the
companion packages of a cell are resolved at, see ``envs``). Owns no environment and runs nothing.
"""

from __future__ import annotations

import os
import re
import urllib.error
import urllib.request
from dataclasses import dataclass

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.tags import sys_tags
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from reprokit.errors import EngineUnavailable, UsageError
from reprokit.files import MAX_JSON_BYTES, parse_json

# The engine each package drives, as repro.py names it, and what else repro.py imports there.
PACKAGE_ENGINES = {
    "onnxruntime": "ort", "onnxruntime-gpu": "ort", "openvino": "openvino",
    "tensorrt": "trt", "tensorrt-cu11": "trt", "tensorrt-cu12": "trt", "tensorrt-cu13": "trt",
}
COMPANIONS = {"ort": ["numpy", "onnx", "ml-dtypes"], "openvino": ["numpy", "onnx", "ml-dtypes"],
              "trt": ["numpy", "onnx", "ml-dtypes", "polygraphy"]}
DEFAULT_INDEX = "https://pypi.org/simple"


@dataclass(frozen=True)
class Release:
    version: str
    uploaded: str | None  # ISO time of the release's first file on the index


@dataclass(frozen=True)
class VersionSpec:
    """A parsed ``--versions``: ``pins`` (exact, wildcard or 'latest') or a ``range``."""

    package: str
    pins: tuple[str, ...] = ()
    range: str | None = None

    @property
    def engine(self) -> str:
        return PACKAGE_ENGINES[self.package]

    def __str__(self) -> str:
        return self.package + ("==" + ",".join(self.pins) if self.pins else (self.range or ""))


def parse_versions(text: str) -> VersionSpec:
    """``onnxruntime==1.18.1,1.20.1,latest`` | ``openvino>=2024.0`` | ``onnxruntime`` (all)."""
    match = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*?)\s*", text or "")
    example = "e.g. --versions 'onnxruntime==1.28.0,1.29.0,latest' or --versions 'openvino>=2024.0'"
    if not match:
        raise UsageError(f"cannot parse --versions {text!r}", hint=example)
    package, rest = canonicalize_name(match.group(1)), match.group(2)
    if package not in PACKAGE_ENGINES:
        raise UsageError(f"--versions names {package!r}, which is not an engine package reprokit knows",
                         hint="one of " + ", ".join(sorted(PACKAGE_ENGINES)))
    if rest.startswith("==") and not rest.startswith("==="):
        pins = tuple(p.strip() for p in rest[2:].split(",") if p.strip())
        for pin in pins:
            if pin != "latest" and not _is_pin(pin):
                raise UsageError(f"--versions: {pin!r} is not a version", hint=example)
        if not pins:
            raise UsageError(f"--versions {text!r} names no version", hint=example)
        return VersionSpec(package, pins=pins)
    try:
        SpecifierSet(rest)
    except InvalidSpecifier as exc:
        raise UsageError(f"--versions: {rest!r} is not a version range ({exc})", hint=example) from exc
    return VersionSpec(package, range=rest)


def _is_pin(pin: str) -> bool:
    """A PEP 440 version, or one ending in ``.*`` (``1.2x`` is neither: a usage error here, not a
    crash when the releases are compared)."""
    if not re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*(\.\*)?", pin):
        return False
    try:
        SpecifierSet("==" + pin)
    except InvalidSpecifier:
        return False
    return True


def index_url() -> str:
    """The index uv installs from (UV_INDEX_URL / UV_DEFAULT_INDEX / PIP_INDEX_URL), so the
    listed releases are the installable ones."""
    for name in ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL"):
        if os.environ.get(name):
            return os.environ[name].rstrip("/")
    return DEFAULT_INDEX


def list_releases(package: str, *, timeout: float = 60.0) -> list[Release]:
    """Final releases of ``package`` with a wheel this interpreter can install (or an sdist alone),
    oldest first, each with the upload time of its newest such file."""
    url = f"{index_url()}/{canonicalize_name(package)}/"
    request = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read(MAX_JSON_BYTES + 1)  # an index page is MBs: never read past the bound
            if len(raw) > MAX_JSON_BYTES:
                raise ValueError(f"the page is larger than {MAX_JSON_BYTES >> 20} MiB")
            data = parse_json(raw, what="the page")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise EngineUnavailable(f"cannot list the releases of {package} from {url}: {exc}",
                                hint="check the network or set UV_INDEX_URL; or name exact versions "
                                     "(--versions 'PKG==1.2.3,1.2.4'), which need no listing") from exc
    return releases_from(data)


def releases_from(data: dict) -> list[Release]:
    """The releases of one PEP 691 project page (see ``list_releases``)."""
    tags = set(sys_tags())
    found: dict[Version, str | None] = {}
    sdists: dict[Version, str | None] = {}
    wheels: set[Version] = set()
    for item in data.get("files", []):
        if item.get("yanked"):
            continue
        name = item["filename"]
        try:
            if name.endswith(".whl"):
                _, version, _, wheel_tags = parse_wheel_filename(name)
                wheels.add(version)
                fits = bool(wheel_tags & tags)
            else:
                _, version = parse_sdist_filename(name)
                fits = False
        except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
            continue
        if version.is_prerelease or version.is_devrelease:
            continue
        uploaded = item.get("upload-time")
        chosen = found if fits else sdists if not name.endswith(".whl") else None
        if chosen is not None:
            chosen[version] = max(filter(None, (chosen.get(version), uploaded)), default=None)
    # A release published as an sdist alone (tensorrt-cu12 fetches its libraries from NVIDIA's
    # index at install time) is installable too; one whose wheels all fit other machines is not.
    found.update({v: t for v, t in sdists.items() if v not in wheels and v not in found})
    return [Release(str(v), found[v]) for v in sorted(found)]


def choose(spec: VersionSpec, releases: list[Release]) -> list[Release]:
    """The releases ``spec`` names, oldest first; a UsageError for a pin the index lacks."""
    if spec.range is not None:
        wanted = SpecifierSet(spec.range)
        chosen = [r for r in releases if Version(r.version) in wanted]
        if not chosen:
            raise UsageError(f"no release of {spec.package} here matches {spec.range!r}",
                             hint=_known(releases))
        return chosen
    chosen: list[Release] = []
    for pin in spec.pins:
        if pin == "latest":
            match = releases[-1:]
        elif pin.endswith(".*"):
            match = [r for r in releases if Version(r.version) in SpecifierSet("==" + pin)][-1:]
        else:
            match = [r for r in releases if Version(r.version) == Version(pin)]
        if not match:
            raise UsageError(f"{spec.package} {pin} is not on the index as a wheel for this Python",
                             hint=_known(releases))
        if match[0] not in chosen:
            chosen.append(match[0])
    return sorted(chosen, key=lambda r: Version(r.version))


def _known(releases: list[Release]) -> str:
    if not releases:
        return "the index lists no installable release for this Python"
    return "releases here: " + ", ".join(r.version for r in releases[-12:]) + (" …" if len(releases) > 12 else "")
