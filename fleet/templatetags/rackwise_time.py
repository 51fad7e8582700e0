"""Times in the console: ``{{ t|when }}`` (``{{ t|when:"s" }}`` with seconds)
and ``{{ t|ago }}``. The page carries the instant (``<time datetime>``) and
shows it in UTC, named; ``static/rackwise/time.js`` then writes it in the
viewer's own zone, named ("2026-12-05 03:12 CET"), and keeps ages current
("12 min ago", the full time on hover)."""

from __future__ import annotations

from datetime import UTC, datetime

from django import template
from django.utils.html import format_html
from django.utils.timesince import timesince

register = template.Library()


@register.filter
def when(value: datetime | None, seconds: str = "") -> str:
    if not value:
        return ""
    utc = value.astimezone(UTC)
    shown = utc.strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M")
    return format_html(
        '<time datetime="{}" data-when{}>{} UTC</time>',
        utc.isoformat(),
        " data-seconds" if seconds else "",
        shown,
    )


@register.filter
def ago(value: datetime | None) -> str:
    if not value:
        return ""
    utc = value.astimezone(UTC)
    return format_html(
        '<time datetime="{}" data-ago title="{} UTC">{} ago</time>',
        utc.isoformat(),
        utc.strftime("%Y-%m-%d %H:%M:%S"),
        timesince(value).split(",")[0],
    )
