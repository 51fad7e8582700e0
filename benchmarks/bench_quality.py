"""Placement quality against the exact optimum (HiGHS MILP) on small instances.

    .venv/bin/python benchmarks/bench_quality.py [--instances 200] [--seed 0]

Each instance: a fleet of 3-6 NVL72 racks with random busy and failed nodes, and a
batch of 6-16 gangs (1-18 nodes, locality required). Figure: GPUs placed
rack-locally by rackwise's queue pass (schedule) / the most GPUs any assignment of
the batch to racks could place rack-locally (the MILP optimum).

The comparison is run with spare_nodes=0: pure packing, so that the MILP (which
knows nothing of spares) is a true upper bound. Jobs of the batch share a submit
time, so rackwise takes them biggest first (best fit decreasing).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import common  # noqa: F401  (puts the repo on sys.path)
import highspy

from placement.model import Fleet, JobRequest
from placement.place import schedule


def instance(rng: random.Random, spares: int) -> tuple[Fleet, list[JobRequest]]:
    racks = rng.randint(3, 6)
    fleet = Fleet.uniform(racks, spare_nodes=spares)
    for r in fleet.racks:
        busy = rng.randint(0, 14)
        for i, node in enumerate(r.nodes):
            if i < busy:
                fleet.set_health(node.id, "draining")  # held by someone outside the batch
        for node in rng.sample(r.nodes, rng.randint(0, 2)):
            fleet.set_health(node.id, "failed")
    sizes = [1, 2, 3, 4, 6, 8, 12, 16, 18]
    batch = [
        JobRequest(f"b{i}", num_gpus=4 * rng.choice(sizes), locality="required", submit_time=0.0)
        for i in range(rng.randint(6, 16))
    ]
    return fleet, batch


def optimum(fleet: Fleet, batch: list[JobRequest]) -> float:
    """max sum(gpus_j x_jr) s.t. each job in at most one rack, rack capacity."""
    racks = fleet.racks
    nj, nr = len(batch), len(racks)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    nodes = [j.nodes_needed(4) for j in batch]
    x = [[h.addBinary() for _ in range(nr)] for _ in range(nj)]
    for j in range(nj):
        h.addConstr(sum(x[j][r] for r in range(nr)) <= 1)
    for r, rack in enumerate(racks):
        idle = rack.free_count
        h.addConstr(sum(nodes[j] * x[j][r] for j in range(nj)) <= idle)
    h.maximize(sum(4 * nodes[j] * x[j][r] for j in range(nj) for r in range(nr)))
    return float(h.getInfo().objective_function_value)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--instances", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    for spares in (0,):
        rng = random.Random(args.seed)
        ratios: list[float] = []
        t_opt = t_rw = 0.0
        for _ in range(args.instances):
            fleet, batch = instance(rng, spares)
            t = time.perf_counter()
            plan = schedule(fleet, batch, "rackwise")
            t_rw += time.perf_counter() - t
            got = sum(len(p.nodes) * 4 for p in plan.placements if len(p.racks) == 1)
            t = time.perf_counter()
            best = optimum(fleet, batch)
            t_opt += time.perf_counter() - t
            ratios.append(1.0 if best == 0 else got / best)
        mean = statistics.fmean(ratios)
        print(
            f"spare_nodes={spares}: rackwise / optimum over {len(ratios)} instances: "
            f"mean {mean:.4f}, min {min(ratios):.4f}, "
            f"optimal in {sum(r >= 0.9999 for r in ratios)}/{len(ratios)}; "
            f"time rackwise {t_rw * 1000 / len(ratios):.2f} ms, "
            f"HiGHS {t_opt * 1000 / len(ratios):.1f} ms per instance"
        )


if __name__ == "__main__":
    main()
