"""The websocket Origin check. A browser sends ``Origin`` on every websocket
handshake; accepting only our own origin stops another site from opening the
live feed with the user's session cookie (cross-site websocket hijacking)."""

from __future__ import annotations

from urllib.parse import urlparse

from channels.security.websocket import OriginValidator, WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host

_DEFAULT_PORTS = {"http": 80, "ws": 80, "https": 443, "wss": 443}


def _origin_tuple(scheme: str, host: str, port: int | None) -> tuple[str, str, int | None]:
    scheme = {"ws": "http", "wss": "https"}.get(scheme.lower(), scheme.lower())
    return scheme, host.lower().strip("[]"), port if port is not None else _DEFAULT_PORTS.get(scheme)


def _parse(origin: str) -> tuple[str, str, int | None] | None:
    try:
        parsed = urlparse(origin)
        port = parsed.port
    except ValueError:
        return None
    if not parsed.scheme or not parsed.hostname:
        return None
    return _origin_tuple(parsed.scheme, parsed.hostname, port)


class SameOriginValidator(OriginValidator):
    """Accepts a handshake whose Origin (scheme, host and port) is the request's
    own (the scheme of the connection, the Host header, which must be in
    ALLOWED_HOSTS) or is listed in CSRF_TRUSTED_ORIGINS; refuses one without an
    Origin. Channels' AllowedHostsOriginValidator compared the host name only, so
    ``http://host:9999`` passed for ``https://host``."""

    def __init__(self, application) -> None:
        super().__init__(application, allowed_origins=[])

    async def __call__(self, scope, receive, send):
        if scope["type"] != "websocket":
            raise ValueError("SameOriginValidator is for websocket connections only")
        headers = dict(scope.get("headers", []))
        try:
            origin = headers.get(b"origin", b"").decode("latin1")
            host = headers.get(b"host", b"").decode("latin1")
        except UnicodeDecodeError:  # pragma: no cover - latin1 decodes any byte
            origin = host = ""
        scheme = scope.get("scheme") or "ws"
        if settings.SECURE_PROXY_SSL_HEADER:
            # The same trust as Django's request.is_secure(): the proxy says https.
            name, value = settings.SECURE_PROXY_SSL_HEADER
            forwarded = headers.get(name.removeprefix("HTTP_").replace("_", "-").lower().encode(), b"")
            if forwarded.decode("latin1").split(",")[0].strip() == value:
                scheme = "wss"
        if origin and self.allowed(origin, host, scheme):
            return await self.application(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)

    @staticmethod
    def allowed(origin: str, host: str, scheme: str) -> bool:
        """Is ``origin`` the connection's own origin, or a trusted one?"""
        wanted = _parse(origin)
        if wanted is None:
            return False
        trusted = {_parse(o) for o in settings.CSRF_TRUSTED_ORIGINS}
        if wanted in trusted:
            return True
        allowed_hosts = settings.ALLOWED_HOSTS or (
            ["localhost", "127.0.0.1", "[::1]"] if settings.DEBUG else []
        )
        if not host:
            # No Host header: not a browser (browsers always send one, and the
            # Origin check protects browsers), e.g. channels' test communicator.
            # Fall back to the host-name check channels does.
            return validate_host(wanted[1], allowed_hosts)
        domain, port = split_domain_port(host)
        if not domain or not validate_host(domain, allowed_hosts):
            return False
        own = _origin_tuple(scheme, domain, int(port) if port else None)
        return wanted == own
