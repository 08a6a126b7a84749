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
from reprokit.graph.pack import feed_key
from reprokit.shrink.buildcost import RIDER_CHANCE


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
    role: str = ""  # how it joined the call ("rider", "speculative"; "": the step asked for it)


def member_kind(member: Member) -> str:
    """The member's kind as summary.json's build breakdown names it (issue 39)."""
    if member.replay:
        return "original copy"
    if member.nodes is None:
        return "marked copy"
    if member.crop:
        return "shape crop"
    return member.role or "asked"


def built_by(group: list[Member], pack_nodes: int) -> dict[str, int]:
    """Nodes one packed call built, per member kind (what the pack adds itself: "pack")."""
    found: dict[str, int] = {}
    for member in group:
        kind = member_kind(member)
        found[kind] = found.get(kind, 0) + len(member.sub.model.graph.node)
    extra = pack_nodes - sum(found.values())
    if extra:
        found["pack"] = extra
    return found


def member_cost(reducer, member: Member) -> tuple[int, dict]:
    """What one copy makes the engine hold: (its outputs and its own weights, {feed key: bytes}).
    Every copy gets its own weights (external ones are read from disk for each); a feed whose
    key another member of the same pack has is held once when the pack shares feeds
    (``Reducer.share_feeds``)."""
    sub = member.sub

    def nbytes(name: str) -> int:
        if member.reference is not None:
            return int(np.asarray(member.reference[name]).nbytes) if name in member.reference else 0
        if name not in reducer.store:
            return 0
        shape, dtype = reducer.store.info(name)
        return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize

    weights = sum(tensor_proto_bytes(t) for t in sub.model.graph.initializer)
    feeds = {}
    for name, value in sub.feeds.items():
        tensor = value is not None and not isinstance(value, (list, tuple))  # not a sequence, not an empty optional
        size = int(np.asarray(value).nbytes) if tensor else sum(int(np.asarray(v).nbytes) for v in value or ())
        feeds[feed_key(value) if tensor and reducer.share_feeds else (id(member), name)] = size
    return weights + sum(nbytes(n) for n in sub.outputs), feeds


class Room:
    """What one pack holds so far: bytes, nodes, and the feeds it has (held once)."""

    def __init__(self):
        self.bytes, self.nodes, self.feeds = 0, 0, set()

    def weight(self, cost: tuple[int, dict]) -> int:
        """The bytes one more member adds: its own, and its feeds this pack does not hold yet."""
        own, feeds = cost
        return own + sum(size for key, size in feeds.items() if key not in self.feeds)

    def add(self, cost: tuple[int, dict], nodes: int) -> None:
        self.bytes += self.weight(cost)
        self.nodes += nodes
        self.feeds.update(cost[1])


def fit(reducer, members: list[Member], *, chunks: tuple[int, bool] | None = None) -> list[list[Member]]:
    """Split members into packs under the byte (memory) and node limits, the bytes spread evenly
    over as many packs as the byte limit needs: an engine's peak follows a pack's data, so two
    halves peak lower than a full pack and its remainder. Members that fit one pack stay one.
    ``chunks``: (nodes, doubling): a pack also closes once its candidates hold this many nodes,
    twice as many in each next pack where doubling (a sequence that stops at its first hit,
    packed by build cost: buildcost.BuildCost.chunks)."""
    costs = [(member_cost(reducer, m), len(m.sub.model.graph.node)) for m in members]
    whole = Room()
    for cost, many in costs:
        whole.add(cost, many)
    even = whole.bytes / max(1, -(-whole.bytes // reducer.pack_bytes))
    chunk_nodes, doubling = chunks if chunks is not None else (None, False)
    groups, current, room, asked = [], [], Room(), 0
    for member, (cost, many) in zip(members, costs):
        if current and (room.bytes + room.weight(cost) > reducer.pack_bytes
                        or room.nodes + many > reducer.pack_nodes or room.bytes >= even
                        or (chunk_nodes is not None and asked >= chunk_nodes)):
            groups.append(current)
            current, room, asked = [], Room(), 0
            if doubling and chunk_nodes is not None:
                chunk_nodes *= 2
        current.append(member)
        room.add(cost, many)
        if member.nodes is not None and not member.replay:
            asked += len(member.nodes)
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
    On TensorRT they cost their build: only those the build-cost estimate says pay ride.
    Each of ``kinds`` (an iterable, maybe a generator: drawn only while members fit) starts again
    at the first pack; the packs' room is measured once for all of them."""
    def cost(member) -> tuple[tuple[int, dict], int]:
        count = len(member.sub.model.graph.node)
        own, feeds = member_cost(reducer, member)
        return (own + count * RIDER_NODE_BYTES, feeds), count

    # on an engine that builds what it runs (TensorRT), a rider costs its build whether or not it
    # is asked about: it rides only where the estimate says that pays (shrink/buildcost.py)
    builds = reducer.build_cost
    rooms = []
    for group in groups:
        rooms.append(Room())
        for member in group:
            rooms[-1].add(*cost(member))
    for extra in kinds:
        at = 0
        for member in extra:
            weight, count = cost(member)
            if builds is not None and not builds.rider_pays(count, RIDER_CHANCE):
                continue
            while at < len(groups) and (rooms[at].bytes + rooms[at].weight(weight) > reducer.pack_bytes
                                        or rooms[at].nodes + count > reducer.pack_nodes):
                at += 1
            if at == len(groups):
                break
            groups[at].append(member)
            rooms[at].add(weight, count)
