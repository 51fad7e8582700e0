"""HMAC-SHA256 signatures for webhook deliveries and callbacks.

Header: ``X-Rackwise-Signature: t=<unix seconds>,v1=<hex hmac of "t.body">``.
The timestamp is signed too, so an old delivery cannot be replayed later."""

from __future__ import annotations

import hashlib
import hmac
import time

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
