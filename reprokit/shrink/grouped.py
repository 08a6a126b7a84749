"""Group testing for pass/fail checks: the earliest failing candidate by binary splitting over
packs of disjoint candidates (one call per pack, built by ``passfail.group_fails``).

A pack that passes clears every member; a failing one is split in halves, so one failing member
among W costs about log2 W calls. A pack that fails with no member failing alone means the
members interact (their union is judged alone) or that group verdicts cannot be trusted here
(the check reads across members, or is flaky): counted as a contradiction, and the search over
that candidate list stops. Talks to the Reducer only through its public methods; builds nothing.
"""

from __future__ import annotations


def first_failing_group(reducer, candidates: list[frozenset], *, together_fail: bool = False) -> int | None:
    """Earliest interesting candidate by group testing over runs of consecutive, pairwise
    disjoint candidates (overlapping ones are judged one by one). ``together_fail``: all the
    candidates together are known to fail, so the first run needs no call of its own."""
    position = 0
    while position < len(candidates):
        known = reducer.cached(candidates[position])
        if known is not None:
            reducer.count(known)
            if known.interesting:
                return position
            position += 1
            continue
        run, used, nodes = [position], set(candidates[position]), len(candidates[position])
        following = position + 1
        while following < len(candidates):
            cand = candidates[following]
            if cand & used or reducer.cached(cand) is not None or nodes + len(cand) > reducer.pack_nodes:
                break
            run.append(following)
            used |= cand
            nodes += len(cand)
            following += 1
        known = together_fail and len(run) == len(candidates) and position == 0
        seen = reducer.contradictions
        # a failing pack of multi-node candidates (pairs) whose left half passes: its right half
        # is tested, not inferred — a check that reads across members (names in two pairs)
        # fails packs that no member explains, and one call says so
        hit = _split(reducer, candidates, run, known_fail=known, assumed=known or len(candidates[position]) > 1)
        if hit is not None:
            return hit
        if known and len(run) > 1:
            _interaction(reducer, [candidates[i] for i in run])
        if reducer.contradictions > seen:
            # a pack failed that none of its members explains (the check reads across members,
            # or is flaky): group verdicts over these candidates cannot be trusted any further
            return None
        position = following
    return None


def _interaction(reducer, members: list[frozenset]) -> bool:
    """A group failed but none of its members fails alone: they fail together. Their union is a
    candidate of its own (judged alone); kept for the passes after this one when it holds."""
    union = frozenset().union(*members)
    if not reducer.smaller(union) or any(found <= union for found in reducer.interactions):
        return False  # a smaller set inside it already fails together
    if reducer.test(union):
        reducer.interactions.append(union)
        return True
    reducer.contradictions += 1  # failing in a pack, not alone: a packing effect, or a flaky check
    return False


def _split(reducer, candidates, run: list[int], *, known_fail: bool, assumed: bool = False) -> int | None:
    """Binary splitting: the earliest member of ``run`` that fails alone, or None. ``assumed``:
    the run's failure is inferred from the confirmed model, not seen in a pack — its right half
    is then tested rather than inferred (no single may fail alone at all: a fusion, a pair)."""
    if len(run) == 1:
        return run[0] if reducer.test(candidates[run[0]]) else None
    if not known_fail and not reducer.group_fails([candidates[i] for i in run]):
        return None
    half = len(run) // 2
    left, right = run[:half], run[half:]
    left_fails = (reducer.test(candidates[left[0]]) if len(left) == 1
                  else reducer.group_fails([candidates[i] for i in left]))
    if left_fails:
        hit = _split(reducer, candidates, left, known_fail=True)
        if hit is not None:
            return hit
        seen = reducer.contradictions
        if _interaction(reducer, [candidates[i] for i in left]):
            return None  # the left members fail together: a smaller candidate than the rest
        if reducer.contradictions > seen:
            return None  # the group's failure is explained by no member: stop trusting groups here
        return _split(reducer, candidates, right, known_fail=False)
    # Left passed, the whole failed: under "a pack fails when a member fails", right holds it.
    seen = reducer.contradictions
    hit = _split(reducer, candidates, right, known_fail=not assumed)
    if hit is None and assumed and not known_fail:
        reducer.contradictions += 1  # the pack failed, neither half does: no member explains it
    elif hit is None and len(right) > 1 and not assumed and reducer.contradictions == seen:
        _interaction(reducer, [candidates[i] for i in right])
    return hit
