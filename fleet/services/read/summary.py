"""Read-side summaries of racks and the fleet, computed with a few grouped
queries rather than per-GPU Python loops, so they stay fast for 1,000 racks."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field

from django.db.models import Count, Q, QuerySet

from fleet.choices import FAILED_NODE_STATES, GpuHealth, JobState, NodeState
from fleet.models import GPU, Allocation, Job, Node, Rack

# The per-rack counts that add up to fleet totals.
COUNTS = (
    "gpus_total",
    "gpus_used",
    "gpus_free",
    "gpus_failed",
    "gpus_unavailable",
    "nodes_total",
    "nodes_free",
)


@dataclass
class RackSummary:
    gpus_total: int = 0
    gpus_used: int = 0
    gpus_free: int = 0
    gpus_failed: int = 0
    gpus_unavailable: int = 0
    nodes_total: int = 0
    nodes_free: int = 0
    nodes_by_state: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def rack_summaries(racks: QuerySet[Rack] | None = None) -> dict[int, RackSummary]:
    """Per-rack counts. A GPU is *used* if allocated; else *failed* if it or its
    node failed; *free* if on a healthy node and not failed or allocated; otherwise
    *unavailable* (suspect, draining or drained node).

    A node is *free* when it is healthy and none of its GPUs is allocated."""
    rack_ids = list((racks if racks is not None else Rack.objects.all()).values_list("id", flat=True))
    out = {rid: RackSummary(nodes_by_state={s: 0 for s in NodeState.values}) for rid in rack_ids}
    if not rack_ids:
        return out

    for row in Node.objects.filter(rack_id__in=rack_ids).values("rack_id", "state").annotate(n=Count("id")):
        s = out[row["rack_id"]]
        s.nodes_by_state[row["state"]] = row["n"]
        s.nodes_total += row["n"]

    gpus = GPU.objects.filter(node__rack_id__in=rack_ids)
    # A held GPU counts as used only, even on a failed node (a recovering job still
    # holds it), so the four GPU counts partition the rack.
    held = Allocation.objects.filter(released_at__isnull=True).values("gpu_id")
    failed = (Q(health=GpuHealth.FAILED) | Q(node__state__in=FAILED_NODE_STATES)) & ~Q(id__in=held)
    for gpu_row in gpus.values("node__rack_id").annotate(
        total=Count("id"), failed=Count("id", filter=failed)
    ):
        s = out[gpu_row["node__rack_id"]]
        s.gpus_total = gpu_row["total"]
        s.gpus_failed = gpu_row["failed"]

    active = Allocation.objects.filter(released_at__isnull=True, gpu__node__rack_id__in=rack_ids)
    for used_row in active.values("gpu__node__rack_id").annotate(n=Count("id")):
        out[used_row["gpu__node__rack_id"]].gpus_used = used_row["n"]

    # Free GPUs: on healthy nodes, not failed, not allocated.
    free_rows = (
        gpus.filter(node__state=NodeState.HEALTHY)
        .exclude(health=GpuHealth.FAILED)
        .exclude(id__in=Allocation.objects.filter(released_at__isnull=True).values("gpu_id"))
        .values("node__rack_id")
        .annotate(n=Count("id"))
    )
    for free_row in free_rows:
        out[free_row["node__rack_id"]].gpus_free = free_row["n"]

    busy_nodes = Allocation.objects.filter(released_at__isnull=True).values("gpu__node_id")
    for idle_row in (
        Node.objects.filter(rack_id__in=rack_ids, state=NodeState.HEALTHY)
        .exclude(id__in=busy_nodes)
        .values("rack_id")
        .annotate(n=Count("id"))
    ):
        out[idle_row["rack_id"]].nodes_free = idle_row["n"]

    for s in out.values():
        s.gpus_unavailable = max(0, s.gpus_total - s.gpus_used - s.gpus_free - s.gpus_failed)
    return out


def fleet_summary() -> dict:
    """Totals, utilization and free nodes per rack for the whole fleet."""
    racks = list(Rack.objects.values("id", "name"))
    per_rack = rack_summaries()
    totals: dict[str, int] = defaultdict(int)
    nodes_by_state: dict[str, int] = {s: 0 for s in NodeState.values}
    for s in per_rack.values():
        for key in COUNTS:
            totals[key] += getattr(s, key)
        for state, n in s.nodes_by_state.items():
            nodes_by_state[state] += n
    jobs_by_state = {s: 0 for s in JobState.values}
    for row in Job.objects.values("state").annotate(n=Count("id")):
        jobs_by_state[row["state"]] = row["n"]
    usable = totals["gpus_total"] - totals["gpus_failed"]
    return {
        "racks": len(racks),
        **{k: totals[k] for k in COUNTS},
        "utilization": round(totals["gpus_used"] / totals["gpus_total"], 4) if totals["gpus_total"] else 0.0,
        "utilization_of_usable": round(totals["gpus_used"] / usable, 4) if usable else 0.0,
        "nodes_by_state": nodes_by_state,
        "jobs_by_state": jobs_by_state,
        "free_nodes_per_rack": [
            {"rack_id": r["id"], "rack": r["name"], "nodes_free": per_rack[r["id"]].nodes_free} for r in racks
        ],
    }
