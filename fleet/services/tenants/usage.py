"""What tenants hold against their quotas, read from the allocation rows.

Counted in GPUs per node shape (GPUs per node, as quotas are). Spare nodes are
fleet insurance: capacity leaves them out, and no quota counts them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection
from django.db.models import Count, F, Sum
from django.utils import timezone

from fleet.choices import JobState
from fleet.models import Allocation, Job, Quota, Rack, Tenant
from placement.quota import Ledger
from placement.quota import Quota as EngineQuota


def capacity_by_shape() -> dict[int, int]:
    """GPUs per node shape outside spare nodes: what quotas may share out."""
    out: dict[int, int] = defaultdict(int)
    for rack in Rack.objects.annotate(n=Count("nodes")).values("gpus_per_node", "n", "spare_nodes"):
        out[rack["gpus_per_node"]] += max(0, rack["n"] - rack["spare_nodes"]) * rack["gpus_per_node"]
    return dict(out)


def job_shape(job: Job, shapes: list[int]) -> int | None:
    """The node shape a job is charged to: its GPUs per node if it has one,
    else the smallest shape whose nodes hold it (a sub-node job)."""
    if job.gpus_per_node:
        return job.gpus_per_node if job.gpus_per_node in shapes else None
    return next((s for s in sorted(shapes) if s >= job.num_gpus), None)


def held() -> dict[tuple[str, int], int]:
    """GPUs held now, by (tenant, node shape)."""
    rows = (
        Allocation.objects.filter(released_at__isnull=True)
        .values(tenant=F("job__tenant__name"), shape=F("gpu__node__rack__gpus_per_node"))
        .annotate(gpus=Count("id"))
    )
    return {(r["tenant"], r["shape"]): r["gpus"] for r in rows}


def quotas_configured() -> bool:
    return Quota.objects.exists()


def ledgers(extra: dict[tuple[str, int], int] | None = None) -> dict[tuple[str, int], Ledger]:
    """One ledger per (cohort, node shape), with every tenant's quota and what
    it holds now (plus ``extra``: GPUs of jobs about to be placed, by
    (tenant, shape)). The fleet-wide cohort also pools the capacity no
    tenant's nominal quota covers."""
    capacity = capacity_by_shape()
    cohort_of = dict(Tenant.objects.values_list("name", "cohort"))
    out: dict[tuple[str, int], Ledger] = {}
    for shape in capacity:
        for cohort in set(cohort_of.values()) | {Tenant.DEFAULT_COHORT}:
            out[(cohort, shape)] = Ledger(shape, 0)
    for q in Quota.objects.select_related("tenant"):
        ledger = out.get((q.tenant.cohort, q.gpus_per_node))
        if ledger is not None:
            ledger.quotas[q.tenant.name] = EngineQuota(
                q.nominal_gpus, q.borrowing_limit_gpus, q.lending_limit_gpus
            )
    for shape, gpus in capacity.items():
        assigned_elsewhere = 0
        for (cohort, s), ledger in out.items():
            if s == shape and cohort != Tenant.DEFAULT_COHORT:
                ledger.capacity = sum(q.nominal for q in ledger.quotas.values())
                assigned_elsewhere += ledger.capacity
        out[(Tenant.DEFAULT_COHORT, shape)].capacity = max(0, gpus - assigned_elsewhere)
    counts: dict[tuple[str, int], int] = defaultdict(int)
    for key, gpus in held().items():
        counts[key] += gpus
    for key, gpus in (extra or {}).items():
        counts[key] += gpus
    for (tenant, shape), gpus in counts.items():
        ledger = out.get((cohort_of.get(tenant, Tenant.DEFAULT_COHORT), shape))
        if ledger is not None:
            ledger.take(tenant, gpus)
    return out


def pending_demand() -> dict[str, int]:
    """GPUs asked for by each tenant's pending jobs."""
    rows = Job.objects.filter(state=JobState.PENDING).values("tenant__name").annotate(gpus=Sum("num_gpus"))
    return {r["tenant__name"]: r["gpus"] or 0 for r in rows}


def pending_by_shape() -> dict[tuple[str, int], int]:
    """GPUs asked for by each tenant's pending jobs, by (tenant, node shape the
    job is charged to: :func:`job_shape`). A job no shape of the fleet holds is
    left out (its tenant's total, :func:`pending_demand`, counts it)."""
    shapes = list(capacity_by_shape())
    rows = (
        Job.objects.filter(state=JobState.PENDING)
        .values("tenant__name", "gpus_per_node", "num_gpus")
        .annotate(n=Count("id"))
    )
    out: dict[tuple[str, int], int] = defaultdict(int)
    for r in rows:
        shape = job_shape(Job(gpus_per_node=r["gpus_per_node"], num_gpus=r["num_gpus"]), shapes)
        if shape is not None:
            out[(r["tenant__name"], shape)] += r["num_gpus"] * r["n"]
    return dict(out)


def decayed_usage(now: datetime | None = None) -> dict[str, float]:
    """GPU-hours each tenant used, each hour weighing half as much per
    ``RACKWISE_FAIR_SHARE_HALF_LIFE_H`` gone by (Slurm's decayed usage for its
    fair share). Rows older than ten half-lives count for nothing and are not
    read."""
    now = now or timezone.now()
    half_life_s = settings.RACKWISE_FAIR_SHARE_HALF_LIFE_H * 3600
    k = math.log(2) / half_life_s
    since = now - timedelta(seconds=10 * half_life_s)
    # The integral of exp(-k (now - t)) over each row's [created, released or now],
    # in hours; exponents clamped so PostgreSQL never underflows.
    sql = f"""
        SELECT t.name, SUM(
            EXP(GREATEST(-700, -%(k)s * EXTRACT(EPOCH FROM (%(now)s - COALESCE(a.released_at, %(now)s)))))
            - EXP(GREATEST(-700, -%(k)s * EXTRACT(EPOCH FROM (%(now)s - a.created_at))))
        ) / %(k)s / 3600.0
        FROM {Allocation._meta.db_table} a
        JOIN {Job._meta.db_table} j ON j.id = a.job_id
        JOIN {Tenant._meta.db_table} t ON t.id = j.tenant_id
        WHERE a.released_at IS NULL OR a.released_at > %(since)s
        GROUP BY t.name
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, {"k": k, "now": now, "since": since})
        return {name: float(hours or 0.0) for name, hours in cursor.fetchall()}
