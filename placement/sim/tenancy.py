"""A shared fleet in the replay: each tenant's quota, usage, fair share and figures.

Opt-in (``SimConfig.tenants``); without it the simulator decides exactly as before.
One :class:`Tenancy` per replay keeps:

* the quota ledger (:class:`placement.quota.Ledger`, one cohort, every tenant's
  nominal quota from :func:`placement.sim.tenants.quotas`), with the GPUs each tenant
  holds now;
* each tenant's past usage, decayed with a half-life (rackwise's fair share, and
  Slurm's PriorityDecayHalfLife for the Slurm baseline), and its queued GPUs;
* Slurm's two partitions (see :mod:`placement.sim.preempt`): which running jobs run
  in the preemptable ``borrow`` partition, and each tenant's GPUs in ``guaranteed``;
* the figures (:meth:`report`):

  1. *Time to guaranteed*: an episode opens when a tenant holds less than its
     nominal quota and has a queued job that would keep it within that quota, and
     closes when no such job is left queued (it started, or the tenant reached its
     quota). Checked after each instant's queue pass: a job that starts at the
     instant it arrives opens no episode (the tenant never waited). p95 and mean
     over all tenants' episodes.
  2. *Share error*: at every moment each tenant is entitled to
     ``min(nominal, demand)`` (demand: GPUs held plus queued), and the capacity left
     over is shared by weight among tenants that want more (water-filling, capped by
     demand). The error is ``sum |entitled - held|`` over tenants, integrated over
     time and divided by capacity x span: 0 when every tenant always held what it
     was entitled to, 1 when the whole fleet was misallotted all the time.
  3. *Jain's index* over tenants of held / entitled GPU-hours (1: all alike).
  4. GPU-hours preempted (GPUs x run time of the runs stopped by a preemption) and
     GPU-hours lost to preemption (work since the last checkpoint plus the restart,
     from the simulator's loss accounting).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from placement.model import JobRequest
from placement.quota import Admission, Ledger
from placement.quota import overdue as quota_overdue
from placement.sim.tenants import TenantSetup, quotas

SLURM_POLICIES = ("slurm-block", "slurm-block-greedy")


@dataclass
class Verdict:
    """May a job start now by quota? ``guaranteed``: it keeps its tenant within its
    nominal quota (it may reclaim); ``overdraw``: GPUs the cohort's pool would be
    overdrawn by (rackwise's reclaim must take them back)."""

    admitted: bool
    guaranteed: bool = False
    overdraw: int = 0


@dataclass
class Tenancy:
    setup: TenantSetup
    capacity: int
    gpus_per_node: int
    policy: str
    ledger: Ledger = field(init=False)
    decayed: dict[str, float] = field(default_factory=dict)
    queued: dict[str, dict[int, int]] = field(default_factory=dict)
    queued_gpus: dict[str, int] = field(default_factory=dict)
    borrowers: set[str] = field(default_factory=set)  # Slurm: jobs in the borrow partition
    guaranteed_use: dict[str, int] = field(default_factory=dict)  # Slurm: GPUs in guaranteed
    owed_since: dict[str, float | None] = field(default_factory=dict)
    episodes: dict[str, list[float]] = field(default_factory=dict)
    last_t: float | None = None
    first_t: float | None = None
    share_err_gs: float = 0.0
    held_gs: dict[str, float] = field(default_factory=dict)
    entitled_gs: dict[str, float] = field(default_factory=dict)
    preempted_gs: float = 0.0
    preemptions: int = 0
    # rackwise victims whose tenant was at or under its nominal quota (must stay 0).
    below_nominal: int = 0
    reclaim_tried: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.quotas = quotas(self.setup, self.capacity, self.gpus_per_node)
        self.ledger = Ledger(self.gpus_per_node, self.capacity, dict(self.quotas))
        self.names = self.setup.names
        self.half_life = (
            self.setup.slurm_half_life_s if self.policy in SLURM_POLICIES else self.setup.half_life_s
        )
        for t in self.names:
            self._add(t)

    def _add(self, t: str) -> None:
        if t not in self.decayed:
            self.decayed[t] = 0.0
            self.queued[t] = {}
            self.queued_gpus[t] = 0
            self.guaranteed_use[t] = 0
            self.owed_since[t] = None
            self.episodes[t] = []
            self.held_gs[t] = 0.0
            self.entitled_gs[t] = 0.0
            if t not in self.names:
                self.names = [*self.names, t]

    def nominal(self, t: str) -> int:
        return self.ledger.quota(t).nominal

    def used(self, t: str) -> int:
        return self.ledger.usage.get(t, 0)

    # -- bookkeeping (the simulator's hooks) ----------------------------------------------

    def enqueued(self, job: JobRequest) -> None:
        t = job.tenant
        self._add(t)
        g = job.total_gpus
        self.queued[t][g] = self.queued[t].get(g, 0) + 1
        self.queued_gpus[t] += g

    def dequeued(self, job: JobRequest) -> None:
        t, g = job.tenant, job.total_gpus
        left = self.queued[t][g] - 1
        if left:
            self.queued[t][g] = left
        else:
            del self.queued[t][g]
        self.queued_gpus[t] -= g

    def started(self, job: JobRequest, gpus: int) -> None:
        t = job.tenant
        self._add(t)
        if self.policy in SLURM_POLICIES:
            # sbatch -p guaranteed,borrow: it runs in guaranteed while the tenant's
            # GrpTRES there allows, else in the borrow partition.
            if self.guaranteed_use[t] + gpus <= self.nominal(t):
                self.guaranteed_use[t] += gpus
            else:
                self.borrowers.add(job.id)
        self.ledger.take(t, gpus)

    def stopped(self, job: JobRequest, gpus: int) -> None:
        t = job.tenant
        if self.policy in SLURM_POLICIES:
            if job.id in self.borrowers:
                self.borrowers.discard(job.id)
            else:
                self.guaranteed_use[t] -= gpus
        self.ledger.give(t, gpus)

    # -- admission ------------------------------------------------------------------------

    def admit(self, job: JobRequest) -> Verdict:
        """Quota admission under the replay's policy: the cohort's arithmetic
        (:meth:`Ledger.admit`, Kueue's) for rackwise and kueue-tas; for Slurm, the
        partitions' GrpTRES limits (guaranteed: nominal; borrow: borrowing limit)."""
        t, g = job.tenant, job.total_gpus
        if self.policy in SLURM_POLICIES:
            if self.guaranteed_use.get(t, 0) + g <= self.nominal(t):
                return Verdict(True, guaranteed=True)
            lim = self.ledger.quota(t).borrowing_limit
            borrowed = self.used(t) - self.guaranteed_use.get(t, 0)
            return Verdict(lim is None or borrowed + g <= lim)
        a: Admission = self.ledger.admit(t, g)
        return Verdict(a.admitted, a.guaranteed, a.overdraw)

    # -- fair share -----------------------------------------------------------------------

    def fair_share(self, t: str) -> float:
        """rackwise's order: decayed usage over weight (lower goes first)."""
        w = self.setup.weight(t)
        return self.decayed.get(t, 0.0) / w if w > 0 else math.inf

    def overdue(self, waited: float, run: float) -> bool:
        """rackwise's starvation bound: has a job that has not started yet waited so
        long that fair share may no longer hold it back? Yes once its bounded
        slowdown so far, ``(waited + run) / max(run, overdue_floor_s)``, reaches
        ``overdue_slowdown`` (2: it has waited as long as it will run, and at least
        the floor). An overdue job goes ahead of every tenant's other jobs, oldest
        first, and holds the backfill reservation, which reclaims respect
        (:mod:`placement.sim.preempt`); so its wait is bounded by this age plus the
        time until its reserved nodes come free, whatever the tenants' shares."""
        return quota_overdue(
            waited,
            run,
            slowdown=self.setup.overdue_slowdown,
            floor_s=self.setup.overdue_floor_s,
            cap_s=self.setup.overdue_cap_s,
        )

    def fair_tree_factors(self) -> dict[str, float]:
        """Slurm's Fair Tree fairshare factor (slurm.schedmd.com/fair_tree.html) for
        one level of accounts, one user each: Level FS = S / U (S: the account's
        normalised shares, U: its decayed usage over its siblings'; infinite without
        usage); accounts ranked by Level FS, highest first, and the factor is
        ``(n - rank) / n`` with rank 0 for the highest (ties share a rank)."""
        total_w = sum(self.setup.weight(t) for t in self.names) or 1.0
        total_u = sum(self.decayed.values())
        level: dict[str, float] = {}
        for t in self.names:
            s = self.setup.weight(t) / total_w
            u = self.decayed.get(t, 0.0) / total_u if total_u > 0 else 0.0
            level[t] = s / u if u > 0 else math.inf
        n = len(self.names)
        out: dict[str, float] = {}
        for t in self.names:
            # Ties get the same rank; the rank counts the accounts strictly above.
            above = sum(1 for x in level.values() if x > level[t])
            out[t] = (n - above) / n
        return out

    def drs(self, t: str, usage: int | None = None) -> float:
        """Kueue's share value (dominant resource share) of a ClusterQueue, one
        resource: GPUs borrowed above nominal, per mille of the cohort's lendable
        GPUs, divided by the fair-sharing weight (pkg/cache: dominantResourceShare)."""
        u = self.used(t) if usage is None else usage
        borrowed = max(0, u - self.nominal(t))
        if borrowed == 0:
            return 0.0
        w = self.setup.weight(t)
        pool = max(1, self.ledger.pool)
        return borrowed * 1000 / pool / w if w > 0 else math.inf

    # -- figures --------------------------------------------------------------------------

    def entitled(self) -> dict[str, float]:
        """Each tenant's entitled GPUs now (:meth:`placement.quota.Ledger.fair`):
        min(nominal, demand), then the capacity left shared by weight among those
        that want more, capped by demand."""
        return self.ledger.fair(dict(self.queued_gpus), {t: self.setup.weight(t) for t in self.names})

    def advance(self, t: float) -> None:
        """The state held from the last instant up to ``t``: integrate the figures and
        decay past usage (usage accrues at the GPUs held, continuously)."""
        if self.last_t is None:
            self.last_t = self.first_t = t
            return
        dt = t - self.last_t
        if dt <= 0:
            return
        ent = self.entitled()
        err = 0.0
        for name in self.names:
            held = self.used(name)
            err += abs(ent[name] - held)
            self.held_gs[name] += held * dt
            self.entitled_gs[name] += ent[name] * dt
            f = 0.5 ** (dt / self.half_life)
            self.decayed[name] = self.decayed[name] * f + held * self.half_life / math.log(2) * (1 - f)
        self.share_err_gs += err * dt
        self.last_t = t

    def owed(self, t: str) -> bool:
        room = self.nominal(t) - self.used(t)
        return room > 0 and any(g <= room for g in self.queued[t])

    def observe(self, now: float) -> None:
        """Open and close time-to-guaranteed episodes (figure 1)."""
        for t in self.names:
            since = self.owed_since[t]
            if self.owed(t):
                if since is None:
                    self.owed_since[t] = now
            elif since is not None:
                self.episodes[t].append(now - since)
                self.owed_since[t] = None

    def report(self, lost_preemption_gs: float) -> dict[str, Any]:
        end = self.last_t or 0.0
        for t in self.names:
            since = self.owed_since[t]
            if since is not None:
                self.episodes[t].append(end - since)
                self.owed_since[t] = None
        eps = sorted(x for t in self.names for x in self.episodes[t])
        span = end - (self.first_t or 0.0)
        ratios = [self.held_gs[t] / self.entitled_gs[t] for t in self.names if self.entitled_gs[t] > 0]
        jain = sum(ratios) ** 2 / (len(ratios) * sum(x * x for x in ratios)) if ratios else 1.0
        total_held = sum(self.held_gs.values()) or 1.0
        total_ent = sum(self.entitled_gs.values()) or 1.0
        return {
            "time_to_guaranteed_p95_s": _r(_pct(eps, 0.95)),
            "time_to_guaranteed_mean_s": _r(sum(eps) / len(eps) if eps else 0.0),
            "guaranteed_episodes": len(eps),
            "share_error": _r(self.share_err_gs / (self.capacity * span) if span > 0 else 0.0),
            "jain_index": _r(jain),
            "gpu_hours_preempted": _r(self.preempted_gs / 3600),
            "gpu_hours_lost_preemption": _r(lost_preemption_gs / 3600),
            "preemptions": self.preemptions,
            "victims_at_or_under_nominal": self.below_nominal,
            "per_tenant": {
                t: {
                    "nominal_gpus": self.nominal(t),
                    "held_share": _r(self.held_gs[t] / total_held),
                    "entitled_share": _r(self.entitled_gs[t] / total_ent),
                    "time_to_guaranteed_p95_s": _r(_pct(sorted(self.episodes[t]), 0.95)),
                }
                for t in self.names
            },
        }


def _pct(xs: list[float], p: float) -> float:
    if not xs:
        return 0.0
    return xs[min(len(xs) - 1, max(0, math.ceil(p * len(xs)) - 1))]


def _r(x: float) -> float:
    return round(float(x), 6)
