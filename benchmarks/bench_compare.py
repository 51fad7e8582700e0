"""rackwise against every baseline on tracegen workloads at moderate and high load.

    .venv/bin/python benchmarks/bench_compare.py [--jobs 20000] [--racks 64] [--seed 1]

Writes the two traces (tracegen, the same seed), replays each under every policy with
the simulator's defaults, and prints one markdown table (the one in the READMEs).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import common  # noqa: F401  (puts the repo on sys.path)

from placement.sim.simulation import POLICY_NAMES, SimConfig, simulate
from placement.sim.trace import read_trace, write_trace
from placement.sim.tracegen import LOADS, generate

COLS = [
    ("policy", "policy", "{}"),
    ("goodput", "goodput", "{:.4f}"),
    ("rack_local_fraction", "rack-local", "{:.3f}"),
    ("excess_racks_mean", "excess racks", "{:.3f}"),
    ("mean_wait_s", "mean wait s", "{:,.0f}"),
    ("p95_wait_s", "p95 wait s", "{:,.0f}"),
    ("mean_jct_s", "mean JCT s", "{:,.0f}"),
    ("gpu_utilization", "util", "{:.3f}"),
    ("completed", "done", "{:,}"),
    ("failures", "fail", "{}"),
    ("in_place_recoveries", "in-place", "{}"),
    ("requeues", "requeue", "{}"),
    ("migrations", "migr", "{}"),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--racks", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--failure-seeds",
        type=int,
        default=4,
        help="also replay with simulator seeds 0..N-1 and summarise goodput",
    )
    args = ap.parse_args()
    cfg = SimConfig(racks=args.racks)
    print(
        f"{args.jobs:,} tracegen jobs (seed {args.seed}) per load on {args.racks} racks "
        "x 18 nodes x 4 GPUs; simulator defaults (cross-rack slowdown 0.43, node MTBF "
        "12,700 h, repair 24 h, checkpoint 60 min, restart 10 min, seed 0)\n"
    )
    print("| load | " + " | ".join(h for _, h, _ in COLS) + " |")
    print("|" + "---|" * (len(COLS) + 1))
    traces = {}
    for name, load in LOADS.items():
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"{name}.csv"
            write_trace(path, generate(args.jobs, load, racks=args.racks, seed=args.seed))
            traces[name] = trace = read_trace(path)
        for policy in POLICY_NAMES:
            t = time.perf_counter()
            m = simulate(trace, policy, cfg).metrics
            m["wall_s"] = time.perf_counter() - t
            cells = [f.format(m[k]) for k, _, f in COLS]
            if policy == "rackwise":
                cells[0] = "**rackwise**"
            print(f"| {name} ({LOADS[name]}) | " + " | ".join(cells) + " |", flush=True)
    if args.failure_seeds > 1:
        # Goodput differences between policies that never span racks come from which
        # jobs the failures happen to hit: show the spread over failure sequences.
        n = args.failure_seeds
        print(f"\nOver simulator seeds 0..{n - 1} (different failure sequences), mean [min, max]:\n")
        print("| load | policy | goodput | mean wait s | rack-local |")
        print("|---|---|---|---|---|")
        for name, trace in traces.items():
            for policy in POLICY_NAMES:
                runs = [
                    simulate(trace, policy, SimConfig(racks=args.racks, seed=s)).metrics for s in range(n)
                ]
                g = [r["goodput"] for r in runs]
                w = [r["mean_wait_s"] for r in runs]
                rl = [r["rack_local_fraction"] for r in runs]
                label = "**rackwise**" if policy == "rackwise" else policy
                print(
                    f"| {name} | {label} | {sum(g) / n:.4f} [{min(g):.4f}, {max(g):.4f}] | "
                    f"{sum(w) / n:,.0f} [{min(w):,.0f}, {max(w):,.0f}] | "
                    f"{sum(rl) / n:.4f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
