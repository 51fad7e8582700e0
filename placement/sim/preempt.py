"""Queue passes and preemption for a shared fleet (``SimConfig.tenants``), per policy.

A mixin of ``placement.sim.simulation.Simulation`` (state in
:class:`placement.sim.tenancy.Tenancy`). Each policy follows its own system's rules;
the baselines' rules are cited where they are applied.

* **rackwise**: its backfill cycle (:meth:`QueuePasses._pass_backfill`), jobs owed
  by quota first, then overdue jobs (the starvation bound,
  :meth:`Tenancy.overdue`: oldest first, and they hold the reservation), then by
  fair share (decayed usage / weight, then priority, then its expansion-factor
  order), admitted by the cohort ledger (:mod:`placement.quota`); a job within its
  tenant's nominal quota that cannot be placed reclaims with
  :func:`placement.reclaim.reclaim`: the cheapest victims, in one rack when one
  holds the job, only from tenants above nominal and never below it, and never on
  the nodes the cycle's reservation holds. A borrowing job (admitted and not
  placed, or held back by its quota) whose tenant stays within its fair share
  with it (weighted max-min of the capacity over the demand,
  :meth:`placement.quota.Ledger.fair`) reclaims the same
  way, from tenants above both their nominal quota and their fair share, and
  never below either: borrowed capacity goes back to whom fair share owes it, as
  Kueue's fair-sharing preemption does, but rack by rack.
* **kueue-tas**: one ClusterQueue per tenant in one cohort (nominalQuota, borrowing
  with no borrowingLimit unless set), ``fairSharing`` enabled with the weights, and
  ``preemption: {reclaimWithinCohort: Any, withinClusterQueue: LowerPriority}``
  (kueue.sigs.k8s.io "Cluster Queue" and "Preemption" pages). Heads of the queues
  are admitted lowest share value first (DRS, "Fair Sharing": "Kueue prefers to
  admit Workloads from ClusterQueues that have the lowest share value first"), then
  priority, then creation time; each queue is BestEffortFIFO (the default
  queueingStrategy: an inadmissible head does not block the rest). Placement is the
  existing TAS policy (``required`` topology). Preemption: candidates are the queue's
  own lower-priority workloads and the workloads of borrowing queues in the cohort,
  ordered lowest priority, then most recently admitted; targets are taken from the
  queue with the highest share first, under the default preemptionStrategies
  ``[LessThanOrEqualToFinalShare, LessThanInitialShare]``, until the preemptor fits
  (quota and topology); then, in reverse, every target not needed is given back
  ("Preemption", Fair Sharing "Algorithm overview"). Kueue picks victims by quota,
  not by rack (Kueue #10815).
* **slurm-block**: priority/multifactor with only PriorityWeightFairshare (Fair Tree,
  :meth:`Tenancy.fair_tree_factors`, usage decayed by PriorityDecayHalfLife, 7 days
  by default; slurm.conf(5)), sched/backfill on the existing topology/block policy.
  Quotas as two partitions over the same nodes, jobs submitted to both
  (``sbatch -p guaranteed,borrow``): ``guaranteed`` (PriorityTier=2) with a QOS
  GrpTRES=gres/gpu=<nominal> per account, ``borrow`` (PriorityTier=1) with
  GrpTRES=<borrowing limit> (none: unlimited); PreemptType=preempt/partition_prio,
  PreemptMode=REQUEUE (slurm.schedmd.com/preempt.html). A job that would run in
  ``guaranteed`` and cannot start preempts jobs of the ``borrow`` partition, lowest
  priority first (then youngest first, PreemptParameters=youngest_order is not
  default, so the order among equals is by start, latest first), as select/cons_tres
  does: drop candidates until the job fits, then preempt only the jobs on the nodes
  it was given.

Victims are requeued: they lose the work since their last checkpoint and pay the
restart (cause ``preemption`` in the loss accounting), and are queued again after
``requeue_delay_s``.
"""

from __future__ import annotations

import heapq
import math
from typing import Any

from placement.model import HEALTHY, Allocation, JobRequest
from placement.place import place, shape_key
from placement.plans import PlacementPlan
from placement.quota import Ledger, Reclaim
from placement.reclaim import reclaim_for_quota
from placement.sim.queue import QueuePasses
from placement.sim.state import JobState
from placement.sim.tenancy import SLURM_POLICIES, Tenancy, Verdict

# A job whose preemption attempt failed tries again only this much later (or when
# anything else changes its tenant's standing); the same for every policy.
PREEMPT_RETRY_S = 300.0
# Preemption rounds at one instant, at most (each starts a job).
MAX_ROUNDS = 64
TENANT_POLICIES = ("rackwise", "slurm-block", "kueue-tas")


class TenantPasses(QueuePasses):
    tenancy: Tenancy | None
    jobs: dict[str, JobState]
    again: bool
    preempt_failed: set[str]
    fs_factors: dict[str, float]

    def _requeue(self, t: float, st: JobState, cause: str = "failures") -> None:
        raise NotImplementedError  # the Simulation's

    def _pass_tenants(self, now: float) -> None:
        ten = self.tenancy
        assert ten is not None
        for _ in range(MAX_ROUNDS):
            self.again = False
            self.preempt_failed = set()
            if self.policy == "kueue-tas":
                self._pass_kueue_tenants(now)
            else:
                if self.policy in SLURM_POLICIES:
                    self.fs_factors = ten.fair_tree_factors()
                self._pass_backfill(now)
            if not self.again:
                return

    def _tenant_order(self, jobs: list[JobState], now: float, lxf_key: Any) -> list[JobState]:
        """The backfill cycle's order with tenants: rackwise by quota, the starvation
        bound and fair share, then its own order (``lxf_key``); Slurm by multifactor
        priority (the fairshare factor), then its queue order."""
        ten = self.tenancy
        assert ten is not None
        if self.policy == "rackwise":
            # 1. Jobs owed by quota (within their tenant's nominal quota) first: a
            #    guarantee outranks anyone's borrowing.
            # 2. Then overdue jobs (the starvation bound, Tenancy.overdue), oldest
            #    first, whatever their tenant's share: without it a borrower's job can
            #    stay behind lower-share tenants for as long as they submit.
            # 3. Then jobs that keep their tenant within its fair share (Ledger.fair,
            #    what a fair-share reclaim would start them with), then the rest:
            #    otherwise a job beyond its share starts now and is the cheapest
            #    victim of the next pass's fair-share reclaim for one within it.
            # 4. Inside each, by fair share, then rackwise's own order.
            share = {t: ten.fair_share(t) for t in ten.names}
            room = {t: ten.nominal(t) - ten.used(t) for t in ten.names}
            fair = ten.entitled() if self.cfg.rackwise_tenant_order == "entitled" else None

            def key(st: JobState) -> tuple[Any, ...]:
                t, gpus = st.job.tenant, st.job.total_gpus
                owed = gpus <= room.get(t, 0)
                if not owed and self._overdue(st, now):
                    return (1, 0, st.submit, st.order)
                beyond = not owed and fair is not None and not ten.ledger.within_fair(t, gpus, fair)
                return (0 if owed else 1, 2 if beyond else 1, share.get(t, math.inf), *lxf_key(st))

            return sorted(jobs, key=key)
        fs = self.fs_factors
        return sorted(jobs, key=lambda st: (-fs.get(st.job.tenant, 0.0), st.order))

    def _overdue(self, st: JobState, now: float) -> bool:
        """rackwise with tenants: a job not started yet past the starvation bound
        (:meth:`Tenancy.overdue`). Requeued jobs keep their place by fair share: a
        reclaim's victim must not jump back ahead of the job it made room for."""
        ten = self.tenancy
        return (
            self.policy == "rackwise"
            and ten is not None
            and st.first_start is None
            and ten.overdue(now - st.submit, self._expected_run(st))
        )

    def _pass_kueue_tenants(self, now: float) -> None:
        """Kueue's scheduling cycles at one instant: heads of the ClusterQueues, lowest
        share value (after admitting the head) first, then priority, then creation."""
        ten = self.tenancy
        assert ten is not None
        by_t: dict[str, list[JobState]] = {}
        for st in heapq.merge(*self.groups.values(), key=lambda s: s.order):
            by_t.setdefault(st.job.tenant, []).append(st)
        pos = dict.fromkeys(by_t, 0)
        failed: set[tuple[Any, ...]] = set()  # shapes TAS could not place this pass
        while True:
            heads = [(t, q[pos[t]]) for t, q in by_t.items() if pos[t] < len(q)]
            if not heads:
                return
            t, st = min(
                heads, key=lambda h: (ten.drs(h[0], ten.used(h[0]) + h[1].job.total_gpus), h[1].order)
            )
            pos[t] += 1  # BestEffortFIFO: an inadmissible head steps aside
            verdict = ten.admit(st.job)
            key = shape_key(st.job)
            if verdict.admitted and key not in failed:
                plan = place(self.fleet, st.job, self.policy, rng=self.rng, now=now)
                if plan.placed:
                    self._take(st)
                    self._start(now, st, plan.allocation(st.job))
                    continue
                failed.add(key)
            if self._preempt_for(now, st, verdict):
                failed.clear()
                self.again = True
                return

    # -- preemption -----------------------------------------------------------------------

    def _preempt_for(self, now: float, st: JobState, verdict: Verdict) -> bool:
        """Stop victims so that ``st`` starts now, by the policy's rules; False when it
        may not or no victims make room."""
        ten = self.tenancy
        assert ten is not None
        job = st.job
        if job.tenant in self.preempt_failed:
            return False
        if now - ten.reclaim_tried.get(job.id, -math.inf) < PREEMPT_RETRY_S:
            return False
        found: tuple[list[str], PlacementPlan] | None = None
        if self.policy == "rackwise":
            may = ten.ledger.reclaim(
                job.tenant,
                job.total_gpus,
                overdraw=verdict.overdraw if verdict.guaranteed else None,
                fair=ten.entitled,
            )
            if may is not None:
                found = self._victims_rackwise(now, st, may)
        elif self.policy == "kueue-tas":
            found = self._victims_kueue(now, job)
        elif verdict.guaranteed:
            found = self._victims_slurm(now, job)
        else:
            return False
        if found is None:
            ten.reclaim_tried[job.id] = now
            self.preempt_failed.add(job.tenant)
            return False
        victims, plan = found
        ten.reclaim_tried.pop(job.id, None)
        for vid in victims:
            vst = self.jobs[vid]
            vt = vst.job.tenant
            if self.policy == "rackwise" and ten.used(vt) <= ten.nominal(vt):
                ten.below_nominal += 1  # a tenant at or under nominal preempted: a bug
            ten.preempted_gs += vst.gpus * (now - vst.run_start)
            ten.preemptions += 1
            self._requeue(now, vst, cause="preemption")
        self._take(st)
        self._start(now, st, plan.allocation(job))
        return True

    def _victims_rackwise(
        self, now: float, st: JobState, reclaim: Reclaim
    ) -> tuple[list[str], PlacementPlan] | None:
        """A reclaim for ``st`` that keeps clear of the cycle's reservations: their
        idle nodes are held back, and jobs on their nodes are no victims (stopping
        them would free nodes promised to the reservation). A reclaim that took a
        reserved gang's room would undo the starvation bound (Tenancy.overdue)."""
        ten = self.tenancy
        assert ten is not None
        job = st.job
        fleet = self.fleet
        usage = ten.ledger.usage
        budgets = reclaim.budgets
        if not budgets:
            return None
        held = self.bf.held_nodes(now, now + self._expected_run(st)) if self.bf is not None else set()
        on_held = {j for nid in held for j in fleet.nodes[nid].jobs}
        slots: dict[str, list[int]] = {}
        for nid in held:
            node = fleet.nodes[nid]
            slots.setdefault(node.rack, []).append(node.index)
        taken = fleet.hold_back(slots)
        try:

            def may(v: JobRequest) -> bool:
                return v.tenant in budgets and v.id not in on_held

            kw: dict[str, Any] = {
                "need_gpus": reclaim.need,
                "policy": "rackwise",
                "now": now,
                "restart_minutes": self.cfg.restart_minutes,
            }
            plan = reclaim_for_quota(fleet, job, may, budgets, usage, ten.nominal, widen=reclaim.widen, **kw)
        finally:
            fleet.give_back(taken)
        if not plan.placed or plan.placement is None or held & set(plan.placement.nodes):
            return None  # (a single-node job may sit on a held node's free GPUs)
        return plan.victims, plan.placement

    def _healthy(self, alloc: Allocation) -> bool:
        return all(self.fleet.nodes[n].health == HEALTHY for n in alloc.nodes)

    def _victims_kueue(self, now: float, job: JobRequest) -> tuple[list[str], PlacementPlan] | None:
        ten = self.tenancy
        assert ten is not None
        fleet = self.fleet
        me, g = job.tenant, job.total_gpus
        q = ten.ledger.quota(me)
        usage = dict(ten.ledger.usage)
        if q.ceiling is not None and usage.get(me, 0) + g > q.ceiling:
            return None  # over nominal + borrowingLimit even with the cohort empty
        pools: dict[str, list[Allocation]] = {}
        for alloc in fleet.allocations.values():
            v = alloc.job
            if not self._healthy(alloc):
                continue
            if v.tenant == me and v.priority >= job.priority:
                continue  # withinClusterQueue: LowerPriority
            pools.setdefault(v.tenant, []).append(alloc)
        for lst in pools.values():
            # Lowest priority first, then the most recently admitted.
            lst.sort(key=lambda a: (a.job.priority, -(a.started_at or 0.0), a.job.id))

        def quota_fits() -> bool:
            trial = Ledger(ten.ledger.shape, ten.ledger.capacity, ten.ledger.quotas, dict(usage))
            return trial.admit(me, g).admitted

        with fleet.trial():
            targets: list[Allocation] = []

            def fits() -> PlacementPlan | None:
                if not quota_fits():
                    return None
                plan = place(fleet, job, self.policy, rng=self.rng, now=now)
                return plan if plan.placed else None

            plan = None
            for strategy in ("LessThanOrEqualToFinalShare", "LessThanInitialShare"):
                left = {t: list(lst) for t, lst in pools.items() if lst}
                while plan is None and left:
                    y = max(left, key=lambda t: (ten.drs(t, usage.get(t, 0)), t))
                    u = left[y][0]
                    if y != me:
                        if usage.get(y, 0) <= ten.nominal(y):
                            del left[y]  # reclaimWithinCohort: only from borrowing queues
                            continue
                        mine = ten.drs(me, usage.get(me, 0) + g)
                        if strategy == "LessThanOrEqualToFinalShare":
                            ok = mine <= ten.drs(y, usage[y] - u.gpus)
                        else:
                            ok = mine < ten.drs(y, usage[y])
                        if not ok:
                            del left[y]
                            continue
                    left[y].pop(0)
                    if not left[y]:
                        del left[y]
                    pools[y].remove(u)
                    fleet.release(u.job.id)
                    usage[y] -= u.gpus
                    targets.append(u)
                    plan = fits()
                if plan is not None:
                    break
            if plan is None:
                return None
            # Give back, in reverse, every target the preemptor does not need.
            for u in reversed(list(targets)):
                fleet.allocate(u, restore=True)
                usage[u.job.tenant] += u.gpus
                kept = fits()
                if kept is not None:
                    targets.remove(u)
                    plan = kept
                else:
                    fleet.release(u.job.id)
                    usage[u.job.tenant] -= u.gpus
        return [u.job.id for u in targets], plan

    def _victims_slurm(self, now: float, job: JobRequest) -> tuple[list[str], PlacementPlan] | None:
        ten = self.tenancy
        assert ten is not None
        fleet = self.fleet
        fs = self.fs_factors
        cands = [
            fleet.allocations[j]
            for j in ten.borrowers
            if j in fleet.allocations and self._healthy(fleet.allocations[j])
        ]
        if not cands:
            return None
        # Lowest job priority (the fairshare factor) first; among equals, youngest first.
        cands.sort(key=lambda a: (fs.get(a.job.tenant, 0.0), -(a.started_at or 0.0), a.job.id))
        with fleet.trial():
            plan = None
            for alloc in cands:
                fleet.release(alloc.job.id)
                p = place(fleet, job, self.policy, rng=self.rng, now=now)
                if p.placed:
                    plan = p
                    break
        if plan is None:
            return None
        # cons_tres preempts only the jobs on the nodes the preemptor was given.
        nodes = set(plan.nodes)
        victims = [a.job.id for a in cands if nodes & set(a.nodes)]
        return victims, plan
