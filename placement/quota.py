"""Quota admission: which pending jobs a tenant's quota lets start, before placement.

The arithmetic follows Kueue's ClusterQueues in a cohort (kueue.sigs.k8s.io
"Cluster Queue": ``nominalQuota``, ``borrowingLimit``, ``lendingLimit``), one
ledger per node shape (GPUs per node), counted in GPUs:

* Each tenant ``t`` has a nominal quota (guaranteed), may borrow up to its
  borrowing limit beyond it (no limit: as much as the cohort has), and puts
  ``lendable(t) = min(lending limit, nominal)`` of its quota into the cohort's
  pool; the rest of its nominal quota (``kept(t)``) only it may use.
* GPUs of the shape that no tenant's nominal quota covers are in the pool too
  (a fleet without quotas is one pool: everybody borrows, as before quotas).
  Spare nodes are fleet insurance: they are not capacity, and count in no quota.
* A tenant's usage above its kept part draws on the pool. A job is admitted if
  its tenant stays within nominal + borrowing limit and the pool's draw stays
  within the pool. A job that keeps its tenant within its nominal quota is
  admitted even when the pool is overdrawn (borrowers hold the tenant's
  lendable part): the overdraw is what a reclaim takes back, only from tenants
  above their nominal quota (:func:`reclaim_budgets`).

Pure arithmetic on numbers: the callers count usage (GPUs held, and those
admitted earlier in the same pass).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Quota:
    """A tenant's quota on one node shape, in GPUs. ``None`` limits: no limit
    (borrow as much as the cohort has; lend all of the nominal quota)."""

    nominal: int = 0
    borrowing_limit: int | None = None
    lending_limit: int | None = None

    @property
    def lendable(self) -> int:
        return self.nominal if self.lending_limit is None else min(self.lending_limit, self.nominal)

    @property
    def kept(self) -> int:
        return self.nominal - self.lendable

    @property
    def ceiling(self) -> int | None:
        """The most the tenant may hold (None: bounded by the pool only)."""
        return None if self.borrowing_limit is None else self.nominal + self.borrowing_limit


NO_QUOTA = Quota()


@dataclass(frozen=True)
class Reclaim:
    """What a waiting job may take back (:meth:`Ledger.reclaim`): the GPUs each
    other tenant may lose (tenants absent may lose none), how many must come
    from them, and whether the victims may include a job that straddles its
    tenant's nominal line (``widen``: a reclaim for a job within its quota)."""

    budgets: dict[str, int]
    need: int
    widen: bool


@dataclass(frozen=True)
class Admission:
    admitted: bool
    reason: str
    # Within the tenant's nominal quota after this job (reclaims may free room).
    guaranteed: bool = False
    # GPUs the pool is overdrawn by once this job is admitted: what a reclaim
    # must take back from tenants above their nominal quota.
    overdraw: int = 0


@dataclass
class Ledger:
    """One cohort's quota on one node shape (``shape``: GPUs per node)."""

    shape: int
    capacity: int
    quotas: dict[str, Quota] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=dict)

    def quota(self, tenant: str) -> Quota:
        return self.quotas.get(tenant, NO_QUOTA)

    @property
    def pool(self) -> int:
        assigned = sum(q.nominal for q in self.quotas.values())
        return sum(q.lendable for q in self.quotas.values()) + max(0, self.capacity - assigned)

    def draw(self, usage: dict[str, int] | None = None) -> int:
        usage = self.usage if usage is None else usage
        return sum(max(0, used - self.quota(t).kept) for t, used in usage.items())

    def borrowed(self, tenant: str) -> int:
        return max(0, self.usage.get(tenant, 0) - self.quota(tenant).nominal)

    def lent(self, tenant: str) -> int:
        """GPUs of ``tenant``'s lendable quota that others use now: the pool's
        draw beyond what the unassigned capacity and the tenants' own use
        cover, shared among lenders in proportion to their idle lendable part."""
        idle = {t: min(q.lendable, max(0, q.nominal - self.usage.get(t, 0))) for t, q in self.quotas.items()}
        total = sum(idle.values())
        unassigned = max(0, self.capacity - sum(q.nominal for q in self.quotas.values()))
        taken = min(total, max(0, sum(self.borrowed(t) for t in self.usage) - unassigned))
        return round(taken * idle.get(tenant, 0) / total) if total else 0

    def admit(self, tenant: str, gpus: int) -> Admission:
        """Would a job of ``gpus`` GPUs of ``tenant`` be admitted now? (The
        ledger is not changed: :meth:`take` records an admitted job.)"""
        q = self.quota(tenant)
        used = self.usage.get(tenant, 0)
        after = {**self.usage, tenant: used + gpus}
        over = self.draw(after) - self.pool
        held = f"{tenant} holds {used} of {q.nominal} nominal GPUs"
        if used + gpus <= q.nominal:
            return Admission(True, f"{held}: within its quota", guaranteed=True, overdraw=max(0, over))
        need = used + gpus - q.nominal
        if q.borrowing_limit is not None and need > q.borrowing_limit:
            return Admission(
                False,
                f"{held} and may borrow {q.borrowing_limit}: this job's {gpus} GPUs would borrow {need}",
            )
        if over > 0:
            free = max(0, self.pool - self.draw())
            return Admission(
                False,
                f"{held}; the cohort has {free} GPUs to lend and this job needs {min(need, gpus)} of them "
                f"(it waits until others use less)",
            )
        return Admission(True, f"{held}: borrows {min(need, gpus)} GPUs from the cohort")

    def take(self, tenant: str, gpus: int) -> None:
        self.usage[tenant] = self.usage.get(tenant, 0) + gpus

    def give(self, tenant: str, gpus: int) -> None:
        self.usage[tenant] = max(0, self.usage.get(tenant, 0) - gpus)

    def fair(self, waiting: dict[str, int], weight: dict[str, float]) -> dict[str, float]:
        """Each tenant's fair share of the cohort's GPUs now (:func:`fair_shares`),
        its demand being what it holds plus ``waiting`` (GPUs of its jobs that
        wait), by ``weight``."""
        names = sorted(set(self.usage) | set(self.quotas) | set(waiting))  # sorted: sums in one order
        return fair_shares(
            self.capacity,
            {t: self.quota(t).nominal for t in names},
            {t: self.usage.get(t, 0) + waiting.get(t, 0) for t in names},
            weight,
        )

    def within_fair(self, tenant: str, gpus: int, fair: dict[str, float]) -> bool:
        """Would ``gpus`` more GPUs keep ``tenant`` within its fair share (``fair``,
        from :meth:`fair`)?"""
        return self.usage.get(tenant, 0) + gpus <= fair.get(tenant, 0.0) + 1e-6

    def fair_reclaim(
        self, tenant: str, gpus: int, fair: dict[str, float], *, counted: bool = False
    ) -> tuple[dict[str, int], int] | None:
        """A reclaim for a job of ``gpus`` GPUs that borrows beyond ``tenant``'s
        nominal quota (``counted``: the usage holds them already, as for a job
        admitted in this pass): None unless the tenant stays within its fair
        share (``fair``, from :meth:`fair`) with it. Else what each other tenant
        may lose (what it holds beyond both its nominal quota and its fair share;
        tenants within either are absent) and the GPUs that must come from them
        (the pool's overdraw with the job)."""
        gpus = 0 if counted else gpus
        if not self.within_fair(tenant, gpus, fair):
            return None
        budgets = {}
        for t, used in self.usage.items():
            keep = max(self.quota(t).nominal, int(fair.get(t, 0.0) + 0.5))
            if t != tenant and used > keep:
                budgets[t] = used - keep
        after = {**self.usage, tenant: self.usage.get(tenant, 0) + gpus}
        return budgets, max(0, self.draw(after) - self.pool)

    def reclaim(
        self,
        tenant: str,
        gpus: int,
        *,
        overdraw: int | None,
        fair: Callable[[], dict[str, float]],
        counted: bool = False,
    ) -> Reclaim | None:
        """The reclaim a waiting job of ``gpus`` GPUs of ``tenant`` may make, for
        :func:`placement.reclaim.reclaim_for_quota`: the simulator and the
        scheduling pass both ask here. ``overdraw`` given: the job is within its
        tenant's nominal quota (:meth:`admit`'s ``guaranteed``) and that many of
        its GPUs must come from the pool; it takes back what other tenants borrow,
        and may widen to a job that straddles its tenant's nominal line. Else it
        borrows: :meth:`fair_reclaim` with ``fair()`` (asked only then: the
        simulator computes fair shares lazily), None unless its tenant stays
        within its fair share."""
        if overdraw is not None:
            budgets = {t: g for t, g in self.reclaim_budgets().items() if t != tenant}
            return Reclaim(budgets, overdraw, widen=True)
        found = self.fair_reclaim(tenant, gpus, fair(), counted=counted)
        return None if found is None else Reclaim(*found, widen=False)

    def reclaim_budgets(self) -> dict[str, int]:
        """How many GPUs each tenant above its nominal quota may lose to a
        reclaim: what it holds beyond its nominal quota. Tenants within their
        nominal quota are absent: a reclaim never takes from them."""
        return {t: over for t in self.usage if (over := self.borrowed(t)) > 0}


def fair_shares(
    capacity: int, nominal: dict[str, int], demand: dict[str, int], weight: dict[str, float]
) -> dict[str, float]:
    """Each tenant's fair share of ``capacity`` GPUs now (weighted max-min, one
    resource): its nominal quota up to its demand (GPUs held plus queued), then
    what is left shared by weight among those that want more, capped by demand,
    and shared again until nobody wants more or nothing is left."""
    fair = {t: float(min(nominal.get(t, 0), d)) for t, d in demand.items()}
    left = capacity - sum(fair.values())
    want = [t for t in demand if demand[t] > fair[t]]
    while left > 1e-9 and want:
        ws = {t: max(0.0, weight.get(t, 0.0)) for t in want}
        total = sum(ws.values())
        if total <= 0:
            ws, total = dict.fromkeys(want, 1.0), float(len(want))
        for t in want:
            fair[t] += min(left * ws[t] / total, demand[t] - fair[t])
        left = capacity - sum(fair.values())
        want = [t for t in want if demand[t] - fair[t] > 1e-9]
    return fair


def overdue(
    waited: float, run: float, *, slowdown: float | None, floor_s: float, cap_s: float | None = None
) -> bool:
    """The starvation bound: has a job that has not started yet waited so long
    that fair share may no longer hold it back? Yes once its bounded slowdown so
    far, ``(waited + run) / max(run, floor_s)``, reaches ``slowdown`` (2: it has
    waited as long as it will run, and at least the floor). ``run``: its expected
    duration (the floor when unknown); ``slowdown`` None: no bound. ``cap_s``:
    a long job is overdue after this much waiting whatever its run."""
    if slowdown is None:
        return False
    return waited + run >= slowdown * max(run, floor_s) or (cap_s is not None and waited >= cap_s)
