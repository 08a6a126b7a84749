"""The memory bound of an engine worker: how much one engine process may allocate, where the
number comes from, how the worker applies it to itself, and how a failure at the bound is told
from any other engine failure. Runs no engine and imports only the standard library (``verify --versions``'s cells use it on Ray
workers); the worker (``engine/worker.py``) calls it.

Why a bound: ``verify`` runs models from people nobody knows. An Expand, ConstantOfShape, Tile or
Resize to a huge shape, or a Loop that doubles a tensor, makes an engine allocate until the
machine swaps or the kernel's OOM killer takes some other process. The bound is the kernel's:
``RLIMIT_DATA``, which on Linux >= 4.7 counts every private writable mapping (the heap and the
anonymous mmaps large allocations use; thread stacks too, allowed for apart: ``stack_allowance``),
so an engine's allocation past it fails inside the
engine, which says so (onnxruntime: "Failed to allocate memory", OpenVINO: "Failed to allocate N
bytes", numpy: MemoryError). ``RLIMIT_AS`` is not used: it counts address space only reserved
(CUDA reserves terabytes, thread pools reserve arenas), so it refuses engines that would run. The
worker also asks the OOM killer to take it first (``oom_score_adj`` 1000): were the machine short
before the bound is reached, the engine process goes, not a process of the user's.

GPU engines (``trt``, ``ort:cuda``) are bounded too, on their host memory (what their drivers map
as private writable memory counts; the GPU's own memory does not), never below ``GPU_FLOOR``:
measured on an H200 (bench/results/gpu_memory_bound.md), their footprint is 0.85-1.7 GiB, and
under a bound of 512 MiB their driver hung instead of failing. A check command (``cmd:``) is the
user's own process: not bounded; nor are ``verify --versions``'s GPU cells (matrix/run.py: not measured).
"""

from __future__ import annotations

import os
import re

from reprokit.errors import EngineOutOfMemory, UsageError

ENV = "REPROKIT_MEMORY_BOUND"  # SIZE (e.g. 8G), "auto" (the default) or "off"
OFF = ("off", "none", "0")

# What each engine says when an allocation fails (measured under RLIMIT_DATA): onnxruntime's
# arena, OpenVINO's allocator, numpy's "Unable to allocate", Python's MemoryError, C++'s
# std::bad_alloc (an abort's last words), glibc's ENOMEM text; the dynamic loader's "failed to
# map segment" (an engine's shared library refused at a bound of a few MiB: an ImportError) and
# EAGAIN from a thread whose stack was refused (OpenVINO's compile at 120 MiB: "Resource
# temporarily unavailable", which was judged a build-error, a verdict; at 130 MiB "can't alloc").
# EAGAIN is also a limit on threads and processes: callers ask engine/threadlimit.py first.
_OUT_OF_MEMORY = re.compile(
    r"Failed to allocate|Unable to allocate|MemoryError|bad_alloc|Cannot allocate memory|"
    r"out of memory|failed to map segment|Resource temporarily unavailable|can't alloc",
    re.IGNORECASE,
)
# The engines' own footprint before any model (measured on the attention sample: the emulator
# needs 110 MiB, OpenVINO 160 MiB on 2 cores); a bound below it fails in the engine, not the model.
ENGINE_FLOOR = 160 << 20
# A GPU engine's own host memory before any model (measured on the H200, bench/results/
# gpu_memory_bound.md: the CUDA provider's session 1.1 GiB of VmData, 1.4-1.7 GiB after a sample's
# run, which failed under a 1 GiB bound; TensorRT-RTX's build 0.85 GiB; under 512 MiB both hung in
# the driver, never answering): a smaller bound is raised to it for them, never a hang.
GPU_FLOOR = 2 << 30
# The largest bound kept (4 EiB): setrlimit takes below 2**63, and the thread stacks are added on top.
_LARGEST = 1 << 62


def half_the_memory() -> int:
    """Half this machine's physical memory (the bound's default, and the feeds' bound:
    ``engine.inputs.memory_bound``)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (
        ValueError,
        OSError,
        AttributeError,
    ):  # no sysconf (Windows): no bound reprokit can read
        return 1 << 62


def parse_size(text: str, option: str) -> int:
    """'500M', '20G', '1.5G', '4096' (bytes) → bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)i?[bB]?\s*", text or "")
    if not match:
        raise UsageError(
            f"cannot parse {option} {text!r}", hint=f"e.g. {option} 20G or {option} 500M"
        )
    scale = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}[match.group(2).lower()]
    return int(float(match.group(1)) * scale)


def size_words(nbytes: float) -> str:
    if nbytes < 2**20:  # a bound of 1B said as "9.54e-07 MiB"
        return (
            f"{nbytes / 2**10:.3g} KiB"
            if nbytes >= 2**10
            else f"{int(nbytes)} byte{'' if int(nbytes) == 1 else 's'}"
        )
    return f"{nbytes / 2**30:.3g} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.3g} MiB"


def parse_bound(text: str, source: str = f"{ENV}") -> int | None:
    """Bytes one engine process may allocate, from ``text`` (SIZE, "auto", "off"); None: no bound."""
    word = (text or "").strip().lower()
    if word in ("", "auto"):
        return default_bound()
    if word in OFF:
        return None
    example = f"{source}=16G" if source == ENV else f"{source} 16G"  # as a shell takes each
    hint = f"a size (e.g. {example}), auto (half this machine's memory) or off"
    try:  # 99999999T: setrlimit refused it in the worker (exit 5), hence the cap
        size = min(parse_size(text, source), _LARGEST)
    except UsageError:
        raise UsageError(f"cannot parse {source} {text!r}", hint=hint) from None
    if size < 1:  # 0.5 or 0M: a bound of 0 bytes, which the worker took for none (unbounded)
        raise UsageError(f"{source} {text!r} is a bound of 0 bytes", hint=f"{hint} (off: no bound)")
    return size


def default_bound() -> int:
    """Half this machine's physical memory: the same line the feeds are held to
    (``engine.inputs.memory_bound``). Measured (bench/results/memory_bound.md): a Swin-T shrink
    peaks at 1.3 GiB and needs a 2 GiB bound; the 2.9 GiB-weights bench model peaks at 3.4 GiB."""
    return half_the_memory()


def configured() -> int | None:
    """The bound now in force: ``REPROKIT_MEMORY_BOUND`` (set by ``--memory-bound``), else the default."""
    return parse_bound(os.environ.get(ENV, ""))


def bound_for(spec, bound: int | None) -> int | None:
    """The bound of an engine worker for ``spec`` (a TargetSpec) when ``bound`` is in force: every
    engine's worker is bounded (a check command is the user's own process: never), a GPU engine's
    (``trt``, ``ort:cuda``) at least ``GPU_FLOOR``, which its driver needs before any model."""
    if not bound or spec.engine not in ("ort", "emulate", "openvino", "trt"):
        return None
    return max(bound, GPU_FLOOR) if on_gpu(spec) else bound


def on_gpu(spec) -> bool:
    """Does a parsed target run on the GPU (``trt``, ``ort:cuda``)?"""
    return spec.engine == "trt" or spec.has("cuda")


def stack_allowance() -> int:
    """What the bound leaves for thread stacks on top of the model's data: RLIMIT_DATA counts each
    thread's stack whole (8 MiB by default, mostly never touched), and engines start a thread per
    core (onnxruntime's pool; OpenVINO's streams besides): two per core, so that a many-core
    machine does not charge 1 GiB of stacks to the model."""
    import resource

    stack = resource.getrlimit(resource.RLIMIT_STACK)[0]  # glibc sizes a thread's stack from it
    stack = 2 << 20 if stack == resource.RLIM_INFINITY else min(stack, 64 << 20)
    return 2 * (os.cpu_count() or 1) * stack


def inherited_limit() -> int | None:
    """The data limit this process was started under (soft or hard, the lower; a ulimit -d, an
    outer guard), which no bound of reprokit's raises; None: unlimited."""
    import resource

    finite = [
        lim for lim in resource.getrlimit(resource.RLIMIT_DATA) if lim != resource.RLIM_INFINITY
    ]
    return min(finite) if finite else None


def apply(limit: int) -> int:
    """In the worker, before the engine loads: at most ``limit`` bytes of data (plus the thread
    stacks' ``stack_allowance``), and the OOM killer's first choice. A limit the process was
    started under that is lower already (soft or hard: an outer guard, a ulimit) is kept, never
    raised. Returns the bound in force: ``limit``, or the lower one inherited."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
    inherited = inherited_limit()
    wanted = limit + stack_allowance()
    if inherited is not None:
        wanted, limit = min(wanted, inherited), min(limit, inherited)
    resource.setrlimit(resource.RLIMIT_DATA, (wanted, hard))
    try:
        with open("/proc/self/oom_score_adj", "w") as handle:
            handle.write("1000")
    except OSError:  # not Linux, or a sandbox that forbids it: the bound still holds
        pass
    return limit


_REQUESTED = re.compile(
    r"(?:buffer of size|allocate) (\d+(?:\.\d+)?) ?(bytes|KiB|MiB|GiB|TiB|PiB|EiB)?", re.IGNORECASE
)
_UNITS = {
    "": 1,
    "bytes": 1,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "pib": 2**50,
    "eib": 2**60,
}


def ran_out(*texts: str) -> bool:
    """Do an engine's words (its error message, its log tail) say that an allocation failed where
    the bound decided it? One larger than this machine's whole memory would fail unbounded too:
    that failure is the engine's own (its verdict stands)."""
    text = "\n".join(t or "" for t in texts)
    if not _OUT_OF_MEMORY.search(text):
        return False
    asked = [float(n) * _UNITS[(unit or "").lower()] for n, unit in _REQUESTED.findall(text)]
    return not asked or max(asked) <= 2 * half_the_memory()


def ran_out_words(limit: int, words: str, *, inherited: bool = False, configured: int | None = None,
                  gpu: bool = False) -> str:
    """'ran out of its memory bound of N (the engine's sentence)': what a worker's result and a
    --versions cell say of a run the bound stopped (``words``: the engine's output). An
    ``inherited`` limit (lower than the ``configured`` bound, or with none) is named as such. A
    ``gpu`` engine's words may be the GPU's own out-of-memory (onnxruntime's CUDA arena says
    "Failed to allocate" as its CPU one does): both are named, since reprokit cannot tell them
    apart from the words (bench/results/gpu_memory_bound.md)."""
    said = failed_words(words)
    held = f"ran out of its memory bound of {size_words(limit)}"
    if gpu:
        held = f"ran out of memory: its host memory bound of {size_words(limit)}, or the GPU's own memory"
    if inherited:
        held = (f"ran out of the data limit it was started under, {size_words(limit)} (ulimit -d, a container's: "
                + ("no --memory-bound" if configured is None else f"lower than --memory-bound's {size_words(configured)}")
                + ", which never raises it)")
    return held + (f" ({said})" if said else "")


def failed_words(text: str) -> str:
    """The engine's sentence that says which allocation failed (its message is mostly a stack)."""
    found = _OUT_OF_MEMORY.search(text or "")
    return (
        " ".join(text[found.start() : found.start() + 160].splitlines()[0].split()) if found else ""
    )


def out_of_memory(role: str, spec: str, message: str, limit: int) -> EngineOutOfMemory:
    """The error of a call whose engine ran out of its bound (``message``: the worker's words),
    with a bound to try: twice ``limit``, in whole GiB."""
    spec = (
        spec if len(spec) <= 80 else spec[:77] + "…"
    )  # fp32-nodes= of a workaround lists hundreds of nodes
    raise_it = f"--memory-bound {max(1, -(-2 * limit // 2**30))}G"
    inherited = inherited_limit()  # the workers' too: they inherit it from this process
    if (
        inherited is not None and inherited <= limit
    ):  # --memory-bound 4G under ulimit -d 800000: 781 MiB held
        hint = (
            f"the limit that held is the data limit reprokit was started under ({size_words(inherited)}: "
            "ulimit -d, or a container's), which reprokit keeps whatever --memory-bound says; only if you "
            "trust the model and the machine has the memory, raise it where reprokit is started (ulimit -d)"
        )
    elif limit < ENGINE_FLOOR:  # the engine may not have fitted itself: the model may be innocent
        hint = (
            f"a bound of {size_words(limit)} leaves the engine hardly any room: onnxruntime and OpenVINO take "
            f"110-160 MiB before any model, so the model may ask for little; try {raise_it}"
        )
    else:
        hint = (
            "the model asks for more memory than reprokit lets one engine process take (half this machine's "
            "memory unless --memory-bound or REPROKIT_MEMORY_BOUND says otherwise); only if you trust the "
            f"model and the machine has the memory, raise it: {raise_it}"
        )
    return EngineOutOfMemory(f"the {role} ({spec}) engine {message}; no verdict", hint=hint)
