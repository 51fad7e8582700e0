"""API authentication and throttling: hashed, optionally expiring tokens
(django-rest-knox) behind the same ``Authorization: Token <key>`` header, with a
limit on wrong tokens per address; and a per-user request rate."""

from __future__ import annotations

import logging

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.plumbing import build_bearer_security_scheme_object
from knox.auth import TokenAuthentication as KnoxTokenAuthentication
from rest_framework import throttling
from rest_framework.exceptions import AuthenticationFailed, Throttled

from fleet.auth import client_ip, token_limiter

log = logging.getLogger(__name__)


class TokenAuthentication(KnoxTokenAuthentication):
    """``Authorization: Token <key>``, checked against the stored hash. After
    ``RACKWISE_TOKEN_MAX_FAILURES`` wrong tokens from one address in the window,
    that address gets 429 for every token, right or wrong, until the window passes."""

    def authenticate(self, request):
        limiter = token_limiter()
        keys = [f"ip:{client_ip(request)}"]
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if header[:6].lower() == "token " and limiter.blocked(keys):
            raise Throttled(wait=limiter.window_s, detail="Too many invalid API tokens from this address.")
        try:
            return super().authenticate(request)
        except AuthenticationFailed:
            limiter.record_failure(keys)
            raise
        except UnicodeDecodeError as exc:  # knox decodes the key as UTF-8
            limiter.record_failure(keys)
            raise AuthenticationFailed("Invalid token.") from exc


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
