"""Faults: PostgreSQL connections killed (pg_terminate_backend from a separate
connection) under the app's connection pool, through a real server thread.

A request that meets a dead connection answers 503 with Retry-After (the client
may retry; with an Idempotency-Key a retried submission returns the job the
first one created), never a 500; the pool checks connections before handing
them out, so once the kills stop the next request succeeds."""

from __future__ import annotations

import itertools
import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from django.db import connection, connections

from fleet.services.users import ensure_user

pytestmark = pytest.mark.django_db(transaction=True)


def _admin_dsn() -> str:
    s = connection.settings_dict
    return f"host={s['HOST'] or '127.0.0.1'} port={s['PORT'] or 5432} user={s['USER']} dbname=postgres" + (
        f" password={s['PASSWORD']}" if s["PASSWORD"] else ""
    )


def _own_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def kill_app_connections(spare_pid: int, older_than_s: float = 0.0) -> int:
    """Terminate every backend on the test database but the test's own (and
    those younger than ``older_than_s``); returns how many were killed."""
    with psycopg.connect(_admin_dsn(), autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid() AND pid <> %s "
            "AND backend_start < now() - make_interval(secs => %s)",
            (connection.settings_dict["NAME"], spare_pid, older_than_s),
        ).fetchall()
    return sum(1 for (killed,) in rows if killed)


def _call(url: str, token: str, body: dict | None = None, key: str | None = None) -> tuple[int, dict, dict]:
    headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
    if key:
        headers["Idempotency-Key"] = key
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode() if body is not None else None,
        headers=headers,
        method="POST" if body is not None else "GET",
    )
    try:
        # Longer than the pool's own 30 s wait, so that wait ends in a 503 here.
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, dict(response.headers), json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        payload = exc.read()
        try:
            data = json.loads(payload)
        except ValueError:
            data = {"raw": payload[:200].decode(errors="replace")}
        return exc.code, dict(exc.headers), data


@pytest.fixture
def token(fleet, submitter) -> str:
    return ensure_user(None, submitter.username, role="submitter")[1]


def _job_counts(keys: list[str]) -> dict[str, int]:
    s = connection.settings_dict
    with psycopg.connect(
        host=s["HOST"] or "127.0.0.1",
        port=s["PORT"] or 5432,
        user=s["USER"],
        dbname=s["NAME"],
        password=s["PASSWORD"] or None,
    ) as conn:
        rows = conn.execute(
            "SELECT idempotency_key, count(*) FROM fleet_job WHERE idempotency_key = ANY(%s) GROUP BY 1",
            (keys,),
        ).fetchall()
    return {key: 0 for key in keys} | dict(rows)


def _fill_pool(n: int) -> None:
    """Leave ``n`` idle connections in the process's pool (the live server's
    threads share it), as a busy hour before a restart does."""
    pool = connections["default"].pool
    held = [pool.getconn() for _ in range(n)]
    for conn in held:
        pool.putconn(conn)


def test_after_the_pools_connections_are_killed_the_next_request_succeeds(live_server, token):
    spare = _own_pid()
    for _ in range(3):  # the pool now holds open connections
        assert _call(f"{live_server.url}/api/jobs/", token)[0] == 200
    # Eight idle connections, all dead at once (a restart): psycopg_pool's own
    # check tried them one by one with a doubling backoff (1+2+4+8+16 s), past
    # the pool's 30 s timeout, and the first request after the restart failed.
    _fill_pool(8)

    assert kill_app_connections(spare) >= 8

    started = time.monotonic()
    status, _, body = _call(f"{live_server.url}/api/jobs/", token)
    assert status == 200, body
    # Well inside the pool's 30 s wait (one backoff step, not five).
    assert time.monotonic() - started < 15
    status, _, body = _call(
        f"{live_server.url}/api/jobs/", token, {"name": "after", "num_gpus": 4, "tenant": "llm"}
    )
    assert status == 201, body


def test_connections_killed_under_load_give_503_or_success_and_never_a_500(live_server, token):
    spare = _own_pid()
    url = f"{live_server.url}/api/jobs/"
    keys = [f"load-{i}" for i in range(60)]
    body = {"name": "load", "num_gpus": 1, "tenant": "llm"}
    stop = threading.Event()
    killed = [0]

    def killer() -> None:
        while not stop.is_set():
            # Established connections only, as a restart or an operator's kill
            # meets them: one killed while the pool is still setting it up makes
            # the pool back off for seconds, which is not what this test is about.
            killed[0] += kill_app_connections(spare, older_than_s=0.3)
            time.sleep(0.1)

    kills = threading.Thread(target=killer, daemon=True)
    kills.start()
    try:
        with ThreadPoolExecutor(max_workers=6) as pool:
            answers = list(pool.map(lambda key: (key, *_call(url, token, body, key)), keys))
    finally:
        stop.set()
        kills.join(10)

    assert killed[0] > 0, "no connection was killed: the test did not exercise the fault"
    statuses = [status for _, status, _, _ in answers]
    assert set(statuses) <= {201, 503}, [(k, s, b) for k, s, _, b in answers if s not in (201, 503)]
    for _, status, headers, data in answers:
        if status == 503:
            assert int(headers["Retry-After"]) >= 1
            assert "database" in data["detail"]
    # Once the kills stop, every refused submission succeeds on its retry, and
    # one that had been created comes back as the same job (200), not a second one.
    created = {key: data["id"] for key, status, _, data in answers if status == 201}
    for key, status, _, _ in answers:
        deadline = time.monotonic() + 60
        while status != 201 and key not in created:
            again, headers, data = _call(url, token, body, key)
            assert again in (200, 201, 503), data
            if again != 503:
                created[key] = data["id"]
            elif time.monotonic() > deadline:
                pytest.fail(f"{key}: still 503 a minute after the kills stopped")
            else:
                time.sleep(min(1.0, int(headers["Retry-After"])))
    assert _job_counts(keys) == {key: 1 for key in keys}
    assert len(set(created.values())) == len(keys)


def test_a_job_committed_before_its_connection_dies_is_answered_201(fleet, submitter_client):
    """What runs after the commit (the live-event publisher reads the job; the
    view used to re-read it) meets a connection killed right after the commit:
    the job exists, so the answer must be its 201, not an error."""
    from fleet.models import Job

    pid = _own_pid()
    seen = {"insert": False, "killed": False}

    def kill_on_first_read_after_commit(execute, sql, params, many, context):
        statement = sql.lstrip().upper()
        if statement.startswith('INSERT INTO "FLEET_JOB"'):
            seen["insert"] = True
        elif (
            seen["insert"]
            and not seen["killed"]
            and not connection.in_atomic_block
            and statement.startswith("SELECT")
        ):
            seen["killed"] = True
            with psycopg.connect(_admin_dsn(), autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(kill_on_first_read_after_commit):
        response = submitter_client.post(
            "/api/jobs/", {"name": "last-word", "num_gpus": 4, "tenant": "llm"}, format="json"
        )
    connection.close()  # the killed connection goes back to the pool, which drops it

    assert seen["killed"], "nothing read the database after the commit: the fault was not injected"
    assert response.status_code == 201, response.content
    assert response.json()["name"] == "last-word"
    assert Job.objects.filter(pk=response.json()["id"], name="last-word").exists()


def test_a_task_whose_connection_was_dropped_runs_again_on_a_fresh_one(fleet):
    """Tasks hit by a dropped connection failed and waited for reconcile (job
    starts 69-90 s late, #28 item 16); now they run again at once."""
    from fleet.tasks import detect_failures

    pid = _own_pid()
    with psycopg.connect(_admin_dsn(), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))

    result = detect_failures.apply()

    assert result.successful(), result.traceback
    assert _own_pid() != pid  # it went on with a new connection


class CuttableProxy:
    """A TCP proxy to PostgreSQL that can be cut (connections closed, new ones
    refused) and restored: a database outage as the app's pool sees it."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        import socket

        self.upstream, self.socket = upstream, socket
        probe = socket.create_server(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self.open: list = []
        self.listener = None
        self.restore()

    def restore(self) -> None:
        self.listener = self.socket.create_server(("127.0.0.1", self.port), reuse_port=False)
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def cut(self) -> None:
        self.listener.close()
        for s in self.open:
            try:
                s.shutdown(self.socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        self.open.clear()

    def _accept(self, listener) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            server = self.socket.create_connection(self.upstream)
            self.open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src, dst) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass


def test_during_a_database_outage_the_pool_tries_again_every_two_seconds_at_most(caplog):
    """After a 40 s outage the API answered 19 s late (#28 item 16): psycopg_pool
    tries to reconnect after 1, 2, 4, 8, 16, 32 s, so once every slot of the pool
    is in such a chain (under load), the next try came long after the database
    was back. The backoff is capped at 2 s: measured here on a real pool, through
    a proxy cut for 20 s, by the pool's own log of its attempts."""
    import logging

    from rackwise.db.base import MAX_RECONNECT_DELAY_S, Pool

    s = connection.settings_dict
    proxy = CuttableProxy((s["HOST"] or "127.0.0.1", int(s["PORT"] or 5432)))
    pool = Pool(
        kwargs={
            "host": "127.0.0.1",
            "port": proxy.port,
            "user": s["USER"],
            "dbname": s["NAME"],
            "connect_timeout": 2,
        },
        min_size=2,
        max_size=2,
        timeout=2,
        open=True,
    )
    caplog.set_level(logging.INFO, logger="psycopg.pool")
    try:
        pool.wait()
        proxy.cut()
        pool.check()  # the pool finds its connections dead and starts reconnecting
        time.sleep(20)
        attempts = [r.created for r in caplog.records if r.getMessage().startswith("error connecting")]
        proxy.restore()
        back = time.monotonic()
        with pool.connection(timeout=10) as conn:
            conn.execute("SELECT 1")
        late = time.monotonic() - back
    finally:
        pool.close()
        proxy.cut()
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert len(attempts) >= 8 and max(gaps) <= MAX_RECONNECT_DELAY_S * 1.2, gaps  # uncapped: 1, 2, 4, 8 s
    assert late < 4, f"the first request after the outage waited {late:.1f} s"
