"""API authentication and throttling: hashed, optionally expiring tokens
(django-rest-knox) behind the same ``Authorization: Token <key>`` header, with a
limit on wrong tokens per address; and a per-user request rate."""

from __future__ import annotations

import logging

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.plumbing import build_bearer_security_scheme_object
from knox.auth import TokenAuthentication as KnoxTokenAuthentication
from rest_framework import throttling
from rest_framework.authentication import get_authorization_header
from rest_framework.exceptions import AuthenticationFailed, Throttled

from fleet.auth import client_ip, token_limiter

log = logging.getLogger(__name__)


# The schemes a token may come under: ``Token`` (DRF's and knox's) and ``Bearer``
# (what OAuth-minded clients send).
SCHEMES = (b"token", b"bearer")
# A wrong key's 401 names the scheme too (#32): a client sending ``Bearer`` with
# a key from elsewhere learnt only "Invalid token." and kept guessing the scheme.
INVALID_TOKEN = (
    "Invalid token: no API token has this key, or it has expired. The scheme is 'Token': "
    "send 'Authorization: Token <key>' ('Bearer <key>' is taken too) with a key that "
    "create_api_user printed."
)


class TokenAuthentication(KnoxTokenAuthentication):
    """``Authorization: Token <key>`` (or ``Bearer <key>``), checked against the
    stored hash. After ``RACKWISE_TOKEN_MAX_FAILURES`` wrong tokens from one
    client in the window, its wrong tokens get 429 until the window passes; a
    right token always works (``fleet.auth``)."""

    def authenticate(self, request):
        auth = get_authorization_header(request).split()
        if not auth or auth[0].lower() not in SCHEMES:
            return None  # another scheme, or none: a 401 that names ours (authenticate_header)
        if len(auth) != 2:
            self._failed(
                request, "Invalid token header: send 'Authorization: Token <key>', one key without spaces."
            )
        try:
            return self.authenticate_credentials(auth[1])
        except (AuthenticationFailed, UnicodeDecodeError):  # knox decodes the key as UTF-8
            self._failed(request, INVALID_TOKEN)

    def _failed(self, request, message: str):
        """A wrong token: counted for this client, which gets 429 once over the
        limit (slowed down); a right token is never refused for this."""
        limiter = token_limiter()
        keys = [f"ip:{client_ip(request)}"]
        limiter.record_failure(keys)
        if limiter.blocked(keys):
            raise Throttled(wait=limiter.window_s, detail="Too many invalid API tokens from this address.")
        raise AuthenticationFailed(message)


class TokenAuthenticationScheme(OpenApiAuthenticationExtension):
    """The schema's ``tokenAuth``, as with DRF's tokens: ``Authorization: Token <key>``."""

    target_class = "fleet.api.auth.TokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema):
        return build_bearer_security_scheme_object(header_name="Authorization", token_prefix="Token")


class UserRateThrottle(throttling.UserRateThrottle):
    """DRF's per-user rate (``RACKWISE_THROTTLE_USER``), failing open when the
    cache (Redis) does not answer: a Redis restart must not fail API calls."""

    def allow_request(self, request, view) -> bool:
        try:
            return super().allow_request(request, view)
        except Exception:
            log.warning("cache unavailable: request rate not checked", exc_info=True)
            return True

    def get_cache_key(self, request, view) -> str | None:
        # A node agent is not a user (pk None): each node gets its own bucket,
        # or all agents of a big fleet would share one.
        node_id = getattr(request.user, "node_id", None)
        if node_id is not None:
            return self.cache_format % {"scope": self.scope, "ident": f"node-{node_id}"}
        return super().get_cache_key(request, view)
