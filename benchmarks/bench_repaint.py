"""The operator console at scale: how soon the Fleet page is ready, how many
DOM elements its grids take, and commit-to-repaint latency, on ``--racks``
NVL72 racks.

Starts its own stack: a fresh PostgreSQL database (``--db``), the racks filled
through the services (gangs of 2-16 whole nodes placed and started until
``--busy`` of the nodes are busy, a few single-GPU jobs, a few nodes failed),
daphne serving the app, and Debian's Chromium (Playwright). It measures:

1. The Fleet page as it opens (a fleet of more than 48 racks starts with its
   groups collapsed): time to ready (snapshot applied, live feed open), and to
   every grid on screen painted.
2. The kiosk (``/?kiosk=1``) on a 3840 x 2160 wall, where every rack is on
   screen and drawn (1,000 racks fit at 3 px cells): time to ready and to
   every grid painted at its fitted cell size, and the DOM elements the grids
   take (per rack and in the whole document).
3. On the kiosk, this process commits node changes (drain / undrain of random
   nodes) through the services at ``--rate`` a second; each bumps its rack's
   version and is published on commit. Latency is from the commit (an
   ``on_commit`` hook registered before the service's own) to the first
   animation frame after the page applied that rack version and repainted its
   grid. Same machine, same clock.

The first load of each page warms the server (imports, connections, the read
models); the second is measured. Figures are printed, not asserted.

    .venv/bin/python benchmarks/bench_repaint.py [--racks 100] [--busy 0.7] [--rate 20]
        [--seconds 15] [--reuse]

Needs PostgreSQL on 127.0.0.1:5432, Redis (REDIS_URL, default
redis://127.0.0.1:6379/13) and /usr/bin/chromium.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stack

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
READY = "document.body.dataset.ws === 'open' && document.body.dataset.ready === '1'"

# Records, for every rack event the page applies, when the next frame ran
# (after the page's own listener has repainted the grid).
PROBE = """() => {
  window.__paints = {};
  window.rackwise.live.on("rack", (r) => {
    requestAnimationFrame(() => { window.__paints[r.rack + ":" + r.version] = \
performance.timeOrigin + performance.now(); });
  });
}"""

# Every rack card in the document that is on screen (or within the 300 px the
# page paints ahead) has been painted.
ON_SCREEN_PAINTED = """() => {
  const cards = [...document.querySelectorAll('article.rack')].filter((el) => {
    if (el.hidden || !el.offsetParent) return false;
    const r = el.getBoundingClientRect();
    return r.bottom > -300 && r.top < innerHeight + 300;
  });
  return cards.every((el) => el.dataset.painted) ? { painted: cards.length } : false;
}"""

# Kiosk: fitted, and every card on screen painted at the fitted cell size (all
# of them when the fleet fits the screen, as it should).
KIOSK_PAINTED = """() => {
  const groups = document.querySelector('[data-testid=groups]');
  if (groups.dataset.fitting) return false;
  const cards = [...document.querySelectorAll('article.rack')].filter((el) => {
    const r = el.getBoundingClientRect();
    return r.bottom > -300 && r.top < innerHeight + 300;
  });
  return cards.every((el) => el.dataset.paintedCell === groups.dataset.cell) ? \
{ painted: cards.length } : false;
}"""

# DOM elements: in the whole document, and inside each painted grid (the svg
# and everything under it).
DOM_COUNTS = """() => {
  const counts = [...document.querySelectorAll('article.rack[data-painted] .grid')].map((g) => \
g.getElementsByTagName('*').length);
  const sum = counts.reduce((a, b) => a + b, 0);
  return { document: document.getElementsByTagName('*').length, grids: counts.length, sum,
           mean: counts.length ? sum / counts.length : 0, min: Math.min(...counts), max: Math.max(...counts),
           cell: Number(document.querySelector('[data-testid=groups]').dataset.cell) };
}"""


def _env(db: str) -> dict[str, str]:
    return stack.app_env(db, redis_db=13)


def setup(db: str, fresh: bool) -> None:
    import psycopg
    import redis

    if fresh:
        with psycopg.connect("postgres://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
            conn.execute(f"CREATE DATABASE {db}")
    redis.Redis.from_url(_env(db)["REDIS_URL"]).flushdb()
    for args in (["migrate", "-v0"], ["collectstatic", "--noinput", "-v0"]):
        subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=_env(db), check=True)


def _built(db: str) -> bool:
    """Whether ``db`` exists and holds a fleet a previous run built."""
    import psycopg

    try:
        with psycopg.connect(f"postgres://postgres@127.0.0.1:5432/{db}") as conn:
            return conn.execute("SELECT count(*) FROM fleet_rack").fetchone()[0] > 0
    except psycopg.Error:
        return False


def fill(racks: int, busy: float, rng: random.Random) -> None:
    """Racks, and jobs on them through the services, as a working day leaves them."""
    from fleet.models import Node
    from fleet.services.jobs import allocations as job_allocations
    from fleet.services.jobs import submit as job_services
    from fleet.services.nodes import moves as node_services
    from fleet.services.nodes.inventory import create_rack
    from fleet.services.users import ensure_user

    t = time.perf_counter()
    for i in range(racks):
        create_rack(None, name=f"b{i:04d}", site="bench", row=str(i // 10), position=i % 10)
    user = ensure_user(None, "bench-filler", role="operator", tenants=["bench"])[0]
    nodes_of: dict[int, list[int]] = {}
    for node_id, rack_id in Node.objects.order_by("rack_id", "slot").values_list("id", "rack_id"):
        nodes_of.setdefault(rack_id, []).append(node_id)
    jobs = used_nodes = 0

    def run(nodes: dict[int, list[int]], spec) -> None:
        nonlocal jobs
        job = job_services.submit_job(user, spec)
        job_allocations.apply_placement(None, job.pk, nodes, reason="bench")
        job_allocations.start_job(None, job.pk)
        jobs += 1

    for nodes in nodes_of.values():
        target = round(busy * len(nodes))
        used = 0
        while used < target:
            take = nodes[used : used + min(target - used, rng.choice([2, 4, 4, 8, 16]))]
            run(
                {n: [0, 1, 2, 3] for n in take},
                job_services.JobSpec(name=f"g{jobs}", tenant="bench", num_nodes=len(take), gpus_per_node=4),
            )
            used += len(take)
        used_nodes += used
        # A node shared by single-GPU jobs, where there is room for one.
        if busy and used < len(nodes) - 3:
            for gpu in range(rng.randint(1, 3)):
                run({nodes[used]: [gpu]}, job_services.JobSpec(name=f"s{jobs}", tenant="bench", num_gpus=1))
    failed = max(1, racks // 50)
    for node_id in rng.sample([n for ns in nodes_of.values() for n in ns], failed):
        node_services.mark_node_failed(user, node_id, reason="bench")
    print(
        f"fleet: {racks} racks, {sum(map(len, nodes_of.values()))} nodes, {jobs} running jobs, "
        f"{used_nodes} nodes held by gangs, {failed} failed (built in {time.perf_counter() - t:.0f} s)",
        flush=True,
    )


def load(page, url: str, painted: str) -> tuple[float, float]:
    """Seconds from navigation to ready, and to ``painted`` holding."""
    t0 = time.monotonic()
    page.goto(url)
    page.wait_for_function(READY, timeout=120000)
    ready = time.monotonic() - t0
    page.wait_for_function(painted, timeout=120000, polling=50)
    return ready, time.monotonic() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--racks", type=int, default=100)
    parser.add_argument("--busy", type=float, default=0.7, help="share of each rack's nodes held by gangs")
    parser.add_argument("--rate", type=float, default=20.0, help="changes per second")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--db", default="rackwise_repaint_bench", help="database to create (dropped first)")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="keep the database a previous run built (same --racks, --busy) instead of building it again, "
        "to compare two checkouts on the same fleet",
    )
    args = parser.parse_args()

    setup(args.db, fresh=not (args.reuse and _built(args.db)))
    os.environ.update(_env(args.db))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rackwise.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.db import connection, transaction
    from django.test import Client

    from fleet.models import Node, Rack
    from fleet.services.nodes import moves as node_services
    from fleet.services.users import ensure_user

    if Rack.objects.exists():
        assert Rack.objects.count() == args.racks, "--reuse: the database holds another fleet; drop --reuse"
        print(f"fleet: {args.racks} racks, reused from a previous run", flush=True)
    else:
        fill(args.racks, args.busy, random.Random(11))
    viewer = ensure_user(None, "bench-viewer", role="viewer")[0]
    operator = ensure_user(None, "bench-operator", role="operator")[0]
    client = Client()
    client.force_login(viewer)
    session = client.cookies["sessionid"].value
    # Drains and undrains from the healthy nodes; a reused fleet's nodes a run left drained start it again.
    node_ids = list(
        Node.objects.filter(state__in=["healthy", "draining", "drained"]).values_list("id", flat=True)
    )
    connection.close()

    port = stack.free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "rackwise.asgi:application"],
        cwd=ROOT,
        env=_env(args.db),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    commits: dict[str, float] = {}
    try:
        stack.wait_for_port(port)

        from playwright.sync_api import sync_playwright

        pw = sync_playwright().start()
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1900, "height": 2400})
        page.context.add_cookies([{"name": "sessionid", "value": session, "url": url}])
        cold_ready, _ = load(page, url + "/", ON_SCREEN_PAINTED)
        fleet_ready, fleet_painted = load(page, url + "/", ON_SCREEN_PAINTED)
        fleet_drawn = page.evaluate(ON_SCREEN_PAINTED)["painted"]
        page.set_viewport_size({"width": 3840, "height": 2160})
        load(page, url + "/?kiosk=1", KIOSK_PAINTED)
        kiosk_ready, kiosk_painted = load(page, url + "/?kiosk=1", KIOSK_PAINTED)
        dom = page.evaluate(DOM_COUNTS)
        fits = page.evaluate("document.scrollingElement.scrollHeight <= innerHeight")
        page.evaluate(PROBE)

        # The changes run in a thread: Playwright's loop owns this one.
        def change_loop() -> None:
            rng = random.Random(7)
            drained = set(Node.objects.filter(state__in=["draining", "drained"]).values_list("id", flat=True))
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
    print(
        f"fleet page ready (snapshot applied, live feed open): {fleet_ready * 1000:.0f} ms "
        f"(first load after start: {cold_ready * 1000:.0f} ms); "
        f"{fleet_drawn} grids on screen painted by {fleet_painted * 1000:.0f} ms"
    )
    print(
        f"kiosk at 3840x2160: ready {kiosk_ready * 1000:.0f} ms, "
        f"{dom['grids']} grids painted at {dom['cell']} px cells by {kiosk_painted * 1000:.0f} ms "
        f"({'every rack on screen' if fits else 'the fleet does not fit the screen'})"
    )
    print(
        f"DOM elements per rack grid: mean {dom['mean']:.1f} (min {dom['min']}, max {dom['max']}); "
        f"all grids {dom['sum']}; whole document {dom['document']}"
    )
    print(
        f"commit -> repaint (kiosk): p50 {q[49]:.0f} ms, p95 {q[94]:.0f} ms, max {lat[-1]:.0f} ms; "
        f"not repainted at their own version: {missing} (covered by a later version); "
        f"gaps seen by the page: {gaps}"
    )


if __name__ == "__main__":
    main()
