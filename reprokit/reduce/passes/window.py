"""window: bisect the end and then the start of the graph, on the unmarked graph.

Like polygraphy's bisect mode — the earliest end (in topological order) whose prefix still shows
the signature, then the latest start — but on our subset semantics: cut tensors are fed with the
captured reference activations and everything downstream of the end is dropped. About
2·log2(N) calls. With jobs > 1 the "yes" branch of the next step is evaluated speculatively.
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
