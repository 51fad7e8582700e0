"""Jobs on GPUs: the only writer of ``Allocation`` rows. Placing jobs (the
actions' allocate steps), starting them, swapping a node, requeueing, finishing
and releasing, each a move of the job lifecycle (``jobs.lifecycle``) with its
allocation rows in the same transaction; and reading where a job runs
(:func:`placement_of`: the rows, with what the engine decided)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime

from django.db import IntegrityError, connection, transaction
from django.db.models import OuterRef, Q, QuerySet, Subquery
from django.utils import timezone

from fleet import steps as st
from fleet.choices import HOLDING_JOB_STATES, JobState, NodeState
from fleet.models import GPU, Allocation, Job, Node
from fleet.services import audit, webhooks
from fleet.services.errors import Conflict
from fleet.services.jobs import lifecycle as job_lifecycle
from fleet.services.nodes import lifecycle as node_lifecycle
from fleet.services.racks import bump_versions


def apply_placement(
    actor,
    job_id: int,
    gpus_by_node: Mapping[int, list[int]],
    *,
    reason: str,
    segments: list[list[str]] | None = None,
    choices: list[str] | None = None,
) -> Job:
    """Bind a pending job to GPUs (node id -> GPU indices) as decided by the
    placement engine. Raises Conflict if the job is no longer pending or any GPU
    is taken or unusable; nothing is written in that case."""
    step = st.Allocate(
        job=job_id, nodes=dict(gpus_by_node), segments=segments, reason=reason, choices=choices
    )
    placed, refused = place_jobs(actor, [step])
    if refused:
        raise Conflict(refused[job_id])
    return placed[0]


def place_jobs(actor, steps: list[st.Allocate]) -> tuple[list[Job], dict[int, str]]:
    """Apply many placements (the actions' allocate steps) in one transaction,
    with a few queries whatever their number. Returns the jobs placed and, for
    each refused one, why (no longer pending, a GPU gone unhealthy). If any GPU
    turns out to be taken (the database constraint), the whole batch is refused
    with Conflict and nothing is written: the caller retries one by one.

    The job keeps what the allocation rows cannot say (its segments, the
    engine's reason and choices); where it runs is its rows (:func:`placement_of`)."""
    with transaction.atomic():
        # Locked in id order, as everywhere: two writers never wait on each other in a cycle.
        locked = Job.objects.select_for_update().filter(pk__in=[step.job for step in steps]).order_by("pk")
        jobs = {j.pk: j for j in locked}
        gpus = _healthy_gpus({int(n) for step in steps for n in step.nodes})
        refused: dict[int, str] = {}
        accepted: list[tuple[st.Allocate, Job, list[GPU]]] = []
        for step in steps:
            assert step.job is not None  # an allocate step requires its job (Step.from_dict)
            job = jobs.get(step.job)
            why = (
                f"job #{step.job} is gone; it cannot be placed"
                if job is None
                else job_lifecycle.refusal(job, "place")
            )
            if why is not None:
                refused[step.job] = why
                continue
            assert job is not None  # a job that is gone has a why
            chosen, missing = _pick(gpus, step.nodes)
            if missing:
                refused[step.job] = _stale(missing)
                continue
            accepted.append((step, job, chosen))
        _insert_allocations(
            [(job, g) for _, job, chosen in accepted for g in chosen],
            "a GPU in the plan is already allocated; the plan is stale",
        )
        views = {}
        for step, job, chosen in accepted:
            job.placement = {
                "segments": step.segments or [sorted({str(g.node_id) for g in chosen})],
                "reason": step.reason,
                "choices": step.choices or [],
            }
            views[job.pk] = _placement_view(job.placement, [g.node for g in chosen])
        placed = [job for _, job, _ in accepted]
        reasons = {step.job: step.reason for step, _, _ in accepted}
        job_lifecycle.apply_many(
            actor,
            placed,
            "place",
            reason_of=lambda job: "",
            message_of=lambda job: reasons[job.pk],
            fields={"placed_at": timezone.now()},
        )
        # One executemany rather than bulk_update's CASE per row: the placement
        # differs per job, and bulk_update's SQL building dominates large batches.
        with connection.cursor() as cursor:
            cursor.executemany(
                f"UPDATE {Job._meta.db_table} SET placement = %s WHERE id = %s",
                [(json.dumps(job.placement), job.pk) for job in placed],
            )
        webhooks.emit_many("job.placed", webhooks.jobs_placed(placed, views))
        bump_versions({g.node.rack_id for _, _, chosen in accepted for g in chosen})
    return placed, refused


def placement_of(job: Job, allocations: Iterable[Allocation] | None = None) -> dict:
    """The job's placement as the API, webhooks and exports show it: what the
    engine chose (segments, reason, choices: kept on the job) and where its
    GPUs are (racks, nodes, segments by hostname), read from its allocation
    rows: those it holds, or if it holds none, the last ones it held.
    ``allocations``: the rows if the caller has them (gpu, node, rack loaded);
    else they are read."""
    if allocations is None:
        allocations = held_or_last_allocations().filter(job=job)
    rows = list(allocations)
    held = [a for a in rows if a.released_at is None]
    if not held and rows:
        # None held: every row has been released.
        last = max(a.released_at for a in rows if a.released_at is not None)
        held = [a for a in rows if a.released_at == last]
    if not job.placement and not held:
        return {}
    return _placement_view(job.placement or {}, [a.gpu.node for a in held])


def hosts_held(job_id: int) -> tuple[list[str], list[list[str]] | None]:
    """Where the job runs now: the hostnames of its active allocation rows,
    sorted, and its segments (node ids) as the engine chose them."""
    hosts = sorted(
        set(
            Allocation.objects.filter(job_id=job_id, released_at__isnull=True).values_list(
                "gpu__node__hostname", flat=True
            )
        )
    )
    placement = Job.objects.filter(pk=job_id).values_list("placement", flat=True).first() or {}
    return hosts, placement.get("segments") or None


def held_or_last_allocations() -> QuerySet[Allocation]:
    """Allocation rows jobs hold, and those each job released last (what
    :func:`placement_of` reads), with their GPU, node and rack."""
    last = (
        Allocation.objects.filter(job_id=OuterRef("job_id"))
        .order_by("-released_at")
        .values("released_at")[:1]
    )
    return Allocation.objects.filter(
        Q(released_at__isnull=True) | Q(released_at=Subquery(last))
    ).select_related("gpu__node__rack")


def _placement_view(stored: dict, nodes: Iterable[Node]) -> dict:
    nodes = list(nodes)
    host_of = {str(n.pk): n.hostname for n in nodes}
    segments = stored.get("segments") or []
    return {
        "racks": sorted({n.rack.name for n in nodes}),
        "nodes": sorted(host_of.values()),
        "segments": segments,
        "segment_hosts": [[host_of.get(str(n), str(n)) for n in seg] for seg in segments],
        "reason": stored.get("reason", ""),
        "choices": stored.get("choices") or [],
    }


def _healthy_gpus(node_ids) -> dict[tuple[int, int], GPU]:
    """The GPUs of the given nodes that are on healthy nodes, by (node id, index)."""
    gpus = GPU.objects.select_related("node__rack").filter(
        node_id__in=node_ids, node__state=NodeState.HEALTHY
    )
    return {(g.node_id, g.index): g for g in gpus}


def _pick(gpus: dict[tuple[int, int], GPU], gpus_by_node: Mapping[int, list[int]]) -> tuple[list[GPU], list]:
    """The wanted GPUs, and the (node, index) keys of those not to be had."""
    keys = [(int(node_id), idx) for node_id, idxs in gpus_by_node.items() for idx in idxs]
    missing = [key for key in keys if key not in gpus]
    return ([] if missing else [gpus[key] for key in keys]), missing


def _stale(missing: list) -> str:
    return f"GPUs {missing} are not on healthy nodes; the plan is stale"


def _insert_allocations(pairs: list[tuple[Job, GPU]], conflict: str) -> None:
    """Create active allocations; Conflict if any GPU is already held (the
    database constraint)."""
    try:
        # A savepoint, so the IntegrityError leaves the outer transaction usable
        # for the rollback and the caller gets a clean Conflict.
        with transaction.atomic():
            Allocation.objects.bulk_create(Allocation(job=job, gpu=gpu) for job, gpu in pairs)
    except IntegrityError as exc:
        raise Conflict(conflict) from exc


def _take_gpus(job: Job, gpus_by_node: Mapping[int, list[int]]) -> list[GPU]:
    """Create active allocations of the given GPUs for ``job``; Conflict if any is
    missing, on an unhealthy node, or already held."""
    chosen, missing = _pick(_healthy_gpus([int(n) for n in gpus_by_node]), gpus_by_node)
    if missing:
        raise Conflict(_stale(missing))
    _insert_allocations(
        [(job, g) for g in chosen], f"a GPU in the plan for job #{job.pk} is already allocated"
    )
    return chosen


def start_job(actor, job_id: int, expect: str | None = None) -> Job:
    """placed|recovering -> running, when the job's processes are up (again).
    ``expect``: the one of the two the caller's step is for (a placement's start
    is of a placed job, a recovery's restart of a recovering one); Conflict if the
    job is in the other. Its racks show the job's state, and the scheduler plans
    with its expected end (from started_at): the lifecycle moves their versions."""
    return job_lifecycle.transition(
        actor, job_id, "start", expect=expect, after_extra=lambda job: {"attempt": job.attempt}
    )


def swap_job_nodes(actor, job_id: int, swaps: Mapping[int, int], *, reason: str) -> Job:
    """Move the job's GPUs off each failed node onto its replacement in the same
    rack, keeping every other node where it is. The job is left recovering; it
    restarts from its checkpoint with :func:`start_job`."""
    hosts = dict(Node.objects.filter(id__in=[*swaps, *swaps.values()]).values_list("id", "hostname"))

    def swap(job: Job) -> set[int]:
        now = timezone.now()
        rack_ids: set[int] = set()
        wanted: dict[int, list[int]] = {}
        for old, new in swaps.items():
            held = Allocation.objects.filter(job=job, gpu__node_id=old, released_at__isnull=True)
            count = held.count()
            if count == 0:
                raise Conflict(
                    f"job #{job.pk} holds nothing on node {hosts.get(old, old)}; the plan is stale"
                )
            held.update(released_at=now)
            busy = set(
                Allocation.objects.filter(gpu__node_id=new, released_at__isnull=True).values_list(
                    "gpu__index", flat=True
                )
            )
            free = [
                i
                for i in GPU.objects.filter(node_id=new).order_by("index").values_list("index", flat=True)
                if i not in busy
            ]
            if len(free) < count:
                raise Conflict(
                    f"node {hosts.get(new, new)} has {len(free)} free GPUs, job #{job.pk} needs {count}"
                )
            wanted[new] = free[:count]
            rack_ids |= set(Node.objects.filter(id__in=[old, new]).values_list("rack_id", flat=True))
        _take_gpus(job, wanted)
        mapping = {str(o): str(n) for o, n in swaps.items()}
        placement = dict(job.placement or {})
        placement["segments"] = [[mapping.get(n, n) for n in seg] for seg in placement.get("segments", [])]
        job.placement = placement
        job.save(update_fields=["placement"])
        return rack_ids

    return job_lifecycle.transition(
        actor,
        job_id,
        "swap",
        reason=reason,
        effect=swap,
        before_extra={"nodes": [hosts.get(o) for o in swaps]},
        after_extra=lambda job: {"nodes": [hosts.get(n) for n in swaps.values()]},
    )


def requeue_job(actor, job_id: int, *, reason: str, action: str = "job.requeue") -> Job:
    """Stop a job that holds GPUs and put it back in the queue (after a failure
    with no room to recover, a preemption, or to move it elsewhere)."""
    return job_lifecycle.transition(
        actor, job_id, "requeue", reason=reason, audit_action=action, effect=release
    )


def finish_job(
    actor,
    job_id: int,
    *,
    succeeded: bool,
    reason: str = "",
    expect_attempt: int | None = None,
    finished_at: datetime | None = None,
) -> Job:
    """A running (or recovering) job ended; its GPUs return to the pool. A
    pending job that has a job in the cluster may end too, when the cluster
    says that job ended (``job_lifecycle.cluster_may_end``).
    ``expect_attempt``: refuse (Conflict) if the job was restarted since the
    end was seen; ``finished_at``: when it ended (the cluster's accounting)."""

    def end(job: Job) -> set[int]:
        job.finished_at = finished_at
        return release(job)

    return job_lifecycle.transition(
        actor,
        job_id,
        "finish",
        to=JobState.COMPLETED if succeeded else JobState.FAILED,
        reason=reason,
        expect_attempt=expect_attempt,
        effect=end,
    )


def release(job: Job) -> set[int]:
    """Release the job's GPUs. Returns the ids of the racks touched. The
    draining nodes it leaves empty are settled once this commits (the module
    docstring)."""
    active = Allocation.objects.filter(job=job, released_at__isnull=True)
    node_ids = set(active.values_list("gpu__node_id", flat=True))
    rack_ids = set(Node.objects.filter(id__in=node_ids).values_list("rack_id", flat=True))
    active.update(released_at=timezone.now())
    if node_ids:
        node_lifecycle.settle_after_commit(node_ids)
    return rack_ids


def release_leaked_allocations() -> list[int]:
    """Release GPUs still held by jobs that no longer hold any (drift: a crash
    between two writes, a manual database edit). Returns the jobs' ids."""
    leaked = Allocation.objects.filter(released_at__isnull=True).exclude(job__state__in=HOLDING_JOB_STATES)
    released = []
    for job_id in sorted(set(leaked.values_list("job_id", flat=True))):
        with transaction.atomic():
            job = Job.objects.select_for_update().get(pk=job_id)
            if job.state in HOLDING_JOB_STATES:
                continue  # placed again since it was selected
            count = Allocation.objects.filter(job=job, released_at__isnull=True).count()
            racks = release(job)
            audit.record(
                None, "allocation.release_drift", job, message=f"released {count} GPU(s) of a {job.state} job"
            )
            bump_versions(racks)
            released.append(job_id)
    return released
