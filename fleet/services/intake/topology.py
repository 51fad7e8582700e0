"""Importing a fleet's topology (from Kubernetes or Slurm, see ``fleet.topology``).

``import_topology`` compares what the source says with the database and returns
a report of the differences; unless it is a dry run it applies them in one
transaction. Steps:

1. Lock every node, then every rack (nodes before racks, as every service does,
   so an import never waits on a node service in a cycle), and plan again on the
   locked rows, so the report matches what is written.
2. Create the racks the source has and the database does not.
3. Fail busy nodes that change rack (their jobs recover elsewhere), then give
   every node its rack and slot (slots in natural hostname order), create the
   new nodes with their GPUs, and fix GPU counts.
4. Reshape each rack (nodes, GPUs per node, kind, spares).
5. Apply the source's node states through the node services (drain, undrain,
   mark failed, return to service), so jobs recover and versions and events
   move as for any other change.
6. Nodes the source no longer has: delete those that never held a job; mark the
   others failed ("absent from <source> import"), so their history stays.
   Racks left without nodes go. A partial source (agents: only the nodes that
   reported) removes and retires nothing: the nodes it does not list stay in
   their racks, and only racks it matches or takes nodes from are reshaped.
7. Audit each rack touched, bump versions, and ask for a scheduling pass.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count

from fleet import dispatch
from fleet.choices import FAILED_NODE_STATES, RACK_KIND_DEFAULTS, NodeState, RackKind
from fleet.models import GPU, Allocation, Node, Rack
from fleet.services import audit
from fleet.services.errors import Conflict
from fleet.services.nodes.moves import drain_node, mark_node_failed, return_node_to_service, undrain_node
from fleet.services.racks import bump_versions
from fleet.topology.model import DRAINING, FAILED, HEALTHY, DesiredDomain, DesiredNode, Topology, natural_key
from fleet.topology.slurm import block_name, block_sizes_for, render_topology_conf

# Far above any real slot: nodes that change place park here first, so no two
# rows ever share a (rack, slot) while slots are reassigned.
_PARKING_SLOT = 16000
_DRAINED = (NodeState.DRAINING, NodeState.DRAINED)


@dataclass
class ImportReport:
    """What an import changed (or, for a dry run, would change)."""

    source: str
    dry_run: bool
    racks_added: list[str] = field(default_factory=list)
    racks_removed: list[str] = field(default_factory=list)
    racks_reshaped: list[str] = field(default_factory=list)
    racks_keyed: list[str] = field(default_factory=list)
    nodes_added: list[str] = field(default_factory=list)
    nodes_removed: list[str] = field(default_factory=list)
    nodes_retired: list[str] = field(default_factory=list)
    nodes_moved: list[str] = field(default_factory=list)
    state_changes: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    racks: int = 0
    nodes: int = 0

    @property
    def changed(self) -> bool:
        return any(
            (
                self.racks_added,
                self.racks_removed,
                self.racks_reshaped,
                self.racks_keyed,
                self.nodes_added,
                self.nodes_removed,
                self.nodes_retired,
                self.nodes_moved,
                self.state_changes,
            )
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"changed": self.changed}

    def lines(self) -> list[str]:
        """A readable summary, one change a line."""
        verb = "would change" if self.dry_run else "changed"
        head = f"{self.source} import: {self.racks} racks, {self.nodes} nodes in the source"
        sections = [
            ("racks added", self.racks_added),
            ("racks removed", self.racks_removed),
            ("racks reshaped", self.racks_reshaped),
            ("racks given the source's id", self.racks_keyed),
            ("nodes added", self.nodes_added),
            ("nodes removed (never ran a job)", self.nodes_removed),
            (
                "nodes retired (absent from the source; marked failed, kept for their history)",
                self.nodes_retired,
            ),
            ("nodes moved", self.nodes_moved),
            ("state changes", self.state_changes),
            ("skipped", self.skipped),
        ]
        out = [head, *self.notes]
        for title, items in sections:
            if items:
                out.append(f"{title} ({len(items)}):")
                out.extend(f"  {item}" for item in items)
        out.append(
            f"dry run: nothing written; this import {verb} the fleet"
            if self.dry_run and self.changed
            else "no changes"
            if not self.changed
            else "applied"
        )
        return out


@dataclass
class _RackPlan:
    domain: DesiredDomain | None
    rack: Rack | None  # None: to create
    name: str
    external_id: str
    gpus_per_node: int
    hosts: list[str] = field(default_factory=list)  # final slot order

    @property
    def saved_rack(self) -> Rack:
        """The rack, once _apply has created those to create (its step 2)."""
        assert self.rack is not None
        return self.rack


@dataclass
class _Plan:
    racks: list[_RackPlan]
    desired: dict[str, tuple[DesiredNode, _RackPlan]]
    nodes: dict[str, Node]
    gpu_counts: dict[int, int]
    ever_allocated: set[int]
    busy: set[int]
    absent: list[Node]
    orphan_racks: list[Rack]


def kind_for(nodes: int, gpus_per_node: int) -> str:
    for kind, (n, g, _) in RACK_KIND_DEFAULTS.items():
        if (n, g) == (nodes, gpus_per_node):
            return kind
    return RackKind.CUSTOM


def default_spares(kind: str, nodes: int) -> int:
    """The kind's spares (2 of 18 for NVL72, 0 for HGX); other shapes keep the same
    share, one spare per 9 nodes, always leaving a node to schedule."""
    spares = RACK_KIND_DEFAULTS[kind][2] if kind in RACK_KIND_DEFAULTS else nodes // 9
    return min(spares, max(nodes - 1, 0))


def _plan(topology: Topology, default_gpus: int, lock: bool) -> _Plan:
    node_qs = Node.objects.select_related("rack").order_by("id")
    rack_qs = Rack.objects.order_by("id")
    if lock:
        # of=self: lock the node rows here and the racks just after, nodes first.
        node_qs, rack_qs = node_qs.select_for_update(of=("self",)), rack_qs.select_for_update()
    nodes = {n.hostname: n for n in node_qs}
    racks = list(rack_qs)
    by_external = {r.external_id: r for r in racks if r.external_id}
    by_name = {r.name: r for r in racks}
    gpu_counts: dict[int, int] = defaultdict(int)
    gpu_counts.update(GPU.objects.values("node_id").annotate(n=Count("id")).values_list("node_id", "n"))
    ever_allocated = set(Allocation.objects.values_list("gpu__node_id", flat=True).distinct())
    busy = set(
        Allocation.objects.filter(released_at__isnull=True).values_list("gpu__node_id", flat=True).distinct()
    )

    plans: list[_RackPlan] = []
    desired: dict[str, tuple[DesiredNode, _RackPlan]] = {}
    matched: set[int] = set()
    for domain in topology.domains:
        rack = by_external.get(domain.external_id)
        if rack is None:
            rack = by_name.get(domain.name)
            if rack is not None and rack.external_id and domain.name != domain.external_id:
                # A name derived from hostnames is taken by another domain: use the id.
                domain.name, rack = domain.external_id, by_name.get(domain.external_id)
            if rack is not None and rack.external_id:
                raise Conflict(
                    f"the {topology.source} domain {domain.external_id} would be rack {domain.name}, "
                    f"but that name belongs to the rack of {rack.external_id}; rename that rack first"
                )
        if rack is not None:
            matched.add(rack.pk)
        gpus = domain.gpus_per_node or (rack.gpus_per_node if rack else None) or default_gpus
        plan = _RackPlan(domain, rack, rack.name if rack else domain.name[:100], domain.external_id, gpus)
        plan.hosts = [n.hostname for n in domain.nodes]
        plans.append(plan)
        for wanted in domain.nodes:
            desired[wanted.hostname] = (wanted, plan)
    absent = [n for h, n in nodes.items() if h not in desired]
    kept: list[Node] = []
    unmatched = [r for r in racks if r.pk not in matched]
    if topology.partial:
        # The source sees only some nodes: the others stay where they are, and of
        # the racks it does not match only those it takes nodes from are planned.
        kept, absent = absent, []
        losing = {
            nodes[h].rack_id
            for h, (_, p) in desired.items()
            if h in nodes and (p.rack is None or nodes[h].rack_id != p.rack.pk)
        }
        unmatched = [r for r in unmatched if r.pk in losing]
    # Retired nodes stay in their rack, after the source's nodes.
    plan_of_rack = {p.rack.pk: p for p in plans if p.rack is not None}
    orphans: list[Rack] = []
    for rack in unmatched:
        plan_of_rack[rack.pk] = _RackPlan(None, rack, rack.name, rack.external_id, rack.gpus_per_node)
        orphans.append(rack)
    for node in sorted(absent, key=lambda n: natural_key(n.hostname)):
        if node.pk in ever_allocated:
            plan_of_rack[node.rack_id].hosts.append(node.hostname)
    # Kept nodes of a planned rack stay in it: among the source's nodes in natural
    # order where the source matches the rack, else in their slot order.
    for node in sorted(kept, key=lambda n: n.slot):
        if node.rack_id in plan_of_rack:
            plan_of_rack[node.rack_id].hosts.append(node.hostname)
    if kept:
        for p in plans:
            p.hosts.sort(key=natural_key)
    plans += [plan_of_rack[r.pk] for r in orphans]
    return _Plan(plans, desired, nodes, gpu_counts, ever_allocated, busy, absent, orphans)


def _state_step(current: str, want: str | None) -> list[str]:
    """The node services to call, in order, to bring ``current`` to ``want``.
    A suspect node the source calls healthy stays suspect: suspicion comes from
    Rackwise's own heartbeats, which see more than a Ready flag."""
    if want is None or want == current:
        return []
    if want == HEALTHY:
        return ["undrain"] if current in _DRAINED else ["return"] if current in FAILED_NODE_STATES else []
    if want == DRAINING:
        if current in _DRAINED:
            return []
        return ["return", "drain"] if current in FAILED_NODE_STATES else ["drain"]
    if want == FAILED:
        return [] if current in FAILED_NODE_STATES else ["fail"]
    raise ValueError(f"unknown state {want!r}")


_RESULT = {"undrain": HEALTHY, "return": HEALTHY, "drain": DRAINING, "fail": FAILED}


def _report(topology: Topology, plan: _Plan, dry_run: bool) -> ImportReport:
    report = ImportReport(topology.source, dry_run, racks=len(topology.domains), nodes=len(plan.desired))
    report.skipped = [f"{host}: {why}" for host, why in topology.skipped]
    report.notes = list(topology.notes)
    for p in plan.racks:
        if p.rack is None:
            source_id = f"{p.external_id}, " if p.external_id != p.name else ""
            report.racks_added.append(f"{p.name} ({source_id}{len(p.hosts)} x {p.gpus_per_node} GPUs)")
            continue
        shape = (len(p.hosts), p.gpus_per_node)
        if p.hosts and shape != (p.rack.nodes_per_domain, p.rack.gpus_per_node):
            report.racks_reshaped.append(
                f"{p.name}: {p.rack.nodes_per_domain} x {p.rack.gpus_per_node} GPUs "
                f"-> {shape[0]} x {shape[1]} GPUs"
            )
        if p.domain is None and not p.hosts:
            report.racks_removed.append(p.name)
        elif p.domain is not None and p.external_id != p.rack.external_id:
            # A rack matched by its name takes the source's id (written with its shape).
            report.racks_keyed.append(f"{p.name}: {p.rack.external_id or 'none'} -> {p.external_id}")
    for host, (want, p) in plan.desired.items():
        node = plan.nodes.get(host)
        if node is None:
            report.nodes_added.append(
                f"{host} in {p.name}" + (f" ({want.state})" if want.state not in (None, HEALTHY) else "")
            )
            continue
        moving = p.rack is None or node.rack_id != p.rack.pk
        if moving:
            failing = node.pk in plan.busy and node.state not in FAILED_NODE_STATES
            note = " (held jobs: marked failed, they recover elsewhere)" if failing else ""
            report.nodes_moved.append(f"{host}: {node.rack.name} -> {p.name}{note}")
            if node.pk in plan.busy:
                continue
        steps = _state_step(node.state, want.state)
        if steps:
            why = f" ({want.reason})" if want.reason else ""
            report.state_changes.append(f"{host}: {node.state} -> {_RESULT[steps[-1]]}{why}")
    for node in plan.absent:
        if node.pk not in plan.ever_allocated:
            report.nodes_removed.append(f"{node.hostname} (was in {node.rack.name})")
        elif node.state not in FAILED_NODE_STATES:
            report.nodes_retired.append(f"{node.hostname} in {node.rack.name}: {node.state} -> failed")
    return report


def plan_import(topology: Topology, *, default_gpus: int = 4) -> ImportReport:
    """The report of what importing ``topology`` would change; writes nothing."""
    return _report(topology, _plan(topology, default_gpus, lock=False), dry_run=True)


def _check_shrink(report: ImportReport, fleet_nodes: int, allow_shrink: bool) -> None:
    """Refuse an import that would remove or retire more than
    ``RACKWISE_TOPOLOGY_MAX_SHRINK`` of the fleet's nodes, unless allowed: a
    source that lists a fraction of the fleet (a wrong context, a label
    selector, one node reporting 5,000 GPUs) is far more likely a mistake than
    a decommission, and a retired node's jobs are interrupted."""
    gone = len(report.nodes_removed) + len(report.nodes_retired)
    share = settings.RACKWISE_TOPOLOGY_MAX_SHRINK
    if allow_shrink or not fleet_nodes or gone <= share * fleet_nodes:
        return
    raise Conflict(
        f"this {report.source} import would remove or retire {gone} of the fleet's {fleet_nodes} nodes "
        f"({gone / fleet_nodes:.0%}), more than RACKWISE_TOPOLOGY_MAX_SHRINK ({share:.0%}); check the "
        "source, or pass --allow-shrink if the fleet really shrinks"
    )


def import_topology(
    actor,
    topology: Topology,
    *,
    dry_run: bool = False,
    default_gpus: int = 4,
    allow_shrink: bool = False,
) -> ImportReport:
    """Make the database match ``topology`` (see the module docstring) and return
    what changed. ``default_gpus`` is the GPU count of new nodes whose source does
    not say (a Slurm topology.conf read without scontrol output). An import that
    would remove or retire more than ``RACKWISE_TOPOLOGY_MAX_SHRINK`` of the
    fleet's nodes raises Conflict unless ``allow_shrink`` (a dry run too, so it
    shows what the real import would do)."""
    if not topology.domains and not topology.partial and Node.objects.exists():
        # An empty answer (a wrong context, a label selector, a truncated file) would
        # retire the whole fleet: far more likely a mistake than a decommission.
        raise Conflict(
            f"the {topology.source} source lists no GPU nodes; importing it would remove or retire "
            "every node. Check the file or the kubeconfig context"
        )
    if dry_run:
        plan = _plan(topology, default_gpus, lock=False)
        report = _report(topology, plan, dry_run=True)
        _check_shrink(report, len(plan.nodes), allow_shrink)
        return report
    with transaction.atomic():
        plan = _plan(topology, default_gpus, lock=True)
        report = _report(topology, plan, dry_run=False)
        _check_shrink(report, len(plan.nodes), allow_shrink)
        if report.changed:
            _apply(actor, topology, plan)
    return report


def _apply(actor, topology: Topology, plan: _Plan) -> None:
    source = topology.source
    before = _rack_snapshots([p.rack.pk for p in plan.racks if p.rack is not None])
    # 2. New racks, created at their final shape (the spares check needs it).
    for p in plan.racks:
        if p.rack is None:
            kind = kind_for(len(p.hosts), p.gpus_per_node)
            p.rack = Rack.objects.create(
                name=p.name,
                external_id=p.external_id,
                kind=kind,
                nodes_per_domain=len(p.hosts),
                gpus_per_node=p.gpus_per_node,
                spare_nodes=default_spares(kind, len(p.hosts)),
            )
    # Nodes gone from the source that never held a job go first: they free their slots.
    for node in plan.absent:
        if node.pk not in plan.ever_allocated:
            node.delete()
    # 3. Busy nodes that change rack fail first: their jobs must not span racks silently.
    held_back: set[str] = set()
    for host, (_, p) in plan.desired.items():
        existing = plan.nodes.get(host)
        if existing is not None and existing.rack_id != p.saved_rack.pk and existing.pk in plan.busy:
            if existing.state not in FAILED_NODE_STATES:
                mark_node_failed(
                    actor, existing.pk, f"moved from {existing.rack.name} to {p.name} by {source} import"
                )
            held_back.add(host)
    moves: list[Node] = []
    final: dict[str, tuple[int, int]] = {}
    for p in plan.racks:
        for slot, host in enumerate(p.hosts):
            final[host] = (p.saved_rack.pk, slot)
    for host, (rack_id, slot) in final.items():
        existing = plan.nodes.get(host)
        if existing is not None and (existing.rack_id, existing.slot) != (rack_id, slot):
            existing.rack_id, existing.slot = rack_id, _PARKING_SLOT + slot
            moves.append(existing)
    if moves:
        Node.objects.bulk_update(moves, ["rack", "slot"])
        for node in moves:
            node.slot = final[node.hostname][1]
        Node.objects.bulk_update(moves, ["slot"])
    created = Node.objects.bulk_create(
        Node(rack_id=final[h][0], slot=final[h][1], hostname=h) for h in plan.desired if h not in plan.nodes
    )
    gpn = {p.saved_rack.pk: p.gpus_per_node for p in plan.racks}
    GPU.objects.bulk_create(GPU(node=n, index=i) for n in created for i in range(gpn[n.rack_id]))
    for host in plan.desired:
        existing = plan.nodes.get(host)
        if existing is not None:
            _fix_gpu_count(existing, plan.gpu_counts[existing.pk], gpn[final[host][0]])
    # 4. Rack shapes.
    for p in plan.racks:
        if p.hosts:
            _reshape(p.saved_rack, len(p.hosts), p.gpus_per_node, p.external_id)
    # 5. States, through the node services.
    ids = {n.hostname: n.pk for n in created} | {h: n.pk for h, n in plan.nodes.items()}
    for host, (want, _) in plan.desired.items():
        if host in held_back:
            continue
        current = plan.nodes[host].state if host in plan.nodes else NodeState.HEALTHY
        for step in _state_step(current, want.state):
            reason = want.reason or f"{want.state} in {source}"
            {
                "undrain": undrain_node,
                "return": return_node_to_service,
                "drain": drain_node,
                "fail": mark_node_failed,
            }[step](actor, ids[host], f"{source} import: {reason}")
    # 6. Nodes the source no longer has but that ran jobs: retired, kept for their history.
    for node in plan.absent:
        if node.pk in plan.ever_allocated and node.state not in FAILED_NODE_STATES:
            mark_node_failed(actor, node.pk, f"absent from {source} import")
    entries = []
    after_all = _rack_snapshots([p.saved_rack.pk for p in plan.racks if p.hosts])
    for p in plan.racks:
        after = after_all.get(p.saved_rack.pk)
        if before.get(p.saved_rack.pk) != after:
            entries.append((p.saved_rack, before.get(p.saved_rack.pk), after, f"{source} import"))
    if entries:
        audit.record_many(actor, "rack.import", entries)
    touched = [p.saved_rack.pk for p in plan.racks if p.hosts]
    for p in plan.racks:
        if not p.hosts:
            Rack.objects.filter(pk=p.saved_rack.pk).delete()
    bump_versions(touched)
    dispatch.schedule_soon()


def _rack_snapshots(rack_ids: list[int]) -> dict[int, dict[str, Any]]:
    """Each rack's shape and hosts, for its audit record (two queries in all)."""
    hosts: dict[int, list[str]] = defaultdict(list)
    for rack_id, hostname in (
        Node.objects.filter(rack_id__in=rack_ids).order_by("slot").values_list("rack_id", "hostname")
    ):
        hosts[rack_id].append(hostname)
    fields = ("name", "external_id", "kind", "nodes_per_domain", "gpus_per_node", "spare_nodes")
    return {
        row["id"]: {**{f: row[f] for f in fields}, "hosts": hosts[row["id"]]}
        for row in Rack.objects.filter(pk__in=rack_ids).values("id", *fields)
    }


def _reshape(rack: Rack, nodes: int, gpus_per_node: int, external_id: str) -> None:
    kind = kind_for(nodes, gpus_per_node)
    spares = rack.spare_nodes
    # An operator's spare count survives re-imports while the shape holds.
    if kind != rack.kind or (spares and spares >= nodes):
        spares = default_spares(kind, nodes)
    Rack.objects.filter(pk=rack.pk).update(
        nodes_per_domain=nodes,
        gpus_per_node=gpus_per_node,
        kind=kind,
        spare_nodes=spares,
        external_id=external_id,
    )


def _fix_gpu_count(node: Node, have: int, want: int) -> None:
    if have < want:
        GPU.objects.bulk_create(GPU(node=node, index=i) for i in range(have, want))
    elif have > want:
        extra = GPU.objects.filter(node=node, index__gte=want)
        if Allocation.objects.filter(gpu__in=extra).exists():
            raise Conflict(
                f"{node.hostname} would lose GPUs {want}-{have - 1}, which have held jobs; "
                "retire the node instead (mark it failed) and import again"
            )
        extra.delete()


@dataclass
class SlurmExport:
    """A ``topology.conf`` for ``topology/block`` and how it was made."""

    text: str
    blocks: list[tuple[str, list[str]]]
    block_sizes: list[int]
    left_out: list[str]


def export_slurm_topology(*, base_block: int | None = None) -> SlurmExport:
    """Rackwise's view of the fleet as Slurm blocks: one block per multi-node rack
    with its healthy nodes (failed, draining and suspect nodes are left out, so
    Slurm places nothing new on them), and ``BlockSizes`` whose base is the slice
    size (nodes minus spares: 16 for an NVL72), so Slurm plans big jobs in
    16-node slices and the rack's other healthy nodes stay free for small jobs and
    for replacing a failed node, as Rackwise does.

    Slurm refuses a block smaller than the base size, so a rack with fewer
    healthy nodes than that is left out (said in ``left_out`` and in a comment),
    and so are single-node NVLink domains (HGX), which a block cannot help.
    ``base_block`` overrides the base size. Raises Conflict when no rack is left."""
    racks = list(Rack.objects.order_by("site", "row", "position", "name"))
    healthy: dict[int, list[str]] = defaultdict(list)
    counts: dict[int, int] = defaultdict(int)
    for rack_id, hostname, state in Node.objects.values_list("rack_id", "hostname", "state"):
        counts[rack_id] += 1
        if state == NodeState.HEALTHY:
            healthy[rack_id].append(hostname)
    multi = [r for r in racks if counts[r.pk] > 1]
    single = [r for r in racks if counts[r.pk] == 1]
    slices = Counter(max(1, min(r.nodes_per_domain, counts[r.pk]) - r.spare_nodes) for r in multi)
    # The slice size of most racks (the larger on a tie), not the smallest: Slurm
    # splits a job into base blocks, so an 8-node base would spread a 16-node job
    # over two NVL72 racks.
    base = base_block or max(slices, key=lambda size: (slices[size], size), default=1)
    blocks: list[tuple[str, list[str]]] = []
    left_out: list[str] = []
    used: set[str] = set()
    for rack in multi:
        hosts = sorted(healthy[rack.pk], key=natural_key)
        if len(hosts) < base:
            left_out.append(f"{rack.name}: {len(hosts)} healthy nodes, fewer than the base block size {base}")
        else:
            blocks.append((block_name(rack.name, used), hosts))
    if single:
        left_out.append(
            f"{len(single)} single-node NVLink domains (HGX): "
            + ", ".join(r.name for r in single[:10])
            + (" ..." if len(single) > 10 else "")
        )
    if not blocks:
        raise Conflict("no rack has a block's worth of healthy nodes; there is nothing to write")
    sizes = block_sizes_for(base, len(blocks))
    comments = [
        (
            "topology.conf for TopologyPlugin=topology/block, "
            "written by Rackwise (manage.py export_slurm_topology)."
        ),
        "One block per NVLink domain (rack) with its healthy nodes; BlockSizes starts at the slice size,",
        "so Slurm plans big jobs in slices and each rack's other nodes stay spare.",
        *(f"left out: {line}" for line in left_out),
        "",
    ]
    return SlurmExport(render_topology_conf(blocks, sizes, comments), blocks, sizes, left_out)
