"""What the benchmarks and ``scripts/screenshots.py`` share to run their own
stack on this machine: the environment of the app served over plain http on
loopback, and a free port to serve it on."""

from __future__ import annotations

import os
import socket
import time


def app_env(db: str, *, redis_db: int, allowed_hosts: str = "127.0.0.1", **extra: str) -> dict[str, str]:
    """The environment for the app, its workers and ``manage.py`` on database
    ``db`` and Redis database ``redis_db`` (unless REDIS_URL is set), plus ``extra``."""
    return (
        os.environ
        | {
            "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{db}",
            "REDIS_URL": os.environ.get("REDIS_URL", f"redis://127.0.0.1:6379/{redis_db}"),
            "DEBUG": "0",
            "SECRET_KEY": "bench",
            "ALLOWED_HOSTS": allowed_hosts,
            "RACKWISE_DEMO": "0",
            "LOG_LEVEL": "WARNING",
            # Plain http on loopback: no HTTPS redirect, cookies without Secure.
            "SECURE_SSL_REDIRECT": "0",
            "SESSION_COOKIE_SECURE": "0",
            "CSRF_COOKIE_SECURE": "0",
        }
        | extra
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout: float = 30.0) -> None:
    """Until something accepts connections on ``port`` (or ``timeout`` passes)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
