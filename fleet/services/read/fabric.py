"""The NVLink fabric the agents report, read for the attention view, a node's
signals and ``import_topology --from agents``; :mod:`fleet.fabric_identity`
judges it, :mod:`fleet.topology.agents` builds racks from it.

Read from the GPUs' readings (``GpuReading.signals["fabric"]``), not from
``NodeReading``, which keeps only the first GPU's fabric: a node whose GPUs
disagree would not show. One query reads the distinct fabrics per node (a node's
GPUs normally agree: one row a node), readings older than
``RACKWISE_AGENT_FABRIC_MAX_AGE_S`` left out."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import BooleanField, Count, ExpressionWrapper, Q
from django.db.models.fields.json import KT
from django.utils import timezone

from fleet.fabric_identity import GPUS_DISAGREE, Fabric, Mismatch, NodeReport, RackInfo, fabric_of, mismatches
from fleet.models import GpuReading, Node, Rack
from fleet.topology.agents import AgentNode, RecordedRack


@dataclass
class _Reported:
    fresh: dict[int, set[Fabric]] = field(default_factory=lambda: defaultdict(set))
    stale: set[int] = field(default_factory=set)  # reported a fabric, only before the cutoff
    hosts: dict[int, tuple[str, int]] = field(default_factory=dict)  # hostname, rack id


def _cutoff(now: datetime | None, max_age_s: float | None) -> datetime:
    age = settings.RACKWISE_AGENT_FABRIC_MAX_AGE_S if max_age_s is None else max_age_s
    return (now or timezone.now()) - timedelta(seconds=age)


def _reported(scope: Q, cutoff: datetime) -> _Reported:
    """The distinct fabrics each node's GPUs reported since ``cutoff`` and the
    nodes that reported one only before: one query."""
    rows = (
        GpuReading.objects.filter(scope)
        .annotate(cluster=KT("signals__fabric__cluster_uuid"), clique=KT("signals__fabric__clique_id"))
        .filter(cluster__isnull=False)
        .exclude(cluster="")
        .annotate(fresh=ExpressionWrapper(Q(read_at__gte=cutoff), output_field=BooleanField()))
        .order_by()
        .values_list(
            "gpu__node_id", "gpu__node__hostname", "gpu__node__rack_id", "cluster", "clique", "fresh"
        )
        .distinct()
    )
    out = _Reported()
    seen_stale: set[int] = set()
    for node_id, hostname, rack_id, cluster, clique, fresh in rows:
        out.hosts[node_id] = (hostname, rack_id)
        fabric = fabric_of(cluster, clique)
        if fabric is None:
            continue
        if fresh:
            out.fresh[node_id].add(fabric)
        else:
            seen_stale.add(node_id)
    out.stale = seen_stale - set(out.fresh)
    return out


def _node_reports(reported: _Reported) -> list[NodeReport]:
    return [
        NodeReport(node_id, *reported.hosts[node_id], frozenset(fabrics))
        for node_id, fabrics in reported.fresh.items()
    ]


def fabric_mismatches(now: datetime | None = None) -> list[Mismatch]:
    """Every node whose fabric disagrees with its rack's, fleet-wide (two queries:
    the readings and the racks)."""
    reports = _node_reports(_reported(Q(), _cutoff(now, None)))
    if not reports:
        return []
    racks = [RackInfo(*row) for row in Rack.objects.values_list("id", "name", "external_id")]
    return mismatches(racks, reports)


def node_mismatch(node: Node, now: datetime | None = None) -> Mismatch | None:
    """``node``'s disagreement with its rack's fabric, or None. Judged on its
    rack's readings alone (one query), which decide it; only a flagged node's
    "rack its fabric says" needs the other racks, read then."""
    reports = _node_reports(_reported(Q(gpu__node__rack_id=node.rack_id), _cutoff(now, None)))
    rack = node.rack
    found = next(
        (
            m
            for m in mismatches([RackInfo(rack.pk, rack.name, rack.external_id)], reports)
            if m.node_id == node.pk
        ),
        None,
    )
    if found is None or found.kind == GPUS_DISAGREE:
        return found
    return next((m for m in fabric_mismatches(now) if m.node_id == node.pk), found)


@dataclass
class AgentFabrics:
    """What ``import_topology --from agents`` reads: every node as recorded, with
    the fabrics its agent reported, and every rack."""

    nodes: list[AgentNode]
    racks: list[RecordedRack]
    max_age_s: float


def agent_fabrics(max_age_s: float | None = None, now: datetime | None = None) -> AgentFabrics:
    """Every node with its recorded rack and GPU count, and the fabrics its GPUs
    reported within ``max_age_s`` (default ``RACKWISE_AGENT_FABRIC_MAX_AGE_S``):
    three queries."""
    age = float(settings.RACKWISE_AGENT_FABRIC_MAX_AGE_S if max_age_s is None else max_age_s)
    reported = _reported(Q(), _cutoff(now, age))
    nodes = [
        AgentNode(
            hostname=hostname,
            gpus=gpus,
            rack=rack,
            fabrics=frozenset(reported.fresh.get(node_id, ())),
            stale=node_id in reported.stale,
        )
        for node_id, hostname, rack, gpus in Node.objects.order_by()
        .annotate(n=Count("gpus"))
        .values_list("id", "hostname", "rack__name", "n")
    ]
    racks = [RecordedRack(*row) for row in Rack.objects.order_by("id").values_list("name", "external_id")]
    return AgentFabrics(nodes, racks, age)
