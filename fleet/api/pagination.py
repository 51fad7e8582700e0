"""List pagination: limit/offset with a largest page (1,000, as NetBox caps it).

DRF's own ``LimitOffsetPagination`` has no ``max_limit`` and ignores a malformed
``limit`` silently; a ``limit`` beyond PostgreSQL's bigint reached the database and
answered 500. Here every bad value is a 400 that says what fits."""

from __future__ import annotations

from django.conf import settings
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination


def _bounded_int(request, name: str, default: int, minimum: int, maximum: int) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    # isdecimal() and isascii(): int() would take "²"-like digits, signs and spaces.
    if not (raw.isascii() and raw.isdecimal()) or len(raw) > 19 or not minimum <= int(raw) <= maximum:
        raise ValidationError({name: [f"must be an integer from {minimum} to {maximum}, got {raw[:40]!r}"]})
    return int(raw)


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    """``?limit=`` 1..``RACKWISE_API_MAX_LIMIT`` (default page ``PAGE_SIZE``),
    ``?offset=`` 0..``RACKWISE_API_MAX_OFFSET``; anything else is a 400."""

    @property
    def max_limit(self) -> int:  # type: ignore[override]
        return settings.RACKWISE_API_MAX_LIMIT

    def get_limit(self, request) -> int:
        return _bounded_int(request, self.limit_query_param, self.default_limit, 1, self.max_limit)

    def get_offset(self, request) -> int:
        return _bounded_int(request, self.offset_query_param, 0, 0, settings.RACKWISE_API_MAX_OFFSET)

    def get_schema_operation_parameters(self, view) -> list[dict]:
        parameters = super().get_schema_operation_parameters(view)
        bounds = {
            self.limit_query_param: {"minimum": 1, "maximum": self.max_limit},
            self.offset_query_param: {"minimum": 0, "maximum": settings.RACKWISE_API_MAX_OFFSET},
        }
        for parameter in parameters:
            parameter["schema"].update(bounds.get(parameter["name"], {}))
        return parameters
