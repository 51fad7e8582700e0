"""Replay speed: 70,000 tracegen jobs on 100 racks.

    .venv/bin/python benchmarks/bench_replay.py [--jobs 70000] [--racks 100]
        [--load 0.85] [--policy rackwise|all] [--no-defrag] [--set FIELD=VALUE]
        [--repeat 1]

Generates the trace (seed 0), then times the replay of each policy; prints jobs per
second of wall time and the simulator's own figures. ``--no-defrag``: rackwise
without the simulated defrag plans (``defrag_after_s=None``); ``--set FIELD=VALUE``
(repeatable): any other SimConfig field, e.g. ``--set rackwise_queue=greedy`` for
the queue before issue #12; ``--repeat N``: N replays each, the median wall time
printed (the figures are the same every time).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import common  # noqa: F401  (puts the repo on sys.path)

from placement.sim.simulation import POLICY_NAMES, SimConfig, simulate
from placement.sim.state import config_overrides
from placement.sim.trace import read_trace, write_trace
from placement.sim.tracegen import generate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=70_000)
    ap.add_argument("--racks", type=int, default=100)
    ap.add_argument("--load", type=float, default=0.85)
    ap.add_argument("--policy", default="rackwise")
    ap.add_argument("--no-defrag", action="store_true")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a SimConfig field (repeatable)",
    )
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    try:
        overrides = config_overrides(args.set)
    except ValueError as e:
        ap.error(str(e))
    if args.no_defrag:
        overrides["defrag_after_s"] = None
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.csv"
        t = time.perf_counter()
        write_trace(path, generate(args.jobs, args.load, racks=args.racks, seed=0))
        trace = read_trace(path)
        print(
            f"trace: {args.jobs:,} jobs, load {args.load}, {args.racks} racks "
            f"(generated and parsed in {time.perf_counter() - t:.1f} s)"
        )
    policies = list(POLICY_NAMES) if args.policy == "all" else [args.policy]
    cfg = SimConfig(racks=args.racks, **overrides)
    for policy in policies:
        walls = []
        for _ in range(max(1, args.repeat)):
            t = time.perf_counter()
            result = simulate(trace, policy, cfg)
            m = result.metrics
            walls.append(time.perf_counter() - t)
        wall = statistics.median(walls)
        print(
            f"{policy:<11} replay {wall:6.1f} s ({args.jobs / wall:,.0f} jobs/s); "
            f"completed {m['completed']:,}, rejected {m['rejected']}, "
            f"util {m['gpu_utilization']:.3f}, mean wait {m['mean_wait_s']:.0f} s, "
            f"failures {m['failures']}; decisions {result.fingerprint}"
        )


if __name__ == "__main__":
    main()
