"""Whole-fleet checks: what must always be true of the rows, and which waiting
jobs the fleet has room for. Read-only. Used by the test suite, the soak test
(``benchmarks/soak.py``) and operators (``scripts/manage check_fleet``)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from django.db import connection, transaction
from django.db.models import Count

from fleet import engine
from fleet.choices import HOLDING_JOB_STATES, JobState
from fleet.models import Allocation, Job
from fleet.services.actions.propose import open_action_job_ids
from placement import model as pm
from placement.place import place, schedule
from placement.validate import validate


def violations() -> list[str]:
    """The engine's invariant checker on one consistent snapshot of the rows
    (REPEATABLE READ), plus the checks only the rows can answer: no GPU held
    twice now, no allocation left to a job that holds nothing, every holding job
    holding exactly what it asked for."""
    # Inside a caller's transaction (a test's), its snapshot is the one read.
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if outermost:
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        snap = engine.load_snapshot()
        # A recovering job holds its failed node until its recovery swaps it out:
        # that is the recovery under way, not a broken rule.
        recovering = {
            str(pk) for pk in Job.objects.filter(state=JobState.RECOVERING).values_list("pk", flat=True)
        }
        problems = [
            str(v) for v in validate(snap.fleet) if not (v.rule == "failed-node" and v.job_id in recovering)
        ]
        active = Allocation.objects.filter(released_at__isnull=True)
        doubled = active.values("gpu_id").annotate(n=Count("id")).filter(n__gt=1)
        problems += [f"GPU {row['gpu_id']} held {row['n']} times" for row in doubled]
        leaked = active.exclude(job__state__in=HOLDING_JOB_STATES).count()
        if leaked:
            problems.append(f"{leaked} allocation(s) held by jobs that hold nothing")
        held = dict(active.values_list("job_id").annotate(n=Count("id")))
        for job in Job.objects.filter(state__in=HOLDING_JOB_STATES):
            want = job.num_gpus
            if job.num_nodes:
                assert job.gpus_per_node is not None  # set with num_nodes (a check constraint)
                want = job.num_nodes * job.gpus_per_node
            if held.get(job.pk, 0) != want:
                problems.append(f"job #{job.pk} holds {held.get(job.pk, 0)} GPUs, wants {want}")
    return problems


def gpus_ever_held_twice() -> int:
    """Pairs of allocations of one GPU whose times overlapped, over the whole
    history (the partial unique index guards the present; this checks the past)."""
    table = Allocation._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"""SELECT count(*) FROM {table} a JOIN {table} b
                ON a.gpu_id = b.gpu_id AND a.id < b.id
               AND a.created_at < COALESCE(b.released_at, 'infinity')
               AND b.created_at < COALESCE(a.released_at, 'infinity')"""
        )
        return int(cursor.fetchone()[0])


@dataclass
class Waiting:
    """A pending job, and whether the fleet has room for it now."""

    job: int
    name: str
    reason: str
    # Room by counting idle nodes, independently of the engine, and never
    # counting a rack's spares: a sufficient condition for any policy's rules.
    room_by_counts: bool
    # The engine places it on the fleet as it is, alone (no queue ahead of it).
    placed_alone: bool
    # The scheduler's own queue pass, on the same fleet, places it now.
    placed_by_pass: bool


def room_by_counts(fleet: pm.Fleet, job: pm.JobRequest) -> bool:
    """Does the fleet have idle room for ``job`` without any rack's spares? A job
    smaller than a node needs one node with that many free GPUs; a gang of ``n``
    nodes needs ``n`` idle nodes in one rack, or, in segments of ``s``, ``n / s``
    segments each inside one rack. Racks whose nodes have another GPU count, and
    nodes that are not healthy, do not count."""
    for gpn, racks in fleet.groups.items():
        if job.is_small(gpn):
            if any(
                node.free_gpus >= job.num_gpus
                for rack in racks
                for node in rack.nodes
                if node.health == pm.HEALTHY
            ):
                return True
            continue
        n = job.nodes_needed(gpn)
        if not n:
            continue
        usable = [max(0, rack.free_count - rack.spare_nodes) for rack in racks]
        seg = job.segment_nodes
        if seg and sum(u // seg for u in usable) * seg >= n:
            return True
        if max(usable, default=0) >= n:
            return True
    return False


def waiting_jobs(policy: str | None = None) -> list[Waiting]:
    """Every pending job that no open action holds, with whether the fleet has
    room for it now: by counts, by the engine alone, and by the scheduler's own
    pass (look-ahead and reservations included), all on one snapshot."""
    policy = policy or engine.policy()
    now = time.time()
    busy = open_action_job_ids()
    jobs = list(Job.objects.select_related("tenant").filter(state=JobState.PENDING).exclude(pk__in=busy))
    if not jobs:
        return []
    requests = {str(j.pk): engine.job_request(j) for j in jobs}
    snap = engine.load_snapshot()
    with snap.fleet.trial():
        passed = {
            p.job_id
            for p in schedule(snap.fleet, list(requests.values()), policy, now=now, apply=True).placements
        }
    out = []
    for job in jobs:
        request = requests[str(job.pk)]
        out.append(
            Waiting(
                job=job.pk,
                name=job.name,
                reason=job.state_reason,
                room_by_counts=room_by_counts(snap.fleet, request),
                placed_alone=place(snap.fleet, request, policy, now=now).placed,
                placed_by_pass=str(job.pk) in passed,
            )
        )
    return out


def report() -> dict:
    """All of the above, as JSON-ready data."""
    return {
        "violations": violations(),
        "gpus_ever_held_twice": gpus_ever_held_twice(),
        "waiting": [asdict(w) for w in waiting_jobs()],
    }
