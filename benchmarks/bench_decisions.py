"""Decision latency on a 1,000-rack fleet (72,000 GPUs).

    .venv/bin/python benchmarks/bench_decisions.py [--racks 1000] [--samples 300]

Prints p50/p99 of place() per policy at 50/70/90 % occupancy, recovery decision
time, defrag plan time (also for one-node jobs blocked by small jobs on every node),
fragmentation time, and with quotas on (four tenants, the fleet shared out): quota
admission plus place() per decision, and reclaim() for a 16-node gang of a tenant
under its quota on a full fleet. Figures, not pass/fail tests.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import time

from common import fill, ms, pct, random_job

from placement.defrag import FreeRacks, defragment
from placement.fragmentation import fragmentation
from placement.model import Allocation, Fleet, JobRequest
from placement.place import place
from placement.quota import Ledger, Quota
from placement.reclaim import reclaim
from placement.recover import recover

POLICIES = ["rackwise", "first-fit", "random", "slurm-block", "kueue-tas"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--racks", type=int, default=1000)
    ap.add_argument("--samples", type=int, default=300)
    args = ap.parse_args()
    print(
        f"fleet: {args.racks} racks x 18 nodes x 4 GPUs = {args.racks * 72:,} GPUs; "
        f"{args.samples} decisions per cell"
    )
    print(f"{'occupancy':>9}  {'policy':<11}  {'p50 ms':>7}  {'p99 ms':>7}  {'max ms':>7}")
    states: dict[float, Fleet] = {}
    for occ in (0.5, 0.7, 0.9):
        fleet = Fleet.uniform(args.racks)
        t0 = time.perf_counter()
        fill(fleet, occ, seed=int(occ * 100))
        fill_s = time.perf_counter() - t0
        states[occ] = fleet
        held = 1 - fleet.free_gpus() / fleet.total_gpus
        rng = random.Random(1)
        jobs = [random_job(rng, f"q{i}") for i in range(args.samples)]
        for policy in POLICIES:
            prng = random.Random(2)
            times = []
            for job in jobs:
                t = time.perf_counter()
                place(fleet, job, policy, rng=prng)
                times.append(time.perf_counter() - t)
            print(
                f"{held:>8.0%}  {policy:<11}  {ms(pct(times, 0.5)):>7}  "
                f"{ms(pct(times, 0.99)):>7}  {ms(max(times)):>7}"
            )
        print(f"{'':>9}  (filling the fleet took {fill_s:.1f} s, {len(fleet.allocations):,} jobs)")

    for occ in (0.7, 0.9):
        with_quotas(states[occ], args.samples)
    reclaim_on_a_full_fleet(args.racks)

    fleet = states[0.7]
    rng = random.Random(3)
    gangs = sorted(j for j, a in fleet.allocations.items() if len(a.nodes) > 1)
    times = []
    actions: dict[str, int] = {}
    for jid in rng.sample(gangs, min(200, len(gangs))):
        node = rng.choice(sorted(fleet.allocations[jid].nodes))
        t = time.perf_counter()
        plan = recover(fleet, jid, [node])
        times.append(time.perf_counter() - t)
        actions[plan.action] = actions.get(plan.action, 0) + 1
    print(
        f"\nrecover() at 70 % occupancy, {len(times)} single-node failures: "
        f"p50 {ms(pct(times, 0.5))} ms, p99 {ms(pct(times, 0.99))} ms; actions {actions}"
    )

    for occ in (0.7, 0.9):
        fleet = states[occ]
        whole = sum(1 for r in fleet.racks if r.free_count == r.healthy)
        t = time.perf_counter()
        plan = defragment(fleet, target=FreeRacks(whole + 5))
        dt = time.perf_counter() - t
        print(
            f"defragment(target={whole} + 5 whole free racks), rackwise-filled fleet at "
            f"{occ:.0%}: {dt * 1000:.0f} ms, feasible={plan.feasible}, "
            f"{len(plan.moves)} moves, {plan.cost_gpu_hours:.1f} GPU-h"
        )
    # Defrag needs stranded capacity: fill fleets with the topology-blind random policy
    # (rackwise keeps racks whole by itself, so there is little to defragment).
    for occ in (0.7, 0.9):
        fleet = Fleet.uniform(args.racks)
        fill(fleet, occ, seed=7, policy="random")
        pending = [JobRequest(f"p{i}", num_gpus=64, locality="required") for i in range(10)]
        t = time.perf_counter()
        plan = defragment(fleet, pending)
        dt = time.perf_counter() - t
        print(
            f"defragment() for 10 pending 16-node gangs, random-filled fleet at {occ:.0%}: "
            f"{dt * 1000:.0f} ms, feasible={plan.feasible}, {len(plan.moves)} moves, "
            f"{plan.cost_gpu_hours:.1f} GPU-h, made placeable "
            f"{len(plan.jobs_made_placeable)}, fragmentation "
            f"{plan.fragmentation_before:.3f} -> {plan.fragmentation_after:.3f}"
        )
        whole = sum(1 for r in fleet.racks if r.free_count == r.healthy)
        t = time.perf_counter()
        plan = defragment(fleet, target=FreeRacks(whole + 5))
        dt = time.perf_counter() - t
        print(
            f"defragment(target={whole} + 5 whole free racks), random-filled at {occ:.0%}: "
            f"{dt * 1000:.0f} ms, feasible={plan.feasible}, {len(plan.moves)} moves, "
            f"{plan.cost_gpu_hours:.1f} GPU-h"
        )
        t = time.perf_counter()
        rep = fragmentation(fleet)
        dt = time.perf_counter() - t
        print(
            f"fragmentation(), random-filled fleet at {occ:.0%}: {dt * 1000:.1f} ms "
            f"(fraction {rep.fraction:.3f}, largest rack-local job {rep.largest_job_gpus} "
            "GPUs)"
        )

    # GPU-level fragmentation: 1- and 2-GPU jobs on every node, no node with 4 free GPUs.
    fleet = Fleet.uniform(args.racks)
    rng = random.Random(11)
    for i, node in enumerate(fleet.nodes.values()):
        left = rng.choice([1, 2, 3])
        while left:
            g = min(left, rng.choice([1, 2]))
            job = JobRequest(f"s{i}-{left}", num_gpus=g, preemptible=rng.random() < 0.8)
            fleet.allocate(Allocation(job, {node.id: node.free_indices(g)}, [[node.id]]))
            left -= g
    for count in (1, 3):
        pending = [JobRequest(f"w{i}", num_gpus=4) for i in range(count)]
        t = time.perf_counter()
        plan = defragment(fleet, pending)
        dt = time.perf_counter() - t
        print(
            f"defragment() for {count} pending 4-GPU job(s), small jobs on every node "
            f"({len(fleet.allocations):,}): {dt * 1000:.0f} ms, feasible={plan.feasible}, "
            f"{len(plan.moves)} moves, made placeable {len(plan.jobs_made_placeable)}"
        )


TENANTS = ("a", "b", "c", "d")


def shared_out(fleet: Fleet) -> Ledger:
    """The running jobs shared among four tenants with equal nominal quotas
    (tenant "a" holds none: it is under its quota and may reclaim)."""
    for i, jid in enumerate(sorted(fleet.allocations)):
        alloc = fleet.allocations[jid]
        alloc.job = dataclasses.replace(alloc.job, tenant=TENANTS[1 + i % 3])
    ledger = Ledger(4, fleet.total_gpus, {t: Quota(fleet.total_gpus // 4) for t in TENANTS})
    for alloc in fleet.allocations.values():
        ledger.take(alloc.job.tenant, alloc.gpus)
    return ledger


def with_quotas(fleet: Fleet, samples: int) -> None:
    """Quotas on: admission then place() per decision, against place() alone on
    the same jobs in the same run; three rounds, the median of each p99 (the
    machine is shared: compare the two)."""
    ledger = shared_out(fleet)
    held = 1 - fleet.free_gpus() / fleet.total_gpus
    rng = random.Random(1)
    jobs = [dataclasses.replace(random_job(rng, f"q{i}"), tenant=TENANTS[i % 4]) for i in range(samples)]
    # Half of the racks reserved, an eighth for each tenant.
    reservations = {r.id: TENANTS[i % 8] for i, r in enumerate(fleet.racks) if i % 8 < 4}
    rounds: dict[str, list[float]] = {"admit": [], "plain": [], "quota": [], "reserved": []}
    for _ in range(3):
        admit, plain, quota, reserved = [], [], [], []
        for job in jobs:
            t = time.perf_counter()
            place(fleet, job, "rackwise", rng=random.Random(2))
            plain.append(time.perf_counter() - t)
            t = time.perf_counter()
            admitted = ledger.admit(job.tenant, job.num_gpus).admitted
            admit.append(time.perf_counter() - t)
            if admitted:
                place(fleet, job, "rackwise", rng=random.Random(2))
            quota.append(time.perf_counter() - t)
            fleet.reservations = reservations
            t = time.perf_counter()
            if ledger.admit(job.tenant, job.num_gpus).admitted:
                place(fleet, job, "rackwise", rng=random.Random(2))
            reserved.append(time.perf_counter() - t)
            fleet.reservations = {}
        for key, times in (("admit", admit), ("plain", plain), ("quota", quota), ("reserved", reserved)):
            rounds[key].append(pct(times, 0.99))
    p99 = {key: ms(statistics.median(values)) for key, values in rounds.items()}
    # Once per scheduling pass and cohort: the fair shares over every tenant's
    # demand (held plus waiting), then one fair-share reclaim's budgets.
    waiting = {t: 0 for t in TENANTS}
    for job in jobs:
        waiting[job.tenant] += job.num_gpus
    weights = {t: 1.0 + i for i, t in enumerate(TENANTS)}
    fair_times = []
    for _ in range(200):
        t = time.perf_counter()
        fair = ledger.fair(waiting, weights)
        ledger.fair_reclaim("a", 64, fair)
        fair_times.append(time.perf_counter() - t)
    print(
        f"quotas on, {held:.0%} held: admission + place() p99 {p99['quota']} ms (admission alone "
        f"{p99['admit']} ms; place() alone on the same jobs {p99['plain']} ms; with half the racks "
        f"reserved for tenants {p99['reserved']} ms); median of 3 rounds; fair shares and a "
        f"fair-share reclaim's budgets, once per pass: median {ms(pct(fair_times, 0.5))} ms"
    )


def reclaim_on_a_full_fleet(racks: int) -> None:
    """reclaim() for a 16-node required gang of a tenant under its quota, on a
    fleet filled to 98 % (no whole rack free), by borrowers."""
    fleet = Fleet.uniform(racks)
    fill(fleet, 0.98, seed=5)
    budgets = shared_out(fleet).reclaim_budgets()
    gang = JobRequest("gang", num_nodes=16, gpus_per_node=4, locality="required", tenant="a")
    times = []
    for _ in range(5):
        t = time.perf_counter()
        plan = reclaim(fleet, gang, lambda j: j.tenant in budgets, budgets, now=0.0)
        times.append(time.perf_counter() - t)
    held = 1 - fleet.free_gpus() / fleet.total_gpus
    where = ", ".join(plan.placement.racks) if plan.placement else "-"
    print(
        f"quotas on, {held:.0%} held: reclaim() for a 16-node required gang of a tenant under its "
        f"quota: median {ms(pct(times, 0.5))} ms; {len(plan.victims)} victim(s), "
        f"{plan.cost_gpu_hours:.1f} GPU-h, in {where}"
    )


if __name__ == "__main__":
    main()
