"""What error pages and error reports may show of the settings."""

from __future__ import annotations

import re

from django.views.debug import SafeExceptionReporterFilter as DjangoFilter

# scheme://user:password@host -> scheme://user:********@host (also a bare
# ``:password@``, as Redis URLs have it).
_URL_CREDENTIALS = re.compile(
    r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<password>[^@/\s]+)@", re.I
)


def mask_url_credentials(value: str) -> str:
    """``redis://:s3cret@h:6379/0`` -> ``redis://:********@h:6379/0``."""
    return _URL_CREDENTIALS.sub(lambda m: f"{m['scheme']}{m['user']}:********@", value)


class SafeExceptionReporterFilter(DjangoFilter):
    """Django's filter (hides settings named like KEY, TOKEN, PASS...), plus the
    password inside any URL-valued setting or request header: ``REDIS_URL``,
    ``CELERY_BROKER_URL``, ``CHANNEL_LAYERS`` and ``CACHES`` hold one when Redis
    has a password, and their names match no secret pattern."""

    def cleanse_setting(self, key, value):
        cleansed = super().cleanse_setting(key, value)
        if isinstance(cleansed, str):
            return mask_url_credentials(cleansed)
        return cleansed
