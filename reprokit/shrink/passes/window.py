"""window: bisect the end and then the start of the graph, on the unmarked graph.

Like polygraphy's bisect mode — the earliest end (in topological order) whose prefix still shows
the signature, then the latest start — but on our subset semantics: cut tensors are fed with the
captured reference activations and everything downstream of the end is dropped. About
2·log2(N) calls, or log2(N) + 1 when the node at the end fails alone. With jobs > 1 the "yes" branch of the next step is evaluated speculatively.
"""

from __future__ import annotations


def run(reducer) -> None:
    order = reducer.ordered()
    if len(order) <= 2:
        return
    # Earliest end: smallest e with order[:e] interesting; e == len(order) is known to be.
    lo, hi = 1, len(order)
    while lo < hi:
        mid = (lo + hi) // 2
        reducer.prefetch([order[:mid], order[: (lo + mid) // 2]])
        if reducer.test(order[:mid]):
            hi = mid
        else:
            lo = mid + 1
    if hi < len(order):
        reducer.accept(order[:hi], "earliest end that still diverges")
    # The node at the earliest end is the prime suspect (a build error or crash in one op):
    # one call on it alone often saves the whole start bisection.
    last = reducer.ordered()[-1]
    if len(reducer.best) > 1 and reducer.test([last]):
        reducer.accept([last], "the node at the earliest end alone")
        return
    order = reducer.ordered()
    # Latest start: largest s with order[s:] interesting; s == 0 is known to be.
    lo, hi = 0, len(order) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        reducer.prefetch([order[mid:], order[(mid + hi + 1) // 2 :]])
        if reducer.test(order[mid:]):
            lo = mid
        else:
            hi = mid - 1
    if lo > 0:
        reducer.accept(order[lo:], "latest start that still diverges")
