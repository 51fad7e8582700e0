"""The README's first command works from a fresh clone with nothing set: it
brings its own PostgreSQL and Redis, a job submitted through the API with a
token made the README's way runs, and the `rackwise` command it installed shows
it. (At c63856d it fell back to SQLite, on which every scheduling pass failed:
jobs only piled up.)"""

from __future__ import annotations

import os
import subprocess
import time

from benchmarks.soak import Api


def _running(api: Api, job_id: int, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    job: dict = {}
    while time.monotonic() < deadline:
        job = api.get(f"/api/jobs/{job_id}/")
        if job["state"] == "running":
            return job
        time.sleep(0.5)
    raise AssertionError(
        f"job {job_id} is {job.get('state')} after {timeout:.0f} s: {job.get('state_reason')}"
    )


def test_the_quick_start_runs_a_job_submitted_through_the_api(quickstart_stack):
    stack = quickstart_stack
    # The README's way: TOKEN=$(scripts/manage create_api_user ...), in a new shell.
    token = stack.manage(
        "create_api_user", "quickstart-user", "--role", "submitter", "--tenant", "llm"
    ).strip()
    api = Api(stack.url, token)

    status, job = api.call("POST", "/api/jobs/", {"name": "hello", "tenant": "llm", "num_gpus": 1})

    assert status == 201, job
    assert _running(api, job["id"])["state"] == "running"
    # Its own database and Redis, named for scripts/manage while it runs.
    env = (stack.checkout / "var" / "stack.env").read_text()
    assert "127.0.0.1" in env and ":5432/" not in env and ":6379/" not in env
    assert (stack.checkout / "var" / "postgres" / "PG_VERSION").read_text().strip() == "18"

    # The command line it installed, pointed at it (before, only `pip install ./client`).
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ["HOME"],
        "RACKWISE_SERVER": stack.url,
        "RACKWISE_TOKEN": token,
    }
    jobs = subprocess.run(
        [str(stack.checkout / ".venv" / "bin" / "rackwise"), "jobs"], env=env, capture_output=True, text=True
    )
    assert jobs.returncode == 0, jobs.stderr
    assert "hello" in jobs.stdout and "running" in jobs.stdout
