"""When the fleet's nodes come free, for backfill to plan with: each node's
expected end (:class:`NodeEnds`), kept up to date from the nodes the fleet changed,
and views of a rack with some nodes taken out, now (:class:`HeldView`) or at a
later time (:class:`LaterView`). Used by :mod:`placement.queues` and the simulator."""

from __future__ import annotations

import bisect
import math

from placement.model import HEALTHY, Fleet, Node, Rack


def jobs_on(fleet: Fleet, node: Node) -> list[tuple[float, int]]:
    """(expected end, GPUs held) of each job running on ``node`` (None: never ends)."""
    allocs = fleet.allocations
    return [
        (math.inf if (end := allocs[j].expected_end) is None else end, len(allocs[j].nodes[node.id]))
        for j in node.jobs
    ]


def replace_sorted(ends: list[float], old: float, new: float) -> None:
    """Replace one ``old`` by ``new`` in the sorted list ``ends``."""
    del ends[bisect.bisect_left(ends, old)]
    bisect.insort(ends, new)


class NodeEnds:
    """When each node is free of its running jobs (their ``expected_end``; None:
    never), for backfill to plan with: ``free_at`` per node (-inf: idle now, inf:
    not healthy), every free_at sorted, and each rack's sorted. Built once; with
    ``track`` the fleet records the nodes it changes (``Fleet.changed``) and
    :meth:`refresh` recomputes only those, so a simulator does not rebuild the whole
    fleet's ends for every backfill cycle."""

    def __init__(self, fleet: Fleet, *, track: bool = True) -> None:
        self.fleet = fleet
        self.free_at: dict[str, float] = {}
        for nid in fleet.nodes:
            self._compute(nid)
        self.ends = sorted(self.free_at.values())
        self.rack_ends = {r.id: sorted(self.free_at[n.id] for n in r.nodes) for r in fleet.racks}
        if track:
            fleet.changed = set()

    def _compute(self, nid: str) -> float:
        node = self.fleet.nodes[nid]
        if node.health != HEALTHY or not node.used:
            # Back from repair: not planned on; idle: free at any time from now.
            at = math.inf if node.health != HEALTHY else -math.inf
        else:
            at = max(e for e, _ in jobs_on(self.fleet, node))
        self.free_at[nid] = at
        return at

    def refresh(self) -> None:
        """Recompute the nodes the fleet changed since the last refresh."""
        changed = self.fleet.changed
        if not changed:
            return
        nodes, rack_ends = self.fleet.nodes, self.rack_ends
        for nid in changed:
            old = self.free_at[nid]
            new = self._compute(nid)
            if new != old:
                replace_sorted(self.ends, old, new)
                replace_sorted(rack_ends[nodes[nid].rack], old, new)
        changed.clear()


class _RackView:
    """What a view of a rack shares with the rack: its id, label and shape, its spares
    policy and how many nodes it lends (read when the view is made)."""

    __slots__ = ("at_risk", "gpus_per_node", "id", "label", "lent_nodes", "size", "spare_nodes")

    def __init__(self, rack: Rack) -> None:
        self.id = rack.id
        self.label = rack.label
        self.size = rack.size
        self.spare_nodes = rack.spare_nodes
        self.lent_nodes = rack.lent_nodes
        self.gpus_per_node = rack.gpus_per_node
        self.at_risk = rack.at_risk

    unlent_spares = Rack.unlent_spares
    slice_offer = Rack.slice_offer
    idle_slots = Rack.idle_slots


class HeldView(_RackView):
    """A rack as a placement policy sees it, with some nodes taken out (held, or busy
    at the time being planned). Duck-types the parts of Rack the policies read."""

    __slots__ = ("free", "node_ids", "nodes")

    def __init__(self, rack: Rack, free: set[int], nodes: list[Node]) -> None:
        super().__init__(rack)
        self.free = free
        self.nodes = nodes
        self.node_ids = {n.id for n in nodes}

    @property
    def free_count(self) -> int:
        return len(self.free)


class LaterView(_RackView):
    """A rack as it will be at ``t``: its nodes free by then that no reservation
    holds. Their count is known from the node ends; which nodes they are is worked
    out only when a policy asks (for the racks it picks), since a decision over a
    whole shape group reads every rack's count but only a few racks' nodes."""

    __slots__ = ("_free", "_free_at", "_held", "_nodes", "_rack", "_t", "free_count")

    def __init__(self, rack: Rack, count: int, free_at: dict[str, float], t: float, held: set[str]) -> None:
        super().__init__(rack)
        self.free_count = count
        self._rack, self._free_at, self._t, self._held = rack, free_at, t, held
        self._nodes: list[Node] | None = None if count else []
        self._free: set[int] | None = None

    @property
    def nodes(self) -> list[Node]:
        if self._nodes is None:
            self._nodes = [
                n for n in self._rack.nodes if self._free_at[n.id] <= self._t and n.id not in self._held
            ]
        return self._nodes

    @property
    def free(self) -> set[int]:
        if self._free is None:
            self._free = {n.index for n in self.nodes}
        return self._free

    @property
    def node_ids(self) -> set[str]:
        return {n.id for n in self.nodes}
