"""The smallest prefix of a ranking that agrees, for the tested precision workaround
(``precision.py``): ``sets[k - 1]`` is prefix k's node set and ``search`` a
:class:`reprokit.shrink.precision.Search` that judges sets (``judge``: several in one packed
call; ``alone``: one call of the printed setting). Packed (``packed_prefix``: many sizes per
call) or by bisection (``bisect_prefix``: one size per call), each to within ``close_enough``.

Must not make a call of its own or build a model: every judgement goes through ``search``.
"""

from __future__ import annotations

__all__ = ["bisect_prefix", "close_enough", "packed_prefix"]


def close_enough(sets: list[list[str]], bad: int, good: int, slack: int = 10) -> bool:
    """Is the agreeing prefix ``good`` the answer, with prefix ``bad`` (0: none) known to fail?
    Exact when they are neighbours; else when the failing set holds all but a ``1/slack`` share
    (a tenth) of the agreeing one's nodes: a call (an engine build) more would spare at most that
    share, and the answer says the bracket (``Workaround.prefix_fails``). PP-OCRv4 det under
    emulate:bf16: 291 nodes offered where 288 was the fewest, for 2 calls fewer."""
    if good - bad <= 1:
        return True
    agreeing = len(sets[good - 1])
    return agreeing - (len(sets[bad - 1]) if bad else 0) <= agreeing // slack


def packed_prefix(search, sets: list[list[str]]) -> int | None:
    """Smallest agreeing prefix size (``sets[k - 1]`` is prefix k's set), to within
    :func:`close_enough`: the first call holds 1, 2, 4, 8 (a few nodes often do) and sizes evenly
    spaced up to all of them; each next call evenly spaced sizes inside the bracket, until it is
    close enough (two calls up to width² nodes)."""
    n = len(sets)
    # at least one evenly spaced size, and that is n: "no prefix agrees" is said only of a ranking
    # judged whole (a call of 3 copies, rapid-layout under emulate:fp16, left it untried)
    even = max(1, search.width - 4)
    sizes = sorted(
        {s for s in (1, 2, 4, 8) if s < n}
        | {max(1, round(n * k / even)) for k in range(1, even + 1)}
    )
    bad, good = 0, None
    while True:
        trials = search.judge([sets[s - 1] for s in sizes])
        for size, trial in zip(sizes, trials):
            if trial.agrees:
                good = size
                break
            bad = max(bad, size)
        if good is None:
            return None  # all of them was in the first call
        if close_enough(sets, bad, good):
            search.fails_at = bad
            return good
        sizes = _between(bad, good, search.width)


def _between(bad: int, good: int, width: int) -> list[int]:
    """Up to ``width`` sizes strictly between ``bad`` and ``good``, evenly spaced."""
    inner = list(range(bad + 1, good))
    if len(inner) <= width:
        return inner
    step = len(inner) / width
    return sorted({inner[int(i * step)] for i in range(width)})


def bisect_prefix(
    search, sets: list[list[str]], calls: int | None = None, slack: int = 10
) -> int | None:
    """Smallest agreeing prefix size by bisection, one call per size: all of the ranking first,
    then the largest prefix that would be close enough beside it (an accumulated error needs most
    of its ranking: PP-OCRv4 det under emulate:bf16 needs 288 of 330 nodes, and there two whole
    models answer where bisection from the middle builds six), then bisection. ``calls``: the
    search stops there at the bracket it has (an agreeing prefix, run as printed, is an answer)."""
    n = len(sets)
    start = search.calls
    if not search.alone(sets[-1])[1].agrees:
        return None
    bad, good = 0, n
    near = next((m for m in range(1, n) if close_enough(sets, m, n, slack)), None)
    first = near is not None and near > n // 2  # where it is the middle or below, plain bisection
    while not close_enough(sets, bad, good, slack) and (
        calls is None or search.calls - start < calls
    ):
        mid = near if first else (bad + good) // 2
        first = False
        if not search.alone(sets[mid - 1])[1].agrees:
            bad = mid
        else:
            good = mid
    search.fails_at = bad
    return good
