"""Commit-to-repaint latency of the operator console, on a 100-rack fleet.

Starts its own stack: a fresh PostgreSQL database (``rackwise_repaint_bench``),
daphne serving the app, and Debian's Chromium (Playwright) showing the fleet page
with every rack's grid on screen. This process then commits node changes
(drain / undrain of random nodes) through the services at a fixed rate; each
change bumps its rack's version and is published on commit. Latency is from
the commit (an ``on_commit`` hook registered before the service's own) to the
first animation frame after the page applied that rack version and repainted
its grid. Same machine, same clock. Figures are printed, not asserted.

    .venv/bin/python benchmarks/bench_repaint.py [--racks 100] [--rate 20] [--seconds 15]

Needs PostgreSQL on 127.0.0.1:5432, Redis (REDIS_URL, default
redis://127.0.0.1:6379/13) and /usr/bin/chromium.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DB = "rackwise_repaint_bench"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]

# Records, for every rack event the page applies, when the next frame ran
# (after the page's own listener has repainted the grid).
PROBE = """() => {
  window.__paints = {};
  window.rackwise.live.on("rack", (r) => {
    requestAnimationFrame(() => { window.__paints[r.rack + ":" + r.version] = performance.timeOrigin + performance.now(); });
  });
}"""


def _env() -> dict[str, str]:
    return os.environ | {
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{DB}",
        "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/13"),
        "DEBUG": "0",
        "SECRET_KEY": "bench",
        "ALLOWED_HOSTS": "127.0.0.1",
        "RACKWISE_DEMO": "0",
        "LOG_LEVEL": "WARNING",
        # Plain http on loopback: no HTTPS redirect, cookies without Secure.
        "SECURE_SSL_REDIRECT": "0",
        "SESSION_COOKIE_SECURE": "0",
        "CSRF_COOKIE_SECURE": "0",
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup(racks: int) -> None:
    import psycopg
    import redis

    with psycopg.connect("postgres://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DB}")
    redis.Redis.from_url(_env()["REDIS_URL"]).flushdb()
    for args in (["migrate", "-v0"], ["collectstatic", "--noinput", "-v0"]):
        subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=_env(), check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--racks", type=int, default=100)
    parser.add_argument("--rate", type=float, default=20.0, help="changes per second")
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args()

    setup(args.racks)
    os.environ.update(_env())
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rackwise.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.db import connection, transaction
    from django.test import Client

    from fleet.models import Node
    from fleet.services import nodes as node_services
    from fleet.services.inventory import create_rack
    from fleet.services.users import ensure_user

    for i in range(args.racks):
        create_rack(None, name=f"b{i:03d}", site="bench", row=str(i // 10), position=i % 10)
    viewer = ensure_user(None, "bench-viewer", role="viewer")[0]
    operator = ensure_user(None, "bench-operator", role="operator")[0]
    client = Client()
    client.force_login(viewer)
    session = client.cookies["sessionid"].value
    node_ids = list(Node.objects.values_list("id", flat=True))
    connection.close()

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "rackwise.asgi:application"],
        cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    commits: dict[str, float] = {}
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)

        from playwright.sync_api import sync_playwright

        pw = sync_playwright().start()
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        # Tall enough for every grid to be on screen (grids off screen repaint lazily).
        page = browser.new_page(viewport={"width": 1900, "height": 2400})
        page.context.add_cookies([{"name": "sessionid", "value": session, "url": url}])
        # The first load warms the server up (imports, connections); the second is measured.
        loads = []
        for _ in range(2):
            t0 = time.monotonic()
            page.goto(url + "/")
            page.wait_for_function("document.body.dataset.ws === 'open' && document.body.dataset.ready === '1'", timeout=60000)
            ready_s = time.monotonic() - t0
            page.wait_for_function(f"document.querySelectorAll('article.rack[data-painted]').length === {args.racks}", timeout=60000)
            loads.append((ready_s, time.monotonic() - t0))
        (cold_ready, _), (ready_s, painted_s) = loads
        page.evaluate(PROBE)

        # The changes run in a thread: Playwright's loop owns this one.
        def change_loop() -> None:
            rng = random.Random(7)
            drained: set[int] = set()
            interval = 1.0 / args.rate
            start = time.monotonic()
            n = 0
            while time.monotonic() - start < args.seconds:
                node_id = rng.choice(node_ids)
                stamp: list[float] = []
                with transaction.atomic():
                    # Registered first, so it runs before the service's publish.
                    transaction.on_commit(lambda stamp=stamp: stamp.append(time.time() * 1000))
                    if node_id in drained:
                        node = node_services.undrain_node(operator, node_id, "bench")
                        drained.discard(node_id)
                    else:
                        node = node_services.drain_node(operator, node_id, "bench")
                        drained.add(node_id)
                    rack_id = node.rack_id
                from fleet.models import Rack

                version = Rack.objects.filter(pk=rack_id).values_list("version", flat=True).get()
                commits[f"{rack_id}:{version}"] = stamp[0]
                n += 1
                time.sleep(max(0.0, start + n * interval - time.monotonic()))
            connection.close()

        thread = threading.Thread(target=change_loop)
        thread.start()
        while thread.is_alive():
            page.wait_for_timeout(200)
        thread.join()
        # Let the last events land.
        try:
            page.wait_for_function(f"Object.keys(window.__paints).length >= {len(commits)}", timeout=10000)
        except Exception:
            pass
        paints = page.evaluate("window.__paints")
        gaps = page.evaluate("window.rackwise.gaps")
        browser.close()
        pw.stop()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=20)

    lat = sorted(paints[k] - t for k, t in commits.items() if k in paints)
    missing = len(commits) - len(lat)
    q = statistics.quantiles(lat, n=100) if len(lat) >= 2 else lat * 99
    print(f"racks: {args.racks}; changes: {len(commits)} at {args.rate:g}/s for {args.seconds:g} s")
    print(f"fleet page interactive (snapshot applied, live feed open): {ready_s * 1000:.0f} ms "
          f"(first load after start: {cold_ready * 1000:.0f} ms); every grid painted: {painted_s * 1000:.0f} ms")
    print(f"commit -> repaint: p50 {q[49]:.0f} ms, p95 {q[94]:.0f} ms, max {lat[-1]:.0f} ms; "
          f"not repainted at their own version: {missing} (covered by a later version); gaps seen by the page: {gaps}")


if __name__ == "__main__":
    main()
