"""Live events for the console, sent to the channel layer after commit.

Every rack carries a version (bumped in the same transaction as the change); a
rack event carries the rack's whole cell state at that version, so a client that
missed a message loses nothing by applying a later one, and one that sees a gap
or reconnects re-fetches the snapshot over REST. Group messages can be dropped:
nothing here is the only copy of anything. So the publishers run after commit
with ``robust=True``: one that fails (the channel layer or the database gone)
is logged and skipped, and never turns a committed change into an error for
the caller.

Message shapes (``type`` is the event kind):

* ``rack``: ``{"rack": id, "name", "version", "nodes": [[node_id, slot, hostname, state,
  [[health, job_id|null], ...]], ...], "jobs": {job_id: {"name", "tenant", "state", "color"}}}``
  (``color``: the job's palette slot in this rack, see ``fleet.palette``),
  ``"held": {node_id: action_id}``, the nodes held for a plan from its approval to its end,
  ``"fabric_degraded"``: why the rack's NVLink fabric is degraded ('' when it is not),
  ``"fabric_nodes"``: the host names of its nodes that report fabric trouble (degraded racks
  only), and ``"verdicts": {verdict: GPUs}``, how many of its GPUs a health rule gives each
  verdict
* ``job``: ``{"job": {"id", "name", "tenant", "state", "state_reason", "num_gpus"}}``
* ``action``: ``{"action": {"id", "kind", "state", "title", "progress", "step_index", "steps", "error",
  "job_tenants": {job_id: tenant_id}}}`` (a submitter gets other tenants' jobs withheld, see
  ``fleet.redact``)
"""

from __future__ import annotations

import copy
import logging
from collections import defaultdict
from collections.abc import Iterable

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction
from django.db.models import Count

from fleet import palette, read_cache, redact
from fleet.models import GPU, Action, Allocation, GpuReading, Job, Node, NodeHold, NodeReading, Rack

log = logging.getLogger(__name__)

GROUP = "fleet"


def _send(events: Iterable[dict]) -> None:
    """Publish ``events`` to the console's group, in one trip into the event loop
    (a pass that places 40 jobs sends some 80 events: one ``async_to_sync`` each
    took half of its time)."""
    layer = get_channel_layer()
    events = list(events)
    if layer is None or not events:
        return

    async def send_all() -> None:
        for event in events:
            try:
                await layer.group_send(GROUP, {"type": "fleet.event", "event": event})
            except Exception:  # the console re-fetches on reconnect; never fail the writer
                log.warning("could not publish %s event", event.get("type"), exc_info=True)

    try:
        async_to_sync(send_all)()
    except Exception:
        log.warning("could not publish %d events", len(events), exc_info=True)


def user_group(user_id: int) -> str:
    """The channel group of one user's live-feed sockets."""
    return f"user.{user_id}"


def session_group(session_key: str) -> str:
    """The channel group of one login session's live-feed sockets."""
    return f"session.{session_key}"


def tell_sockets(group: str, kind: str) -> None:
    """Send ``{"type": kind}`` to a group of live-feed sockets (now; callers
    inside a transaction send on commit)."""
    try:
        async_to_sync(get_channel_layer().group_send)(group, {"type": kind})
    except Exception:  # the channel layer down: the socket lives on until its next reconnect
        log.warning("could not tell %s of %s", group, kind, exc_info=True)


def rack_state(rack_ids: Iterable[int]) -> list[dict]:
    """The cell state of each rack, as sent in ``rack`` events and served by the
    console snapshot. A rack's ``jobs`` are the jobs holding GPUs in it.

    Reads plain rows (no model instances): this runs on every rack change and
    for the console's snapshot of the whole fleet."""

    ids = sorted(set(rack_ids))
    holder = dict(
        Allocation.objects.filter(released_at__isnull=True, gpu__node__rack_id__in=ids).values_list(
            "gpu_id", "job_id"
        )
    )
    jobs = {
        pk: {"name": name, "tenant": tenant, "state": state, "tenant_id": tenant_id}
        for pk, name, tenant, state, tenant_id in Job.objects.filter(pk__in=set(holder.values())).values_list(
            "pk", "name", "tenant__name", "state", "tenant_id"
        )
    }
    gpus: dict[int, list] = defaultdict(list)
    for gpu_id, node_id, health in (
        GPU.objects.filter(node__rack_id__in=ids)
        .order_by("node_id", "index")
        .values_list("id", "node_id", "health")
    ):
        gpus[node_id].append([health, holder.get(gpu_id)])
    held: dict[int, dict[str, int]] = defaultdict(dict)
    for node_id, rack_id, action_id in NodeHold.objects.filter(node__rack_id__in=ids).values_list(
        "node_id", "node__rack_id", "action_id"
    ):
        held[rack_id][str(node_id)] = action_id
    # A verdict changes its GPU's health in the same heartbeat, and so the rack's version.
    verdicts: dict[int, dict[str, int]] = defaultdict(dict)
    for rack_id, verdict, n in (
        GpuReading.objects.filter(gpu__node__rack_id__in=ids)
        .exclude(verdict="")
        .values_list("gpu__node__rack_id", "verdict")
        .annotate(n=Count("id"))
        .order_by()
    ):
        verdicts[rack_id][verdict] = n
    nodes: dict[int, list] = defaultdict(list)
    for node_id, rack_id, slot, hostname, state in (
        Node.objects.filter(rack_id__in=ids)
        .order_by("slot")
        .values_list("id", "rack_id", "slot", "hostname", "state")
    ):
        nodes[rack_id].append([node_id, slot, hostname, state, gpus[node_id]])
    racks = list(
        Rack.objects.filter(pk__in=ids).values("id", "name", "version", "spare_nodes", "fabric_degraded")
    )
    fabric_nodes: dict[int, list[str]] = defaultdict(list)
    if degraded := [r["id"] for r in racks if r["fabric_degraded"]]:
        for rack_id, hostname in (
            NodeReading.objects.filter(node__rack_id__in=degraded)
            .exclude(fabric_trouble="")
            .order_by("node__slot")
            .values_list("node__rack_id", "node__hostname")
        ):
            fabric_nodes[rack_id].append(hostname)
    out = []
    for rack in racks:
        # Colours are chosen per rack from this rack's cells alone, so a rack's
        # event and the snapshot always agree (fleet.palette).
        colors = palette.job_colors([[cell[1] for cell in node[4]] for node in nodes[rack["id"]]])
        out.append(
            {
                "type": "rack",
                "rack": rack["id"],
                "name": rack["name"],
                "version": rack["version"],
                "spare_nodes": rack["spare_nodes"],
                "nodes": nodes[rack["id"]],
                "jobs": {str(k): jobs[k] | {"color": colors[k]} for k in sorted(colors)},
                "held": held.get(rack["id"], {}),
                "fabric_degraded": rack["fabric_degraded"],
                "fabric_nodes": fabric_nodes.get(rack["id"], []),
                "verdicts": verdicts.get(rack["id"], {}),
            }
        )
    return out


def visible_to(event: dict, tenant_ids: set[int] | None) -> dict:
    """The event as a user sees it: ``tenant_ids`` None sees every tenant; else a
    job of another tenant shows only its id and state (as in the REST API). Used
    by the live feed and the console's REST snapshot alike."""
    if tenant_ids is None:
        return event
    event = copy.deepcopy(event)
    if event["type"] == "rack":
        for job in event["jobs"].values():
            if job["tenant_id"] not in tenant_ids:
                job["name"] = job["tenant"] = None
    elif event["type"] == "job" and event["job"]["tenant_id"] not in tenant_ids:
        event["job"] = {
            "id": event["job"]["id"],
            "state": event["job"]["state"],
            "name": None,
            "tenant": None,
        }
    elif event["type"] == "action":
        event["action"] = _visible_action(event["action"], tenant_ids)
    return event


def _visible_action(action: dict, tenant_ids: set[int]) -> dict:
    """An action event as fleet.redact rules it: in full when it touches no other
    tenant's job; only id, kind, state and progress when it touches none of the
    reader's; else with title and error withheld."""
    job_tenants = {int(k): v for k, v in action.get("job_tenants", {}).items()}
    foreign = redact.foreign_jobs(job_tenants, tenant_ids)
    if not foreign:
        return action
    if len(foreign) == len(job_tenants):
        keep = ("id", "kind", "state", "progress", "step_index", "steps")
        return {k: action[k] for k in keep} | {"title": None, "error": None, "job_tenants": {}}
    return action | {
        "title": redact.withheld_title(action["kind"], action["id"], job_tenants),
        "error": redact.WITHHELD if action["error"] else "",
        "job_tenants": {str(k): v for k, v in job_tenants.items() if k not in foreign},
    }


def _changed() -> None:
    """On commit, before the events go out: the read models' generation moves."""
    transaction.on_commit(read_cache.bump, robust=True)


def racks_changed(rack_ids: Iterable[int]) -> None:
    ids = set(rack_ids)
    if ids:
        _changed()
        transaction.on_commit(lambda: _send(rack_state(ids)), robust=True)


def job_state(job) -> dict:
    return {
        "id": job.pk,
        "name": job.name,
        "tenant": job.tenant.name,
        "tenant_id": job.tenant_id,
        "state": job.state,
        "state_reason": job.state_reason,
        "num_gpus": job.num_gpus,
        "num_nodes": job.num_nodes,
    }


def jobs_changed(job_ids: Iterable[int]) -> None:
    ids = set(job_ids)
    if not ids:
        return
    _changed()

    def publish() -> None:

        _send(
            {"type": "job", "job": job_state(job)}
            for job in Job.objects.select_related("tenant").filter(pk__in=ids)
        )

    transaction.on_commit(publish, robust=True)


def action_state(action) -> dict:
    return {
        "id": action.pk,
        "kind": action.kind,
        "state": action.state,
        "title": action.title,
        "progress": round(action.progress, 4),
        "step_index": action.step_index,
        "steps": len(action.steps),
        "error": action.error,
        # Who owns each job the action touches, for visible_to (like a rack's jobs).
        "job_tenants": {str(job.pk): job.tenant_id for job in action.jobs.all()},
    }


def actions_changed(action_ids: Iterable[int]) -> None:
    ids = set(action_ids)
    if not ids:
        return
    _changed()

    def publish() -> None:

        _send(
            {"type": "action", "action": action_state(action)}
            for action in Action.objects.filter(pk__in=ids).prefetch_related("jobs")
        )

    transaction.on_commit(publish, robust=True)
