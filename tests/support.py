"""Helpers for tests that run real Celery workers against the test database and
the test run's private Redis."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import redis
from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent

# Fast simulated cluster: steps take milliseconds, a job's expected second takes
# a hundredth of a second.
FAST_CLUSTER = {
    "RACKWISE_SIM_STEP_SECONDS": "0.05",
    "RACKWISE_SIM_TIME_SCALE": "0.01",
    "RACKWISE_STALL_S": "3",
    # Read models recomputed after every change (no once-a-second grace).
    "RACKWISE_READ_MODEL_MAX_AGE_S": "0",
    # Every scheduling pass checks the in-memory fleet against the rows.
    "RACKWISE_LIVE_FLEET_VERIFY": "1",
}


def mark_directory(items, directory: Path, marker) -> None:
    """Give every collected test under ``directory`` the ``marker``, so that
    ``-m 'not NAME'`` deselects the whole directory (and its session fixtures
    never start). Call it from a ``tryfirst`` collection hook: the marker must be
    on the items before ``-m`` deselects by it."""
    for item in items:
        if directory in Path(item.path).resolve().parents:
            item.add_marker(marker)


def nodes_of(job_id: int) -> set[int]:
    """The nodes a job holds GPUs on now."""
    from fleet.models import Allocation

    return set(
        Allocation.objects.filter(job_id=job_id, released_at__isnull=True).values_list(
            "gpu__node_id", flat=True
        )
    )


def consistent_violations() -> list[str]:
    """The engine's invariant checker on one consistent snapshot of the database,
    plus the database-level checks (fleet.services.read.invariants)."""
    from fleet.services.read.invariants import violations

    return violations()


def wait_for(predicate: Callable[[], object], timeout: float = 30.0, what: str = "condition") -> object:
    """Poll application state until ``predicate`` is truthy (no fixed sleeps)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def flush_broker() -> None:
    """Empty the test Redis: no message of an earlier test reaches this one."""
    redis.Redis.from_url(settings.REDIS_URL).flushdb()


class Worker:
    """A real ``celery worker`` process (prefork pool) on the test database."""

    def __init__(
        self,
        env: dict[str, str] | None = None,
        concurrency: int = 2,
        queues: str = "celery,scheduler,control",
    ) -> None:
        db = connection.settings_dict
        url = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
        self.name = f"test-{uuid.uuid4().hex[:8]}"
        self.log_path = ROOT / "var" / f"{self.name}.log"
        self.log_path.parent.mkdir(exist_ok=True)
        self.env = (
            os.environ | {"DATABASE_URL": url, "REDIS_URL": settings.REDIS_URL} | FAST_CLUSTER | (env or {})
        )
        self.concurrency = concurrency
        # "celery" is the default queue; scheduling passes go to "scheduler",
        # event webhooks to "webhooks".
        self.queues = queues
        self.proc: subprocess.Popen | None = None

    def start(self) -> Worker:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "rackwise",
                "worker",
                "-n",
                f"{self.name}@%h",
                "--concurrency",
                str(self.concurrency),
                "-Q",
                self.queues,
                "-l",
                "info",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for(
            lambda: b"ready." in self.log_path.read_bytes() or self.proc.poll() is not None,
            60,
            "worker start",
        )
        if self.proc.poll() is not None:
            raise AssertionError(f"worker exited: {self.log_path.read_text()[-3000:]}")
        return self

    def kill(self) -> None:
        """SIGKILL the worker and its pool processes, as a crash would."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextmanager
def workers(count: int = 1, env: dict[str, str] | None = None) -> Iterator[list[Worker]]:
    flush_broker()
    started = [Worker(env).start() for _ in range(count)]
    try:
        yield started
    finally:
        for w in started:
            w.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def subprocess_env() -> dict[str, str]:
    """The environment of a server or client process the test starts: the test
    database, the test Redis, the fast simulated cluster."""
    from tests.webhook_receiver import ALLOW_LOOPBACK_ENV

    db = connection.settings_dict
    url = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_ALLOW_ASYNC_UNSAFE"}
    # The webhooks page test registers a receiver on 127.0.0.1 (refused by default).
    env |= ALLOW_LOOPBACK_ENV
    return env | {"DATABASE_URL": url, "REDIS_URL": settings.REDIS_URL, "RACKWISE_DEMO": "0"} | FAST_CLUSTER


class AppServer:
    """daphne serving rackwise.asgi on a fixed port, on the test database (the
    browser tests and the CLI's); stop() and start() again cut every websocket,
    as a restart or a network drop would."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = env or {}
        self.log_path = ROOT / "var" / f"daphne-{self.port}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> AppServer:
        self.log_path.parent.mkdir(exist_ok=True)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                "127.0.0.1",
                "-p",
                str(self.port),
                "rackwise.asgi:application",
            ],
            cwd=ROOT,
            env=subprocess_env() | self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for(self._answers, 30, "daphne to listen")
        return self

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"daphne exited: {self.log_path.read_text()[-3000:]}")
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def restart_redis() -> None:
    """Restart the test run's private Redis (it keeps nothing on disk, so every
    queued message is lost, as after a crash)."""
    server, port = os.environ.get("RACKWISE_REDIS_SERVER"), os.environ.get("RACKWISE_REDIS_PORT")
    if not (server and port):
        raise RuntimeError("run through scripts/test, which starts a private Redis this test may restart")
    try:
        redis.Redis(port=int(port)).shutdown(nosave=True)
    except redis.exceptions.ConnectionError:
        pass  # shutting down drops the connection
    pidfile = ROOT / "var" / f"redis-{port}.pid"
    subprocess.run(
        [
            server,
            "--daemonize",
            "yes",
            "--bind",
            "127.0.0.1",
            "--port",
            port,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(ROOT / "var"),
            "--pidfile",
            str(pidfile),
            "--logfile",
            str(ROOT / "var" / f"redis-{port}.log"),
        ],
        check=True,
    )
    wait_for(lambda: _pings(int(port)), 10, "redis restart")


def _pings(port: int) -> bool:
    try:
        return bool(redis.Redis(port=port).ping())
    except redis.exceptions.ConnectionError:
        return False


class InstantAdapter:
    """A cluster that carries out every step at once and reports nothing (the
    database side of each step is the real service's)."""

    name = "instant"

    def perform(self, action, index, step, report=None):
        from fleet.cluster.base import DONE, Outcome

        return Outcome(DONE)

    def reports_fleet(self) -> bool:
        return False

    def after_step(self, action, index, step) -> None:
        return None

    def cancel(self, job) -> None:
        return None

    def set_node_state(self, hostname: str, state: str, reason: str) -> None:
        return None

    def node_states(self):
        return None

    def job_states(self, jobs) -> dict:
        return {}


def carry_out(action_id: int) -> None:
    """Every step of the action, carried out at once (:class:`InstantAdapter`)."""
    from fleet.services.execution import execute as execution

    while execution.execute_next_step(action_id, adapter=InstantAdapter()).more:
        pass


def pass_carried_out() -> None:
    """A scheduling pass, and the actions it approved carried out."""
    from fleet.choices import ActionState
    from fleet.models import Action
    from fleet.services.decisions.scheduling import schedule_pass

    schedule_pass()
    approved = Action.objects.filter(state__in=(ActionState.APPROVED, ActionState.EXECUTING))
    for action_id in approved.values_list("pk", flat=True):
        carry_out(action_id)


def page_html(user, path: str) -> str:
    """A console page as ``user`` sees it (it must answer 200)."""
    from django.test import Client

    client = Client()
    client.force_login(user)
    response = client.get(path)
    assert response.status_code == 200, (path, response.status_code)
    return response.content.decode()
