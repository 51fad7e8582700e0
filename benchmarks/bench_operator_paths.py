"""The operator's decisions at 1,000 racks: checking a plan before it runs (an
approval, a recheck), planning a recovery, planning a defrag and the
fragmentation report, each on a full load of the fleet (``RACKWISE_LIVE_FLEET=0``,
as every one of them did before) and on the in-memory fleet, unchanged and
after one rack changed.

    .venv/bin/python benchmarks/bench_operator_paths.py [--racks 1000] [--repeat 7]

Uses the fleet ``bench_read_side.py`` builds (cloned from the same template, see
dbcache.py): 70 % of the nodes busy with jobs of 2-16 nodes, 20 nodes failed,
so some jobs are recovering. Times each call in this process; medians of
``--repeat`` calls, figures printed, not asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_read_side  # noqa: E402
import stack  # noqa: E402

DB = "rackwise_ops_bench"


def _env() -> dict[str, str]:
    return stack.app_env(DB, redis_db=12, allowed_hosts="testserver")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--racks", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    # The fleet bench_read_side.py builds (the same template: built once for both).
    bench_read_side.open_fleet(DB, _env(), args.racks)
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import transaction

    from fleet import engine
    from fleet.choices import JobState
    from fleet.models import Job, Rack
    from fleet.services.actions import propose as actions
    from fleet.services.decisions import defrag as defrag_services
    from fleet.services.decisions import recovery
    from fleet.services.racks import bump_versions

    operator = get_user_model().objects.get(username="bench")
    recovering = list(Job.objects.select_related("tenant").filter(state=JobState.RECOVERING).order_by("pk"))
    assert recovering, "the bench fleet has no recovering job"
    job = recovering[0]
    action = recovery.plan_recovery(job.pk)
    assert action is not None, "no recovery plan for the bench job"
    some_rack = Rack.objects.order_by("pk").values_list("pk", flat=True).first()

    def one_rack_changed() -> None:
        with transaction.atomic():
            bump_versions([some_rack])  # what every change of a rack does

    calls = {
        "check a plan (approve, recheck)": lambda: actions.check_plan(action),
        "plan a recovery": lambda: recovery.recovery_proposal(job),
        "plan a defrag (operator's request)": lambda: defrag_services.plan_defrag(
            operator, defrag_services.DefragGoal(free_racks=1)
        ),
        "fragmentation report": defrag_services.fragmentation_report,
    }

    def median_ms(call, before=None) -> float:
        times = []
        for _ in range(args.repeat):
            if before is not None:
                before()
            t = time.perf_counter()
            call()
            times.append(time.perf_counter() - t)
        return statistics.median(times) * 1000

    print(
        f"{'call':<36} {'full load':>10} {'in memory':>10} {'after a change':>15}   "
        f"(median of {args.repeat}, ms)"
    )
    for name, call in calls.items():
        settings.RACKWISE_LIVE_FLEET = False
        full = median_ms(call)
        settings.RACKWISE_LIVE_FLEET = True
        call()  # the first call builds the in-memory fleet
        unchanged = median_ms(call)
        changed = median_ms(call, before=one_rack_changed)
        print(f"{name:<36} {full:>10.0f} {unchanged:>10.0f} {changed:>15.0f}")
    snap = engine.load_snapshot()
    print(
        f"fleet: {len(snap.fleet.racks)} racks, {len(snap.fleet.nodes)} nodes, "
        f"{len(snap.fleet.allocations)} running jobs"
    )


if __name__ == "__main__":
    main()
