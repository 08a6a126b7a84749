"""What a packed call holds: its members (a candidate's node set and extraction, or the marked
whole model, or the original's replay), what each costs an engine, how members are split over
calls under the pack's memory and node bounds, and how riders (shape crops, producer→consumer
pairs a later step may ask about) fill the room packs have left. No engine runs here: the
evaluator builds and runs the packs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from reprokit.graph.io import tensor_proto_bytes
from reprokit.graph.pack import feed_bytes


@dataclass(eq=False)  # a dict key by identity: two shape tries may share a node set
class Member:
    """One candidate of a packed call: its node set (None: the marked whole model), its
    extraction, and the reference its outputs are judged against (None: the captured
    activations). ``crop`` tells shape tries of one node set apart in the journal."""

    nodes: frozenset | None
    sub: object  # Extraction
    reference: dict | None = None
    crop: str = ""
    replay: bool = False  # the original's replay riding along (confirm.RideAlong): no candidate
    quiet: bool = False  # a rider for a later step: its hit never stops a sequence of packs


def member_bytes(reducer, member: Member) -> int:
    """What one copy makes the engine hold: its feeds, its outputs and its own weights (every copy
    gets its own; external ones are read from disk for each)."""
    sub = member.sub

    def nbytes(name: str) -> int:
        if member.reference is not None:
            return int(np.asarray(member.reference[name]).nbytes) if name in member.reference else 0
        if name not in reducer.store:
            return 0
        shape, dtype = reducer.store.info(name)
        return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize

    weights = sum(tensor_proto_bytes(t) for t in sub.model.graph.initializer)
    return feed_bytes(sub) + weights + sum(nbytes(n) for n in sub.outputs)


def fit(reducer, members: list[Member]) -> list[list[Member]]:
    """Split members into packs under the byte (memory) and node limits, the bytes spread evenly
    over as many packs as the byte limit needs: an engine's peak follows a pack's data, so two
    halves peak lower than a full pack and its remainder. Members that fit one pack stay one."""
    sizes = [(member_bytes(reducer, m), len(m.sub.model.graph.node)) for m in members]
    even = sum(b for b, _ in sizes) / max(1, -(-sum(b for b, _ in sizes) // reducer.pack_bytes))
    groups, current, size, nodes = [], [], 0, 0
    for member, (weight, many) in zip(members, sizes):
        if current and (size + weight > reducer.pack_bytes or nodes + many > reducer.pack_nodes or size >= even):
            groups.append(current)
            current, size, nodes = [], 0, 0
        current.append(member)
        size += weight
        nodes += many
    if current:
        groups.append(current)
    return groups


# What one more node costs an engine beside its data when riders decide whether they fit (only
# they: a pack's own split follows its data). Measured on the emulator: riders taking the
# planted 1,997-node chain's survey pack from ~6,000 to ~10,800 nodes raised the worker's peak
# from 259 to 414 MiB, ~33-39 KiB a node (at 40 KiB here it still took 331 MiB against
# polygraphy's 343); a pack of few nodes and much data is unaffected.
RIDER_NODE_BYTES = 40 << 10


def ride_along(reducer, groups: list[list[Member]], *kinds) -> None:
    """Speculative members (shape crops a later step will ask about, producer→consumer pairs the
    survey may need next) fill the room the packs have left under the limits, first pack first
    (a pack split by the memory bound leaves room in each): they never cost a call of their own.
    Each of ``kinds`` (an iterable, maybe a generator: drawn only while members fit) starts again
    at the first pack; the packs' room is measured once for all of them."""
    def cost(member) -> tuple[int, int]:
        count = len(member.sub.model.graph.node)
        return member_bytes(reducer, member) + count * RIDER_NODE_BYTES, count

    room = [[sum(c[0] for c in costs), sum(c[1] for c in costs)] for costs in ([cost(m) for m in g] for g in groups)]
    for extra in kinds:
        at = 0
        for member in extra:
            weight, count = cost(member)
            while at < len(groups) and (room[at][0] + weight > reducer.pack_bytes
                                        or room[at][1] + count > reducer.pack_nodes):
                at += 1
            if at == len(groups):
                break
            groups[at].append(member)
            room[at][0] += weight
            room[at][1] += count
