"""Screenshots of the console for docs/: the Fleet page, a rack page, the Actions
page with a defrag plan, the job submission form with its what-if answer, and
the kiosk mode at 3840x2160.

    .venv/bin/python scripts/screenshots.py [--out docs/screenshots] [--racks 24]

Builds its own stack: a fresh PostgreSQL database (``rackwise_screenshots``),
a fleet filled through the services (jobs submitted, placed by the scheduling
pass and started by the simulated cluster's steps, some finished, nodes failed,
drained and in repair, a defrag planned), daphne serving the app, and Debian's
Chromium (Playwright). Needs PostgreSQL on 127.0.0.1:5432, Redis (REDIS_URL,
default redis://127.0.0.1:6379/12) and /usr/bin/chromium.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import stack

ROOT = Path(__file__).resolve().parents[1]
DB = "rackwise_screenshots"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
SHAPES = [  # (nodes, gpus per node) or (0, gpus): a mix like the real traces', big gangs included
    (16, 4),
    (12, 4),
    (8, 4),
    (8, 4),
    (4, 4),
    (4, 4),
    (4, 4),
    (2, 4),
    (2, 4),
    (2, 4),
    (0, 4),
    (0, 4),
    (0, 2),
    (0, 1),
    (0, 1),
]


def _env() -> dict[str, str]:
    return stack.app_env(DB, redis_db=12, RACKWISE_SIM_STEP_SECONDS="0")


def setup() -> None:
    import psycopg
    import redis

    with psycopg.connect("postgres://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DB}")
    redis.Redis.from_url(_env()["REDIS_URL"]).flushdb()
    for args in (["migrate", "-v0"], ["collectstatic", "--noinput", "-v0"]):
        subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=_env(), check=True)


def populate(racks: int, rng: random.Random):
    """The fleet through the services, as a day of work leaves it. Returns
    (operator, submitter, the rack to show, the defrag plan)."""
    from fleet.choices import ActionKind, ActionState, JobState
    from fleet.cluster.simulated import SimulatedAdapter
    from fleet.models import Action, Job, Node, Rack
    from fleet.services.actions import propose as action_services
    from fleet.services.decisions.defrag import plan_defrag
    from fleet.services.decisions.scheduling import schedule_pass
    from fleet.services.execution import execute as execution
    from fleet.services.jobs import allocations as job_allocations
    from fleet.services.jobs import submit as job_services
    from fleet.services.nodes import moves as node_services
    from fleet.services.nodes.inventory import create_rack
    from fleet.services.read.metrics import record_sample
    from fleet.services.users import ensure_user

    half = max(1, racks // 2)  # racks per site, over rows A-C
    for i in range(racks):
        site = "dc-east" if i < racks // 2 else "dc-west"
        row = "ABC"[(i % half) * 3 // half]
        create_rack(
            None, name=f"{site[3]}{row}{i % 4 + 1:02d}-{i:02d}", site=site, row=row, position=i % 4 + 1
        )
    operator = ensure_user(None, "operator", role="operator", tenants=["llm", "vision"])[0]
    submitter = ensure_user(None, "engineer", role="submitter", tenants=["llm", "vision"])[0]
    adapter = SimulatedAdapter(step_seconds=0, failure_rate=0, time_scale=1)

    def run_passes() -> None:
        for _ in range(20):
            schedule_pass()
            ready = list(
                Action.objects.filter(state__in=[ActionState.APPROVED, ActionState.EXECUTING]).values_list(
                    "pk", flat=True
                )
            )
            if not ready:
                return
            for pk in ready:
                while execution.execute_next_step(pk, adapter=adapter).more:
                    pass

    total_nodes = Node.objects.count()
    submitted = 0
    while submitted < total_nodes * 0.9:
        nodes, gpus = rng.choice(SHAPES)
        spec = job_services.JobSpec(
            name=f"{rng.choice(['llama', 'mixtral', 'vit', 'dit', 'rlhf', 'embed'])}-{rng.randrange(1000)}",
            tenant=rng.choice(["llm", "llm", "vision"]),
            num_nodes=nodes or None,
            gpus_per_node=gpus if nodes else None,
            num_gpus=None if nodes else gpus,
            preemptible=rng.random() < 0.7,
            expected_duration_s=rng.randrange(3600, 48 * 3600),
        )
        job_services.submit_job(submitter, spec)
        submitted += max(1, nodes)
        if rng.random() < 0.2:
            run_passes()
            record_sample()
    run_passes()
    # Some jobs finish at different times: free room scatters over the racks.
    running = list(Job.objects.filter(state=JobState.RUNNING).order_by("id"))
    for job in rng.sample(running, len(running) // 4):
        job_allocations.finish_job(None, job.pk, succeeded=True, reason="done")
    record_sample()
    # Big gangs arrive that no rack has room for; nodes fail, drain, go to repair.
    for name in ("llama-405b", "mixtral-8x22b", "dit-xl-video", "llama-70b-long"):
        job_services.submit_job(
            submitter,
            job_services.JobSpec(name=name, tenant="llm", num_nodes=16, gpus_per_node=4, locality="required"),
        )
    nodes = list(Node.objects.order_by("?")[:5])
    node_services.mark_node_failed(operator, nodes[0].pk, reason="XID 79: GPU fell off the bus")
    node_services.mark_node_failed(operator, nodes[1].pk, reason="NVLink errors")
    node_services.drain_node(operator, nodes[2].pk, reason="firmware update")
    node_services.drain_node(operator, nodes[3].pk, reason="ECC errors climbing")
    run_passes()
    record_sample()
    action_services.set_policy(operator, ActionKind.DEFRAG, "manual")
    outcome = plan_defrag(operator)
    rack = Rack.objects.filter(nodes=nodes[2]).first()
    return operator, submitter, rack, outcome.action


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "screenshots"))
    parser.add_argument("--racks", type=int, default=24)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    setup()
    os.environ.update(_env())
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rackwise.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.db import connection
    from django.test import Client

    operator, submitter, rack, plan = populate(args.racks, random.Random(3))
    sessions = {}
    for user in (operator, submitter):
        client = Client()
        client.force_login(user)
        sessions[user.username] = client.cookies["sessionid"].value
    connection.close()
    print(f"fleet ready; defrag plan: {f'#{plan.pk}' if plan else 'none (nothing to gain)'}")

    port = stack.free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "rackwise.asgi:application"],
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        stack.wait_for_port(port)
        from playwright.sync_api import sync_playwright

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)

            def shoot(
                name: str, path: str, who: str, viewport=(1600, 1000), full_page=True, then=None
            ) -> None:
                page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
                page.context.add_cookies([{"name": "sessionid", "value": sessions[who], "url": url}])
                page.goto(url + path)
                page.wait_for_function("document.body.dataset.ready === '1'", timeout=60000)
                if then:
                    then(page)
                page.wait_for_timeout(500)
                page.screenshot(path=str(out / f"{name}.png"), full_page=full_page)
                page.close()
                print(f"{out / name}.png")

            def paint_all(page) -> None:
                page.evaluate("window.scrollTo(0, document.body.scrollHeight)")
                page.wait_for_timeout(300)
                page.evaluate("window.scrollTo(0, 0)")

            def fill_form(page) -> None:
                page.locator("[name=name]").fill("llama-70b-sft")
                page.locator("[name=shape][value=nodes]").check()
                page.locator("[name=num_nodes]").fill("16")
                page.locator("[name=gpus_per_node]").fill("4")
                page.locator("[name=expected_duration_s]").fill("28800")
                page.locator("[data-testid=what-if-check]").click()
                page.wait_for_function(
                    "document.querySelector('[data-testid=what-if]').dataset.state === 'answered'"
                )

            shoot("fleet", "/", "operator", then=paint_all)
            shoot("rack", f"/racks/{rack.pk}/", "operator")
            shoot("actions", "/actions/", "operator")
            shoot("submit", "/jobs/submit/", "engineer", then=fill_form)
            shoot("kiosk-4k", "/?kiosk=1", "operator", viewport=(3840, 2160), full_page=False)
            browser.close()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=20)


if __name__ == "__main__":
    main()
