"""The Rackwise REST API over HTTP, and the exit codes its answers map to.

Every failure becomes a ``CliError`` with an exit code a shell can test
(``EXIT``, README "For ML engineers: the rackwise command") and one line for
stderr; the API's own message (a 400's field messages, a 409's detail) is kept
as it came, and the whole body goes with it for ``--json``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import requests

from rackwise_cli import __version__

# Exit codes. 2 is click's own for a usage error (unknown option, bad value).
OK = 0
REFUSED = 1  # the API refused: 400 (field messages), 403, 404, 409, 429
USAGE = 2
UNREACHABLE = 3  # no answer (connection refused, DNS, timeout) or a 5xx
UNAUTHENTICATED = 4  # no token configured, or the server refused it (401)
JOB_FAILED = 5  # --wait: the job ended failed or cancelled
WAIT_TIMEOUT = 6  # --wait: still not running when --timeout passed

EXIT = {
    OK: "ok",
    REFUSED: "the API refused the request (400 with field messages, 403, 404, 409 conflict, 429)",
    USAGE: "usage error (bad option, unreadable job file)",
    UNREACHABLE: "cannot reach the server, or it answered 5xx",
    UNAUTHENTICATED: "not logged in, or the token was refused (401)",
    JOB_FAILED: "--wait: the job ended failed or cancelled",
    WAIT_TIMEOUT: "--wait: the timeout passed first",
}

TIMEOUT_S = 30.0


@dataclass
class CliError(Exception):
    """A failure to report in one line, with its exit code (and the API's body)."""

    message: str
    code: int = REFUSED
    status: int | None = None
    body: Any = field(default=None)

    def __str__(self) -> str:
        return self.message


def flatten_errors(body: Any, prefix: str = "") -> list[str]:
    """A 400 body's field messages as ``field: message``, nested fields joined
    with dots (``slurm.script: ...``), each message exactly as the API wrote it."""
    if isinstance(body, dict):
        out: list[str] = []
        for key, value in body.items():
            if key in ("detail", "non_field_errors"):
                out += flatten_errors(value, prefix)
            else:
                out += flatten_errors(value, f"{prefix}.{key}" if prefix else str(key))
        return out
    if isinstance(body, list):
        return [m for item in body for m in flatten_errors(item, prefix)]
    return [f"{prefix}: {body}" if prefix else str(body)]


def message_of(body: Any) -> str:
    """One line for an error body: its ``detail`` when it has one (a 409's extra
    fields are for --json), else every field message."""
    if isinstance(body, dict) and isinstance(body.get("detail"), str):
        return body["detail"]
    return "; ".join(flatten_errors(body))


def error_for(response: requests.Response) -> CliError:
    """The ``CliError`` for an answer that is not 2xx."""
    try:
        body: Any = response.json()
    except ValueError:
        body = None
    status = response.status_code
    if body is None:
        text = (response.text or response.reason or "").strip().splitlines()
        message = f"HTTP {status}" + (f": {text[0][:200]}" if text else "")
    else:
        message = message_of(body) or f"HTTP {status}"
    if status == 401:
        code = UNAUTHENTICATED
    elif status >= 500:
        code = UNREACHABLE
    else:
        code = REFUSED
    return CliError(f"{message} (HTTP {status})", code=code, status=status, body=body)


class Api:
    """A session against one server with one token (``Authorization: Token <key>``)."""

    def __init__(self, server: str, token: str | None, timeout: float = TIMEOUT_S) -> None:
        self.server = server.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers["User-Agent"] = f"rackwise-cli/{__version__}"
        self.session.headers["Accept"] = "application/json"
        if token:
            self.session.headers["Authorization"] = f"Token {token}"

    def url(self, path: str) -> str:
        return f"{self.server}/api/{path.lstrip('/')}"

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        try:
            response = self.session.request(method, self.url(path), timeout=self.timeout, **kwargs)
        except requests.exceptions.RequestException as exc:
            reason = type(exc).__name__
            raise CliError(f"cannot reach {self.server}: {reason}", code=UNREACHABLE) from exc
        if not response.ok:
            raise error_for(response)
        return response

    def get(self, path: str, params: Any = None) -> Any:
        return self._json(self.request("GET", path, params=params))

    def post(self, path: str, body: Any = None, headers: dict | None = None) -> Any:
        return self._json(self.request("POST", path, json=body if body is not None else {}, headers=headers))

    def post_response(self, path: str, body: Any = None) -> requests.Response:
        return self.request("POST", path, json=body if body is not None else {})

    def _json(self, response: requests.Response) -> Any:
        try:
            return response.json()
        except ValueError as exc:
            raise CliError(
                f"{self.server} did not answer JSON (is it a Rackwise server?)", code=UNREACHABLE
            ) from exc

    def pages(self, path: str, params: dict | None = None, limit: int = 100) -> list[dict]:
        """The first ``limit`` results of a list, following ``next``."""
        params = dict(params or {})
        out: list[dict] = []
        offset = 0
        while len(out) < limit:
            params.update(limit=min(100, limit - len(out)), offset=offset)
            page = self.get(path, params)
            results = page.get("results", []) if isinstance(page, dict) else page
            out += results
            if not isinstance(page, dict) or not page.get("next") or not results:
                break
            offset += len(results)
        return out[:limit]
