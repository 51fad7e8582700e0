"""REST endpoints the operator console reads: the rack snapshot it repairs its
live picture from, and the chart's samples."""

from __future__ import annotations

import math

from django.conf import settings
from django.utils.decorators import method_decorator
from django.views.decorators.gzip import gzip_page
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from fleet.events import rack_state, visible_to
from fleet.models import Rack
from fleet.permissions import sees_all_tenants
from fleet.services.metrics import chart_markers, samples_since

MAX_SAMPLE_HOURS = 720.0
MAX_RACK_ID = 2**63 - 1  # the id column is a bigint


def _rack_ids(raw: str) -> list[int]:
    """``ids`` as integers; a 400 for anything else, and for more ids than a page
    of racks holds (the list is one query's ``IN``)."""
    parts = [x for x in raw.split(",") if x]
    if len(parts) > settings.RACKWISE_API_MAX_LIMIT:
        raise ValidationError({"ids": [f"at most {settings.RACKWISE_API_MAX_LIMIT} rack ids, got {len(parts)}"]})
    if not all(p.isascii() and p.isdecimal() and len(p) <= 19 and int(p) <= MAX_RACK_ID for p in parts):
        raise ValidationError({"ids": ["comma-separated rack ids (positive integers)"]})
    return [int(p) for p in parts]


def tenant_filter(user) -> set[int] | None:
    """None when the user sees every tenant; else the tenants it belongs to."""
    return None if sees_all_tenants(user) else set(user.tenants.values_list("id", flat=True))


@method_decorator(gzip_page, name="dispatch")
class ConsoleRacksView(APIView):
    """The cell state of every rack (or of ``ids``), each at its version, in the
    shape of the live feed's ``rack`` events and redacted the same way.

    Gzipped for clients that accept it (the console's first load is the whole
    fleet: 18 cells of 4 per rack compress well). Only this JSON is compressed,
    never a page with a CSRF token in it (BREACH)."""

    @extend_schema(
        parameters=[OpenApiParameter("ids", str, description="Comma-separated rack ids; default all.")],
        responses=inline_serializer("ConsoleRacks", {"racks": serializers.ListField(child=serializers.DictField())}),
    )
    def get(self, request):
        raw = request.query_params.get("ids")
        ids = _rack_ids(raw) if raw else list(Rack.objects.values_list("id", flat=True))
        tenants = tenant_filter(request.user)
        return Response({"racks": [visible_to(e, tenants) for e in rack_state(ids)]})


class FleetSamplesView(APIView):
    """Samples of the last ``hours`` (default 24): utilization, fragmentation,
    queue depth and the pending jobs' wait percentiles; and the node failures and
    defrags to mark on the charts."""

    @extend_schema(
        parameters=[OpenApiParameter("hours", float, description="How far back; 1 to 720 (else a 400).")],
        responses=inline_serializer(
            "FleetSamples", {"samples": serializers.ListField(child=serializers.DictField()),
                             "markers": serializers.ListField(child=serializers.DictField())}
        ),
    )
    def get(self, request):
        raw = request.query_params.get("hours", "24")
        try:
            hours = float(raw) if len(raw) <= 20 else math.nan
        except ValueError:
            hours = math.nan
        # "nan" passed min/max clamping unnoticed; refuse what is not 1..720.
        if not 1.0 <= hours <= MAX_SAMPLE_HOURS:
            raise ValidationError({"hours": [f"a number of hours from 1 to {MAX_SAMPLE_HOURS:g}, got {raw[:40]!r}"]})
        return Response(
            {
                "samples": [
                    {"at": s.at.isoformat(), "utilization": s.utilization, "fragmentation": s.fragmentation,
                     "gpus_used": s.gpus_used, "jobs_pending": s.jobs_pending,
                     "wait_p50_s": s.wait_p50_s, "wait_p95_s": s.wait_p95_s}
                    for s in samples_since(hours)
                ],
                "markers": chart_markers(hours),
            }
        )
