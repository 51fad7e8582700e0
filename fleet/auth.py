"""Failed-login limits, for the console's login form, the admin's and API tokens.

Failures are counted in the Django cache (Redis) per key (a username, a client
address) for a fixed window that starts at the first failure. Once a key has
``limit`` failures, attempts for it are refused, even with the right password,
until its window has passed: otherwise an attacker just keeps guessing until one
works. A cache that does not answer fails open (logged): Redis being down must
not lock every operator out.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django import forms
from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.core.cache import cache

log = logging.getLogger(__name__)


def client_ip(request) -> str:
    """The peer's address. Behind a proxy every client has the proxy's address,
    so the per-address limit then applies to all of them together (the
    per-username limit is unaffected)."""
    return (request.META.get("REMOTE_ADDR") or "unknown") if request is not None else "unknown"


class FailureLimiter:
    """Counts failures per key in a fixed window; ``blocked`` once ``limit`` is reached."""

    def __init__(self, scope: str, limit: int, window_s: int) -> None:
        self.scope, self.limit, self.window_s = scope, limit, window_s

    def _key(self, key: str) -> str:
        return f"fail:{self.scope}:{key}"

    def blocked(self, keys: Iterable[str]) -> bool:
        try:
            counts = cache.get_many([self._key(k) for k in keys])
        except Exception:
            log.warning("cache unavailable: %s failure limit not checked", self.scope, exc_info=True)
            return False
        return any(int(v) >= self.limit for v in counts.values())

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

    @property
    def wait_message(self) -> str:
        minutes = max(1, round(self.window_s / 60))
        return f"Too many failed attempts; try again in up to {minutes} minute{'s' if minutes > 1 else ''}."


def login_limiter() -> FailureLimiter:
    return FailureLimiter("login", settings.RACKWISE_LOGIN_MAX_FAILURES, settings.RACKWISE_LOGIN_WINDOW_S)


def token_limiter() -> FailureLimiter:
    return FailureLimiter("token", settings.RACKWISE_TOKEN_MAX_FAILURES, settings.RACKWISE_LOGIN_WINDOW_S)


class ThrottledLoginMixin:
    """For an AuthenticationForm: refuse while the username or the address is
    over its failure limit; count each wrong password against both."""

    def clean(self):
        username = (self.data.get("username") or "").strip().lower()
        keys = [f"user:{username}", f"ip:{client_ip(self.request)}"]
        limiter = login_limiter()
        if limiter.blocked(keys):
            raise forms.ValidationError(limiter.wait_message, code="throttled")
        try:
            cleaned = super().clean()
        except forms.ValidationError as exc:
            if getattr(exc, "code", None) == "invalid_login":
                limiter.record_failure(keys)
            raise
        # A successful login forgives this username's failures, not the address's.
        limiter.reset(keys[:1])
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
        from fleet.choices import Role
        from fleet.permissions import role_of

        return bool(user.is_active and user.is_staff and role_of(user) == Role.OPERATOR)

    def has_perm(self, user, perm: str, obj=None) -> bool:
        return perm.split(".", 1)[0] in OPERATOR_ADMIN_APPS and self._is_operator(user)

    def has_module_perms(self, user, app_label: str) -> bool:
        return app_label in OPERATOR_ADMIN_APPS and self._is_operator(user)
