"""The conflict search's halving beside a weighted-question search inside the failing half (issue 39:
pass/fail est. TensorRT build): a side-by-side table over simulated placements, not a test.

    python bench/conflict_alternatives.py            # ~20 s on a shared 2-core machine
    python bench/conflict_alternatives.py --samples 40

The check is a pure predicate here ("fails while the needed nodes are all in the set": monotone,
as the benchmark's fusion and pair checks are) over a chain of ``--nodes`` nodes in topological
order, each node's producer the one before it; every distinct question counts one call and its
size in nodes built, and the result's two singles are asked when no passing question held them
(what ddmin's 1-minimality sweep would ask). Estimated TensorRT build seconds: 0.0135 s a call +
3.07 ms a node (reprokit/shrink/buildcost.py).

The alternative (``weighted``): the halving's first two questions as today (neither half failing
still goes to conflict._straddle), then, inside the half that fails, every single and pair is a
hypothesis with a weight (``NEAR`` for a single and for a producer→consumer pair, 1 for any other
pair); a question fails exactly when it holds the answer, so its chance of failing is the weight
it holds; each question is the union of one or two runs of the nodes still in some hypothesis with
the least (``CALL`` + nodes) per bit it tells; after ``bits + SPARE`` questions, or when the answers
fit no single or pair, conflict.search bisects the smallest set seen failing.

What it showed (issue 39, hpair; bench/results/conflict_alternatives.md, 15 placements a case): inside
the half, at CALL=30 / 60, a fusion 10% / 4% less estimated build time and 1.7 / 1.5 calls fewer,
a single 12% / 9% less and 1.7 / 1.3 calls fewer, a pair inside the half 1% / 4% less but 0.7 /
0.3 calls more on average (18 / 17 at most, 17 today); the benchmark's rows at CALL=30: MobileNetV2's
Conv→Clip 10 calls and 241 nodes (12 and 306 today), the 144-node CNN's 11 and 241 (12 and 236),
the two distant-pair rows unchanged (across the halves), about 0.25 s of the 16.4 s in all. Over
150 random placements in 128–300-node chains with no graph (tests/test_reducer.py's property
test) the bounds that test asserts — a pair in 2⌈log2 n⌉ + 2 calls, k nodes in QuickXplain's
2k⌈log2(n/k)⌉ + 2k — fail on some: a pair by up to 7 calls at CALL=30 (the questions run out and
the bisection starts over) and 1 at CALL=60, three nodes by 2 at either. The halving stays.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from reprokit.shrink.buildcost import TENSORRT  # noqa: E402
from reprokit.shrink.passes import conflict  # noqa: E402

NEAR = 10.0
SPARE = 4
GRID = 40


def weighted(fails, order: list[int], producers, call: float) -> frozenset | None:
    """The single or pair of ``order`` (known to fail) by weighted questions; None when the answers
    fit none or the questions run out."""
    nodes = list(order)
    n = len(nodes)
    weight = np.triu(np.ones((n, n)), k=1)
    np.fill_diagonal(weight, NEAR)
    position = {node: i for i, node in enumerate(nodes)}
    for j, node in enumerate(nodes):
        for producer in producers(node):
            if position.get(producer, n) < j:
                weight[position[producer], j] = NEAR
    failed: set[frozenset] = set()
    questions = math.ceil(math.log2(weight.sum())) + SPARE
    while True:
        live = np.nonzero(weight.sum(axis=0) + weight.sum(axis=1))[0]
        if len(live) == 0:
            return None
        if len(live) < len(nodes):
            nodes = [nodes[i] for i in live]
            weight = weight[np.ix_(live, live)]
        hypotheses = np.argwhere(weight > 0)
        if len(hypotheses) == 1:
            found = frozenset(nodes[i] for i in hypotheses[0])
            return found if found in failed or fails(found) else None
        inside = _question(weight, call) if questions > 0 else None
        questions -= 1
        if inside is None:
            return None
        asked = frozenset(nodes[i] for i in np.nonzero(inside)[0])
        held = np.outer(inside, inside)
        if fails(asked):
            weight, _ = weight * held, failed.add(asked)
        else:
            weight = weight * ~held


def _question(weight: np.ndarray, call: float) -> np.ndarray | None:
    """The union of one or two runs with the least (call + nodes) per bit; a 2-D cumulative table
    gives each run's weight in O(1)."""
    n = len(weight)
    total = weight.sum()
    table = np.zeros((n + 1, n + 1))
    table[1:, 1:] = weight.cumsum(axis=0).cumsum(axis=1)

    def held(a, b, c, d):
        return table[b, d] - table[a, d] - table[b, c] + table[a, c]

    ends = np.unique(np.linspace(0, n, min(n, GRID) + 1).round().astype(int))
    first, second = np.triu_indices(len(ends), k=1)
    start, stop = ends[first], ends[second]
    own = held(start, stop, start, stop)
    s1, e1, s2, e2 = start[:, None], stop[:, None], start[None, :], stop[None, :]
    mass = np.concatenate([own, (own[:, None] + own[None, :] + held(s1, e1, s2, e2)).ravel()])
    cost = np.concatenate([stop - start, ((e1 - s1) + (e2 - s2)).ravel()]).astype(float)
    usable = (
        np.concatenate([np.ones(len(own), bool), (e1 < s2).ravel()]) & (mass > 0) & (mass < total)
    )
    if not usable.any():
        return None
    chance = np.clip(mass / total, 1e-12, 1 - 1e-12)
    bits = -(chance * np.log2(chance) + (1 - chance) * np.log2(1 - chance))
    choice = int(np.argmin(np.where(usable, (call + cost) / bits, np.inf)))
    inside = np.zeros(n, bool)
    if choice < len(own):
        inside[start[choice] : stop[choice]] = True
    else:
        a, b = divmod(choice - len(own), len(own))
        inside[start[a] : stop[a]] = True
        inside[start[b] : stop[b]] = True
    return inside


def halving_then_weighted(test, order: list[int], producers, call: float) -> frozenset | None:
    half = conflict._cut(len(order))
    first, second = order[:half], order[half:]
    if test(frozenset(first)):
        window = first
    elif test(frozenset(second)):
        window = second
    else:
        return conflict._straddle(lambda s: test(frozenset(s)), first, second, producers)
    smallest = [frozenset(window)]

    def noted(nodes) -> bool:
        if not test(frozenset(nodes)):
            return False
        if len(nodes) < len(smallest[0]):
            smallest[0] = frozenset(nodes)
        return True

    found = weighted(noted, window, producers, call)
    if found is None:
        found = conflict.search(test, [i for i in window if i in smallest[0]], producers)
    return found


def cost(n: int, need: frozenset, method) -> tuple[int, int]:
    cache: dict[frozenset, bool] = {}

    def test(nodes) -> bool:
        nodes = frozenset(nodes)
        if nodes not in cache:
            cache[nodes] = need <= nodes
        return cache[nodes]

    found = method(test, list(range(n)), lambda node: {node - 1} if node else set())
    assert found == need, (found, need)
    passed = [s for s, failed in cache.items() if not failed]
    ones = [need - {x} for x in need if len(need) > 1]
    extra = sum(1 for r in ones if r not in cache and not any(r <= s for s in passed))
    return len(cache) + extra, sum(len(s) for s in cache) + extra


def placements(n: int, samples: int, seed: int = 7) -> dict[str, list[frozenset]]:
    rnd = random.Random(seed)
    half = conflict._cut(n)
    pairs = [tuple(sorted(rnd.sample(range(n), 2))) for _ in range(samples * 8)]
    return {
        "fusion": [frozenset({i, i + 1}) for i in rnd.sample(range(n - 1), samples)],
        "single": [frozenset({i}) for i in rnd.sample(range(n), samples)],
        "pair inside a half": [frozenset(p) for p in pairs if (p[0] < half) == (p[1] < half)][
            :samples
        ],
        "pair across the halves": [frozenset(p) for p in pairs if (p[0] < half) != (p[1] < half)][
            :samples
        ],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=150)
    parser.add_argument("--samples", type=int, default=15)
    args = parser.parse_args(argv)
    methods = {"halving (today)": lambda t, o, p: conflict._find(t, o, p, None)}
    for call in (30.0, 60.0):
        methods[f"weighted, CALL={call:.0f}"] = lambda t, o, p, c=call: halving_then_weighted(
            t, o, p, c
        )
    n = args.nodes
    lines = [
        f"| case ({n}-node chain) | method | calls mean | calls max | nodes mean | est. TensorRT s mean |",
        "|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    for case, needs in placements(n, args.samples).items():
        for name, method in methods.items():
            runs = [cost(n, need, method) for need in needs]
            calls = [c for c, _ in runs]
            est = statistics.mean(TENSORRT.seconds(c, b) for c, b in runs)
            lines.append(
                f"| {case} | {name} | {statistics.mean(calls):.2f} | {max(calls)} "
                f"| {statistics.mean(b for _, b in runs):.0f} | {est:.3f} |"
            )
            print(lines[-1], flush=True)
    bound = 2 * math.ceil(math.log2(n)) + 2
    lines += [
        "",
        f"{args.samples} placements a case, seed 7; a pair's bound in tests/test_reducer.py: "
        f"2⌈log2 n⌉ + 2 = {bound} calls (the result's singles included).",
    ]
    print(lines[-1])
    with open(
        os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "results", "conflict_alternatives.md"
        ),
        "w",
    ) as out:
        out.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
