"""Sizes for the dynamic dims of a model input that ``--input-shapes`` does not give, and the
words that say which were chosen.

A size of 1 everywhere is the one that most often fails: a detector's feature maps shrink to
1×1 and its upsampled and downsampled branches no longer line up ("Shape mismatch attempting to
re-use buffer"). So a dim gets a size by what it is: the model's metadata first (a key named
like the dim, Ultralytics' ``imgsz``/``stride``), else its name (batch → 1, height/width → 224,
a multiple of 32; sequence/tokens → 16, past → 16, total → past + sequence), else its place (the
two last dims of an NCHW image input are height and width), else 1.

Every outcome says the chosen sizes: a note when the run goes on, and the ``Error:``/``Hint:``
of a failure after they were chosen (:func:`say_in_error`, called by the CLI) names them with
the ``--input-shapes NAME:DIMS`` to edit. Runs no engine; knows nothing of click.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from reprokit.errors import ExitCode

BATCH, SPATIAL, SEQUENCE, OTHER = 1, 224, 16, 1
_IMAGE_SIZE_KEYS = ("imgsz", "img_size", "image_size", "imagesize", "input_size", "imgsize")


@dataclass(frozen=True)
class Guess:
    """The sizes chosen for one input: ``declared`` as the model says it (names for dynamic
    dims), ``dims`` as fed, ``why`` in words."""

    input: str
    declared: tuple
    dims: tuple[int, ...]
    why: str

    @property
    def arg(self) -> str:
        return f"{self.input}:{'x'.join(map(str, self.dims))}"

    @property
    def declared_text(self) -> str:
        # quoted names, as Python writes a list: rich markup takes "[batch, 3]" for a tag
        return "[" + ", ".join(str(d) if isinstance(d, int) and d > 0 else repr(d or "?")
                               for d in self.declared) + "]"

    def note(self) -> str:
        return (f"input {self.input!r} has dynamic dims {self.declared_text}; reprokit chose "
                f"{'x'.join(map(str, self.dims))} ({self.why}); give the sizes your model takes with "
                f"--input-shapes {shlex.quote(self.arg)}")


# The guesses of this process's last prepared model: the CLI names them in any error that follows.
_CHOSEN: list[Guess] = []
_GIVEN: dict = {}  # the --input-shapes of that model and its metadata's stride


def forget() -> None:
    _CHOSEN.clear()
    _GIVEN.clear()


def given(shapes: dict, hints: dict[str, str] | None = None) -> None:
    """The sizes ``--input-shapes`` gave (and the model's metadata): a reference that fails on
    them is told they may be the cause (:func:`say_in_error`)."""
    _GIVEN.clear()
    _GIVEN.update(shapes=dict(shapes), stride=_int((hints or {}).get("stride")))


def chosen() -> list[Guess]:
    return list(_CHOSEN)


def metadata_hints(model) -> dict[str, str]:
    """The model's metadata_props, keys lower-cased (where sizes may be written down)."""
    return {p.key.lower(): p.value for p in getattr(model, "metadata_props", [])}


def choose(name: str, shape: tuple, hints: dict[str, str] | None = None) -> Guess:
    """Sizes for every dynamic dim of input ``name`` (static dims are kept)."""
    hints = hints or {}
    image = _image_size(hints)
    stride = _int(hints.get("stride"))
    # one name, one size (ONNX's meaning of a dim_param), across the model's inputs too
    named = {d: size for g in _CHOSEN if g.input != name for d, size in zip(g.declared, g.dims)
             if isinstance(d, str) and d}
    dims, chosen_dims, sources = [], [], []
    for index, dim in enumerate(shape):
        if isinstance(dim, int) and dim > 0:
            dims.append(dim)
            continue
        if isinstance(dim, str) and dim in named:
            size, source = named[dim], "same"
        else:
            size, source = _size(dim, index, shape, hints, image, stride)
        if isinstance(dim, str) and dim:
            named.setdefault(dim, size)
        dims.append(size)
        chosen_dims.append(f"{dim if isinstance(dim, str) and dim else f'dim {index}'}={size}")
        if source not in sources:
            sources.append(source)
    keys = [s.split(":", 1)[1] for s in sources if s.startswith("metadata:")]
    words = ([f"from the model's metadata ({', '.join(keys)})"] if keys else []) + [
        {"name": "by the dims' names", "place": "image sides by their place in an NCHW input",
         "same": "a name used before keeps its size", "default": "1 where nothing says more"}[s]
        for s in sources if not s.startswith("metadata:")]
    guess = Guess(name, tuple(shape), tuple(dims), f"{', '.join(chosen_dims)}: {'; '.join(words)}")
    _CHOSEN[:] = [g for g in _CHOSEN if g.input != name] + [guess]
    return guess


def _size(dim, index: int, shape: tuple, hints: dict, image, stride) -> tuple[int, str]:
    """A size and where it came from: ``metadata:KEY``, ``name``, ``place`` or ``default``."""
    text = dim if isinstance(dim, str) else ""
    exact = _int(hints.get(text.lower())) if text else None
    if exact and exact > 0:
        return exact, f"metadata:{text.lower()}"
    kind = _kind(text)
    source = "name"
    if kind is None:
        kind, source = _place(index, shape), "place"
    if kind in ("height", "width"):
        if image:
            return (image[0] if kind == "height" else image[1]), f"metadata:{image[2]}"
        return (SPATIAL if not stride or SPATIAL % stride == 0 else -(-SPATIAL // stride) * stride), source
    sizes = {"batch": BATCH, "sequence": SEQUENCE, "past": SEQUENCE, "total": 2 * SEQUENCE}
    return (sizes[kind], "name") if kind in sizes else (OTHER, "default")


def _kind(text: str) -> str | None:
    """What a dim's name says it is."""
    if not text:
        return None
    words = [w for w in re.split(r"[^a-z0-9]+", re.sub(r"([a-z])([A-Z])", r"\1_\2", text).lower()) if w]
    has = set(words).__contains__
    if any(has(w) for w in ("batch", "batchsize", "bs", "n", "b", "nbatch")):
        return "batch"
    if any(has(w) for w in ("height", "h", "rows", "ih", "imgh")):
        return "height"
    if any(has(w) for w in ("width", "w", "cols", "iw", "imgw")):
        return "width"
    sequence = any(has(w) for w in ("seq", "sequence", "seqlen", "len", "length", "tokens", "token",
                                    "time", "frames", "steps", "t"))
    if has("total") and sequence:
        return "total"
    if has("past") and sequence:
        return "past"
    return "sequence" if sequence else None


def _place(index: int, shape: tuple) -> str | None:
    """An NCHW image input (1, 3 or 4 channels, known) whose height and width are unnamed."""
    if len(shape) == 4 and shape[1] in (1, 3, 4) and index in (2, 3):
        return "height" if index == 2 else "width"
    return None


def _image_size(hints: dict) -> tuple[int, int, str] | None:
    for key in _IMAGE_SIZE_KEYS:
        numbers = [int(n) for n in re.findall(r"\d+", hints.get(key, ""))]
        if numbers and all(0 < n <= 16384 for n in numbers[:2]):
            return numbers[0], numbers[1] if len(numbers) > 1 else numbers[0], key
    return None


def _int(text) -> int | None:
    return int(text) if isinstance(text, str) and text.strip().isdigit() else None


def say_in_error(exc) -> None:
    """A ReprokitError raised after sizes were chosen names them: the error line says which,
    and the hint puts the ``--input-shapes`` to edit first (before the hint it had) when the
    reference failed (exit 5), where wrong sizes are the likeliest cause, after it otherwise."""
    guesses = chosen()
    if not guesses and _GIVEN.get("shapes") and exc.exit_code is ExitCode.REFERENCE:
        _say_given_shapes(exc)
        return
    if not guesses or exc.exit_code in (ExitCode.USAGE, ExitCode.INTERRUPTED) or "reprokit chose" in exc.message:
        return
    names = "; ".join(f"{g.input} {'x'.join(map(str, g.dims))} for {g.declared_text}" for g in guesses)
    # one quoted argument: several NAME:DIMS unquoted would be read as more MODELs
    args = shlex.quote(" ".join(g.arg for g in guesses))
    lines = exc.message.split("\n", 1)
    lines[0] += f" [with the dynamic dims reprokit chose: {names}]"
    exc.message = "\n".join(lines)
    edit = f"give the sizes your model takes: --input-shapes {args} (edit the numbers)"
    if exc.exit_code is ExitCode.REFERENCE:
        exc.hint = f"the chosen sizes may not fit the model; {edit}" + (f"; otherwise: {exc.hint}" if exc.hint else "")
    else:
        exc.hint = (f"{exc.hint}; " if exc.hint else "") + f"dynamic dims were chosen by reprokit: {edit}"


def _say_given_shapes(exc) -> None:
    """The reference fails on the sizes the user gave (nudenet 320n at 1x3x33x33: "Can't merge
    shape info … Inferred=3 Declared=4", no word of the shapes): the hint says they may not fit."""
    args = shlex.quote(" ".join(f"{name}:{'x'.join(map(str, dims))}" for name, dims in _GIVEN["shapes"].items()))
    stride = _GIVEN.get("stride")
    why = f"the model's metadata says stride {stride}: image sizes a multiple of it" if stride else \
        "a size its strides, reshapes or concatenations cannot take"
    exc.hint = f"the sizes you gave (--input-shapes {args}) may not fit the model ({why}); " + \
        (f"otherwise: {exc.hint}" if exc.hint else "")
