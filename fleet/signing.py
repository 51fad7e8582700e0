"""HMAC-SHA256 signatures for webhook deliveries and callbacks.

Header: ``X-Rackwise-Signature: t=<unix seconds>,v1=<hex hmac of "t.body">``.
The timestamp is signed too, so an old delivery cannot be replayed later."""

from __future__ import annotations

import hashlib
import hmac
import http.client
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

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


@dataclass(frozen=True)
class PostResult:
    status: int
    body: str  # the first few hundred characters of the answer, for the history


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # urllib would turn a redirected POST into a GET without the body (and
    # without our signature's meaning); a redirect is the receiver's mistake.
    def redirect_request(self, *args, **kwargs):
        return None


_opener = urllib.request.build_opener(_NoRedirect)


def post_signed(
    url: str, secret: str, body: bytes, *, timeout: float, headers: dict[str, str] | None = None
) -> PostResult:
    """POST ``body`` as JSON to ``url`` with a fresh signature header. Any HTTP
    answer (2xx or not) is returned; an unreachable or silent receiver raises
    OSError (``urllib.error.URLError`` and ``TimeoutError`` are OSErrors)."""
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", HEADER: sign(secret, body), **(headers or {})},
    )
    try:
        with _opener.open(request, timeout=timeout) as response:
            return PostResult(response.status, response.read(500).decode(errors="replace"))
    except urllib.error.HTTPError as exc:
        with exc:
            return PostResult(exc.code, exc.read(500).decode(errors="replace"))
    except http.client.HTTPException as exc:  # a malformed answer: not an OSError
        raise OSError(f"bad HTTP answer: {exc!r}") from exc
