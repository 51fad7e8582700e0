"""Synthetic job traces: ``python -m placement.sim.tracegen --jobs N --load L --seed S``.

1. Sizes are drawn from a mix running from single GPUs to multi-rack gangs (powers of
   two, the shapes training jobs use; see SIZE_MIX).
2. Durations are log-normal (heavy-tailed: median ``--median-minutes``, sigma 1.3),
   clipped to [1 minute, 7 days].
3. Arrivals are a Poisson process whose rate makes the offered load (GPU-seconds asked
   per second over the fleet's GPUs) equal ``--load``.
4. Multi-node jobs get a locality (mostly preferred, some required, a few none); gangs
   bigger than a rack half the time ask for 16-node segments; a fifth of the jobs are
   not preemptible and a tenth have a higher priority.

``--mix itp`` follows the Microsoft ITP traces instead (see ITP below): their size
mix, log-normal durations fitted to them, and their bursty arrivals (batches of
jobs submitted at the same second, long-tailed gaps); rows carry no locality,
priority, preemptibility or tenant, like the real traces, so the simulator's
defaults apply.
"""

from __future__ import annotations

import argparse
import csv
import math
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from placement.sim.trace import COLUMNS, write_trace

# GPUs -> share of jobs.
SIZE_MIX: dict[int, float] = {
    1: 0.16,
    2: 0.08,
    4: 0.12,
    8: 0.12,
    16: 0.12,
    32: 0.12,
    64: 0.14,
    128: 0.09,
    256: 0.05,
}


@dataclass(frozen=True)
class Preset:
    mix: dict[int, float]
    median_minutes: float
    sigma: float
    # Arrivals: with probability ``same_instant`` a job is submitted at the same second
    # as the one before; otherwise the gap is hyperexponential (two exponential phases,
    # balanced means) with coefficient of variation ``gap_cv`` (1.0: the exponential
    # gaps of a Poisson process).
    same_instant: float = 0.0
    gap_cv: float = 1.0
    bare: bool = False  # rows carry only the four required columns' information


# Summary numbers of the seven ITP traces in ../shared/traces/itp (itp01, 02, 05, 07,
# 08, 09, 10; 48,142 jobs), computed once with a short script over the CSVs; the
# traces are not read here.
# * mix: the share of jobs of each num_gpus, computed per trace, then averaged over the
#   seven traces (each cluster weighs the same, so itp07-09's 37k jobs do not drown
#   the others). The traces hold only these seven sizes.
# * durations: log-normal; median 9,744 s (= 162.4 min, the geometric mean of the
#   seven per-trace medians, 6,182-17,761 s) and sigma 1.22 (the mean of the
#   per-trace standard deviations of ln(duration), 0.81-1.78).
# * arrivals: 14.8% of the inter-arrival gaps are zero (the mean over the traces of
#   the share of zero gaps, 0-54%: jobs submitted in batches); the non-zero gaps have
#   a coefficient of variation of 4.80 (the median over the traces, 4.30-11.92),
#   against 1.0 for a Poisson process: many short gaps and a few long lulls, which a
#   two-phase hyperexponential reproduces (a gamma of that CV would put most gaps
#   within a millisecond).
ITP = Preset(
    mix={1: 0.8928, 2: 0.0453, 4: 0.0320, 8: 0.0227, 16: 0.0025, 32: 0.0020, 64: 0.0027},
    median_minutes=9744 / 60,
    sigma=1.22,
    same_instant=0.148,
    gap_cv=4.80,
    bare=True,
)
PRESETS = {"default": Preset(SIZE_MIX, 60.0, 1.3), "itp": ITP}


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
    preset: str | Preset | None = None,
) -> list[dict[str, object]]:
    """Rows of a trace (dicts with the trace columns), sorted by submit time.

    ``preset`` (``"itp"`` or a Preset) sets the size mix, the durations and the
    arrival process together; ``median_minutes`` and ``sigma`` then come from it."""
    if jobs < 1 or load <= 0:
        raise ValueError("jobs must be >= 1 and load > 0")
    pre = PRESETS[preset] if isinstance(preset, str) else preset
    if pre is not None:
        mix, median_minutes, sigma = mix or pre.mix, pre.median_minutes, pre.sigma
    rng = random.Random(seed)
    mix = mix or SIZE_MIX
    total_gpus = racks * nodes_per_rack * gpus_per_node
    sizes_all = [g for g in mix if g <= total_gpus]
    weights = [mix[g] for g in sizes_all]
    sizes = rng.choices(sizes_all, weights, k=jobs)
    durations = [
        min(7 * 86400.0, max(60.0, median_minutes * 60 * math.exp(rng.gauss(0, sigma)))) for _ in range(jobs)
    ]
    work = sum(g * d for g, d in zip(sizes, durations, strict=True))
    span = work / (load * total_gpus)
    t = 0.0
    rows: list[dict[str, object]] = []
    for i, (g, d) in enumerate(zip(sizes, durations, strict=True)):
        if pre is not None and pre.bare:
            t += _gap(rng, pre, span / jobs)
            rows.append(
                {"job_id": f"j{i:06d}", "submit_time": round(t, 3), "duration": round(d, 3), "num_gpus": g}
            )
            continue
        t += rng.expovariate(jobs / span)
        nodes = math.ceil(g / gpus_per_node)
        if g <= gpus_per_node:
            locality = "none"
        else:
            locality = rng.choices(["preferred", "required", "none"], [0.7, 0.2, 0.1])[0]
        seg = ""
        if nodes > nodes_per_rack and rng.random() < 0.5:
            seg = str(min(16, nodes_per_rack))
        rows.append(
            {
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
            }
        )
    return rows


def _gap(rng: random.Random, pre: Preset, mean: float) -> float:
    """One inter-arrival gap of mean ``mean``: zero with probability ``same_instant``,
    else hyperexponential with balanced means and the preset's coefficient of
    variation c: phase 1 with probability p = (1 + sqrt((c^2 - 1) / (c^2 + 1))) / 2
    and mean m / (2p), else mean m / (2 (1 - p)), m the mean non-zero gap (scaled so
    the overall mean stays ``mean`` and the offered load is the one asked for)."""
    if rng.random() < pre.same_instant:
        return 0.0
    m = mean / (1.0 - pre.same_instant)
    c2 = max(1.0, pre.gap_cv**2)
    p = (1 + math.sqrt((c2 - 1) / (c2 + 1))) / 2
    phase_mean = m / (2 * p) if rng.random() < p else m / (2 * (1 - p))
    return rng.expovariate(1.0 / phase_mean)


LOADS = {"moderate": 0.6, "high": 0.85}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m placement.sim.tracegen",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument(
        "--load", default="moderate", help="offered load: a fraction (0.7) or moderate (0.6) / high (0.85)"
    )
    ap.add_argument("--racks", type=int, default=64)
    ap.add_argument("--nodes-per-rack", type=int, default=18)
    ap.add_argument("--gpus-per-node", type=int, default=4)
    ap.add_argument(
        "--median-minutes",
        type=float,
        default=None,
        help="median duration (default 60; with --mix itp, the ITP figure)",
    )
    ap.add_argument(
        "--mix",
        choices=sorted(PRESETS),
        default="default",
        help="default (single GPUs to multi-rack gangs) or itp (the ITP traces)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-o", "--out", default="-", help="output CSV (default stdout)")
    args = ap.parse_args(argv)
    try:
        load = LOADS[args.load] if args.load in LOADS else float(args.load)
    except ValueError:
        ap.error(f"--load must be a number or one of {', '.join(LOADS)}")
    pre: Preset | None = PRESETS[args.mix]
    if pre is not None and args.median_minutes is not None:
        pre = Preset(pre.mix, args.median_minutes, pre.sigma, pre.same_instant, pre.gap_cv, pre.bare)
    if args.mix == "default" and args.median_minutes is None:
        pre = None  # exactly the old generator (and its random sequence)
    rows = generate(
        args.jobs,
        load,
        racks=args.racks,
        nodes_per_rack=args.nodes_per_rack,
        gpus_per_node=args.gpus_per_node,
        seed=args.seed,
        preset=pre,
    )
    if args.out == "-":
        writer = csv.DictWriter(sys.stdout, fieldnames=list(COLUMNS))
        writer.writeheader()
        writer.writerows(rows)
    else:
        write_trace(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
