"""Tenants for trace replay: who submitted each job, and what each tenant is owed.

The ITP traces (``../shared/traces/itp``) carry no tenant column, so a shared fleet
is simulated by assigning their jobs to tenants here, deterministically:

1. The arrivals, in submit order, are cut into contiguous *bursts*: runs of jobs
   whose GPU-hours (GPUs x duration) add up to about ``1 / bursts`` of the trace's
   (a job bigger than that is a burst of its own). A tenant's demand thus comes in
   runs of back-to-back submissions, as a team's experiments do.
2. Each burst goes to the tenant furthest behind its target share of the GPU-hours
   assigned so far, plus a seeded jitter of up to ``jitter`` bursts' worth
   (``random.Random(seed)``), so the order of tenants is irregular but the shares end
   close to the targets (e.g. 50/30/15/5).

:func:`quotas` turns the entitlements into Kueue-style quotas on one cohort
(:mod:`placement.quota`): each tenant's nominal quota is its entitlement of the
fleet's GPUs, in whole nodes, with borrowing allowed (no borrowing limit unless one
is given) and all of the nominal quota lendable.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass

from placement.quota import Quota
from placement.sim.trace import TraceJob

# Default tenants: shares of the trace's GPU-hours and entitlements of the fleet.
DEFAULT_SHARES: tuple[tuple[str, float], ...] = (("a", 0.50), ("b", 0.30), ("c", 0.15), ("d", 0.05))


@dataclass(frozen=True)
class TenantSetup:
    """Tenants of a replay (``SimConfig.tenants``). ``entitlements``: each tenant's
    declared fraction of the fleet (its nominal quota, and its fair-share weight);
    ``borrowing_limit``: GPUs each may hold beyond it (None: no limit);
    ``half_life_s``: rackwise's fair-share decay of past usage; ``slurm_half_life_s``:
    Slurm's PriorityDecayHalfLife (slurm.conf(5), default 7-0 = 7 days).
    ``overdue_slowdown``, ``overdue_floor_s``, ``overdue_cap_s``: rackwise's starvation bound (see
    :meth:`placement.sim.tenancy.Tenancy.overdue`); ``overdue_slowdown=None`` turns
    it off."""

    entitlements: tuple[tuple[str, float], ...] = DEFAULT_SHARES
    borrowing_limit: int | None = None
    half_life_s: float = 4 * 3600.0
    slurm_half_life_s: float = 7 * 86400.0
    overdue_slowdown: float | None = 2.0
    overdue_floor_s: float = 3600.0
    overdue_cap_s: float | None = None

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.entitlements]

    def weight(self, tenant: str) -> float:
        return dict(self.entitlements).get(tenant, 0.0)


def quotas(setup: TenantSetup, capacity_gpus: int, gpus_per_node: int) -> dict[str, Quota]:
    """Nominal quotas proportional to the entitlements, in whole nodes (rounded down,
    so they never add up to more than the fleet), borrowing per ``setup``."""
    out: dict[str, Quota] = {}
    total = sum(e for _, e in setup.entitlements) or 1.0
    for name, ent in setup.entitlements:
        nodes = int(ent / total * capacity_gpus) // gpus_per_node
        out[name] = Quota(nominal=nodes * gpus_per_node, borrowing_limit=setup.borrowing_limit)
    return out


def assign(
    trace: Sequence[TraceJob],
    shares: Sequence[tuple[str, float]] = DEFAULT_SHARES,
    *,
    seed: int = 0,
    bursts: int = 200,
    jitter: float = 1.0,
    checkpoint_minutes: float | None = None,
) -> list[TraceJob]:
    """The trace with each job's ``tenant`` set (steps 1-2 of the module docstring),
    in the same order; ``checkpoint_minutes``, when given, is set on every job too.
    Deterministic for a given trace, shares and seed."""
    rng = random.Random(seed)
    total_share = sum(s for _, s in shares)
    work = [tj.job.total_gpus * tj.duration for tj in trace]
    target = sum(work) / max(1, bursts)
    out: list[TraceJob] = []
    assigned = {name: 0.0 for name, _ in shares}
    done = 0.0
    i = 0
    while i < len(trace):
        # 1. The next burst: contiguous arrivals up to about ``target`` GPU-seconds.
        j, size = i, 0.0
        while j < len(trace) and (j == i or size + work[j] <= target):
            size += work[j]
            j += 1
        # 2. The tenant furthest behind its share after this burst, with jitter.
        done += size
        name = max(
            shares,
            key=lambda s: (
                (s[1] / total_share * done - assigned[s[0]]) / max(size, 1.0) + jitter * rng.random()
            ),
        )[0]
        assigned[name] += size
        for tj in trace[i:j]:
            job = dataclasses.replace(tj.job, tenant=name)
            if checkpoint_minutes is not None:
                job = dataclasses.replace(job, checkpoint_minutes=checkpoint_minutes)
            out.append(dataclasses.replace(tj, job=job))
        i = j
    return out


def gpu_hour_shares(trace: Sequence[TraceJob]) -> dict[str, float]:
    """Each tenant's fraction of the trace's GPU-hours."""
    work: dict[str, float] = {}
    for tj in trace:
        work[tj.job.tenant] = work.get(tj.job.tenant, 0.0) + tj.job.total_gpus * tj.duration
    total = sum(work.values()) or 1.0
    return {t: w / total for t, w in sorted(work.items())}
