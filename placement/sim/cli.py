"""``python -m placement.sim.cli TRACE.csv [options]``: replay a job trace.

See placement/README.md for the trace format, the options and the JSON keys; they
are a contract, keep them stable.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from placement.sim.simulation import POLICY_NAMES, SimConfig, SimResult, simulate
from placement.sim.trace import TraceError, read_trace

JSON_KEYS = (
    "policy",
    "jobs",
    "completed",
    "rejected",
    "gpu_utilization",
    "rack_local_fraction",
    "excess_racks_mean",
    "mean_wait_s",
    "p50_wait_s",
    "p95_wait_s",
    "mean_jct_s",
    "makespan_s",
    "goodput",
    "failures",
    "in_place_recoveries",
    "requeues",
    "migrations",
    "migration_gpu_hours",
    "gpu_hour_weighted_wait_s",
    "bounded_slowdown_mean",
    "p95_wait_s_by_size",
    "max_wait_s_by_size",
    "p99_wait_s_by_size",
    "max_slowdown_by_size",
    "gpu_hours_lost",
    "useful_utilization",
    "wall_s",
)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m placement.sim.cli", description="Replay a job trace under placement policies."
    )
    ap.add_argument("trace", help="CSV with job_id, submit_time, duration, num_gpus, ...")
    ap.add_argument("--racks", type=int, default=64)
    ap.add_argument("--nodes-per-rack", type=int, default=18)
    ap.add_argument("--gpus-per-node", type=int, default=4)
    ap.add_argument("--policy", default="rackwise", help=f"one of {', '.join(POLICY_NAMES)}, or all")
    ap.add_argument("--cross-rack-slowdown", type=float, default=0.43)
    ap.add_argument("--node-mtbf-hours", type=float, default=12700.0)
    ap.add_argument("--repair-hours", type=float, default=24.0)
    ap.add_argument("--checkpoint-minutes", type=float, default=60.0)
    ap.add_argument("--restart-minutes", type=float, default=10.0)
    ap.add_argument(
        "--requeue-delay-s",
        type=float,
        default=120.0,
        help="a requeued job may start again this long after it stopped",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--locality",
        choices=("required", "preferred", "none"),
        default="required",
        help="locality of trace rows that carry none (default required: "
        "real NVL72 training jobs are submitted that way)",
    )
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument(
        "--plot", metavar="FILE.png", help="draw utilization, queue length and fragmentation over time"
    )
    return ap


def _check(ap: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    if args.policy != "all" and args.policy not in POLICY_NAMES:
        ap.error(f"--policy must be one of {', '.join(POLICY_NAMES)} or all")
    for name in ("racks", "nodes_per_rack", "gpus_per_node"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if not 0 <= args.cross_rack_slowdown < 1:
        ap.error("--cross-rack-slowdown must be in [0, 1)")
    for name in (
        "node_mtbf_hours",
        "repair_hours",
        "checkpoint_minutes",
        "restart_minutes",
        "requeue_delay_s",
    ):
        if getattr(args, name) < 0:
            ap.error(f"--{name.replace('_', '-')} must not be negative")
    return list(POLICY_NAMES) if args.policy == "all" else [args.policy]


class ProgressBar:
    """A one-line progress bar on stderr, drawn only on a terminal."""

    def __init__(self, total_policies: int) -> None:
        self.enabled = sys.stderr.isatty()
        self.total_policies = total_policies
        self.index = 0

    def __call__(self, policy: str, sim_t: float, done: int, total: int) -> None:
        if not self.enabled:
            return
        width = 30
        frac = done / total if total else 1.0
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        sys.stderr.write(
            f"\r[{self.index + 1}/{self.total_policies}] {policy:<11} [{bar}] "
            f"{done}/{total} jobs, t={sim_t / 3600:,.1f} h "
        )
        sys.stderr.flush()

    def finish(self) -> None:
        if self.enabled:
            sys.stderr.write("\r" + " " * 90 + "\r")
            sys.stderr.flush()
        self.index += 1


def worst_p95(row: dict[str, Any]) -> tuple[float, str]:
    """The highest per-size-class p95 wait and its class."""
    by = row["p95_wait_s_by_size"]
    cls = max(by, key=lambda c: by[c])  # the first class on ties
    return by[cls], cls if by[cls] > 0 else "-"


def table(rows: list[dict[str, Any]]) -> str:
    """The headline set first (JCT, GPU-hour-weighted wait, bounded slowdown, worst p95
    by size class, rack-local, useful utilization), then the context."""
    cols = [
        ("policy", "policy", "{}"),
        ("completed", "done", "{}"),
        ("rejected", "rej", "{}"),
        ("mean_jct_s", "JCT s", "{:.0f}"),
        ("gpu_hour_weighted_wait_s", "GPU-h wait s", "{:.0f}"),
        ("bounded_slowdown_mean", "bsld", "{:.2f}"),
        ("worst_p95", "worst p95 s (class)", "{}"),
        ("rack_local_fraction", "rack-local", "{:.3f}"),
        ("useful_utilization", "useful util", "{:.3f}"),
        ("goodput", "goodput", "{:.3f}"),
        ("mean_wait_s", "wait mean s", "{:.0f}"),
        ("failures", "fail", "{}"),
        ("requeues", "requeue", "{}"),
        ("migrations", "migr", "{}"),
        ("wall_s", "wall s", "{:.1f}"),
    ]
    shown = []
    for r in rows:
        w, cls = worst_p95(r)
        shown.append({**r, "worst_p95": f"{w:.0f} ({cls})"})
    cells = [[h for _, h, _ in cols]] + [[f.format(r[k]) for k, _, f in cols] for r in shown]
    widths = [max(len(c[i]) for c in cells) for i in range(len(cols))]
    lines = [
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def plot(results: list[SimResult], path: str) -> None:
    import matplotlib  # only for --plot: the simulator itself needs no plotting library

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    for res in results:
        if not res.series:
            continue
        t0 = res.series[0][0]
        ts = [(s[0] - t0) / 3600 for s in res.series]
        axes[0].plot(ts, [s[1] for s in res.series], label=res.policy, lw=1)
        axes[1].plot(ts, [s[2] for s in res.series], label=res.policy, lw=1)
        axes[2].plot(ts, [s[3] for s in res.series], label=res.policy, lw=1)
    axes[0].set_ylabel("GPU utilization")
    axes[1].set_ylabel("queue length (jobs)")
    axes[2].set_ylabel("fragmentation\n(share of free GPUs)")
    axes[2].set_xlabel("simulated time (h)")
    axes[0].legend(loc="lower right", fontsize=8)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    policies = _check(ap, args)
    try:
        trace = read_trace(
            args.trace, gpus_per_node=args.gpus_per_node, checkpoint_minutes=args.checkpoint_minutes
        )
    except TraceError as exc:
        print(f"{args.trace}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{args.trace}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    cfg = SimConfig(
        racks=args.racks,
        nodes_per_rack=args.nodes_per_rack,
        gpus_per_node=args.gpus_per_node,
        cross_rack_slowdown=args.cross_rack_slowdown,
        node_mtbf_hours=args.node_mtbf_hours,
        repair_hours=args.repair_hours,
        checkpoint_minutes=args.checkpoint_minutes,
        restart_minutes=args.restart_minutes,
        requeue_delay_s=args.requeue_delay_s,
        seed=args.seed,
        locality=args.locality,
        samples=400 if args.plot else 0,
    )
    bar = ProgressBar(len(policies))
    results: list[SimResult] = []
    for policy in policies:
        results.append(simulate(trace, policy, cfg, progress=bar))
        bar.finish()
    rows = [{k: r.metrics[k] for k in JSON_KEYS} for r in results]
    if args.json:
        print(json.dumps(rows if args.policy == "all" else rows[0], indent=2))
    else:
        print(
            f"{len(trace)} jobs on {args.racks} racks x {args.nodes_per_rack} nodes x "
            f"{args.gpus_per_node} GPUs, seed {args.seed}, rows without locality: "
            f"{args.locality}"
        )
        print(table(rows))
    if args.plot:
        plot(results, args.plot)
        if not args.json:
            print(f"plot written to {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
