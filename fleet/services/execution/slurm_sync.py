"""What Slurm says, applied to Rackwise through the usual services.

Called from :func:`fleet.services.execution.cluster_sync.sync` every
``RACKWISE_SLURM_SYNC_S`` when ``RACKWISE_CLUSTER=slurm`` (job ends are
``cluster_sync.sync_jobs``' business). Each function takes the adapter, so tests
and the integration call them directly; each is idempotent.

1. :func:`sync_nodes`: Slurm's node states onto Rackwise's nodes, through
   :mod:`fleet.services.nodes.moves` (so a node Slurm marks DOWN under a running job
   interrupts it and Rackwise's recovery swaps in a spare). The rule, with
   Rackwise's own states left alone:

   ================ ============== ============== ==================
   Rackwise \\ Slurm healthy        draining (DRAIN) failed (DOWN...)
   ================ ============== ============== ==================
   healthy          -              drain          fail
   suspect          - (heartbeats  drain          fail
                    own suspicion)
   draining/drained undrain        -              fail
   failed           return         -              -
   in_repair        - (an operator's, always)
   ================ ============== ============== ==================

   A node whose Rackwise state changed after Slurm was read is skipped this
   round: the read may predate a change Rackwise just mirrored into Slurm.
2. :func:`adopt_held_jobs`: held jobs in the managed partition that Rackwise
   does not know become Rackwise jobs of the tenant named as their Slurm
   account (``RACKWISE_SLURM_TENANT`` when no tenant has that name), so they
   count against that tenant's quota; the scheduler places them and the
   allocate/start steps pin and release them.
3. :func:`reconcile_jobs`: a Rackwise job that ended (cancelled, finished)
   while its Slurm job still runs or waits is scancelled.
4. :func:`sync_topology`: the live import (``import_topology --from
   slurm-live``), racks and nodes only: states are :func:`sync_nodes`' business.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import replace
from datetime import timedelta
from typing import TypedDict

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from fleet.choices import FINISHED_JOB_STATES, Locality, NodeState, Role
from fleet.cluster.base import (
    JOB_ENDED,
    NODE_DRAINING,
    NODE_FAILED,
    NODE_HEALTHY,
    ClusterUnavailable,
    StepFailed,
)
from fleet.models import Job, Node, Rack, Tenant
from fleet.services.errors import ServiceError
from fleet.services.intake.topology import import_topology
from fleet.services.jobs import submit as job_services
from fleet.services.nodes import moves as node_services
from fleet.services.users import ensure_user

log = logging.getLogger(__name__)

SERVICE_USER = "slurm-sync"
_DRAINED = (NodeState.DRAINING, NodeState.DRAINED)


class _Shape(TypedDict, total=False):
    """The size of an adopted job, as JobSpec takes it."""

    num_gpus: int
    num_nodes: int
    gpus_per_node: int


# (Rackwise state, Slurm state) -> the node service to call; absent: nothing.
_RULES: dict[tuple[str, str], str] = {
    (NodeState.HEALTHY, NODE_DRAINING): "drain",
    (NodeState.HEALTHY, NODE_FAILED): "fail",
    (NodeState.SUSPECT, NODE_DRAINING): "drain",
    (NodeState.SUSPECT, NODE_FAILED): "fail",
    (NodeState.DRAINING, NODE_HEALTHY): "undrain",
    (NodeState.DRAINING, NODE_FAILED): "fail",
    (NodeState.DRAINED, NODE_HEALTHY): "undrain",
    (NodeState.DRAINED, NODE_FAILED): "fail",
    (NodeState.FAILED, NODE_HEALTHY): "return",
}


def node_change(rackwise_state: str, slurm_state: str) -> str | None:
    """The node service that brings Rackwise in line with Slurm (the table of
    the module docstring): ``drain``, ``undrain``, ``fail``, ``return`` or None."""
    return _RULES.get((rackwise_state, slurm_state))


def sync_nodes(adapter) -> dict[str, list[str]]:
    """Apply ``adapter.node_states()`` to Rackwise's nodes (see the module
    docstring). Returns the hostnames changed, by the service called."""
    read_at = timezone.now()
    reports = adapter.node_states()
    changed: dict[str, list[str]] = {"drain": [], "undrain": [], "fail": [], "return": []}
    if not reports:
        return changed
    services = {
        "drain": node_services.drain_node,
        "undrain": node_services.undrain_node,
        "fail": node_services.mark_node_failed,
        "return": node_services.return_node_to_service,
    }
    for node in Node.objects.filter(hostname__in=list(reports)).order_by("pk"):
        report = reports[node.hostname]
        change = node_change(node.state, report.state)
        if change is None or node.state_changed_at >= read_at:
            continue
        if change in ("undrain", "return"):
            reason = "returned to service in Slurm"
        else:
            reason = f"Slurm {report.state}: {report.reason}" if report.reason else f"{report.state} in Slurm"
        try:
            # mirror=False: Slurm already has this state.
            services[change](None, node.pk, reason[:250], mirror=False)
        except ServiceError as exc:  # changed meanwhile (a Conflict): the next sync sees it
            log.info("slurm sync: %s %s skipped: %s", change, node.hostname, exc)
            continue
        changed[change].append(node.hostname)
    return changed


def service_user(tenant: str | None = None):
    """The user adopted jobs belong to: a submitter of ``tenant`` (by default
    ``RACKWISE_SLURM_TENANT``), made a member of it when it is not yet."""
    tenant = tenant or settings.RACKWISE_SLURM_TENANT
    found = get_user_model().objects.filter(username=SERVICE_USER, tenants__name=tenant).first()
    if found is not None:
        return found
    return ensure_user(None, SERVICE_USER, role=Role.SUBMITTER, tenants=[tenant], issue_token=False)[0]


def tenant_of_account(account: str, known: set[str]) -> str:
    """Slurm accounts are tenants: an adopted job's tenant is the Rackwise
    tenant named as its Slurm account, else ``RACKWISE_SLURM_TENANT`` (an
    account no tenant is named after makes no tenant of its own)."""
    return account if account in known else settings.RACKWISE_SLURM_TENANT


def _default_gpus_per_node() -> int:
    counts = Counter(Rack.objects.values_list("gpus_per_node", flat=True))
    return counts.most_common(1)[0][0] if counts else 4


def adopt_held_jobs(adapter) -> list[int]:
    """Held jobs in the managed partition that Rackwise does not know become
    Rackwise jobs (idempotent by external id, and by the submission key
    ``slurm:<id>``). Shape: the Slurm job's node count and GPUs per node; one
    node with fewer GPUs than a node has is a sub-node job. Returns the new jobs' ids."""
    held = adapter.adoptable_jobs()
    if not held:
        return []
    known = set(
        Job.objects.filter(external_id__in=[r.external_id for r in held]).values_list(
            "external_id", flat=True
        )
    )
    fresh = [r for r in held if r.external_id not in known]
    if not fresh:
        return []
    node_size = _default_gpus_per_node()
    accounts = {str(r.extra.get("account") or "") for r in fresh}
    tenants = set(Tenant.objects.filter(name__in=accounts).values_list("name", flat=True))
    adopted = []
    for report in fresh:
        tenant = tenant_of_account(str(report.extra.get("account") or ""), tenants)
        actor = service_user(tenant)
        nodes = report.num_nodes or 1
        per_node = report.gpus_per_node or node_size
        shape: _Shape
        if nodes == 1 and per_node < node_size:
            shape = {"num_gpus": per_node}
        else:
            shape = {"num_nodes": nodes, "gpus_per_node": per_node}
        spec = job_services.JobSpec(
            name=(report.name or f"slurm-{report.external_id}")[:200],
            tenant=tenant,
            locality=Locality.REQUIRED,
            idempotency_key=f"slurm:{report.external_id}",
            **shape,
        )
        try:
            # One transaction: the job exists with its Slurm id or not at all,
            # and the scheduling pass it asks for runs after both are written.
            with transaction.atomic():
                job, created = job_services.submit_job_once(actor, spec)
                if created:
                    Job.objects.filter(pk=job.pk).update(
                        external_id=report.external_id,
                        cluster_spec={
                            "slurm": {
                                "adopted": True,
                                "job_id": report.external_id,
                                "user": report.user,
                                "account": report.extra.get("account", ""),
                                "partition": report.extra.get("partition", ""),
                            }
                        },
                    )
        except ServiceError as exc:
            log.warning("slurm job %s not adopted: %s", report.external_id, exc)
            continue
        if created:
            log.info("slurm job %s adopted as job #%s", report.external_id, job.pk)
            adopted.append(job.pk)
    return adopted


def reconcile_jobs(adapter, *, within: timedelta = timedelta(days=1)) -> list[int]:
    """Rackwise jobs that ended (within ``within``) whose Slurm job still
    lives are scancelled. Returns those jobs' ids."""
    since = timezone.now() - within
    ended = list(
        Job.objects.filter(
            state__in=FINISHED_JOB_STATES, external_id__isnull=False, finished_at__gte=since
        ).only("pk", "external_id", "cluster_spec", "attempt")
    )
    if not ended:
        return []
    reports = adapter.job_states(ended, listed_only=True)
    cancelled = []
    for job in ended:
        report = reports.get(job.pk)
        if report is not None and report.state not in JOB_ENDED:
            adapter.cancel(job)
            cancelled.append(job.pk)
    return cancelled


def sync_topology(adapter) -> dict[str, object]:
    """Racks (Slurm blocks) and nodes of the running Slurm into Rackwise,
    through the topology import service, with node states left out (so the
    rules of :func:`sync_nodes` hold). Returns the import's report; a Slurm
    answer that would shrink the fleet too much is refused and reported."""
    topology = adapter.topology(max_gpus=settings.RACKWISE_TOPOLOGY_MAX_GPUS_PER_NODE)
    for domain in topology.domains:
        domain.nodes = [replace(n, state=None, reason="") for n in domain.nodes]
    try:
        report = import_topology(None, topology)
    except ServiceError as exc:
        log.warning("slurm sync: topology not imported: %s", exc)
        return {"error": str(exc)}
    return report.as_dict() if report.changed else {"changed": False}


def sync(adapter, *, topology: bool = True) -> dict[str, object]:
    """All of the above, in order (topology first, so new nodes get their
    states); what each did. Slurm unreachable: ``{"error": ...}``, nothing
    changed by the part that could not read."""
    out: dict[str, object] = {}
    try:
        if topology:
            out["topology"] = sync_topology(adapter)
        out["nodes"] = sync_nodes(adapter)
        out["adopted"] = adopt_held_jobs(adapter)
        out["scancelled"] = reconcile_jobs(adapter)
    except (ClusterUnavailable, StepFailed) as exc:
        log.warning("slurm sync stopped: %s", exc)
        out["error"] = str(exc)
    return out
