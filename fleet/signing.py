"""HMAC-SHA256 signatures for webhook deliveries and callbacks.

Header: ``X-Rackwise-Signature: t=<unix seconds>,v1=<hex hmac of "t.body">``.
The timestamp is signed too, so an old delivery cannot be replayed later."""

from __future__ import annotations

import hashlib
import hmac
import http.client
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

HEADER = "X-Rackwise-Signature"
MAX_SKEW_S = 300


def sign(secret: str, body: bytes, timestamp: int | None = None) -> str:
    t = int(time.time() if timestamp is None else timestamp)
    mac = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def verify(secret: str, body: bytes, header: str | None, now: float | None = None) -> bool:
    """True if ``header`` is a valid, fresh signature of ``body`` with ``secret``."""
    if not secret or not header:
        return False
    try:
        parts = dict(item.split("=", 1) for item in header.split(","))
        t = int(parts["t"])
        given = parts["v1"]
    except (KeyError, ValueError):
        return False
    if abs((time.time() if now is None else now) - t) > MAX_SKEW_S:
        return False
    expected = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, given)


# How much of an answer is read (and counted) at most: only its status and size
# are kept, and a receiver must not hold a worker by streaming a large body.
MAX_ANSWER_BYTES = 64 * 1024


@dataclass(frozen=True)
class PostResult:
    status: int
    # Bytes of the answer's body, read up to MAX_ANSWER_BYTES (the body itself is
    # never kept: the delivery history must not read back what an endpoint says).
    length: int
    truncated: bool = False

    def describe(self) -> str:
        size = f"more than {MAX_ANSWER_BYTES}" if self.truncated else str(self.length)
        return f"HTTP {self.status}, {size} bytes"


def _measure(response) -> tuple[int, bool]:
    data = response.read(MAX_ANSWER_BYTES + 1)
    return min(len(data), MAX_ANSWER_BYTES), len(data) > MAX_ANSWER_BYTES


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """Connects to ``address`` while ``host`` stays the name (the Host header)."""

    def __init__(self, host: str, port: int, *, address: str, **kwargs) -> None:
        super().__init__(host, port, **kwargs)
        self._create_connection = lambda where, timeout, source=None: socket.create_connection(
            (address, where[1]), timeout, source
        )


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """As above, over TLS: SNI and certificate checks use the name, not the address."""

    def __init__(self, host: str, port: int, *, address: str, **kwargs) -> None:
        super().__init__(host, port, context=ssl.create_default_context(), **kwargs)
        self._create_connection = lambda where, timeout, source=None: socket.create_connection(
            (address, where[1]), timeout, source
        )


def _connection(url: str, address: str | None, timeout: float) -> http.client.HTTPConnection:
    parts = urlsplit(url)
    https = parts.scheme == "https"
    host, port = parts.hostname or "", parts.port or (443 if https else 80)
    if address is not None:
        cls = _PinnedHTTPSConnection if https else _PinnedHTTPConnection
        return cls(host, port, address=address, timeout=timeout)
    if https:
        return http.client.HTTPSConnection(host, port, timeout=timeout, context=ssl.create_default_context())
    return http.client.HTTPConnection(host, port, timeout=timeout)


def _post(url: str, address: str | None, body: bytes, headers: dict[str, str], timeout: float) -> PostResult:
    """One POST that ends within ``timeout`` seconds in all: the socket timeout
    bounds each read, and a watchdog cuts the connection at the deadline, so a
    receiver that answers a byte at a time cannot hold a worker for longer.
    No redirect is followed (a 3xx is returned like any answer: a redirected
    POST would lose its body and its signature's meaning)."""
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    connection = _connection(url, address, timeout)
    expired = threading.Event()

    def cut() -> None:
        expired.set()
        if connection.sock is not None:
            try:
                connection.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    watchdog = threading.Timer(timeout, cut)
    watchdog.daemon = True
    watchdog.start()
    try:
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        result = PostResult(response.status, *_measure(response))
    except (OSError, http.client.HTTPException):
        if expired.is_set():
            raise TimeoutError(f"timed out: no whole answer within {timeout:g} s") from None
        raise
    finally:
        watchdog.cancel()
        connection.close()
    if expired.is_set():
        raise TimeoutError(f"timed out: no whole answer within {timeout:g} s")
    return result


def post_signed(
    url: str,
    secret: str,
    body: bytes,
    *,
    timeout: float,
    headers: dict[str, str] | None = None,
    connect_to: str | None = None,
) -> PostResult:
    """POST ``body`` as JSON to ``url`` with a fresh signature header, within
    ``timeout`` seconds in all. Any HTTP answer (2xx or not) is returned, as
    its status and size; an unreachable, silent or too slow receiver raises
    OSError (``TimeoutError`` and ``ssl.SSLError`` are OSErrors).

    ``connect_to``: the IP address to connect to instead of resolving the URL's
    host again (event webhooks pass the address they checked, see
    ``fleet.services.webhook_targets``); the host name is still sent as
    ``Host`` and used for TLS."""
    all_headers = {"Content-Type": "application/json", HEADER: sign(secret, body), **(headers or {})}
    try:
        return _post(url, connect_to, body, all_headers, timeout)
    except http.client.HTTPException as exc:  # a malformed answer: not an OSError
        raise OSError(f"bad HTTP answer: {exc!r}") from exc
