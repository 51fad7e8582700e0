"""The one module that translates between ORM rows and the placement engine's
dataclasses. Services load a snapshot here, ask ``placement`` for a decision, and
turn its plan back into row ids here."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Q

from fleet.choices import HOLDING_JOB_STATES, GpuHealth, NodeState
from fleet.models import Allocation, Job, Node, Rack
from fleet.steps import Allocate, Checkpoint, Start, Step, Stop
from placement import model as pm
from placement.plans import Move
from placement.validate import validate_indexes

# Database node states as the engine sees them: suspect and drained nodes take no
# new work but their jobs stay (draining); a node in repair is failed.
ENGINE_HEALTH = {
    NodeState.HEALTHY: pm.HEALTHY,
    NodeState.SUSPECT: pm.DRAINING,
    NodeState.DRAINING: pm.DRAINING,
    NodeState.DRAINED: pm.DRAINING,
    NodeState.FAILED: pm.FAILED,
    NodeState.IN_REPAIR: pm.FAILED,
}


def engine_health(state: str, held_for: int | None = None) -> str:
    """A node's health as the engine sees it. A healthy node held for a plan
    (``NodeHold``) takes no new work but keeps its jobs, as a draining one does:
    the scheduler, recovery and other plans pass it by, and the plan itself sees
    it as it is (:meth:`Snapshot.unhold`)."""
    health = ENGINE_HEALTH[state]
    return pm.DRAINING if held_for is not None and health == pm.HEALTHY else health


def job_request(job: Job) -> pm.JobRequest:
    return pm.JobRequest(
        id=str(job.pk),
        **{name: getattr(job, name) for name in (*Job.SHAPE, *Job.PLACEMENT_TERMS)},
        checkpoint_minutes=job.checkpoint_interval_s / 60.0,
        submit_time=job.submitted_at.timestamp(),
        expected_duration=float(job.expected_duration_s) if job.expected_duration_s else None,
        tenant=job.tenant.name if job.tenant_id else "",
    )


@dataclass
class Snapshot:
    """The fleet as the engine sees it, plus what is needed to map back to rows."""

    fleet: pm.Fleet
    jobs: dict[str, Job] = field(default_factory=dict)
    hostnames: dict[str, str] = field(default_factory=dict)
    rack_names: dict[str, str] = field(default_factory=dict)
    # Held nodes: node id -> (the action holding it, its health without the hold).
    held: dict[str, tuple[int, str]] = field(default_factory=dict)

    def holder(self, node_id) -> int | None:
        """The action a node is held for, or None."""
        hold = self.held.get(str(node_id))
        return hold[0] if hold else None

    def unhold(self, action_id: int) -> None:
        """Inside a ``fleet.trial()``: the nodes held for ``action_id`` as they
        are without the hold, so that the action's own plan (checked, or planned
        again) may use the nodes it holds. The trial puts the holds back."""
        for nid, (owner, health) in self.held.items():
            if owner == action_id and self.fleet.nodes[nid].health != health:
                self.fleet.set_health(nid, health)

    def describe_nodes(self, node_ids) -> list[str]:
        return [self.hostnames.get(n, n) for n in node_ids]

    def allocate_step(self, job_id: int, nodes, segments, reason: str, choices=None) -> Allocate:
        """The step that binds a job to the engine's chosen ``nodes`` (node id
        -> GPU indices), named by hostname for the action's log."""
        return Allocate(
            job=job_id,
            nodes={k: list(v) for k, v in nodes.items()},
            segments=segments,
            hostnames=self.describe_nodes(nodes),
            reason=reason,
            choices=choices,
        )

    def move_steps(self, move: Move) -> list[Step]:
        """The steps of one of the engine's moves of a running job (a defrag's,
        an evacuation's): checkpoint, stop, bind it to its new nodes, start."""
        job_id = int(move.job_id)
        return [
            Checkpoint(job=job_id),
            Stop(job=job_id),
            self.allocate_step(job_id, move.to_nodes, move.to_segments, move.reason),
            Start(job=job_id),
        ]

    def describe_racks(self, rack_ids) -> list[str]:
        return [self.rack_names.get(r, r) for r in rack_ids]


def load_snapshot() -> Snapshot:
    """Read racks, nodes and active allocations into an engine Fleet.

    Allocations are restored even on nodes that have failed meanwhile: the job is
    still there, and recovery needs to see it."""
    racks: list[pm.Rack] = []
    hostnames: dict[str, str] = {}
    rack_names: dict[str, str] = {}
    held: dict[str, tuple[int, str]] = {}
    nodes_by_rack: dict[int, list[pm.Node]] = defaultdict(list)
    at_risk: dict[int, set[int]] = defaultdict(set)
    for node_id, rack_id, slot, hostname, state, gpus, held_for, suspect in _node_rows(Node.objects.all()):
        nid = str(node_id)
        if suspect:
            at_risk[rack_id].add(slot)
        hostnames[nid] = hostname
        if held_for is not None:
            held[nid] = (held_for, ENGINE_HEALTH[state])
        nodes_by_rack[rack_id].append(
            pm.Node(nid, str(rack_id), slot, gpus, engine_health(state, held_for), name=hostname)
        )
    reservations: dict[str, str] = {}
    degraded: set[str] = set()
    for rack_id, name, spare_nodes, reserved_for, fabric_degraded in Rack.objects.order_by(
        *RACK_ORDER
    ).values_list("id", "name", "spare_nodes", "reservation__tenant__name", "fabric_degraded"):
        if reserved_for:
            reservations[str(rack_id)] = reserved_for
        if fabric_degraded:
            degraded.add(str(rack_id))
        nodes = nodes_by_rack.get(rack_id)
        if not nodes:
            continue
        rack_names[str(rack_id)] = name
        racks.append(
            pm.Rack(
                str(rack_id),
                nodes,
                spare_nodes=_spares(spare_nodes, len(nodes)),
                name=name,
                at_risk=frozenset(at_risk.get(rack_id, ())),
            )
        )
    fleet = pm.Fleet(racks)
    fleet.reservations = {r: t for r, t in reservations.items() if r in fleet.rack_by_id}
    fleet.degraded = frozenset(degraded & set(fleet.rack_by_id))
    jobs = _restore(fleet, Allocation.objects.filter(released_at__isnull=True))
    return Snapshot(fleet, jobs, hostnames, rack_names, held)


# The order of racks in a Fleet (the engine's tie-breaks follow it).
RACK_ORDER = ("site", "row", "position", "name")


def _node_rows(nodes):
    """(id, rack id, slot, hostname, state, GPU count, the action holding it or
    None, GPUs with a suspect verdict)."""
    return (
        nodes.annotate(
            gpu_count=Count("gpus"), suspect_gpus=Count("gpus", filter=Q(gpus__health=GpuHealth.DEGRADED))
        )
        .order_by("rack_id", "slot")
        .values_list(
            "id", "rack_id", "slot", "hostname", "state", "gpu_count", "hold__action_id", "suspect_gpus"
        )
    )


def _spares(spare_nodes: int, nodes: int) -> int:
    return min(spare_nodes, max(0, nodes - 1))


def _restore(fleet: pm.Fleet, allocations) -> dict[str, Job]:
    """Put the jobs holding these active ``allocations`` (rows) back on ``fleet``,
    each with every GPU it holds in ``allocations``; returns the jobs by id."""
    held: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for job_id, node_id, index in allocations.values_list("job_id", "gpu__node_id", "gpu__index"):
        held[job_id][str(node_id)].append(index)
    jobs = {
        str(j.pk): j
        for j in Job.objects.select_related("tenant").filter(pk__in=list(held), state__in=HOLDING_JOB_STATES)
    }
    for job_id, nodes in held.items():
        job = jobs.get(str(job_id))
        if job is None:
            continue  # drift (allocations of a finished job); reconcile releases them
        request = job_request(job)
        segments = _segments(job, nodes, fleet)
        allocation = pm.Allocation(request, {n: tuple(sorted(g)) for n, g in nodes.items()}, segments)
        began = job.started_at or job.placed_at
        if began is not None and job.expected_duration_s:
            # What backfill plans with: a job expected to end by a reservation may use it.
            allocation.expected_end = began.timestamp() + job.expected_duration_s
        fleet.allocate(allocation, restore=True)
    return jobs


class LiveFleet:
    """The fleet kept in memory between scheduling passes, as Slurm keeps its state
    and Kueue its cache: :meth:`snapshot` brings it up to date from what changed
    since the last call instead of reading every node and allocation again.

    What changed is told by the racks' versions (``Rack.version``, bumped by
    ``fleet.services.racks.bump_versions`` in every transaction that changes a
    rack, its nodes or the allocations and jobs on it). For each rack whose version
    moved, its nodes are read again, and every job that held or now holds GPUs in
    it is taken off and put back from its rows, all of its GPUs in any rack. All
    of it is read in one REPEATABLE READ transaction, so versions and rows are of
    one moment.

    It is rebuilt from scratch (``load_snapshot``) on the first call and on any
    change it cannot apply in place: a rack added, removed or reordered, a changed
    spare count or node layout, an allocation that does not fit what it holds.

    The database stays the truth: the caller plans on the snapshot inside
    ``Fleet.trial()`` (nothing it tries stays in memory), allocations are still
    checked by the invariant checker and refused by the unique index. One caller
    at a time (a lock; another thread meanwhile gets a fresh load): the
    scheduling pass, under the decision lock; recovery and defrag planning and
    the checks of an action's plan, in the worker that runs them; and in a web
    process the what-if answers, which plan on a copy."""

    def __init__(self) -> None:
        self.snap: Snapshot | None = None
        self.versions: dict[int, int] = {}
        self.layout: list[tuple[int, int]] = []
        self.rebuilds = 0  # full loads
        self.applied = 0  # snapshots brought up to date in place
        self.lock = threading.Lock()

    def snapshot(self, *, check: bool = False) -> Snapshot:
        """Up to date with the rows; with ``check``, compared with a fresh load of
        them in the same transaction (see :func:`verify`)."""
        if connection.in_atomic_block:
            return self._refresh(check)  # a caller's transaction: its isolation level is set
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            return self._refresh(check)

    def _refresh(self, check: bool) -> Snapshot:
        snap = self._bring_up_to_date()
        if check:
            verify(snap)
        return snap

    def _bring_up_to_date(self) -> Snapshot:
        # A reservation changes no rack's version: read with the racks each time.
        rows = list(
            Rack.objects.order_by(*RACK_ORDER).values_list(
                "id", "version", "spare_nodes", "name", "reservation__tenant__name", "fabric_degraded"
            )
        )
        layout = [(rid, spares) for rid, _, spares, *_ in rows]
        versions = {rid: v for rid, v, *_ in rows}
        if self.snap is None or layout != self.layout:
            return self._rebuild(layout, versions)
        snap = self.snap
        known = snap.fleet.rack_by_id
        snap.fleet.reservations = {str(rid): t for rid, _, _, _, t, _ in rows if t and str(rid) in known}
        snap.fleet.degraded = frozenset(str(rid) for rid, *_, bad in rows if bad and str(rid) in known)
        for rid, _, _, name, *_ in rows:
            if str(rid) in snap.rack_names:
                snap.rack_names[str(rid)] = name
        changed = [rid for rid, v in versions.items() if self.versions.get(rid) != v]
        if not changed:
            return snap
        try:
            self._apply(snap, changed)
        except (pm.CapacityError, _Gap):
            return self._rebuild(layout, versions)
        except BaseException:
            self.snap = None  # half applied: the next snapshot is a full load
            raise
        self.versions = versions
        self.applied += 1
        return snap

    def _rebuild(self, layout, versions) -> Snapshot:
        self.snap = load_snapshot()
        self.layout, self.versions = layout, versions
        self.rebuilds += 1
        return self.snap

    def _apply(self, snap: Snapshot, changed: list[int]) -> None:
        fleet = snap.fleet
        rows: dict[str, list] = defaultdict(list)
        at_risk: dict[str, set[int]] = defaultdict(set)
        for node_id, rack_id, slot, hostname, state, gpus, held_for, suspect in _node_rows(
            Node.objects.filter(rack_id__in=changed)
        ):
            if suspect:
                at_risk[str(rack_id)].add(slot)
            hold = (held_for, ENGINE_HEALTH[state]) if held_for is not None else None
            rows[str(rack_id)].append(
                (str(node_id), slot, hostname, engine_health(state, held_for), gpus, hold)
            )
        affected: set[str] = set()
        for rid in map(str, changed):
            rack = fleet.rack_by_id.get(rid)
            layout = [(nid, slot, gpus) for nid, slot, _, _, gpus, _ in rows[rid]]
            if rack is None:
                if layout:
                    raise _Gap(rid)  # a rack without nodes (left out of the fleet) has some now
                continue
            if [(n.id, n.index, n.gpus) for n in rack.nodes] != layout:
                raise _Gap(rid)  # nodes added or removed, GPUs counted differently
            rack.at_risk = frozenset(at_risk.get(rid, ()))
            affected.update(j for n in rack.nodes for j in n.jobs)
        now_held = Allocation.objects.filter(released_at__isnull=True, gpu__node__rack_id__in=changed)
        affected.update(str(j) for j in now_held.order_by().values_list("job_id", flat=True).distinct())
        for jid in affected:
            if jid in fleet.allocations:
                fleet.release(jid)
            snap.jobs.pop(jid, None)
        for rid in map(str, changed):
            # A hold is taken or released with its racks' versions moved
            # (fleet.services.actions.lifecycle), so a changed rack's holds are read here.
            for nid, _, hostname, health, _, hold in rows[rid]:
                snap.hostnames[nid] = fleet.nodes[nid].name = hostname
                if hold is None:
                    snap.held.pop(nid, None)
                else:
                    snap.held[nid] = hold
                if fleet.nodes[nid].health != health:
                    fleet.set_health(nid, health)
        snap.jobs.update(
            _restore(
                fleet,
                Allocation.objects.filter(released_at__isnull=True, job_id__in=[int(j) for j in affected]),
            )
        )


class _Gap(Exception):
    """A change the live fleet cannot apply in place: rebuild."""


_live = LiveFleet()


def forget_live_fleet() -> None:
    """Drop the in-memory fleet: the next snapshot is a full load."""
    global _live
    _live = LiveFleet()


class LiveFleetDrift(AssertionError):
    """With ``RACKWISE_LIVE_FLEET_VERIFY``: the in-memory fleet differs from the rows."""


@contextmanager
def live_snapshot() -> Iterator[Snapshot]:
    """The in-memory fleet brought up to date (see :class:`LiveFleet`), for the
    ``with`` block; a fresh ``load_snapshot()`` when the cache is off
    (``RACKWISE_LIVE_FLEET``) or another thread of this process is using it.

    With ``RACKWISE_LIVE_FLEET_VERIFY`` (the test suite) every snapshot is
    compared with a fresh load first: a difference raises LiveFleetDrift."""
    if not settings.RACKWISE_LIVE_FLEET or not _live.lock.acquire(blocking=False):
        yield load_snapshot()
        return
    try:
        yield _live.snapshot(check=settings.RACKWISE_LIVE_FLEET_VERIFY)
    finally:
        _live.lock.release()


def verify(snap: Snapshot) -> None:
    """Raise LiveFleetDrift unless ``snap`` equals a fresh load of the rows and its
    indexes are exact. Under concurrent writers, call it in the transaction that
    read ``snap`` (``LiveFleet.snapshot(check=True)``)."""
    fresh = load_snapshot()
    problems = [str(v) for v in validate_indexes(snap.fleet)]
    mine, theirs = canonical(snap.fleet), canonical(fresh.fleet)
    if mine != theirs:
        problems.append(_first_difference(mine, theirs))
    if snap.hostnames != fresh.hostnames or snap.rack_names != fresh.rack_names:
        problems.append("host or rack names differ")
    if snap.held != fresh.held:
        problems.append(
            f"held nodes differ: in memory {sorted(snap.held.items())}, "
            f"in the rows {sorted(fresh.held.items())}"
        )
    if problems:
        raise LiveFleetDrift("; ".join(problems[:5]))


def _first_difference(mine: dict, theirs: dict) -> str:
    for r1, r2 in zip(mine["racks"], theirs["racks"], strict=False):
        if r1 != r2:
            return f"rack {r1['id']}: in memory {r1}, in the rows {r2}"
    if len(mine["racks"]) != len(theirs["racks"]):
        return f"{len(mine['racks'])} racks in memory, {len(theirs['racks'])} in the rows"
    a1 = {a["job_id"]: a for a in mine["allocations"]}
    a2 = {a["job_id"]: a for a in theirs["allocations"]}
    for jid in sorted(a1.keys() | a2.keys()):
        if a1.get(jid) != a2.get(jid):
            return f"job {jid}: in memory {a1.get(jid)}, in the rows {a2.get(jid)}"
    return "fleets differ"


def canonical(fleet: pm.Fleet) -> dict:
    """The fleet's state in a form that compares equal for equal fleets, whatever
    order its allocations were made in."""
    data = fleet.to_dict()
    data["allocations"] = sorted(data["allocations"], key=lambda a: a["job_id"])
    for a in data["allocations"]:
        a["nodes"] = dict(sorted(a["nodes"].items()))
    return data


def _segments(job: Job, nodes: dict[str, list[int]], fleet: pm.Fleet) -> list[list[str]]:
    """The job's segments as recorded at placement, if they still match its nodes;
    else one segment per rack."""
    recorded = (job.placement or {}).get("segments") or []
    flat = [n for seg in recorded for n in seg]
    if sorted(flat) == sorted(nodes):
        return [list(seg) for seg in recorded]
    by_rack: dict[str, list[str]] = defaultdict(list)
    for nid in nodes:
        by_rack[fleet.nodes[nid].rack].append(nid)
    return list(by_rack.values())


def policy() -> str:
    return settings.RACKWISE_POLICY


__all__ = [
    "ENGINE_HEALTH",
    "LiveFleet",
    "LiveFleetDrift",
    "Snapshot",
    "canonical",
    "engine_health",
    "job_request",
    "live_snapshot",
    "load_snapshot",
    "policy",
    "verify",
]
