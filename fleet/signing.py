"""HMAC-SHA256 signatures for webhook deliveries and callbacks.

Header: ``X-Rackwise-Signature: t=<unix seconds>,v1=<hex hmac of "t.body">``.
The timestamp is signed too, so an old delivery cannot be replayed later."""

from __future__ import annotations

import hashlib
import hmac
import http.client
import socket
import ssl
import time
import urllib.error
import urllib.request
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


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # urllib would turn a redirected POST into a GET without the body (and
    # without our signature's meaning); a redirect is the receiver's mistake.
    def redirect_request(self, *args, **kwargs):
        return None


_opener = urllib.request.build_opener(_NoRedirect)


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


def _post_pinned(url: str, address: str, body: bytes, headers: dict[str, str], timeout: float) -> PostResult:
    parts = urlsplit(url)
    cls = _PinnedHTTPSConnection if parts.scheme == "https" else _PinnedHTTPConnection
    port = parts.port or (443 if parts.scheme == "https" else 80)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    connection = cls(parts.hostname or "", port, address=address, timeout=timeout)
    try:
        # http.client follows no redirects: a 3xx is returned like any answer.
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        return PostResult(response.status, *_measure(response))
    finally:
        connection.close()


def post_signed(
    url: str,
    secret: str,
    body: bytes,
    *,
    timeout: float,
    headers: dict[str, str] | None = None,
    connect_to: str | None = None,
) -> PostResult:
    """POST ``body`` as JSON to ``url`` with a fresh signature header. Any HTTP
    answer (2xx or not) is returned, as its status and size; an unreachable or
    silent receiver raises OSError (``urllib.error.URLError``, ``TimeoutError``
    and ``ssl.SSLError`` are OSErrors).

    ``connect_to``: the IP address to connect to instead of resolving the URL's
    host again (event webhooks pass the address they checked, see
    ``fleet.services.webhook_targets``); the host name is still sent as
    ``Host`` and used for TLS."""
    all_headers = {"Content-Type": "application/json", HEADER: sign(secret, body), **(headers or {})}
    try:
        if connect_to is not None:
            return _post_pinned(url, connect_to, body, all_headers, timeout)
        request = urllib.request.Request(url, data=body, method="POST", headers=all_headers)
        try:
            with _opener.open(request, timeout=timeout) as response:
                return PostResult(response.status, *_measure(response))
        except urllib.error.HTTPError as exc:
            with exc:
                return PostResult(exc.code, *_measure(exc))
    except http.client.HTTPException as exc:  # a malformed answer: not an OSError
        raise OSError(f"bad HTTP answer: {exc!r}") from exc
