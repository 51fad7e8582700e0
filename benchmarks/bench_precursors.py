"""Drain before failure, measured (issue #31): rackwise on the seven ITP training traces
with failures announced ahead, against reactive recovery on the same failures.

    .venv/bin/python benchmarks/bench_precursors.py [--traces ../shared/traces/itp]
        [--quick] [--seeds 3] [--false-alarms 0.0011] [--workers 1]

Cells: each trace (read in place, never copied) x GPU counts x1 and x4, at the high
load of ``bench_real_traces.py`` (a fleet of ceil(mean demand / 0.9 / 72) NVL72
racks, at least 2 and at least what the largest job needs), node MTBF 2,000 h (the
grid's shorter cell: failures frequent enough to measure), checkpoints every 60 min,
restarts 10 min, locality required. Each cell is replayed by rackwise twice on the
very same failure sequence (same seed): reactive recovery
(``drain_before_failure=False``, the behaviour before #31) and drain-before-failure
with ``precursor_share`` of the failures announced ``precursor_lead_s`` ahead and
``false_alarm_per_node_day`` false alarms (``placement/sim/precursors.py``).

Figures, GPU-hours summed over the cells (pooled; a ratio of sums, so the cells with
most failures weigh most): lost to failures (work since the last checkpoint plus
restarts, victims included), precautionary restarts, idle GPUs of flagged nodes
(all of them, and only while some job waited in the queue), net = lost +
precautions + drained idle while jobs waited, and the ratios drain / reactive.
Also the geometric mean over the cells of mean JCT, drain / reactive.

1. The headline: half of the failures announced, 1 h ahead, at ``--false-alarms``
   per node-day, seeds 0..``--seeds``-1, one row per cell.
2. The false-alarm sweep at the headline's share and lead (seed 0).
3. The curve: announced share 0, 0.25, 0.5, 0.75, 1 x lead 10 min, 30 min, 1 h,
   4 h, at ``--false-alarms`` (seed 0).

``--quick``: each trace's first 5,000 jobs, seed 0 only, the curve at lead 1 h only.
The full run takes about 10 minutes on one core. Prints figures; no timed asserts.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

import common  # noqa: F401  (puts the repo on sys.path)
from bench_real_traces import GPN, NODES, default_traces, gmean, load, racks_for

from placement.sim.simulation import SimConfig, simulate

MTBF_H = 2000.0
LOAD = 0.9
SHARES = (0.0, 0.25, 0.5, 0.75, 1.0)
LEADS_S = (600.0, 1800.0, 3600.0, 14400.0)
# False alarms per node-day. 0.0011: with MTBF 2,000 h and half of the failures
# announced (0.006 true flags per node-day) a precision of 84%, the best of Liu et
# al. 2022; 0.007: 46%, their classic models'. See placement/README.md.
FALSE_ALARMS = 0.0011
FA_SWEEP = (0.0, 0.0011, 0.007, 0.03)


def run_task(task: dict[str, Any]) -> dict[str, Any]:
    trace = load(task["path"], task["scale"], task["max_jobs"], "required")
    cfg = SimConfig(
        racks=task["racks"],
        nodes_per_rack=NODES,
        gpus_per_node=GPN,
        node_mtbf_hours=MTBF_H,
        seed=task["seed"],
        **task["config"],
    )
    t0 = time.perf_counter()
    m = simulate(trace, "rackwise", cfg).metrics
    pre = m.get("precursors", {})
    return {
        **task,
        "lost": m["gpu_hours_lost"]["failures"],
        "precautions": pre.get("gpu_hours_precautions", 0.0),
        "idle": pre.get("gpu_hours_drained_idle", 0.0),
        "idle_waiting": pre.get("gpu_hours_drained_idle_waiting", 0.0),
        "moves": pre.get("precaution_swaps", 0) + pre.get("precaution_moves", 0),
        "flags": (pre.get("flags_true", 0), pre.get("flags_false", 0)),
        "failures": m["failures"],
        "jct": m["mean_jct_s"],
        "wall": time.perf_counter() - t0,
    }


def drain_config(share: float, lead: float, fa: float) -> dict[str, Any]:
    return {"precursor_share": share, "precursor_lead_s": lead, "false_alarm_per_node_day": fa}


def summarize(pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, float]:
    """Pooled figures of (reactive, drain) pairs of replays."""
    rea = sum(r["lost"] for r, _ in pairs)
    lost = sum(d["lost"] for _, d in pairs)
    pre = sum(d["precautions"] for _, d in pairs)
    idle = sum(d["idle"] for _, d in pairs)
    idle_w = sum(d["idle_waiting"] for _, d in pairs)
    net = lost + pre + idle_w
    return {
        "reactive": rea,
        "lost": lost,
        "precautions": pre,
        "idle": idle,
        "idle_waiting": idle_w,
        "net": net,
        "lost_ratio": lost / rea if rea else math.nan,
        "net_ratio": net / rea if rea else math.nan,
        "net_all_idle_ratio": (lost + pre + idle) / rea if rea else math.nan,
        "jct": gmean([d["jct"] / r["jct"] for r, d in pairs if r["jct"] > 0]),
        "moves": sum(d["moves"] for _, d in pairs),
        "flags_true": sum(d["flags"][0] for _, d in pairs),
        "flags_false": sum(d["flags"][1] for _, d in pairs),
    }


HEAD = (
    "| GPU-h lost, reactive | GPU-h lost, drain | precautionary restarts | drained idle "
    "(while jobs waited) | net | lost ratio | net ratio | net ratio, all idle | JCT ratio |"
)


def row(s: dict[str, float]) -> str:
    return (
        f"| {s['reactive']:,.0f} | {s['lost']:,.0f} | {s['precautions']:,.0f} | "
        f"{s['idle']:,.0f} ({s['idle_waiting']:,.0f}) | {s['net']:,.0f} | {s['lost_ratio']:.3f} | "
        f"{s['net_ratio']:.3f} | {s['net_all_idle_ratio']:.3f} | {s['jct']:.3f} |"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", default=str(default_traces()))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seeds", type=int, default=None, help="headline seeds 0..N-1 (default 3; --quick 1)")
    ap.add_argument("--false-alarms", type=float, default=FALSE_ALARMS, help="per node-day")
    ap.add_argument("--max-jobs", type=int, default=None, help="each trace's first N jobs (--quick 5000)")
    ap.add_argument("--only", default="", help="comma-separated trace names (itp01,...)")
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args(argv)
    seeds = list(range(args.seeds if args.seeds is not None else (1 if args.quick else 3)))
    max_jobs = args.max_jobs if args.max_jobs is not None else (5000 if args.quick else None)
    leads = (3600.0,) if args.quick else LEADS_S
    fa = args.false_alarms
    paths = sorted(Path(args.traces).glob("*.csv"))
    if args.only:
        paths = [p for p in paths if p.stem in set(args.only.split(","))]
    if not paths:
        print(f"no traces in {args.traces}", file=sys.stderr)
        return 2

    cells = []
    for p in paths:
        for scale in (1, 4):
            trace = load(str(p), scale, max_jobs, "required")
            cells.append({"trace": p.stem, "path": str(p), "scale": scale, "racks": racks_for(trace, LOAD)})
    # Every replay, keyed by (cell, seed, config); reactive once per (cell, seed).
    configs: dict[str, dict[str, Any]] = {"reactive": {"drain_before_failure": False}}
    head = drain_config(0.5, 3600.0, fa)
    configs["headline"] = head
    for x in FA_SWEEP:
        configs[f"fa {x}"] = drain_config(0.5, 3600.0, x)
    for share in SHARES:
        for lead in leads:
            configs[f"curve {share} {lead}"] = drain_config(share, lead, fa)
    # Settings named twice (the headline is also a point of each sweep) run once.
    canon = {name: repr(sorted(conf.items())) for name, conf in configs.items()}
    tasks = []
    for c in cells:
        for seed in seeds:
            done: set[str] = set()
            for name, conf in configs.items():
                if (seed > 0 and name not in ("reactive", "headline")) or canon[name] in done:
                    continue  # sweeps on seed 0 only
                done.add(canon[name])
                task = {**c, "seed": seed, "key": canon[name], "name": name, "config": conf}
                tasks.append({**task, "max_jobs": max_jobs})
    wall0 = time.perf_counter()
    if args.workers > 1:
        with multiprocessing.get_context("fork").Pool(args.workers) as pool:
            results = pool.map(run_task, tasks, chunksize=1)
    else:
        results = [run_task(t) for t in tasks]
    wall = time.perf_counter() - wall0
    found = {(r["trace"], r["scale"], r["seed"], r["key"]): r for r in results}

    class ByName(dict[tuple[str, int, int, str], dict[str, Any]]):
        def __missing__(self, k: tuple[str, int, int, str]) -> dict[str, Any]:
            return found[(k[0], k[1], k[2], canon[k[3]])]

    by = ByName()

    def pairs(name: str, seed_list: list[int]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        return [
            (by[(c["trace"], c["scale"], s, "reactive")], by[(c["trace"], c["scale"], s, name)])
            for c in cells
            for s in seed_list
        ]

    print("# Drain before failure: rackwise, drain / reactive on the same failures\n")
    print(
        f"{len(paths)} traces x GPUs x1, x4 = {len(cells)} cells, load {LOAD}, MTBF {MTBF_H:,.0f} h, "
        f"checkpoints 60 min, restarts 10 min, "
        f"{'first ' + str(max_jobs) + ' jobs' if max_jobs else 'whole traces'}; "
        f"{len(results)} replays, {wall:.0f} s wall on {args.workers} worker(s)\n"
    )
    print(
        f"## Headline: half of the failures announced 1 h ahead, {fa} false alarms per node-day, "
        f"seeds {seeds}\n"
    )
    print("| trace | GPUs | racks | seed | failures | flags true/false | moves |" + HEAD[1:])
    print("|---" * 16 + "|")
    for c in cells:
        for s in seeds:
            r = by[(c["trace"], c["scale"], s, "reactive")]
            d = by[(c["trace"], c["scale"], s, "headline")]
            one = summarize([(r, d)])
            print(
                f"| {c['trace']} | x{c['scale']} | {c['racks']} | {s} | {r['failures']} | "
                f"{d['flags'][0]}/{d['flags'][1]} | {d['moves']} " + row(one)
            )
    total = summarize(pairs("headline", seeds))
    print("\nAll cells and seeds, pooled:\n")
    print(HEAD)
    print("|---" * 9 + "|")
    print(row(total))
    cut = 1 - total["lost_ratio"]
    print(
        f"\nGPU-hours lost to failures cut by {100 * cut:.1f}% (target 30%: "
        f"{'met' if cut >= 0.3 else 'not met'}); net of precautionary restarts and of drained "
        f"capacity while jobs waited: {100 * (1 - total['net_ratio']):.1f}%; counting every "
        f"idle GPU of a flagged node: {100 * (1 - total['net_all_idle_ratio']):.1f}%. "
        f"Flags: {total['flags_true']:,} true, {total['flags_false']:,} false "
        f"(precision {total['flags_true'] / max(1, total['flags_true'] + total['flags_false']):.2f})."
    )

    print("\n## False alarms (half announced, 1 h ahead, seed 0)\n")
    print("| false alarms per node-day | precision |" + HEAD[1:])
    print("|---" * 11 + "|")
    for x in FA_SWEEP:
        s = summarize(pairs(f"fa {x}", [0]))
        prec = s["flags_true"] / max(1, s["flags_true"] + s["flags_false"])
        print(f"| {x} | {prec:.2f} " + row(s))

    print(f"\n## The curve: announced share x lead, {fa} false alarms per node-day, seed 0\n")
    for key, title in (("lost_ratio", "GPU-hours lost to failures"), ("net_ratio", "net")):
        print(f"{title}, drain / reactive:\n")
        print("| share \\ lead | " + " | ".join(f"{lead / 60:.0f} min" for lead in leads) + " |")
        print("|---" * (len(leads) + 1) + "|")
        for share in SHARES:
            vals = [summarize(pairs(f"curve {share} {lead}", [0]))[key] for lead in leads]
            print(f"| {share} | " + " | ".join(f"{v:.3f}" for v in vals) + " |")
        print()
    slow = sorted(results, key=lambda r: -r["wall"])[:3]
    print(
        "slowest replays: "
        + ", ".join(f"{r['trace']} x{r['scale']} {r['name']} {r['wall']:.1f} s" for r in slow)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
