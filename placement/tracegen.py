"""Synthetic job traces: ``python -m placement.tracegen --jobs N --load L --seed S``.

1. Sizes are drawn from a mix running from single GPUs to multi-rack gangs (powers of
   two, the shapes training jobs use; see SIZE_MIX).
2. Durations are log-normal (heavy-tailed: median ``--median-minutes``, sigma 1.3),
   clipped to [1 minute, 7 days].
3. Arrivals are a Poisson process whose rate makes the offered load (GPU-seconds asked
   per second over the fleet's GPUs) equal ``--load``.
4. Multi-node jobs get a locality (mostly preferred, some required, a few none); gangs
   bigger than a rack half the time ask for 16-node segments; a fifth of the jobs are
   not preemptible and a tenth have a higher priority.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections.abc import Sequence

from placement.trace import COLUMNS, write_trace

# GPUs -> share of jobs.
SIZE_MIX: dict[int, float] = {
    1: 0.16, 2: 0.08, 4: 0.12, 8: 0.12, 16: 0.12, 32: 0.12, 64: 0.14, 128: 0.09, 256: 0.05,
}


def generate(
    jobs: int,
    load: float,
    *,
    racks: int = 64,
    nodes_per_rack: int = 18,
    gpus_per_node: int = 4,
    seed: int = 0,
    median_minutes: float = 60.0,
    sigma: float = 1.3,
    mix: dict[int, float] | None = None,
) -> list[dict[str, object]]:
    """Rows of a trace (dicts with the trace columns), sorted by submit time."""
    if jobs < 1 or load <= 0:
        raise ValueError("jobs must be >= 1 and load > 0")
    rng = random.Random(seed)
    mix = mix or SIZE_MIX
    total_gpus = racks * nodes_per_rack * gpus_per_node
    sizes_all = [g for g in mix if g <= total_gpus]
    weights = [mix[g] for g in sizes_all]
    sizes = rng.choices(sizes_all, weights, k=jobs)
    durations = [
        min(7 * 86400.0, max(60.0, median_minutes * 60 * math.exp(rng.gauss(0, sigma))))
        for _ in range(jobs)
    ]
    work = sum(g * d for g, d in zip(sizes, durations, strict=True))
    span = work / (load * total_gpus)
    t = 0.0
    rows: list[dict[str, object]] = []
    for i, (g, d) in enumerate(zip(sizes, durations, strict=True)):
        t += rng.expovariate(jobs / span)
        nodes = math.ceil(g / gpus_per_node)
        if g <= gpus_per_node:
            locality = "none"
        else:
            locality = rng.choices(["preferred", "required", "none"], [0.7, 0.2, 0.1])[0]
        seg = ""
        if nodes > nodes_per_rack and rng.random() < 0.5:
            seg = str(min(16, nodes_per_rack))
        rows.append({
            "job_id": f"j{i:06d}",
            "submit_time": round(t, 3),
            "duration": round(d, 3),
            "num_gpus": g,
            "num_nodes": "",
            "gpus_per_node": "",
            "segment_nodes": seg,
            "locality": locality,
            "priority": 1 if rng.random() < 0.1 else 0,
            "preemptible": 0 if rng.random() < 0.2 else 1,
            "tenant": f"t{rng.randrange(4)}",
        })
    return rows


LOADS = {"moderate": 0.6, "high": 0.85}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m placement.tracegen", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--load", default="moderate",
                    help="offered load: a fraction (0.7) or moderate (0.6) / high (0.85)")
    ap.add_argument("--racks", type=int, default=64)
    ap.add_argument("--nodes-per-rack", type=int, default=18)
    ap.add_argument("--gpus-per-node", type=int, default=4)
    ap.add_argument("--median-minutes", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-o", "--out", default="-", help="output CSV (default stdout)")
    args = ap.parse_args(argv)
    try:
        load = LOADS[args.load] if args.load in LOADS else float(args.load)
    except ValueError:
        ap.error(f"--load must be a number or one of {', '.join(LOADS)}")
    rows = generate(args.jobs, load, racks=args.racks, nodes_per_rack=args.nodes_per_rack,
                    gpus_per_node=args.gpus_per_node, seed=args.seed,
                    median_minutes=args.median_minutes)
    if args.out == "-":
        import csv

        writer = csv.DictWriter(sys.stdout, fieldnames=list(COLUMNS))
        writer.writeheader()
        writer.writerows(rows)
    else:
        write_trace(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
