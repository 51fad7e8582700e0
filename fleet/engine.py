"""The one module that translates between ORM rows and the placement engine's
dataclasses. Services load a snapshot here, ask ``placement`` for a decision, and
turn its plan back into row ids here."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from django.conf import settings
from django.db.models import Count

from fleet.choices import HOLDING_JOB_STATES, NodeState
from fleet.cluster.steps import Allocate
from fleet.models import Allocation, Job, Node, Rack
from placement import model as pm

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


def job_request(job: Job) -> pm.JobRequest:
    return pm.JobRequest(
        id=str(job.pk),
        num_gpus=job.num_gpus,
        num_nodes=job.num_nodes,
        gpus_per_node=job.gpus_per_node,
        segment_nodes=job.segment_nodes,
        locality=job.locality,
        priority=job.priority,
        preemptible=job.preemptible,
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

    def describe_racks(self, rack_ids) -> list[str]:
        return [self.rack_names.get(r, r) for r in rack_ids]


def load_snapshot() -> Snapshot:
    """Read racks, nodes and active allocations into an engine Fleet.

    Allocations are restored even on nodes that have failed meanwhile: the job is
    still there, and recovery needs to see it."""
    racks: list[pm.Rack] = []
    hostnames: dict[str, str] = {}
    rack_names: dict[str, str] = {}
    nodes_by_rack: dict[int, list[pm.Node]] = defaultdict(list)
    for node in Node.objects.annotate(gpu_count=Count("gpus")).order_by("rack_id", "slot"):
        nid = str(node.pk)
        hostnames[nid] = node.hostname
        nodes_by_rack[node.rack_id].append(
            pm.Node(nid, str(node.rack_id), node.slot, node.gpu_count, ENGINE_HEALTH[node.state])
        )
    for rack in Rack.objects.order_by("site", "row", "position", "name"):
        nodes = nodes_by_rack.get(rack.pk)
        if not nodes:
            continue
        rack_names[str(rack.pk)] = rack.name
        spares = min(rack.spare_nodes, max(0, len(nodes) - 1))
        racks.append(pm.Rack(str(rack.pk), nodes, spare_nodes=spares))
    fleet = pm.Fleet(racks)

    held: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for job_id, node_id, index in Allocation.objects.filter(released_at__isnull=True).values_list(
        "job_id", "gpu__node_id", "gpu__index"
    ):
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
    return Snapshot(fleet, jobs, hostnames, rack_names)


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


__all__ = ["ENGINE_HEALTH", "Snapshot", "job_request", "load_snapshot", "policy"]
