"""Creating racks with their nodes and GPUs (demo seed, and fleet imports later)."""

from __future__ import annotations

from django.db import transaction

from fleet import events
from fleet.choices import RACK_KIND_DEFAULTS, RackKind
from fleet.models import GPU, Node, Rack
from fleet.services import audit
from fleet.services.errors import Conflict, InvalidInput
from fleet.services.racks import change_stamp


def create_rack(
    actor,
    *,
    name: str,
    kind: str = RackKind.NVL72,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    spare_nodes: int | None = None,
    external_id: str = "",
    site: str = "",
    row: str = "",
    position: int | None = None,
    hostname_prefix: str | None = None,
) -> Rack:
    """Create a rack with ``nodes`` trays of ``gpus_per_node`` GPUs (defaults from
    the kind). Raises Conflict if the name is taken."""
    default_nodes, default_gpn, default_spares = RACK_KIND_DEFAULTS.get(kind, (None, None, 0))
    nodes = nodes if nodes is not None else default_nodes
    gpus_per_node = gpus_per_node if gpus_per_node is not None else default_gpn
    if kind not in RackKind.values:
        raise InvalidInput(
            {"kind": [f"unknown rack kind {kind!r}; use one of: {', '.join(RackKind.values)}"]}
        )
    if not nodes or not gpus_per_node or nodes < 1 or gpus_per_node < 1:
        raise InvalidInput("a custom rack needs positive nodes and gpus_per_node")
    spare_nodes = default_spares if spare_nodes is None else spare_nodes
    if spare_nodes >= nodes and spare_nodes:
        raise InvalidInput(
            {"spare_nodes": [f"{spare_nodes} spares leave nothing to schedule in a rack of {nodes} nodes"]}
        )
    prefix = hostname_prefix or name
    with transaction.atomic():
        if Rack.objects.filter(name=name).exists():
            raise Conflict(f"a rack named {name!r} already exists")
        rack = Rack.objects.create(
            name=name,
            kind=kind,
            nodes_per_domain=nodes,
            gpus_per_node=gpus_per_node,
            spare_nodes=spare_nodes,
            external_id=external_id,
            site=site,
            row=row,
            position=position,
            # Stamped like a change, so a console's ?since= brings the new rack.
            changed_xid=change_stamp(),
        )
        rack.refresh_from_db(fields=["changed_xid"])
        created = Node.objects.bulk_create(
            Node(rack=rack, slot=slot, hostname=f"{prefix}-n{slot:02d}") for slot in range(nodes)
        )
        GPU.objects.bulk_create(GPU(node=node, index=i) for node in created for i in range(gpus_per_node))
        audit.record(
            actor,
            "rack.create",
            rack,
            after={"kind": kind, "nodes": nodes, "gpus_per_node": gpus_per_node, "spare_nodes": spare_nodes},
        )
        # A new rack is a change like any other: consoles get it live, and the read
        # models (summary, fragmentation) stop serving the fleet without it.
        events.racks_changed([rack.pk])
    return rack
