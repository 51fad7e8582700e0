"""Failed-login limits, for the console's login form, the admin's and API tokens.

Nobody can lock another person out (#28 item 11). Failures are counted in the
Django cache (Redis) for a window that starts at the first failure:

- per username and client address: after ``RACKWISE_LOGIN_MAX_FAILURES``
  failures, that client is refused for that username, even with the right
  password, until the window passes (one client guessing one account);
- per username, from every address: no lock, a delay. Once the username has
  had that many failures, a client that has itself failed for it must wait
  ``2 ** (failures - limit)`` seconds (at most ``RACKWISE_LOGIN_MAX_DELAY_S``)
  after the username's last failure before it may try again; a client that
  has not failed for it (the account's owner at their own desk) is never held
  back by failures from elsewhere;
- per client address, for any username: ``RACKWISE_LOGIN_MAX_ADDRESS_FAILURES``
  failures (spraying many accounts) refuse that address for the window;
- API tokens: a valid token always works. A client that sent
  ``RACKWISE_TOKEN_MAX_FAILURES`` wrong tokens gets 429 with Retry-After for its
  wrong tokens (it is slowed down), never anyone else, nor its own right one.

The client address is read through ``RACKWISE_NUM_PROXIES`` trusted proxies
(as DRF's ``NUM_PROXIES``): behind one load balancer set it to 1, so that each
client is counted, not the balancer. A cache that does not answer fails open
(logged): Redis being down must not lock every operator out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from django import forms
from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.core.cache import cache

from fleet.choices import Role
from fleet.permissions import role_of

log = logging.getLogger(__name__)


def client_ip(request) -> str:
    """The client's address: the peer's, or with ``RACKWISE_NUM_PROXIES`` trusted
    proxies in front, the address the outermost of them saw (taken from the
    right of X-Forwarded-For, which only the trusted proxies wrote)."""
    if request is None:
        return "unknown"
    peer = request.META.get("REMOTE_ADDR") or "unknown"
    proxies = settings.RACKWISE_NUM_PROXIES
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
    if proxies <= 0 or not forwarded:
        return peer
    hops = [h.strip() for h in forwarded.split(",") if h.strip()]
    return hops[-min(proxies, len(hops))][:64] if hops else peer


class FailureLimiter:
    """Counts failures per key in a fixed window; ``blocked`` once ``limit`` is reached."""

    def __init__(self, scope: str, limit: int, window_s: int) -> None:
        self.scope, self.limit, self.window_s = scope, limit, window_s

    def _key(self, key: str) -> str:
        return f"fail:{self.scope}:{key}"

    def counts(self, keys: Iterable[str]) -> dict[str, int]:
        keys = list(keys)
        try:
            found = cache.get_many([self._key(k) for k in keys])
        except Exception:
            log.warning("cache unavailable: %s failure limit not checked", self.scope, exc_info=True)
            return {}
        return {k: int(found[self._key(k)]) for k in keys if self._key(k) in found}

    def blocked(self, keys: Iterable[str], limit: int | None = None) -> bool:
        limit = self.limit if limit is None else limit
        return any(v >= limit for v in self.counts(keys).values())

    def record_failure(self, keys: Iterable[str]) -> None:
        try:
            for key in keys:
                # add() starts the window at the first failure; incr() is atomic, so
                # concurrent guesses are all counted.
                cache.add(self._key(key), 0, timeout=self.window_s)
                try:
                    cache.incr(self._key(key))
                except ValueError:  # the window lapsed between add and incr
                    cache.add(self._key(key), 1, timeout=self.window_s)
        except Exception:
            log.warning("cache unavailable: %s failure not counted", self.scope, exc_info=True)

    def reset(self, keys: Iterable[str]) -> None:
        try:
            cache.delete_many([self._key(k) for k in keys])
        except Exception:
            log.warning("cache unavailable: %s failures not reset", self.scope, exc_info=True)

    def stamp(self, key: str) -> None:
        """Remember when ``key`` last failed (for a delay)."""
        try:
            cache.set(self._key(f"last:{key}"), time.time(), timeout=self.window_s)
        except Exception:
            log.warning("cache unavailable: %s failure time not kept", self.scope, exc_info=True)

    def since_last(self, key: str) -> float | None:
        try:
            last = cache.get(self._key(f"last:{key}"))
        except Exception:
            return None
        return None if last is None else time.time() - float(last)

    @property
    def wait_message(self) -> str:
        minutes = max(1, round(self.window_s / 60))
        return f"Too many failed attempts; try again in up to {minutes} minute{'s' if minutes > 1 else ''}."


def login_limiter() -> FailureLimiter:
    return FailureLimiter("login", settings.RACKWISE_LOGIN_MAX_FAILURES, settings.RACKWISE_LOGIN_WINDOW_S)


def token_limiter() -> FailureLimiter:
    return FailureLimiter("token", settings.RACKWISE_TOKEN_MAX_FAILURES, settings.RACKWISE_LOGIN_WINDOW_S)


def login_delay(limiter: FailureLimiter, username: str, address: str) -> float:
    """Seconds this client must still wait before trying ``username`` again (the
    per-username backoff; 0 for a client that has not failed for it)."""
    user, pair = f"user:{username}", f"pair:{username}:{address}"
    counts = limiter.counts([user, pair])
    over = counts.get(user, 0) - limiter.limit
    if over < 0 or not counts.get(pair):
        return 0.0
    delay = min(2.0**over, float(settings.RACKWISE_LOGIN_MAX_DELAY_S))
    since = limiter.since_last(user)
    return 0.0 if since is None else max(0.0, delay - since)


class ThrottledLoginMixin:
    """For an AuthenticationForm: the limits of this module's docstring."""

    def clean(self):
        username = (self.data.get("username") or "").strip().lower()
        address = client_ip(self.request)
        user, pair, ip = f"user:{username}", f"pair:{username}:{address}", f"ip:{address}"
        limiter = login_limiter()
        if limiter.blocked([pair]) or limiter.blocked([ip], settings.RACKWISE_LOGIN_MAX_ADDRESS_FAILURES):
            raise forms.ValidationError(limiter.wait_message, code="throttled")
        wait = login_delay(limiter, username, address)
        if wait > 0:
            raise forms.ValidationError(
                f"Too many failed attempts for this username; try again in {max(1, round(wait))} s.",
                code="throttled",
            )
        try:
            cleaned = super().clean()
        except forms.ValidationError as exc:
            if getattr(exc, "code", None) == "invalid_login":
                limiter.record_failure([user, pair, ip])
                limiter.stamp(user)
            raise
        # A successful login forgives the username's failures (its owner is here),
        # not the address's.
        limiter.reset([pair, user])
        return cleaned


class LoginForm(ThrottledLoginMixin, AuthenticationForm):
    """The console's login form."""


class AdminLoginForm(ThrottledLoginMixin, AdminAuthenticationForm):
    """The admin's login form, with the same limits."""


# The apps an operator administers in /admin/ (the README's roles table:
# operators do everything, including the admin). Users and groups are not among
# them: an operator must not be able to make anyone a superuser.
OPERATOR_ADMIN_APPS = frozenset({"fleet", "django_celery_beat"})


class OperatorPermissionsBackend:
    """Gives active operators (staff, set by ``ensure_user``) every permission on
    the fleet's and the beat schedule's models. Authenticates nobody; Django's
    ModelBackend still checks passwords and everyone else's permissions."""

    def authenticate(self, request, **credentials):
        return None

    def get_user(self, user_id):
        return None

    def _is_operator(self, user) -> bool:

        return bool(user.is_active and user.is_staff and role_of(user) == Role.OPERATOR)

    def has_perm(self, user, perm: str, obj=None) -> bool:
        return perm.split(".", 1)[0] in OPERATOR_ADMIN_APPS and self._is_operator(user)

    def has_module_perms(self, user, app_label: str) -> bool:
        return app_label in OPERATOR_ADMIN_APPS and self._is_operator(user)
