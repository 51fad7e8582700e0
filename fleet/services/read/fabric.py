"""The NVLink fabric the agents report, read for the attention view, a node's
signals and ``import_topology --from agents``; :mod:`fleet.fabric_identity`
judges it, :mod:`fleet.topology.agents` builds racks from it.

Read from ``NodeReading``: the node's fabric (its first GPU in a cluster) and,
when its GPUs disagree, the distinct fabrics they report, which the heartbeat
intake keeps there. One narrow row a node: reading every GPU's ``signals``
instead took 240 ms for 18,000 nodes. Reports older than
``RACKWISE_AGENT_FABRIC_MAX_AGE_S`` are left out (counted as stale)."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import BooleanField, Case, Count, ExpressionWrapper, F, JSONField, Q, Value, When
from django.utils import timezone

from fleet.fabric_identity import (
    GPUS_DISAGREE,
    Fabric,
    Mismatch,
    NodeReport,
    RackInfo,
    expected_fabrics,
    fabric_of,
    mismatches,
    racks_to_judge,
)
from fleet.models import Node, NodeReading, Rack
from fleet.topology.agents import AgentNode, RecordedRack


@dataclass
class _Reported:
    fresh: dict[int, set[Fabric]] = field(default_factory=dict)
    stale: set[int] = field(default_factory=set)  # reported a fabric, but before the cutoff
    hosts: dict[int, tuple[str, int]] = field(default_factory=dict)  # hostname, rack id


def _cutoff(now: datetime | None, max_age_s: float | None) -> datetime:
    age = settings.RACKWISE_AGENT_FABRIC_MAX_AGE_S if max_age_s is None else max_age_s
    return (now or timezone.now()) - timedelta(seconds=age)


def _reported(scope: Q, cutoff: datetime) -> _Reported:
    """The fabrics each node's GPUs reported since ``cutoff`` and the nodes that
    reported one only before: one query."""
    rows = (
        NodeReading.objects.filter(scope)
        .exclude(fabric_cluster_uuid="")
        .annotate(
            fresh=ExpressionWrapper(Q(read_at__gte=cutoff), output_field=BooleanField()),
            # Null where the GPUs agree (nearly always): no JSON to decode per row.
            disagreement=Case(
                When(fabric_disagreement=[], then=Value(None)),
                default=F("fabric_disagreement"),
                output_field=JSONField(),
            ),
        )
        .order_by()
        .values_list(
            "node_id",
            "node__hostname",
            "node__rack_id",
            "fabric_cluster_uuid",
            "fabric_clique_id",
            "disagreement",
            "fresh",
        )
    )
    out = _Reported()
    for node_id, hostname, rack_id, cluster, clique, disagreement, fresh in rows:
        out.hosts[node_id] = (hostname, rack_id)
        if not fresh:
            out.stale.add(node_id)
            continue
        if disagreement:
            pairs = [
                p
                for p in disagreement
                if isinstance(p, list) and len(p) == 2 and isinstance(p[1], int | str | None)
            ]
            fabrics = {f for f in (fabric_of(*p) for p in pairs) if f is not None}
        else:
            fabric = fabric_of(cluster, clique)
            fabrics = {fabric} if fabric is not None else set()
        if fabrics:
            out.fresh[node_id] = fabrics
    return out


def _node_reports(reported: _Reported) -> list[NodeReport]:
    return [
        NodeReport(node_id, *reported.hosts[node_id], frozenset(fabrics))
        for node_id, fabrics in reported.fresh.items()
    ]


def fabric_mismatches(now: datetime | None = None) -> list[Mismatch]:
    """Every node whose fabric disagrees with its rack's, fleet-wide, steps:

    1. Count the fresh reports by rack and fabric in the database (a row a rack
       and fabric, about one a rack), marking racks with a node whose GPUs
       disagree; read the racks.
    2. Take each rack's fabric from its counts (fleet.fabric_identity).
    3. Read node by node only the racks where some count differs from the
       rack's fabric, or a node's GPUs disagree: none on a sound fleet.

    Two queries when nothing disagrees, three otherwise. For 18,000 nodes this
    takes 23 ms; reading them one by one took 110 ms, on every attention view."""
    cutoff = _cutoff(now, None)
    rows = (
        NodeReading.objects.filter(read_at__gte=cutoff)
        .exclude(fabric_cluster_uuid="")
        .annotate(split=Case(When(fabric_disagreement=[], then=Value(False)), default=Value(True)))
        .order_by()
        .values_list("node__rack_id", "fabric_cluster_uuid", "fabric_clique_id", "split")
        .annotate(n=Count("id"))
    )
    counts: dict[int, Counter[Fabric]] = defaultdict(Counter)
    split: set[int] = set()
    for rack_id, cluster, clique, gpus_disagree, n in rows:
        fabric = fabric_of(cluster, clique)
        if gpus_disagree:
            split.add(rack_id)
        elif fabric is not None:
            counts[rack_id][fabric] += n
    if not counts and not split:
        return []
    racks = [RackInfo(*row) for row in Rack.objects.values_list("id", "name", "external_id")]
    expected = expected_fabrics(racks, counts)
    judge = racks_to_judge(expected, counts) | split
    if not judge:
        return []
    reports = _node_reports(_reported(Q(node__rack_id__in=judge), cutoff))
    return mismatches(racks, reports, expected)


def node_mismatch(node: Node, now: datetime | None = None) -> Mismatch | None:
    """``node``'s disagreement with its rack's fabric, or None. Judged on its
    rack's readings alone (one query), which decide it; only a flagged node's
    "rack its fabric says" needs the other racks, read then."""
    reports = _node_reports(_reported(Q(node__rack_id=node.rack_id), _cutoff(now, None)))
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
