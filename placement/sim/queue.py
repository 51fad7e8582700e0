"""The simulator's queue passes, one per queue discipline, run after every instant's
events: sched/backfill cycles (slurm-block, and rackwise's LXF queue), Kueue's
StrictFIFO (kueue-tas) and the best-effort greedy queue (the rest). A mixin of
``placement.sim.simulation.Simulation``, whose state they share."""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable
from typing import Any

from placement.model import Allocation, Fleet, JobRequest
from placement.place import place, reservation, shape_key
from placement.policies import POLICIES
from placement.policies.common import min_racks
from placement.policies.rackwise import idle_room, rack_room
from placement.policies.slurm_block import block_room
from placement.queues import Backfill, Hold, expansion_factor
from placement.sim.state import JobState, SimConfig
from placement.sim.tenancy import Tenancy, Verdict
from placement.timeline import NodeEnds


class QueuePasses:
    """The queue half of a replay: which queued jobs start at an instant."""

    # Set up by Simulation.__init__ (see there).
    cfg: SimConfig
    policy: str
    fleet: Fleet
    rng: random.Random
    groups: dict[tuple[Any, ...], list[JobState]]
    blocked: set[tuple[Any, ...]]
    reserved: frozenset[str]
    reserved_until: float | None
    reserved_for: str | None
    queued: int
    running: set[str]
    bf: Backfill | None
    kept_holds: dict[str, Hold]
    node_ends: NodeEnds | None
    bf_last: tuple[float, float, int] | None
    fresh: list[JobState]
    fifo_blocked: str | None
    room_tests: dict[tuple[Any, ...], Callable[[dict[str, int]], bool]]
    tenancy: Tenancy | None  # a shared fleet (placement/sim/preempt.py); None: no tenants
    again: bool

    def _start(self, t: float, st: JobState, alloc: Allocation) -> None:
        raise NotImplementedError  # the Simulation's: allocate and run the job

    def _tenant_order(self, jobs: list[JobState], now: float, lxf_key: Any) -> list[JobState]:
        raise NotImplementedError  # TenantPasses'

    def _preempt_for(self, now: float, st: JobState, verdict: Verdict) -> bool:
        raise NotImplementedError  # TenantPasses'

    def _overdue(self, st: JobState, now: float) -> bool:
        raise NotImplementedError  # TenantPasses'

    def _enqueue(self, st: JobState) -> None:
        group = self.groups.setdefault(shape_key(st.job), [])
        # Keep the group sorted by order; requeued jobs go back to their place.
        lo, hi = 0, len(group)
        while lo < hi:
            mid = (lo + hi) // 2
            if group[mid].order < st.order:
                lo = mid + 1
            else:
                hi = mid
        group.insert(lo, st)
        self.queued += 1
        self.fresh.append(st)
        if self.tenancy is not None:
            self.tenancy.enqueued(st.job)

    def _freed(self, early: bool = True) -> None:
        """Capacity came back: every shape may fit again; reservations are redone.
        ``early``: sooner than the running jobs' expected ends said (anything but a
        job completing), so rackwise's kept reservation may no longer be the earliest."""
        if early:
            self.kept_holds.clear()
        self.blocked.clear()
        self.reserved = frozenset()
        self.reserved_until = None
        self.reserved_for = None
        self.bf = None
        self.fifo_blocked = None

    def _pass_tenants(self, now: float) -> None:
        raise NotImplementedError  # TenantPasses'

    def _pass(self, now: float) -> None:
        if self.tenancy is not None:
            self._pass_tenants(now)
        elif self.policy == "slurm-block" or (
            self.policy == "rackwise" and self.cfg.rackwise_queue == "backfill"
        ):
            self._pass_backfill(now)
        elif self.policy == "kueue-tas":
            self._pass_strict_fifo(now)
        else:
            self._pass_greedy(now)
        self.fresh.clear()

    def _in_order(self, limit: int) -> list[JobState]:
        """The first ``limit`` queued jobs in queue order (groups are kept sorted)."""
        out: list[JobState] = []
        for st in heapq.merge(*self.groups.values(), key=lambda s: s.order):
            out.append(st)
            if len(out) >= limit:
                break
        return out

    def _take(self, st: JobState) -> None:
        key = shape_key(st.job)
        group = self.groups[key]
        group.remove(st)
        if not group:
            del self.groups[key]  # only shapes with queued jobs: passes read them all
        self.queued -= 1
        if self.tenancy is not None:
            self.tenancy.dequeued(st.job)

    def _expected_run(self, st: JobState) -> float:
        # What the scheduler expects this run to take (the simulator knows the
        # remaining work; Slurm would use the job's time limit).
        return st.remaining + (self.cfg.restart_minutes * 60 if st.restarts else 0.0)

    def _pass_backfill(self, now: float) -> None:
        """slurm-block: priority order with sched/backfill; rackwise: the same cycle in
        expansion-factor order with rackwise placement (placement/queues.py)."""
        cfg = self.cfg
        rackwise = self.policy == "rackwise"
        age = 0.0 if rackwise else cfg.bf_min_age_reserve_s
        lxf = rackwise and cfg.rackwise_order == "lxf"
        last = self.bf_last
        ten = self.tenancy
        if (
            ten is None
            and self.bf is not None
            and last is not None
            and not age  # else ageing alone changes the plan
            and all(
                (st.submit == now and st.order[0] >= last[0]) if lxf else st.order > last for st in self.fresh
            )
        ):
            # Nothing came back since the last cycle: its reservations still hold and
            # the jobs it looked at still cannot start; only new arrivals are new, and
            # they come last in the queue's order (by expansion factor, a job that has
            # not waited has the lowest), so they are tried against the same holds
            # (only while the cycle's bf_max_job_test bound would reach them).
            todo = (
                sorted(self.fresh, key=lambda s: s.order)
                if self.queued - len(self.fresh) < cfg.bf_max_job_test
                else []
            )
            self.bf.now = now
            self.bf.ctx.now = now
        else:
            self.bf_last = None
            if self.node_ends is None:
                self.node_ends = NodeEnds(self.fleet)
            self.bf = Backfill(
                self.fleet,
                now,
                POLICIES[self.policy],
                self.policy,
                window_s=cfg.bf_window_s,
                min_age_reserve_s=age,
                max_reservations=(cfg.rackwise_max_reservations if rackwise else cfg.bf_max_reservations),
                room=self._room,
                ends=self.node_ends,
                # rackwise keeps a gang's reservation from cycle to
                # cycle while it stays the earliest (see
                # Backfill._reuse): its racks do not change under
                # it at every completion, nor is it planned again.
                kept=(self.kept_holds if rackwise and cfg.rackwise_keep_reservations else None),
                idle_room=idle_room if rackwise else None,
            )
            tau = cfg.rackwise_lxf_tau_s

            def lxf_key(st: JobState) -> tuple[Any, ...]:
                xf = expansion_factor(now - st.submit, self._expected_run(st), tau)
                return (st.order[0], -xf, st.order)

            if ten is not None:
                # A shared fleet: fair share first (placement/sim/preempt.py).
                todo = self._tenant_order(
                    [st for g in self.groups.values() for st in g],
                    now,
                    lxf_key if lxf else (lambda st: (st.order,)),
                )
                del todo[cfg.bf_max_job_test :]
            elif lxf:
                todo = sorted((st for g in self.groups.values() for st in g), key=lxf_key)
                del todo[cfg.bf_max_job_test :]
            else:
                todo = self._in_order(cfg.bf_max_job_test)
        bf = self.bf
        fleet = self.fleet
        gpn = cfg.gpus_per_node
        idle_total = fleet.idle_total
        max_partial = max((f for f, s in fleet.partial.items() if s), default=0)
        cannot: dict[tuple[Any, ...], float] = {}  # shape -> shortest run that failed
        for st in todo:
            if st.end is not None or st.job.id in self.running:
                continue
            self.bf_last = st.order if self.bf_last is None else max(self.bf_last, st.order)
            job = st.job
            verdict = None
            overdue = ten is not None and self._overdue(st, now)
            if ten is not None:
                verdict = ten.admit(job)
                if not verdict.admitted:
                    if overdue:
                        # Past the starvation bound it still reserves: the cohort's
                        # GPUs come back as its nodes do, and nobody else may take them.
                        bf.reserve_later(job, self._expected_run(st), st.submit, shape_key(job))
                    elif self._preempt_for(now, st, verdict):
                        self.again = True  # a fair-share reclaim: plan a new cycle
                        return
                    continue  # held by its quota: no start
            key = shape_key(job)
            run = self._expected_run(st)
            if run < cannot.get(key, math.inf):
                # Cheap necessary conditions before a full placement decision.
                if job.is_small(gpn):
                    hopeless = not idle_total and max_partial < job.num_gpus
                else:
                    hopeless = job.nodes_needed(gpn) > idle_total or (
                        rackwise and not idle_room(fleet, job, bf.ctx)
                    )
                plan = None if hopeless else bf.try_start(job, run)
                if plan is not None and plan.placed and self._spans(job, len(plan.racks)):
                    # Spread over more racks than it needs, it runs slower: it must
                    # not run into a reservation at its real speed either.
                    slow = run / (1 - cfg.cross_rack_slowdown)
                    if bf.held_nodes(now, now + slow) & set(plan.nodes):
                        plan = None
                if plan is not None and plan.placed:
                    self._take(st)
                    self._start(now, st, plan.allocation(job))
                    bf.started(job.id)
                    idle_total = fleet.idle_total
                    max_partial = max((f for f, s in fleet.partial.items() if s), default=0)
                    continue
                # Around no hold it fails whatever it runs for: skip its shape.
                cannot[key] = run if bf.holds else -math.inf
            if verdict is not None and self._preempt_for(now, st, verdict):
                self.again = True  # the fleet changed under this cycle: plan a new one
                return
            if self.policy != "rackwise" or not job.is_small(gpn) or overdue:
                # rackwise reserves for gangs only: a single-node job fits on any
                # node, and its rising expansion factor moves it up the queue; with
                # tenants, fair share comes before that factor, so an overdue one
                # reserves too.
                bf.reserve_later(job, run, st.submit, key)

    def _room(self, job: JobRequest, racks: list[Any]) -> Callable[[dict[str, int]], bool]:
        key = (shape_key(job), id(racks))
        test = self.room_tests.get(key)
        if test is None:
            room = rack_room if self.policy == "rackwise" else block_room
            test = self.room_tests[key] = room(job, racks)
        return test

    def _spans(self, job: JobRequest, racks_used: int) -> bool:
        gpn = self.cfg.gpus_per_node
        return not job.is_small(gpn) and racks_used > min_racks(
            job.nodes_needed(gpn), self.cfg.nodes_per_rack, job.segment_nodes
        )

    def _pass_strict_fifo(self, now: float) -> None:
        """kueue-tas: Kueue's StrictFIFO ClusterQueue. Workloads go by priority, then
        creation time; a head that cannot be admitted blocks every workload behind
        it, even ones that would fit (kueue.sigs.k8s.io, Cluster Queue, "Queueing
        strategy")."""
        while self.queued:
            heads = [g[0] for g in self.groups.values()]
            st = min(heads, key=lambda s: s.order)
            if self.fifo_blocked == st.job.id:
                return  # nothing came back since it last failed
            plan = place(self.fleet, st.job, self.policy, rng=self.rng, now=now)
            if not plan.placed:
                self.fifo_blocked = st.job.id
                return
            self._take(st)
            self._start(now, st, plan.allocation(st.job))

    def _pass_greedy(self, now: float) -> None:
        """Best-effort FIFO: any job that fits starts (first-fit, random,
        slurm-block-greedy; rackwise adds its look-ahead reservation)."""
        heap = [(g[0].order, k) for k, g in self.groups.items() if k not in self.blocked]
        if not heap:
            return
        heapq.heapify(heap)
        fleet = self.fleet
        idle_total = fleet.idle_total
        max_partial = max((f for f, s in fleet.partial.items() if s), default=0)
        gpn = self.cfg.gpus_per_node
        while heap:
            _, key = heapq.heappop(heap)
            group = self.groups[key]
            st = group[0]
            job = st.job
            small = job.is_small(gpn)
            # Cheap necessary conditions before a full placement decision.
            if small and not idle_total and max_partial < job.num_gpus:
                self.blocked.add(key)
                continue
            if not small and job.nodes_needed(gpn) > idle_total:
                self.blocked.add(key)
                self._maybe_reserve(job, now)
                continue
            plan = place(
                fleet,
                job,
                self.policy,
                rng=self.rng,
                reserved=self.reserved,
                reserved_until=self.reserved_until,
                now=now,
            )
            if not plan.placed:
                self.blocked.add(key)
                self._maybe_reserve(job, now)
                continue
            self._take(st)
            released = self.reserved_for == job.id
            if released:
                self.reserved, self.reserved_for = frozenset(), None
                self.reserved_until = None
            self._start(now, st, plan.allocation(job))
            if released:
                # Shapes blocked only by the reservation may fit now: pass again.
                self.blocked.clear()
                self._pass_greedy(now)
                return
            idle_total = fleet.idle_total
            max_partial = max((f for f, s in fleet.partial.items() if s), default=0)
            if group:
                heapq.heappush(heap, (group[0].order, key))

    def _maybe_reserve(self, job: JobRequest, now: float) -> None:
        # rackwise look-ahead: the first blocked gang holds the racks nearest to fitting it.
        if self.policy != "rackwise" or not self.cfg.lookahead or self.reserved_for is not None:
            return
        if job.is_small(self.cfg.gpus_per_node):
            return
        if now - (job.submit_time or 0.0) < self.cfg.reserve_after_s:
            return
        self.reserved, self.reserved_until = reservation(self.fleet, job, now)
        self.reserved_for = job.id if self.reserved else None
