"""Submitted-to-placed latency of the whole control loop, on a 100-rack fleet.

Starts its own stack on this machine: a fresh PostgreSQL database
(``rackwise_bench``), daphne serving the API, and two Celery workers on Redis.
Jobs are POSTed over HTTP at a fixed rate (open loop) and the latency is read
from the database (``placed_at - submitted_at``). Figures are printed, not
asserted; the machine is shared, so compare runs made together.

    .venv/bin/python benchmarks/bench_submit_latency.py [--rates 10 100] [--seconds 15]

Needs PostgreSQL on 127.0.0.1:5432 and Redis (REDIS_URL, default 127.0.0.1:6379).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DB = "rackwise_bench"
SHAPES = [{"num_gpus": 1}, {"num_gpus": 2}, {"num_gpus": 4}, {"num_nodes": 2, "gpus_per_node": 4}]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    return os.environ | {
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{DB}",
        "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/14"),
        "DEBUG": "0",
        "SECRET_KEY": "bench",
        "ALLOWED_HOSTS": "127.0.0.1",
        "RACKWISE_SIM_STEP_SECONDS": "0",
        "RACKWISE_DEMO": "0",
        "LOG_LEVEL": "WARNING",
        # Plain http on loopback, and one user submitting at benchmark rates.
        "SECURE_SSL_REDIRECT": "0",
        "RACKWISE_THROTTLE_USER": "1000000/min",
    }


def _manage(*args: str) -> str:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=_env(), check=True, capture_output=True, text=True
    ).stdout


def setup(racks: int) -> str:
    import psycopg
    import redis

    with psycopg.connect("postgres://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DB}")
    redis.Redis.from_url(_env()["REDIS_URL"]).flushdb()
    _manage("migrate", "-v0")
    script = (
        "from fleet.services.inventory import create_rack\n"
        f"for i in range({racks}): create_rack(None, name=f'b{{i:03d}}', site='bench', row=str(i // 10), position=i % 10)\n"
    )
    _manage("shell", "-c", script)
    return _manage("create_api_user", "bench", "--role", "submitter", "--tenant", "bench").strip()


def run_rate(url: str, token: str, rate: float, seconds: float, seed: int) -> list[int]:
    """POST jobs at ``rate`` per second for ``seconds`` (open loop: a slow
    answer does not slow the arrivals). Returns the job ids."""
    rng = random.Random(seed)
    ids: list[int] = []
    lock = threading.Lock()
    threads: list[threading.Thread] = []

    def submit(body: dict) -> None:
        request = urllib.request.Request(
            f"{url}/api/jobs/", data=json.dumps(body).encode(), method="POST",
            headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            job_id = json.loads(response.read())["id"]
        with lock:
            ids.append(job_id)

    start = time.monotonic()
    n = int(rate * seconds)
    for i in range(n):
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        body = {"name": f"bench-{i}", "tenant": "bench", "expected_duration_s": 10**6, **rng.choice(SHAPES)}
        t = threading.Thread(target=submit, args=(body,))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    return ids


def latencies(ids: list[int], timeout: float = 120) -> list[float]:
    import psycopg

    deadline = time.monotonic() + timeout
    with psycopg.connect(f"postgres://postgres@127.0.0.1:5432/{DB}") as conn:
        while True:
            rows = conn.execute(
                "SELECT EXTRACT(EPOCH FROM placed_at - submitted_at) FROM fleet_job WHERE id = ANY(%s) AND placed_at IS NOT NULL",
                (ids,),
            ).fetchall()
            conn.commit()
            if len(rows) == len(ids) or time.monotonic() > deadline:
                return [float(r[0]) for r in rows]
            time.sleep(0.2)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--racks", type=int, default=100)
    parser.add_argument("--rates", type=float, nargs="+", default=[10, 100])
    parser.add_argument("--seconds", type=float, default=15)
    args = parser.parse_args()

    token = setup(args.racks)
    port = _free_port()
    procs = [
        subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "rackwise.asgi:application"],
                         cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=(ROOT / "var" / "bench-web.log").open("w"),
                         start_new_session=True),
    ] + [
        subprocess.Popen([sys.executable, "-m", "celery", "-A", "rackwise", "worker", "-n", f"bench{i}@%h", "--concurrency", "1",
                          "-l", "warning", "--without-gossip", "--without-mingle"],
                         cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        for i in range(2)
    ]
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                urllib.request.urlopen(f"{url}/login/", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        time.sleep(3)  # workers connect
        print(f"fleet: {args.racks} racks x 18 nodes x 4 GPUs; 2 workers; shapes {[list(s.values()) for s in SHAPES]}")
        print(f"{'rate/s':>7} {'jobs':>6} {'placed':>7} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}")
        for k, rate in enumerate(args.rates):
            ids = run_rate(url, token, rate, args.seconds, seed=k)
            lat = latencies(ids)
            print(f"{rate:>7.0f} {len(ids):>6} {len(lat):>7} {pct(lat, .5) * 1000:>8.0f} {pct(lat, .95) * 1000:>8.0f} "
                  f"{max(lat, default=float('nan')) * 1000:>8.0f}")
            # Free the fleet for the next rate.
            _manage("shell", "-c", "from fleet.models import Job\nfrom fleet.services.jobs import cancel_job\n"
                    "[cancel_job(None, j.pk) for j in Job.objects.exclude(state__in=['completed','failed','cancelled'])]")
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            p.wait(timeout=30)


if __name__ == "__main__":
    main()
