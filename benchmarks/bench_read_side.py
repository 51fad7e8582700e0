"""The read side at 1,000 racks: /api/fleet/summary/, /api/fleet/fragmentation/,
/metrics and the console's first snapshot, with the read models computed on
every request (as before) and shared through the cache: after a change with
no worker refreshing them (the reader pays for one computation), after a change
as deployed (a worker's refresh is queued; the reader is served the stored
figure), and with no change; and the refresh's own cost.

    .venv/bin/python benchmarks/bench_read_side.py [--racks 1000] [--repeat 7]

Builds its own database (``rackwise_read_bench``, cloned from a template kept
after the first run, see dbcache.py): racks created and filled
through the services (jobs of 2-16 nodes placed and started until about 70 % of
the nodes are busy, a few nodes failed), then times each request in this
process with Django's test client (no network, so the figures are the server's
work). Medians of ``--repeat`` requests; figures printed, not asserted.
"""

from __future__ import annotations

import argparse
import gzip
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import dbcache  # noqa: E402
import stack  # noqa: E402

DB = "rackwise_read_bench"


def _env() -> dict[str, str]:
    return stack.app_env(DB, redis_db=11, allowed_hosts="testserver")


def fill(racks: int, rng: random.Random):
    from fleet.models import Node
    from fleet.services.jobs import allocations as job_allocations
    from fleet.services.jobs import submit as job_services
    from fleet.services.nodes import moves as node_services
    from fleet.services.nodes.inventory import create_rack
    from fleet.services.users import ensure_user

    t = time.perf_counter()
    for i in range(racks):
        create_rack(None, name=f"r{i:04d}", site=f"site{i // 250}", row=str(i // 25), position=i % 25)
    user = ensure_user(None, "bench", role="operator", tenants=["bench"])[0]
    free = {}
    for node_id, rack_id in Node.objects.order_by("rack_id", "slot").values_list("id", "rack_id"):
        free.setdefault(rack_id, []).append(node_id)
    busy = jobs = 0
    total = sum(len(v) for v in free.values())
    for nodes in free.values():
        target = round(0.7 * len(nodes))
        used = 0
        while used < target:
            take = nodes[used : used + min(target - used, rng.choice([2, 4, 4, 8, 16]))]
            job = job_services.submit_job(
                user,
                job_services.JobSpec(name=f"j{jobs}", tenant="bench", num_nodes=len(take), gpus_per_node=4),
            )
            job_allocations.apply_placement(
                None, job.pk, {node: [0, 1, 2, 3] for node in take}, reason="bench"
            )
            job_allocations.start_job(None, job.pk)
            used += len(take)
            jobs += 1
        busy += used
    for node_id in rng.sample(list(Node.objects.values_list("id", flat=True)), 20):
        node_services.mark_node_failed(user, node_id, reason="bench")
    print(
        f"fleet: {racks} racks, {total} nodes, {jobs} running jobs, {busy} busy nodes, 20 failed "
        f"(built in {time.perf_counter() - t:.0f} s)"
    )
    return user


def open_fleet(db: str, env: dict[str, str], racks: int) -> None:
    """Set Django up in this process on ``db``, a clone of the fleet :func:`fill`
    builds for ``racks`` racks (built once and kept as a template, see
    dbcache.py), with its Redis database (``env``'s REDIS_URL) emptied."""
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rackwise.settings")
    sys.path.insert(0, str(ROOT))
    import django
    import redis

    django.setup()
    from django.db import connections

    def build() -> None:
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
        fill(racks, random.Random(5))
        # The template is copied from a database nobody is connected to: close
        # the connections and the pool that keeps them open.
        connections.close_all()
        connections["default"].close_pool()

    if dbcache.fresh_database(db, f"read-side {racks}", build):
        print(f"fleet: {racks} racks, cloned from the one an earlier run built")
    redis.Redis.from_url(env["REDIS_URL"]).flushdb()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--racks", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    open_fleet(DB, _env(), args.racks)
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.test import Client

    from fleet import read_cache
    from fleet.services.read import read_models

    user = get_user_model().objects.get(username="bench")
    client = Client()
    client.force_login(user)

    def timed(path: str, **headers) -> tuple[float, int]:
        t = time.perf_counter()
        response = client.get(path, headers=headers)
        assert response.status_code == 200, (path, response.status_code)
        return time.perf_counter() - t, len(response.content)

    paths = ["/api/fleet/summary/", "/api/fleet/fragmentation/", "/metrics"]
    rows = []
    for path in paths:
        settings.RACKWISE_READ_MODELS = False
        computed = statistics.median(timed(path)[0] for _ in range(args.repeat))
        settings.RACKWISE_READ_MODELS = True
        # A change with no worker to refresh: the reader computes (max age 0).
        settings.RACKWISE_READ_MODEL_MAX_AGE_S = 0
        no_worker = []
        for _ in range(args.repeat):
            read_cache.bump()  # what a committed change does
            no_worker.append(timed(path)[0])
        # A change, as deployed: the reader is served the stored figure while the
        # worker's refresh is on its way.
        settings.RACKWISE_READ_MODEL_MAX_AGE_S = 10.0
        after_change = []
        for _ in range(args.repeat):
            read_cache.bump()
            after_change.append(timed(path)[0])
        shared = statistics.median(timed(path)[0] for _ in range(args.repeat))
        rows.append((path, computed, statistics.median(no_worker), statistics.median(after_change), shared))
    print(
        f"{'request':<28} {'computed':>10} {'after a change:':>16} {'no worker':>10} {'refresh queued':>15} "
        f"{'unchanged':>10}   (median of {args.repeat}, ms)"
    )
    for path, computed, no_worker, first, shared in rows:
        print(
            f"{path:<28} {computed * 1000:>10.0f} {'':>16} {no_worker * 1000:>10.0f} {first * 1000:>15.1f} "
            f"{shared * 1000:>10.1f}"
        )
    refresh = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        read_models.refresh()
        refresh.append(time.perf_counter() - t)
    print(
        f"the worker's refresh (summary and fragmentation, once per change burst): "
        f"{statistics.median(refresh) * 1000:.0f} ms"
    )
    plain_s, plain = timed("/api/console/racks/")
    zipped_s, zipped = timed("/api/console/racks/", accept_encoding="gzip")
    print(
        f"console snapshot: {plain / 1024:.0f} KB plain ({plain_s * 1000:.0f} ms), "
        f"{zipped / 1024:.0f} KB gzip ({zipped_s * 1000:.0f} ms)"
    )
    assert gzip.decompress(client.get("/api/console/racks/", headers={"accept-encoding": "gzip"}).content)


if __name__ == "__main__":
    main()
