"""Submitted-to-placed latency of the whole control loop, on 100 and 1,000 racks.

Starts its own stack on this machine for each fleet size: a fresh PostgreSQL
database (``rackwise_bench``, cloned from a template kept per size and schema,
so the racks are built once), daphne serving the API, the scheduler's worker
(queue ``scheduler``, concurrency 1, the fleet in memory) and one worker for the
rest. Jobs are POSTed over HTTP at a fixed rate (open loop) and the latency is
read from the database (``placed_at - submitted_at``). Figures are printed, not
asserted; the machine is shared, so compare the ratios of one run.

    .venv/bin/python benchmarks/bench_submit_latency.py [--racks 100 1000] [--rates 10 50] [--seconds 15]
        [--live-fleet both|on|off]

``--live-fleet both`` also runs every cell with the in-memory fleet off
(``RACKWISE_LIVE_FLEET=0``: every pass loads the fleet), as the baseline.

Needs PostgreSQL on 127.0.0.1:5432 and Redis (REDIS_URL, default 127.0.0.1:6379).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import dbcache  # noqa: E402
import stack  # noqa: E402

DB = "rackwise_bench"
SHAPES = [{"num_gpus": 1}, {"num_gpus": 2}, {"num_gpus": 4}, {"num_nodes": 2, "gpus_per_node": 4}]


def _env(**extra: str) -> dict[str, str]:
    # One user submitting at benchmark rates.
    return stack.app_env(
        DB, redis_db=14, RACKWISE_SIM_STEP_SECONDS="0", RACKWISE_THROTTLE_USER="1000000/min", **extra
    )


def _manage(*args: str) -> str:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=_env(), check=True, capture_output=True, text=True
    ).stdout


def setup(racks: int) -> str:
    """A fleet of ``racks`` empty racks and a submitter's token (built once, then cloned)."""
    import redis

    token_file = ROOT / "var" / f"{dbcache.template_name(f'submit-latency {racks}')}.token"

    def build() -> None:
        t = time.perf_counter()
        _manage("migrate", "-v0")
        script = (
            "from fleet.services.nodes.inventory import create_rack\n"
            f"for i in range({racks}): create_rack(None, name=f'b{{i:04d}}', site='bench', "
            "row=str(i // 10), position=i % 10)\n"
        )
        _manage("shell", "-c", script)
        token_file.write_text(
            _manage("create_api_user", "bench", "--role", "submitter", "--tenant", "bench").strip()
        )
        print(f"  (built {racks} racks in {time.perf_counter() - t:.0f} s, kept for the next run)")

    dbcache.fresh_database(DB, f"submit-latency {racks}", build)
    redis.Redis.from_url(_env()["REDIS_URL"]).flushdb()
    return token_file.read_text().strip()


def run_rate(url: str, token: str, rate: float, seconds: float, seed: int) -> list[int]:
    """POST jobs at ``rate`` per second for ``seconds`` (open loop: a slow
    answer does not slow the arrivals). Returns the job ids."""
    rng = random.Random(seed)
    ids: list[int] = []
    lock = threading.Lock()
    threads: list[threading.Thread] = []

    def submit(body: dict) -> None:
        request = urllib.request.Request(
            f"{url}/api/jobs/",
            data=json.dumps(body).encode(),
            method="POST",
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
                "SELECT EXTRACT(EPOCH FROM placed_at - submitted_at) FROM fleet_job "
                "WHERE id = ANY(%s) AND placed_at IS NOT NULL",
                (ids,),
            ).fetchall()
            conn.commit()
            if len(rows) == len(ids) or time.monotonic() > deadline:
                return [float(r[0]) for r in rows]
            time.sleep(0.2)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def start_stack(port: int, env: dict[str, str]) -> list[subprocess.Popen]:
    def celery(name: str, queue: str) -> subprocess.Popen:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "rackwise",
                "worker",
                "-n",
                f"{name}@%h",
                "-Q",
                queue,
                "--concurrency",
                "1",
                "-l",
                os.environ.get("BENCH_CELERY_LOG", "warning"),
                "--without-gossip",
                "--without-mingle",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=(ROOT / "var" / f"bench-{name}.log").open("w"),
            start_new_session=True,
        )

    return [
        subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "rackwise.asgi:application"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=(ROOT / "var" / "bench-web.log").open("w"),
            start_new_session=True,
        ),
        celery("scheduler", "scheduler"),
        celery("worker", "celery,control"),
    ]


def stop_stack(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for p in procs:
        p.wait(timeout=30)


def measure(racks: int, rates: list[float], seconds: float, live: bool) -> dict[float, tuple[float, float]]:
    """p50 and p95 (seconds) by rate, on a fresh fleet of ``racks`` racks."""
    token = setup(racks)
    port = stack.free_port()
    procs = start_stack(port, _env(RACKWISE_LIVE_FLEET="1" if live else "0"))
    out = {}
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                urllib.request.urlopen(f"{url}/login/", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        time.sleep(3)  # workers connect
        for k, rate in enumerate(rates):
            ids = run_rate(url, token, rate, seconds, seed=k)
            lat = latencies(ids)
            out[rate] = (pct(lat, 0.5), pct(lat, 0.95))
            print(
                f"{racks:>6} {'on' if live else 'off':>5} {rate:>7.0f} {len(ids):>6} {len(lat):>7} "
                f"{pct(lat, 0.5) * 1000:>8.0f} {pct(lat, 0.95) * 1000:>8.0f} "
                f"{max(lat, default=float('nan')) * 1000:>8.0f}",
                flush=True,
            )
            # Free the fleet for the next rate.
            _manage(
                "shell",
                "-c",
                "from fleet.models import Job\nfrom fleet.services.jobs.submit import cancel_job\n"
                "[cancel_job(None, j.pk) for j in "
                "Job.objects.exclude(state__in=['completed','failed','cancelled'])]",
            )
    finally:
        stop_stack(procs)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--racks", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--rates", type=float, nargs="+", default=[10, 50])
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--live-fleet", choices=["both", "on", "off"], default="both")
    args = parser.parse_args()
    (ROOT / "var").mkdir(exist_ok=True)
    modes = {"both": [True, False], "on": [True], "off": [False]}[args.live_fleet]
    print(
        "NVL72 racks (18 nodes x 4 GPUs); scheduler worker + one worker + daphne; "
        f"shapes {[list(s.values()) for s in SHAPES]}"
    )
    print(
        f"{'racks':>6} {'live':>5} {'rate/s':>7} {'jobs':>6} {'placed':>7} "
        f"{'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}"
    )
    results = {
        (racks, live): measure(racks, args.rates, args.seconds, live)
        for live in modes
        for racks in args.racks
    }
    small, big = min(args.racks), max(args.racks)
    if small != big:
        print(f"\np95 at {big} racks over p95 at {small} racks (must be <= 1.5):")
        for live in modes:
            ratios = "  ".join(
                f"{rate:.0f}/s {results[(big, live)][rate][1] / results[(small, live)][rate][1]:.2f}x"
                for rate in args.rates
            )
            print(f"  live fleet {'on' if live else 'off'}: {ratios}")
    if len(modes) == 2:
        print("\np95 with the live fleet over p95 without (same fleet, same rate):")
        for racks in args.racks:
            ratios = "  ".join(
                f"{rate:.0f}/s {results[(racks, True)][rate][1] / results[(racks, False)][rate][1]:.2f}x"
                for rate in args.rates
            )
            print(f"  {racks} racks: {ratios}")


if __name__ == "__main__":
    main()
