"""The fleet: racks, nodes and allocations, with the indexes the decisions read.

The :class:`Fleet` keeps small indexes up to date on every mutation (per-rack set of
idle healthy nodes, per-rack count of nodes lent to small jobs, partly used nodes by
free GPUs, racks by idle-node count) so that a placement decision looks capacity up
instead of scanning every rack or GPU.
"""

from __future__ import annotations

import bisect
import contextlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from placement.model.records import HEALTH_STATES, HEALTHY, Allocation, Node, Rack

# GPUs per node -> (every GPU index in order, the mask of them all).
_WHOLE: dict[int, tuple[tuple[int, ...], int]] = {}


class CapacityError(ValueError):
    """Raised when an allocation would take a GPU that is held or not healthy."""


class Fleet:
    """Racks, nodes and the current allocations, with indexes kept up to date.

    Build one with :meth:`uniform` or :meth:`from_shapes`, or from your own Racks.
    Mutate only through :meth:`allocate`, :meth:`release` and :meth:`set_health`.
    """

    def __init__(self, racks: Iterable[Rack], allocations: Iterable[Allocation] = ()) -> None:
        self.racks: list[Rack] = list(racks)
        self.rack_by_id: dict[str, Rack] = {}
        self.rack_pos: dict[str, int] = {}
        self.nodes: dict[str, Node] = {}
        self.allocations: dict[str, Allocation] = {}
        # Racks reserved for a tenant (rack id -> tenant): its work goes there first,
        # others' only while nothing else holds it (placement.place.place).
        self.reservations = {}
        # Racks whose NVLink fabric is degraded: no new multi-node gang goes there
        # (placement.place.place and the queue pass leave them out for gangs).
        self.degraded: frozenset[str] = frozenset()
        for pos, rack in enumerate(self.racks):
            if rack.id in self.rack_by_id:
                raise ValueError(f"duplicate rack id {rack.id!r}")
            self.rack_by_id[rack.id] = rack
            self.rack_pos[rack.id] = pos
            for node in rack.nodes:
                if node.id in self.nodes:
                    raise ValueError(f"duplicate node id {node.id!r}")
                node.rack = rack.id
                node.used = 0
                node.jobs = {}
                self.nodes[node.id] = node
            rack.free = {n.index for n in rack.nodes if n.health == HEALTHY}
            rack.lent_nodes = 0
        # partial[f]: healthy nodes holding some GPUs with exactly f GPUs still free;
        # small-job best fit reads it instead of scanning every node.
        self.partial: dict[int, set[str]] = {}
        # Node ids that allocate/release/set_health touched, when someone tracks them
        # (None: nobody does; see placement.timeline.NodeEnds).
        self.changed: set[str] | None = None
        self.groups: dict[int, list[Rack]] = {}
        for rack in self.racks:
            self.groups.setdefault(rack.gpus_per_node, []).append(rack)
        self.groups = dict(sorted(self.groups.items()))
        self.group_size: dict[int, int] = {g: max(r.size for r in rs) for g, rs in self.groups.items()}
        self._slot: dict[str, dict[int, Node]] = {r.id: {n.index: n for n in r.nodes} for r in self.racks}
        # Capacity by size: group_pos[rack] is the rack's position in its shape group;
        # by_free[gpus_per_node] lists (idle nodes, group position) of the group's racks
        # that have an idle node, sorted, so "racks with at least n idle nodes, fewest
        # first" is a bisect; idle_total counts idle healthy nodes fleet-wide.
        self.group_pos: dict[str, int] = {}
        self.by_free: dict[int, list[tuple[int, int]]] = {}
        for g, rs in self.groups.items():
            for i, r in enumerate(rs):
                self.group_pos[r.id] = i
            self.by_free[g] = sorted((len(r.free), i) for i, r in enumerate(rs) if r.free)
        self.idle_total = sum(len(r.free) for r in self.racks)
        # The most spares a rack of the group keeps (spare_nodes is fixed for the life
        # of a Fleet): an offer is at most this far below a rack's idle count.
        self.max_spares: dict[int, int] = {g: max(r.spare_nodes for r in rs) for g, rs in self.groups.items()}
        self._group_nodes: dict[tuple[int, int], int] = {}
        self._group_sizes: dict[int, list[int]] = {}
        self._undo: _Undo | None = None  # see trial()
        for alloc in allocations:
            self.allocate(alloc)

    @property
    def reservations(self) -> dict[str, str]:
        return self._reservations

    @reservations.setter
    def reservations(self, value: dict[str, str]) -> None:
        self._reservations = value
        self._tiers: dict[str, list[frozenset[str]]] = {}
        self._outside: dict[frozenset[str], dict[int, list[Rack]]] = {}

    def reservation_tiers(self, tenant: str) -> list[frozenset[str]]:
        """The racks to leave out, tier by tier, for a job of ``tenant`` (see
        :func:`placement.queues.by_tier`): all but its own reserved racks, then
        the racks other tenants reserved, then none. Computed once per tenant
        while the reservations stay (assign ``reservations`` anew to change
        them)."""
        if not self._reservations:
            return [frozenset()]
        tiers = self._tiers.get(tenant)
        if tiers is None:
            others = frozenset(r for r, t in self._reservations.items() if t != tenant)
            found = [others, frozenset()]
            if len(others) < len(self._reservations):
                own = frozenset(self._reservations) - others
                found.insert(0, frozenset(self.rack_by_id) - own)
            tiers = self._tiers[tenant] = list(dict.fromkeys(found))
            for tier in tiers:
                self._outside.setdefault(tier, {})
        return tiers

    def groups_outside(self, skip: frozenset[str]) -> dict[int, list[Rack]]:
        """:attr:`groups` without the racks in ``skip`` (kept for the reservation
        tiers, which every decision asks for again)."""
        if not skip:
            return self.groups
        kept = self._outside.get(skip)
        if kept:
            return kept
        groups = {g: [r for r in rs if r.id not in skip] for g, rs in self.groups.items()}
        groups = {g: rs for g, rs in groups.items() if rs}
        if kept is not None:
            self._outside[skip] = groups
        return groups

    # -- construction ---------------------------------------------------------------

    @classmethod
    def uniform(
        cls, racks: int, nodes_per_rack: int = 18, gpus_per_node: int = 4, spare_nodes: int = 2
    ) -> Fleet:
        """``racks`` identical racks named r000.., nodes named r000-n00.."""
        return cls.from_shapes([(racks, nodes_per_rack, gpus_per_node, spare_nodes)])

    @classmethod
    def from_shapes(cls, shapes: Iterable[tuple[int, int, int, int]]) -> Fleet:
        """Racks from ``(count, nodes_per_rack, gpus_per_node, spare_nodes)`` groups."""
        out: list[Rack] = []
        for count, npr, gpn, spares in shapes:
            for _ in range(count):
                rid = f"r{len(out):03d}"
                nodes = [Node(f"{rid}-n{i:02d}", rid, i, gpn) for i in range(npr)]
                out.append(Rack(rid, nodes, spare_nodes=spares))
        return cls(out)

    def node_at(self, rack_id: str, index: int) -> Node:
        return self._slot[rack_id][index]

    def copy(self) -> Fleet:
        """An independent copy (what-if planning). The indexes are copied, not rebuilt
        allocation by allocation: they are kept exact on every mutation (the
        invariant ``placement.validate.validate_indexes`` checks), and each node's
        jobs keep their order, that of ``allocations``. Allocations are shared, as
        with ``allocate``."""
        racks = [
            Rack(
                r.id,
                [Node(n.id, n.rack, n.index, n.gpus, n.health, name=n.name) for n in r.nodes],
                spare_nodes=r.spare_nodes,
                name=r.name,
                at_risk=r.at_risk,
            )
            for r in self.racks
        ]
        out = Fleet(racks)  # builds the fixed indexes (shapes, slots, positions)
        out.reservations = dict(self.reservations)
        out.degraded = self.degraded
        for rack, src in zip(out.racks, self.racks, strict=True):
            for node, was in zip(rack.nodes, src.nodes, strict=True):
                node.used, node.jobs = was.used, dict(was.jobs)  # __init__ clears them
            rack.free = set(src.free)
            rack.lent_nodes = src.lent_nodes
        out.allocations = dict(self.allocations)
        out.partial = {f: set(ids) for f, ids in self.partial.items() if ids}
        out.by_free = {g: list(index) for g, index in self.by_free.items()}
        out.idle_total = self.idle_total
        return out

    # -- queries --------------------------------------------------------------------

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes.values())

    def free_gpus(self) -> int:
        return sum(n.free_gpus for n in self.nodes.values())

    def rack_of(self, node_id: str) -> Rack:
        return self.rack_by_id[self.nodes[node_id].rack]

    def racks_of(self, alloc: Allocation) -> list[str]:
        seen: dict[str, None] = {}
        for nid in alloc.nodes:
            seen[self.nodes[nid].rack] = None
        return list(seen)

    def shapes(self) -> list[int]:
        """Distinct GPUs-per-node values, ascending."""
        return sorted({r.gpus_per_node for r in self.racks})

    # -- mutations ------------------------------------------------------------------

    @staticmethod
    def _partial_key(node: Node) -> int:
        if node.health != HEALTHY or node.used == 0:
            return 0
        return node.gpus - node.used.bit_count()

    def _state(self, node: Node) -> tuple[bool, bool, int]:
        return node.idle, self._is_lent_node(node), self._partial_key(node)

    def _node_changed(
        self, node: Node, before: tuple[bool, bool, int], touched: dict[str, int] | None = None
    ) -> None:
        """Update the indexes after ``node`` changed from state ``before``. With
        ``touched`` the racks-by-idle index is left to :meth:`_reindex_racks` (one
        update per rack for a gang): it records each changed rack's old idle count."""
        was_idle, was_small, was_key = before
        key = self._partial_key(node)
        if key != was_key:
            if was_key:
                self.partial[was_key].discard(node.id)
            if key:
                self.partial.setdefault(key, set()).add(node.id)
        rack = self.rack_by_id[node.rack]
        now_idle = node.idle
        if was_idle != now_idle:
            old = len(rack.free)
            if touched is not None:
                touched.setdefault(rack.id, old)
            if was_idle:
                rack.free.discard(node.index)
            else:
                rack.free.add(node.index)
            new = len(rack.free)
            if touched is None and new != old:
                self.idle_total += new - old
                self._reindex(rack, old, new)
        now_lent = self._is_lent_node(node)
        rack.lent_nodes += int(now_lent) - int(was_small)

    def _reindex_racks(self, touched: dict[str, int]) -> None:
        for rid, old in touched.items():
            rack = self.rack_by_id[rid]
            new = len(rack.free)
            if new != old:
                self.idle_total += new - old
                self._reindex(rack, old, new)

    def _reindex(self, rack: Rack, old: int, new: int) -> None:
        """Move the rack from the ``old`` to the ``new`` idle-count bucket."""
        pos = self.group_pos[rack.id]
        index = self.by_free[rack.gpus_per_node]
        if old:
            del index[bisect.bisect_left(index, (old, pos))]
        if new:
            bisect.insort(index, (new, pos))

    def most_idle(self, gpus_per_node: int, count: int) -> list[Rack]:
        """The ``count`` racks of this shape with the most idle nodes (ties: group
        order), from the index; racks without an idle node fill up, in group order."""
        index = self.by_free.get(gpus_per_node, [])
        group = self.groups.get(gpus_per_node, [])
        out: list[Rack] = []
        hi = len(index)
        while hi and len(out) < count:
            lo = bisect.bisect_left(index, (index[hi - 1][0], -1))
            out += [group[p] for _, p in index[lo:hi]]
            hi = lo
        if len(out) < count:
            out += [r for r in group if not r.free][: count - len(out)]
        return out[:count]

    def group_nodes(self, gpus_per_node: int, segment: int | None = None) -> int:
        """Nodes of this shape (racks are fixed for the life of a Fleet); with
        ``segment``, only those that whole segments of that many nodes can use."""
        key = (gpus_per_node, segment or 0)
        total = self._group_nodes.get(key)
        if total is None:
            racks = self.groups.get(gpus_per_node, [])
            total = sum((r.size // segment) * segment if segment else r.size for r in racks)
            self._group_nodes[key] = total
        return total

    def group_sizes(self, gpus_per_node: int) -> list[int]:
        """Node counts of this shape's racks, largest first (racks are fixed for the
        life of a Fleet)."""
        sizes = self._group_sizes.get(gpus_per_node)
        if sizes is None:
            sizes = sorted((r.size for r in self.groups.get(gpus_per_node, [])), reverse=True)
            self._group_sizes[gpus_per_node] = sizes
        return sizes

    def racks_with_idle(self, gpus_per_node: int, at_least: int = 1) -> Iterator[tuple[int, int, Rack]]:
        """(idle nodes, group position, rack) for the racks of this shape with at least
        ``at_least`` idle nodes, fewest idle first, ties in group order. Read from the
        index, lazily: the racks without room are never looked at."""
        index = self.by_free.get(gpus_per_node)
        if not index:
            return
        group = self.groups[gpus_per_node]
        for i in range(bisect.bisect_left(index, (max(1, at_least), -1)), len(index)):
            free, pos = index[i]
            yield free, pos, group[pos]

    def _is_lent_node(self, node: Node) -> bool:
        """A node whose jobs are all small or preemptible: reclaimable as a spare."""
        if not node.jobs:
            return False
        for j in node.jobs:
            a = self.allocations.get(j)
            if a is not None and not (a.job.preemptible or a.job.is_small(node.gpus)):
                return False
        return True

    def allocate(self, alloc: Allocation, *, restore: bool = False) -> None:
        """Record a job's allocation. Raises CapacityError if any GPU is unavailable.

        ``restore`` puts back an allocation that was released for a what-if, even if
        one of its nodes has failed meanwhile (the job is still there).
        """
        jid = alloc.job.id
        if jid in self.allocations:
            raise CapacityError(f"job {jid} already holds an allocation")
        masks: list[tuple[Node, int]] = []
        for nid, gpus in alloc.nodes.items():
            node = self.nodes.get(nid)
            if node is None:
                raise CapacityError(f"job {jid}: unknown node {nid}")
            if node.health != HEALTHY and not restore:
                raise CapacityError(f"job {jid}: node {node.label} is {node.health}")
            whole = _WHOLE.get(node.gpus)
            if whole is None:
                whole = _WHOLE[node.gpus] = (tuple(range(node.gpus)), (1 << node.gpus) - 1)
            if gpus == whole[0]:
                mask = whole[1]  # every GPU of the node, in order (gangs): valid
            else:
                mask = 0
                for g in gpus:
                    if not 0 <= g < node.gpus or mask >> g & 1:
                        raise CapacityError(f"job {jid}: bad GPU index {g} on {node.label}")
                    mask |= 1 << g
            if node.used & mask:
                raise CapacityError(f"job {jid}: a GPU on {node.label} is already held")
            masks.append((node, mask))
        if self._undo is not None:
            self._undo.save(alloc.nodes)
        self.allocations[jid] = alloc
        touched: dict[str, int] = {}
        lends = alloc.job.preemptible  # (or small: checked per node shape below)
        for node, mask in masks:
            if not node.jobs and node.health == HEALTHY and mask == (1 << node.gpus) - 1:
                # Fast path, a whole idle node (gangs): idle -> full, no partial entry.
                rack = self.rack_by_id[node.rack]
                touched.setdefault(rack.id, len(rack.free))
                rack.free.discard(node.index)
                node.used = mask
                node.jobs[jid] = mask
                if lends or alloc.job.is_small(node.gpus):
                    rack.lent_nodes += 1
                continue
            before = self._state(node)
            node.used |= mask
            node.jobs[jid] = mask
            self._node_changed(node, before, touched)
        self._reindex_racks(touched)
        if self.changed is not None:
            self.changed.update(alloc.nodes)

    def release(self, job_id: str) -> Allocation:
        """Free a job's GPUs and forget its allocation (KeyError if unknown)."""
        alloc = self.allocations[job_id]
        nodes = self.nodes
        if self._undo is not None:
            self._undo.save(alloc.nodes)
        # A node held whole by this job alone (gangs) takes the fast path below.
        states = {
            nid: None
            if (len(nodes[nid].jobs) == 1 and nodes[nid].used == (1 << nodes[nid].gpus) - 1)
            else self._state(nodes[nid])
            for nid in alloc.nodes
        }
        del self.allocations[job_id]
        touched: dict[str, int] = {}
        lends = alloc.job.preemptible
        for nid in alloc.nodes:
            node = nodes[nid]
            node.used &= ~node.jobs.pop(job_id)
            before = states[nid]
            if before is None:
                # Fast path: full -> empty; idle again if healthy, lent no more.
                rack = self.rack_by_id[node.rack]
                if lends or alloc.job.is_small(node.gpus):
                    rack.lent_nodes -= 1
                if node.health == HEALTHY:
                    touched.setdefault(rack.id, len(rack.free))
                    rack.free.add(node.index)
                continue
            self._node_changed(node, before, touched)
        self._reindex_racks(touched)
        if self.changed is not None:
            self.changed.update(alloc.nodes)
        return alloc

    def set_health(self, node_id: str, health: str) -> list[str]:
        """Change a node's health; returns the ids of the jobs running on it."""
        if health not in HEALTH_STATES:
            raise ValueError(f"health must be one of {HEALTH_STATES}")
        node = self.nodes[node_id]
        if self._undo is not None:
            self._undo.save((node_id,))
        before = self._state(node)
        node.health = health
        self._node_changed(node, before)
        if self.changed is not None:
            self.changed.add(node_id)
        return list(node.jobs)

    def hold_back(self, slots: Mapping[str, Iterable[int]]) -> dict[str, list[int]]:
        """Take the idle ones of these nodes (rack id -> slots) out of their racks'
        idle sets, the racks-by-idle index and the idle count, until
        :meth:`give_back` gets the answer. The nodes themselves do not change: this
        is for a gang's decision, which takes idle nodes from ``rack.free`` only, to
        see those nodes as held for someone else (backfill's reservations) while
        reading the indexes. Mutate nothing in between."""
        taken: dict[str, list[int]] = {}
        for rid, want in slots.items():
            rack = self.rack_by_id[rid]
            free = rack.free
            got = [i for i in want if i in free]
            if got:
                taken[rid] = got
                free.difference_update(got)
                self._reindex(rack, len(free) + len(got), len(free))
                self.idle_total -= len(got)
        return taken

    def give_back(self, taken: dict[str, list[int]]) -> None:
        """Undo :meth:`hold_back`."""
        for rid, got in taken.items():
            rack = self.rack_by_id[rid]
            rack.free.update(got)
            self._reindex(rack, len(rack.free) - len(got), len(rack.free))
            self.idle_total += len(got)

    @contextlib.contextmanager
    def trial(self) -> Iterator[Fleet]:
        """What-if changes on the fleet itself, without a copy: inside, mutate it as
        usual; on exit every change is undone (nodes, racks and indexes as they were,
        each node's jobs and ``allocations`` in their old order) and the change
        tracking (``changed``) has seen none of it. Only the nodes touched are saved,
        at their first change. A trial inside a trial undoes its own changes: what it
        touched that the outer one had not saved yet is put back as the outer one
        found it, so the outer one needs no record of it."""
        outer = self._undo
        undo = self._undo = _Undo(self)
        changed, self.changed = self.changed, None
        try:
            yield self
        finally:
            self._undo = outer
            undo.rollback()
            self.changed = changed

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fleet:
        """Rebuild a fleet from :meth:`to_dict` output (JSON round trip)."""
        racks = [
            Rack(
                r["id"],
                [
                    Node(
                        n["id"],
                        r["id"],
                        n["index"],
                        n["gpus"],
                        n.get("health", HEALTHY),
                        name=n.get("name", ""),
                    )
                    for n in r["nodes"]
                ],
                spare_nodes=r.get("spare_nodes", 2),
                name=r.get("name", ""),
                at_risk=frozenset(r.get("at_risk", ())),
            )
            for r in data["racks"]
        ]
        fleet = cls(racks)
        for a in data.get("allocations", []):
            # restore: a job may still sit on a node that failed (awaiting recovery).
            fleet.allocate(Allocation.from_dict(a), restore=True)
        return fleet

    def to_dict(self) -> dict[str, Any]:
        return {
            "racks": [
                {
                    "id": r.id,
                    "spare_nodes": r.spare_nodes,
                    "nodes": [
                        {"id": n.id, "index": n.index, "gpus": n.gpus, "health": n.health} for n in r.nodes
                    ],
                    **({"at_risk": sorted(r.at_risk)} if r.at_risk else {}),
                }
                for r in self.racks
            ],
            "allocations": [a.to_dict() for a in self.allocations.values()],
        }


class _Undo:
    """What :meth:`Fleet.trial` puts back: the allocations and the idle count as
    they were, and each touched node's and rack's state from before its first
    change."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.allocations = dict(fleet.allocations)
        self.idle_total = fleet.idle_total
        self.nodes: dict[str, tuple[Node, int, dict[str, int], str]] = {}
        self.racks: dict[str, tuple[Rack, set[int], int]] = {}

    def save(self, node_ids: Iterable[str]) -> None:
        for nid in node_ids:
            if nid not in self.nodes:
                node = self.fleet.nodes[nid]
                self.nodes[nid] = (node, node.used, dict(node.jobs), node.health)
                if node.rack not in self.racks:
                    rack = self.fleet.rack_by_id[node.rack]
                    self.racks[rack.id] = (rack, set(rack.free), rack.lent_nodes)

    def rollback(self) -> None:
        fleet = self.fleet
        for node, used, jobs, health in self.nodes.values():
            key = fleet._partial_key(node)
            if key:
                fleet.partial[key].discard(node.id)
            node.used, node.health = used, health
            node.jobs.clear()
            node.jobs.update(jobs)
            key = fleet._partial_key(node)
            if key:
                fleet.partial.setdefault(key, set()).add(node.id)
        for rack, free, lent in self.racks.values():
            old = len(rack.free)
            rack.free.clear()
            rack.free.update(free)
            rack.lent_nodes = lent
            if old != len(free):
                fleet._reindex(rack, old, len(free))
        fleet.idle_total = self.idle_total
        fleet.allocations.clear()
        fleet.allocations.update(self.allocations)


def as_allocations(fleet: Fleet, allocations: Mapping[str, Allocation] | None) -> Mapping[str, Allocation]:
    return fleet.allocations if allocations is None else allocations
